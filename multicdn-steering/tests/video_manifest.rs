//! The steering handler's public behaviour: manifests for HLS and DASH, players' reports,
//! incident TTL, overload answers, and the CMSD header read back as a Structured Field.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use multicdn_core::{
    ApplyOptions, CohortId, CohortPlan, NetworkKey, ProviderId, Steerer, SteeringPlan, Timestamp,
    Weights,
};
use multicdn_steering::video::server::MeasurementError;
use multicdn_steering::video::shedding::cmsd_dynamic;
use multicdn_steering::video::{
    ContentSteering, ContentSteeringSteerer, PathwayClone, Protocol, RateLimit, SharedPlan,
    SteeringConfig, SteeringRequest, UriReplacement,
};
use serde_json::Value;

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

fn t(s: u64) -> Timestamp {
    Timestamp::from_secs(1_800_000_000 + s)
}

/// A cohort: its name, its networks, its split in basis points.
type CohortSpec<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, u32)]);

fn plan(cohorts: &[CohortSpec<'_>]) -> SteeringPlan {
    SteeringPlan {
        record: "video.example.com".into(),
        ttl: Duration::from_secs(300),
        cohorts: cohorts
            .iter()
            .map(|(id, nets, w)| CohortPlan {
                cohort: CohortId::new(id).unwrap(),
                networks: nets.iter().map(|n| n.parse().unwrap()).collect(),
                weights: Weights::new(w.iter().map(|(p, bp)| (ProviderId::new(p).unwrap(), *bp)))
                    .unwrap(),
            })
            .collect(),
    }
}

async fn serving(
    config: SteeringConfig,
    pl: &SteeringPlan,
) -> (ContentSteering, ContentSteeringSteerer) {
    let shared = SharedPlan::new();
    let steerer = ContentSteeringSteerer::new(p("content-steering"), shared.clone());
    steerer.apply(pl, &ApplyOptions::default()).await.unwrap();
    (ContentSteering::new(config, shared), steerer)
}

fn clones() -> Vec<PathwayClone> {
    vec![PathwayClone {
        base_id: "cdn-a".into(),
        id: "cdn-c".into(),
        uri_replacement: UriReplacement {
            host: Some("c.example.com".into()),
            params: [("token".to_owned(), "abc".to_owned())].into(),
        },
    }]
}

fn req(protocol: Protocol, query: &str, nets: &[&str]) -> SteeringRequest {
    SteeringRequest::from_query_string(
        protocol,
        query,
        nets.iter()
            .map(|n| n.parse::<NetworkKey>().unwrap())
            .collect(),
    )
}

fn assert_manifest_types(body: &str, reload_path: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["VERSION"].as_u64(), Some(1));
    assert!(v["TTL"].is_u64(), "TTL is an integer: {body}");
    let reload = v["RELOAD-URI"].as_str().unwrap();
    assert!(reload.starts_with(reload_path), "{reload}");
    assert!(
        reload.contains("session=") && reload.contains("version=1"),
        "{reload}"
    );
    let order = v["PATHWAY-PRIORITY"].as_array().unwrap();
    assert!(!order.is_empty() && order.iter().all(Value::is_string));
    let clone = &v["PATHWAY-CLONES"][0];
    assert_eq!(clone["BASE-ID"].as_str(), Some("cdn-a"));
    assert_eq!(clone["ID"].as_str(), Some("cdn-c"));
    assert_eq!(
        clone["URI-REPLACEMENT"]["HOST"].as_str(),
        Some("c.example.com")
    );
    assert!(clone["URI-REPLACEMENT"]["PARAMS"].is_object());
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 5, "{keys:?}");
    v
}

#[tokio::test]
async fn hls_manifest_carries_every_field_with_its_json_type() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 10_000), ("cdn-b", 0)])]);
    let (h, _) = serving(SteeringConfig::default().clones(clones()), &pl).await;
    let r = h.handle(&req(Protocol::Hls, "", &["AS7922"]), t(0));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = assert_manifest_types(&r.body, "/hls.json?");
    assert_eq!(v["TTL"], 300);
    // A clone is listed right after the pathway it clones: unlisted, no player would use it.
    assert_eq!(
        v["PATHWAY-PRIORITY"],
        serde_json::json!(["cdn-a", "cdn-c", "cdn-b"])
    );
}

