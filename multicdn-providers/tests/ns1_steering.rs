//! NS1 against wiremock stubs: the exact bodies for create, update and feed publish, 429
//! honoured, nothing sent for an invalid plan, and the touched-share guard.

// Helpers outside `#[test]` functions unwrap too: a failed setup should fail the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use multicdn_core::policy::Share;
use multicdn_core::{
    ApplyOptions, CohortId, CohortPlan, Error, ProviderId, Secret, Steerer, SteeringPlan, Weights,
};
use multicdn_providers::http::HttpSettings;
use multicdn_providers::ns1::{Ns1Client, Ns1Steerer};
use serde_json::{Value, json};
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const RECORD: &str = "/v1/zones/example.com/www.example.com/CNAME";

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

fn fast() -> HttpSettings {
    HttpSettings::default()
        .with_request_timeout(Duration::from_secs(5))
        .with_max_attempts(4)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
}

fn feeds() -> BTreeMap<ProviderId, String> {
    [
        (p("fastly"), "feed-f".to_owned()),
        (p("cloudflare"), "feed-c".to_owned()),
    ]
    .into()
}

fn steerer(server: &MockServer) -> Ns1Steerer {
    let client = Ns1Client::new(&server.uri(), Secret::new("ns1-key-123"), fast()).unwrap();
    let edges = [
        (p("fastly"), "example.map.fastly.net".to_owned()),
        (p("cloudflare"), "example.cdn.cloudflare.net".to_owned()),
    ]
    .into();
    Ns1Steerer::new(client, "example.com", "www.example.com", edges).with_feeds("src-1", feeds())
}

fn split(fastly: f64) -> Weights {
    Weights::from_percentages([(p("fastly"), fastly), (p("cloudflare"), 100.0 - fastly)]).unwrap()
}

fn cohort(name: &str, networks: &[&str], weights: Weights) -> CohortPlan {
    CohortPlan {
        cohort: CohortId::new(name).unwrap(),
        networks: networks.iter().map(|n| n.parse().unwrap()).collect(),
        weights,
    }
}

fn plan(europe_fastly: f64) -> SteeringPlan {
    SteeringPlan {
        record: "www.example.com".into(),
        ttl: Duration::from_secs(30),
        cohorts: vec![
            cohort("default", &["*"], split(100.0)),
            cohort("europe", &["DE", "FR"], split(europe_fastly)),
        ],
    }
}

fn answer(
    edge: &str,
    group: &str,
    provider: &str,
    tier: &str,
    priority: u64,
    weight: u64,
    up: Value,
) -> Value {
    json!({
        "answer": [edge],
        "meta": {
            "note": format!("multicdn cohort={group} provider={provider} tier={tier}"),
            "priority": priority,
            "up": up,
            "weight": weight
        },
        "region": group
    })
}

const F: &str = "example.map.fastly.net";
const C: &str = "example.cdn.cloudflare.net";

/// The record `plan(europe_fastly)` becomes, written out by hand.
fn expected(europe_fastly: u64) -> Value {
    let eu_f = europe_fastly * 100;
    let eu_c = 10_000 - eu_f;
    json!({
        "zone": "example.com",
        "domain": "www.example.com",
        "type": "CNAME",
        "ttl": 30,
        "answers": [
            answer(C, "europe", "cloudflare", "primary", 1, eu_c, json!({"feed": "feed-c"})),
            answer(F, "europe", "fastly", "primary", 1, eu_f, json!({"feed": "feed-f"})),
            answer(C, "europe", "cloudflare", "last-resort", 3, eu_c, json!(true)),
            answer(F, "europe", "fastly", "last-resort", 3, eu_f, json!(true)),
            answer(F, "default", "fastly", "primary", 1, 10_000, json!({"feed": "feed-f"})),
            answer(C, "default", "cloudflare", "standby", 2, 1, json!({"feed": "feed-c"})),
            answer(F, "default", "fastly", "last-resort", 3, 10_000, json!(true)),
        ],
        "filters": [
            {"filter": "up", "config": {}},
            {"filter": "geofence_country", "config": {"remove_no_location": true}},
            {"filter": "select_first_region", "config": {}},
            {"filter": "priority", "config": {"eliminate": "1"}},
            {"filter": "weighted_shuffle", "config": {}},
            {"filter": "select_first_n", "config": {"N": "1"}}
        ],
        "regions": {
            "default": {"meta": {}},
            "europe": {"meta": {"country": ["DE", "FR"]}}
        }
    })
}

