//! The `deploy` tool against stateful Fastly and Cloudflare stubs on loopback (wiremock): every
//! route checks method, path, the auth header and the body's shape, and keeps the service's
//! versions and the zone's rulesets, so `apply` then `drift` reads back what was written, and a
//! console edit made between two runs is seen by the next.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::runtime::Runtime;
use wiremock::matchers::{header, method, path_regex};
use wiremock::{Match, Mock, MockServer, Request, ResponseTemplate};

const SID: &str = "SU1Z0isxPaozGVKXdv0eY";
const ZONE: &str = "023e105f4ecef8ad9ca31a8372d0c353";
const FASTLY_TOKEN: &str = "fastly-secret-token-0123";
const CLOUDFLARE_TOKEN: &str = "cloudflare-secret-token-4567";

/// `target/<profile>/examples/deploy`, beside this test's `target/<profile>/deps/`.
fn deploy_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|d| d.parent()).unwrap();
    profile
        .join("examples")
        .join(format!("deploy{}", std::env::consts::EXE_SUFFIX))
}

struct Stubs {
    fastly: MockServer,
    cloudflare: MockServer,
    service: Arc<Mutex<Service>>,
    zone: Arc<Mutex<Zone>>,
}

impl Stubs {
    /// Runs `deploy <args> --policy examples/policy.yaml` against both stubs.
    fn deploy(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(deploy_binary());
        cmd.args(args)
            .args([
                "--policy",
                concat!(env!("CARGO_MANIFEST_DIR"), "/policy.yaml"),
            ])
            .args(["--fastly-endpoint", &self.fastly.uri()])
            .args(["--cloudflare-endpoint", &self.cloudflare.uri()])
            .env("FASTLY_API_TOKEN", FASTLY_TOKEN)
            .env("CLOUDFLARE_API_TOKEN", CLOUDFLARE_TOKEN);
        let out = cmd.output().unwrap();
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            !all.contains(FASTLY_TOKEN) && !all.contains(CLOUDFLARE_TOKEN),
            "a token was printed:\n{all}"
        );
        out
    }

    /// How many requests each stub has received so far.
    fn mark(&self, rt: &Runtime) -> [usize; 2] {
        [&self.cloudflare, &self.fastly]
            .map(|server| rt.block_on(server.received_requests()).unwrap().len())
    }

    /// Every request the stubs received after `mark`, as `METHOD /path`, Cloudflare's first
    /// (the tool goes through the policy's providers in name order).
    fn since(&self, rt: &Runtime, mark: [usize; 2]) -> Vec<String> {
        let mut out = Vec::new();
        for (server, from) in [&self.cloudflare, &self.fastly].into_iter().zip(mark) {
            for r in &rt.block_on(server.received_requests()).unwrap()[from..] {
                out.push(format!("{} {}", r.method, r.url.path()));
            }
        }
        out
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// What the plan and diff read; anything else is a write (or Fastly's validation).
fn is_read(call: &str) -> bool {
    call.starts_with("GET ")
        && (call.ends_with("/version")
            || call.ends_with("/snippet")
            || call.ends_with("/entrypoint"))
}

// ---- Fastly: a service with versions, each with its snippets -------------------------

#[derive(Debug, Default)]
struct Service {
    /// `(number, active, snippets)`.
    versions: Vec<(u32, bool, Vec<Value>)>,
}

impl Service {
    fn version(&mut self, n: u32) -> Option<&mut (u32, bool, Vec<Value>)> {
        self.versions.iter_mut().find(|v| v.0 == n)
    }

    /// A console edit: clone the active version, change one snippet's VCL, activate.
    fn console_edit(&mut self, name: &str, from: &str, to: &str) {
        let (_, _, mut snippets) = self.versions.iter().find(|v| v.1).unwrap().clone();
        let s = snippets.iter_mut().find(|s| s["name"] == name).unwrap();
        let content = s["content"].as_str().unwrap().replace(from, to);
        assert_ne!(s["content"], json!(content), "{from:?} is not in {name}");
        s["content"] = json!(content);
        let number = self.versions.len() as u32 + 1;
        for v in &mut self.versions {
            v.1 = false;
        }
        self.versions.push((number, true, snippets));
    }
}

/// The numeric segment after `/version/`.
fn version_in(r: &Request) -> u32 {
    let segments: Vec<&str> = r.url.path().split('/').collect();
    segments[4].parse().unwrap()
}

fn form(r: &Request) -> Vec<(String, String)> {
    url::form_urlencoded::parse(&r.body).into_owned().collect()
}

/// A form-urlencoded body with exactly these fields (Fastly's snippet writes).
struct FormFields(&'static [&'static str]);

