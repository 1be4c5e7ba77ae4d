//! Fastly's and Cloudflare's purge APIs, as their contracts say (`API-CONTRACTS.md`):
//!
//! | vendor | route | checked |
//! |---|---|---|
//! | Fastly | `POST /service/{sid}/purge` | `Fastly-Key`; keys from `Surrogate-Key` (space separated) or a JSON body `{"surrogate_keys": [...]}`, 1 to 256 of them |
//! | Fastly | `POST /service/{sid}/purge/{key}` | `Fastly-Key` |
//! | Fastly | `POST /service/{sid}/purge_all` | `Fastly-Key`; never soft |
//! | Fastly | `POST /purge/{host}/{path}` | no scheme in the path |
//! | Cloudflare | `POST /zones/{zone}/purge_cache` | `Authorization: Bearer`; a JSON object with exactly one of `files`, `tags`, `hosts`, `prefixes`, `purge_everything`; at most 100 items |
//!
//! Any other method on these paths is a 405, any other path a 404. Fastly's errors are
//! `{"msg": ..., "detail": ...}`; Cloudflare's are its envelope with `success: false` and
//! `errors: [{code, message}]`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::serve::serve;

/// Most surrogate keys one Fastly batch purge takes.
pub const FASTLY_MAX_KEYS: usize = 256;
/// Most items one Cloudflare purge takes (below Enterprise).
pub const CLOUDFLARE_MAX_ITEMS: usize = 100;

/// A failure to inject into a vendor's next answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer normally.
    None,
    /// Refuse every token (an expired or revoked token): 401 with the vendor's error.
    RefuseTokens,
    /// Answer 503 (the vendor's API is down).
    Unavailable,
    /// Answer 429 with `Retry-After: 1`.
    RateLimited,
}

#[derive(Debug, Default)]
struct PurgeState {
    faults: Mutex<BTreeMap<&'static str, Fault>>,
    purged: Mutex<Vec<(String, Vec<String>)>>,
    refused: Mutex<Vec<(String, String)>>,
    ids: AtomicU64,
}

/// Emulated Fastly and Cloudflare purge APIs on 127.0.0.1.
#[derive(Debug)]
pub struct PurgeApi {
    addr: SocketAddr,
    state: Arc<PurgeState>,
    _stop: oneshot::Sender<()>,
}

impl PurgeApi {
    /// Starts both vendors' purge endpoints on one port: Fastly at `/fastly`, Cloudflare at
    /// `/cloudflare/client/v4`.
    pub async fn start() -> std::io::Result<PurgeApi> {
        let state = Arc::new(PurgeState::default());
        let app = Router::new()
            .route("/fastly/service/{sid}/purge", post(fastly_batch))
            .route("/fastly/service/{sid}/purge/{key}", post(fastly_key))
            .route("/fastly/service/{sid}/purge_all", post(fastly_all))
            .route("/fastly/purge/{*url}", post(fastly_url))
            .route(
                "/cloudflare/client/v4/zones/{zone}/purge_cache",
                post(cloudflare_purge),
            )
            .with_state(state.clone());
        let (addr, stop) = serve(app).await?;
        Ok(PurgeApi {
            addr,
            state,
            _stop: stop,
        })
    }

    /// Base URL for the Fastly adapter.
    pub fn fastly_base(&self) -> String {
        format!("http://{}/fastly", self.addr)
    }

    /// Base URL for the Cloudflare adapter.
    pub fn cloudflare_base(&self) -> String {
        format!("http://{}/cloudflare/client/v4", self.addr)
    }

    /// Injects `fault` into every answer of `vendor` (`fastly`, `cloudflare`) until changed.
    pub fn set_fault(&self, vendor: &'static str, fault: Fault) {
        self.state
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(vendor, fault);
    }

    /// Makes `vendor`'s API refuse every token (an expired token), or accept them again.
    pub fn refuse_tokens(&self, vendor: &'static str, refuse: bool) {
        let fault = if refuse {
            Fault::RefuseTokens
        } else {
            Fault::None
        };
        self.set_fault(vendor, fault);
    }