/// What NS1 answers on read: the record plus fields it adds.
fn as_read(record: Value) -> Value {
    let mut r = record;
    r["id"] = json!("rec-1");
    r["tier"] = json!(3);
    r["use_client_subnet"] = json!(true);
    r["meta"] = json!({});
    r
}

fn not_found() -> ResponseTemplate {
    ResponseTemplate::new(404).set_body_json(json!({"message": "record not found"}))
}

/// The zone as NS1 lists it (`GET /v1/zones/example.com`): its records' domains and types.
async fn mount_zone(server: &MockServer, records: &[(&str, &str)]) {
    let records: Vec<Value> = records
        .iter()
        .map(|(domain, rtype)| json!({"domain": domain, "type": rtype, "short_answers": ["192.0.2.1"], "ttl": 300}))
        .collect();
    Mock::given(method("GET"))
        .and(path("/v1/zones/example.com"))
        .and(header("X-NSONE-Key", "ns1-key-123"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"zone": "example.com", "id": "zone-1", "ttl": 3600, "records": records}),
        ))
        .expect(1)
        .mount(server)
        .await;
}

async fn writes(server: &MockServer) -> Vec<wiremock::Request> {
    server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.method.as_str() != "GET")
        .collect()
}

#[tokio::test]
async fn a_new_record_is_created_with_the_exact_body() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(not_found())
        .mount(&server)
        .await;
    mount_zone(&server, &[("example.com", "NS"), ("api.example.com", "A")]).await;
    Mock::given(method("PUT"))
        .and(path(RECORD))
        .and(header("X-NSONE-Key", "ns1-key-123"))
        .and(body_json(expected(90)))
        .respond_with(ResponseTemplate::new(200).set_body_json(as_read(expected(90))))
        .expect(1)
        .mount(&server)
        .await;
    let diff = steerer(&server)
        .apply(&plan(90.0), &ApplyOptions::default())
        .await
        .unwrap();
    assert_eq!(diff.changes.len(), 2);
    assert!(diff.changes.iter().all(|c| c.before.is_none()));
}

#[tokio::test]
async fn a_changed_split_updates_the_record_with_the_exact_body() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(ResponseTemplate::new(200).set_body_json(as_read(expected(90))))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(RECORD))
        .and(body_json(expected(70)))
        .respond_with(ResponseTemplate::new(200).set_body_json(as_read(expected(70))))
        .expect(1)
        .mount(&server)
        .await;
    // One of two cohorts is 50% of the record: allow it.
    let s = steerer(&server).with_max_touched(Share::percent(50));
    let dry = s.dry_run(&plan(70.0)).await.unwrap();
    assert!(!dry.create && dry.changed);
    let text = dry.to_string();
    assert!(
        text.contains("~ europe: cloudflare 10%, fastly 90% -> cloudflare 30%, fastly 70%"),
        "{text}"
    );
    let diff = s
        .apply(&plan(70.0), &ApplyOptions::default())
        .await
        .unwrap();
    assert_eq!(diff.changes.len(), 1);
    assert_eq!(diff.changes[0].cohort.as_str(), "europe");
}

#[tokio::test]
async fn the_record_in_force_reads_back_and_reapplying_sends_nothing() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(ResponseTemplate::new(200).set_body_json(as_read(expected(90))))
        .mount(&server)
        .await;
    let s = steerer(&server);
    let state = s.current().await.unwrap();
    let europe = state.cohort(&CohortId::new("europe").unwrap()).unwrap();
    assert_eq!(europe.weights, split(90.0));
    assert_eq!(
        europe.networks,
        vec!["DE".parse().unwrap(), "FR".parse().unwrap()]
    );
    assert_eq!(
        state
            .cohort(&CohortId::new("default").unwrap())
            .unwrap()
            .weights,
        split(100.0)
    );
    let diff = s
        .apply(&plan(90.0), &ApplyOptions::default())
        .await
        .unwrap();
    assert!(diff.is_empty());
    assert!(writes(&server).await.is_empty());
}

