//! What a simulated day reports: TTFB per strategy, capture, reversals, reaction times, floor
//! and cap compliance, and an SVG of one network's weights against its truth.

use std::collections::HashMap;
use std::fmt;
use std::fmt::Write as _;

use multicdn_core::{CohortId, Policy, ProviderId, TOTAL_BP, Timestamp};

use super::{Actuated, Network, REGIONS, World, fastly_moved, is_optimizing, mode_is_deadman};
use crate::engine::Decision;
use crate::journal::Rule;

/// The strategies compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The closed loop.
    Loop,
    /// The policy's static weights.
    Static,
    /// Fastly at 90% everywhere.
    FastlyAlone,
    /// Cloudflare at 90% everywhere.
    CloudflareAlone,
    /// 90% to the truly faster provider of each network, now (it pays its own warm-up).
    Oracle,
}

impl Strategy {
    /// Every strategy, in report order.
    pub const ALL: [Strategy; 5] = [
        Strategy::Loop,
        Strategy::Static,
        Strategy::FastlyAlone,
        Strategy::CloudflareAlone,
        Strategy::Oracle,
    ];

    fn name(self) -> &'static str {
        match self {
            Strategy::Loop => "loop",
            Strategy::Static => "static weights",
            Strategy::FastlyAlone => "fastly 90%",
            Strategy::CloudflareAlone => "cloudflare 90%",
            Strategy::Oracle => "oracle",
        }
    }
}

/// One strategy's TTFB outside the outage window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StrategyFigures {
    /// The strategy.
    pub strategy: Strategy,
    /// Mean TTFB, ms.
    pub mean_ms: f64,
    /// p75 TTFB, ms.
    pub p75_ms: f64,
    /// Page loads counted.
    pub loads: u64,
}

/// What the day measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Per strategy, outside the outage window (its start to 30 minutes after its end).
    pub strategies: Vec<StrategyFigures>,
    /// (baseline - loop) / (baseline - oracle), baseline the best single CDN: mean, p75.
    pub capture_vs_best_single: (f64, f64),
    /// The same against static weights: mean, p75.
    pub capture_vs_static: (f64, f64),
    /// RUM reversals within two hours in cohorts whose networks' truth did not change (the
    /// close calls included: their truth crosses within noise).
    pub reversals_unchanged: usize,
    /// RUM reversals within two hours in cohorts touched by an event.
    pub reversals_changed: usize,
    /// The reversals where truth did not change: cohort and minute of the day.
    pub unchanged_reversals: Vec<(CohortId, u32)>,
    /// RUM moves over the day.
    pub rum_moves: usize,
    /// Degraded networks (fastly above its floor when the degradation began).
    pub degraded: usize,
    /// Of those, how many moved within 10 minutes.
    pub moved_within_10: usize,
    /// Of those, how many went 80% of the way to the floor within 30 minutes.
    pub most_within_30: usize,
    /// Minutes to the first move and to 80% of the way, the slowest network (`None`: never).
    pub slowest_reaction: (Option<u32>, Option<u32>),
    /// Minutes from the last beacon to the deadman's static weights (`None`: never).
    pub deadman_after_min: Option<u32>,
    /// The policy's `stale_after`, minutes.
    pub stale_after_min: u32,
    /// Rounds where a healthy provider was under its floor in some cohort.
    pub floor_violations: usize,
    /// The most traffic optimizing moves shifted in any 60 minutes, bp of all traffic.
    pub max_moved_per_hour_bp: f64,
    /// The policy's hourly cap, bp.
    pub hourly_cap_bp: u32,
    /// Where the loop's mean loses to the oracle's, network by network, the largest first.
    pub losses: Vec<NetworkLoss>,
    /// The loop's mean TTFB minus the oracle's, hour by hour of the day (`NaN`: not scored).
    pub hourly_loss_ms: Vec<f64>,
    trace: Trace,
}

/// One network's part of the gap between the loop's mean TTFB and the oracle's.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkLoss {
    /// The network.
    pub asn: u32,
    /// Its traffic rank (0 is the busiest).
    pub rank: usize,
    /// Its region.
    pub region: &'static str,
    /// Its share of the day's traffic.
    pub share: f64,
    /// The mean true difference between the two providers over the day, ms.
    pub truth_gap_ms: f64,
    /// Minutes it steered as its own cohort.
    pub own_minutes: u32,
    /// Its loads' mean TTFB under the loop minus under the oracle, ms.
    pub loss_ms: f64,
    /// Its part of the difference of the overall means, ms.
    pub contribution_ms: f64,
}

