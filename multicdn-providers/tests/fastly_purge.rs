//! The Fastly adapter against wiremock on loopback: exact request shapes for every purge kind,
//! batching, soft purge, errors, retries and timeouts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use multicdn_core::{Error, Provider, ProviderKind, PurgeRequest, PurgeScope, Purger, Secret};
use multicdn_providers::fastly::{FastlyLimits, FastlyPurger};
use multicdn_providers::http::{HttpSettings, RateLimit};
use serde_json::json;
use support::strict::FastlyPurge;
use support::vendors::{FASTLY_TOKEN, SERVICE, fast, fastly, pid, tags};
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

fn ok_id(id: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"status": "ok", "id": id}))
}

/// Answers a batch purge with a purge id per key sent.
struct EchoKeys;

impl Respond for EchoKeys {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        let map: serde_json::Map<String, serde_json::Value> = body["surrogate_keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k.as_str().unwrap().to_owned(),
                    json!(format!("id-{}", k.as_str().unwrap())),
                )
            })
            .collect();
        ResponseTemplate::new(200).set_body_json(map)
    }
}

#[tokio::test]
async fn a_url_purge_posts_host_and_path_without_scheme() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/purge/www.example.com/css/styles.css"))
        .and(header("Fastly-Key", FASTLY_TOKEN))
        .respond_with(ok_id("108340-1455557446-1143"))
        .expect(1)
        .mount(&server)
        .await;
    let receipt = fastly(&server.uri(), fast(1))
        .purge(&PurgeRequest::urls([
            "https://www.example.com/css/styles.css",
        ]))
        .await
        .unwrap();
    assert_eq!(receipt.purge_ids, ["108340-1455557446-1143"]);
    assert_eq!(
        (receipt.items, receipt.requests, receipt.attempts),
        (1, 1, 1)
    );
    let sent = &server.received_requests().await.unwrap()[0];
    assert!(sent.headers.get("fastly-soft-purge").is_none());
}

#[tokio::test]
async fn one_surrogate_key_posts_to_the_key_endpoint_and_soft_adds_the_header() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(format!("/service/{SERVICE}/purge/product-123")))
        .and(header("Fastly-Key", FASTLY_TOKEN))
        .and(header("Fastly-Soft-Purge", "1"))
        .respond_with(ok_id("k-1"))
        .expect(1)
        .mount(&server)
        .await;
    let receipt = fastly(&server.uri(), fast(1))
        .purge(&PurgeRequest::tags(["product-123"]).soft())
        .await
        .unwrap();
    assert_eq!(receipt.purge_ids, ["k-1"]);
}

#[tokio::test]
async fn a_batch_of_keys_is_one_json_request_with_ids_in_key_order() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(format!("/service/{SERVICE}/purge")))
        .and(header("Fastly-Key", FASTLY_TOKEN))
        .and(body_json(json!({"surrogate_keys": ["k1", "k2", "k3"]})))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"k3": "i3", "k1": "i1", "k2": "i2"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let receipt = fastly(&server.uri(), fast(1))
        .purge(&PurgeRequest::tags(["k1", "k2", "k3", "k2"]))
        .await
        .unwrap();
    assert_eq!(receipt.purge_ids, ["i1", "i2", "i3"]);
    assert_eq!((receipt.items, receipt.requests), (3, 1));
}

#[tokio::test]
async fn six_hundred_keys_make_three_batch_requests_of_at_most_256() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("fastly-key", FASTLY_TOKEN))
        .and(path(format!("/service/{SERVICE}/purge")))
        .respond_with(EchoKeys)
        .expect(3)
        .mount(&server)
        .await;
    let receipt = fastly(&server.uri(), fast(1))
        .purge(&PurgeRequest::tags(tags(600)))
        .await
        .unwrap();
    assert_eq!(
        (receipt.items, receipt.requests, receipt.purge_ids.len()),
        (600, 3, 600)
    );
    let mut sizes: Vec<usize> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let b: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            b["surrogate_keys"].as_array().unwrap().len()
        })
        .collect();
    sizes.sort();
    assert_eq!(sizes, [88, 256, 256]);
}

#[tokio::test]
async fn purge_all_posts_to_purge_all_and_a_soft_purge_all_sends_nothing() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(format!("/service/{SERVICE}/purge_all")))
        .and(header("Fastly-Key", FASTLY_TOKEN))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "ok"})))
        .expect(1)
        .mount(&server)
        .await;
    let purger = fastly(&server.uri(), fast(1));
    let receipt = purger.purge(&PurgeRequest::everything()).await.unwrap();
    assert_eq!((receipt.requests, receipt.purge_ids.len()), (1, 0));
    let soft = purger
        .purge(&PurgeRequest::everything().soft())
        .await
        .unwrap_err();
    assert!(matches!(soft, Error::Unsupported { .. }), "{soft}");
    assert!(
        soft.to_string().contains("soft purge of everything"),
        "{soft}"
    );
}