impl Match for FormFields {
    fn matches(&self, r: &Request) -> bool {
        let keys: BTreeSet<String> = form(r).into_iter().map(|(k, _)| k).collect();
        r.headers
            .get("content-type")
            .is_some_and(|v| v == "application/x-www-form-urlencoded")
            && keys == self.0.iter().map(|k| (*k).to_owned()).collect()
    }
}

fn fastly_error(status: u16, msg: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({"msg": msg, "detail": msg}))
}

async fn fastly(service: &Arc<Mutex<Service>>) -> MockServer {
    let server = MockServer::start().await;
    let base = format!("^/service/{SID}/version");
    let key = || header("Fastly-Key", FASTLY_TOKEN);
    let s = service.clone();
    Mock::given(method("GET"))
        .and(path_regex(format!("{base}$")))
        .and(key())
        .respond_with(move |_: &Request| {
            let list: Vec<Value> = s
                .lock()
                .unwrap()
                .versions
                .iter()
                .map(|(n, active, _)| json!({"number": n, "active": active, "service_id": SID}))
                .collect();
            ResponseTemplate::new(200).set_body_json(list)
        })
        .mount(&server)
        .await;
    let s = service.clone();
    Mock::given(method("GET"))
        .and(path_regex(format!("{base}/[0-9]+/snippet$")))
        .and(key())
        .respond_with(move |r: &Request| {
            let mut state = s.lock().unwrap();
            match state.version(version_in(r)) {
                Some((_, _, snippets)) => {
                    ResponseTemplate::new(200).set_body_json(snippets.clone())
                }
                None => fastly_error(404, "Record not found"),
            }
        })
        .mount(&server)
        .await;
    let s = service.clone();
    Mock::given(method("PUT"))
        .and(path_regex(format!("{base}/[0-9]+/clone$")))
        .and(key())
        .respond_with(move |r: &Request| {
            let mut state = s.lock().unwrap();
            let Some((_, _, snippets)) = state.version(version_in(r)).map(|v| v.clone()) else {
                return fastly_error(404, "Record not found");
            };
            let number = state.versions.len() as u32 + 1;
            state.versions.push((number, false, snippets));
            ResponseTemplate::new(200).set_body_json(json!({"number": number, "active": false}))
        })
        .mount(&server)
        .await;
    // Writes go to an inactive (draft) version only, as on Fastly (active versions are locked).
    let s = service.clone();
    Mock::given(method("POST"))
        .and(path_regex(format!("{base}/[0-9]+/snippet$")))
        .and(key())
        .and(FormFields(&["name", "type", "content", "priority", "dynamic"]))
        .respond_with(move |r: &Request| {
            let fields: std::collections::BTreeMap<_, _> = form(r).into_iter().collect();
            let mut state = s.lock().unwrap();
            match state.version(version_in(r)) {
                Some((_, false, snippets)) if fields["dynamic"] == "0" => {
                    snippets.push(json!({
                        "name": fields["name"], "type": fields["type"], "content": fields["content"],
                        "priority": fields["priority"], "dynamic": "0"
                    }));
                    ResponseTemplate::new(200).set_body_json(json!({"name": fields["name"]}))
                }
                _ => fastly_error(400, "Version is locked or missing"),
            }
        })
        .mount(&server)
        .await;
    let s = service.clone();
    Mock::given(method("PUT"))
        .and(path_regex(format!("{base}/[0-9]+/snippet/[^/]+$")))
        .and(key())
        .and(FormFields(&["type", "content", "priority"]))
        .respond_with(move |r: &Request| {
            let name = r.url.path().rsplit('/').next().unwrap().to_owned();
            let fields: std::collections::BTreeMap<_, _> = form(r).into_iter().collect();
            let mut state = s.lock().unwrap();
            let Some((_, false, snippets)) = state.version(version_in(r)) else {
                return fastly_error(400, "Version is locked or missing");
            };
            let Some(snippet) = snippets.iter_mut().find(|x| x["name"] == name.as_str()) else {
                return fastly_error(404, "Record not found");
            };
            for (k, v) in fields {
                snippet[k] = json!(v);
            }
            ResponseTemplate::new(200).set_body_json(snippet.clone())
        })
        .mount(&server)
        .await;
    let s = service.clone();
    Mock::given(method("DELETE"))
        .and(path_regex(format!("{base}/[0-9]+/snippet/[^/]+$")))
        .and(key())
        .respond_with(move |r: &Request| {
            let name = r.url.path().rsplit('/').next().unwrap().to_owned();
            let mut state = s.lock().unwrap();
            let Some((_, false, snippets)) = state.version(version_in(r)) else {
                return fastly_error(400, "Version is locked or missing");
            };
            let before = snippets.len();
            snippets.retain(|x| x["name"] != name.as_str());
            if snippets.len() == before {
                return fastly_error(404, "Record not found");
            }
            ResponseTemplate::new(200).set_body_json(json!({"status": "ok"}))
        })
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex(format!("{base}/[0-9]+/validate$")))
        .and(key())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "ok"})))
        .mount(&server)
        .await;
    let s = service.clone();
    Mock::given(method("PUT"))
        .and(path_regex(format!("{base}/[0-9]+/activate$")))
        .and(key())
        .respond_with(move |r: &Request| {
            let n = version_in(r);
            let mut state = s.lock().unwrap();
            if state.version(n).is_none() {
                return fastly_error(404, "Record not found");
            }
            for v in &mut state.versions {
                v.1 = v.0 == n;
            }
            ResponseTemplate::new(200).set_body_json(json!({"number": n, "active": true}))
        })
        .mount(&server)
        .await;
    server
}

