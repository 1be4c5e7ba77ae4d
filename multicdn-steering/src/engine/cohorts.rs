//! Building the engine's inputs from scoreboard snapshots: one [`CohortInput`] per ASN whose
//! own cells are sufficient for every provider, and one per region of the policy, scored on the
//! traffic that region serves: the networks it matches first, without the carved-out ASNs.
//!
//! **Which signal decides.** Providers are compared on evidence the comparison itself does not
//! bias. A provider at the 10% measurement floor has a colder cache than one at 90%, so raw
//! navigation TTFB favours whoever already has the traffic (the minor provider's misses carry
//! the origin fetch). In order:
//!
//! 1. The paired client probe ([`Metric::Probe`]): every provider timed on the same small,
//!    always-cached object by the same user at the same moment. Its pairs
//!    ([`Snapshot::pairing`]) let a cohort be judged from `min_pairs` loads, the users' own
//!    speed cancelling from the difference.
//! 2. Navigations the edge served from its cache ([`Metric::TtfbHit`], `Server-Timing`
//!    `cache=HIT`): no origin fetch in them, and thirty to fifty times as many as probes.
//! 3. Navigation TTFB (`metric`), only where neither runs at all; it carries the warmth bias.
//!
//! Where 1 or 2 decides, what the cohort's users get now, misses included (`metric`), is
//! attached as [`CohortInput::experienced`]: the engine breaks ties with it, towards the warmer
//! cache the cohort already mostly uses. The traffic share that weights the hourly cap always
//! comes from `metric`.
//!
//! **Windows.** A network is judged on the policy's `window` when its own evidence there is
//! sufficient, else on twice, four times... the window up to `max_window`
//! ([`RumPolicy::windows`](multicdn_core::policy::RumPolicy::windows)): a busy network
//! reacts within minutes, a sparse one is judged at all. A window must not hide a change within
//! it: a provider whose latest half window
//! ([`RumPolicy::latest_window`](multicdn_core::policy::RumPolicy::latest_window), read only for
//! this) differs from the window it is judged on by more than [`CHANGE_Z`] standard
//! errors and by a material amount (the policy's gaps), on the deciding signal or on cache
//! hits, has the change added to its score (and its error widened), so a regional degradation
//! moves a network within minutes whichever window judges it.
//!
//! **Own evidence only.** An ASN is scored on its own cut or not at all: when its cells go thin
//! in every window it gets no input, so a cohort already in force holds its weights (and rejoins
//! its region once they equal the region's); it never moves on its country's cut, which other
//! networks dominate.
//!
//! **Spread.** Each score carries its standard error, from the cell's own count and spread:
//! for the p-quantile `q` of `n` samples, `sqrt(p(1-p)/n) / f(q)`, the density `f` read from the
//! cell as `0.4 / (p90 - p50)`. The engine requires a gap of
//! [`SIGNIFICANCE_Z`](super::SIGNIFICANCE_Z) standard errors of the difference besides the
//! policy's fixed gaps; a paired comparison's error shrinks by the correlation of its two
//! estimates.

use std::collections::HashMap;
use std::sync::Arc;

use multicdn_core::policy::RumPolicy;
use multicdn_core::{CellStats, CohortId, NetworkKey, Policy, ProviderId, Scorer, SteeringPlan};

use super::{CohortInput, PairedEvidence, ProviderEvidence, cohort_id_for};
use crate::beacon::ClientNetwork;
use crate::scoreboard::{CellStatus, CellView, Metric, Pairing, Snapshot};
use crate::scorer::Percentile;

/// The inputs for every cohort worth deciding on, scored by `scorer` on `metric` (the probe
/// metric's availability is attached to latency cells of the same cut, for
/// [`AvailabilityThenLatency`](crate::scorer::AvailabilityThenLatency)).
pub fn cohort_inputs(
    policy: &Policy,
    snapshot: &Snapshot,
    metric: Metric,
    scorer: &dyn Scorer,
    current: &SteeringPlan,
) -> Vec<CohortInput> {
    cohort_inputs_over(
        policy,
        std::slice::from_ref(snapshot),
        metric,
        scorer,
        current,
    )
}

