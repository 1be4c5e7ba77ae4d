//! An emulated CDN edge fronting the site: a health object, HTML pages, the identity header
//! (`Server-Timing: cdn;desc=..., pop;desc=..., cache;desc=...`) and cache tags. Its behaviour
//! can be switched at run time ([`EdgeMode`]) to play an incident: a 503, or a 200 whose body
//! is an error page.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use tokio::sync::oneshot;

use crate::serve::serve;

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