// ---- Cloudflare: a zone's entry-point rulesets ----------------------------------------

#[derive(Debug, Default)]
struct Zone {
    /// `(phase, version, rules)`.
    rulesets: Vec<(String, u32, Vec<Value>)>,
}

impl Zone {
    /// A console edit: a rule added on the dashboard (Cloudflare gives it an id as its ref).
    fn console_rule(&mut self, phase: &str) {
        let rs = self.rulesets.iter_mut().find(|r| r.0 == phase).unwrap();
        rs.1 += 1;
        rs.2.push(json!({
            "id": "c0ffee", "ref": "c0ffee", "version": "1", "action": "set_cache_settings",
            "expression": "(http.host eq \"old.example.com\")", "description": "added on the console",
            "action_parameters": {"cache": false}, "enabled": true
        }));
    }
}

fn phase_in(r: &Request) -> String {
    r.url.path().split('/').nth(5).unwrap().to_owned()
}

fn envelope(status: u16, result: Value, errors: Value) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({
        "success": status < 300, "errors": errors, "messages": [], "result": result
    }))
}

/// A ruleset PUT: `{"description": string, "rules": [rule, ...]}`, every rule with its ref,
/// description, expression, action, action_parameters and enabled flag.
struct RulesetBody;

impl Match for RulesetBody {
    fn matches(&self, r: &Request) -> bool {
        let Ok(body) = serde_json::from_slice::<Value>(&r.body) else {
            return false;
        };
        let Some(rules) = body["rules"].as_array() else {
            return false;
        };
        r.headers
            .get("content-type")
            .is_some_and(|v| v == "application/json")
            && body["description"].is_string()
            && rules.iter().all(|rule| {
                ["ref", "description", "expression", "action"]
                    .iter()
                    .all(|k| rule[k].is_string())
                    && rule["action_parameters"].is_object()
                    && rule["enabled"].is_boolean()
            })
    }
}