    /// Every purge acknowledged: (vendor, items).
    pub fn purged(&self) -> Vec<(String, Vec<String>)> {
        self.state
            .purged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every request answered 400: (vendor, why).
    pub fn malformed(&self) -> Vec<(String, String)> {
        self.state
            .refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl PurgeState {
    fn fault(&self, vendor: &str) -> Fault {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(vendor)
            .copied()
            .unwrap_or(Fault::None)
    }

    fn record(&self, vendor: &str, items: Vec<String>) -> String {
        self.purged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((vendor.to_owned(), items));
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{}-1455557446-{n}", 108_340 + n)
    }

    fn malformed(&self, vendor: &str, why: &str) {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((vendor.to_owned(), why.to_owned()));
    }

    /// The fastly checks every route shares: the injected fault, then the token.
    fn fastly_gate(&self, headers: &HeaderMap) -> Option<Response> {
        let fault = self.fault("fastly");
        let token = headers
            .get("fastly-key")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| !v.trim().is_empty());
        if fault == Fault::RefuseTokens || !token {
            return Some(fastly_error(
                StatusCode::UNAUTHORIZED,
                "Provided credentials are missing or invalid",
                "",
            ));
        }
        injected(fault, || {
            fastly_error(StatusCode::SERVICE_UNAVAILABLE, "Service unavailable", "")
        })
    }

    fn fastly_bad(&self, why: &str) -> Response {
        self.malformed("fastly", why);
        fastly_error(StatusCode::BAD_REQUEST, "Bad request", why)
    }

    fn cloudflare_gate(&self, headers: &HeaderMap) -> Option<Response> {
        let fault = self.fault("cloudflare");
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| !t.trim().is_empty());
        if fault == Fault::RefuseTokens || !bearer {
            return Some(cloudflare_error(
                StatusCode::UNAUTHORIZED,
                10000,
                "Authentication error",
            ));
        }
        injected(fault, || {
            cloudflare_error(
                StatusCode::SERVICE_UNAVAILABLE,
                10001,
                "service unavailable",
            )
        })
    }
}

fn injected(fault: Fault, unavailable: impl FnOnce() -> Response) -> Option<Response> {
    match fault {
        Fault::Unavailable => Some(unavailable()),
        Fault::RateLimited => Some(
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "1")],
                "rate limited",
            )
                .into_response(),
        ),
        Fault::None | Fault::RefuseTokens => None,
    }
}

fn fastly_error(status: StatusCode, msg: &str, detail: &str) -> Response {
    (status, axum::Json(json!({"msg": msg, "detail": detail}))).into_response()
}

fn cloudflare_error(status: StatusCode, code: u32, message: &str) -> Response {
    (
        status,
        axum::Json(json!({
            "success": false,
            "errors": [{"code": code, "message": message}],
            "messages": [],
            "result": null
        })),
    )
        .into_response()
}

fn soft(headers: &HeaderMap) -> bool {
    headers
        .get("fastly-soft-purge")
        .is_some_and(|v| v.as_bytes() == b"1")
}

async fn fastly_batch(
    State(s): State<Arc<PurgeState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = s.fastly_gate(&headers) {
        return refusal;
    }
    let mut keys: Vec<String> = headers
        .get("surrogate-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    if !body.is_empty() {
        let parsed: Result<Value, _> = serde_json::from_slice(&body);
        let Some(list) = parsed
            .ok()
            .and_then(|v| v.get("surrogate_keys").cloned())
            .and_then(|v| v.as_array().cloned())
        else {
            return s.fastly_bad("the body must be {\"surrogate_keys\": [...]}");
        };
        for k in list {
            match k.as_str() {
                Some(k) if !k.is_empty() && !k.contains(char::is_whitespace) => {
                    keys.push(k.to_owned());
                }
                _ => return s.fastly_bad("every surrogate key must be a non-empty string"),
            }
        }
    }
    if keys.is_empty() {
        return s.fastly_bad("no surrogate keys given");
    }
    if keys.len() > FASTLY_MAX_KEYS {
        return s.fastly_bad("at most 256 surrogate keys a request");
    }
    let mut out = serde_json::Map::new();
    for k in &keys {
        out.insert(
            k.clone(),
            Value::String(s.record("fastly", vec![k.clone()])),
        );
    }
    axum::Json(Value::Object(out)).into_response()
}

