//! Deploying the rendered snippets to Fastly, against wiremock on loopback: the plan reads
//! only, applying needs the explicit flag, a failed validation never activates, and drift is
//! read back from the active version.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use multicdn_core::{Policy, ProviderId, Secret};
use multicdn_providers::fastly::deploy::{FastlyDeployed, FastlyDeployer, as_written};
use multicdn_providers::http::HttpSettings;
use multicdn_providers::render::RenderMode;
use multicdn_providers::render::fastly_vcl::{
    FastlyRendering, Snippet, SnippetKind, render_fastly,
};
use multicdn_providers::render::plan::{ChangeOp, DeployError, DeployOptions};
use serde_json::{Value, json};
use wiremock::matchers::{body_string_contains, header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const SID: &str = "SU1Z0isxPaozGVKXdv0eY";
const TOKEN: &str = "fastly-token-0123456789";

fn rendering() -> FastlyRendering {
    let p = Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap();
    render_fastly(&p.site, &p.cache, RenderMode::Strict).unwrap()
}

fn deployer(server: &MockServer) -> FastlyDeployer {
    let settings = HttpSettings::default()
        .with_max_attempts(1)
        .with_request_timeout(Duration::from_secs(5));
    FastlyDeployer::new(
        ProviderId::new("fastly").unwrap(),
        SID,
        Secret::new(TOKEN),
        &server.uri(),
        settings,
    )
    .unwrap()
}

fn versions(active: u32) -> Value {
    json!([
        {"number": active - 1, "active": false, "locked": true},
        {"number": active, "active": true, "locked": true},
    ])
}

/// Fastly's listing shape: priority as a string, ids and timestamps alongside; a
/// `multicdn-...` snippet as multicdn wrote it (digest line included).
fn listed(name: &str, kind: &str, priority: u32, content: &str) -> Value {
    let content = if name.starts_with("multicdn-") {
        as_written(&Snippet {
            name: name.to_owned(),
            kind: SnippetKind::parse(kind).unwrap(),
            priority,
            content: content.to_owned(),
        })
        .content
    } else {
        content.to_owned()
    };
    json!({
        "id": format!("id-{name}"), "service_id": SID, "version": 3, "name": name, "type": kind,
        "priority": priority.to_string(), "dynamic": "0", "content": content,
        "created_at": "2026-11-01T00:00:00Z", "updated_at": "2026-11-01T00:00:00Z", "deleted_at": null
    })
}

fn deployed_as_rendered(r: &FastlyRendering) -> Vec<Value> {
    r.snippets
        .iter()
        .map(|s| listed(&s.name, s.kind.as_str(), s.priority, &s.content))
        .collect()
}

async fn mount_reads(server: &MockServer, active: u32, snippets: Vec<Value>) {
    Mock::given(method("GET"))
        .and(path(format!("/service/{SID}/version")))
        .and(header("Fastly-Key", TOKEN))
        .respond_with(ResponseTemplate::new(200).set_body_json(versions(active)))
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("/service/{SID}/version/{active}/snippet")))
        .and(header("Fastly-Key", TOKEN))
        .respond_with(ResponseTemplate::new(200).set_body_json(Value::Array(snippets)))
        .mount(server)
        .await;
}

/// Deployed by multicdn from an older policy: recv-routes out of date, an old snippet of
/// ours; and someone else's snippet.
fn drifted(r: &FastlyRendering) -> Vec<Value> {
    let mut deployed = deployed_as_rendered(r);
    deployed.retain(|s| s["name"] != "multicdn-hash-cache-key");
    deployed[0] = listed(
        "multicdn-recv-routes",
        "recv",
        10,
        "if (req.url.path ~ \"^/checkout\") {\n  return(pass);\n}\n",
    );
    deployed.push(listed(
        "multicdn-recv-legacy",
        "recv",
        50,
        "unset req.http.X-Legacy;\n",
    ));
    deployed.push(listed("custom-logging", "log", 100, "log \"x\";\n"));
    deployed
}

fn writes(requests: &[Request]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.method.as_str() != "GET")
        .map(|r| format!("{} {}", r.method, r.url.path()))
        .collect()
}

