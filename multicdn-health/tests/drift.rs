//! The drift checker against real edges on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests and their helpers fail loudly

mod support;

use multicdn_core::FailReason;
use multicdn_health::{AllowedDifference, DriftChecker, DriftKind, Edge};
use support::{SITE, edge, id, two_edges};

const PATHS: [&str; 5] = [
    "/",
    "/products/oak-dining-table",
    "/checkout",
    "/robots.txt",
    "/redirect",
];

#[tokio::test]
async fn identical_edges_show_no_drift_despite_headers_that_always_differ() {
    let (fastly, cloudflare, edges) = two_edges().await;
    // The ignore set: vendor headers that legitimately differ.
    fastly.add_header("x-served-by", "cache-lhr7361-LHR");
    fastly.add_header("x-cache", "HIT");
    cloudflare.add_header("cf-ray", "7d1c2a3b4c5d6e7f-LHR");
    cloudflare.add_header("cf-cache-status", "HIT");
    let checker = DriftChecker::builder(edges).host(SITE).build().unwrap();
    let report = checker.check(&PATHS).await;
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.paths, 5);
    // Every path went through both edges, with the site's Host.
    for edge in [&fastly, &cloudflare] {
        let seen = edge.requests();
        assert_eq!(seen.len(), 5);
        assert!(seen.iter().all(|r| r.headers["host"] == SITE));
    }
}

#[tokio::test]
async fn drift_is_found_in_exactly_the_header_that_differs() {
    let (fastly, _cloudflare, edges) = two_edges().await;
    // The security header added during a PCI review, on the primary only.
    fastly.add_header(
        "strict-transport-security",
        "max-age=31536000; includeSubDomains",
    );
    let checker = DriftChecker::builder(edges).host(SITE).build().unwrap();
    let report = checker.check(&PATHS).await;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.differences.len(), PATHS.len(), "{report:#?}");
    for (d, path) in report.differences.iter().zip(PATHS) {
        assert_eq!(d.path, path);
        assert_eq!(
            d.kind,
            DriftKind::Header("strict-transport-security".into())
        );
        assert_eq!(
            (d.baseline.as_str(), d.other.as_str()),
            ("fastly", "cloudflare")
        );
        assert_eq!(
            d.baseline_value.as_deref(),
            Some("max-age=31536000; includeSubDomains")
        );
        assert_eq!(d.other_value, None);
    }
    assert_eq!(
        report.differences[2].to_string(),
        "DRIFT /checkout [strict-transport-security]: fastly=\"max-age=31536000; includeSubDomains\" cloudflare=(absent)"
    );
}

#[tokio::test]
async fn a_differing_value_and_a_differing_status_are_both_reported() {
    let (fastly, cloudflare, edges) = two_edges().await;
    fastly.add_header("x-frame-options", "DENY");
    cloudflare.add_header("x-frame-options", "SAMEORIGIN");
    // A rule added on one provider only, during an incident.
    cloudflare.set_status("/robots.txt", 404);
    let checker = DriftChecker::builder(edges).build().unwrap();
    let report = checker.check(&["/robots.txt"]).await;
    let shown: Vec<String> = report.differences.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        vec![
            "DRIFT /robots.txt status: fastly=\"200\" cloudflare=\"404\"",
            "DRIFT /robots.txt [x-frame-options]: fastly=\"DENY\" cloudflare=\"SAMEORIGIN\"",
        ]
    );
}

#[tokio::test]
async fn redirects_are_compared_not_followed() {
    let (fastly, cloudflare, edges) = two_edges().await;
    let checker = DriftChecker::builder(edges).build().unwrap();
    let report = checker.check(&["/redirect"]).await;
    assert!(report.is_clean(), "{report:#?}");
    // Each edge saw exactly the one request: nobody chased /elsewhere.
    assert_eq!(fastly.requests().len(), 1);
    assert_eq!(cloudflare.requests().len(), 1);
}

#[tokio::test]
async fn allowlisted_differences_are_not_drift() {
    let (fastly, cloudflare, edges) = two_edges().await;
    fastly.add_header("via", "1.1 varnish");
    fastly.add_header("x-frame-options", "DENY");
    cloudflare.add_header("x-frame-options", "SAMEORIGIN");
    let checker = DriftChecker::builder(edges)
        .allow(AllowedDifference::header("Via"))
        .allow(AllowedDifference::header_on("x-frame-options", "/embed"))
        .build()
        .unwrap();
    let report = checker.check(&["/embed", "/"]).await;
    assert_eq!(report.differences.len(), 1, "{report:#?}");
    assert_eq!(report.differences[0].path, "/");
    assert_eq!(
        report.differences[0].kind,
        DriftKind::Header("x-frame-options".into())
    );
}

#[tokio::test]
async fn an_unreachable_edge_is_a_failure_not_a_difference() {
    let fastly = edge("fastly").await;
    let dead = support::dead_port_url().await;
    let edges = vec![
        Edge::new(id("fastly"), &fastly.base_url()).unwrap(),
        Edge::new(id("cloudflare"), &dead).unwrap(),
    ];
    let report = DriftChecker::builder(edges)
        .build()
        .unwrap()
        .check(&["/", "/a"])
        .await;
    assert!(report.differences.is_empty());
    assert_eq!(report.failures.len(), 2);
    assert_eq!(report.failures[0].provider, id("cloudflare"));
    assert!(matches!(
        report.failures[0].reason,
        FailReason::Connect { .. }
    ));
    assert!(!report.is_clean());
}
