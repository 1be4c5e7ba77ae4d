//! A loopback server that answers Fastly and Cloudflare purges as documented and enforces
//! their limits as token buckets, answering 429 past them (with `Fastly-RateLimit-Reset` or
//! `Retry-After`). It counts requests, purged items and 429s.
//!
//! Fastly lives under `/fastly`, Cloudflare under `/cloudflare`.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use multicdn_core::Stopwatch;
use serde_json::{Value, json};

/// A token bucket: `capacity` tokens, refilling `per_second`, full at the start.
#[derive(Debug)]
pub struct Bucket {
    per_second: f64,
    capacity: f64,
    tokens: f64,
    last: Duration,
}

impl Bucket {
    /// A full bucket.
    pub fn new(per_second: f64, capacity: u32) -> Bucket {
        Bucket {
            per_second,
            capacity: f64::from(capacity),
            tokens: f64::from(capacity),
            last: Duration::ZERO,
        }
    }

    /// Takes `cost` tokens at `now` if there are that many; otherwise the wait until there are.
    pub fn take(&mut self, now: Duration, cost: f64) -> Result<(), Duration> {
        let dt = now.saturating_sub(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.per_second).min(self.capacity);
        self.last = now;
        // A microsecond of float slack: a token refilled exactly on time counts.
        if self.tokens + 1e-6 >= cost {
            self.tokens = (self.tokens - cost).max(0.0);
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (cost - self.tokens) / self.per_second,
            ))
        }
    }
}

/// The limits the server enforces.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Fastly purges (per key / URL): (per second, bucket).
    pub fastly_purges: (f64, u32),
    /// Fastly non-read requests (purge_all).
    pub fastly_non_read: (f64, u32),
    /// Cloudflare's plan bucket, per request.
    pub cloudflare_purge: (f64, u32),
    /// Cloudflare's global limit, per request.
    pub cloudflare_global: (f64, u32),
}

impl ServerLimits {
    /// Fastly's documented hourly caps and Cloudflare Pro.
    pub fn documented_pro() -> ServerLimits {
        ServerLimits {
            fastly_purges: (100_000.0 / 3600.0, 100_000),
            fastly_non_read: (1_000.0 / 3600.0, 1_000),
            cloudflare_purge: (5.0, 25),
            cloudflare_global: (4.0, 1_200),
        }
    }
}

/// Counters.
#[derive(Debug, Default)]
pub struct Stats {
    /// Fastly requests answered 200.
    pub fastly_ok: AtomicU64,
    /// Fastly 429s.
    pub fastly_429: AtomicU64,
    /// Fastly keys and URLs purged.
    pub fastly_items: AtomicU64,
    /// Cloudflare requests answered 200.
    pub cloudflare_ok: AtomicU64,
    /// Cloudflare 429s.
    pub cloudflare_429: AtomicU64,
    /// Cloudflare items purged.
    pub cloudflare_items: AtomicU64,
}

struct Shared {
    clock: Stopwatch,
    stats: Arc<Stats>,
    fastly_purges: Mutex<Bucket>,
    fastly_non_read: Mutex<Bucket>,
    cloudflare_purge: Mutex<Bucket>,
    cloudflare_global: Mutex<Bucket>,
}

/// A running server.
pub struct LimitedServer {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    /// Its counters.
    pub stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LimitedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LimitedServer {
    /// Starts a server on an ephemeral loopback port.
    pub async fn start(limits: ServerLimits) -> LimitedServer {
        let stats = Arc::new(Stats::default());
        let b = |(r, c): (f64, u32)| Mutex::new(Bucket::new(r, c));
        let shared = Arc::new(Shared {
            clock: Stopwatch::start(),
            stats: stats.clone(),
            fastly_purges: b(limits.fastly_purges),
            fastly_non_read: b(limits.fastly_non_read),
            cloudflare_purge: b(limits.cloudflare_purge),
            cloudflare_global: b(limits.cloudflare_global),
        });
        let app = Router::new()
            .route("/fastly/service/{sid}/purge", post(fastly_batch))
            .route("/fastly/service/{sid}/purge/{key}", post(fastly_key))
            .route("/fastly/service/{sid}/purge_all", post(fastly_all))
            .route(
                "/cloudflare/zones/{zone}/purge_cache",
                post(cloudflare_purge),
            )
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        LimitedServer { addr, stats, task }
    }

    /// Fastly's base URL.
    pub fn fastly_base(&self) -> String {
        format!("http://{}/fastly", self.addr)
    }

    /// Cloudflare's base URL.
    pub fn cloudflare_base(&self) -> String {
        format!("http://{}/cloudflare", self.addr)
    }

    /// 429s answered, both vendors.
    pub fn too_many(&self) -> u64 {
        self.stats.fastly_429.load(Ordering::SeqCst)
            + self.stats.cloudflare_429.load(Ordering::SeqCst)
    }
}

/// The wait as `Retry-After` seconds, fractional (real vendors send whole seconds; the
/// client reads both).
fn retry_after(wait: Duration) -> String {
    format!("{:.3}", wait.as_secs_f64())
}

fn fastly_authorised(headers: &HeaderMap) -> bool {
    headers.get("fastly-key").is_some_and(|v| !v.is_empty())
}

fn fastly_limited(s: &Shared, bucket: &Mutex<Bucket>, cost: f64) -> Option<Response> {
    let now = s.clock.elapsed();
    match bucket.lock().unwrap().take(now, cost) {
        Ok(()) => None,
        Err(wait) => {
            s.stats.fastly_429.fetch_add(1, Ordering::SeqCst);
            // Fastly-RateLimit-Reset is epoch seconds; this server's epoch is its start, so it
            // sends the wait as Retry-After instead (fractional, to keep tests fast).
            Some(
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", retry_after(wait))],
                    Json(json!({"msg": "Too many requests", "detail": "rate limit"})),
                )
                    .into_response(),
            )
        }
    }
}

