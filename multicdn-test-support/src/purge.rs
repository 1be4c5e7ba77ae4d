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
//!
//! [`PurgeApi::start_limited`] also enforces the vendors' rate limits as token buckets
//! ([`PurgeLimits`]: Fastly's purge and non-read budgets, Cloudflare's plan and global
//! buckets) and answers 429 past them, with the wait in `Retry-After` (fractional seconds, to
//! keep tests fast; the clients read both).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use multicdn_core::Stopwatch;

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
    /// Never answer (an hour on tokio time): the client's timeout is what ends the request.
    Hang,
}

/// Sleeps an hour when `fault` is [`Fault::Hang`].
pub(crate) async fn hang(fault: Fault) {
    if fault == Fault::Hang {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

/// The rate limits [`PurgeApi::start_limited`] enforces: (tokens a second, bucket size).
#[derive(Debug, Clone, Copy)]
pub struct PurgeLimits {
    /// Fastly purges, one token per key or URL.
    pub fastly_purges: (f64, u32),
    /// Fastly non-read requests (`purge_all`).
    pub fastly_non_read: (f64, u32),
    /// Cloudflare's plan bucket, one token a request.
    pub cloudflare_purge: (f64, u32),
    /// Cloudflare's global limit, one token a request.
    pub cloudflare_global: (f64, u32),
}

impl PurgeLimits {
    /// Fastly's documented hourly caps and Cloudflare Pro.
    pub fn documented_pro() -> PurgeLimits {
        PurgeLimits {
            fastly_purges: (100_000.0 / 3600.0, 100_000),
            fastly_non_read: (1_000.0 / 3600.0, 1_000),
            cloudflare_purge: (5.0, 25),
            cloudflare_global: (4.0, 1_200),
        }
    }
}

/// A token bucket: full at the start, refilling `per_second` up to `capacity`.
#[derive(Debug, Clone)]
struct Bucket {
    per_second: f64,
    capacity: f64,
    tokens: f64,
    last: Duration,
}

impl Bucket {
    fn new((per_second, capacity): (f64, u32)) -> Bucket {
        Bucket {
            per_second,
            capacity: f64::from(capacity),
            tokens: f64::from(capacity),
            last: Duration::ZERO,
        }
    }

    /// Takes `cost` tokens at `now` if there are that many; otherwise the wait until there are.
    fn take(&mut self, now: Duration, cost: f64) -> Result<(), Duration> {
        let dt = now.saturating_sub(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.per_second).min(self.capacity);
        self.last = now;
        // A microsecond of float slack: a token refilled exactly on time counts.
        if self.tokens + 1e-6 >= cost {
            self.tokens = (self.tokens - cost).max(0.0);
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (cost - self.tokens) / self.per_second.max(1e-9),
            ))
        }
    }
}

#[derive(Debug)]
struct Buckets {
    started: Stopwatch,
    fastly_purges: Mutex<Bucket>,
    fastly_non_read: Mutex<Bucket>,
    cloudflare_purge: Mutex<Bucket>,
    cloudflare_global: Mutex<Bucket>,
}

impl Buckets {
    /// Takes `cost` from every bucket in `which`, or none: the longest wait otherwise.
    fn take(&self, which: &[&Mutex<Bucket>], cost: f64) -> Result<(), Duration> {
        let now = self.started.elapsed();
        let mut guards: Vec<_> = which
            .iter()
            .map(|b| b.lock().unwrap_or_else(PoisonError::into_inner))
            .collect();
        let mut wait = Duration::ZERO;
        for g in &mut guards {
            // Probe without spending: refill, then check.
            let mut probe = (**g).clone();
            if let Err(w) = probe.take(now, cost) {
                wait = wait.max(w);
            }
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        for g in &mut guards {
            let _ = g.take(now, cost);
        }
        Ok(())
    }
}

/// Requests answered, per vendor and outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeStats {
    /// Fastly purges acknowledged.
    pub fastly_ok: u64,
    /// Fastly 429s.
    pub fastly_429: u64,
    /// Fastly keys and URLs purged.
    pub fastly_items: u64,
    /// Cloudflare purges acknowledged.
    pub cloudflare_ok: u64,
    /// Cloudflare 429s.
    pub cloudflare_429: u64,
    /// Cloudflare items purged.
    pub cloudflare_items: u64,
}

