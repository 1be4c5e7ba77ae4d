//! Deploying the rendered rulesets to Cloudflare, against wiremock on loopback: entry points
//! read and diffed, the whole rule list PUT per phase only with the explicit flag, error
//! envelopes reported with their codes, and drift read back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use multicdn_core::policy::CloudflarePlan;
use multicdn_core::{Error, Policy, ProviderId, Secret};
use multicdn_providers::cloudflare::deploy::{CloudflareDeployer, as_written};
use multicdn_providers::http::HttpSettings;
use multicdn_providers::render::RenderMode;
use multicdn_providers::render::cloudflare_rules::{
    CACHE_PHASE, CloudflareRendering, CloudflareTarget, HEADERS_PHASE, Ruleset, render_cloudflare,
};
use multicdn_providers::render::plan::{ChangeOp, DeployError, DeployOptions};
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const ZONE: &str = "023e105f4ecef8ad9ca31a8372d0c353";
const TOKEN: &str = "cf-token-abcdef0123456789";

fn rendering() -> CloudflareRendering {
    let p = Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap();
    render_cloudflare(
        &p.site,
        &p.cache,
        CloudflareTarget::new(CloudflarePlan::Pro),
        RenderMode::Lenient,
    )
    .unwrap()
}

fn deployer(server: &MockServer) -> CloudflareDeployer {
    let settings = HttpSettings::default()
        .with_max_attempts(1)
        .with_request_timeout(Duration::from_secs(5));
    CloudflareDeployer::new(
        ProviderId::new("cloudflare").unwrap(),
        ZONE,
        Secret::new(TOKEN),
        &server.uri(),
        settings,
    )
    .unwrap()
}

fn entrypoint(phase: &str) -> String {
    format!("/zones/{ZONE}/rulesets/phases/{phase}/entrypoint")
}

fn ok(result: Value) -> ResponseTemplate {
    ResponseTemplate::new(200)
        .set_body_json(json!({"success": true, "errors": [], "messages": [], "result": result}))
}

/// The ruleset as Cloudflare returns it after multicdn wrote it: ids, versions and timestamps
/// on every rule, multicdn's mark in every description.
fn as_deployed(r: &Ruleset, version: &str) -> Value {
    let rules: Vec<Value> = r
        .rules
        .iter()
        .enumerate()
        .map(|(i, rule)| {
            let mut v = serde_json::to_value(as_written(rule)).unwrap();
            v["id"] = json!(format!("rule{i}"));
            v["version"] = json!("1");
            v["last_updated"] = json!("2026-11-01T00:00:00Z");
            v
        })
        .collect();
    json!({
        "id": format!("rs-{}", r.phase), "name": "default", "kind": "zone", "phase": r.phase,
        "version": version, "last_updated": "2026-11-01T00:00:00Z", "rules": rules
    })
}

async fn mount_get(server: &MockServer, phase: &str, answer: ResponseTemplate) {
    Mock::given(method("GET"))
        .and(path(entrypoint(phase)))
        .and(header("Authorization", format!("Bearer {TOKEN}")))
        .respond_with(answer)
        .mount(server)
        .await;
}

fn not_found() -> ResponseTemplate {
    ResponseTemplate::new(404).set_body_json(json!({
        "success": false, "errors": [{"code": 10003, "message": "could not find entrypoint ruleset in the http_request_cache_settings phase"}],
        "messages": [], "result": null
    }))
}

/// One PUT of the cache phase's whole rule list, answered as version 8.
async fn expect_one_cache_put(server: &MockServer) {
    Mock::given(method("PUT"))
        .and(path(entrypoint(CACHE_PHASE)))
        .and(header("Authorization", format!("Bearer {TOKEN}")))
        .and(header("Content-Type", "application/json"))
        .respond_with(ok(json!({"id": "rs", "version": "8", "rules": []})))
        .expect(1)
        .mount(server)
        .await;
}

fn writes(requests: &[Request]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.method.as_str() != "GET")
        .map(|r| format!("{} {}", r.method, r.url.path()))
        .collect()
}

/// The cache phase as deployed with drift: the defaults rule edited on the console, the
/// assets rule missing, and a console-only rule added.
fn drifted_cache(r: &CloudflareRendering) -> Value {
    let mut v = as_deployed(&r.cache_rules, "7");
    let rules = v["rules"].as_array_mut().unwrap();
    rules[0]["action_parameters"]["edge_ttl"]["default"] = json!(600);
    rules.retain(|x| x["ref"] != "multicdn-cache-route-3");
    rules.push(json!({
        "id": "c0ffee", "ref": "c0ffee", "version": "1", "action": "set_cache_settings",
        "expression": "(http.host eq \"old.example.com\")", "description": "added on the console",
        "action_parameters": {"cache": false}, "enabled": true
    }));
    v
}

