//! One full decision round over 100,000 cohorts × 3 providers, in the middle of a day: a
//! provider failed over (its cohorts remember their weights from before), pins in force,
//! cohorts settling and under hysteresis from a round twenty minutes earlier, a tenth of the
//! cohorts under `min_samples`, scores with their standard errors, and an hourly cap that
//! binds (a fifth of the cohorts see a significant gap; the cap lets only part of them move).
//! The timing includes freeing each round's decision, as a loop replacing its last plan would.
//!
//! `cargo bench -p multicdn-steering --bench decide -- --warm-up-time 1 --measurement-time 3`

// Setup code: a malformed fixture should stop the bench loudly.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use multicdn_core::{CohortId, CohortPlan, NetworkKey, Policy, ProviderId, Timestamp, Weights};
use multicdn_steering::engine::{
    CohortInput, EngineState, Inputs, ProviderEvidence, ProviderHealth, decide,
};

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
                .map(|(k, p)| {
                    // A tenth of the cohorts are thin: under min_samples, they cannot move.
                    let samples = if i % 10 == 3 {
                        50 + next() % 150
                    } else {
                        500 + next() % 5000
                    };
                    let score = base + if k == (i as usize % 3) { gap } else { 0.0 };
                    ProviderEvidence::new(p.clone(), Some(score), samples)
                        .with_stderr(Some(0.5 * score / (samples as f64).sqrt()))
                })
                .collect(),
        });
    }
    asn_cohorts.append(&mut plan.cohorts);
    plan.cohorts = asn_cohorts;
    // Twenty minutes earlier: edgeco went down five minutes before that, and that round's
    // moves left cohorts settling, under hysteresis, and spent part of the hourly cap.
    let now = Timestamp::from_secs(1_800_000_000);
    let earlier = Timestamp::from_secs(1_800_000_000 - 20 * 60);
    let mut health = BTreeMap::new();
    health.insert(
        providers
            .iter()
            .find(|p| p.as_str() == "edgeco")
            .unwrap()
            .clone(),
        ProviderHealth::down(Timestamp::from_secs(1_800_000_000 - 25 * 60)),
    );
    let first = decide(
        earlier,
        &Inputs {
            policy: &policy,
            current: &plan,
            cohorts: &inputs,
            health: &health,
            data_as_of: Some(earlier),
            state: &EngineState::new(),
        },
    );
    let (plan, state) = (first.plan, first.state);
    let round = Inputs {
        policy: &policy,
        current: &plan,
        cohorts: &inputs,
        health: &health,
        data_as_of: Some(now),
        state: &state,
    };
    let d = decide(now, &round);
    let mut rules: BTreeMap<String, usize> = BTreeMap::new();
    for e in &d.journal {
        *rules.entry(format!("{:?}", e.rule)).or_default() += 1;
    }
    eprintln!(
        "decide: {} cohorts in the plan, {} journal entries {rules:?}, {} held by guardrails, {} in memory",
        d.plan.cohorts.len(),
        d.journal.len(),
        d.held.len(),
        state.cohorts.len()
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
