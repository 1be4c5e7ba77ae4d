//! Drills: announced shifts of traffic to a standby or secondary (seed 000 sections 18, 20, 21:
//! "Shift 100% to the secondary for an hour and watch your RUM data").
//!
//! A drill's timeline comes from its [`DrillSpec`] and the failover's steps and interval: at
//! `at` the first step of `share` moves to `to`, one more step every `interval` until all of it
//! has; that is held for `hold`; then it returns in the same steps. An abort (the Controller's,
//! on a regression; the engine's own when `to` goes down) starts the return at once, from the
//! level reached. The engine applies the level to every drilled cohort from the weights it had
//! when the drill began, journals each step as [`Rule::Drill`](crate::journal::Rule::Drill)
//! (never counted as oscillation), and suspends the other optimizing rules and the floors there
//! while it runs; health failover still comes first.
//!
//! [`DrillProgress`] is the drill's memory and report, kept in the
//! [`EngineState`] so that a restart (or a standby controller) continues it.

use std::collections::BTreeMap;
use std::time::Duration;

use multicdn_core::policy::{DrillSpec, Failover};
use multicdn_core::{CohortId, NetworkKey, Policy, SteeringPlan, TOTAL_BP, Timestamp};
use serde::{Deserialize, Serialize};

use super::EngineState;
use crate::beacon::ClientNetwork;
use crate::scoreboard::{Metric, Snapshot};

/// RUM figures of one region over one phase of a drill.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PhaseFigures {
    /// Navigation beacons behind the TTFB figures.
    pub samples: u64,
    /// p75 TTFB, ms (every provider's traffic together: what users saw).
    pub p75_ms: Option<f64>,
    /// p90 TTFB, ms.
    pub p90_ms: Option<f64>,
    /// Probe fetches behind the error rate.
    pub probes: u64,
    /// Share of probe fetches that failed, 0.0 to 1.0.
    pub error_rate: Option<f64>,
}

/// One region's figures before, during and after a drill.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegionFigures {
    /// The baseline, measured over the RUM window before the drill began.
    pub before: Option<PhaseFigures>,
    /// Since the drill began (updated every round while it runs).
    pub during: Option<PhaseFigures>,
    /// After the return, once the cohort has settled.
    pub after: Option<PhaseFigures>,
}

/// Why and when a drill was aborted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Abort {
    /// When the return began.
    pub at: Timestamp,
    /// The region whose figures aborted it, if it was a regression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<CohortId>,
    /// What was seen.
    pub reason: String,
}

/// A drill's memory and report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DrillProgress {
    /// The first round that moved traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Timestamp>,
    /// The first round with the whole share on the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full: Option<Timestamp>,
    /// Set when it was aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<Abort>,
    /// The round the last drilled cohort was back on its weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Timestamp>,
    /// Figures per drilled region.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub regions: BTreeMap<CohortId, RegionFigures>,
}

impl DrillProgress {
    /// How long the shift took: from the first step to the whole share on the target.
    pub fn time_to_shift(&self) -> Option<Duration> {
        Some(self.full?.since(self.started?))
    }
}

/// Where a drill stands at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not begun.
    Pending,
    /// Moving to the target: `level` basis points of the drill's share are there.
    Shifting {
        /// Basis points of the share.
        level: u32,
    },
    /// The whole share is on the target.
    Holding,
    /// Returning (after the hold or an abort): `level` basis points of the share remain.
    Returning {
        /// Basis points of the share.
        level: u32,
    },
    /// Over: every drilled cohort is back on its own weights.
    Over,
}

impl Phase {
    /// Basis points of the drill's share on the target now.
    pub fn level(self) -> u32 {
        match self {
            Phase::Pending | Phase::Over => 0,
            Phase::Holding => TOTAL_BP,
            Phase::Shifting { level } | Phase::Returning { level } => level,
        }
    }

    /// True from the first step until the return is complete.
    pub fn is_running(self) -> bool {
        !matches!(self, Phase::Pending | Phase::Over)
    }
}

/// The cumulative step reached `elapsed` after a start, in basis points (the failover's steps).
fn stepped(failover: &Failover, elapsed: Duration) -> u32 {
    let Some(last) = failover.steps.last() else {
        return TOTAL_BP;
    };
    let interval = failover.interval.get().as_millis().max(1);
    let idx = (elapsed.as_millis() / interval) as usize;
    failover.steps.get(idx).unwrap_or(last).bp().min(TOTAL_BP)
}

