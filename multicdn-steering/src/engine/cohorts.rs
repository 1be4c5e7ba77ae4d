//! Building the engine's inputs from a scoreboard snapshot: one [`CohortInput`] per ASN whose
//! own cells are steerable for every provider, and one per region of the policy, scored on the
//! traffic that region serves: the networks it matches first, without the carved-out ASNs.
//!
//! **Which signal decides.** The paired client probe ([`Metric::Probe`]: every provider timed
//! on the same small object by the same user at the same moment) decides wherever a cohort has
//! probe samples: both providers are measured on one population, so a provider's colder cache
//! at the 10% floor does not count against it. Navigation TTFB (`metric`) decides only where no
//! probe runs at all, and it carries that bias (the minor provider's misses): say so when you
//! read its moves. The traffic share that weights the hourly cap always comes from `metric`.
//!
//! **Own evidence only.** An ASN is scored on its own cut or not at all: when its cells go thin
//! it gets no input, so a cohort already in force holds its weights (and rejoins its region once
//! they equal the region's); it never moves on its country's cut, which other networks
//! dominate.
//!
//! **Spread.** Each score carries its standard error, from the cell's own count and spread:
//! for the p-quantile `q` of `n` samples, `sqrt(p(1-p)/n) / f(q)`, the density `f` read from the
//! cell as `0.4 / (p90 - p50)`. The engine requires a gap of
//! [`SIGNIFICANCE_Z`](super::SIGNIFICANCE_Z) standard errors of the difference besides the
//! policy's fixed gaps. The two probe estimates come from the same page loads and are
//! positively correlated; treating them as independent overstates the difference's error, on
//! the careful side.

use std::collections::HashMap;
use std::sync::Arc;

use multicdn_core::{CellStats, CohortId, NetworkKey, Policy, ProviderId, Scorer, SteeringPlan};

use super::{CohortInput, ProviderEvidence, cohort_id_for};
use crate::beacon::ClientNetwork;
use crate::scoreboard::{CellView, Metric, Snapshot};
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

    let score = |cohort: &CohortId,
                 views: Vec<(ProviderId, CellView, Option<f64>)>|
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
                samples += stats.samples;
                let score = view
                    .status
                    .is_steerable()
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
    let availability = |network: NetworkKey, p: &ProviderId| -> Option<f64> {
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
    let mut asns = snapshot.asns(metric);
    asns.extend(existing.keys().copied());
    asns.sort_unstable();
    asns.dedup();
    for asn in asns {
        let own_cut = NetworkKey::Asn(asn);
        let country = snapshot.country_of_asn(asn);
        // The paired probe decides where it runs; navigation only where it does not.
        let signal = if metric != Metric::Probe && snapshot.samples(Metric::Probe, own_cut) > 0 {
            Metric::Probe
        } else {
            metric
        };
        // Own evidence or none: a thin ASN holds (or rejoins its region), never borrowing its
        // country's cut.
        if snapshot.cut_for(signal, &[own_cut], &providers).is_none() {
            continue;
        }
        let id = existing
            .get(&asn)
            .map_or_else(|| cohort_id_for(own_cut), |c| (*c).clone());
        let views = providers
            .iter()
            .map(|p| {
                let avail = if signal == metric {
                    availability(own_cut, p)
                } else {
                    None
                };
                (p.clone(), snapshot.cell(signal, own_cut, p), avail)
            })
            .collect();
        let (evidence, _) = score(&id, views);
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
        let by_probe = metric != Metric::Probe && probes.iter().any(|v| v.stats.samples > 0);
        let views = providers
            .iter()
            .zip(probes)
            .map(|(p, probe)| {
                if by_probe {
                    return (p.clone(), probe, None);
                }
                let view = snapshot.merged_where(metric, p, label, include);
                let avail = (metric != Metric::Probe)
                    .then_some(probe)
                    .filter(|v| v.status.is_steerable())
                    .and_then(|v| v.stats.availability);
                (p.clone(), view, avail)
            })
            .collect();
        let (evidence, _) = score(&region.cohort, views);
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
        });
    }
    out
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
