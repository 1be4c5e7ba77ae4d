//! One full decision round over 100,000 cohorts × 3 providers, in the middle of a day, forty
//! minutes after an earlier round on other evidence:
//!
//! - a provider failed over 45 minutes ago (every cohort remembers its weights from before);
//! - three pins in force;
//! - traffic shares Zipf over the cohorts (the busiest is thousands of times the quietest);
//! - a tenth of the cohorts under `min_samples` (they cannot move), scores with standard errors;
//! - the earlier round moved a tenth of the cohorts: half of them still see the gap and move
//!   another step (after their re-measurement), half now see a small gap the other way, which
//!   hysteresis holds; another tenth see a significant gap for the first time;
//! - the earlier round's moves spent part of the hourly cap, and this round's proposals want
//!   more than is left, so the cap binds (the setup asserts it: moves made and moves held).
//!
//! The timing includes freeing each round's decision, as a loop replacing its last plan would.
//! `decide` uses every core the process may run on (its per-cohort phases in chunks above
//! 32,768 cohorts): run it under `taskset -c 0` for the one-core figure.
//!
//! `cargo bench -p multicdn-steering --bench decide -- --warm-up-time 1 --measurement-time 3`

// Setup code: a malformed fixture should stop the bench loudly.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use multicdn_core::{CohortId, CohortPlan, NetworkKey, Policy, ProviderId, Timestamp, Weights};
use multicdn_steering::engine::{
    CohortInput, EngineState, Inputs, PairedEvidence, ProviderEvidence, ProviderHealth, decide,
};
use multicdn_steering::journal::{Guardrail, Rule};

const COHORTS: usize = 100_000;

const POLICY: &str = r#"
site: {host: www.example.com}
providers:
  fastly: {kind: fastly, edge_host: f.example.net, service_id: svc}
  cloudflare: {kind: cloudflare, edge_host: c.example.net, zone_id: zone}
  edgeco: {kind: generic, edge_host: e.example.net}
health: {path: /h, expect: ok, regions: [a, b, c]}
steering:
  record: www.example.com
  zone: example.com
  regions:
    - name: europe
      match: [GB, IE, DE, FR, NL, ES, IT]
      weights: {fastly: 60%, cloudflare: 30%, edgeco: 10%}
    - name: default
      match: ["*"]
      weights: {fastly: 40%, cloudflare: 40%, edgeco: 20%}
  floors: {measurement: 10%}
  failover: {steps: [50%, 100%], interval: 1m}
  rum: {min_samples: 200, relative_gap: 10%, absolute_gap: 20ms, step: 20%, settle: 30m}
  guardrails: {max_moved_per_hour: 3%, max_change_per_cohort: 40%, stale_after: 15m}
  pins:
    - {network: AS10007, weights: {fastly: 50%, cloudflare: 40%, edgeco: 10%}, until: 2030-01-01T00:00:00Z, reason: peering maintenance}
    - {network: AS10500, weights: {fastly: 80%, cloudflare: 10%, edgeco: 10%}, until: 2030-01-01T00:00:00Z, reason: commit}
    - {network: AS60000, weights: {fastly: 30%, cloudflare: 60%, edgeco: 10%}, until: 2030-01-01T00:00:00Z, reason: known event}
"#;

/// What a cohort's evidence shows in a round: the provider that is slower, and by how much.
#[derive(Clone, Copy)]
struct Gap {
    slow: usize,
    ms: f64,
}

/// One round's inputs: every cohort's evidence, with the gaps `gaps` gives it.
fn inputs(
    providers: &[ProviderId],
    ids: &[CohortId],
    shares: &[f64],
    gaps: impl Fn(usize) -> Gap,
    seed: u64,
) -> Vec<CohortInput> {
    let mut x: u64 = seed;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    ids.iter()
        .enumerate()
        .map(|(i, id)| {
            let asn = 10_000 + i as u32;
            let gap = gaps(i);
            let base = 80.0 + (next() % 200) as f64;
            // Samples follow the traffic share; a tenth of the cohorts are thin whatever
            // their share: under min_samples, they cannot move.
            let busy = (shares[i] * 200_000_000.0) as u64;
            let evidence: Arc<[ProviderEvidence]> = providers
                .iter()
                .enumerate()
                .map(|(k, p)| {
                    let samples = if i % 10 == 3 {
                        50 + next() % 150
                    } else {
                        300 + busy + next() % 2000
                    };
                    let noise = (next() % 100) as f64 / 20.0;
                    let score = base + noise + if k == gap.slow { gap.ms } else { 0.0 };
                    ProviderEvidence::new(p.clone(), Some(score), samples)
                        .with_stderr(Some(0.5 * score / (samples as f64).sqrt()))
                })
                .collect();
            // Half the cohorts measured on the paired probe: every two providers compared on
            // the loads that timed both (the thin ones among them judged from `min_pairs`).
            let pairings: Arc<[PairedEvidence]> = if i % 2 == 0 {
                let mut out = Vec::new();
                for (a, ea) in evidence.iter().enumerate() {
                    for eb in &evidence[a + 1..] {
                        out.push(PairedEvidence {
                            a: ea.provider.clone(),
                            b: eb.provider.clone(),
                            pairs: ea.samples.min(eb.samples),
                            correlation: 0.6 + (next() % 30) as f64 / 100.0,
                        });
                    }
                }
                out.into()
            } else {
                Arc::from(vec![])
            };
            CohortInput {
                cohort: id.clone(),
                networks: [NetworkKey::Asn(asn)].into(),
                parent: Some(CohortId::new("default").unwrap()),
                share: shares[i],
                cut: Some(NetworkKey::Asn(asn)),
                evidence,
                pairings,
                experienced: Arc::from(vec![]),
            }
        })
        .collect()
}

