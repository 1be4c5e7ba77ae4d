//! One full decision round over 100,000 cohorts × 3 providers, a fifth of them moving. The
//! timing includes freeing each round's decision, as a loop replacing its last plan would.
//!
//! `cargo bench -p multicdn-steering --bench decide -- --warm-up-time 1 --measurement-time 3`

// Setup code: a malformed fixture should stop the bench loudly.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use multicdn_core::{CohortId, CohortPlan, NetworkKey, Policy, ProviderId, Timestamp, Weights};
use multicdn_steering::engine::{CohortInput, EngineState, Inputs, ProviderEvidence, decide};

const COHORTS: usize = 100_000;

const POLICY: &str = r#"
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
  rum: {min_samples: 200, relative_gap: 10%, absolute_gap: 20ms, step: 20%, settle: 10m}
  guardrails: {max_moved_per_hour: 30%, max_change_per_cohort: 40%, stale_after: 15m}
"#;

fn decide_round(c: &mut Criterion) {
    let policy = Policy::from_yaml(POLICY, "bench.yaml").unwrap();
    let providers: Vec<ProviderId> = policy.provider_ids();
    let mut plan = policy.static_plan();
    let mut inputs = Vec::with_capacity(COHORTS);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut asn_cohorts = Vec::with_capacity(COHORTS);
    for i in 0..COHORTS as u32 {
        let asn = 10_000 + i;
        let id = CohortId::new(&format!("as{asn}")).unwrap();
        asn_cohorts.push(CohortPlan {
            cohort: id.clone(),
            networks: [NetworkKey::Asn(asn)].into(),
            weights: Weights::new(providers.iter().cloned().zip([4000, 4000, 2000])).unwrap(),
        });
        // A fifth of the networks see a significant gap; the rest are within noise.
        let gap = if next().is_multiple_of(5) { 80.0 } else { 5.0 };
        let base = 80.0 + (next() % 200) as f64;
        inputs.push(CohortInput {
            cohort: id,
            networks: [NetworkKey::Asn(asn)].into(),
            parent: Some(CohortId::new("default").unwrap()),
            share: 1.0 / COHORTS as f64,
            cut: Some(NetworkKey::Asn(asn)),
            evidence: providers
                .iter()
                .enumerate()
                .map(|(k, p)| ProviderEvidence {
                    stderr: None,
                    provider: p.clone(),
                    score: Some(base + if k == (i as usize % 3) { gap } else { 0.0 }),
                    samples: 500 + next() % 5000,
                })
                .collect(),
        });
    }
    asn_cohorts.append(&mut plan.cohorts);
    plan.cohorts = asn_cohorts;
    let health = BTreeMap::new();
    let state = EngineState::new();
    let now = Timestamp::from_secs(1_800_000_000);
    let round = Inputs {
        policy: &policy,
        current: &plan,
        cohorts: &inputs,
        health: &health,
        data_as_of: Some(now),
        state: &state,
    };
    let d = decide(now, &round);
    eprintln!(
        "decide: {} cohorts in the plan, {} journal entries, {} held by guardrails",
        d.plan.cohorts.len(),
        d.journal.len(),
        d.held.len()
    );
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
