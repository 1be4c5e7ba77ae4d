//! hls.js and dash.js in a real Chromium follow content steering and the edges' quality caps,
//! end to end on loopback, with the library's pieces doing the work.
//!
//! Two CDN edges (`fastly` and `cloudflare`: small axum servers) serve the same clip, made by
//! `tests/players/make-media.sh` with ffmpeg (two H.264 rungs and AAC in 2 s fMP4 segments,
//! HLS and DASH) at a link's pace (20 Mbit/s, not loopback's), answer the policy's health
//! object, count the segments they serve, answer 503 to everything while "dead", and carry the
//! library's [`QualityCap`] layer. An origin
//! serves the clip's untagged manifests. The library's [`SteeringService`] serves the
//! steering routes and `/manifests/{*path}` (the origin's manifests tagged for both pathways)
//! over the plan a [`Controller`] puts in force: the example policy with a 2 s steering TTL,
//! everyone on `fastly`, the health monitor probing both edges from five "regions", rounds
//! every half second. A page server serves `tests/players/player.html`, the two players from
//! `tests/browser/node_modules` and the hls.js CMSD snippet `src/service/assets/cmsd-hls.js`;
//! the page plays HLS in hls.js and DASH in dash.js side by side and POSTs `/control/<action>`
//! to change things mid-play, so every switch time is measured in the page against the moment
//! the change was made.
//!
//! Scenarios, one page and one fresh controller each, both players at once:
//! - a. an operator pins everyone to `cloudflare`: from the next round the plan prefers it, and
//!   both players fetch from it within TTL + one segment + slack of the pin;
//! - b. `fastly` dies mid-play (503 to everything, its health object included): the monitor
//!   marks it down, the steering service stops offering it, both players move to `cloudflare`
//!   and neither returns;
//! - c. the edges cap at the low rung (`CMSD-Dynamic` `mb`): both players drop to it (hls.js
//!   through the snippet, dash.js through its own CMSD settings); the explicit lift (the top
//!   rung's `mb`) brings the high rung back;
//! - d. other clients (another address) send the steering server hostile, malformed and empty
//!   reports and a flood of idle connections while the players play: every hostile request is
//!   answered without a 5xx, and the players' steering requests go on being answered 200 at
//!   the TTL's pace.
//!
//! The browser is driven by `tests/browser/drive.mjs` like `browser.rs`. Without the driver,
//! Node, Chromium or ffmpeg the test says why and passes; with `CI` set it fails. The clip is
//! made once into `$CARGO_TARGET_TMPDIR/players-media` and kept while the script is unchanged.
//! `--nocapture` prints the measured switch times.

#![cfg(feature = "service")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Wall-clock time is what this test measures: the players run in real time.
#![allow(clippy::disallowed_methods)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path as UrlPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use multicdn::core::policy::Share;
use multicdn::prelude::*;
use multicdn::service::cmsd::QualityCap;
use multicdn::service::steering::SteeringService;
use multicdn::service::{ServeLimits, serve};
use multicdn::steering::video::{BitrateLadder, Pathway, SteeringConfig, TagOptions};
use serde_json::{Value, json};
use support::browser::{drive, driver, evals};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

/// The example policy; the test shortens its steering TTL and starts everyone on `fastly`.
const POLICY: &str = include_str!("../../examples/policy.yaml");
/// The steering TTL the players get: short, so the test is quick.
const TTL: Duration = Duration::from_secs(2);
/// The clip's segment duration (make-media.sh).
const SEGMENT: Duration = Duration::from_secs(2);
/// How often the controller runs a round.
const ROUND: Duration = Duration::from_millis(500);
/// What a switch may take on top of TTL + one segment: the steering round trip, the player's
/// scheduling of its next fragment, a controller round, a loaded machine.
const SLACK: Duration = Duration::from_secs(3);
/// The pace an edge sends a media segment at: a link's, not loopback's. On loopback a whole
/// segment can arrive in one read, and dash.js's XHR loader drops a throughput sample made of a
/// single progress event (it times the transfer between two), so on a busy machine it can be
/// left with no estimate at all; its throughput rule then decides nothing and applies no `mb`
/// (a CI run saw dash.js hold the top rung for 20 s under the cap). At 20 Mbit/s the top rung's
/// 500 KB segment takes about 200 ms, several progress events, and the estimate stays well above
/// the top rung's 2 Mbit/s.
const LINK_BITS_PER_SEC: u64 = 20_000_000;
/// The pieces a paced segment is sent in.
const LINK_CHUNK: usize = 16 * 1024;
/// The pathways, as the policy, the plan, the manifests and the edges name them.
const A: &str = "fastly";
const B: &str = "cloudflare";
/// Where the hostile requests come from (the players use 127.0.0.1): the steering service
/// limits its clients one by one.
const OTHER_CLIENT: [u8; 4] = [127, 0, 0, 2];
/// Where the flood of idle connections comes from: the server caps connections per client.
const FLOODER: [u8; 4] = [127, 0, 0, 3];

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The clip