fn decide_round(c: &mut Criterion) {
    let policy = Policy::from_yaml(POLICY, "bench.yaml").unwrap();
    let providers: Vec<ProviderId> = policy.provider_ids();
    let mut plan = policy.static_plan();
    let ids: Vec<CohortId> = (0..COHORTS)
        .map(|i| CohortId::new(&format!("as{}", 10_000 + i)).unwrap())
        .collect();
    // Zipf traffic (s = 1) over the cohorts, in a shuffled order so that share and position
    // in the plan are unrelated.
    let harmonic: f64 = (1..=COHORTS).map(|r| 1.0 / r as f64).sum();
    let mut shares: Vec<f64> = (1..=COHORTS).map(|r| 1.0 / (r as f64 * harmonic)).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..shares.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        shares.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut asn_cohorts: Vec<CohortPlan> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| CohortPlan {
            cohort: id.clone(),
            networks: [NetworkKey::Asn(10_000 + i as u32)].into(),
            weights: Weights::new(providers.iter().cloned().zip([4000, 4000, 2000])).unwrap(),
        })
        .collect();
    asn_cohorts.append(&mut plan.cohorts);
    plan.cohorts = asn_cohorts;
    // Providers in id order: cloudflare, edgeco, fastly. Gaps on cloudflare or fastly, so that
    // they can move (edgeco is down).
    let slow_of = |i: usize| if i.is_multiple_of(2) { 0 } else { 2 };
    let within_noise = Gap { slow: 1, ms: 0.0 };
    // Forty minutes earlier (edgeco down five minutes before that): a tenth of the cohorts
    // see a clear gap.
    let earlier_inputs = inputs(
        &providers,
        &ids,
        &shares,
        |i| {
            if i % 10 == 0 {
                Gap {
                    slow: slow_of(i),
                    ms: 80.0,
                }
            } else {
                within_noise
            }
        },
        0x2545_f491_4f6c_dd1d,
    );
    // Now: of those, half still see it and half see a small gap the other way (the provider
    // they moved to now slower by 30 ms: significant, but not beyond the switch-back factor);
    // another tenth see a clear gap for the first time.
    let now_inputs = inputs(
        &providers,
        &ids,
        &shares,
        |i| match i % 20 {
            0 => Gap {
                slow: slow_of(i),
                ms: 80.0,
            },
            10 => Gap {
                slow: 2 - slow_of(i),
                ms: 30.0,
            },
            5 | 15 => Gap {
                slow: slow_of(i),
                ms: 80.0,
            },
            _ => within_noise,
        },
        0x6a09_e667_f3bc_c908,
    );
    let now = Timestamp::from_secs(1_800_000_000);
    let earlier = Timestamp::from_secs(1_800_000_000 - 40 * 60);
    let mut health = BTreeMap::new();
    health.insert(
        providers
            .iter()
            .find(|p| p.as_str() == "edgeco")
            .unwrap()
            .clone(),
        ProviderHealth::down(Timestamp::from_secs(1_800_000_000 - 45 * 60)),
    );
    let first = decide(
        earlier,
        &Inputs {
            policy: &policy,
            current: &plan,
            cohorts: &earlier_inputs,
            health: &health,
            data_as_of: Some(earlier),
            state: &EngineState::new(),
        },
    );
    let (plan, state) = (first.plan, first.state);
    let round = Inputs {
        policy: &policy,
        current: &plan,
        cohorts: &now_inputs,
        health: &health,
        data_as_of: Some(now),
        state: &state,
    };
    let d = decide(now, &round);
    let mut rules: BTreeMap<String, usize> = BTreeMap::new();
    for e in &d.journal {
        *rules.entry(format!("{:?}", e.rule)).or_default() += 1;
    }
    let by_cap = d
        .held
        .iter()
        .filter(|h| h.by == Guardrail::HourlyCap)
        .count();
    eprintln!(
        "decide: {} cohorts in the plan, {} journal entries {rules:?}, {} held ({} by the hourly cap), {} in memory; the earlier round made {} moves",
        d.plan.cohorts.len(),
        d.journal.len(),
        d.held.len(),
        by_cap,
        state.cohorts.len(),
        first.journal.iter().filter(|e| e.rule == Rule::Rum).count(),
    );
    // The round this bench claims: moves made, moves held by the cap, re-measurements.
    let count = |r: Rule| d.journal.iter().filter(|e| e.rule == r).count();
    if count(Rule::Rum) < 1_000 || by_cap < 1_000 || count(Rule::Remeasured) < 1_000 {
        panic!(
            "the fixture no longer has the round it describes: {rules:?}, {by_cap} held by the cap"
        );
    }
    let mut group = c.benchmark_group("decide");
    group.throughput(Throughput::Elements(COHORTS as u64));
    group.sample_size(10);
    group.bench_function("round_100k_cohorts_3_providers", |b| {
        b.iter(|| black_box(decide(now, black_box(&round))))
    });
    group.finish();
}

criterion_group!(benches, decide_round);
criterion_main!(benches);
