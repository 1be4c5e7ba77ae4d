//! An emulated CDN edge fronting the site, a real HTTP server on 127.0.0.1:
//!
//! | path | answer |
//! |---|---|
//! | `/_health...` | 200 with the health marker while healthy; 503 with an error page after [`EdgeServer::set_healthy`]`(false)` |
//! | `/error-page` | 200 with a CDN error page (no marker) |
//! | `/no-marker` | 200 with other content |
//! | `/503-with-marker` | 503 whose body does contain the marker |
//! | `/late-marker` | 200: 70,000 bytes of filler, then the marker |
//! | `/huge` | 200: the marker, then 8 MiB of filler |
//! | `/hang` | never answers (sleeps an hour on tokio time) |
//! | `/redirect` | 301 to `/elsewhere` |
//! | `/host-gated` | the marker only when `Host: www.example.com` |
//! | `/_multicdn/probe.gif` | 200, a 43-byte GIF for the browser probe, `no-store`, readable and timeable from any origin (`Access-Control-Allow-Origin` and `Timing-Allow-Origin: *`) |
//! | anything else | 200, an HTML page naming the path (loading the script set with [`EdgeServer::set_page_script`]), with a cache tag for the path ([`EdgeServer::set_cache_tags`]), or the status set with [`EdgeServer::set_status`] |
//!
//! Every answer carries the identity header (`Server-Timing: cdn;desc=..., pop;desc=...,
//! cache;desc=...`), `Cache-Control`, and any headers added with [`EdgeServer::add_header`];
//! every request is recorded ([`EdgeServer::requests`]). The whole edge can be switched into an
//! incident ([`EdgeMode`]): a 503 to everything, or a 200 whose body is an error page.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The health marker of the example policy (`health.expect`).
pub const MARKER: &str = "healthy-v3";
/// The site's hostname the edges front.
pub const SITE: &str = "www.example.com";

/// Orders requests across every edge in a process.
static SEQUENCE: AtomicUsize = AtomicUsize::new(0);

/// How an emulated edge behaves as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeMode {
    /// Serves the real content.
    Healthy,
    /// Answers 503 to everything, as edges did during the 2021 Fastly outage.
    Unavailable,
    /// Answers 200 with a stale custom error page: only a content check catches it.
    ErrorPage,
}

/// One request an edge received.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// Its place among every edge's requests in this process.
    pub seq: usize,
    /// The client's address: the same for requests over one connection.
    pub peer: SocketAddr,
    /// The path.
    pub path: String,
    /// The request headers.
    pub headers: HeaderMap,
}

#[derive(Debug)]
struct EdgeState {
    vendor: String,
    pop: String,
    marker: String,
    mode: Mutex<EdgeMode>,
    healthy: AtomicBool,
    tags: AtomicBool,
    count: AtomicU64,
    requests: Mutex<Vec<SeenRequest>>,
    extra_headers: Mutex<Vec<(HeaderName, HeaderValue)>>,
    statuses: Mutex<HashMap<String, StatusCode>>,
    latency: Mutex<Duration>,
    script: Mutex<Option<String>>,
}

/// The smallest transparent GIF: the probe object.
const PROBE_GIF: &[u8] = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An emulated CDN edge on 127.0.0.1; stops when dropped.
#[derive(Debug)]
pub struct EdgeServer {
    addr: SocketAddr,
    state: Arc<EdgeState>,
    _stop: oneshot::Sender<()>,
}