/// [`cohort_inputs`] over snapshots of several windows, the shortest first (as
/// [`Scoreboard::snapshots`](crate::scoreboard::Scoreboard::snapshots) reads them for
/// [`RumPolicy::read_windows`](multicdn_core::policy::RumPolicy::read_windows)): an ASN too thin
/// in one is judged on the next; regions on the first of at least the policy's `window`.
/// Snapshots shorter than `window` are the latest part of it, read only for the change test.
pub fn cohort_inputs_over(
    policy: &Policy,
    snapshots: &[Snapshot],
    metric: Metric,
    scorer: &dyn Scorer,
    current: &SteeringPlan,
) -> Vec<CohortInput> {
    let judged_from = snapshots
        .iter()
        .position(|s| s.window >= policy.steering.rum.window.get())
        .unwrap_or(0);
    let (recent, ladder) = snapshots.split_at(judged_from);
    let Some(snapshot) = ladder.first() else {
        return Vec::new();
    };
    // The latest part of the evidence, against which a longer window is tested for a change.
    let latest = recent.first().unwrap_or(snapshot);
    let providers = policy.provider_ids();
    let static_plan = policy.static_plan();
    let total = snapshot.samples(metric, NetworkKey::Global).max(1) as f64;
    let weights: HashMap<&CohortId, &multicdn_core::Weights> = current
        .cohorts
        .iter()
        .map(|c| (&c.cohort, &c.weights))
        .collect();
    let default = static_plan
        .cohorts
        .iter()
        .find(|c| c.networks.contains(&NetworkKey::Global))
        .map(|c| c.cohort.clone());
    let mut out = Vec::new();
    let percentile = Percentile::nearest(policy.steering.rum.percentile);

    let rum = &policy.steering.rum;
    let min_pairs = rum.min_pairs;
    // A cell is scored when steerable, or, for a paired cohort, fresh with `min_pairs`.
    let usable = |view: &CellView, paired: bool| match view.status {
        CellStatus::Steerable => true,
        CellStatus::TooFewSamples { samples, .. } => paired && samples >= min_pairs,
        _ => false,
    };
    // `paired`: the cohort's pairings, when they are enough to judge it on.
    let score = |cohort: &CohortId,
                 views: Vec<(ProviderId, CellView, Option<f64>)>,
                 paired: Option<&[PairedEvidence]>|
     -> (Arc<[ProviderEvidence]>, u64) {
        let mut samples = 0;
        let evidence = views
            .into_iter()
            .map(|(p, view, availability)| {
                let mut stats: CellStats = view.stats.clone();
                if stats.availability.is_none() {
                    stats.availability = availability;
                }
                stats.share_bp = weights.get(cohort).map(|w| w.get(&p));
                stats.pairs = paired.map(|list| {
                    list.iter()
                        .filter(|pe| pe.a == p || pe.b == p)
                        .map(|pe| pe.pairs)
                        .max()
                        .unwrap_or(0)
                });
                samples += stats.samples;
                let score = usable(&view, paired.is_some())
                    .then(|| scorer.score(&p, &stats).value())
                    .flatten()
                    // To the microsecond: the journal cites these, and reads them back.
                    .map(|s| super::rounded(s, 1e3));
                let se = score
                    .and_then(|_| quantile_stderr(&stats, percentile))
                    .map(|s| super::rounded(s, 1e3));
                ProviderEvidence::new(p, score, stats.samples).with_stderr(se)
            })
            .collect();
        (evidence, samples)
    };
    let availability = |snapshot: &Snapshot, network: NetworkKey, p: &ProviderId| -> Option<f64> {
        if metric == Metric::Probe {
            return None;
        }
        let v = snapshot.cell(Metric::Probe, network, p);
        v.status
            .is_steerable()
            .then_some(v.stats.availability)
            .flatten()
    };

    let existing: HashMap<u32, &CohortId> = current
        .cohorts
        .iter()
        .filter_map(|c| match c.networks.as_slice() {
            [NetworkKey::Asn(a)] => Some((*a, &c.cohort)),
            _ => None,
        })
        .collect();
    let mut asns: Vec<u32> = ladder.iter().flat_map(|s| s.asns(metric)).collect();
    asns.extend(existing.keys().copied());
    asns.sort_unstable();
    asns.dedup();
    let longest = ladder.last().unwrap_or(snapshot);
    let least = ladder
        .iter()
        .map(Snapshot::min_samples)
        .min()
        .unwrap_or(0)
        .min(min_pairs);
    for asn in asns {
        let own_cut = NetworkKey::Asn(asn);
        // The unbiased signals, paired probes first, then navigations served from cache; raw
        // navigation (which carries the cache-warmth bias) only where neither runs at all.
        let unbiased = [Metric::Probe, Metric::TtfbHit]
            .into_iter()
            .filter(|m| *m != metric && longest.samples(*m, own_cut) > 0)
            .collect::<Vec<_>>();
        let signals: Vec<Metric> = if unbiased.is_empty() {
            vec![metric]
        } else {
            unbiased
        };
        // A network is judged on a signal only when every provider's cell holds at least
        // the snapshot's `min_samples` (or, paired, `min_pairs`) in some window; the longest
        // window holds the most, so one that falls short there is not judged on its own, and
        // the pairings and quantiles below need not be read.
        if !signals.iter().any(|&signal| {
            providers
                .iter()
                .all(|p| longest.cell_samples(signal, own_cut, p) >= least)
        }) {
            continue;
        }
        let Some((snapshot, signal, pairings, paired)) = ladder.iter().find_map(|snapshot| {
            signals.iter().find_map(|&signal| {
                // Own evidence or none: a thin ASN holds (or rejoins its region), never
                // borrowing its country's cut. Paired probes count from `min_pairs` pairs.
                let pairings = if signal == Metric::Probe {
                    pairings_of(&providers, |a, b| snapshot.pairing(own_cut, a, b))
                } else {
                    Vec::new()
                };
                let paired = paired_enough(&providers, &pairings, min_pairs);
                let enough = snapshot.cut_for(signal, &[own_cut], &providers).is_some()
                    || (paired
                        && providers
                            .iter()
                            .all(|p| usable(&snapshot.cell(signal, own_cut, p), true)));
                enough.then_some((snapshot, signal, pairings, paired))
            })
        }) else {
            continue;
        };
        let country = snapshot.country_of_asn(asn);
        let total = snapshot.samples(metric, NetworkKey::Global).max(1) as f64;
        let id = existing
            .get(&asn)
            .map_or_else(|| cohort_id_for(own_cut), |c| (*c).clone());
        let views = providers
            .iter()
            .map(|p| {
                let avail = if signal == metric {
                    availability(snapshot, own_cut, p)
                } else {
                    None
                };
                (p.clone(), snapshot.cell(signal, own_cut, p), avail)
            })
            .collect();
        let (mut evidence, _) = score(&id, views, paired.then_some(&pairings[..]));
        let experienced = if signal == metric {
            Arc::from(Vec::new())
        } else {
            let views = providers
                .iter()
                .map(|p| {
                    let avail = availability(snapshot, own_cut, p);
                    (p.clone(), snapshot.cell(metric, own_cut, p), avail)
                })
                .collect();
            score(&id, views, None).0
        };
        let mut pairings = pairings;
        // Judged over a longer window: a provider whose latest window differs from it beyond
        // the noise, and by a material amount, changed within it: the change is added to its
        // score. Either signal can show it (navigation is the denser where the provider
        // carries most of the traffic).
        if !std::ptr::eq(latest, snapshot) {
            let mut list: Vec<ProviderEvidence> = evidence.to_vec();
            let mut changed = Vec::new();
            for e in &mut list {
                let Some(score) = e.score else { continue };
                let shift = [signal, Metric::TtfbHit].iter().find_map(|m| {
                    change(
                        &snapshot.cell(*m, own_cut, &e.provider).stats,
                        &latest.cell(*m, own_cut, &e.provider).stats,
                        percentile,
                        rum,
                    )
                });
                if let Some((shift, var)) = shift {
                    e.score = Some(super::rounded(score + shift, 1e3));
                    e.stderr = e
                        .stderr
                        .map(|se| super::rounded((se * se + var).sqrt(), 1e3));
                    changed.push(e.provider.clone());
                }
            }
            if !changed.is_empty() {
                evidence = list.into();
                // A changed provider's latest window is not paired with the others' longer one.
                for pe in &mut pairings {
                    if changed.contains(&pe.a) || changed.contains(&pe.b) {
                        pe.correlation = 0.0;
                    }
                }
            }
        }
        let own_samples = snapshot.samples(metric, own_cut);
        let parent = country
            .and_then(|c| {
                static_plan
                    .cohorts
                    .iter()
                    .find(|r| {
                        r.networks.contains(&NetworkKey::Country(c))
                            || c.continent()
                                .is_some_and(|k| r.networks.contains(&NetworkKey::Continent(k)))
                    })
                    .map(|r| r.cohort.clone())
            })
            .or_else(|| default.clone());
        out.push(CohortInput {
            cohort: id,
            networks: [own_cut].into(),
            parent,
            share: own_samples as f64 / total,
            cut: Some(own_cut),
            evidence,
            pairings: pairings.into(),
            experienced,
        });
    }
    // Regions: the traffic of the networks each one matches first (the `*` region takes the
    // rest), without the ASNs carved out above.
    let carved: std::collections::HashSet<u32> = out
        .iter()
        .filter_map(|i: &CohortInput| match i.networks.as_slice() {
            [NetworkKey::Asn(a)] => Some(*a),
            _ => None,
        })
        .collect();
    let region_of = |n: &ClientNetwork| -> Option<usize> {
        let continent = n.continent();
        static_plan.cohorts.iter().position(|r| {
            r.networks.iter().any(|k| match k {
                NetworkKey::Asn(a) => n.asn == Some(*a),
                NetworkKey::Country(c) => n.country == Some(*c),
                NetworkKey::Continent(c) => continent == Some(*c),
                NetworkKey::Global => true,
            })
        })
    };
    for (ri, region) in static_plan.cohorts.iter().enumerate() {
        let include = |n: &ClientNetwork| {
            n.asn.is_none_or(|a| !carved.contains(&a)) && region_of(n) == Some(ri)
        };
        let label = if region.networks.len() == 1 {
            region.networks[0]
        } else {
            NetworkKey::Global
        };
        let probes: Vec<CellView> = providers
            .iter()
            .map(|p| snapshot.merged_where(Metric::Probe, p, label, include))
            .collect();
        // The same signals as an ASN's: paired probes, else navigations served from cache,
        // else navigation.
        let signal = if metric != Metric::Probe && probes.iter().any(|v| v.stats.samples > 0) {
            Metric::Probe
        } else if metric != Metric::Probe
            && providers.iter().any(|p| {
                snapshot
                    .merged_where(Metric::TtfbHit, p, label, include)
                    .stats
                    .samples
                    > 0
            })
        {
            Metric::TtfbHit
        } else {
            metric
        };
        let navigation = |p: &ProviderId, probe: CellView| {
            let view = snapshot.merged_where(metric, p, label, include);
            let avail = (metric != Metric::Probe)
                .then_some(probe)
                .filter(|v| v.status.is_steerable())
                .and_then(|v| v.stats.availability);
            (p.clone(), view, avail)
        };
        let views = providers
            .iter()
            .zip(probes.iter().cloned())
            .map(|(p, probe)| match signal {
                Metric::Probe => (p.clone(), probe, None),
                Metric::TtfbHit => (
                    p.clone(),
                    snapshot.merged_where(Metric::TtfbHit, p, label, include),
                    None,
                ),
                _ => navigation(p, probe),
            })
            .collect();
        let pairings = if signal == Metric::Probe {
            pairings_of(&providers, |a, b| snapshot.pairing_where(a, b, include))
        } else {
            Vec::new()
        };
        let paired = paired_enough(&providers, &pairings, min_pairs);
        let (evidence, _) = score(&region.cohort, views, paired.then_some(&pairings[..]));
        let experienced = if signal == metric {
            Arc::from(Vec::new())
        } else {
            let views = providers
                .iter()
                .zip(probes)
                .map(|(p, probe)| navigation(p, probe))
                .collect();
            score(&region.cohort, views, None).0
        };
        let samples: u64 = providers
            .iter()
            .map(|p| {
                snapshot
                    .merged_where(metric, p, label, include)
                    .stats
                    .samples
            })
            .sum();
        out.push(CohortInput {
            cohort: region.cohort.clone(),
            networks: region.networks.clone(),
            parent: None,
            share: samples as f64 / total,
            cut: (region.networks.len() == 1).then(|| region.networks[0]),
            evidence,
            pairings: pairings.into(),
            experienced,
        });
    }
    out
}

