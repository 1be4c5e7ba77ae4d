//! The cache warmer against real edges on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests and their helpers fail loudly

mod support;

use std::collections::BTreeMap;

use multicdn_core::{ManualClock, Policy, Timestamp};
use multicdn_health::{
    Edge, HealthConfig, Monitor, WarmOutcome, WarmProgress, Warmer, edges_from_policy,
};
use support::{FakeRunner, REGIONS, SITE, edge, id, two_edges};

fn top_urls(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("/products/item-{i}")).collect()
}

#[tokio::test]
async fn warms_every_url_through_each_edge_one_provider_after_another() {
    let (fastly, cloudflare, edges) = two_edges().await;
    let warmer = Warmer::builder(edges)
        .host(SITE)
        .concurrency(4)
        .build()
        .unwrap();
    let urls = top_urls(20);
    let mut progress: Vec<WarmProgress> = Vec::new();
    let report = warmer
        .warm(&urls, |_| false, |p| progress.push(p.clone()))
        .await;

    for edge in [&fastly, &cloudflare] {
        let seen = edge.requests();
        assert_eq!(seen.len(), 20);
        for r in &seen {
            assert_eq!(r.headers["host"], SITE);
            assert_eq!(r.headers["accept-encoding"], "br, gzip");
        }
    }
    // Staggered: every fastly request came before any cloudflare request.
    let last_fastly = fastly.requests().iter().map(|r| r.seq).max().unwrap();
    let first_cloudflare = cloudflare.requests().iter().map(|r| r.seq).min().unwrap();
    assert!(last_fastly < first_cloudflare);

    for p in ["fastly", "cloudflare"] {
        match report.get(&id(p)).unwrap() {
            WarmOutcome::Warmed(s) => {
                assert_eq!((s.requests, s.non_2xx, s.failed), (20, 0, 0));
                assert!(s.p90 >= s.mean / 2 && s.p90 > std::time::Duration::ZERO);
            }
            other => panic!("{p}: {other:?}"),
        }
    }
    // Progress: once per request, counting up to the total, provider by provider.
    assert_eq!(progress.len(), 40);
    assert_eq!(
        (
            progress[0].provider_index,
            progress[0].done,
            progress[0].total
        ),
        (0, 1, 20)
    );
    assert_eq!(
        (progress[19].provider.as_str(), progress[19].done),
        ("fastly", 20)
    );
    assert_eq!(
        (
            progress[39].provider.as_str(),
            progress[39].done,
            progress[39].providers
        ),
        ("cloudflare", 20, 2)
    );
}

#[tokio::test]
async fn non_2xx_answers_and_dead_edges_are_counted() {
    let fastly = edge("fastly").await;
    fastly.set_status("/products/item-3", 404);
    fastly.set_status("/products/item-4", 503);
    let dead = support::dead_port_url().await;
    let edges = vec![
        Edge::new(id("fastly"), &fastly.base_url()).unwrap(),
        Edge::new(id("cloudflare"), &dead).unwrap(),
    ];
    let report = Warmer::builder(edges)
        .build()
        .unwrap()
        .warm(&top_urls(10), |_| false, |_| {})
        .await;
    match report.get(&id("fastly")).unwrap() {
        WarmOutcome::Warmed(s) => assert_eq!((s.requests, s.non_2xx, s.failed), (10, 2, 0)),
        other => panic!("{other:?}"),
    }
    match report.get(&id("cloudflare")).unwrap() {
        WarmOutcome::Warmed(s) => assert_eq!((s.requests, s.non_2xx, s.failed), (10, 0, 10)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_warmer_skips_a_provider_that_health_says_is_down() {
    let (fastly, cloudflare, _) = two_edges().await;
    let policy = Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap();
    let overrides = BTreeMap::from([
        (id("fastly"), fastly.base_url()),
        (id("cloudflare"), cloudflare.base_url()),
    ]);
    let edges = edges_from_policy(&policy, &overrides).unwrap();

    // Health: three of five runners see fastly failing for two rounds.
    let clock = ManualClock::new(Timestamp::from_secs(1_800_000_000));
    let runners: Vec<FakeRunner> = REGIONS.iter().map(|r| FakeRunner::new(r, &clock)).collect();
    for r in &runners[..3] {
        r.fail(&id("fastly"), true);
    }
    let mut b = Monitor::builder(HealthConfig::default())
        .clock(clock.clone())
        .targets(multicdn_health::targets_from_policy(&policy, &overrides).unwrap());
    for r in &runners {
        b = b.runner(r.clone());
    }
    let monitor = b.build().unwrap();
    monitor.round_once().await;
    monitor.round_once().await;
    let health = monitor.watch();

    let warmer = Warmer::builder(edges)
        .host(policy.site.host.clone())
        .build()
        .unwrap();
    let report = warmer
        .warm(&top_urls(5), |p| health.borrow().is_down(p), |_| {})
        .await;
    assert_eq!(report.get(&id("fastly")), Some(&WarmOutcome::SkippedDown));
    assert!(
        matches!(report.get(&id("cloudflare")), Some(WarmOutcome::Warmed(s)) if s.requests == 5)
    );
    assert!(
        fastly.requests().is_empty(),
        "not one request may reach a down provider"
    );
    assert_eq!(cloudflare.requests().len(), 5);
}

#[tokio::test]
async fn a_rate_limited_warm_still_warms_everything() {
    let (fastly, cloudflare, edges) = two_edges().await;
    let warmer = Warmer::builder(edges)
        .rate_per_second(1_000)
        .concurrency(2)
        .build()
        .unwrap();
    let report = warmer.warm(&top_urls(5), |_| false, |_| {}).await;
    assert_eq!(report.providers.len(), 2);
    assert_eq!(fastly.requests().len(), 5);
    assert_eq!(cloudflare.requests().len(), 5);
}
