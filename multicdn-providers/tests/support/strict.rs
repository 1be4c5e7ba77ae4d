//! Matchers that accept a purge only as the vendor would: method, path, auth header and body
//! shape and limits (`API-CONTRACTS.md`). A mock mounted with one of them does not answer a
//! malformed request, so the test sees wiremock's 404 instead of the success it scripted.

use serde_json::Value;
use wiremock::{Match, Request};

use super::vendors::{CLOUDFLARE_TOKEN, FASTLY_TOKEN, SERVICE, ZONE};

fn header<'r>(request: &'r Request, name: &str) -> Option<&'r str> {
    request.headers.get(name).and_then(|v| v.to_str().ok())
}

/// A Fastly purge: `POST` with `Fastly-Key`, to `/service/{SERVICE}/purge` with 1 to 256
/// surrogate keys (JSON body or `Surrogate-Key`), `/service/{SERVICE}/purge/{key}`,
/// `/service/{SERVICE}/purge_all` (never soft), or `/purge/{host}/{path}` (no scheme).
pub struct FastlyPurge;

impl Match for FastlyPurge {
    fn matches(&self, request: &Request) -> bool {
        if request.method.as_str() != "POST" || header(request, "fastly-key") != Some(FASTLY_TOKEN)
        {
            return false;
        }
        let path = request.url.path();
        let service = format!("/service/{SERVICE}");
        if path == format!("{service}/purge") {
            let from_header = header(request, "surrogate-key")
                .map(|v| v.split_whitespace().count())
                .unwrap_or(0);
            let from_body = serde_json::from_slice::<Value>(&request.body)
                .ok()
                .and_then(|v| {
                    v.get("surrogate_keys")?.as_array().map(|a| {
                        a.iter()
                            .all(|k| k.as_str().is_some_and(|k| !k.is_empty()))
                            .then_some(a.len())
                    })
                })
                .flatten();
            let keys = from_header + from_body.unwrap_or(0);
            let body_ok = request.body.is_empty() || from_body.is_some();
            return body_ok && (1..=256).contains(&keys);
        }
        if path == format!("{service}/purge_all") {
            return header(request, "fastly-soft-purge").is_none();
        }
        if let Some(key) = path.strip_prefix(&format!("{service}/purge/")) {
            return !key.is_empty() && !key.contains('/');
        }
        path.strip_prefix("/purge/")
            .is_some_and(|rest| rest.contains('/') && !rest.starts_with("http"))
    }
}

/// A Cloudflare purge: `POST /zones/{ZONE}/purge_cache` with `Authorization: Bearer` and a
/// JSON body holding exactly one of `files` (1 to 500 URLs: Enterprise's limit, 100 below it),
/// `tags`, `hosts`, `prefixes` (1 to 100 items) or `purge_everything: true`.
pub struct CloudflarePurge;

impl Match for CloudflarePurge {
    fn matches(&self, request: &Request) -> bool {
        if request.method.as_str() != "POST"
            || request.url.path() != format!("/zones/{ZONE}/purge_cache")
            || header(request, "authorization") != Some(&format!("Bearer {CLOUDFLARE_TOKEN}"))
        {
            return false;
        }
        let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&request.body) else {
            return false;
        };
        if body.len() != 1 {
            return false;
        }
        match body.iter().next() {
            Some((k, Value::Bool(true))) => k == "purge_everything",
            Some((k, Value::Array(items))) => {
                ["files", "tags", "hosts", "prefixes"].contains(&k.as_str())
                    && (1..=if k == "files" { 500 } else { 100 }).contains(&items.len())
                    && items.iter().all(|i| match i {
                        Value::String(s) => !s.is_empty(),
                        Value::Object(o) => o.get("url").is_some_and(Value::is_string),
                        _ => false,
                    })
            }
            _ => false,
        }
    }
}