/// How many standard errors a provider's latest window must differ from a longer one by to
/// count as a change within it: strict, since every cohort and provider is tested every round.
pub const CHANGE_Z: f64 = 4.0;

/// Samples the latest window needs before its quantile is compared with a longer window's.
pub const CHANGE_MIN_SAMPLES: u64 = 30;

/// The change of a cell's `percentile` from a longer window (`long`) to its latest part
/// (`short`), with the variance of that difference, when it is beyond [`CHANGE_Z`] standard
/// errors and material (beyond the policy's absolute and relative gaps).
fn change(
    long: &CellStats,
    short: &CellStats,
    percentile: Percentile,
    rum: &RumPolicy,
) -> Option<(f64, f64)> {
    if short.samples < CHANGE_MIN_SAMPLES || long.samples <= short.samples {
        return None;
    }
    let (ql, qs) = (percentile.read(long)?, percentile.read(short)?);
    // The spread is read from the longer window (the latest one's own is too few samples to
    // trust: an unusually tight latest window would look like a change), scaled to the latest
    // window's count; the latest lies inside the longer, so the variance of their difference
    // is `se_long² · (n_long / n_short - 1)`.
    let sl = quantile_stderr(long, percentile)?;
    let var = sl * sl * (long.samples as f64 / short.samples as f64 - 1.0);
    let shift = qs - ql;
    let material = shift.abs() >= rum.absolute_gap.get().as_secs_f64() * 1000.0
        && shift.abs() >= rum.relative_gap.fraction() * ql.max(qs);
    (material && shift.abs() > CHANGE_Z * var.sqrt()).then_some((shift, var))
}