/// The clip's directory, made by make-media.sh when missing or stale; `None` (a skip, a failure
/// in CI) without ffmpeg.
fn media() -> Option<PathBuf> {
    let script = Path::new(MANIFEST_DIR).join("tests/players/make-media.sh");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("players-media");
    let stamp = dir.join(".made-by");
    let wanted = std::fs::read(&script).unwrap();
    if std::fs::read(&stamp).is_ok_and(|s| s == wanted)
        && dir.join("manifest.mpd").is_file()
        && dir.join("master.m3u8").is_file()
    {
        return Some(dir);
    }
    let ffmpeg = Process::new("ffmpeg").arg("-version").output();
    if !ffmpeg.is_ok_and(|o| o.status.success()) {
        let why = "ffmpeg is not on PATH (apt-get install ffmpeg; .ci/run does)";
        if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
            panic!("the player test cannot run in CI: {why}");
        }
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "skipped: {why}");
        return None;
    }
    let started = Instant::now();
    let out = Process::new("bash")
        .arg(&script)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "make-media.sh failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&stamp, &wanted).unwrap();
    println!(
        "made the clip in {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    Some(dir)
}

/// The rungs of the clip, from its multivariant playlist: (BANDWIDTH rounded up to kbps,
/// height), lowest first. These are what the edges cap at: the bitrate hls.js compares, and the
/// total dash.js compares after adding the audio.
fn rungs(master: &str) -> Vec<(u32, u32)> {
    let mut rungs: Vec<(u32, u32)> = master
        .lines()
        .filter_map(|l| l.strip_prefix("#EXT-X-STREAM-INF:"))
        .map(|attrs| {
            let bps: u32 = attr(attrs, "BANDWIDTH").unwrap().parse().unwrap();
            let height = attr(attrs, "RESOLUTION")
                .and_then(|r| r.split('x').nth(1))
                .unwrap()
                .parse()
                .unwrap();
            (bps.div_ceil(1000), height)
        })
        .collect();
    rungs.sort_unstable();
    assert!(rungs.len() >= 2, "the clip needs two rungs: {master}");
    rungs
}

/// An attribute of an HLS attribute list (`KEY=value` or `KEY="value"`).
fn attr<'a>(attrs: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = attrs;
    while !rest.is_empty() {
        let (k, tail) = rest.split_once('=')?;
        let (value, tail) = if let Some(q) = tail.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], q[end + 1..].trim_start_matches(','))
        } else {
            tail.split_once(',').unwrap_or((tail, ""))
        };
        if k.trim() == key {
            return Some(value);
        }
        rest = tail;
    }
    None
}

// ---------------------------------------------------------------------------------------------
// The edges and the origin

/// One CDN edge: serves the clip under `/hls/` and `/dash/` and the policy's health object,
/// with the library's CMSD layer on every response.
#[derive(Debug)]
struct Edge {
    name: &'static str,
    media: PathBuf,
    /// What the health object says (the policy's `health.expect`).
    health: String,
    /// Answers 503 to everything while set.
    dead: AtomicBool,
    /// The cap the edge's CMSD layer sends.
    cap: QualityCap,
    /// Media segments served, by `/hls` or `/dash`.
    segments: Mutex<BTreeMap<&'static str, u64>>,
    /// Requests answered 503.
    refused: AtomicU64,
}

fn content_type(file: &str) -> &'static str {
    match file.rsplit('.').next() {
        Some("m3u8") => "application/vnd.apple.mpegurl",
        Some("mpd") => "application/dash+xml",
        Some("m4s" | "mp4") => "video/mp4",
        _ => "application/octet-stream",
    }
}

/// A file of the clip, or 404 for a name that is not one.
fn clip_file(media: &Path, file: &str) -> Option<Vec<u8>> {
    let plain = !file.is_empty()
        && !file.starts_with('.')
        && file
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    plain
        .then(|| std::fs::read(media.join(file)).ok())
        .flatten()
}

/// `bytes` sent at [`LINK_BITS_PER_SEC`], in [`LINK_CHUNK`] pieces, with its length declared (the
/// players' progress events need it).
fn paced(bytes: Vec<u8>) -> Response {
    let bytes = axum::body::Bytes::from(bytes);
    let len = bytes.len();
    let gap = Duration::from_micros(LINK_CHUNK as u64 * 8 * 1_000_000 / LINK_BITS_PER_SEC);
    let pieces = futures::stream::unfold(0, move |at| {
        let bytes = bytes.clone();
        async move {
            if at >= bytes.len() {
                return None;
            }
            if at > 0 {
                tokio::time::sleep(gap).await;
            }
            let end = (at + LINK_CHUNK).min(bytes.len());
            Some((Ok::<_, std::convert::Infallible>(bytes.slice(at..end)), end))
        }
    });
    let mut r = Body::from_stream(pieces).into_response();
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    r
}

async fn edge_file(edge: &Edge, family: &'static str, file: &str) -> Response {
    let mut r = if edge.dead.load(Ordering::SeqCst) {
        edge.refused.fetch_add(1, Ordering::SeqCst);
        (StatusCode::SERVICE_UNAVAILABLE, "down for the test\n").into_response()
    } else {
        match clip_file(&edge.media, file) {
            Some(bytes) if file.starts_with("chunk-") => {
                *edge.segments.lock().unwrap().entry(family).or_default() += 1;
                let mut r = paced(bytes);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(content_type(file)),
                );
                r
            }
            Some(bytes) => ([(header::CONTENT_TYPE, content_type(file))], bytes).into_response(),
            None => (StatusCode::NOT_FOUND, "no such file\n").into_response(),
        }
    };
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // The page is on another origin. The CMSD layer adds the expose header for its own.
    r.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    r
}