#[tokio::test]
async fn a_zone_without_entry_points_plans_every_rule_as_an_addition() {
    let server = MockServer::start().await;
    mount_get(&server, CACHE_PHASE, not_found()).await;
    mount_get(&server, HEADERS_PHASE, not_found()).await;
    let r = rendering();
    let plan = deployer(&server).plan(&r).await.unwrap();
    assert_eq!(plan.phases.len(), 2);
    for (p, rs) in plan.phases.iter().zip(r.rulesets()) {
        assert_eq!(p.deployed_version, None);
        assert_eq!(p.changes.len(), rs.rules.len());
        assert!(p.changes.iter().all(|c| c.op == ChangeOp::Add));
    }
    assert!(plan.to_string().contains("no entry point yet"), "{plan}");
    assert!(writes(&server.received_requests().await.unwrap()).is_empty());
}

#[tokio::test]
async fn the_plan_diffs_each_phase_by_rule_ref_and_sends_nothing() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_get(&server, CACHE_PHASE, ok(drifted_cache(&r))).await;
    mount_get(
        &server,
        HEADERS_PHASE,
        ok(as_deployed(&r.header_rules, "3")),
    )
    .await;
    let plan = deployer(&server).plan(&r).await.unwrap();
    let cache = &plan.phases[0];
    assert_eq!(cache.phase, CACHE_PHASE);
    assert_eq!(cache.deployed_version.as_deref(), Some("7"));
    let ops: Vec<_> = cache
        .changes
        .iter()
        .map(|c| (c.key.as_str(), c.op))
        .collect();
    assert_eq!(
        ops,
        [
            ("multicdn-cache-defaults", ChangeOp::Update),
            ("multicdn-cache-route-3", ChangeOp::Add),
            ("c0ffee", ChangeOp::Remove),
        ]
    );
    // Cloudflare's ids, versions and timestamps are not differences.
    assert!(plan.phases[1].changes.is_empty());
    let shown = plan.to_string();
    assert!(shown.contains("\"default\":600"), "{shown}");
    assert!(shown.contains("\"default\":3600"), "{shown}");
    assert!(shown.contains("- c0ffee"), "{shown}");
    assert!(
        shown.contains(&format!("{HEADERS_PHASE} (version 3): unchanged")),
        "{shown}"
    );
    // The console's edit of the defaults rule and its own rule are named as console edits.
    let edits: Vec<_> = plan
        .console_edits()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(edits.len(), 2, "{edits:?}");
    assert!(
        edits[0].starts_with(&format!(
            "{CACHE_PHASE}/multicdn-cache-defaults: edited since multicdn wrote it"
        )),
        "{edits:?}"
    );
    assert!(
        edits[1].starts_with(&format!("{CACHE_PHASE}/c0ffee: added outside multicdn")),
        "{edits:?}"
    );
    assert!(writes(&server.received_requests().await.unwrap()).is_empty());
}

#[tokio::test]
async fn rules_multicdn_wrote_are_replaced_without_force() {
    let server = MockServer::start().await;
    let r = rendering();
    // An older rendering, written by multicdn: the defaults rule had another edge TTL.
    let mut older = r.cache_rules.clone();
    older.rules[0].action_parameters["edge_ttl"]["default"] = json!(600);
    mount_get(&server, CACHE_PHASE, ok(as_deployed(&older, "7"))).await;
    mount_get(
        &server,
        HEADERS_PHASE,
        ok(as_deployed(&r.header_rules, "3")),
    )
    .await;
    expect_one_cache_put(&server).await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    assert!(plan.console_edits().is_empty(), "{plan}");
    let done = d.apply(&plan, true).await.unwrap();
    assert_eq!(
        done.written,
        [(CACHE_PHASE.to_owned(), Some("8".to_owned()))]
    );
}

#[tokio::test]
async fn applying_without_the_flag_or_over_console_edits_without_force_sends_nothing() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_get(&server, CACHE_PHASE, ok(drifted_cache(&r))).await;
    mount_get(&server, HEADERS_PHASE, not_found()).await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let before = server.received_requests().await.unwrap().len();
    let err = d.apply(&plan, false).await.unwrap_err();
    assert!(matches!(err, DeployError::NotConfirmed { .. }), "{err}");
    // Confirmed, but the console's edits would be overwritten: refused too.
    let err = d.apply(&plan, true).await.unwrap_err();
    let DeployError::ConsoleEdits { edits, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(edits.len(), 2, "{err}");
    assert!(
        err.to_string().contains("c0ffee: added outside multicdn"),
        "{err}"
    );
    assert_eq!(server.received_requests().await.unwrap().len(), before);
}