/// What the run records as it goes.
#[derive(Debug, Clone)]
pub(crate) struct Trace {
    /// Fastly's planned share per network per minute.
    weights: Vec<Vec<u32>>,
    /// True latency per network per minute.
    truth: Vec<Vec<[f64; 2]>>,
    /// RUM moves: minute, cohort, toward fastly.
    rum: Vec<(u32, CohortId, bool)>,
    /// Share-weighted optimizing bp moved per minute.
    moved: Vec<f64>,
    floor_violations: usize,
    deadman: Vec<u32>,
    networks_of: HashMap<CohortId, Vec<usize>>,
    asns: Vec<u32>,
    /// Minutes each network steered as its own cohort.
    own_minutes: Vec<u32>,
    /// The journal of the network `World::journal_of` names.
    pub(crate) journal: Vec<String>,
}

impl Trace {
    pub(crate) fn new(networks: &[Network], world: &World) -> Trace {
        let m = world.minutes as usize;
        Trace {
            weights: vec![Vec::with_capacity(m); networks.len()],
            truth: vec![Vec::with_capacity(m); networks.len()],
            rum: Vec::new(),
            moved: vec![0.0; m],
            floor_violations: 0,
            deadman: Vec::new(),
            networks_of: HashMap::new(),
            asns: networks.iter().map(|n| n.asn).collect(),
            own_minutes: vec![0; networks.len()],
            journal: Vec::new(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn round(
        &mut self,
        _now: Timestamp,
        minute: u32,
        d: &Decision,
        shares: &HashMap<&CohortId, f64>,
        fastly: &ProviderId,
        floor: u32,
        down: &[&ProviderId],
    ) {
        for e in &d.journal {
            if !e.is_move() {
                continue;
            }
            if is_optimizing(e.rule) {
                let share = shares.get(&e.cohort).copied().unwrap_or(0.0);
                if let Some(x) = self.moved.get_mut(minute as usize) {
                    *x += f64::from(fastly_moved(e, fastly)) * share;
                }
            }
            if e.rule == Rule::Rum {
                self.rum.push((
                    minute,
                    e.cohort.clone(),
                    e.after.get(fastly) > e.before.get(fastly),
                ));
            }
        }
        // Floors hold for healthy providers only: a down provider legitimately goes to zero.
        let under = d.plan.cohorts.iter().any(|c| {
            c.weights
                .iter()
                .any(|(p, bp)| bp < floor && !down.contains(&p))
        });
        if under {
            self.floor_violations += 1;
        }
        if mode_is_deadman(d) {
            self.deadman.push(minute);
        }
    }

    pub(crate) fn weights(&mut self, _minute: u32, w: &[u32]) {
        for (v, x) in self.weights.iter_mut().zip(w) {
            v.push(*x);
        }
    }

    /// Counts a minute for every network with a cohort of its own in `plan`.
    pub(crate) fn carved(&mut self, plan: &multicdn_core::SteeringPlan, networks: &[Network]) {
        let own: std::collections::HashSet<u32> = plan
            .cohorts
            .iter()
            .filter_map(|c| match c.networks.as_slice() {
                [multicdn_core::NetworkKey::Asn(a)] => Some(*a),
                _ => None,
            })
            .collect();
        for (m, n) in self.own_minutes.iter_mut().zip(networks) {
            if own.contains(&n.asn) {
                *m += 1;
            }
        }
    }

    pub(crate) fn truth(&mut self, _minute: u32, i: usize, t: [f64; 2]) {
        if let Some(v) = self.truth.get_mut(i) {
            v.push(t);
        }
    }
}

fn capture(baseline: f64, strategy: f64, oracle: f64) -> f64 {
    let gain = baseline - oracle;
    if gain.abs() < 1e-9 {
        return f64::NAN;
    }
    (baseline - strategy) / gain
}

pub(crate) fn finish(
    world: &World,
    policy: &Policy,
    networks: &[Network],
    worlds: &[Actuated],
    mut trace: Trace,
) -> Report {
    let strategies: Vec<StrategyFigures> = Strategy::ALL
        .iter()
        .zip(worlds)
        .map(|(s, a)| StrategyFigures {
            strategy: *s,
            mean_ms: a.hist.mean(),
            p75_ms: a.hist.quantile(0.75),
            loads: a.hist.n,
        })
        .collect();
    let get = |s: Strategy| {
        strategies
            .iter()
            .find(|f| f.strategy == s)
            .map_or((f64::NAN, f64::NAN), |f| (f.mean_ms, f.p75_ms))
    };
    let (lp, st, fa, ca, or) = (
        get(Strategy::Loop),
        get(Strategy::Static),
        get(Strategy::FastlyAlone),
        get(Strategy::CloudflareAlone),
        get(Strategy::Oracle),
    );
    let best = (fa.0.min(ca.0), fa.1.min(ca.1));
    // Cohorts and the networks they cover: an ASN cohort its own network, a region its
    // networks.
    for (i, n) in networks.iter().enumerate() {
        let own = crate::engine::cohort_id_for(multicdn_core::NetworkKey::Asn(n.asn));
        trace.networks_of.entry(own).or_default().push(i);
        if let Ok(r) = CohortId::new(REGIONS[n.region].0) {
            trace.networks_of.entry(r).or_default().push(i);
        }
    }
    let changed = |i: usize| {
        networks
            .get(i)
            .is_some_and(|n| n.region == 0 || n.region == 2)
    };
    // RUM reversals within two hours.
    let mut last: HashMap<&CohortId, (u32, bool)> = HashMap::new();
    let (mut rev_unchanged, mut rev_changed) = (0, 0);
    let mut unchanged_reversals = Vec::new();
    for (minute, cohort, toward) in &trace.rum {
        if let Some((at, dir)) = last.get(cohort)
            && dir != toward
            && minute - at <= 120
        {
            let touched = trace
                .networks_of
                .get(cohort)
                .is_some_and(|ns| ns.iter().any(|i| changed(*i)));
            if touched {
                rev_changed += 1;
            } else {
                rev_unchanged += 1;
                unchanged_reversals.push(((*cohort).clone(), *minute));
            }
        }
        last.insert(cohort, (*minute, *toward));
    }
    // Reaction to the degradation.
    let floor = policy.steering.floors.measurement.bp();
    let start = (world.degradation.0 * 60.0).round() as usize;
    let end = (world.degradation.1 * 60.0).round() as usize;
    let (mut degraded, mut within_10, mut within_30) = (0, 0, 0);
    let (mut slow_first, mut slow_most): (Option<u32>, Option<u32>) = (Some(0), Some(0));
    for (i, n) in networks.iter().enumerate() {
        let Some(w) = trace.weights.get(i) else {
            continue;
        };
        let Some(&w0) = w.get(start) else { continue };
        if n.region != 0 || w0 <= floor + 100 || n.close_call {
            continue;
        }
        degraded += 1;
        let first = (start..end.min(w.len()))
            .find(|&m| w[m] < w0)
            .map(|m| (m - start) as u32);
        let most = (start..end.min(w.len()))
            .find(|&m| f64::from(w0 - w[m].min(w0)) >= 0.8 * f64::from(w0 - floor))
            .map(|m| (m - start) as u32);
        if first.is_some_and(|m| m <= 10) {
            within_10 += 1;
        }
        if most.is_some_and(|m| m <= 30) {
            within_30 += 1;
        }
        slow_first = match (slow_first, first) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
        slow_most = match (slow_most, most) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    let pipeline = (world.pipeline_outage.0 * 60.0).round() as u32;
    let deadman_after_min = trace
        .deadman
        .iter()
        .find(|m| **m >= pipeline)
        .map(|m| m - pipeline);
    let total_loads = worlds.first().map_or(0, |a| a.hist.n).max(1) as f64;
    let mut losses: Vec<NetworkLoss> = networks
        .iter()
        .enumerate()
        .filter_map(|(i, n)| {
            let (l, o) = (
                worlds.first()?.per_network.get(i)?,
                worlds.last()?.per_network.get(i)?,
            );
            if l.1 == 0 || o.1 == 0 {
                return None;
            }
            let loss = l.0 / l.1 as f64 - o.0 / o.1 as f64;
            let truth = trace.truth.get(i)?;
            Some(NetworkLoss {
                asn: n.asn,
                rank: i,
                region: REGIONS[n.region].0,
                share: n.share,
                truth_gap_ms: truth.iter().map(|t| (t[0] - t[1]).abs()).sum::<f64>()
                    / truth.len().max(1) as f64,
                own_minutes: trace.own_minutes.get(i).copied().unwrap_or(0),
                loss_ms: loss,
                contribution_ms: loss * l.1 as f64 / total_loads,
            })
        })
        .collect();
    losses.sort_by(|a, b| b.contribution_ms.total_cmp(&a.contribution_ms));
    let hourly_loss_ms = match (worlds.first(), worlds.last()) {
        (Some(l), Some(o)) => l
            .per_hour
            .iter()
            .zip(&o.per_hour)
            .map(|(l, o)| {
                if l.1 == 0 || o.1 == 0 {
                    f64::NAN
                } else {
                    l.0 / l.1 as f64 - o.0 / o.1 as f64
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut max_hour = 0.0f64;
    for m in 0..trace.moved.len() {
        let from = m.saturating_sub(59);
        let s: f64 = trace.moved[from..=m].iter().sum();
        max_hour = max_hour.max(s);
    }
    Report {
        capture_vs_best_single: (capture(best.0, lp.0, or.0), capture(best.1, lp.1, or.1)),
        capture_vs_static: (capture(st.0, lp.0, or.0), capture(st.1, lp.1, or.1)),
        strategies,
        reversals_unchanged: rev_unchanged,
        reversals_changed: rev_changed,
        unchanged_reversals,
        rum_moves: trace.rum.len(),
        degraded,
        moved_within_10: within_10,
        most_within_30: within_30,
        slowest_reaction: (slow_first, slow_most),
        deadman_after_min,
        stale_after_min: (policy.steering.guardrails.stale_after.get().as_secs() / 60) as u32,
        floor_violations: trace.floor_violations,
        max_moved_per_hour_bp: max_hour,
        hourly_cap_bp: policy.steering.guardrails.max_moved_per_hour.bp(),
        losses,
        hourly_loss_ms,
        trace,
    }
}

impl Report {
    /// The journal entries of the cohort of the network [`World::journal_of`] names, one line
    /// each (empty when it names none).
    pub fn journal(&self) -> &[String] {
        &self.trace.journal
    }

    /// The networks' ASNs, busiest first (the SVG's `network` is an index into them).
    pub fn asns(&self) -> &[u32] {
        &self.trace.asns
    }

    /// Network `index`'s planned fastly share (bp) and its truth (fastly, cloudflare ms),
    /// minute by minute; `None` for an unknown index.
    pub fn timeline(&self, index: usize) -> Option<(&[u32], &[[f64; 2]])> {
        Some((self.trace.weights.get(index)?, self.trace.truth.get(index)?))
    }

    /// An SVG of network `index`'s planned fastly share against its truth (fastly minus
    /// cloudflare true latency) over the day; `None` for an unknown index.
    pub fn svg(&self, index: usize) -> Option<String> {
        let w = self.trace.weights.get(index)?;
        let t = self.trace.truth.get(index)?;
        let asn = self.trace.asns.get(index)?;
        let (width, height, pad) = (960.0, 360.0, 40.0);
        let n = w.len().max(2) as f64;
        let x = |m: usize| pad + (width - 2.0 * pad) * m as f64 / (n - 1.0);
        let diffs: Vec<f64> = t.iter().map(|v| v[0] - v[1]).collect();
        let span = diffs.iter().fold(20.0f64, |a, d| a.max(d.abs()));
        let mid = height / 2.0;
        let yw =
            |bp: u32| height - pad - (height - 2.0 * pad) * f64::from(bp) / f64::from(TOTAL_BP);
        let yt = |d: f64| mid - (height / 2.0 - pad) * d / span;
        let mut out = String::new();
        let _ = write!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
             <text x=\"{pad}\" y=\"20\">AS{asn}: fastly's planned share (blue, 0-100%) against truth, fastly minus cloudflare (orange, ±{span:.0} ms; above the middle line fastly is slower)</text>\
             <line x1=\"{pad}\" x2=\"{}\" y1=\"{mid}\" y2=\"{mid}\" stroke=\"#bbb\"/>",
            width - pad
        );
        let poly = |pts: Vec<(f64, f64)>, color: &str| {
            let mut s = String::from("<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"");
            s.push_str(color);
            s.push_str("\" points=\"");
            for (a, b) in pts {
                let _ = write!(s, "{a:.1},{b:.1} ");
            }
            s.push_str("\"/>");
            s
        };
        out.push_str(&poly(
            diffs
                .iter()
                .enumerate()
                .map(|(m, d)| (x(m), yt(*d)))
                .collect(),
            "#e8772e",
        ));
        out.push_str(&poly(
            w.iter()
                .enumerate()
                .map(|(m, bp)| (x(m), yw(*bp)))
                .collect(),
            "#2e6fe8",
        ));
        for h in (0..=24).step_by(3) {
            let m = (h * 60).min(w.len().saturating_sub(1));
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{h:02}:00</text>",
                x(m),
                height - 10.0
            );
        }
        out.push_str("</svg>\n");
        Some(out)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "TTFB outside the outage window:")?;
        for s in &self.strategies {
            writeln!(
                f,
                "  {:<16} mean {:>7.2} ms   p75 {:>7.2} ms   ({} loads)",
                s.strategy.name(),
                s.mean_ms,
                s.p75_ms,
                s.loads
            )?;
        }
        let pct = |x: f64| x * 100.0;
        writeln!(
            f,
            "capture vs best single CDN: mean {:.1}%, p75 {:.1}%",
            pct(self.capture_vs_best_single.0),
            pct(self.capture_vs_best_single.1)
        )?;
        writeln!(
            f,
            "capture vs static weights:  mean {:.1}%, p75 {:.1}%",
            pct(self.capture_vs_static.0),
            pct(self.capture_vs_static.1)
        )?;
        writeln!(
            f,
            "RUM moves {}; reversals within 2 h: {} where truth did not change, {} where it did",
            self.rum_moves, self.reversals_unchanged, self.reversals_changed
        )?;
        if !self.unchanged_reversals.is_empty() {
            let list: Vec<String> = self
                .unchanged_reversals
                .iter()
                .map(|(c, m)| format!("{c} at {:02}:{:02}", m / 60, m % 60))
                .collect();
            writeln!(f, "  where truth did not change: {}", list.join(", "))?;
        }
        let m = |x: Option<u32>| x.map_or_else(|| "never".to_owned(), |v| format!("{v} min"));
        writeln!(
            f,
            "degradation: {} networks; moved within 10 min: {}; 80% of the way within 30 min: {}; slowest first move {}, slowest 80% {}",
            self.degraded,
            self.moved_within_10,
            self.most_within_30,
            m(self.slowest_reaction.0),
            m(self.slowest_reaction.1)
        )?;
        writeln!(
            f,
            "deadman: static weights {} after the last beacon (stale_after {} min)",
            m(self.deadman_after_min),
            self.stale_after_min
        )?;
        writeln!(
            f,
            "floors: {} rounds with a healthy provider under its floor; hourly cap: at most {:.0} bp moved in any hour (cap {} bp)",
            self.floor_violations, self.max_moved_per_hour_bp, self.hourly_cap_bp
        )?;
        let (own, region): (Vec<&NetworkLoss>, Vec<&NetworkLoss>) = self
            .losses
            .iter()
            .partition(|l| l.own_minutes * 2 >= self.trace.moved.len() as u32);
        let sum = |v: &[&NetworkLoss]| v.iter().map(|l| l.contribution_ms).sum::<f64>();
        writeln!(
            f,
            "loss to the oracle's mean: {:.2} ms from {} networks steered as their own cohort most of the day, {:.2} ms from {} steered with their region; the largest:",
            sum(&own),
            own.len(),
            sum(&region),
            region.len()
        )?;
        let hours: Vec<String> = self
            .hourly_loss_ms
            .iter()
            .map(|l| {
                if l.is_nan() {
                    "-".to_owned()
                } else {
                    format!("{l:.1}")
                }
            })
            .collect();
        writeln!(f, "loss to the oracle by hour (ms): {}", hours.join(" "))?;
        for l in self.losses.iter().take(8) {
            writeln!(
                f,
                "  AS{} (rank {}, {}, {:.1}% of traffic, true gap {:.1} ms, own cohort {} min): {:+.1} ms a load, {:+.2} ms of the mean",
                l.asn,
                l.rank,
                l.region,
                l.share * 100.0,
                l.truth_gap_ms,
                l.own_minutes,
                l.loss_ms,
                l.contribution_ms
            )?;
        }
        Ok(())
    }
}
