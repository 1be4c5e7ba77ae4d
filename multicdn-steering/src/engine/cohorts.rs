//! Building the engine's inputs from a scoreboard snapshot: one [`CohortInput`] per ASN whose
//! cells are steerable for every provider (or that already steers as its own cohort, read with
//! fallback to coarser cuts when it has gone thin), and one per region of the policy, scored on
//! the traffic that region serves: the networks it matches first, without the carved-out ASNs.

use std::collections::HashMap;
use std::sync::Arc;

use multicdn_core::{CellStats, CohortId, NetworkKey, Policy, ProviderId, Scorer, SteeringPlan};

use super::{CohortInput, ProviderEvidence, cohort_id_for};
use crate::beacon::ClientNetwork;
use crate::scoreboard::{CellView, Metric, Snapshot};

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
                ProviderEvidence {
                    score: view
                        .status
                        .is_steerable()
                        .then(|| scorer.score(&p, &stats).value())
                        .flatten()
                        // To the microsecond: the journal cites these, and reads them back.
                        .map(|s| super::rounded(s, 1e3)),
                    samples: stats.samples,
                    provider: p,
                }
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
        let country = snapshot.country_of_asn(asn);
        let chain = ClientNetwork::new(Some(asn), country).cuts();
        let own = snapshot.cut_for(metric, &chain[..1], &providers);
        let id = existing
            .get(&asn)
            .map_or_else(|| cohort_id_for(NetworkKey::Asn(asn)), |c| (*c).clone());
        let cut = match own {
            Some(c) => c,
            None if existing.contains_key(&asn) => {
                match snapshot.cut_for(metric, &chain, &providers) {
                    Some(c) => c,
                    None => continue,
                }
            }
            None => continue,
        };
        let views = providers
            .iter()
            .map(|p| {
                (
                    p.clone(),
                    snapshot.cell(metric, cut, p),
                    availability(cut, p),
                )
            })
            .collect();
        let (evidence, _) = score(&id, views);
        let own_samples = snapshot.samples(metric, NetworkKey::Asn(asn));
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
            networks: [NetworkKey::Asn(asn)].into(),
            parent,
            share: own_samples as f64 / total,
            cut: Some(cut),
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
        let views = providers
            .iter()
            .map(|p| {
                let view = snapshot.merged_where(metric, p, label, include);
                let avail = (metric != Metric::Probe)
                    .then(|| snapshot.merged_where(Metric::Probe, p, label, include))
                    .filter(|v| v.status.is_steerable())
                    .and_then(|v| v.stats.availability);
                (p.clone(), view, avail)
            })
            .collect();
        let (evidence, samples) = score(&region.cohort, views);
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