#[tokio::test]
async fn apply_puts_the_whole_rule_list_of_each_changed_phase_only() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_get(&server, CACHE_PHASE, ok(drifted_cache(&r))).await;
    mount_get(
        &server,
        HEADERS_PHASE,
        ok(as_deployed(&r.header_rules, "3")),
    )
    .await;
    expect_one_cache_put(&server).await;
    Mock::given(method("PUT"))
        .and(header("Authorization", format!("Bearer {TOKEN}")))
        .and(path(entrypoint(HEADERS_PHASE)))
        .respond_with(ok(json!({})))
        .expect(0)
        .mount(&server)
        .await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let done = d
        .apply_with(&plan, DeployOptions::default().confirm(true).force(true))
        .await
        .unwrap();
    assert_eq!(
        done.written,
        [(CACHE_PHASE.to_owned(), Some("8".to_owned()))]
    );
    let requests = server.received_requests().await.unwrap();
    let put = requests
        .iter()
        .find(|q| q.method.as_str() == "PUT")
        .unwrap();
    let body: Value = serde_json::from_slice(&put.body).unwrap();
    let written: Vec<_> = r.cache_rules.rules.iter().map(as_written).collect();
    assert_eq!(body["rules"], serde_json::to_value(&written).unwrap());
    assert_eq!(body["rules"][0]["ref"], "multicdn-cache-defaults");
}

#[tokio::test]
async fn an_error_envelope_is_reported_with_every_code_and_message() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_get(&server, CACHE_PHASE, not_found()).await;
    mount_get(&server, HEADERS_PHASE, not_found()).await;
    Mock::given(method("PUT"))
        .and(header("Authorization", format!("Bearer {TOKEN}")))
        .and(path(entrypoint(CACHE_PHASE)))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "success": false,
            "errors": [
                {"code": 20217, "message": "'starts_with' is not allowed: expression is invalid"},
                {"code": 20021, "message": "rule 2 is invalid"}
            ],
            "messages": [], "result": null
        })))
        .expect(1)
        .mount(&server)
        .await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let err = d.apply(&plan, true).await.unwrap_err();
    let DeployError::Vendor(Error::Vendor {
        status,
        code,
        message,
        retryable,
        request,
        ..
    }) = &err
    else {
        panic!("{err}");
    };
    assert_eq!(
        (*status, code.as_deref(), *retryable),
        (400, Some("20217"), false)
    );
    assert!(
        message.contains("20217: 'starts_with'") && message.contains("20021: rule 2"),
        "{message}"
    );
    assert_eq!(request, &format!("PUT {}", entrypoint(CACHE_PHASE)));
    assert!(!format!("{err} {err:?} {d:?}").contains(TOKEN));
}

#[tokio::test]
async fn a_200_with_success_false_is_a_failure_not_an_empty_zone() {
    let server = MockServer::start().await;
    mount_get(
        &server,
        CACHE_PHASE,
        ResponseTemplate::new(200).set_body_json(json!({
            "success": false, "errors": [{"code": 10000, "message": "Authentication error"}],
            "messages": [], "result": null
        })),
    )
    .await;
    let err = deployer(&server).plan(&rendering()).await.unwrap_err();
    assert!(err.is_auth(), "{err}");
    assert!(
        err.to_string().contains("10000: Authentication error"),
        "{err}"
    );
}

#[tokio::test]
async fn a_plan_made_against_an_older_ruleset_version_is_refused_before_any_write() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_get(&server, CACHE_PHASE, ok(drifted_cache(&r))).await;
    mount_get(&server, HEADERS_PHASE, not_found()).await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    server.reset().await;
    let mut moved = drifted_cache(&r);
    moved["version"] = json!("9");
    mount_get(&server, CACHE_PHASE, ok(moved)).await;
    mount_get(&server, HEADERS_PHASE, not_found()).await;
    let err = d
        .apply_with(&plan, DeployOptions::default().confirm(true).force(true))
        .await
        .unwrap_err();
    assert!(matches!(err, DeployError::PlanOutdated { .. }), "{err}");
    assert!(err.to_string().contains("from version 7 to 9"), "{err}");
    assert!(writes(&server.received_requests().await.unwrap()).is_empty());
}

