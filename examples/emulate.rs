//! Emulated CDN edges and vendor purge APIs on loopback, so the quickstart and the tools run on
//! one machine with no account and no credentials.
//!
//! An [`EdgeServer`] answers like a CDN edge fronting the site: a health object, HTML pages,
//! the identity header (`Server-Timing: cdn;desc=..., pop;desc=..., cache;desc=...`) and cache
//! tags. Its behaviour can be switched at run time ([`EdgeMode`]) to play an incident: a 503,
//! or a 200 whose body is an error page. A [`PurgeApi`] answers Fastly's and Cloudflare's purge
//! endpoints as documented, and can be told to refuse a provider's token.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// How an emulated edge behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeMode {
    /// Serves the real content.
    Healthy,
    /// Answers 503 to everything, as edges did during the 2021 Fastly outage.
    Unavailable,
    /// Answers 200 with a stale custom error page: only a content check catches it.
    ErrorPage,
}

#[derive(Debug)]
struct EdgeState {
    vendor: &'static str,
    pop: &'static str,
    health_marker: String,
    mode: Mutex<EdgeMode>,
    requests: AtomicU64,
}

/// An emulated CDN edge on 127.0.0.1.
#[derive(Debug)]
pub struct EdgeServer {
    addr: SocketAddr,
    state: Arc<EdgeState>,
    _stop: oneshot::Sender<()>,
}

impl EdgeServer {
    /// Starts an edge for `vendor` (`fastly` or `cloudflare`) at PoP `pop`, whose health object
    /// contains `health_marker`.
    pub async fn start(
        vendor: &'static str,
        pop: &'static str,
        health_marker: &str,
    ) -> std::io::Result<EdgeServer> {
        let state = Arc::new(EdgeState {
            vendor,
            pop,
            health_marker: health_marker.to_owned(),
            mode: Mutex::new(EdgeMode::Healthy),
            requests: AtomicU64::new(0),
        });
        let app = Router::new()
            .fallback(any(edge_handler))
            .with_state(state.clone());
        let (addr, stop) = serve(app).await?;
        Ok(EdgeServer {
            addr,
            state,
            _stop: stop,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Switches behaviour.
    pub fn set_mode(&self, mode: EdgeMode) {
        if let Ok(mut m) = self.state.mode.lock() {
            *m = mode;
        }
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }
}

async fn edge_handler(State(state): State<Arc<EdgeState>>, uri: axum::http::Uri) -> Response {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let mode = state.mode.lock().map(|m| *m).unwrap_or(EdgeMode::Healthy);
    let path = uri.path().to_owned();
    let mut headers = HeaderMap::new();
    let cache = if path.starts_with("/_health") {
        "MISS"
    } else {
        "HIT"
    };
    let timing = format!(
        "cdn;desc=\"{}\", pop;desc=\"{}\", cache;desc=\"{cache}\"",
        state.vendor, state.pop
    );
    if let Ok(v) = HeaderValue::from_str(&timing) {
        headers.insert("server-timing", v);
    }
    match mode {
        EdgeMode::Unavailable => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                headers,
                "503 Service Unavailable",
            )
                .into_response();
        }
        EdgeMode::ErrorPage => {
            headers.insert("content-type", HeaderValue::from_static("text/html"));
            return (
                StatusCode::OK,
                headers,
                "<html><body><h1>Something went wrong</h1><p>Please try again later.</p></body></html>",
            )
                .into_response();
        }
        EdgeMode::Healthy => {}
    }
    if path.starts_with("/_health") {
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        headers.insert("cache-control", HeaderValue::from_static("no-cache"));
        return (
            StatusCode::OK,
            headers,
            format!("{}\n", state.health_marker),
        )
            .into_response();
    }
    let tag = path.trim_start_matches('/').replace('/', "-");
    let tag_header = if state.vendor == "fastly" {
        "surrogate-key"
    } else {
        "cache-tag"
    };
    if let Ok(v) = HeaderValue::from_str(if tag.is_empty() { "home" } else { &tag }) {
        headers.insert(tag_header, v);
    }
    headers.insert("content-type", HeaderValue::from_static("text/html"));
    headers.insert(
        "cache-control",
        HeaderValue::from_static("public, max-age=60, stale-if-error=604800"),
    );
    (
        StatusCode::OK,
        headers,
        format!("<html><body><h1>{path}</h1><p>Oak dining table, £899.</p></body></html>"),
    )
        .into_response()
}

#[derive(Debug, Default)]
struct PurgeState {
    refuse: Mutex<BTreeMap<&'static str, bool>>,
    purged: Mutex<Vec<(String, Vec<String>)>>,
    ids: AtomicU64,
}

/// Emulated Fastly and Cloudflare purge APIs on 127.0.0.1, answering as their contracts say.
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