#[tokio::test]
async fn dash_manifest_has_the_same_shape_and_reads_dash_reports() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 10_000)])]);
    let config = SteeringConfig::default().clones(clones()).reload_uris(
        "https://steer.example.com/hls.json",
        "https://steer.example.com/dash.json?asset=7",
    );
    let (h, _) = serving(config, &pl).await;
    let q = "_DASH_pathway=cdn-a,cdn-b&_DASH_throughput=8000000,2500000&_HLS_pathway=x&_HLS_throughput=1";
    let r = h.handle(&req(Protocol::Dash, q, &["DE"]), t(0));
    assert_eq!(r.status, 200);
    let v = assert_manifest_types(
        &r.body,
        "https://steer.example.com/dash.json?asset=7&session=",
    );
    assert_eq!(v["PATHWAY-PRIORITY"], serde_json::json!(["cdn-a", "cdn-c"]));
    let got: Vec<(&str, u64)> = r
        .measurements
        .iter()
        .map(|m| (m.pathway.as_str(), m.throughput_bps))
        .collect();
    assert_eq!(got, vec![("cdn-a", 8_000_000), ("cdn-b", 2_500_000)]);
    assert_eq!(r.measurements[0].network, Some("DE".parse().unwrap()));
    assert_eq!(r.measurements[0].at, t(0));
}

#[tokio::test]
async fn hls_reports_become_measurements_and_malformed_ones_errors() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 10_000)])]);
    let (h, _) = serving(SteeringConfig::default(), &pl).await;
    let r = h.handle(
        &req(
            Protocol::Hls,
            "_HLS_pathway=cdn-b&_HLS_throughput=3100000",
            &["AS7922"],
        ),
        t(5),
    );
    assert_eq!(r.measurements.len(), 1);
    assert_eq!(r.measurements[0].provider(), Some(p("cdn-b")));
    assert_eq!(r.measurements[0].network, Some(NetworkKey::Asn(7922)));
    for (q, want) in [
        (
            "_HLS_pathway=cdn-a&_HLS_throughput=lots",
            "not a non-negative number",
        ),
        (
            "_HLS_pathway=cdn-a,cdn-b&_HLS_throughput=1",
            "paired by position",
        ),
        ("_HLS_pathway=%3Cscript%3E&_HLS_throughput=1", "not valid"),
        (
            "_HLS_pathway=cdn-a&_HLS_throughput=1e400",
            "not a non-negative number",
        ),
    ] {
        let r = h.handle(&req(Protocol::Hls, q, &[]), t(5));
        assert_eq!(r.status, 200, "a bad report never breaks the manifest");
        let err: &MeasurementError = r.rejected.first().unwrap();
        assert!(err.to_string().contains(want), "{q}: {err}");
        assert!(r.measurements.is_empty());
    }
}

#[tokio::test]
async fn the_reload_uri_keeps_the_session_and_its_pathway_order() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 5_000), ("cdn-b", 5_000)])]);
    let (h, steerer) = serving(SteeringConfig::default(), &pl).await;
    let first = h.handle(&req(Protocol::Hls, "", &[]), t(0));
    let reload = first.manifest.as_ref().unwrap().reload_uri.clone().unwrap();
    let query = reload.split_once('?').unwrap().1;
    let again = h.handle(&req(Protocol::Hls, query, &[]), t(300));
    assert_eq!(again.session, first.session);
    assert_eq!(
        again.manifest.unwrap().pathway_priority,
        first.manifest.unwrap().pathway_priority
    );
    // A new plan shows up as a new version in the next reload URI.
    let moved = plan(&[("default", &["*"], &[("cdn-a", 2_000), ("cdn-b", 8_000)])]);
    steerer
        .apply(&moved, &ApplyOptions::default())
        .await
        .unwrap();
    let next = h.handle(&req(Protocol::Hls, query, &[]), t(600));
    assert!(
        next.manifest
            .unwrap()
            .reload_uri
            .unwrap()
            .ends_with("&version=2")
    );
}