#[tokio::test]
async fn a_record_read_back_with_float_weights_and_reordered_countries_is_unchanged() {
    // ns1-go types weight as a float: NS1 may hand back 9000.0 for the 9000 written, filter
    // configs as numbers, and countries in its own order. None of that is drift.
    let mut read = as_read(expected(90));
    for a in read["answers"].as_array_mut().unwrap() {
        let w = a["meta"]["weight"].as_u64().unwrap();
        a["meta"]["weight"] = json!(w as f64 + 0.0);
        a["meta"]["priority"] = json!(a["meta"]["priority"].as_u64().unwrap() as f64);
    }
    read["filters"][3]["config"]["eliminate"] = json!(1);
    read["filters"][5]["config"]["N"] = json!(1);
    read["regions"]["europe"]["meta"]["country"] = json!(["FR", "DE"]);
    let text = serde_json::to_string(&read).unwrap();
    assert!(text.contains("\"weight\":9000.0"), "{text}");
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(RECORD))
        .and(header("X-NSONE-Key", "ns1-key-123"))
        .respond_with(ResponseTemplate::new(200).set_body_string(text))
        .mount(&server)
        .await;
    let s = steerer(&server);
    let dry = s.dry_run(&plan(90.0)).await.unwrap();
    assert!(!dry.changed, "{dry}");
    let diff = s
        .apply(&plan(90.0), &ApplyOptions::default())
        .await
        .unwrap();
    assert!(diff.is_empty());
    assert!(writes(&server).await.is_empty());
    // A real change still shows: 8000.0 where 9000 is wanted.
    let mut moved =
        serde_json::from_str::<Value>(&serde_json::to_string(&as_read(expected(90))).unwrap())
            .unwrap();
    moved["answers"][1]["meta"]["weight"] = json!(8000.0);
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(ResponseTemplate::new(200).set_body_json(moved))
        .mount(&server)
        .await;
    assert!(steerer(&server).dry_run(&plan(90.0)).await.unwrap().changed);
}

#[tokio::test]
async fn no_geofence_regional_filter_without_georegion_metadata() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(not_found())
        .mount(&server)
        .await;
    mount_zone(&server, &[("example.com", "NS"), ("api.example.com", "A")]).await;
    let dry = steerer(&server).dry_run(&plan(90.0)).await.unwrap();
    assert!(
        dry.record
            .filters
            .iter()
            .all(|f| f.filter != "geofence_regional"),
        "{:?}",
        dry.record.filters
    );
    assert!(
        dry.record
            .regions
            .values()
            .all(|g| !g.meta.contains_key("georegion"))
    );
}

#[tokio::test]
async fn feeds_are_provisioned_once_and_publish_up_down_without_touching_the_record() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "k"))
        .and(path("/v1/data/sources"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([{"id": "other", "name": "someone-else"}])),
        )
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/data/sources"))
        .and(body_json(
            json!({"name": "multicdn", "sourcetype": "nsone_v1"}),
        ))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"id": "src-1", "name": "multicdn"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "k"))
        .and(path("/v1/data/feeds/src-1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!([{"id": "feed-c", "name": "multicdn cloudflare", "config": {"label": "cloudflare"}}]),
        ))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/v1/data/feeds/src-1"))
        .and(body_json(
            json!({"name": "multicdn fastly", "config": {"label": "fastly"}}),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "feed-f"})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/feed/src-1"))
        .and(body_json(json!({"fastly": {"up": false}})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({})))
        .expect(1)
        .mount(&server)
        .await;

    let client = Ns1Client::new(&server.uri(), Secret::new("k"), fast()).unwrap();
    let edges = [(p("fastly"), F.to_owned()), (p("cloudflare"), C.to_owned())].into();
    let mut s = Ns1Steerer::new(client, "example.com", "www.example.com", edges);
    let made = s.provision_feeds("multicdn").await.unwrap();
    assert_eq!(made, feeds());
    s.set_up(&[(p("fastly"), false)].into()).await.unwrap();
    assert!(
        !server
            .received_requests()
            .await
            .unwrap()
            .iter()
            .any(|r| r.url.path().starts_with("/v1/zones")),
        "publishing must not rewrite the record"
    );
    let err = s.set_up(&[(p("akamai"), true)].into()).await.unwrap_err();
    assert!(err.to_string().contains("no data feed"), "{err}");
}

