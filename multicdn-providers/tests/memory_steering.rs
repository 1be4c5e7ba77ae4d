//! The in-memory steerer as the quickstart uses it: apply the policy's static plan, resolve
//! clients, apply a failover step, and watch traffic move.

// Helpers outside `#[test]` functions unwrap too: a failed setup should fail the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use multicdn_core::policy::Share;
use multicdn_core::{ApplyOptions, NetworkKey, Policy, ProviderId, Steerer, Weights};
use multicdn_providers::memory::MemorySteerer;

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

fn policy() -> Policy {
    Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap()
}

fn share(steerer: &MemorySteerer, networks: &[NetworkKey], provider: &ProviderId, n: u32) -> f64 {
    steerer.reset_counts();
    for _ in 0..n {
        steerer.resolve(networks).unwrap();
    }
    steerer.served_total(provider) as f64 / f64::from(n)
}

#[tokio::test]
async fn traffic_moves_when_a_failover_plan_is_applied() {
    let steerer = MemorySteerer::with_seed(2026);
    let plan = policy().static_plan();
    steerer
        .apply(&plan, &ApplyOptions::default())
        .await
        .unwrap();
    assert_eq!(steerer.current().await.unwrap().cohorts, plan.cohorts);

    let germany: Vec<NetworkKey> = vec!["DE".parse().unwrap(), "AS3320".parse().unwrap()];
    let before = share(&steerer, &germany, &p("fastly"), 20_000);
    assert!((0.88..0.92).contains(&before), "{before}");

    let mut failover = plan.clone();
    failover.cohorts[0].weights = Weights::single(p("cloudflare"));
    let diff = steerer.plan(&failover).await.unwrap();
    assert_eq!(diff.changes.len(), 1);
    steerer
        .apply(&failover, &ApplyOptions::default())
        .await
        .unwrap();
    assert_eq!(share(&steerer, &germany, &p("fastly"), 20_000), 0.0);
    // Other cohorts keep their split.
    let us: Vec<NetworkKey> = vec!["US".parse().unwrap()];
    let us_fastly = share(&steerer, &us, &p("fastly"), 20_000);
    assert!((0.83..0.87).contains(&us_fastly), "{us_fastly}");
    let brazil: Vec<NetworkKey> = vec!["BR".parse().unwrap()];
    assert_eq!(steerer.cohort_for(&brazil).unwrap().as_str(), "default");
}

#[tokio::test]
async fn the_same_seed_gives_the_same_answers_and_clones_share_state() {
    let plan = policy().static_plan();
    let a = MemorySteerer::with_seed(11);
    let b = MemorySteerer::with_seed(11);
    a.apply(&plan, &ApplyOptions::default()).await.unwrap();
    b.apply(&plan, &ApplyOptions::default()).await.unwrap();
    let nets: Vec<NetworkKey> = vec!["continent:AS".parse().unwrap()];
    let run = |s: &MemorySteerer| {
        (0..500)
            .map(|_| s.resolve(&nets).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(&a), run(&b));
    let clone = a.clone();
    clone.resolve(&nets).unwrap();
    assert_eq!(
        a.served().values().flat_map(|m| m.values()).sum::<u64>(),
        501
    );
}

#[tokio::test]
async fn applying_the_same_plan_again_changes_nothing_and_the_guard_holds() {
    let plan = policy().static_plan();
    let steerer = MemorySteerer::new().with_max_touched(Share::percent(30));
    steerer
        .apply(&plan, &ApplyOptions::default())
        .await
        .unwrap();
    assert!(
        steerer
            .apply(&plan, &ApplyOptions::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(steerer.applied(), 1);
    let mut everything = plan.clone();
    for c in &mut everything.cohorts {
        c.weights = Weights::single(p("fastly"));
    }
    let err = steerer
        .apply(&everything, &ApplyOptions::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("force"), "{err}");
    steerer
        .apply(&everything, &ApplyOptions::default().force(true))
        .await
        .unwrap();
    assert_eq!(steerer.applied(), 2);
    let mut broken = plan.clone();
    broken
        .cohorts
        .retain(|c| !c.networks.contains(&NetworkKey::Global));
    assert!(
        steerer
            .apply(&broken, &ApplyOptions::default().force(true))
            .await
            .is_err()
    );
}
