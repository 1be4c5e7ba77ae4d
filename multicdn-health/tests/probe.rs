//! The HTTP content probe against real edges on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests and their helpers fail loudly

mod support;

use std::time::Duration;

use multicdn_core::{
    CacheStatus, Error, FailReason, HealthCheck, ManualClock, Observation, Outcome, Target,
    Timestamp,
};
use multicdn_health::HttpProbe;
use support::{EdgeServer, MARKER, SITE, edge, id, region};

fn probe() -> HttpProbe {
    HttpProbe::builder(region("eu-west"))
        .clock(ManualClock::new(Timestamp::from_secs(1_800_000_000)))
        .build()
        .unwrap()
}

fn target(edge: &EdgeServer, path: &str) -> Target {
    Target::new(id("fastly"), edge.url(path), MARKER).with_host(SITE)
}

fn reason(o: &Observation) -> FailReason {
    match &o.outcome {
        Outcome::Fail { reason } => reason.clone(),
        Outcome::Pass => panic!("expected a failure, got a pass: {o:?}"),
    }
}

#[tokio::test]
async fn passes_on_the_expected_status_and_content_and_says_who_served_it() {
    let edge = edge("fastly").await;
    let o = probe()
        .check(&target(&edge, "/_health/v3.txt"))
        .await
        .unwrap();
    assert!(o.passed(), "{o:?}");
    assert_eq!(o.status, Some(200));
    assert_eq!(
        (o.provider.as_str(), o.runner.as_str()),
        ("fastly", "eu-west")
    );
    assert_eq!(o.at, Timestamp::from_secs(1_800_000_000));
    assert!(o.latency > Duration::ZERO && o.latency < Duration::from_secs(3));
    let served = o.served_by.unwrap();
    assert_eq!(served.provider, "fastly");
    assert_eq!(served.pop.as_deref(), Some("LHR"));
    // The health object is never cached (no-cache): every probe reaches the origin.
    assert_eq!(served.cache, Some(CacheStatus::Miss));
}

#[tokio::test]
async fn successive_probes_reuse_one_connection() {
    let edge = edge("fastly").await;
    let p = probe();
    for _ in 0..3 {
        assert!(
            p.check(&target(&edge, "/_health/v3.txt"))
                .await
                .unwrap()
                .passed()
        );
    }
    let peers: Vec<_> = edge.requests().iter().map(|r| r.peer).collect();
    assert_eq!(peers.len(), 3);
    assert!(
        peers.iter().all(|p| *p == peers[0]),
        "one connection, reused: {peers:?}"
    );
}

#[tokio::test]
async fn sends_no_cache_and_the_sites_host_to_the_edge() {
    let edge = edge("fastly").await;
    let o = probe().check(&target(&edge, "/host-gated")).await.unwrap();
    assert!(
        o.passed(),
        "the edge only answers for the site's Host: {o:?}"
    );
    let seen = &edge.requests()[0];
    assert_eq!(seen.headers["host"], SITE);
    assert_eq!(seen.headers["cache-control"], "no-cache");
    // Without the Host override the same edge does not know the site.
    let bare = Target::new(id("fastly"), edge.url("/host-gated"), MARKER);
    assert_eq!(
        reason(&probe().check(&bare).await.unwrap()),
        FailReason::Status { got: 404 }
    );
}

#[tokio::test]
async fn a_503_fails_even_when_its_body_has_the_marker() {
    let edge = edge("fastly").await;
    let o = probe()
        .check(&target(&edge, "/503-with-marker"))
        .await
        .unwrap();
    assert_eq!(reason(&o), FailReason::Status { got: 503 });
    assert_eq!(o.status, Some(503));
    edge.set_healthy(false);
    let o = probe()
        .check(&target(&edge, "/_health/v3.txt"))
        .await
        .unwrap();
    assert_eq!(reason(&o), FailReason::Status { got: 503 });
}

#[tokio::test]
async fn other_statuses_pass_when_expected() {
    let edge = edge("fastly").await;
    let t = target(&edge, "/503-with-marker").with_expect_status(vec![200, 503]);
    assert!(probe().check(&t).await.unwrap().passed());
}