async fn fastly_key(
    State(s): State<Arc<PurgeState>>,
    Path((_sid, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(refusal) = s.fastly_gate(&headers) {
        return refusal;
    }
    let id = s.record("fastly", vec![key]);
    axum::Json(json!({"status": "ok", "id": id})).into_response()
}

async fn fastly_url(State(s): State<Arc<PurgeState>>, Path(url): Path<String>) -> Response {
    if let Some(fault) = injected(s.fault("fastly"), || {
        fastly_error(StatusCode::SERVICE_UNAVAILABLE, "Service unavailable", "")
    }) {
        return fault;
    }
    if url.starts_with("http:") || url.starts_with("https:") || !url.contains('/') {
        return s.fastly_bad("the path is /purge/{host}/{path}, without a scheme");
    }
    let id = s.record("fastly", vec![url]);
    axum::Json(json!({"status": "ok", "id": id})).into_response()
}

async fn fastly_all(State(s): State<Arc<PurgeState>>, headers: HeaderMap) -> Response {
    if let Some(refusal) = s.fastly_gate(&headers) {
        return refusal;
    }
    if soft(&headers) {
        return s.fastly_bad("purge_all cannot be soft");
    }
    s.record("fastly", vec!["*".into()]);
    axum::Json(json!({"status": "ok"})).into_response()
}

const CLOUDFLARE_KINDS: [&str; 5] = ["files", "tags", "hosts", "prefixes", "purge_everything"];

async fn cloudflare_purge(
    State(s): State<Arc<PurgeState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refusal) = s.cloudflare_gate(&headers) {
        return refusal;
    }
    let bad = |why: &str| {
        s.malformed("cloudflare", why);
        cloudflare_error(StatusCode::BAD_REQUEST, 1012, why)
    };
    let Ok(Value::Object(json)) = serde_json::from_slice::<Value>(&body) else {
        return bad("the body must be a JSON object");
    };
    let kinds: Vec<&str> = CLOUDFLARE_KINDS
        .into_iter()
        .filter(|k| json.contains_key(*k))
        .collect();
    if kinds.len() != 1 || json.len() != 1 {
        return bad(
            "Request must contain exactly one of \"purge_everything\", \"files\", \"tags\", \"hosts\" or \"prefixes\"",
        );
    }
    let items: Vec<String> = match json.get("purge_everything") {
        Some(Value::Bool(true)) => vec!["*".to_owned()],
        Some(_) => return bad("purge_everything must be true"),
        None => {
            let Some(list) = json.values().next().and_then(Value::as_array) else {
                return bad("the items must be an array");
            };
            let mut items = Vec::with_capacity(list.len());
            for v in list {
                match v {
                    Value::String(t) if !t.is_empty() => items.push(t.clone()),
                    // A file may be {"url": ..., "headers": {...}}.
                    Value::Object(o) if o.get("url").is_some_and(Value::is_string) => {
                        items.push(v.to_string());
                    }
                    _ => return bad("every item must be a non-empty string"),
                }
            }
            items
        }
    };
    if items.is_empty() {
        return bad("no items given");
    }
    if items.len() > CLOUDFLARE_MAX_ITEMS {
        return bad("at most 100 items a request");
    }
    let id = s.record("cloudflare", items);
    axum::Json(json!({
        "success": true, "errors": [], "messages": [], "result": {"id": id}
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    async fn post(url: String, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
        let mut r = reqwest::Client::new().post(url).body(body.to_owned());
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let a = r.send().await.unwrap();
        let status = a.status().as_u16();
        (status, a.json().await.unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn fastly_checks_the_token_and_the_body_shape_and_limit() {
        let api = PurgeApi::start().await.unwrap();
        let url = format!("{}/service/SVC/purge", api.fastly_base());
        let key = [("fastly-key", "t")];
        let (s, _) = post(url.clone(), &[], r#"{"surrogate_keys":["a"]}"#).await;
        assert_eq!(s, 401);
        let (s, v) = post(url.clone(), &key, r#"{"keys":["a"]}"#).await;
        assert_eq!((s, v["msg"].as_str()), (400, Some("Bad request")));
        let many: Vec<String> = (0..257).map(|i| format!("k{i}")).collect();
        let body = json!({ "surrogate_keys": many }).to_string();
        assert_eq!(post(url.clone(), &key, &body).await.0, 400);
        let (s, v) = post(url.clone(), &key, r#"{"surrogate_keys":["a","b"]}"#).await;
        assert_eq!(s, 200);
        assert!(v["a"].is_string() && v["b"].is_string(), "{v}");
        api.set_fault("fastly", Fault::Unavailable);
        assert_eq!(post(url, &key, r#"{"surrogate_keys":["a"]}"#).await.0, 503);
        assert_eq!(api.purged().len(), 2);
        assert_eq!(api.malformed().len(), 2);
    }

    #[tokio::test]
    async fn cloudflare_takes_exactly_one_kind_with_a_bearer_token() {
        let api = PurgeApi::start().await.unwrap();
        let url = format!("{}/zones/Z/purge_cache", api.cloudflare_base());
        let auth = [("authorization", "Bearer t")];
        let (s, v) = post(url.clone(), &[("x-auth-key", "t")], r#"{"tags":["a"]}"#).await;
        assert_eq!((s, v["errors"][0]["code"].as_u64()), (401, Some(10000)));
        let (s, v) = post(url.clone(), &auth, r#"{"tags":["a"],"hosts":["h"]}"#).await;
        assert_eq!((s, v["success"].as_bool()), (400, Some(false)));
        let many: Vec<String> = (0..101).map(|i| format!("t{i}")).collect();
        let body = json!({ "tags": many }).to_string();
        assert_eq!(post(url.clone(), &auth, &body).await.0, 400);
        let (s, v) = post(url.clone(), &auth, r#"{"purge_everything":true}"#).await;
        assert_eq!((s, v["success"].as_bool()), (200, Some(true)));
        api.refuse_tokens("cloudflare", true);
        assert_eq!(post(url, &auth, r#"{"tags":["a"]}"#).await.0, 401);
        assert_eq!(
            api.purged(),
            [("cloudflare".to_owned(), vec!["*".to_owned()])]
        );
    }
}