    /// Makes `vendor`'s API refuse every token (an expired token), or accept them again.
    pub fn refuse_tokens(&self, vendor: &'static str, refuse: bool) {
        if let Ok(mut r) = self.state.refuse.lock() {
            r.insert(vendor, refuse);
        }
    }

    /// Every purge acknowledged: (vendor, items).
    pub fn purged(&self) -> Vec<(String, Vec<String>)> {
        self.state
            .purged
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default()
    }
}

impl PurgeState {
    fn refused(&self, vendor: &str) -> bool {
        self.refuse
            .lock()
            .map(|r| r.get(vendor).copied().unwrap_or(false))
            .unwrap_or(false)
    }
    fn record(&self, vendor: &str, items: Vec<String>) -> String {
        if let Ok(mut p) = self.purged.lock() {
            p.push((vendor.to_owned(), items));
        }
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", 108_340 + n)
    }
}

fn fastly_refusal() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(serde_json::json!({"msg": "Provided credentials are missing or invalid"})),
    )
        .into_response()
}

async fn fastly_batch(
    State(s): State<Arc<PurgeState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if s.refused("fastly") {
        return fastly_refusal();
    }
    let mut keys: Vec<String> = headers
        .get("surrogate-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body)
        && let Some(list) = json.get("surrogate_keys").and_then(|v| v.as_array())
    {
        keys.extend(list.iter().filter_map(|k| k.as_str().map(str::to_owned)));
    }
    let mut out = serde_json::Map::new();
    for k in &keys {
        out.insert(
            k.clone(),
            serde_json::Value::String(s.record("fastly", vec![k.clone()])),
        );
    }
    axum::Json(serde_json::Value::Object(out)).into_response()
}

async fn fastly_key(
    State(s): State<Arc<PurgeState>>,
    Path((_sid, key)): Path<(String, String)>,
) -> Response {
    if s.refused("fastly") {
        return fastly_refusal();
    }
    let id = s.record("fastly", vec![key]);
    axum::Json(serde_json::json!({"status": "ok", "id": id})).into_response()
}

async fn fastly_all(State(s): State<Arc<PurgeState>>) -> Response {
    if s.refused("fastly") {
        return fastly_refusal();
    }
    s.record("fastly", vec!["*".into()]);
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn cloudflare_purge(State(s): State<Arc<PurgeState>>, body: Bytes) -> Response {
    if s.refused("cloudflare") {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({
                "success": false,
                "errors": [{"code": 10000, "message": "Authentication error"}],
                "messages": [],
                "result": null
            })),
        )
            .into_response();
    }
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let items: Vec<String> = ["files", "tags", "hosts", "prefixes"]
        .iter()
        .filter_map(|k| json.get(*k).and_then(|v| v.as_array()))
        .flatten()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| v.to_string())
        })
        .collect();
    let id = s.record("cloudflare", items);
    axum::Json(serde_json::json!({
        "success": true, "errors": [], "messages": [], "result": {"id": id}
    }))
    .into_response()
}

async fn serve(app: Router) -> std::io::Result<(SocketAddr, oneshot::Sender<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    });
    Ok((addr, stop))
}