/// How long the failover's steps take from the first to the last.
fn ramp(failover: &Failover) -> Duration {
    let steps = failover.steps.len().saturating_sub(1) as u32;
    failover.interval.get().saturating_mul(steps)
}

/// Where `spec` stands at `now`, given an abort (if any).
pub fn phase(
    spec: &DrillSpec,
    failover: &Failover,
    abort: Option<&Abort>,
    now: Timestamp,
) -> Phase {
    if now < spec.at {
        return Phase::Pending;
    }
    let up = |t: Timestamp| -> u32 {
        if t < spec.at {
            0
        } else {
            stepped(failover, t.since(spec.at))
        }
    };
    let return_start = spec.at.plus(ramp(failover)).plus(spec.hold.get());
    let (from, level_then) = match abort {
        Some(a) if a.at < return_start => (a.at, up(a.at)),
        _ => (return_start, TOTAL_BP),
    };
    if now < from {
        let level = up(now);
        return if level >= TOTAL_BP {
            Phase::Holding
        } else {
            Phase::Shifting { level }
        };
    }
    let gone = stepped(failover, now.since(from));
    let level = (u64::from(level_then) * u64::from(TOTAL_BP - gone) / u64::from(TOTAL_BP)) as u32;
    if level == 0 {
        Phase::Over
    } else {
        Phase::Returning { level }
    }
}

/// Whether the drill covers a cohort (its own id, or the region it was carved out of); a drill
/// naming no cohorts covers every one.
pub fn covers(spec: &DrillSpec, cohort: &CohortId, parent: Option<&CohortId>) -> bool {
    spec.cohorts.is_empty()
        || spec
            .cohorts
            .iter()
            .any(|c| c == cohort || Some(c) == parent)
}

/// The figures of region `cohort` of `plan` (its whole traffic, carved-out networks included)
/// in `snapshot`.
pub fn figures(plan: &SteeringPlan, snapshot: &Snapshot, cohort: &CohortId) -> PhaseFigures {
    let at = plan.cohorts.iter().position(|c| &c.cohort == cohort);
    let region_of = |n: &ClientNetwork| -> Option<usize> {
        let continent = n.continent();
        plan.cohorts.iter().position(|r| {
            r.networks.iter().any(|k| match k {
                NetworkKey::Asn(a) => n.asn == Some(*a),
                NetworkKey::Country(c) => n.country == Some(*c),
                NetworkKey::Continent(c) => continent == Some(*c),
                NetworkKey::Global => true,
            })
        })
    };
    let include = |n: &ClientNetwork| at.is_some() && region_of(n) == at;
    let ttfb = snapshot.merged_all_where(Metric::Ttfb, NetworkKey::Global, include);
    let probe = snapshot.merged_all_where(Metric::Probe, NetworkKey::Global, include);
    let has = |n: u64, v: Option<f64>| v.filter(|v| n > 0 && v.is_finite());
    PhaseFigures {
        samples: ttfb.stats.samples,
        p75_ms: has(ttfb.stats.samples, ttfb.stats.p75),
        p90_ms: has(ttfb.stats.samples, ttfb.stats.p90),
        probes: probe.stats.samples,
        error_rate: probe
            .stats
            .availability
            .filter(|_| probe.stats.samples > 0)
            .map(|a| (1.0 - a).clamp(0.0, 1.0)),
    }
}

/// The regions a drill covers: the policy's regions it names (every region when it names
/// none).
fn regions<'p>(spec: &DrillSpec, plan: &'p SteeringPlan) -> Vec<&'p CohortId> {
    plan.cohorts
        .iter()
        .map(|c| &c.cohort)
        .filter(|c| covers(spec, c, None))
        .collect()
}

/// A regression of `during` over `before` beyond the drill's thresholds, in words.
fn regression(spec: &DrillSpec, before: &PhaseFigures, during: &PhaseFigures) -> Option<String> {
    let a = &spec.abort;
    if during.samples >= a.min_samples
        && before.samples >= a.min_samples
        && let (Some(b), Some(d)) = (before.p90_ms, during.p90_ms)
    {
        let limit = a.p90_rise.get().as_secs_f64() * 1000.0;
        if d - b > limit {
            return Some(format!(
                "p90 TTFB {d:.0} ms against {b:.0} ms before the drill: up {:.0} ms, more than {limit:.0} ms",
                d - b
            ));
        }
    }
    if during.probes >= a.min_samples
        && before.probes >= a.min_samples
        && let (Some(b), Some(d)) = (before.error_rate, during.error_rate)
    {
        let limit = a.error_rise.fraction();
        if d - b > limit {
            return Some(format!(
                "error rate {:.2}% against {:.2}% before the drill: up more than {:.2} points",
                d * 100.0,
                b * 100.0,
                limit * 100.0
            ));
        }
    }
    None
}

