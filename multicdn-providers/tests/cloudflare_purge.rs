//! The Cloudflare adapter against wiremock on loopback: exact request shapes for every purge
//! kind, batching per plan, the envelope, errors, retries and timeouts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use multicdn_core::policy::CloudflarePlan;
use multicdn_core::{Error, Provider, ProviderKind, PurgeRequest, PurgeScope, Purger, Secret};
use multicdn_providers::cloudflare::{CloudflareLimits, CloudflarePurger};
use multicdn_providers::http::HttpSettings;
use serde_json::{Value, json};
use support::strict::CloudflarePurge;
use support::vendors::{CLOUDFLARE_TOKEN, ZONE, cloudflare, fast, pid, tags};
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn purge_path() -> String {
    format!("/zones/{ZONE}/purge_cache")
}

fn success(id: &str) -> ResponseTemplate {
    ResponseTemplate::new(200)
        .set_body_json(json!({"success": true, "errors": [], "messages": [], "result": {"id": id}}))
}

fn failure(status: u16, code: u32, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({
        "success": false, "errors": [{"code": code, "message": message}], "messages": [], "result": null
    }))
}

fn pro() -> CloudflareLimits {
    CloudflareLimits::for_plan(CloudflarePlan::Pro)
}

async fn expect_shape(scope: PurgeScope, body: Value) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(purge_path()))
        .and(header(
            "Authorization",
            format!("Bearer {CLOUDFLARE_TOKEN}"),
        ))
        .and(header("Content-Type", "application/json"))
        .and(body_json(&body))
        .respond_with(success("9a7806061c88ada191ed06f989cc3dac"))
        .expect(1)
        .mount(&server)
        .await;
    let receipt = cloudflare(&server.uri(), pro(), fast(1))
        .purge(&PurgeRequest { scope, soft: false })
        .await
        .unwrap();
    assert_eq!(receipt.purge_ids, ["9a7806061c88ada191ed06f989cc3dac"]);
    assert_eq!(receipt.requests, 1);
}

#[tokio::test]
async fn files_are_purged_as_files() {
    expect_shape(
        PurgeScope::Urls(vec!["https://www.example.com/css/styles.css".into()]),
        json!({"files": ["https://www.example.com/css/styles.css"]}),
    )
    .await;
}

#[tokio::test]
async fn tags_are_purged_as_tags() {
    expect_shape(
        PurgeScope::Tags(vec!["product-123".into(), "price".into()]),
        json!({"tags": ["product-123", "price"]}),
    )
    .await;
}

#[tokio::test]
async fn hosts_are_purged_as_hosts() {
    expect_shape(
        PurgeScope::Hosts(vec!["www.example.com".into()]),
        json!({"hosts": ["www.example.com"]}),
    )
    .await;
}

#[tokio::test]
async fn prefixes_are_purged_as_prefixes() {
    expect_shape(
        PurgeScope::Prefixes(vec!["www.example.com/foo".into()]),
        json!({"prefixes": ["www.example.com/foo"]}),
    )
    .await;
}

#[tokio::test]
async fn everything_is_purge_everything_true() {
    expect_shape(PurgeScope::Everything, json!({"purge_everything": true})).await;
}

#[tokio::test]
async fn two_hundred_fifty_tags_make_three_requests_of_at_most_100() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header(
            "authorization",
            format!("Bearer {CLOUDFLARE_TOKEN}"),
        ))
        .and(path(purge_path()))
        .respond_with(success("id"))
        .expect(3)
        .mount(&server)
        .await;
    let receipt = cloudflare(&server.uri(), pro(), fast(1))
        .purge(&PurgeRequest::tags(tags(250)))
        .await
        .unwrap();
    assert_eq!((receipt.items, receipt.requests), (250, 3));
    let mut sizes: Vec<usize> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let b: Value = serde_json::from_slice(&r.body).unwrap();
            b["tags"].as_array().unwrap().len()
        })
        .collect();
    sizes.sort();
    assert_eq!(sizes, [50, 100, 100]);
}