impl EdgeServer {
    /// Starts an edge for `vendor` (`fastly`, `cloudflare`, or any name) at PoP `pop`, whose
    /// health object contains `marker`.
    pub async fn start(vendor: &str, pop: &str, marker: &str) -> std::io::Result<EdgeServer> {
        let state = Arc::new(EdgeState {
            vendor: vendor.to_owned(),
            pop: pop.to_owned(),
            marker: marker.to_owned(),
            mode: Mutex::new(EdgeMode::Healthy),
            healthy: AtomicBool::new(true),
            tags: AtomicBool::new(true),
            count: AtomicU64::new(0),
            requests: Mutex::new(Vec::new()),
            extra_headers: Mutex::new(Vec::new()),
            statuses: Mutex::new(HashMap::new()),
            latency: Mutex::new(Duration::ZERO),
            script: Mutex::new(None),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(handle).with_state(state.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(EdgeServer {
            addr,
            state,
            _stop: stop,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Switches the whole edge's behaviour.
    pub fn set_mode(&self, mode: EdgeMode) {
        *lock(&self.state.mode) = mode;
    }

    /// Makes the health object fail (503 with an error page) or pass again; other paths are
    /// unaffected.
    pub fn set_healthy(&self, healthy: bool) {
        self.state.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Whether pages carry their cache tag (`Surrogate-Key` on fastly, `Cache-Tag` otherwise),
    /// as an edge that does not strip them shows it to clients (default: they do).
    pub fn set_cache_tags(&self, tags: bool) {
        self.state.tags.store(tags, Ordering::SeqCst);
    }

    /// Adds a header to every answer. A name or value that is not valid HTTP is ignored.
    pub fn add_header(&self, name: &str, value: &str) {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            lock(&self.state.extra_headers).push((n, v));
        }
    }

    /// Answers `path` with `status` (for paths without a fixed answer).
    pub fn set_status(&self, path: &str, status: u16) {
        if let Ok(s) = StatusCode::from_u16(status) {
            lock(&self.state.statuses).insert(path.to_owned(), s);
        }
    }

    /// Makes every page load `src` (`<script async src=...>` in its head): the shipped
    /// `rum.js`, so that a browser loading a page through this edge sends the beacons.
    pub fn set_page_script(&self, src: &str) {
        *lock(&self.state.script) = Some(src.to_owned());
    }

    /// Each answer waits this long first (on tokio time).
    pub fn set_latency(&self, latency: Duration) {
        *lock(&self.state.latency) = latency;
    }

    /// Requests answered so far.
    pub fn request_count(&self) -> u64 {
        self.state.count.load(Ordering::Relaxed)
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.state.requests).clone()
    }
}

/// The page an edge serves at `path`, loading `script` when given: a test that stands up an
/// edge of its own serves the same page.
pub fn page(path: &str, script: Option<&str>) -> String {
    let script = script
        .map(|src| format!("<script async src=\"{src}\"></script>"))
        .unwrap_or_default();
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{path}</title>{script}</head><body><h1>{path}</h1><p>Oak dining table, £899.</p></body></html>"
    )
}

/// The answer's status and body, before the headers every answer carries.
async fn answer(state: &EdgeState, path: &str, host: &str) -> (StatusCode, Vec<u8>) {
    match *lock(&state.mode) {
        EdgeMode::Unavailable => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                b"503 Service Unavailable".to_vec(),
            );
        }
        EdgeMode::ErrorPage => {
            return (
                StatusCode::OK,
                b"<html><body><h1>Something went wrong</h1><p>Please try again later.</p></body></html>"
                    .to_vec(),
            );
        }
        EdgeMode::Healthy => {}
    }
    let marker = state.marker.as_bytes();
    match path {
        p if p.starts_with("/_health") => {
            if state.healthy.load(Ordering::SeqCst) {
                (StatusCode::OK, format!("ok {}\n", state.marker).into())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    b"<html><h1>503 Service Unavailable</h1></html>".to_vec(),
                )
            }
        }
        "/error-page" => (
            StatusCode::OK,
            format!(
                "<html><body>{} error: unknown domain: {SITE}. Details: cache-{}</body></html>",
                state.vendor, state.pop
            )
            .into(),
        ),
        "/no-marker" => (StatusCode::OK, b"some other object".to_vec()),
        "/503-with-marker" => (StatusCode::SERVICE_UNAVAILABLE, marker.to_vec()),
        "/late-marker" => {
            let mut b = vec![b'.'; 70_000];
            b.extend_from_slice(marker);
            (StatusCode::OK, b)
        }
        "/huge" => {
            let mut b = marker.to_vec();
            b.extend(std::iter::repeat_n(b'.', 8 * 1024 * 1024));
            (StatusCode::OK, b)
        }
        "/hang" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            (StatusCode::OK, marker.to_vec())
        }
        "/redirect" => (StatusCode::MOVED_PERMANENTLY, Vec::new()),
        "/host-gated" if host == SITE => (StatusCode::OK, marker.to_vec()),
        "/host-gated" => (StatusCode::NOT_FOUND, b"unknown host".to_vec()),
        "/_multicdn/probe.gif" => (StatusCode::OK, PROBE_GIF.to_vec()),
        _ => {
            let status = lock(&state.statuses)
                .get(path)
                .copied()
                .unwrap_or(StatusCode::OK);
            (status, page(path, lock(&state.script).as_deref()).into())
        }
    }
}

async fn handle(
    State(state): State<Arc<EdgeState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let path = req.uri().path().to_owned();
    state.count.fetch_add(1, Ordering::Relaxed);
    lock(&state.requests).push(SeenRequest {
        seq: SEQUENCE.fetch_add(1, Ordering::SeqCst),
        peer,
        path: path.clone(),
        headers: req.headers().clone(),
    });
    let latency = *lock(&state.latency);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let host = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (status, body) = answer(&state, &path, &host).await;
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    if status == StatusCode::MOVED_PERMANENTLY {
        headers.insert("location", HeaderValue::from_static("/elsewhere"));
    }
    let health = path.starts_with("/_health");
    let cache = if health { "MISS" } else { "HIT" };
    let timing = format!(
        "cdn;desc=\"{}\", pop;desc=\"{}\", cache;desc=\"{cache}\"",
        state.vendor, state.pop
    );
    if let Ok(v) = HeaderValue::from_str(&timing) {
        headers.insert("server-timing", v);
    }
    if path == "/_multicdn/probe.gif" {
        headers.insert("cache-control", HeaderValue::from_static("no-store"));
        headers.insert("content-type", HeaderValue::from_static("image/gif"));
        headers.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        headers.insert("timing-allow-origin", HeaderValue::from_static("*"));
    } else if health {
        headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    } else {
        headers.insert(
            "cache-control",
            HeaderValue::from_static("public, max-age=60, stale-if-error=604800"),
        );
        headers.insert("content-type", HeaderValue::from_static("text/html"));
        let tag = path.trim_start_matches('/').replace('/', "-");
        let tag_header = if state.vendor == "fastly" {
            "surrogate-key"
        } else {
            "cache-tag"
        };
        if state.tags.load(Ordering::SeqCst)
            && let Ok(v) = HeaderValue::from_str(if tag.is_empty() { "home" } else { &tag })
        {
            headers.insert(tag_header, v);
        }
    }
    for (k, v) in lock(&state.extra_headers).iter() {
        headers.append(k.clone(), v.clone());
    }
    resp
}