#[tokio::test]
async fn the_plan_lists_every_change_from_the_active_version_and_sends_nothing() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_reads(&server, 3, drifted(&r)).await;
    let plan = deployer(&server).plan(&r).await.unwrap();
    assert_eq!(plan.base_version, 3);
    let ops: Vec<_> = plan
        .changes
        .iter()
        .map(|c| (c.key.as_str(), c.op))
        .collect();
    assert_eq!(
        ops,
        [
            ("multicdn-recv-routes", ChangeOp::Update),
            ("multicdn-hash-cache-key", ChangeOp::Add),
            ("multicdn-recv-legacy", ChangeOp::Remove),
        ]
    );
    assert_eq!(plan.unmanaged, ["custom-logging"]);
    let shown = plan.to_string();
    assert!(
        shown.contains("clone active version 3, 3 snippet change(s)"),
        "{shown}"
    );
    assert!(shown.contains("~ multicdn-recv-routes"), "{shown}");
    assert!(
        shown.contains("+ multicdn-hash-cache-key (type hash, priority 10"),
        "{shown}"
    );
    assert!(shown.contains("- multicdn-recv-legacy"), "{shown}");
    assert!(
        shown.contains("unmanaged (left alone): custom-logging"),
        "{shown}"
    );
    assert!(writes(&server.received_requests().await.unwrap()).is_empty());
}

#[tokio::test]
async fn a_snippet_edited_on_the_console_is_not_overwritten_without_force() {
    let server = MockServer::start().await;
    let r = rendering();
    let mut deployed = drifted(&r);
    // Someone edited multicdn's recv snippet on the console: its digest no longer matches.
    let edited = deployed[0]["content"]
        .as_str()
        .unwrap()
        .replace("return(pass)", "return(lookup)");
    deployed[0]["content"] = json!(edited);
    mount_reads(&server, 3, deployed).await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let edits: Vec<_> = plan.console_edits.iter().map(ToString::to_string).collect();
    assert_eq!(
        edits,
        [
            "multicdn-recv-routes: edited since multicdn wrote it (its multicdn-digest no longer matches)"
        ]
    );
    assert!(
        plan.to_string()
            .contains("console edit, overwritten only when forced"),
        "{plan}"
    );
    let err = d.apply(&plan, true).await.unwrap_err();
    assert!(matches!(err, DeployError::ConsoleEdits { .. }), "{err}");
    assert!(writes(&server.received_requests().await.unwrap()).is_empty());
    // Forced, it goes ahead: the clone is the first write.
    Mock::given(method("PUT"))
        .and(path(format!("/service/{SID}/version/3/clone")))
        .and(header("Fastly-Key", TOKEN))
        .respond_with(ResponseTemplate::new(500))
        .expect(1)
        .mount(&server)
        .await;
    let forced = DeployOptions::default().confirm(true).force(true);
    assert!(d.apply_with(&plan, forced).await.is_err());
}

#[tokio::test]
async fn applying_without_the_flag_sends_nothing() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_reads(&server, 3, drifted(&r)).await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let before = server.received_requests().await.unwrap().len();
    let err = d.apply(&plan, false).await.unwrap_err();
    assert!(matches!(err, DeployError::NotConfirmed { .. }), "{err}");
    assert_eq!(server.received_requests().await.unwrap().len(), before);
}

async fn mount_writes(server: &MockServer, validate: ResponseTemplate, activations: u64) {
    Mock::given(method("PUT"))
        .and(header("Fastly-Key", TOKEN))
        .and(path(format!("/service/{SID}/version/3/clone")))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"number": 4, "active": false})),
        )
        .expect(1)
        .mount(server)
        .await;
    Mock::given(method("PUT"))
        .and(path(format!(
            "/service/{SID}/version/4/snippet/multicdn-recv-routes"
        )))
        .and(header("Content-Type", "application/x-www-form-urlencoded"))
        .and(body_string_contains("type=recv"))
        .and(body_string_contains("priority=10"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"name": "multicdn-recv-routes"})),
        )
        .expect(1)
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path(format!("/service/{SID}/version/4/snippet")))
        .and(header("Content-Type", "application/x-www-form-urlencoded"))
        .and(body_string_contains("name=multicdn-hash-cache-key"))
        .and(body_string_contains("type=hash"))
        .and(body_string_contains("dynamic=0"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"name": "multicdn-hash-cache-key"})),
        )
        .expect(1)
        .mount(server)
        .await;
    Mock::given(method("DELETE"))
        .and(header("Fastly-Key", TOKEN))
        .and(path(format!(
            "/service/{SID}/version/4/snippet/multicdn-recv-legacy"
        )))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "ok"})))
        .expect(1)
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(header("Fastly-Key", TOKEN))
        .and(path(format!("/service/{SID}/version/4/validate")))
        .respond_with(validate)
        .expect(1)
        .mount(server)
        .await;
    Mock::given(method("PUT"))
        .and(header("Fastly-Key", TOKEN))
        .and(path(format!("/service/{SID}/version/4/activate")))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"number": 4, "active": true})),
        )
        .expect(activations)
        .mount(server)
        .await;
}