#[tokio::test]
async fn hosts_and_prefixes_are_unsupported_and_nothing_is_sent() {
    let server = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(ok_id("x"))
        .expect(0)
        .mount(&server)
        .await;
    let purger = fastly(&server.uri(), fast(1));
    for scope in [
        PurgeScope::Hosts(vec!["www.example.com".into()]),
        PurgeScope::Prefixes(vec!["www.example.com/foo".into()]),
    ] {
        let kind = scope.kind();
        let e = purger
            .purge(&PurgeRequest { scope, soft: false })
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        assert!(e.to_string().contains(&format!("purge by {kind}")), "{e}");
    }
    let pacing = purger.pacing();
    assert!(pacing.hosts.is_none() && pacing.prefixes.is_none());
}

#[tokio::test]
async fn a_429_with_a_rate_limit_reset_in_the_past_is_retried_once() {
    let server = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("Fastly-RateLimit-Remaining", "0")
                .insert_header("Fastly-RateLimit-Reset", "1")
                .set_body_json(json!({"msg": "Too many requests"})),
        )
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(FastlyPurge)
        .respond_with(ok_id("after"))
        .expect(1)
        .mount(&server)
        .await;
    let receipt = fastly(&server.uri(), fast(4))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap();
    assert_eq!(
        (receipt.attempts, receipt.purge_ids.clone()),
        (2, vec!["after".to_owned()])
    );
}

#[tokio::test]
async fn a_503_carrying_a_distant_rate_limit_reset_is_still_retried() {
    // Fastly sends Fastly-RateLimit-Reset on every counted request; with requests remaining it
    // is no advice to wait, so a transient 503 is retried as any other.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(format!("/service/{SERVICE}/purge_all")))
        .and(header("Fastly-Key", FASTLY_TOKEN))
        .respond_with(
            ResponseTemplate::new(503)
                .insert_header("Fastly-RateLimit-Remaining", "998")
                .insert_header("Fastly-RateLimit-Reset", "4102444800")
                .set_body_json(json!({"msg": "Service unavailable"})),
        )
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(format!("/service/{SERVICE}/purge_all")))
        .and(header("Fastly-Key", FASTLY_TOKEN))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "ok"})))
        .expect(1)
        .mount(&server)
        .await;
    let receipt = fastly(&server.uri(), fast(4))
        .purge(&PurgeRequest::everything())
        .await
        .unwrap();
    assert_eq!(receipt.attempts, 2);
}

