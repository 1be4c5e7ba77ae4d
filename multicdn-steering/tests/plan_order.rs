//! The decision does not depend on the order the inputs list the cohorts in, and a plan that
//! lists a cohort twice keeps its first entry: the engine finds a round's cohorts by the hash
//! of their ids, with a binary search for a few inputs out of plan order and a table once many
//! are, and both paths must answer as the in-order one does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeMap;
use std::sync::Arc;

use multicdn_core::{CohortPlan, NetworkKey, SteeringPlan, Timestamp};
use multicdn_steering::engine::{
    CohortInput, Decision, EngineState, Inputs, ProviderEvidence, cohort_id_for, decide,
};
use multicdn_steering::journal::Rule;

mod common;
use common::{Rng, c, p, policy, w};

const RUM: &str =
    "{min_samples: 200, window: 1h, relative_gap: 10%, absolute_gap: 20ms, step: 20%, settle: 10m}";

/// `n` carved-out networks in force at fastly 50%, every third with cloudflare clearly faster.
fn estate(n: u32) -> (SteeringPlan, Vec<CohortInput>) {
    let pol = policy(RUM);
    let mut plan = pol.static_plan();
    let mut rng = Rng(0x5eed);
    let mut inputs = Vec::new();
    let mut finer = Vec::new();
    for k in 0..n {
        let asn = 64_000 + k;
        let id = cohort_id_for(NetworkKey::Asn(asn));
        finer.push(CohortPlan {
            cohort: id.clone(),
            networks: [NetworkKey::Asn(asn)].into(),
            weights: w(5_000),
        });
        let base = 80.0 + 100.0 * rng.next();
        let fastly = if k % 3 == 0 { base + 60.0 } else { base };
        let evidence: Arc<[ProviderEvidence]> = [("fastly", fastly), ("cloudflare", base)]
            .into_iter()
            .map(|(name, score)| {
                ProviderEvidence::new(p(name), Some(score), 1_000)
                    .with_stderr(Some(0.5 * score / 1_000f64.sqrt()))
            })
            .collect();
        inputs.push(CohortInput {
            cohort: id,
            networks: [NetworkKey::Asn(asn)].into(),
            parent: Some(c("default")),
            share: 1.0 / f64::from(n),
            cut: Some(NetworkKey::Asn(asn)),
            evidence,
            pairings: Arc::from(vec![]),
            experienced: Arc::from(vec![]),
        });
    }
    finer.append(&mut plan.cohorts);
    plan.cohorts = finer;
    (plan, inputs)
}

fn round(plan: &SteeringPlan, inputs: &[CohortInput]) -> Decision {
    let pol = policy(RUM);
    let now = Timestamp::from_secs(1_800_000_000);
    decide(
        now,
        &Inputs {
            policy: &pol,
            current: plan,
            cohorts: inputs,
            health: &BTreeMap::new(),
            data_as_of: Some(now),
            state: &EngineState::new(),
        },
    )
}

/// Inputs in plan order, reversed (every input a stray: the table), and with a few swapped
/// (the binary search): the same plan, the same journal.
#[test]
fn the_decision_is_the_same_whatever_order_the_inputs_come_in() {
    let (plan, inputs) = estate(900);
    let in_order = round(&plan, &inputs);
    let moves = in_order
        .journal
        .iter()
        .filter(|e| e.rule == Rule::Rum)
        .count();
    assert_eq!(moves, 300, "every third network moves");

    let mut reversed = inputs.clone();
    reversed.reverse();
    let mut few_swapped = inputs.clone();
    for k in (0..40).map(|k| k * 20) {
        few_swapped.swap(k, k + 7);
    }
    for (how, inputs) in [("reversed", reversed), ("a few swapped", few_swapped)] {
        let d = round(&plan, &inputs);
        assert_eq!(d.plan, in_order.plan, "{how}: the plan");
        assert_eq!(d.journal, in_order.journal, "{how}: the journal");
    }
}

/// A cohort listed twice in the plan in force keeps its first entry: it appears once in the
/// decision, moved from the first entry's weights.
#[test]
fn a_cohort_listed_twice_keeps_its_first_entry() {
    let (mut plan, inputs) = estate(600);
    let mut again = plan.cohorts[3].clone();
    again.weights = w(9_000);
    plan.cohorts.insert(450, again);
    let d = round(&plan, &inputs);
    let id = &plan.cohorts[3].cohort;
    let listed: Vec<_> = d.plan.cohorts.iter().filter(|c| c.cohort == *id).collect();
    assert_eq!(listed.len(), 1, "{id} listed once");
    let moved = d.journal.iter().find(|e| e.cohort == *id).unwrap();
    assert_eq!(
        moved.before,
        w(5_000),
        "moved from the first entry's weights"
    );
    assert_eq!(listed[0].weights, moved.after);
    assert_eq!(
        d.plan.cohorts.len(),
        plan.cohorts.len() - 1,
        "every other cohort kept"
    );
}