#[tokio::test]
async fn a_200_with_an_error_page_is_a_content_mismatch() {
    let edge = edge("fastly").await;
    let o = probe().check(&target(&edge, "/error-page")).await.unwrap();
    assert_eq!(
        reason(&o),
        FailReason::ContentMismatch {
            expected: MARKER.into()
        }
    );
    assert_eq!(o.status, Some(200));
    let o = probe().check(&target(&edge, "/no-marker")).await.unwrap();
    assert_eq!(
        reason(&o),
        FailReason::ContentMismatch {
            expected: MARKER.into()
        }
    );
}

#[tokio::test]
async fn only_a_bounded_prefix_of_the_body_is_searched() {
    let edge = edge("fastly").await;
    // The marker sits after 70,000 bytes: beyond the default 64 KiB.
    let t = target(&edge, "/late-marker");
    assert_eq!(
        reason(&probe().check(&t).await.unwrap()),
        FailReason::ContentMismatch {
            expected: MARKER.into()
        }
    );
    let wide = HttpProbe::builder(region("eu-west"))
        .max_body_bytes(128 * 1024)
        .build()
        .unwrap();
    assert!(wide.check(&t).await.unwrap().passed());
    // A huge object with the marker up front passes without being read to the end.
    assert!(
        probe()
            .check(&target(&edge, "/huge"))
            .await
            .unwrap()
            .passed()
    );
}

#[tokio::test(start_paused = true)]
async fn an_edge_hanging_past_the_deadline_is_a_timeout_at_the_deadline() {
    let edge = edge("fastly").await;
    let t = target(&edge, "/hang").with_timeout(Duration::from_secs(3));
    let o = probe().check(&t).await.unwrap();
    assert_eq!(reason(&o), FailReason::Timeout);
    assert_eq!(o.latency, Duration::from_secs(3));
    assert_eq!(o.status, None);
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_failure() {
    let url = support::dead_port_url().await;
    let t = Target::new(id("fastly"), format!("{url}/_health/v3.txt"), MARKER);
    match reason(&probe().check(&t).await.unwrap()) {
        FailReason::Connect { detail } => assert!(!detail.is_empty()),
        other => panic!("expected a connect failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_failed_handshake_is_a_tls_failure() {
    // https to an edge that speaks plain HTTP: the TLS layer rejects the answer.
    let edge = edge("fastly").await;
    let t = Target::new(
        id("fastly"),
        format!("https://{}/_health/v3.txt", edge.addr()),
        MARKER,
    );
    match reason(&probe().check(&t).await.unwrap()) {
        FailReason::Tls { detail } => assert!(!detail.is_empty()),
        other => panic!("expected a TLS failure, got {other:?}"),
    }
}

#[tokio::test]
async fn redirects_are_judged_not_followed() {
    let edge = edge("fastly").await;
    let o = probe().check(&target(&edge, "/redirect")).await.unwrap();
    assert_eq!(reason(&o), FailReason::Status { got: 301 });
    assert_eq!(edge.requests().len(), 1);
}

#[tokio::test]
async fn a_target_that_is_not_a_url_cannot_be_checked() {
    for url in ["not a url", "ftp://example.com/x"] {
        let t = Target::new(id("fastly"), url, MARKER);
        match probe().check(&t).await {
            Err(Error::InvalidRequest { provider, message }) => {
                assert_eq!(provider.as_str(), "fastly");
                assert!(message.contains(url), "{message}");
            }
            other => panic!("expected an invalid request, got {other:?}"),
        }
    }
    let edge = edge("fastly").await;
    let t = target(&edge, "/_health/v3.txt").with_host("bad\nhost");
    assert!(matches!(
        probe().check(&t).await,
        Err(Error::InvalidRequest { .. })
    ));
}

#[tokio::test]
async fn observations_cross_any_transport_as_json() {
    let edge = edge("fastly").await;
    edge.set_healthy(false);
    let mut o = probe()
        .check(&target(&edge, "/_health/v3.txt"))
        .await
        .unwrap();
    // Latency travels in whole milliseconds.
    o.latency = Duration::from_millis(o.latency.as_millis() as u64);
    let wire = serde_json::to_string(&o).unwrap();
    let back: Observation = serde_json::from_str(&wire).unwrap();
    assert_eq!(back, o);
    assert!(wire.contains("\"kind\":\"status\""), "{wire}");
}