#[tokio::test]
async fn each_network_gets_its_cohort_and_split_cohorts_follow_their_weights() {
    let pl = plan(&[
        ("as7922", &["AS7922"], &[("cdn-a", 7_000), ("cdn-b", 3_000)]),
        ("default", &["*"], &[("cdn-b", 10_000)]),
    ]);
    let (h, _) = serving(SteeringConfig::default(), &pl).await;
    let other = h.handle(&req(Protocol::Hls, "", &["AS3320", "DE"]), t(0));
    assert_eq!(other.cohort.unwrap().as_str(), "default");
    assert_eq!(other.manifest.unwrap().pathway_priority, vec!["cdn-b"]);
    let n = 4_000;
    let mut a_first = 0;
    for i in 0..n {
        let r = h.handle(
            &req(Protocol::Hls, &format!("session=s{i}"), &["AS7922", "US"]),
            t(0),
        );
        assert_eq!(r.cohort.as_ref().unwrap().as_str(), "as7922");
        let order = r.manifest.unwrap().pathway_priority;
        assert_eq!(order.len(), 2, "both pathways stay listed for failover");
        if order[0] == "cdn-a" {
            a_first += 1;
        }
    }
    let share = f64::from(a_first) / f64::from(n);
    assert!(
        (share - 0.7).abs() < 0.03,
        "cdn-a leads {share} of sessions, want 0.7"
    );
}

#[tokio::test]
async fn an_incident_shortens_the_ttl_until_it_ends() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 10_000)])]);
    let config = SteeringConfig::default()
        .ttl(Duration::from_secs(300))
        .incident_ttl(Duration::from_secs(30));
    let (h, _) = serving(config, &pl).await;
    let ttl = |h: &ContentSteering| {
        h.handle(&req(Protocol::Hls, "", &[]), t(0))
            .manifest
            .unwrap()
            .ttl
    };
    assert_eq!(ttl(&h), 300);
    h.set_incident(true);
    assert_eq!(ttl(&h), 30);
    h.set_incident(false);
    assert_eq!(ttl(&h), 300);
}

#[tokio::test]
async fn overload_keeps_hls_sessions_with_a_long_ttl_and_tells_dash_to_retry_after() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 10_000)])]);
    let config = SteeringConfig::default().rate_limit(RateLimit {
        per_second: 0.5,
        burst: 3,
    });
    let (h, _) = serving(config, &pl).await;
    let r = |protocol, s| h.handle(&req(protocol, "", &[]), t(s));
    for _ in 0..3 {
        assert_eq!(r(Protocol::Hls, 0).status, 200);
    }
    // hls.js stops asking for good after a 429: it gets the plan with a long TTL instead.
    let limited = r(Protocol::Hls, 0);
    assert_eq!(limited.status, 200);
    assert!(limited.limited);
    assert_eq!(limited.manifest.as_ref().unwrap().ttl, 600);
    assert_eq!(limited.manifest.unwrap().pathway_priority, ["cdn-a"]);
    // dash.js honours Retry-After.
    let limited = r(Protocol::Dash, 0);
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("Retry-After"), Some("2"));
    assert!(limited.manifest.is_none());
    assert!(serde_json::from_str::<Value>(&limited.body).unwrap()["error"].is_string());
    let again = r(Protocol::Hls, 2);
    assert_eq!((again.status, again.limited), (200, false));
    assert_eq!(again.manifest.unwrap().ttl, 300);
}

#[tokio::test]
async fn each_client_has_its_own_limit() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 10_000)])]);
    let config = SteeringConfig::default().client_limit(RateLimit {
        per_second: 0.1,
        burst: 2,
    });
    let (h, _) = serving(config, &pl).await;
    let from = |ip: [u8; 4]| {
        h.handle(
            &req(Protocol::Dash, "", &[]).from_client(std::net::IpAddr::from(ip)),
            t(0),
        )
    };
    assert_eq!(from([192, 0, 2, 1]).status, 200);
    assert_eq!(from([192, 0, 2, 1]).status, 200);
    assert_eq!(from([192, 0, 2, 1]).status, 429, "its burst is spent");
    assert_eq!(
        from([192, 0, 2, 2]).status,
        200,
        "another client is not held back"
    );
}