async fn cloudflare(zone: &Arc<Mutex<Zone>>) -> MockServer {
    let server = MockServer::start().await;
    let route = format!("^/zones/{ZONE}/rulesets/phases/[a-z_]+/entrypoint$");
    let bearer = || header("Authorization", format!("Bearer {CLOUDFLARE_TOKEN}"));
    let answer = |phase: &str, version: u32, rules: &[Value]| {
        json!({"id": format!("rs-{phase}"), "kind": "zone", "phase": phase,
               "version": version.to_string(), "rules": rules})
    };
    let z = zone.clone();
    Mock::given(method("GET"))
        .and(path_regex(route.clone()))
        .and(bearer())
        .respond_with(move |r: &Request| {
            let phase = phase_in(r);
            let state = z.lock().unwrap();
            match state.rulesets.iter().find(|x| x.0 == phase) {
                Some((p, v, rules)) => envelope(200, answer(p, *v, rules), json!([])),
                None => envelope(
                    404,
                    Value::Null,
                    json!([{"code": 10003, "message": "could not find entrypoint ruleset"}]),
                ),
            }
        })
        .mount(&server)
        .await;
    let z = zone.clone();
    Mock::given(method("PUT"))
        .and(path_regex(route))
        .and(bearer())
        .and(RulesetBody)
        .respond_with(move |r: &Request| {
            let phase = phase_in(r);
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            let rules: Vec<Value> = body["rules"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .map(|(i, rule)| {
                    let mut rule = rule.clone();
                    rule["id"] = json!(format!("rule{i}"));
                    rule["version"] = json!("1");
                    rule
                })
                .collect();
            let mut state = z.lock().unwrap();
            let version = match state.rulesets.iter_mut().find(|x| x.0 == phase) {
                Some(rs) => {
                    rs.1 += 1;
                    rs.2 = rules.clone();
                    rs.1
                }
                None => {
                    state.rulesets.push((phase.clone(), 1, rules.clone()));
                    1
                }
            };
            envelope(200, answer(&phase, version, &rules), json!([]))
        })
        .mount(&server)
        .await;
    server
}

/// A Fastly service with one active, empty version and a zone without entry points.
fn stubs(rt: &Runtime) -> Stubs {
    let service = Arc::new(Mutex::new(Service {
        versions: vec![(1, true, Vec::new())],
    }));
    let zone = Arc::new(Mutex::new(Zone::default()));
    let (fastly, cloudflare) =
        rt.block_on(async { (fastly(&service).await, cloudflare(&zone).await) });
    Stubs {
        fastly,
        cloudflare,
        service,
        zone,
    }
}

/// The writes `plan` lists (`    METHOD /path  [body]` lines), as `METHOD /path`.
fn planned_writes(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|l| {
            ["PUT ", "POST ", "DELETE ", "GET "]
                .iter()
                .any(|m| l.starts_with(m))
        })
        .map(|l| l.split("  [").next().unwrap().to_owned())
        .collect()
}

