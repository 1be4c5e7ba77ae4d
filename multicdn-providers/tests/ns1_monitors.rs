//! NS1 monitors against wiremock stubs that check method, path, `X-NSONE-Key` and the exact
//! body of every write: one `http` job per provider from the policy's health section, the
//! `nsone_monitoring` source, the `datafeed` notify list and the feeds wiring each job to its
//! provider's answers' `up`; provisioning again writes nothing, and a job edited since is put
//! back.

// Helpers outside `#[test]` functions unwrap too: a failed setup should fail the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use multicdn_core::{ApplyOptions, Policy, ProviderId, Secret, Steerer};
use multicdn_providers::http::HttpSettings;
use multicdn_providers::ns1::{Ns1Client, Ns1Steerer};
use serde_json::{Value, json};
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: &str = "ns1-key-monitors";
const SOURCE_NAME: &str = "multicdn monitors";

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

fn steerer(server: &MockServer) -> Ns1Steerer {
    let settings = HttpSettings::default()
        .with_request_timeout(Duration::from_secs(5))
        .with_max_attempts(1);
    let client = Ns1Client::new(&server.uri(), Secret::new(KEY), settings).unwrap();
    Ns1Steerer::from_policy(client, &policy())
}

/// The job the example policy's health section makes for `provider` at `edge`, exactly.
fn job(provider: &str, edge: &str) -> Value {
    json!({
        "name": format!("multicdn {provider} {edge}"),
        "job_type": "http",
        "active": true,
        "config": {
            "url": format!("https://{edge}/_health/v3.txt"),
            "method": "GET",
            "connect_timeout": 3,
            "idle_timeout": 3,
            "follow_redirect": false,
            "tls_add_verify": true,
        },
        "rules": [
            {"key": "status_code", "comparison": "==", "value": "200"},
            {"key": "body", "comparison": "contains", "value": "healthy-v3"},
        ],
        "regions": ["lhr", "lga", "sjc", "sin", "gru"],
        "frequency": 30,
        "policy": "quorum",
        "rapid_recheck": false,
        "notify_list": "nl-1",
        "notify_failback": true,
        "notify_regional": false,
        "notes": format!("multicdn health check for {provider}"),
    })
}

/// `job` as NS1 lists it: with its id, a status, and numbers as floats.
fn listed(mut job: Value, id: &str) -> Value {
    job["id"] = json!(id);
    job["frequency"] = json!(30.0);
    job["status"] = json!({"global": {"since": 1, "status": "up"}});
    job
}

fn ok(body: Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(body)
}

async fn get(server: &MockServer, at: &str, body: Value) {
    Mock::given(method("GET"))
        .and(path(at))
        .and(header("X-NSONE-Key", KEY))
        .respond_with(ok(body))
        .mount(server)
        .await;
}

async fn write(server: &MockServer, verb: &str, at: &str, body: Value, answer: Value) {
    Mock::given(method(verb))
        .and(path(at))
        .and(header("X-NSONE-Key", KEY))
        .and(body_json(body))
        .respond_with(ok(answer))
        .expect(1)
        .mount(server)
        .await;
}

async fn writes(server: &MockServer) -> Vec<(String, String)> {
    server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.method.as_str() != "GET")
        .map(|r| (r.method.to_string(), r.url.path().to_owned()))
        .collect()
}

#[tokio::test]
async fn monitors_are_made_from_the_policy_and_drive_the_answers_up_with_up_first_in_the_chain() {
    let server = MockServer::start().await;
    let fastly = job("fastly", "example.map.fastly.net");
    let cloudflare = job("cloudflare", "example.cdn.cloudflare.net");
    // Another team's source of the same name but another type is not reused.
    get(
        &server,
        "/v1/data/sources",
        json!([{"id": "theirs", "name": SOURCE_NAME, "sourcetype": "nsone_v1"}]),
    )
    .await;
    write(
        &server,
        "PUT",
        "/v1/data/sources",
        json!({"name": SOURCE_NAME, "sourcetype": "nsone_monitoring"}),
        json!({"id": "src-m", "name": SOURCE_NAME, "sourcetype": "nsone_monitoring"}),
    )
    .await;
    get(&server, "/v1/lists", json!([])).await;
    write(
        &server,
        "PUT",
        "/v1/lists",
        json!({"name": SOURCE_NAME, "notify_list": [{"type": "datafeed", "config": {"sourceid": "src-m"}}]}),
        json!({"id": "nl-1", "name": SOURCE_NAME}),
    )
    .await;
    get(&server, "/v1/monitoring/jobs", json!([])).await;
    write(
        &server,
        "PUT",
        "/v1/monitoring/jobs",
        fastly.clone(),
        listed(fastly, "job-f"),
    )
    .await;
    write(
        &server,
        "PUT",
        "/v1/monitoring/jobs",
        cloudflare.clone(),
        listed(cloudflare, "job-c"),
    )
    .await;
    get(&server, "/v1/data/feeds/src-m", json!([])).await;
    write(
        &server,
        "PUT",
        "/v1/data/feeds/src-m",
        json!({"name": "multicdn fastly monitor", "config": {"jobid": "job-f"}}),
        json!({"id": "feed-f"}),
    )
    .await;
    write(
        &server,
        "PUT",
        "/v1/data/feeds/src-m",
        json!({"name": "multicdn cloudflare monitor", "config": {"jobid": "job-c"}}),
        json!({"id": "feed-c"}),
    )
    .await;
    let record = "/v1/zones/example.com/www.example.com/CNAME";
    Mock::given(method("GET"))
        .and(path(record))
        .and(header("X-NSONE-Key", KEY))
        .respond_with(
            ResponseTemplate::new(404).set_body_json(json!({"message": "record not found"})),
        )
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path(record))
        .and(header("X-NSONE-Key", KEY))
        .respond_with(ok(json!({})))
        .expect(1)
        .mount(&server)
        .await;
    // The zone holds nothing else at the name (checked before a new CNAME is written).
    Mock::given(method("GET"))
        .and(path("/v1/zones/example.com"))
        .and(header("X-NSONE-Key", KEY))
        .respond_with(ok(json!({"zone": "example.com", "records": []})))
        .expect(1)
        .mount(&server)
        .await;

    let mut steerer = steerer(&server);
    let feeds = steerer
        .provision_monitors(&policy(), SOURCE_NAME)
        .await
        .unwrap();
    assert_eq!(
        feeds,
        [
            (p("cloudflare"), "feed-c".to_owned()),
            (p("fastly"), "feed-f".to_owned())
        ]
        .into()
    );
    steerer
        .apply(&policy().static_plan(), &ApplyOptions::default())
        .await
        .unwrap();

    let sent: Value = server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.method.as_str() == "PUT" && r.url.path() == record)
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .unwrap();
    assert_eq!(sent["filters"][0], json!({"filter": "up", "config": {}}));
    let answers = sent["answers"].as_array().unwrap();
    assert!(!answers.is_empty());
    for a in answers {
        let edge = a["answer"][0].as_str().unwrap();
        let feed = if edge == "example.map.fastly.net" {
            "feed-f"
        } else {
            "feed-c"
        };
        let up = &a["meta"]["up"];
        if a["meta"]["priority"] == 3 {
            assert_eq!(up, &json!(true), "the last resort is always up: {a}");
        } else {
            assert_eq!(up, &json!({"feed": feed}), "{a}");
        }
    }
}

