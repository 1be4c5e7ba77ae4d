//! Stateful stubs of the configuration APIs the deploy tool drives (wiremock on loopback): a
//! Fastly service's versions and snippets (clone, snippet writes on drafts only, validate,
//! activate) and a Cloudflare zone's entry-point rulesets. Every route checks method, path,
//! the auth header and the body's shape (Fastly's form fields, Cloudflare's ruleset JSON), and
//! answers as the vendor does otherwise, so `apply` then `drift` reads back what was written and
//! a console edit ([`Service::console_edit`], [`Zone::console_rule`]) is seen by the next run.

// Test stubs: a request the stub cannot read is a failed test, and failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use wiremock::matchers::{header, method, path_regex};
use wiremock::{Match, Mock, MockServer, Request, ResponseTemplate};

// ---- Fastly: a service with versions, each with its snippets -------------------------

/// A Fastly service: its versions, each with its snippets.
#[derive(Debug, Default)]
pub struct Service {
    /// `(number, active, snippets)`.
    pub versions: Vec<(u32, bool, Vec<Value>)>,
}

impl Service {
    fn version(&mut self, n: u32) -> Option<&mut (u32, bool, Vec<Value>)> {
        self.versions.iter_mut().find(|v| v.0 == n)
    }

    /// A console edit: clone the active version, change one snippet's VCL, activate.
    pub fn console_edit(&mut self, name: &str, from: &str, to: &str) {
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

/// A Fastly API holding `service` (service id `sid`), accepting `Fastly-Key: token`.
pub async fn fastly_config(service: &Arc<Mutex<Service>>, sid: &str, token: &str) -> MockServer {
    let server = MockServer::start().await;
    let base = format!("^/service/{sid}/version");
    let token = token.to_owned();
    let key = || header("Fastly-Key", token.as_str());
    let s = service.clone();
    let sid = sid.to_owned();
    Mock::given(method("GET"))
        .and(path_regex(format!("{base}$")))
        .and(key())
        .respond_with(move |_: &Request| {
            let list: Vec<Value> = s
                .lock()
                .unwrap()
                .versions
                .iter()
                .map(|(n, active, _)| json!({"number": n, "active": active, "service_id": sid}))
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

/// A Cloudflare zone: its entry-point rulesets.
#[derive(Debug, Default)]
pub struct Zone {
    /// `(phase, version, rules)`.
    pub rulesets: Vec<(String, u32, Vec<Value>)>,
}

impl Zone {
    /// A console edit: a rule added on the dashboard (Cloudflare gives it an id as its ref).
    pub fn console_rule(&mut self, phase: &str) {
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

/// A Cloudflare API holding `zone`'s rulesets (zone id `zone_id`), accepting
/// `Authorization: Bearer token`.
pub async fn cloudflare_rulesets(
    zone: &Arc<Mutex<Zone>>,
    zone_id: &str,
    token: &str,
) -> MockServer {
    let server = MockServer::start().await;
    let route = format!("^/zones/{zone_id}/rulesets/phases/[a-z_]+/entrypoint$");
    let bearer = || header("Authorization", format!("Bearer {token}"));
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