#[test]
fn plan_shows_the_exact_calls_apply_sends_and_drift_then_finds_nothing() {
    let rt = Runtime::new().unwrap();
    let stubs = stubs(&rt);

    let plan = stubs.deploy(&["plan"]);
    let shown = text(&plan.stdout);
    assert_eq!(code(&plan), 0, "{shown}{}", text(&plan.stderr));
    let read = stubs.since(&rt, [0, 0]);
    assert!(read.iter().all(|c| is_read(c)), "plan wrote: {read:?}");
    let planned = planned_writes(&shown);
    let on = |api: &str| -> Vec<String> {
        planned
            .iter()
            .filter(|c| c.contains(api))
            .cloned()
            .collect()
    };
    let fastly = on("/service/");
    assert_eq!(fastly.len(), 8, "{shown}");
    assert_eq!(fastly[0], format!("PUT /service/{SID}/version/1/clone"));
    assert!(
        fastly[1..6]
            .iter()
            .all(|c| c == &format!("POST /service/{SID}/version/2/snippet")),
        "{shown}"
    );
    assert_eq!(
        fastly[6..],
        [
            format!("GET /service/{SID}/version/2/validate"),
            format!("PUT /service/{SID}/version/2/activate"),
        ]
    );
    assert!(
        shown.contains("form: name=multicdn-recv-routes, type=recv, priority=10"),
        "{shown}"
    );
    assert_eq!(
        on("/zones/"),
        [
            format!("PUT /zones/{ZONE}/rulesets/phases/http_request_cache_settings/entrypoint"),
            format!("PUT /zones/{ZONE}/rulesets/phases/http_response_headers_transform/entrypoint"),
        ]
    );
    assert!(
        shown.contains("rule(s) (multicdn-cache-defaults, "),
        "{shown}"
    );

    let before = stubs.mark(&rt);
    let apply = stubs.deploy(&["apply"]);
    assert_eq!(
        code(&apply),
        0,
        "{}{}",
        text(&apply.stdout),
        text(&apply.stderr)
    );
    assert!(text(&apply.stdout).contains("version 2 validated and activated (was 1)"));
    let sent: Vec<String> = stubs
        .since(&rt, before)
        .into_iter()
        .filter(|c| !is_read(c))
        .collect();
    assert_eq!(sent, planned, "apply sent other calls than the plan showed");

    let drift = stubs.deploy(&["drift"]);
    assert_eq!(
        code(&drift),
        0,
        "{}{}",
        text(&drift.stdout),
        text(&drift.stderr)
    );
    assert!(text(&drift.stdout).contains("no drift: every provider runs the policy's rendering"));
    let diff = stubs.deploy(&["diff", "--vendor", "cloudflare"]);
    assert_eq!(code(&diff), 0, "{}", text(&diff.stdout));
    assert!(text(&diff.stdout).contains("0 of 1 provider(s) would change"));
}

#[test]
fn a_console_edit_is_drift_and_apply_overwrites_it_only_with_force() {
    let rt = Runtime::new().unwrap();
    let stubs = stubs(&rt);
    assert_eq!(code(&stubs.deploy(&["apply"])), 0);
    stubs.service.lock().unwrap().console_edit(
        "multicdn-recv-routes",
        "return(pass)",
        "return(lookup)",
    );
    stubs
        .zone
        .lock()
        .unwrap()
        .console_rule("http_request_cache_settings");

    let drift = stubs.deploy(&["drift"]);
    assert_eq!(code(&drift), 1, "{}", text(&drift.stdout));
    assert!(
        text(&drift.stdout).contains("drift on 2 of 2 provider(s)"),
        "{}",
        text(&drift.stdout)
    );

    let before = stubs.mark(&rt);
    let refused = stubs.deploy(&["apply"]);
    let err = text(&refused.stderr);
    assert_eq!(code(&refused), 1, "{err}");
    assert!(
        err.contains("would overwrite 2 item(s) changed outside multicdn; nothing was sent"),
        "{err}"
    );
    assert!(
        err.contains("multicdn-recv-routes: edited since multicdn wrote it"),
        "{err}"
    );
    assert!(
        err.contains("http_request_cache_settings/c0ffee: added outside multicdn"),
        "{err}"
    );
    let after = stubs.since(&rt, before);
    assert!(
        after.iter().all(|c| is_read(c)),
        "refused apply wrote: {after:?}"
    );

    let forced = stubs.deploy(&["apply", "--force"]);
    assert_eq!(
        code(&forced),
        0,
        "{}{}",
        text(&forced.stdout),
        text(&forced.stderr)
    );
    assert_eq!(code(&stubs.deploy(&["drift"])), 0);
}

#[test]
fn an_unset_token_is_a_usage_error_named_by_its_variable() {
    let rt = Runtime::new().unwrap();
    let stubs = stubs(&rt);
    let out = Command::new(deploy_binary())
        .args(["plan", "--vendor", "fastly", "--policy"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/policy.yaml"))
        .args(["--fastly-endpoint", &stubs.fastly.uri()])
        .env_remove("FASTLY_API_TOKEN")
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    assert!(
        text(&out.stderr).contains("FASTLY_API_TOKEN (providers.fastly.token_env) is unset"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        rt.block_on(stubs.fastly.received_requests())
            .unwrap()
            .is_empty()
    );
}