#[tokio::test]
async fn apply_clones_replaces_validates_then_activates() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_reads(&server, 3, drifted(&r)).await;
    mount_writes(
        &server,
        ResponseTemplate::new(200).set_body_json(json!({"status": "ok"})),
        1,
    )
    .await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let done = d.apply(&plan, true).await.unwrap();
    assert_eq!(
        done,
        FastlyDeployed::Activated {
            previous: 3,
            version: 4
        }
    );
    let requests = server.received_requests().await.unwrap();
    assert_eq!(
        writes(&requests),
        [
            format!("PUT /service/{SID}/version/3/clone"),
            format!("PUT /service/{SID}/version/4/snippet/multicdn-recv-routes"),
            format!("POST /service/{SID}/version/4/snippet"),
            format!("DELETE /service/{SID}/version/4/snippet/multicdn-recv-legacy"),
            format!("PUT /service/{SID}/version/4/activate"),
        ]
    );
    // The created snippet's content arrives intact through the form encoding.
    let post = requests
        .iter()
        .find(|q| q.method.as_str() == "POST")
        .unwrap();
    let form: Vec<(String, String)> = url::form_urlencoded::parse(&post.body)
        .into_owned()
        .collect();
    let content = &form.iter().find(|(k, _)| k == "content").unwrap().1;
    assert_eq!(
        content,
        &as_written(r.snippet("multicdn-hash-cache-key").unwrap()).content
    );
    assert!(
        requests
            .iter()
            .all(|q| q.headers.get("Fastly-Key").unwrap() == TOKEN)
    );
}

#[tokio::test]
async fn a_failed_validation_never_activates_and_reports_fastlys_messages() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_reads(&server, 3, drifted(&r)).await;
    mount_writes(
        &server,
        ResponseTemplate::new(200).set_body_json(json!({
            "status": "error",
            "msg": "Syntax error: Unexpected token",
            "errors": ["Unexpected '}' at line 12, column 3", {"message": "in snippet multicdn-recv-routes"}],
        })),
        0,
    )
    .await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let err = d.apply(&plan, true).await.unwrap_err();
    let DeployError::ValidationFailed {
        version,
        message,
        errors,
        ..
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!(*version, 4);
    assert_eq!(message, "Syntax error: Unexpected token");
    assert_eq!(errors.len(), 2);
    let shown = err.to_string();
    assert!(
        shown.contains("not activated") && shown.contains("line 12"),
        "{shown}"
    );
    assert!(!shown.contains(TOKEN));
    // The activate stub's expect(0) is verified when the server drops.
}

#[tokio::test]
async fn a_plan_made_against_an_older_active_version_is_refused_before_any_write() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_reads(&server, 3, drifted(&r)).await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    server.reset().await;
    mount_reads(&server, 5, drifted(&r)).await;
    let err = d.apply(&plan, true).await.unwrap_err();
    assert!(matches!(err, DeployError::PlanOutdated { .. }), "{err}");
    assert!(err.to_string().contains("version 3") && err.to_string().contains("version 5"));
    assert!(writes(&server.received_requests().await.unwrap()).is_empty());
}

#[tokio::test]
async fn an_up_to_date_service_is_left_alone() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_reads(&server, 7, deployed_as_rendered(&r)).await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    assert!(plan.is_empty(), "{plan}");
    assert_eq!(
        d.apply(&plan, true).await.unwrap(),
        FastlyDeployed::Unchanged { version: 7 }
    );
    assert!(writes(&server.received_requests().await.unwrap()).is_empty());
    let drift = d.drift(&r).await.unwrap();
    assert!(drift.is_clean(), "{drift}");
}