/// The Controller's watch over the policy's drills, before each round's decision: the
/// baseline of every drilled region over the RUM window just before a drill begins, its figures
/// since it began while it runs (and an abort, stepwise, on a regression beyond the drill's
/// thresholds), and its figures after the return once the cohorts have settled (`rum.settle`).
/// `snapshot(window)` reads the scoreboard over the `window` before `now`.
pub fn observe(
    policy: &Policy,
    state: &mut EngineState,
    now: Timestamp,
    snapshot: &mut dyn FnMut(Duration) -> Snapshot,
) {
    let steering = &policy.steering;
    if steering.drills.is_empty() {
        return;
    }
    let plan = policy.static_plan();
    for spec in &steering.drills {
        let progress = state.drills.get(&spec.name);
        let ph = phase(
            spec,
            &steering.failover,
            progress.and_then(|p| p.aborted.as_ref()),
            now,
        );
        match progress {
            None if ph.is_running() => {
                // The round that begins it: what the regions saw until now is the baseline.
                let snap = snapshot(steering.rum.window.get());
                let regions = regions(spec, &plan)
                    .into_iter()
                    .map(|c| {
                        let before = figures(&plan, &snap, c);
                        (
                            c.clone(),
                            RegionFigures {
                                before: Some(before),
                                ..RegionFigures::default()
                            },
                        )
                    })
                    .collect();
                state.drills.insert(
                    spec.name.clone(),
                    DrillProgress {
                        regions,
                        ..DrillProgress::default()
                    },
                );
            }
            Some(p) if p.ended.is_none() => {
                let Some(started) = p.started else { continue };
                let snap = snapshot(now.since(started).max(Duration::from_secs(1)));
                let mut abort = None;
                let names: Vec<CohortId> = p.regions.keys().cloned().collect();
                let aborted = p.aborted.is_some();
                if let Some(p) = state.drills.get_mut(&spec.name) {
                    for c in names {
                        let during = figures(&plan, &snap, &c);
                        if let Some(r) = p.regions.get_mut(&c) {
                            if !aborted
                                && abort.is_none()
                                && let Some(before) = &r.before
                                && let Some(why) = regression(spec, before, &during)
                            {
                                abort = Some((c.clone(), why));
                            }
                            r.during = Some(during);
                        }
                    }
                }
                if let Some((region, why)) = abort {
                    state.abort_drill(
                        &spec.name,
                        now,
                        Some(region.clone()),
                        format!("{region}: {why}"),
                    );
                }
            }
            Some(p) => {
                let Some(ended) = p.ended else { continue };
                let settled = now.since(ended) >= steering.rum.settle.get();
                if !settled || p.regions.values().all(|r| r.after.is_some()) {
                    continue;
                }
                let snap = snapshot(now.since(ended).max(Duration::from_secs(1)));
                if let Some(p) = state.drills.get_mut(&spec.name) {
                    for (c, r) in p.regions.iter_mut() {
                        r.after.get_or_insert_with(|| figures(&plan, &snap, c));
                    }
                }
            }
            None => {}
        }
    }
}