#[tokio::test]
async fn a_429_is_honoured_then_the_call_succeeds() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "0")
                .set_body_json(json!({"message": "rate limit exceeded"})),
        )
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("X-RateLimit-Limit", "100")
                .insert_header("X-RateLimit-Remaining", "0")
                .insert_header("X-RateLimit-Period", "0.1")
                .set_body_json(json!({"message": "rate limit exceeded"})),
        )
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(not_found())
        .mount(&server)
        .await;
    mount_zone(&server, &[("example.com", "NS"), ("api.example.com", "A")]).await;
    Mock::given(method("PUT"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "0")
                .set_body_json(json!({"message": "slow down"})),
        )
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path(RECORD))
        .and(body_json(expected(90)))
        .respond_with(ResponseTemplate::new(200).set_body_json(as_read(expected(90))))
        .expect(1)
        .mount(&server)
        .await;
    steerer(&server)
        .apply(&plan(90.0), &ApplyOptions::default())
        .await
        .unwrap();
    assert_eq!(server.received_requests().await.unwrap().len(), 6);
}

#[tokio::test]
async fn a_retry_after_beyond_the_limit_fails_at_once_carrying_the_wait() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Retry-After", "600")
                .set_body_json(json!({"message": "rate limit exceeded"})),
        )
        .mount(&server)
        .await;
    let err = steerer(&server).current().await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(600)));
    assert!(err.to_string().contains("rate limit exceeded"), "{err}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn plans_ns1_cannot_express_send_nothing() {
    let server = MockServer::start().await;
    let s = steerer(&server);
    let mut mixed = plan(90.0);
    mixed
        .cohorts
        .push(cohort("comcast", &["AS7922", "US"], split(50.0)));
    let mut outside = plan(90.0);
    outside.record = "www.example.org".into();
    let mut unknown = plan(90.0);
    unknown.cohorts[1].weights = Weights::single(p("akamai"));
    let mut two_defaults = plan(90.0);
    let mut networks = two_defaults.cohorts[1].networks.to_vec();
    networks.push("*".parse().unwrap());
    two_defaults.cohorts[1].networks = networks.into();
    for (bad, says) in [
        (mixed, "mixes"),
        (outside, "outside the zone"),
        (unknown, "unknown provider akamai"),
        (two_defaults, "exactly one cohort"),
    ] {
        let err = s
            .apply(&bad, &ApplyOptions::default().force(true))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidRequest { .. }), "{err:?}");
        assert!(err.to_string().contains(says), "{err}");
    }
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_plan_changing_too_many_cohorts_is_refused_unless_forced() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(ResponseTemplate::new(200).set_body_json(as_read(expected(90))))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(header("x-nsone-key", "ns1-key-123"))
        .and(path(RECORD))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({})))
        .mount(&server)
        .await;
    let s = steerer(&server);
    let mut both = plan(50.0);
    both.cohorts[0].weights = split(80.0);
    let err = s.apply(&both, &ApplyOptions::default()).await.unwrap_err();
    assert!(err.to_string().contains("max_touched_per_apply"), "{err}");
    assert!(writes(&server).await.is_empty());
    s.apply(&both, &ApplyOptions::default().force(true))
        .await
        .unwrap();
    assert_eq!(writes(&server).await.len(), 1);
}

#[tokio::test]
async fn a_new_cname_beside_other_types_at_the_name_is_refused_before_any_write() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(RECORD))
        .and(header("X-NSONE-Key", "ns1-key-123"))
        .respond_with(not_found())
        .mount(&server)
        .await;
    mount_zone(
        &server,
        &[
            ("example.com", "NS"),
            ("www.example.com", "A"),
            ("WWW.example.com.", "AAAA"),
            ("api.example.com", "MX"),
        ],
    )
    .await;
    let err = steerer(&server)
        .apply(&plan(90.0), &ApplyOptions::default().force(true))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidRequest { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("www.example.com already holds A, AAAA records"),
        "{err}"
    );
    assert!(writes(&server).await.is_empty());
}