#[tokio::test]
async fn the_ttl_is_short_during_a_failover_and_for_one_ttl_after_a_plan_change() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 6_000), ("cdn-b", 4_000)])]);
    let config = SteeringConfig::default()
        .ttl(Duration::from_secs(30))
        .incident_ttl(Duration::from_secs(5));
    let (h, steerer) = serving(config, &pl).await;
    let ttl = |s| {
        h.handle(&req(Protocol::Hls, "", &[]), t(s))
            .manifest
            .unwrap()
            .ttl
    };
    assert_eq!(ttl(0), 30, "the first plan is not a change");
    let changed = plan(&[("default", &["*"], &[("cdn-a", 2_000), ("cdn-b", 8_000)])]);
    steerer
        .apply(&changed, &multicdn_core::ApplyOptions::default())
        .await
        .unwrap();
    assert_eq!(ttl(100), 5, "just after a change");
    assert_eq!(ttl(129), 5);
    assert_eq!(ttl(131), 30, "one normal TTL later");
    steerer.shared_plan().set_unavailable([p("cdn-a")].into());
    // The unavailable set is a change of its own, and a failover for as long as it lasts.
    assert_eq!(ttl(500), 5);
    assert_eq!(ttl(900), 5);
}

#[tokio::test]
async fn a_session_whose_throughput_collapses_is_offered_the_alternative_first() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 10_000 - 1), ("cdn-b", 1)])]);
    let (h, _) = serving(SteeringConfig::default(), &pl).await;
    let ask = |q: &str, s| {
        h.handle(&req(Protocol::Hls, q, &[]), t(s))
            .manifest
            .unwrap()
            .pathway_priority
    };
    let first = ask("session=s1", 0);
    assert_eq!(first, ["cdn-a", "cdn-b"]);
    assert_eq!(
        ask("session=s1&_HLS_pathway=cdn-a&_HLS_throughput=8000000", 30),
        ["cdn-a", "cdn-b"]
    );
    // A quarter of its best on cdn-a: offered cdn-b first, cdn-a kept second.
    assert_eq!(
        ask("session=s1&_HLS_pathway=cdn-a&_HLS_throughput=2000000", 60),
        ["cdn-b", "cdn-a"]
    );
    // Another session in the same cohort is unaffected.
    assert_eq!(ask("session=s2", 60), ["cdn-a", "cdn-b"]);
    // After the hold (5 minutes), the plan's order again.
    assert_eq!(ask("session=s1", 400), ["cdn-a", "cdn-b"]);
}

