//! Test edges on loopback and test runners, shared by the integration tests.
//!
//! A [`TestEdge`] is a real HTTP server on 127.0.0.1 that behaves like one CDN's edge:
//!
//! | path | answer |
//! |---|---|
//! | `/_health/v3.txt` | 200 `ok healthy-v3` while healthy, 503 with an error page when not |
//! | `/error-page` | 200 with a CDN error page (no marker) |
//! | `/no-marker` | 200 with other content |
//! | `/503-with-marker` | 503 whose body does contain the marker |
//! | `/late-marker` | 200: 70,000 bytes of filler, then the marker |
//! | `/huge` | 200: the marker, then 8 MiB of filler |
//! | `/hang` | never answers (sleeps an hour on tokio time) |
//! | `/redirect` | 301 to `/elsewhere` |
//! | `/host-gated` | the marker only when `Host: www.example.com` |
//! | anything else | 200 `page {path}`, or the status set with [`TestEdge::set_status`] |
//!
//! Every answer carries `Server-Timing: cdn;desc="{name}"`, a `Date`, and any headers added
//! with [`TestEdge::add_header`]; every request is recorded.

#![allow(dead_code, unreachable_pub, missing_docs)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support: failing loudly is the point

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use multicdn_core::{
    Clock, Error, FailReason, HealthCheck, ManualClock, Observation, Outcome, ProviderId, RegionId,
    Target,
};
use multicdn_health::{Edge, HttpProbe};

pub const MARKER: &str = "healthy-v3";
pub const SITE: &str = "www.example.com";

/// Orders requests across every edge in a test binary.
static SEQUENCE: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub seq: usize,
    /// The client's address: the same for requests over one connection.
    pub peer: SocketAddr,
    pub path: String,
    pub headers: HeaderMap,
}

#[derive(Debug)]
pub struct EdgeState {
    pub name: String,
    healthy: AtomicBool,
    requests: Mutex<Vec<SeenRequest>>,
    extra_headers: Mutex<Vec<(String, String)>>,
    statuses: Mutex<HashMap<String, u16>>,
    latency: Mutex<Duration>,
}

#[derive(Debug)]
pub struct TestEdge {
    pub addr: SocketAddr,
    pub state: Arc<EdgeState>,
}

impl TestEdge {
    /// Starts an edge named `name` on the current runtime.
    pub async fn start(name: &str) -> TestEdge {
        let state = Arc::new(EdgeState {
            name: name.to_owned(),
            healthy: AtomicBool::new(true),
            requests: Mutex::new(Vec::new()),
            extra_headers: Mutex::new(Vec::new()),
            statuses: Mutex::new(HashMap::new()),
            latency: Mutex::new(Duration::ZERO),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            let _ = axum::serve(listener, app).await;
        });
        TestEdge { addr, state }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.state.healthy.store(healthy, Ordering::SeqCst);
    }

    pub fn add_header(&self, name: &str, value: &str) {
        self.state
            .extra_headers
            .lock()
            .unwrap()
            .push((name.to_owned(), value.to_owned()));
    }

    pub fn set_status(&self, path: &str, status: u16) {
        self.state
            .statuses
            .lock()
            .unwrap()
            .insert(path.to_owned(), status);
    }

    /// Each answer waits this long first (on tokio time).
    pub fn set_latency(&self, latency: Duration) {
        *self.state.latency.lock().unwrap() = latency;
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.state.requests.lock().unwrap().clone()
    }
}