#[tokio::test]
async fn enterprise_sends_500_urls_a_request_and_100_tags() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(success("id"))
        .expect(4)
        .mount(&server)
        .await;
    let purger = cloudflare(
        &server.uri(),
        CloudflareLimits::for_plan(CloudflarePlan::Enterprise),
        fast(1),
    );
    let urls: Vec<String> = (0..600)
        .map(|i| format!("https://www.example.com/p/{i}"))
        .collect();
    let r = purger.purge(&PurgeRequest::urls(urls)).await.unwrap();
    assert_eq!(r.requests, 2);
    let r = purger.purge(&PurgeRequest::tags(tags(150))).await.unwrap();
    assert_eq!(r.requests, 2);
}

#[tokio::test]
async fn a_200_with_success_false_is_an_error_with_cloudflares_code_and_not_retried() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(failure(
            200,
            1012,
            "Request must contain one of purge_everything, files, tags, hosts or prefixes",
        ))
        .expect(1)
        .mount(&server)
        .await;
    let e = cloudflare(&server.uri(), pro(), fast(4))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    match &e {
        Error::Vendor {
            status,
            code,
            retryable,
            ..
        } => {
            assert_eq!(
                (*status, code.as_deref(), *retryable),
                (200, Some("1012"), false)
            );
        }
        other => panic!("expected a vendor error, got {other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("cloudflare") && text.contains("POST /zones/"),
        "{text}"
    );
    assert!(text.contains("1012: Request must contain"), "{text}");
}

#[tokio::test]
async fn a_success_false_rate_limit_code_is_retried() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(failure(
            200,
            971,
            "Please wait and consider throttling your request speed",
        ))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(CloudflarePurge)
        .respond_with(success("after"))
        .expect(1)
        .mount(&server)
        .await;
    let r = cloudflare(&server.uri(), pro(), fast(4))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap();
    assert_eq!(
        (r.attempts, r.purge_ids.clone()),
        (2, vec!["after".to_owned()])
    );
}

#[tokio::test]
async fn a_429_then_success_is_retried_honouring_retry_after() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(
            failure(
                429,
                971,
                "Please wait and consider throttling your request speed",
            )
            .insert_header("retry-after", "0"),
        )
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(CloudflarePurge)
        .respond_with(success("ok"))
        .expect(1)
        .mount(&server)
        .await;
    let r = cloudflare(&server.uri(), pro(), fast(4))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap();
    assert_eq!(r.attempts, 2);
}

#[tokio::test]
async fn a_retry_after_beyond_the_limit_fails_without_waiting() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(failure(429, 971, "Please wait").insert_header("retry-after", "3600"))
        .expect(1)
        .mount(&server)
        .await;
    let e = cloudflare(&server.uri(), pro(), fast(4))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert_eq!(e.retry_after(), Some(Duration::from_secs(3600)), "{e:?}");
    assert!(e.to_string().contains("429"), "{e}");
}

#[tokio::test]
async fn three_500s_then_a_clear_failure() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(ResponseTemplate::new(500).set_body_string("internal error"))
        .expect(3)
        .mount(&server)
        .await;
    let e = cloudflare(&server.uri(), pro(), fast(3))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert!(e.is_retryable() && e.may_have_applied(), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("HTTP 500") && text.contains("internal error"),
        "{text}"
    );
}

#[tokio::test]
async fn a_401_is_not_retried_and_reads_as_an_authentication_problem() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(failure(401, 10000, "Authentication error"))
        .expect(1)
        .mount(&server)
        .await;
    let e = cloudflare(&server.uri(), pro(), fast(4))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert!(e.is_auth() && !e.is_retryable(), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("authentication failed") && text.contains("10000: Authentication error"),
        "{text}"
    );
}

#[tokio::test]
async fn an_auth_code_in_a_200_envelope_is_an_authentication_problem() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(failure(200, 9109, "Invalid access token"))
        .expect(1)
        .mount(&server)
        .await;
    let e = cloudflare(&server.uri(), pro(), fast(4))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert!(e.is_auth(), "{e:?}");
}

#[tokio::test]
async fn a_200_that_is_not_an_envelope_fails_loudly() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true})))
        .mount(&server)
        .await;
    let e = cloudflare(&server.uri(), pro(), fast(1))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::UnexpectedResponse { .. }), "{e:?}");
    assert!(e.to_string().contains("success"), "{e}");
}

#[tokio::test]
async fn a_slow_answer_times_out() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(success("late").set_delay(Duration::from_millis(500)))
        .mount(&server)
        .await;
    let settings = fast(1).with_request_timeout(Duration::from_millis(50));
    let e = cloudflare(&server.uri(), pro(), settings)
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Timeout { .. }) && e.may_have_applied(),
        "{e:?}"
    );
}