/// Every two providers' pairing that `pairing` finds.
fn pairings_of(
    providers: &[ProviderId],
    pairing: impl Fn(&ProviderId, &ProviderId) -> Option<Pairing>,
) -> Vec<PairedEvidence> {
    let mut out = Vec::new();
    for (i, a) in providers.iter().enumerate() {
        for b in &providers[i + 1..] {
            if let Some(p) = pairing(a, b) {
                out.push(PairedEvidence {
                    a: a.clone(),
                    b: b.clone(),
                    pairs: p.pairs,
                    correlation: super::rounded(p.correlation, 1e4),
                });
            }
        }
    }
    out
}

/// True when every provider is paired with another on at least `min_pairs` loads.
fn paired_enough(providers: &[ProviderId], pairings: &[PairedEvidence], min_pairs: u64) -> bool {
    providers.len() >= 2
        && providers.iter().all(|p| {
            pairings
                .iter()
                .any(|pe| pe.pairs >= min_pairs && (&pe.a == p || &pe.b == p))
        })
}

/// The standard error of a cell's `percentile`, in milliseconds, from its count and spread:
/// `sqrt(p(1-p)/n) / f(q)`, with the density at the quantile read as `0.4 / (p90 - p50)`.
/// `None` when the cell lacks the quantiles.
pub fn quantile_stderr(stats: &CellStats, percentile: Percentile) -> Option<f64> {
    let p = match percentile {
        Percentile::P50 => 0.5,
        Percentile::P75 => 0.75,
        Percentile::P90 => 0.9,
        Percentile::P99 => 0.99,
    };
    let n = stats.samples as f64 * stats.availability.unwrap_or(1.0);
    let (p50, p90) = (stats.p50?, stats.p90?);
    if n < 1.0 || p90.partial_cmp(&p50).is_none_or(|o| o.is_lt()) {
        return None;
    }
    let per_unit = (p90 - p50) / 0.4;
    Some((p * (1.0 - p) / n).sqrt() * per_unit)
}