fn edge_router(edge: Arc<Edge>) -> Router {
    let (hls, dash, health) = (edge.clone(), edge.clone(), edge.clone());
    Router::new()
        .route(
            "/hls/{file}",
            get(move |UrlPath(file): UrlPath<String>| {
                let edge = hls.clone();
                async move { edge_file(&edge, "hls", &file).await }
            }),
        )
        .route(
            "/dash/{file}",
            get(move |UrlPath(file): UrlPath<String>| {
                let edge = dash.clone();
                async move { edge_file(&edge, "dash", &file).await }
            }),
        )
        .route(
            "/_health/v3.txt",
            get(move || {
                let edge = health.clone();
                async move {
                    if edge.dead.load(Ordering::SeqCst) {
                        edge.refused.fetch_add(1, Ordering::SeqCst);
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "down for the test\n".to_owned(),
                        )
                    } else {
                        (StatusCode::OK, edge.health.clone())
                    }
                }
            }),
        )
        .layer(edge.cap.layer())
}

/// The origin: the clip's manifests as ffmpeg wrote them, for the steering service to tag.
fn origin_router(media: PathBuf) -> Router {
    Router::new().route(
        "/{family}/{file}",
        get(move |UrlPath((family, file)): UrlPath<(String, String)>| {
            let media = media.clone();
            async move {
                match (family.as_str(), clip_file(&media, &file)) {
                    ("hls" | "dash", Some(bytes)) => {
                        ([(header::CONTENT_TYPE, content_type(&file))], bytes).into_response()
                    }
                    _ => (StatusCode::NOT_FOUND, "no such manifest\n").into_response(),
                }
            }
        }),
    )
}

async fn listen(router: Router) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, router).await.unwrap() });
    base
}

// ---------------------------------------------------------------------------------------------
// The lab: a controller, its health monitor and the steering service, fresh for each scenario

/// The example policy with a 2 s steering TTL and everyone (the `default` region, which the
/// players fall in: no resolver here) on `fastly`; no measurement floor, and guardrails that
/// let an operator's pin move the whole region at once.
fn policy() -> Policy {
    let mut text = POLICY.to_owned();
    for (from, to) in [
        ("  ttl: 30s", "  ttl: 2s"),
        (
            "match: [\"*\"]\n      weights: { fastly: 50%, cloudflare: 50% }",
            "match: [\"*\"]\n      weights: { fastly: 100%, cloudflare: 0% }",
        ),
        ("measurement: 10%", "measurement: 0%"),
        ("max_moved_per_hour: 30%", "max_moved_per_hour: 100%"),
        ("max_change_per_cohort: 40%", "max_change_per_cohort: 100%"),
        ("max_touched_per_apply: 30%", "max_touched_per_apply: 100%"),
    ] {
        assert_eq!(
            text.matches(from).count(),
            1,
            "the example policy has no {from:?}"
        );
        text = text.replace(from, to);
    }
    let policy = Policy::from_yaml(&text, "examples/policy.yaml (players test)").unwrap();
    assert_eq!(policy.steering.ttl.get(), TTL);
    policy
}

/// Fresh beacons for Europe (both providers equal), so the deadman never fires.
fn feed(c: &Controller) {
    let now = SystemClock.now().as_millis();
    let mut text = String::new();
    for cdn in [A, B] {
        for _ in 0..30 {
            text.push_str(&format!(
                "{{\"at\":{now},\"asn\":3320,\"country\":\"DE\",\"ttfb\":40,\"provider\":\"{cdn}\"}}\n"
            ));
        }
    }
    c.ingest_bytes(text.as_bytes());
}

/// One request the steering server answered.
#[derive(Debug, Clone)]
struct Seen {
    client: Option<IpAddr>,
    path: String,
    status: u16,
    at: Instant,
}

async fn record(
    State(seen): State<Arc<Mutex<Vec<Seen>>>>,
    request: Request,
    next: Next,
) -> Response {
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    seen.lock().unwrap().push(Seen {
        client,
        path,
        status: response.status().as_u16(),
        at: Instant::now(),
    });
    response
}

/// What every scenario shares: the edges, the origin, the ladder.
struct Bench {
    policy: Policy,
    edges: [(Arc<Edge>, String); 2],
    origin: String,
    ladder: BitrateLadder,
}

/// One scenario's controller and steering service.
struct Lab {
    controller: Controller,
    service: SteeringService,
    steering: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    edges: [(Arc<Edge>, String); 2],
    ladder: BitrateLadder,
    stop: watch::Sender<bool>,
    hostile: Mutex<Option<tokio::task::JoinHandle<Hostile>>>,
}

impl Bench {
    /// A fresh controller (monitor on both edges, content steering) and steering service,
    /// with the first round run: everyone on `fastly`.
    async fn lab(&self) -> Arc<Lab> {
        for (edge, _) in &self.edges {
            edge.dead.store(false, Ordering::SeqCst);
            edge.cap.lift();
        }
        let overrides = self
            .edges
            .iter()
            .map(|(e, base)| (p(e.name), base.clone()))
            .collect();
        let mut monitor = Monitor::builder(HealthConfig::from_policy(&self.policy.health))
            .targets(targets_from_policy(&self.policy, &overrides).unwrap());
        for region in &self.policy.health.regions {
            monitor = monitor.runner(HttpProbe::builder(region.clone()).build().unwrap());
        }
        let plan = SharedPlan::new();
        let controller = Controller::builder(self.policy.clone())
            .content_steering(ContentSteeringSteerer::new(
                p("content-steering"),
                plan.clone(),
            ))
            .monitor(monitor.build().unwrap())
            .interval(ROUND)
            .build()
            .unwrap();
        feed(&controller);
        controller.round(SystemClock.now()).await;

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let steering = format!("http://{}", listener.local_addr().unwrap());
        let pathways = self
            .edges
            .iter()
            .map(|(e, base)| Pathway {
                id: e.name.to_owned(),
                base: format!("{base}/").parse().unwrap(),
            })
            .collect();
        let service = SteeringService::new(SteeringConfig::from_policy(&self.policy), plan)
            .origins(["*"])
            .manifests(
                format!("{}/", self.origin).parse().unwrap(),
                format!("{steering}/").parse().unwrap(),
                TagOptions {
                    server_uri: String::new(),
                    default_pathway: A.to_owned(),
                    pathways,
                },
            )
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let router = service
            .router()
            .layer(middleware::from_fn_with_state(seen.clone(), record));
        let (stop, stopped) = watch::channel(false);
        let limits = ServeLimits::default()
            .max_connections(128)
            .per_client_connections(16)
            .header_timeout(Duration::from_secs(1));
        let mut s = stopped.clone();
        tokio::spawn(async move {
            serve(listener, router, limits, async move {
                let _ = s.wait_for(|v| *v).await;
            })
            .await
            .unwrap();
        });
        let (c, mut s) = (controller.clone(), stopped);
        tokio::spawn(async move {
            c.run(SystemClock, async move {
                let _ = s.wait_for(|v| *v).await;
            })
            .await;
        });
        Arc::new(Lab {
            controller,
            service,
            steering,
            seen,
            edges: self.edges.clone(),
            ladder: self.ladder.clone(),
            stop,
            hostile: Mutex::new(None),
        })
    }
}