/// A drill's report for people: the shift, the abort if any, and each region's figures
/// before, during and after.
pub fn report(spec: &DrillSpec, progress: &DrillProgress) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "drill {}: {} of traffic to {} at {}, held {}",
        spec.name, spec.share, spec.to, spec.at, spec.hold
    );
    match (progress.started, progress.time_to_shift()) {
        (Some(s), Some(t)) => {
            let _ = writeln!(out, "  shift began {s}, complete after {} s", t.as_secs());
        }
        (Some(s), None) => {
            let _ = writeln!(out, "  shift began {s}, never complete");
        }
        _ => {
            let _ = writeln!(out, "  not begun");
        }
    }
    match &progress.aborted {
        Some(a) => {
            let _ = writeln!(out, "  ABORTED at {}: {}", a.at, a.reason);
        }
        None if progress.ended.is_some() => {
            let _ = writeln!(out, "  completed without an abort");
        }
        None => {}
    }
    if let Some(e) = progress.ended {
        let _ = writeln!(out, "  back on the providers' own weights at {e}");
    }
    let cell = |f: Option<&PhaseFigures>| -> String {
        let Some(f) = f else {
            return format!("{:>31}", "-");
        };
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
        let err = f
            .error_rate
            .map_or_else(|| "-".to_owned(), |e| format!("{:.2}%", e * 100.0));
        format!(
            "{:>5}/{:>5} ms {:>7} n={:<7}",
            ms(f.p75_ms),
            ms(f.p90_ms),
            err,
            f.samples
        )
    };
    let _ = writeln!(
        out,
        "  {:<16} {:<31} {:<31} {:<31}",
        "region", "before p75/p90 errors", "during", "after"
    );
    for (c, r) in &progress.regions {
        let _ = writeln!(
            out,
            "  {:<16} {} {} {}",
            c.as_str(),
            cell(r.before.as_ref()),
            cell(r.during.as_ref()),
            cell(r.after.as_ref())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use multicdn_core::policy::{Dur, Share};

    fn spec() -> DrillSpec {
        serde_json::from_value(serde_json::json!({
            "name": "q4",
            "at": "2026-12-01T10:00:00Z",
            "to": "cloudflare",
            "hold": "1h",
        }))
        .unwrap()
    }

    fn failover() -> Failover {
        let mut f = Failover::default();
        f.steps = vec![Share::percent(50), Share::percent(100)];
        f.interval = Dur::secs(90);
        f
    }

    fn t(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn a_drill_shifts_holds_and_returns_in_the_failover_steps() {
        let (s, f) = (spec(), failover());
        assert_eq!(
            phase(&s, &f, None, t("2026-12-01T09:59:59Z")),
            Phase::Pending
        );
        assert_eq!(
            phase(&s, &f, None, t("2026-12-01T10:00:00Z")),
            Phase::Shifting { level: 5_000 }
        );
        assert_eq!(
            phase(&s, &f, None, t("2026-12-01T10:01:30Z")),
            Phase::Holding
        );
        // The hold ends an hour after the ramp (90 s).
        assert_eq!(
            phase(&s, &f, None, t("2026-12-01T11:01:29Z")),
            Phase::Holding
        );
        assert_eq!(
            phase(&s, &f, None, t("2026-12-01T11:01:30Z")),
            Phase::Returning { level: 5_000 }
        );
        assert_eq!(phase(&s, &f, None, t("2026-12-01T11:03:00Z")), Phase::Over);
    }

    #[test]
    fn an_abort_returns_at_once_from_the_level_reached() {
        let (s, f) = (spec(), failover());
        let abort = Abort {
            at: t("2026-12-01T10:00:30Z"),
            region: None,
            reason: "p90 up".into(),
        };
        // Aborted at 50%: half of that at once, then nothing.
        assert_eq!(
            phase(&s, &f, Some(&abort), t("2026-12-01T10:00:30Z")),
            Phase::Returning { level: 2_500 }
        );
        assert_eq!(
            phase(&s, &f, Some(&abort), t("2026-12-01T10:02:00Z")),
            Phase::Over
        );
    }

    fn figs(samples: u64, p90: f64, probes: u64, errors: f64) -> PhaseFigures {
        PhaseFigures {
            samples,
            p75_ms: Some(p90 * 0.8),
            p90_ms: Some(p90),
            probes,
            error_rate: Some(errors),
        }
    }

    #[test]
    fn a_regression_needs_enough_samples_and_a_rise_beyond_the_threshold() {
        let s = spec();
        let before = figs(1_000, 120.0, 1_000, 0.002);
        // p90 up 150 ms exactly: within the default threshold.
        assert_eq!(
            regression(&s, &before, &figs(1_000, 270.0, 1_000, 0.002)),
            None
        );
        let why = regression(&s, &before, &figs(1_000, 300.0, 1_000, 0.002)).unwrap();
        assert!(why.contains("p90 TTFB 300 ms against 120 ms"), "{why}");
        // Too few samples during the drill to judge.
        assert_eq!(regression(&s, &before, &figs(150, 900.0, 150, 0.5)), None);
        // Errors up 1.3 points, more than the default 1.
        let why = regression(&s, &before, &figs(1_000, 120.0, 1_000, 0.015)).unwrap();
        assert!(why.contains("error rate 1.50% against 0.20%"), "{why}");
    }
}