#[tokio::test]
async fn provisioning_again_writes_nothing_and_an_edited_job_is_put_back() {
    let server = MockServer::start().await;
    let fastly = job("fastly", "example.map.fastly.net");
    let cloudflare = job("cloudflare", "example.cdn.cloudflare.net");
    let mut edited = listed(cloudflare.clone(), "job-c");
    edited["rules"][1]["value"] = json!("healthy-v2");
    get(
        &server,
        "/v1/data/sources",
        json!([{"id": "src-m", "name": SOURCE_NAME, "sourcetype": "nsone_monitoring"}]),
    )
    .await;
    get(
        &server,
        "/v1/lists",
        json!([{"id": "nl-1", "name": SOURCE_NAME, "notify_list": [{"type": "datafeed", "config": {"sourceid": "src-m"}}]}]),
    )
    .await;
    get(
        &server,
        "/v1/monitoring/jobs",
        json!([listed(fastly, "job-f"), edited, {"id": "other", "name": "someone else's"}]),
    )
    .await;
    write(
        &server,
        "POST",
        "/v1/monitoring/jobs/job-c",
        cloudflare.clone(),
        listed(cloudflare, "job-c"),
    )
    .await;
    get(
        &server,
        "/v1/data/feeds/src-m",
        json!([
            {"id": "feed-f", "name": "multicdn fastly monitor", "config": {"jobid": "job-f"}},
            {"id": "feed-c", "name": "multicdn cloudflare monitor", "config": {"jobid": "job-c"}},
        ]),
    )
    .await;
    let mut steerer = steerer(&server);
    // A dry run's lookup sees the edited job as not in place, and writes nothing.
    assert_eq!(
        steerer.find_monitors(&policy(), SOURCE_NAME).await.unwrap(),
        None
    );
    assert!(writes(&server).await.is_empty());
    let feeds = steerer
        .provision_monitors(&policy(), SOURCE_NAME)
        .await
        .unwrap();
    assert_eq!(feeds[&p("fastly")], "feed-f");
    assert_eq!(feeds[&p("cloudflare")], "feed-c");
    assert_eq!(
        writes(&server).await,
        [("POST".to_owned(), "/v1/monitoring/jobs/job-c".to_owned())]
    );
}

#[tokio::test]
async fn a_lookup_finds_monitors_in_place_without_writing() {
    let server = MockServer::start().await;
    get(
        &server,
        "/v1/data/sources",
        json!([{"id": "src-m", "name": SOURCE_NAME, "sourcetype": "nsone_monitoring"}]),
    )
    .await;
    get(
        &server,
        "/v1/lists",
        json!([{"id": "nl-1", "name": SOURCE_NAME, "notify_list": [{"type": "datafeed", "config": {"sourceid": "src-m"}}]}]),
    )
    .await;
    get(
        &server,
        "/v1/monitoring/jobs",
        json!([
            listed(job("fastly", "example.map.fastly.net"), "job-f"),
            listed(job("cloudflare", "example.cdn.cloudflare.net"), "job-c"),
        ]),
    )
    .await;
    get(
        &server,
        "/v1/data/feeds/src-m",
        json!([
            {"id": "feed-f", "config": {"jobid": "job-f"}},
            {"id": "feed-c", "config": {"jobid": "job-c"}},
        ]),
    )
    .await;
    let mut steerer = steerer(&server);
    let found = steerer
        .find_monitors(&policy(), SOURCE_NAME)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        found,
        [
            (p("cloudflare"), "feed-c".to_owned()),
            (p("fastly"), "feed-f".to_owned())
        ]
        .into()
    );
    assert!(writes(&server).await.is_empty());
}