#[tokio::test]
async fn drift_reports_every_rule_that_differs_and_nothing_when_deployed_as_rendered() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_get(&server, CACHE_PHASE, ok(drifted_cache(&r))).await;
    mount_get(
        &server,
        HEADERS_PHASE,
        ok(as_deployed(&r.header_rules, "3")),
    )
    .await;
    let d = deployer(&server);
    let drift = d.drift(&r).await.unwrap();
    let keys: Vec<_> = drift.differences.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "http_request_cache_settings/multicdn-cache-defaults",
            "http_request_cache_settings/multicdn-cache-route-3",
            "http_request_cache_settings/c0ffee",
        ]
    );
    let defaults = &drift.differences[0];
    assert_eq!(
        defaults.deployed.as_ref().unwrap().action_parameters["edge_ttl"]["default"],
        600
    );
    assert_eq!(
        defaults.rendered.as_ref().unwrap().action_parameters["edge_ttl"]["default"],
        3600
    );
    assert!(
        drift.to_string().contains("added on the console"),
        "{drift}"
    );

    server.reset().await;
    mount_get(&server, CACHE_PHASE, ok(as_deployed(&r.cache_rules, "8"))).await;
    mount_get(
        &server,
        HEADERS_PHASE,
        ok(as_deployed(&r.header_rules, "3")),
    )
    .await;
    let clean = d.drift(&r).await.unwrap();
    assert!(clean.is_clean(), "{clean}");
}

#[tokio::test]
async fn a_failure_after_one_phase_was_written_says_what_was_written() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_get(&server, CACHE_PHASE, not_found()).await;
    mount_get(&server, HEADERS_PHASE, not_found()).await;
    Mock::given(method("PUT"))
        .and(header("Authorization", format!("Bearer {TOKEN}")))
        .and(path(entrypoint(CACHE_PHASE)))
        .respond_with(ok(json!({"id": "rs", "version": "1", "rules": []})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(header("Authorization", format!("Bearer {TOKEN}")))
        .and(path(entrypoint(HEADERS_PHASE)))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "success": false, "errors": [{"code": 20120, "message": "the expression is invalid"}],
            "messages": [], "result": null
        })))
        .expect(1)
        .mount(&server)
        .await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let err = d.apply(&plan, true).await.unwrap_err();
    let DeployError::Partial { done, source } = &err else {
        panic!("{err}");
    };
    assert_eq!(done, &format!("{CACHE_PHASE} (version 1)"));
    assert!(
        source
            .to_string()
            .contains("20120: the expression is invalid"),
        "{source}"
    );
}

#[test]
fn deployers_are_built_from_the_policys_provider_entries_or_refused_with_the_field() {
    let p = Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap();
    let cf = ProviderId::new("cloudflare").unwrap();
    let fastly = ProviderId::new("fastly").unwrap();
    let settings = HttpSettings::default;
    let token = || Secret::new(TOKEN);
    assert!(
        CloudflareDeployer::from_spec(cf.clone(), &p.providers[&cf], token(), None, settings())
            .is_ok()
    );
    assert!(
        multicdn_providers::fastly::deploy::FastlyDeployer::from_spec(
            fastly.clone(),
            &p.providers[&fastly],
            token(),
            None,
            settings()
        )
        .is_ok()
    );
    let wrong = CloudflareDeployer::from_spec(
        fastly.clone(),
        &p.providers[&fastly],
        token(),
        None,
        settings(),
    )
    .unwrap_err();
    assert!(wrong.to_string().contains("not cloudflare"), "{wrong}");
    let insecure = CloudflareDeployer::new(cf, ZONE, token(), "http://api.example.com", settings())
        .unwrap_err();
    assert!(insecure.to_string().contains("plain HTTP"), "{insecure}");
}

#[tokio::test]
async fn a_plan_for_another_zone_is_refused_before_anything_is_sent() {
    let server = MockServer::start().await;
    mount_get(&server, CACHE_PHASE, not_found()).await;
    mount_get(&server, HEADERS_PHASE, not_found()).await;
    let mut plan = deployer(&server).plan(&rendering()).await.unwrap();
    plan.zone_id = "ffffffffffffffffffffffffffffffff".into();
    let before = server.received_requests().await.unwrap().len();
    let err = deployer(&server).apply(&plan, true).await.unwrap_err();
    assert!(matches!(err, DeployError::PlanOutdated { .. }), "{err}");
    assert_eq!(server.received_requests().await.unwrap().len(), before);
}

#[test]
fn a_token_a_header_cannot_carry_is_refused_by_name_when_the_deployer_is_built() {
    let bad = format!("{TOKEN}\r\n");
    let err = CloudflareDeployer::new(
        ProviderId::new("cloudflare").unwrap(),
        ZONE,
        Secret::new(bad.as_str()),
        "https://api.cloudflare.com/client/v4",
        HttpSettings::default(),
    )
    .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("cloudflare"), "{shown}");
    assert!(shown.contains("HTTP header cannot carry"), "{shown}");
    assert!(!shown.contains(TOKEN), "{shown}");
}