impl Lab {
    fn host(&self, i: usize) -> String {
        self.edges[i].1.trim_start_matches("http://").to_owned()
    }

    async fn control(&self, action: &str) -> Result<(), String> {
        let rungs = self.ladder.rungs();
        match action {
            "pin-b" => {
                let until = SystemClock.now() + Duration::from_secs(3600);
                self.controller
                    .operate(
                        Operator::new("players-test", "cloudflare is faster for everyone"),
                        Command::Pin {
                            network: NetworkKey::Global,
                            weights: [(p(B), Share::percent(100)), (p(A), Share::percent(0))]
                                .into(),
                            until,
                        },
                    )
                    .await
                    .map_err(|e| e.to_string())?;
            }
            "kill-a" => self.edges[0].0.dead.store(true, Ordering::SeqCst),
            // The ladder is kept highest first.
            "cap-low" => {
                let low = &rungs[rungs.len() - 1].name;
                for (edge, _) in &self.edges {
                    edge.cap.cap_at(low).map_err(|e| e.to_string())?;
                }
            }
            "cap-lift" => {
                for (edge, _) in &self.edges {
                    edge.cap.lift();
                }
            }
            "hostile" => {
                let addr = self.steering.trim_start_matches("http://").parse().unwrap();
                *self.hostile.lock().unwrap() = Some(tokio::spawn(hostile_clients(addr)));
            }
            _ => return Err(format!("unknown action {action}")),
        }
        Ok(())
    }

    /// What the steering service answers now and what the players asked it, for failure
    /// messages.
    async fn diagnose(&self) -> String {
        let now: Value = match reqwest::get(format!("{}/steering/hls.json", self.steering)).await {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(e) => Value::String(e.to_string()),
        };
        let plan = self.controller.plan().await;
        let asked: Vec<String> = self
            .players()
            .iter()
            .map(|s| format!("{} {}", s.path, s.status))
            .collect();
        format!(
            "\nthe service answers now: {now}\nthe plan: {:?}\nthe players asked: {asked:?}",
            plan.cohorts
                .iter()
                .map(|c| format!("{}: {}", c.cohort, c.weights))
                .collect::<Vec<_>>()
        )
    }