#[test]
fn without_a_plan_it_serves_the_default_order_or_503() {
    let h = ContentSteering::new(SteeringConfig::default(), SharedPlan::new());
    let r = h.handle(&req(Protocol::Hls, "", &[]), t(0));
    assert_eq!(r.status, 503);
    assert_eq!(r.header("Retry-After"), Some("300"));
    let h = ContentSteering::new(
        SteeringConfig::default().default_pathways(vec![p("cdn-a"), p("cdn-b")]),
        SharedPlan::new(),
    );
    let r = h.handle(&req(Protocol::Dash, "", &[]), t(0));
    assert_eq!(r.status, 200);
    assert!(r.body.contains(r#""PATHWAY-PRIORITY":["cdn-a","cdn-b"]"#));
    assert!(
        r.manifest
            .unwrap()
            .reload_uri
            .unwrap()
            .ends_with("version=0")
    );
}

#[test]
fn cmsd_dynamic_parses_back_as_a_structured_field_list() {
    let value = cmsd_dynamic("edge-sin-1", 5000).unwrap();
    let list: sfv::List = sfv::Parser::new(&value).parse().unwrap();
    assert_eq!(list.len(), 1);
    let sfv::ListEntry::Item(item) = &list[0] else {
        panic!("expected an item, got {:?}", list[0]);
    };
    assert_eq!(
        item.bare_item.as_string().map(|s| s.as_str()),
        Some("edge-sin-1")
    );
    let mb = item
        .params
        .get("mb")
        .and_then(|v| v.as_integer())
        .map(i64::from);
    assert_eq!(mb, Some(5000));
    assert_eq!(
        item.params.get("du").and_then(|v| v.as_boolean()),
        Some(true)
    );
}

#[tokio::test]
async fn a_provider_marked_unavailable_is_no_longer_offered_and_sessions_see_a_new_version() {
    let pl = plan(&[("default", &["*"], &[("cdn-a", 6_000), ("cdn-b", 4_000)])]);
    let (h, steerer) = serving(SteeringConfig::default(), &pl).await;
    let shared = steerer.shared_plan();
    let order = |r: &multicdn_steering::video::SteeringResponse| {
        r.manifest.as_ref().unwrap().pathway_priority.clone()
    };
    let before = h.handle(&req(Protocol::Hls, "session=s1", &[]), t(0));
    assert_eq!(order(&before).len(), 2);
    // cdn-a goes down while the plan still lists it (failover moves its share in steps).
    assert_eq!(shared.set_unavailable([p("cdn-a")].into()), 2);
    let during = h.handle(&req(Protocol::Hls, "session=s1", &[]), t(10));
    assert_eq!(order(&during), ["cdn-b"]);
    assert!(
        during
            .manifest
            .unwrap()
            .reload_uri
            .unwrap()
            .ends_with("&version=2")
    );
    // Setting the same set again changes nothing.
    assert_eq!(shared.set_unavailable([p("cdn-a")].into()), 2);
    // Both out: a player still gets the plan's order rather than nothing.
    shared.set_unavailable([p("cdn-a"), p("cdn-b")].into());
    let both = h.handle(&req(Protocol::Dash, "session=s1", &[]), t(20));
    assert_eq!(order(&both).len(), 2);
    // Back: both offered again.
    assert_eq!(shared.set_unavailable(Default::default()), 4);
    let after = h.handle(&req(Protocol::Hls, "session=s1", &[]), t(30));
    assert_eq!(order(&after), order(&before));
}

#[tokio::test]
async fn a_providers_further_video_hosts_are_clones_listed_after_it_and_measured_as_it() {
    let src = include_str!("../../examples/policy.yaml").replacen(
        "    edge_host: example.map.fastly.net\n",
        "    edge_host: example.map.fastly.net\n    video_hosts: [v1.fastly.example.net, v2.fastly.example.net, v3.fastly.example.net]\n",
        1,
    );
    let policy = multicdn_core::Policy::from_yaml(&src, "policy.yaml").unwrap();
    let config = SteeringConfig::from_policy(&policy);
    let pl = plan(&[("default", &["*"], &[("fastly", 10_000), ("cloudflare", 0)])]);
    let (h, steerer) = serving(config, &pl).await;
    let r = h.handle(&req(Protocol::Hls, "session=s1", &[]), t(0));
    let m = r.manifest.unwrap();
    assert_eq!(
        m.pathway_priority,
        ["fastly", "fastly-2", "fastly-3", "cloudflare"]
    );
    let clones: Vec<(&str, &str, Option<&str>)> = m
        .pathway_clones
        .iter()
        .map(|c| {
            (
                c.base_id.as_str(),
                c.id.as_str(),
                c.uri_replacement.host.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        clones,
        [
            ("fastly", "fastly-2", Some("v2.fastly.example.net")),
            ("fastly", "fastly-3", Some("v3.fastly.example.net")),
        ]
    );
    // A report on a clone is a report on its provider.
    let r = h.handle(
        &req(
            Protocol::Hls,
            "session=s2&_HLS_pathway=fastly-2&_HLS_throughput=5000000",
            &[],
        ),
        t(1),
    );
    assert_eq!(r.measurements.len(), 1);
    assert_eq!(r.measurements[0].pathway, "fastly");
    // The provider out: neither it nor its clones are offered.
    steerer.shared_plan().set_unavailable([p("fastly")].into());
    let r = h.handle(&req(Protocol::Hls, "session=s1", &[]), t(2));
    let m = r.manifest.unwrap();
    assert_eq!(m.pathway_priority, ["cloudflare"]);
    assert!(m.pathway_clones.is_empty(), "{:?}", m.pathway_clones);
    // The manifests tagged from the policy point the provider's pathway at its first video host.
    let options =
        multicdn_steering::video::TagOptions::from_policy(&policy, "/steering/hls.json").unwrap();
    let fastly = options.pathways.iter().find(|p| p.id == "fastly").unwrap();
    assert_eq!(fastly.base.as_str(), "https://v1.fastly.example.net/");
    let cloudflare = options
        .pathways
        .iter()
        .find(|p| p.id == "cloudflare")
        .unwrap();
    assert_eq!(
        cloudflare.base.as_str(),
        "https://example.cdn.cloudflare.net/"
    );
}