#[tokio::test]
async fn soft_purges_and_bad_items_are_refused_before_sending() {
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(success("x"))
        .expect(0)
        .mount(&server)
        .await;
    let p = cloudflare(&server.uri(), pro(), fast(1));
    let e = p
        .purge(&PurgeRequest::tags(["a"]).soft())
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Unsupported { .. }) && e.to_string().contains("soft purge"),
        "{e}"
    );
    let e = p
        .purge(&PurgeRequest {
            scope: PurgeScope::Prefixes(vec!["https://www.example.com/foo".into()]),
            soft: false,
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no scheme"), "{e}");
    let e = p
        .purge(&PurgeRequest::urls(["/relative"]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a full URL"), "{e}");
}

#[test]
fn built_from_the_policy_entry_with_its_plan() {
    let spec = serde_json::from_value(json!({
        "kind": "cloudflare", "edge_host": "www.example.com.cdn.cloudflare.net",
        "zone_id": ZONE, "plan": "business", "token_env": "CF_TOKEN"
    }))
    .unwrap();
    let p = CloudflarePurger::from_spec(
        pid("cloudflare"),
        &spec,
        Secret::new(CLOUDFLARE_TOKEN),
        Some("http://127.0.0.1:9"),
        HttpSettings::default(),
    )
    .unwrap();
    assert_eq!(p.kind(), ProviderKind::Cloudflare);
    assert_eq!(
        (p.limits().purge.per_second, p.limits().purge.burst),
        (10.0, 50)
    );
    let c = p.pacing();
    assert!(c.hosts.is_some() && c.prefixes.is_some() && !c.soft_items && !c.soft_everything);
    assert_eq!(c.tags.map(|k| k.per_request), Some(100));
    let d = format!("{p:?}");
    assert!(
        !d.contains(CLOUDFLARE_TOKEN) && d.contains("[redacted]"),
        "{d}"
    );
    let no_zone = serde_json::from_value(json!({"kind": "cloudflare", "edge_host": "e"})).unwrap();
    let e = CloudflarePurger::from_spec(
        pid("cf"),
        &no_zone,
        Secret::new("t"),
        None,
        HttpSettings::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("zone_id"), "{e}");
}

#[tokio::test]
async fn the_strict_stubs_answer_only_what_the_vendors_would_accept() {
    use support::strict::FastlyPurge;
    use support::vendors::{CLOUDFLARE_TOKEN, FASTLY_TOKEN, SERVICE, ZONE};
    let server = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    Mock::given(FastlyPurge)
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let client = reqwest::Client::new();
    let status = |path: String, auth: (&'static str, String), body: serde_json::Value| {
        let req = client
            .post(format!("{}{path}", server.uri()))
            .header(auth.0, auth.1)
            .json(&body);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let cf = || ("authorization", format!("Bearer {CLOUDFLARE_TOKEN}"));
    let cf_path = || format!("/zones/{ZONE}/purge_cache");
    assert_eq!(status(cf_path(), cf(), json!({"tags": ["a"]})).await, 200);
    // Two kinds in one request, too many tags, a wrong token, a wrong zone: not answered.
    assert_eq!(
        status(cf_path(), cf(), json!({"tags": ["a"], "hosts": ["h"]})).await,
        404
    );
    let many: Vec<String> = (0..101).map(|i| format!("t{i}")).collect();
    assert_eq!(status(cf_path(), cf(), json!({ "tags": many })).await, 404);
    let wrong = ("authorization", "Bearer other".to_owned());
    assert_eq!(status(cf_path(), wrong, json!({"tags": ["a"]})).await, 404);
    assert_eq!(
        status("/zones/Z/purge_cache".into(), cf(), json!({"tags": ["a"]})).await,
        404
    );
    let fk = || ("fastly-key", FASTLY_TOKEN.to_owned());
    let batch = format!("/service/{SERVICE}/purge");
    assert_eq!(
        status(batch.clone(), fk(), json!({"surrogate_keys": ["a"]})).await,
        200
    );
    let keys: Vec<String> = (0..257).map(|i| format!("k{i}")).collect();
    assert_eq!(
        status(batch.clone(), fk(), json!({ "surrogate_keys": keys })).await,
        404
    );
    assert_eq!(status(batch, fk(), json!({"keys": ["a"]})).await, 404);
}