async fn fastly_batch(
    State(s): State<Arc<Shared>>,
    Path(_sid): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if !fastly_authorised(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"msg": "Provided credentials are missing or invalid"})),
        )
            .into_response();
    }
    let keys: Vec<String> = body["surrogate_keys"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if keys.is_empty() || keys.len() > 256 {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"msg": "between 1 and 256 keys"})),
        )
            .into_response();
    }
    if let Some(r) = fastly_limited(&s, &s.fastly_purges, keys.len() as f64) {
        return r;
    }
    s.stats.fastly_ok.fetch_add(1, Ordering::SeqCst);
    s.stats
        .fastly_items
        .fetch_add(keys.len() as u64, Ordering::SeqCst);
    let map: serde_json::Map<String, Value> = keys
        .into_iter()
        .enumerate()
        .map(|(i, k)| (k, json!(format!("108340-1455557446-{i}"))))
        .collect();
    Json(Value::Object(map)).into_response()
}

async fn fastly_key(
    State(s): State<Arc<Shared>>,
    Path((_sid, _key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !fastly_authorised(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"msg": "Provided credentials are missing or invalid"})),
        )
            .into_response();
    }
    if let Some(r) = fastly_limited(&s, &s.fastly_purges, 1.0) {
        return r;
    }
    s.stats.fastly_ok.fetch_add(1, Ordering::SeqCst);
    s.stats.fastly_items.fetch_add(1, Ordering::SeqCst);
    Json(json!({"status": "ok", "id": "108340-1455557446-0"})).into_response()
}

async fn fastly_all(
    State(s): State<Arc<Shared>>,
    Path(_sid): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !fastly_authorised(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"msg": "Provided credentials are missing or invalid"})),
        )
            .into_response();
    }
    if let Some(r) = fastly_limited(&s, &s.fastly_non_read, 1.0) {
        return r;
    }
    s.stats.fastly_ok.fetch_add(1, Ordering::SeqCst);
    Json(json!({"status": "ok"})).into_response()
}

fn envelope_error(status: StatusCode, code: u32, message: &str) -> Response {
    (
        status,
        Json(json!({"success": false, "errors": [{"code": code, "message": message}], "messages": [], "result": null})),
    )
        .into_response()
}

async fn cloudflare_purge(
    State(s): State<Arc<Shared>>,
    Path(_zone): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if !headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer ") && v.len() > 7)
    {
        return envelope_error(StatusCode::UNAUTHORIZED, 10000, "Authentication error");
    }
    let now = s.clock.elapsed();
    let limited = s
        .cloudflare_global
        .lock()
        .unwrap()
        .take(now, 1.0)
        .and_then(|()| s.cloudflare_purge.lock().unwrap().take(now, 1.0));
    if let Err(wait) = limited {
        s.stats.cloudflare_429.fetch_add(1, Ordering::SeqCst);
        let mut r = envelope_error(
            StatusCode::TOO_MANY_REQUESTS,
            971,
            "Please wait and consider throttling your request speed",
        );
        if let Ok(v) = retry_after(wait).parse() {
            r.headers_mut().insert("retry-after", v);
        }
        return r;
    }
    let items = ["files", "tags", "hosts", "prefixes"]
        .iter()
        .find_map(|k| body[*k].as_array().map(Vec::len));
    let everything = body["purge_everything"] == json!(true);
    match items {
        Some(n) if n > 100 => {
            return envelope_error(StatusCode::BAD_REQUEST, 1134, "at most 100 items a request");
        }
        None if !everything => {
            return envelope_error(
                StatusCode::OK,
                1012,
                "Request must contain one of purge_everything, files, tags, hosts or prefixes",
            );
        }
        _ => {}
    }
    s.stats.cloudflare_ok.fetch_add(1, Ordering::SeqCst);
    s.stats
        .cloudflare_items
        .fetch_add(items.unwrap_or(0) as u64, Ordering::SeqCst);
    Json(json!({"success": true, "errors": [], "messages": [], "result": {"id": "9a7806061c88ada191ed06f989cc3dac"}})).into_response()
}
