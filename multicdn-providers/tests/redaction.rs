//! Vendors that echo the request's headers in an error body: the error the library surfaces
//! (its message, its `Display` and its `Debug`) never carries a credential, whether echoed as
//! header lines or as JSON.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use multicdn_core::{ProviderId, Secret};
use multicdn_providers::cloudflare::deploy::CloudflareDeployer;
use multicdn_providers::fastly::deploy::FastlyDeployer;
use multicdn_providers::http::HttpSettings;
use multicdn_providers::ns1::Ns1Client;
use multicdn_providers::render::RenderMode;
use multicdn_providers::render::cloudflare_rules::{CloudflareTarget, render_cloudflare};
use multicdn_providers::render::fastly_vcl::render_fastly;
use serde_json::{Map, Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const FASTLY_TOKEN: &str = "fastly-echoed-token-0123";
const CLOUDFLARE_TOKEN: &str = "cloudflare-echoed-token-4567";
const NS1_KEY: &str = "ns1-echoed-key-89ab";

/// A 4xx whose body echoes every request header twice: as `Name: value` lines inside the
/// vendor's message, and as a JSON object (as echo and debugging proxies do).
fn echo(status: u16) -> impl Fn(&Request) -> ResponseTemplate {
    move |r: &Request| {
        let lines: String = r
            .headers
            .iter()
            .map(|(k, v)| format!("{k}: {}\n", v.to_str().unwrap()))
            .collect();
        let map: Map<String, Value> = r
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap())))
            .collect();
        ResponseTemplate::new(status).set_body_json(json!({
            "msg": format!("bad request; you sent:\n{lines}"),
            "message": format!("bad request; you sent:\n{lines}"),
            "success": false,
            "errors": [{"code": 1000, "message": format!("headers: {}", Value::Object(map.clone()))}],
            "headers": map,
        }))
    }
}

fn settings() -> HttpSettings {
    HttpSettings::default()
        .with_max_attempts(1)
        .with_request_timeout(Duration::from_secs(5))
}

fn policy() -> multicdn_core::Policy {
    multicdn_core::Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap()
}

fn assert_clean(err: &dyn std::fmt::Debug, shown: &str, secret: &str) {
    let all = format!("{shown} {err:?}");
    assert!(!all.contains(secret), "the secret surfaced: {all}");
    assert!(
        all.contains("[redacted]"),
        "the echo was not kept, redacted: {all}"
    );
}

#[tokio::test]
async fn a_fastly_error_echoing_fastly_key_is_redacted() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/service/SU1Z0isxPaozGVKXdv0eY/version"))
        .and(header("Fastly-Key", FASTLY_TOKEN))
        .respond_with(echo(400))
        .expect(1)
        .mount(&server)
        .await;
    let d = FastlyDeployer::new(
        ProviderId::new("fastly").unwrap(),
        "SU1Z0isxPaozGVKXdv0eY",
        Secret::new(FASTLY_TOKEN),
        &server.uri(),
        settings(),
    )
    .unwrap();
    let r = render_fastly(&policy().site, &policy().cache, RenderMode::Lenient).unwrap();
    let err = d.plan(&r).await.unwrap_err();
    assert_clean(&err, &err.to_string(), FASTLY_TOKEN);
}

#[tokio::test]
async fn a_cloudflare_error_echoing_authorization_is_redacted() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(
            "/zones/023e105f4ecef8ad9ca31a8372d0c353/rulesets/phases/http_request_cache_settings/entrypoint",
        ))
        .and(header("Authorization", format!("Bearer {CLOUDFLARE_TOKEN}")))
        .respond_with(echo(400))
        .expect(1)
        .mount(&server)
        .await;
    let d = CloudflareDeployer::new(
        ProviderId::new("cloudflare").unwrap(),
        "023e105f4ecef8ad9ca31a8372d0c353",
        Secret::new(CLOUDFLARE_TOKEN),
        &server.uri(),
        settings(),
    )
    .unwrap();
    let r = render_cloudflare(
        &policy().site,
        &policy().cache,
        CloudflareTarget::default(),
        RenderMode::Lenient,
    )
    .unwrap();
    let err = d.plan(&r).await.unwrap_err();
    assert_clean(&err, &err.to_string(), CLOUDFLARE_TOKEN);
}

#[tokio::test]
async fn an_ns1_error_echoing_x_nsone_key_is_redacted() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/zones/example.com/www.example.com/CNAME"))
        .and(header("X-NSONE-Key", NS1_KEY))
        .respond_with(echo(400))
        .expect(1)
        .mount(&server)
        .await;
    let client = Ns1Client::new(&server.uri(), Secret::new(NS1_KEY), settings()).unwrap();
    let err = client
        .get_record("example.com", "www.example.com", "CNAME")
        .await
        .unwrap_err();
    assert_clean(&err, &err.to_string(), NS1_KEY);
}