#[tokio::test]
async fn a_distant_rate_limit_reset_with_nothing_remaining_fails_as_rate_limited() {
    // Remaining 0: the reset is the vendor's word on when to come back, beyond what the
    // settings wait for, so the call fails at once instead of hammering.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(format!("/service/{SERVICE}/purge_all")))
        .and(header("Fastly-Key", FASTLY_TOKEN))
        .respond_with(
            ResponseTemplate::new(503)
                .insert_header("Fastly-RateLimit-Remaining", "0")
                .insert_header("Fastly-RateLimit-Reset", "4102444800")
                .set_body_json(json!({"msg": "Service unavailable"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let e = fastly(&server.uri(), fast(4))
        .purge(&PurgeRequest::everything())
        .await
        .unwrap_err();
    assert!(e.retry_after().is_some(), "{e:?}");
}

#[tokio::test]
async fn three_500s_fail_clearly_with_fastlys_message() {
    let server = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(
            ResponseTemplate::new(503).set_body_json(
                json!({"msg": "Service unavailable", "detail": "purge backend down"}),
            ),
        )
        .expect(3)
        .mount(&server)
        .await;
    let e = fastly(&server.uri(), fast(3))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert!(e.is_retryable() && e.may_have_applied(), "{e:?}");
    let text = e.to_string();
    for part in [
        "fastly",
        "POST /service/",
        "/purge/a",
        "503",
        "Service unavailable: purge backend down",
    ] {
        assert!(text.contains(part), "{part:?} missing from {text}");
    }
}

#[tokio::test]
async fn a_401_is_not_retried_and_reads_as_an_authentication_problem() {
    let server = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_json(json!({"msg": "Provided credentials are missing or invalid"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let e = fastly(&server.uri(), fast(4))
        .purge(&PurgeRequest::tags(["a", "b"]))
        .await
        .unwrap_err();
    assert!(
        e.is_auth() && !e.is_retryable() && !e.may_have_applied(),
        "{e:?}"
    );
    assert!(e.to_string().contains("authentication failed"), "{e}");
    assert!(e.to_string().contains("credentials are missing"), "{e}");
}

#[tokio::test]
async fn a_400_is_not_retried() {
    let server = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(
            ResponseTemplate::new(400)
                .set_body_json(json!({"msg": "Bad request", "detail": "bad key"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let e = fastly(&server.uri(), fast(4))
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert!(
        !e.is_retryable() && e.to_string().contains("Bad request: bad key"),
        "{e}"
    );
}

#[tokio::test]
async fn a_slow_answer_times_out_and_may_have_applied() {
    let server = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(ok_id("late").set_delay(Duration::from_millis(500)))
        .mount(&server)
        .await;
    let settings = fast(1).with_request_timeout(Duration::from_millis(50));
    let e = fastly(&server.uri(), settings)
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(
        e.may_have_applied() && e.to_string().contains("may have been applied"),
        "{e}"
    );
}

#[tokio::test]
async fn a_batch_answer_missing_a_key_fails_loudly() {
    let server = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"a": "1"})))
        .mount(&server)
        .await;
    let e = fastly(&server.uri(), fast(1))
        .purge(&PurgeRequest::tags(["a", "b"]))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::UnexpectedResponse { .. }), "{e:?}");
    assert!(e.to_string().contains("1 of 2 keys"), "{e}");
}

#[tokio::test]
async fn invalid_items_are_refused_before_sending() {
    let server = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(ok_id("x"))
        .expect(0)
        .mount(&server)
        .await;
    let purger = fastly(&server.uri(), fast(1));
    let e = purger
        .purge(&PurgeRequest::tags(["ok", "not ok"]))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidRequest { .. }) && e.to_string().contains("whitespace"),
        "{e}"
    );
    let e = purger
        .purge(&PurgeRequest::urls(["www.example.com/no-scheme"]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a full URL"), "{e}");
}

#[tokio::test]
async fn the_purge_budget_counts_every_key_of_a_batch() {
    let server = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(EchoKeys)
        .expect(2)
        .mount(&server)
        .await;
    // Bucket 10 keys, 100 a second: the second batch of 10 keys waits ~100 ms for a refill.
    let limits = FastlyLimits::default()
        .with_purges(RateLimit::new(100.0, 10))
        .with_keys_per_batch(10);
    let purger = fastly(&server.uri(), fast(1))
        .with_limits(limits)
        .with_in_flight(1);
    let watch = multicdn_core::Stopwatch::start();
    purger.purge(&PurgeRequest::tags(tags(20))).await.unwrap();
    let took = watch.elapsed();
    assert!(took >= Duration::from_millis(95), "{took:?}");
    assert!(took < Duration::from_millis(600), "{took:?}");
}

#[test]
fn built_from_the_policy_entry_with_https_required() {
    let spec = serde_json::from_value(json!({
        "kind": "fastly", "edge_host": "example.map.fastly.net",
        "service_id": SERVICE, "token_env": "MULTICDN_TEST_FASTLY_TOKEN_UNSET"
    }))
    .unwrap();
    let p = FastlyPurger::from_spec(
        pid("fastly"),
        &spec,
        Secret::new(FASTLY_TOKEN),
        None,
        HttpSettings::default(),
    )
    .unwrap();
    assert_eq!(
        (p.id().as_str(), p.kind(), p.edge_host()),
        ("fastly", ProviderKind::Fastly, "example.map.fastly.net")
    );
    let pacing = p.pacing();
    assert!(pacing.soft_items && !pacing.soft_everything);
    assert_eq!(pacing.tags.map(|k| k.per_request), Some(256));
    let plain = FastlyPurger::from_spec(
        pid("fastly"),
        &spec,
        Secret::new("t"),
        Some("http://api.fastly.com"),
        HttpSettings::default(),
    )
    .unwrap_err();
    assert!(plain.to_string().contains("plain HTTP"), "{plain}");
    let env = FastlyPurger::from_spec_env(pid("fastly"), &spec, None, HttpSettings::default())
        .unwrap_err();
    assert!(
        env.to_string().contains("MULTICDN_TEST_FASTLY_TOKEN_UNSET"),
        "{env}"
    );
    let no_service: multicdn_core::policy::ProviderSpec =
        serde_json::from_value(json!({"kind": "fastly", "edge_host": "e"})).unwrap();
    let e = FastlyPurger::from_spec(
        pid("fastly"),
        &no_service,
        Secret::new("t"),
        None,
        HttpSettings::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("service_id"), "{e}");
    let cf: multicdn_core::policy::ProviderSpec =
        serde_json::from_value(json!({"kind": "cloudflare", "edge_host": "e", "zone_id": "z"}))
            .unwrap();
    assert!(
        FastlyPurger::from_spec(
            pid("cf"),
            &cf,
            Secret::new("t"),
            None,
            HttpSettings::default()
        )
        .is_err()
    );
}

#[test]
fn debug_never_shows_the_token() {
    let p = fastly("http://127.0.0.1:9", fast(1));
    let d = format!("{p:?}");
    assert!(!d.contains(FASTLY_TOKEN) && d.contains("[redacted]"), "{d}");
}

#[test]
fn a_token_a_header_cannot_carry_is_refused_without_printing_it() {
    let e = FastlyPurger::new(
        pid("fastly"),
        "example.map.fastly.net",
        SERVICE,
        Secret::new("tok-secret\n"),
        "http://127.0.0.1:9",
        HttpSettings::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidRequest { .. }), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("tok-secret"), "{e:?}");
}