    /// The players' steering requests (from 127.0.0.1), as (path, status, when).
    fn players(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| {
                s.client == Some(IpAddr::from([127, 0, 0, 1])) && s.path.starts_with("/steering/")
            })
            .cloned()
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

// ---------------------------------------------------------------------------------------------
// The steering server's other clients

/// What the hostile clients got.
#[derive(Debug, Default)]
struct Hostile {
    /// Answers by status.
    statuses: BTreeMap<u16, u64>,
    /// Requests that got no answer at all.
    unanswered: u64,
    /// Idle connections the server accepted and closed, refused, or left open.
    idle_closed: u64,
    idle_open: u64,
}

/// The steering server's other clients: for ten seconds, from [`FLOODER`], a stream of
/// half-sent requests left idle (a few hundred connections in all), and from [`OTHER_CLIENT`]
/// a few hundred requests with empty throughputs, malformed and hostile query strings.
async fn hostile_clients(server: SocketAddr) -> Hostile {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut out = Hostile::default();
    let other = IpAddr::from(OTHER_CLIENT);
    let flooder = IpAddr::from(FLOODER);
    // The idle flood: opened in waves, each connection sending half a request's headers.
    let flood = tokio::spawn(async move {
        let mut conns = Vec::new();
        for _ in 0..10 {
            for _ in 0..40 {
                let socket = TcpSocket::new_v4().unwrap();
                socket.bind(SocketAddr::new(flooder, 0)).unwrap();
                if let Ok(Ok(mut s)) =
                    tokio::time::timeout(Duration::from_secs(2), socket.connect(server)).await
                {
                    let _ = s
                        .write_all(b"GET /steering/hls.json HTTP/1.1\r\nHost: x\r\n")
                        .await;
                    conns.push(s);
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // Each was answered (the overload answer) and closed, or timed out and closed.
        let (mut closed, mut open) = (0, 0);
        for mut s in conns {
            let mut buf = [0u8; 256];
            match tokio::time::timeout(Duration::from_secs(3), async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            })
            .await
            {
                Ok(()) => closed += 1,
                Err(_) => open += 1,
            }
        }
        (closed, open)
    });
    let long = "x".repeat(4000);
    let many = vec![A; 40].join(",");
    let queries = [
        format!("_HLS_pathway={A}&_HLS_throughput="),
        format!("_HLS_pathway={A},{B}&_HLS_throughput=,"),
        format!("_DASH_pathway=%22{A},{B}%22&_DASH_throughput=,5000000"),
        "_DASH_pathway=&_DASH_throughput=".to_owned(),
        format!("_HLS_throughput=NaN&_HLS_pathway={A}"),
        format!("_HLS_pathway={A}&_HLS_throughput=-1e308"),
        "_HLS_pathway=%00%ff%fe&_HLS_throughput=1".to_owned(),
        "session=../../etc/passwd&version=-1".to_owned(),
        "session=%zz%&&&==&_HLS_pathway".to_owned(),
        format!("session={long}&_HLS_pathway={long}&_HLS_throughput=1"),
        format!("_HLS_pathway={many}&_HLS_throughput=1"),
        format!("_HLS_pathway={A}&_HLS_pathway={B}&_HLS_throughput=1&_HLS_throughput=x"),
        "%3Cscript%3Ealert(1)%3C/script%3E=1".to_owned(),
        String::new(),
    ];
    let client = reqwest::Client::builder()
        .local_address(other)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for round in 0..25 {
        for (i, q) in queries.iter().enumerate() {
            let family = if (round + i) % 2 == 0 { "hls" } else { "dash" };
            match client
                .get(format!("http://{server}/steering/{family}.json?{q}"))
                .send()
                .await
            {
                Ok(r) => *out.statuses.entry(r.status().as_u16()).or_default() += 1,
                Err(_) => out.unanswered += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (closed, open) = flood.await.unwrap();
    out.idle_closed = closed;
    out.idle_open = open;
    out
}

// ---------------------------------------------------------------------------------------------
// The page server

fn file_response(path: &Path, kind: &'static str) -> Response {
    match std::fs::read(path) {
        Ok(bytes) => ([(header::CONTENT_TYPE, kind)], Body::from(bytes)).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{}: {e}\n", path.display())).into_response(),
    }
}

/// The scenario running now, for the page's `/control/<action>`.
type Current = Arc<Mutex<Option<Arc<Lab>>>>;

fn page_router(current: Current, modules: PathBuf) -> Router {
    let dir = Path::new(MANIFEST_DIR);
    let page = dir.join("tests/players/player.html");
    let hls = modules.join("hls.js/dist/hls.min.js");
    let dash = modules.join("dashjs/dist/modern/umd/dash.all.min.js");
    let js = "text/javascript";
    Router::new()
        .route(
            "/player.html",
            get(move || async move { file_response(&page, "text/html; charset=utf-8") }),
        )
        .route(
            "/assets/cmsd-hls.js",
            // The snippet as the steering service serves it at /steering/cmsd-hls.js.
            get(move || async move {
                ([(header::CONTENT_TYPE, js)], multicdn::service::CMSD_HLS_JS).into_response()
            }),
        )
        .route(
            "/lib/hls.min.js",
            get(move || async move { file_response(&hls, js) }),
        )
        .route(
            "/lib/dash.all.min.js",
            get(move || async move { file_response(&dash, js) }),
        )
        .route(
            "/control/{action}",
            post(
                move |State(current): State<Current>, UrlPath(action): UrlPath<String>| async move {
                    let lab = current.lock().unwrap().clone();
                    let Some(lab) = lab else {
                        return (StatusCode::CONFLICT, "no scenario is running\n".to_owned());
                    };
                    match lab.control(&action).await {
                        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
                        Err(e) => (StatusCode::BAD_REQUEST, e),
                    }
                },
            ),
        )
        .with_state(current)
}

// ---------------------------------------------------------------------------------------------
// Driving the page

/// The steps that open the player page and wait until both players play from `fastly`.
fn open(page: &str, steering: &str, a_host: &str) -> Vec<Value> {
    let hls = format!("{steering}/manifests/hls/master.m3u8");
    let dash = format!("{steering}/manifests/dash/manifest.mpd");
    let url = format!(
        "{page}/player.html?hls={}&dash={}",
        urlencode(&hls),
        urlencode(&dash)
    );
    vec![
        json!({"goto": url}),
        json!({
            "wait_fn": format!(
                "player.hls && player.dash && !player.hls.error && !player.dash.error && \
                 player.hls.host === '{a_host}' && player.dash.host === '{a_host}' && \
                 player.hls.time > 0.5 && player.dash.time > 0.5"
            ),
            "timeout_ms": 20000,
            "soft": true,
        }),
    ]
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A JS expression: the ms from `window[since]` to the first video segment of each player that
/// matches `cond` (a JS predicate on a segment `s`), as `[hls, dash]` (null when none).
fn first_after(since: &str, cond: &str) -> String {
    format!(
        "['hls', 'dash'].map((k) => {{ const x = player[k].segments.find((s) => \
         s.type === 'video' && s.at >= window.{since} && ({cond})); return x ? x.at - window.{since} : null; }})"
    )
}

fn both(cond: &str, since: &str) -> String {
    format!(
        "['hls', 'dash'].every((k) => !player[k].error && player[k].segments.some((s) => \
         s.type === 'video' && s.at >= window.{since} && ({cond})))"
    )
}

/// The state a scenario ends with, for the assertions and the failure messages.
const SUMMARY: &str = "JSON.stringify(['hls', 'dash'].map((k) => ({ player: k, error: player[k].error, \
     time: player[k].time, cap: player[k].cap, mb: player[k].mb, estimate: player[k].estimate, failovers: player[k].failovers, \
     video: player[k].segments.filter((s) => s.type === 'video').map((s) => [s.host, s.height, s.at]) })))";

/// The summary a scenario ends with (the last step's value), parsed.
fn summary_of(v: &[&Value]) -> Value {
    serde_json::from_str(v[v.len() - 1].as_str().unwrap()).unwrap()
}

/// The segments a player gave up on one pathway and loaded from the next, by player.
fn failovers(summary: &Value) -> Vec<(String, Vec<String>)> {
    summary
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let urls = s["failovers"].as_array().unwrap();
            (
                s["player"].as_str().unwrap().to_owned(),
                urls.iter()
                    .map(|u| u.as_str().unwrap().to_owned())
                    .collect(),
            )
        })
        .collect()
}

/// No player gave up on a segment: nothing in the scenario failed.
fn assert_no_failovers(summary: &Value, what: &str) {
    for (player, urls) in failovers(summary) {
        assert!(urls.is_empty(), "{what}: {player} gave up on {urls:?}");
    }
}

fn ms(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap_or(f64::NAN))
        .collect()
}

/// The console errors of a run, less what `allowed` accepts.
fn console_errors<'a>(result: &'a Value, allowed: &dyn Fn(&str) -> bool) -> Vec<&'a str> {
    result["console_errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .filter(|t| !allowed(t))
        .collect()
}

fn assert_clean(result: &Value, what: &str, allowed: &dyn Fn(&str) -> bool) {
    assert_eq!(
        result["page_errors"].as_array().unwrap().len(),
        0,
        "{what}: the page threw: {}",
        result["page_errors"]
    );
    let errors = console_errors(result, allowed);
    assert!(errors.is_empty(), "{what}: console errors: {errors:?}");
}

fn job(steps: Vec<Value>) -> Value {
    // Not strict: a 503 from a down edge is a console error in Chromium; each scenario says
    // which console errors it accepts.
    json!({"timeout_ms": 60000, "strict": false, "steps": steps})
}

// ---------------------------------------------------------------------------------------------
// The scenarios

/// What the scenarios share.
struct Run {
    bench: Bench,
    current: Current,
    driver: PathBuf,
    page: String,
    switch_bound: f64,
}

impl Run {
    /// A fresh lab, made the current one.
    async fn lab(&self) -> Arc<Lab> {
        let lab = self.bench.lab().await;
        *self.current.lock().unwrap() = Some(lab.clone());
        lab
    }

    /// Both players switched within the bound: `switch` is their times (ms), `summary` what
    /// they fetched, for the failure message.
    async fn assert_switched(&self, lab: &Lab, what: &str, switch: &[f64], summary: &Value) {
        let why = lab.diagnose().await;
        for (player, ms) in ["hls.js", "dash.js"].iter().zip(switch) {
            assert!(
                *ms <= self.switch_bound,
                "{player} took {ms} ms {what} (bound {} ms): {summary}{why}",
                self.switch_bound
            );
        }
    }

    /// Opens the page on `lab`'s manifests, runs `steps`, and returns the result; a wait that
    /// timed out fails the scenario with what both players did and what the service said.
    async fn play(&self, lab: &Lab, what: &str, steps: Vec<Value>) -> Value {
        let mut all = open(&self.page, &lab.steering, &lab.host(0));
        all.extend(steps);
        all.push(json!({"eval": SUMMARY}));
        let result = drive(&self.driver, job(all)).await;
        let steps = result["steps"].as_array().unwrap();
        if let Some(waited) = steps.iter().find(|s| s["timed_out"] == json!(true)) {
            panic!(
                "{what}: waited in vain for {}\nthe players: {}\nthe page's errors: {} {}{}",
                waited["wait_fn"],
                steps.last().unwrap()["value"],
                result["console_errors"],
                result["page_errors"],
                lab.diagnose().await
            );
        }
        result
    }
}

/// a. An operator pins everyone to `cloudflare`; the next round's plan prefers it.
async fn plan_change(run: &Run) {
    let lab = run.lab().await;
    let (a_host, b_host) = (lab.host(0), lab.host(1));
    let t = Instant::now();
    let result = run
        .play(
            &lab,
            "a. plan change",
            vec![
                json!({"eval": "control('pin-b').then((t) => { window.t0 = t; return t; })"}),
                json!({"wait_fn": both(&format!("s.host === '{b_host}'"), "t0"), "timeout_ms": 15000, "soft": true}),
                json!({"eval": first_after("t0", &format!("s.host === '{b_host}'"))}),
                json!({"sleep_ms": 2500}),
            ],
        )
        .await;
    let v = evals(&result);
    let switch = ms(v[1]);
    let summary = summary_of(&v);
    println!(
        "a. pin to cloudflare: hls.js on it after {:.0} ms, dash.js after {:.0} ms \
         (bound {:.0} ms = TTL {} s + segment {} s + slack {} s); page {:.1} s",
        switch[0],
        switch[1],
        run.switch_bound,
        TTL.as_secs(),
        SEGMENT.as_secs(),
        SLACK.as_secs(),
        t.elapsed().as_secs_f64()
    );
    assert_clean(&result, "plan change", &|_| false);
    assert_no_failovers(&summary, "plan change");
    run.assert_switched(&lab, "to follow the plan", &switch, &summary)
        .await;
    // Before the pin every video segment came from fastly; after the switch, every one from
    // cloudflare.
    let t0 = v[0].as_f64().unwrap();
    for (s, switched) in summary.as_array().unwrap().iter().zip(&switch) {
        for seg in s["video"].as_array().unwrap() {
            let (host, at) = (seg[0].as_str().unwrap(), seg[2].as_f64().unwrap());
            if at < t0 {
                assert_eq!(host, a_host, "{} before the pin: {s}", s["player"]);
            } else if at > t0 + switched {
                assert_eq!(host, b_host, "{} after its switch: {s}", s["player"]);
            }
        }
    }
    let journal = lab.controller.journal().await;
    assert!(
        format!("{journal:?}").contains("cloudflare is faster for everyone"),
        "the journal says why the plan changed"
    );
}

/// b. `fastly` dies mid-play; the monitor marks it down and the service stops offering it.
async fn provider_dies(run: &Run) {
    let lab = run.lab().await;
    let (a_host, b_host) = (lab.host(0), lab.host(1));
    let a = lab.edges[0].0.clone();
    let refused_before = a.refused.load(Ordering::SeqCst);
    let t = Instant::now();
    let result = run
        .play(
            &lab,
            "b. fastly dies",
            vec![
                json!({"eval": "control('kill-a').then((t) => { window.t0 = t; return t; })"}),
                json!({"wait_fn": both(&format!("s.host === '{b_host}'"), "t0"), "timeout_ms": 15000, "soft": true}),
                json!({"eval": first_after("t0", &format!("s.host === '{b_host}'"))}),
                json!({"sleep_ms": 6000}),
                // Fetches from fastly after each player's first cloudflare segment.
                json!({"eval": format!(
                    "['hls', 'dash'].map((k) => {{ const segs = player[k].segments; \
                     const i = segs.findIndex((s) => s.at >= window.t0 && s.host === '{b_host}'); \
                     return segs.slice(i).filter((s) => s.host === '{a_host}').map((s) => s.url); }})"
                )}),
            ],
        )
        .await;
    let v = evals(&result);
    let switch = ms(v[1]);
    let back = v[2].as_array().unwrap();
    let summary = summary_of(&v);
    let ledger = lab.controller.ledger().await;
    let down = ledger
        .health()
        .get(&p(A))
        .is_some_and(|h| h.state == HealthState::Down);
    println!(
        "b. fastly dies (503 to everything): hls.js on cloudflare after {:.0} ms, dash.js after \
         {:.0} ms; fastly refused {} requests; marked down: {down}; page {:.1} s",
        switch[0],
        switch[1],
        a.refused.load(Ordering::SeqCst) - refused_before,
        t.elapsed().as_secs_f64()
    );
    let a_origin = lab.edges[0].1.clone();
    assert_clean(&result, "fastly dies", &|text| {
        text.contains("503") || text.contains(&a_origin)
    });
    assert!(down, "the monitor marked fastly down: {ledger:?}");
    // dash.js gives up on a segment it was loading when fastly died (its retries go to the same
    // URL) and loads it from cloudflare; it gives up on nothing else.
    for (player, urls) in failovers(&summary) {
        assert!(
            urls.iter().all(|u| u.starts_with(&a_origin)),
            "{player} gave up on a segment that is not fastly's: {urls:?}"
        );
    }
    run.assert_switched(&lab, "to leave fastly", &switch, &summary)
        .await;
    for (player, urls) in ["hls.js", "dash.js"].iter().zip(back) {
        assert_eq!(
            urls.as_array().unwrap().len(),
            0,
            "{player} went back to fastly: {urls}"
        );
    }
    // The service no longer offers fastly.
    let body: Value = reqwest::get(format!("{}/steering/hls.json", lab.steering))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["PATHWAY-PRIORITY"], json!([B]), "{body}");
}

/// c. The edges cap at the low rung, then lift the cap.
async fn quality_cap(run: &Run, low: (u32, u32), high: (u32, u32)) {
    let lab = run.lab().await;
    let t = Instant::now();
    let result = run
        .play(
            &lab,
            "c. quality cap",
            vec![
                // dash.js applies mb only where its throughput rule decides, and that rule
                // decides nothing before dash.js has a throughput estimate.
                json!({
                    "wait_fn": format!(
                        "player.hls.height === {h} && player.dash.height === {h} && \
                         player.dash.estimate !== null",
                        h = high.1
                    ),
                    "timeout_ms": 20000,
                    "soft": true,
                }),
                json!({"eval": "control('cap-low').then((t) => { window.t1 = t; return t; })"}),
                json!({"wait_fn": both(&format!("s.height === {}", low.1), "t1"), "timeout_ms": 20000, "soft": true}),
                json!({"eval": first_after("t1", &format!("s.height === {}", low.1))}),
                json!({"eval": "control('cap-lift').then((t) => { window.t2 = t; return t; })"}),
                // ABR climbs back at its own pace (dash.js's throughput rule has taken up to 18 s here).
                json!({"wait_fn": both(&format!("s.height === {}", high.1), "t2"), "timeout_ms": 30000, "soft": true}),
                json!({"eval": first_after("t2", &format!("s.height === {}", high.1))}),
                json!({"eval": "[player.hls.cap, player.hls.mb]"}),
            ],
        )
        .await;
    let v = evals(&result);
    let (down, up) = (ms(v[1]), ms(v[3]));
    println!(
        "c. cap at {}p (mb={}): hls.js on it after {:.0} ms, dash.js after {:.0} ms; \
         lift (mb={}): hls.js back on {}p after {:.0} ms, dash.js after {:.0} ms; \
         hls.js autoLevelCapping/mb at the end: {}; page {:.1} s",
        low.1,
        low.0,
        down[0],
        down[1],
        high.0,
        high.1,
        up[0],
        up[1],
        v[4],
        t.elapsed().as_secs_f64()
    );
    assert_clean(&result, "quality cap", &|_| false);
    assert_no_failovers(&summary_of(&v), "quality cap");
    assert_eq!(
        v[4],
        &json!([-1, high.0]),
        "the lift leaves hls.js uncapped"
    );
}

/// d. Hostile and empty reports and a flood of idle connections while the players play.
async fn hostile(run: &Run) {
    let lab = run.lab().await;
    let t = Instant::now();
    let before = lab.players().len();
    let started = Instant::now();
    let result = run
        .play(
            &lab,
            "d. hostile clients",
            vec![
                json!({"eval": "control('hostile').then((t) => { window.t3 = t; window.v3 = [player.hls.time, player.dash.time]; return t; })"}),
                json!({
                    "wait_fn": "player.hls.time > window.v3[0] + 8 && player.dash.time > window.v3[1] + 8 \
                                && !player.hls.error && !player.dash.error",
                    "timeout_ms": 25000,
                    "soft": true,
                }),
                json!({"eval": both("true", "t3")}),
            ],
        )
        .await;
    let v = evals(&result);
    let task = lab.hostile.lock().unwrap().take();
    let hostile = task
        .expect("the page started no hostile clients")
        .await
        .unwrap();
    let players = lab.players();
    let during: Vec<&Seen> = players[before..]
        .iter()
        .filter(|s| s.at >= started)
        .collect();
    let stats = lab.service.stats();
    println!(
        "d. hostile requests answered {:?} ({} unanswered); idle connections closed {}, left \
         open {}; the players made {} steering requests meanwhile, statuses {:?}; service {stats:?}; \
         page {:.1} s",
        hostile.statuses,
        hostile.unanswered,
        hostile.idle_closed,
        hostile.idle_open,
        during.len(),
        during.iter().map(|s| s.status).collect::<BTreeSet<_>>(),
        t.elapsed().as_secs_f64()
    );
    assert_clean(&result, "hostile clients", &|_| false);
    assert_no_failovers(&summary_of(&v), "hostile clients");
    assert_eq!(hostile.unanswered, 0, "every hostile request is answered");
    assert_eq!(hostile.statuses.values().sum::<u64>(), 14 * 25);
    assert!(
        hostile.statuses.keys().all(|s| *s < 500),
        "a hostile request got a server error: {:?}",
        hostile.statuses
    );
    assert_eq!(hostile.idle_open, 0, "every idle connection was closed");
    assert_eq!(
        v[1],
        &json!(true),
        "both players went on fetching: {}",
        v[v.len() - 1]
    );
    assert!(
        during.iter().all(|s| s.status == 200),
        "a player's steering request failed: {during:?}"
    );
    // Both players kept reloading at the TTL's pace: none was put on the overload TTL.
    for family in ["hls", "dash"] {
        let n = during
            .iter()
            .filter(|s| s.path == format!("/steering/{family}.json"))
            .count();
        let expected = started.elapsed().as_secs_f64() / TTL.as_secs_f64();
        assert!(
            n as f64 >= expected / 2.0,
            "{family}: {n} steering requests in {:.1} s at TTL {} s",
            started.elapsed().as_secs_f64(),
            TTL.as_secs()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hls_js_and_dash_js_follow_content_steering_and_cmsd_quality_caps() {
    let Some(driver) = driver() else { return };
    let Some(media) = media() else { return };
    let modules = driver.parent().unwrap().join("node_modules");
    for lib in [
        "hls.js/dist/hls.min.js",
        "dashjs/dist/modern/umd/dash.all.min.js",
    ] {
        assert!(
            modules.join(lib).is_file(),
            "{} is missing: run npm ci in {}",
            lib,
            driver.parent().unwrap().display()
        );
    }
    let master = std::fs::read_to_string(media.join("master.m3u8")).unwrap();
    let rungs = rungs(&master);
    let (low, high) = (rungs[0], rungs[rungs.len() - 1]);
    let ladder = BitrateLadder::new(
        rungs
            .iter()
            .map(|(kbps, height)| (format!("{height}p"), *kbps)),
    )
    .unwrap();
    let policy = policy();
    let mut edges = Vec::new();
    for name in [A, B] {
        let edge = Arc::new(Edge {
            name,
            media: media.clone(),
            health: policy.health.expect.clone(),
            dead: AtomicBool::new(false),
            cap: QualityCap::new(name, ladder.clone()).unwrap(),
            segments: Mutex::new(BTreeMap::new()),
            refused: AtomicU64::new(0),
        });
        let base = listen(edge_router(edge.clone())).await;
        edges.push((edge, base));
    }
    let edges: [(Arc<Edge>, String); 2] = edges.try_into().unwrap();
    let origin = listen(origin_router(media.clone())).await;
    let current: Current = Arc::new(Mutex::new(None));
    let page = listen(page_router(current.clone(), modules)).await;
    let run = Run {
        bench: Bench {
            policy,
            edges: edges.clone(),
            origin,
            ladder,
        },
        current,
        driver,
        page,
        switch_bound: (TTL + SEGMENT + SLACK).as_millis() as f64,
    };
    let started = Instant::now();
    plan_change(&run).await;
    provider_dies(&run).await;
    quality_cap(&run, low, high).await;
    hostile(&run).await;
    for (e, _) in &edges {
        println!(
            "{} served segments {:?}",
            e.name,
            e.segments.lock().unwrap()
        );
    }
    println!(
        "browser time {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
}