#[tokio::test]
async fn drift_reports_every_snippet_that_differs_with_expected_and_deployed() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_reads(&server, 3, drifted(&r)).await;
    let drift = deployer(&server).drift(&r).await.unwrap();
    let keys: Vec<_> = drift.differences.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "multicdn-recv-routes",
            "multicdn-hash-cache-key",
            "multicdn-recv-legacy"
        ]
    );
    let changed = &drift.differences[0];
    assert_eq!(changed.rendered.as_ref(), r.snippet("multicdn-recv-routes"));
    assert!(
        changed
            .deployed
            .as_ref()
            .unwrap()
            .content
            .contains("^/checkout")
    );
    let shown = drift.to_string();
    assert!(shown.contains("3 item(s) differ"), "{shown}");
    assert!(
        shown.contains("expected: # cache.routes[0] match ^/checkout: never cached"),
        "{shown}"
    );
    assert!(shown.contains("deployed, not expected"), "{shown}");
    assert!(
        shown.contains("not managed by the policy: custom-logging"),
        "{shown}"
    );
}

#[tokio::test]
async fn fastly_errors_name_the_request_and_never_the_token() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(header("Fastly-Key", TOKEN))
        .and(path(format!("/service/{SID}/version")))
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_json(json!({"msg": "Provided credentials are missing or invalid"})),
        )
        .mount(&server)
        .await;
    let d = deployer(&server);
    let err = d.plan(&rendering()).await.unwrap_err();
    assert!(err.is_auth(), "{err}");
    let shown = format!("{err} {err:?} {d:?}");
    assert!(
        shown.contains(&format!("GET /service/{SID}/version")),
        "{shown}"
    );
    assert!(shown.contains("credentials are missing"), "{shown}");
    assert!(!shown.contains(TOKEN), "{shown}");
}

#[tokio::test]
async fn a_validation_verdict_sent_as_http_400_is_still_a_validation_failure() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_reads(&server, 3, drifted(&r)).await;
    mount_writes(
        &server,
        ResponseTemplate::new(400).set_body_json(json!({
            "status": "error",
            "msg": "Compilation failed",
            "errors": ["Unknown variable 'beresp.stale_if_error'"],
        })),
        0,
    )
    .await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let err = d.apply(&plan, true).await.unwrap_err();
    assert!(
        matches!(&err, DeployError::ValidationFailed { version: 4, errors, .. } if errors[0].contains("Unknown variable")),
        "{err}"
    );
}

#[tokio::test]
async fn a_failed_snippet_write_names_the_draft_and_never_activates() {
    let server = MockServer::start().await;
    let r = rendering();
    mount_reads(&server, 3, drifted(&r)).await;
    Mock::given(method("PUT"))
        .and(header("Fastly-Key", TOKEN))
        .and(path(format!("/service/{SID}/version/3/clone")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"number": 4})))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(header("Fastly-Key", TOKEN))
        .and(path(format!(
            "/service/{SID}/version/4/snippet/multicdn-recv-routes"
        )))
        .respond_with(
            ResponseTemplate::new(400).set_body_json(
                json!({"msg": "Bad request", "detail": "priority must be a number"}),
            ),
        )
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(header("Fastly-Key", TOKEN))
        .and(path(format!("/service/{SID}/version/4/activate")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"number": 4})))
        .expect(0)
        .mount(&server)
        .await;
    let d = deployer(&server);
    let plan = d.plan(&r).await.unwrap();
    let err = d.apply(&plan, true).await.unwrap_err();
    assert!(matches!(err, DeployError::Partial { .. }), "{err}");
    let shown = err.to_string();
    assert!(shown.contains("priority must be a number"), "{shown}");
    assert!(
        shown.contains("draft version 4 cloned from version 3; version 3 stays active"),
        "{shown}"
    );
}

#[test]
fn a_token_a_header_cannot_carry_is_refused_by_name_when_the_deployer_is_built() {
    let bad = format!("{TOKEN}\n");
    let err = FastlyDeployer::new(
        ProviderId::new("fastly").unwrap(),
        SID,
        Secret::new(bad.as_str()),
        "https://api.fastly.com",
        HttpSettings::default(),
    )
    .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("fastly"), "{shown}");
    assert!(shown.contains("HTTP header cannot carry"), "{shown}");
    assert!(!shown.contains(TOKEN), "{shown}");
}

#[test]
fn a_provider_entry_without_a_service_id_is_refused_naming_the_field() {
    let p = Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap();
    let id = ProviderId::new("fastly").unwrap();
    let mut spec = p.providers[&id].clone();
    spec.service_id = None;
    let err =
        FastlyDeployer::from_spec(id, &spec, Secret::new(TOKEN), None, HttpSettings::default())
            .unwrap_err();
    assert!(
        err.to_string()
            .contains("providers.fastly.service_id is required to deploy to Fastly"),
        "{err}"
    );
}