#[derive(Debug, Default)]
struct PurgeState {
    faults: Mutex<BTreeMap<&'static str, Fault>>,
    purged: Mutex<Vec<(String, Vec<String>)>>,
    refused: Mutex<Vec<(String, String)>>,
    ids: AtomicU64,
    limits: Option<Buckets>,
    stats: Mutex<PurgeStats>,
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
        PurgeApi::serve(PurgeState::default()).await
    }

    /// Starts both vendors' endpoints enforcing `limits` (429 past them).
    pub async fn start_limited(limits: PurgeLimits) -> std::io::Result<PurgeApi> {
        PurgeApi::serve(PurgeState {
            limits: Some(Buckets {
                started: Stopwatch::start(),
                fastly_purges: Mutex::new(Bucket::new(limits.fastly_purges)),
                fastly_non_read: Mutex::new(Bucket::new(limits.fastly_non_read)),
                cloudflare_purge: Mutex::new(Bucket::new(limits.cloudflare_purge)),
                cloudflare_global: Mutex::new(Bucket::new(limits.cloudflare_global)),
            }),
            ..PurgeState::default()
        })
        .await
    }

    async fn serve(state: PurgeState) -> std::io::Result<PurgeApi> {
        let state = Arc::new(state);
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

    /// Requests answered so far, per vendor and outcome.
    pub fn stats(&self) -> PurgeStats {
        *self
            .state
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// 429s answered, both vendors.
    pub fn too_many(&self) -> u64 {
        let s = self.stats();
        s.fastly_429 + s.cloudflare_429
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
        {
            let mut st = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
            let n = items.len() as u64;
            if vendor == "fastly" {
                st.fastly_items += n;
            } else {
                st.cloudflare_items += n;
            }
        }
        self.purged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((vendor.to_owned(), items));
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{}-1455557446-{n}", 108_340 + n)
    }

    /// One acknowledged request.
    fn acknowledged(&self, vendor: &str) {
        let mut st = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        if vendor == "fastly" {
            st.fastly_ok += 1;
        } else {
            st.cloudflare_ok += 1;
        }
    }

    /// Spends `cost` from `vendor`'s buckets for a request of kind `all` (purge everything),
    /// or answers the 429.
    fn limited(&self, vendor: &str, all: bool, cost: f64) -> Option<Response> {
        let b = self.limits.as_ref()?;
        let which: Vec<&Mutex<Bucket>> = match (vendor, all) {
            ("fastly", true) => vec![&b.fastly_non_read],
            ("fastly", false) => vec![&b.fastly_purges],
            _ => vec![&b.cloudflare_global, &b.cloudflare_purge],
        };
        let wait = b.take(&which, cost).err()?;
        let retry = format!("{:.3}", wait.as_secs_f64());
        let mut st = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        let body = if vendor == "fastly" {
            st.fastly_429 += 1;
            json!({"msg": "Too many requests", "detail": "rate limit"})
        } else {
            st.cloudflare_429 += 1;
            json!({"success": false, "errors": [{"code": 971, "message": "Please wait and consider throttling your request speed"}], "messages": [], "result": null})
        };
        Some(
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", retry)],
                axum::Json(body),
            )
                .into_response(),
        )
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
        Fault::None | Fault::RefuseTokens | Fault::Hang => None,
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
    hang(s.fault("fastly")).await;
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
    if let Some(r) = s.limited("fastly", false, keys.len() as f64) {
        return r;
    }
    s.acknowledged("fastly");
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
    hang(s.fault("fastly")).await;
    if let Some(refusal) = s.fastly_gate(&headers) {
        return refusal;
    }
    if let Some(r) = s.limited("fastly", false, 1.0) {
        return r;
    }
    s.acknowledged("fastly");
    let id = s.record("fastly", vec![key]);
    axum::Json(json!({"status": "ok", "id": id})).into_response()
}

async fn fastly_url(State(s): State<Arc<PurgeState>>, Path(url): Path<String>) -> Response {
    hang(s.fault("fastly")).await;
    if let Some(fault) = injected(s.fault("fastly"), || {
        fastly_error(StatusCode::SERVICE_UNAVAILABLE, "Service unavailable", "")
    }) {
        return fault;
    }
    if url.starts_with("http:") || url.starts_with("https:") || !url.contains('/') {
        return s.fastly_bad("the path is /purge/{host}/{path}, without a scheme");
    }
    if let Some(r) = s.limited("fastly", false, 1.0) {
        return r;
    }
    s.acknowledged("fastly");
    let id = s.record("fastly", vec![url]);
    axum::Json(json!({"status": "ok", "id": id})).into_response()
}

async fn fastly_all(State(s): State<Arc<PurgeState>>, headers: HeaderMap) -> Response {
    hang(s.fault("fastly")).await;
    if let Some(refusal) = s.fastly_gate(&headers) {
        return refusal;
    }
    if soft(&headers) {
        return s.fastly_bad("purge_all cannot be soft");
    }
    if let Some(r) = s.limited("fastly", true, 1.0) {
        return r;
    }
    s.acknowledged("fastly");
    s.record("fastly", vec!["*".into()]);
    axum::Json(json!({"status": "ok"})).into_response()
}

const CLOUDFLARE_KINDS: [&str; 5] = ["files", "tags", "hosts", "prefixes", "purge_everything"];

async fn cloudflare_purge(
    State(s): State<Arc<PurgeState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    hang(s.fault("cloudflare")).await;
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
        s.malformed("cloudflare", "at most 100 items a request");
        return cloudflare_error(StatusCode::BAD_REQUEST, 1134, "at most 100 items a request");
    }
    if let Some(r) = s.limited("cloudflare", false, 1.0) {
        return r;
    }
    s.acknowledged("cloudflare");
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

    #[tokio::test]
    async fn a_hang_is_ended_only_by_the_clients_timeout() {
        let api = PurgeApi::start().await.unwrap();
        api.set_fault("cloudflare", Fault::Hang);
        let sent = reqwest::Client::new()
            .post(format!("{}/zones/Z/purge_cache", api.cloudflare_base()))
            .header("authorization", "Bearer t")
            .body(r#"{"tags":["a"]}"#)
            .timeout(std::time::Duration::from_millis(200))
            .send()
            .await;
        assert!(sent.is_err_and(|e| e.is_timeout()));
        assert!(api.purged().is_empty());
    }
}