async fn handle(
    State(state): State<Arc<EdgeState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let path = req.uri().path().to_owned();
    state.requests.lock().unwrap().push(SeenRequest {
        seq: SEQUENCE.fetch_add(1, Ordering::SeqCst),
        peer,
        path: path.clone(),
        headers: req.headers().clone(),
    });
    let latency = *state.latency.lock().unwrap();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let host = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (status, body): (u16, Vec<u8>) = match path.as_str() {
        "/_health/v3.txt" if state.healthy.load(Ordering::SeqCst) => (200, format!("ok {MARKER}\n").into()),
        "/_health/v3.txt" => (503, b"<html><h1>503 Service Unavailable</h1></html>".to_vec()),
        "/error-page" => (
            200,
            b"<html><body>Fastly error: unknown domain: www.example.com. Details: cache-lhr-LHR</body></html>"
                .to_vec(),
        ),
        "/no-marker" => (200, b"some other object".to_vec()),
        "/503-with-marker" => (503, MARKER.as_bytes().to_vec()),
        "/late-marker" => {
            let mut b = vec![b'.'; 70_000];
            b.extend_from_slice(MARKER.as_bytes());
            (200, b)
        }
        "/huge" => {
            let mut b = MARKER.as_bytes().to_vec();
            b.extend(std::iter::repeat_n(b'.', 8 * 1024 * 1024));
            (200, b)
        }
        "/hang" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            (200, MARKER.as_bytes().to_vec())
        }
        "/host-gated" if host == SITE => (200, MARKER.as_bytes().to_vec()),
        "/host-gated" => (404, b"unknown host".to_vec()),
        _ => {
            let status = state.statuses.lock().unwrap().get(&path).copied().unwrap_or(200);
            (status, format!("page {path}").into())
        }
    };
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = if path == "/redirect" {
        StatusCode::MOVED_PERMANENTLY
    } else {
        StatusCode::from_u16(status).unwrap()
    };
    let headers = resp.headers_mut();
    if path == "/redirect" {
        headers.insert("location", HeaderValue::from_static("/elsewhere"));
    }
    headers.insert(
        "server-timing",
        HeaderValue::from_str(&format!(
            "cdn;desc=\"{}\", pop;desc=\"LHR\", cache;desc=\"HIT\"",
            state.name
        ))
        .unwrap(),
    );
    headers.insert(
        "cache-control",
        HeaderValue::from_static("public, max-age=60"),
    );
    for (k, v) in state.extra_headers.lock().unwrap().iter() {
        headers.append(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    resp
}

/// Two edges, fastly and cloudflare, and their [`Edge`]s in that order.
pub async fn two_edges() -> (TestEdge, TestEdge, Vec<Edge>) {
    let fastly = TestEdge::start("fastly").await;
    let cloudflare = TestEdge::start("cloudflare").await;
    let edges = vec![
        Edge::new(id("fastly"), &fastly.base_url()).unwrap(),
        Edge::new(id("cloudflare"), &cloudflare.base_url()).unwrap(),
    ];
    (fastly, cloudflare, edges)
}

/// A port nothing listens on.
pub async fn dead_port_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

pub fn id(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

pub fn region(s: &str) -> RegionId {
    RegionId::new(s).unwrap()
}

pub const REGIONS: [&str; 5] = ["eu-west", "us-east", "us-west", "ap-southeast", "sa-east"];

/// A real HTTP probe whose network path to the edges is broken: every target's URL is sent to
/// `base` instead (a dead port, say). The runner in a region having a bad minute.
#[derive(Debug)]
pub struct BrokenPath {
    pub probe: HttpProbe,
    pub base: String,
}

#[async_trait]
impl HealthCheck for BrokenPath {
    async fn check(&self, target: &Target) -> Result<Observation, Error> {
        let mut t = target.clone();
        let path = t.url.splitn(4, '/').nth(3).unwrap_or_default().to_owned();
        t.url = format!("{}/{path}", self.base);
        self.probe.check(&t).await
    }
}

/// A runner without I/O, for loop and quorum scenarios on paused time: it fails the providers
/// named in `failing` and passes the rest, stamping with `clock`.
#[derive(Debug, Clone)]
pub struct FakeRunner {
    pub region: RegionId,
    pub clock: ManualClock,
    pub failing: Arc<Mutex<BTreeSet<ProviderId>>>,
    pub calls: Arc<AtomicUsize>,
}

impl FakeRunner {
    pub fn new(region: &str, clock: &ManualClock) -> FakeRunner {
        FakeRunner {
            region: RegionId::new(region).unwrap(),
            clock: clock.clone(),
            failing: Arc::default(),
            calls: Arc::default(),
        }
    }

    pub fn fail(&self, provider: &ProviderId, failing: bool) {
        let mut f = self.failing.lock().unwrap();
        if failing {
            f.insert(provider.clone());
        } else {
            f.remove(provider);
        }
    }
}

#[async_trait]
impl HealthCheck for FakeRunner {
    async fn check(&self, target: &Target) -> Result<Observation, Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let outcome = if self.failing.lock().unwrap().contains(&target.provider) {
            Outcome::Fail {
                reason: FailReason::Status { got: 503 },
            }
        } else {
            Outcome::Pass
        };
        Ok(Observation::new(
            target.provider.clone(),
            self.region.clone(),
            self.clock.now(),
            outcome,
            Duration::from_millis(25),
        ))
    }
}
