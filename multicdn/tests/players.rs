//! hls.js and dash.js in a real Chromium follow content steering and the edges' quality caps,
//! end to end on loopback.
//!
//! Two "CDN" origins (`cdn-a`, `cdn-b`: small axum servers) serve the same clip, made by
//! `tests/players/make-media.sh` with ffmpeg (two H.264 rungs and AAC in 2 s fMP4 segments,
//! HLS and DASH), count the segments they serve, answer 503 while "down" and add
//! `CMSD-Dynamic` while they cap the quality. A steering server answers the players' steering
//! requests with [`ContentSteering`] over the plan a [`ContentSteeringSteerer`] applies, and
//! serves the manifests tagged for steering (both pathways, the steering server's URI). A page
//! server serves `tests/players/player.html`, the two players from `tests/browser/node_modules`
//! and `src/service/assets/cmsd-hls.js`; the page plays HLS in hls.js and DASH in dash.js side
//! by side and POSTs `/control/<action>` to change the plan or the edges mid-play, so every
//! switch time is measured in the page against the moment the change was made.
//!
//! Scenarios, one page each, both players at once, steering TTL of 2 s:
//! - a plan preferring `cdn-a` then one preferring `cdn-b`: both fetch from `cdn-b` within
//!   TTL + one segment + slack of the change;
//! - `cdn-a` marked unavailable and answering 503: both move to `cdn-b` and stay;
//! - the edges cap at the low rung (`CMSD-Dynamic` `mb`): both drop to it; the top rung's `mb`
//!   (the explicit lift) brings the high rung back;
//! - other clients send the steering server a few hundred hostile or empty reports while the
//!   players play: every one is answered, none with a 5xx, and playback goes on.
//!
//! The browser is driven by `tests/browser/drive.mjs` like `browser.rs`. Without the driver,
//! Node, Chromium or ffmpeg the test says why and passes; with `CI` set it fails. The clip is
//! made once into `$CARGO_TARGET_TMPDIR/players-media` and kept while the script is unchanged.
//! `--nocapture` prints the measured switch times.
//!
//! The steering routes, the manifest tagging and the edges' CMSD headers are written here by
//! hand, each in its own function ([`steering_router`], [`tag_hls`], [`tag_dash`],
//! [`edge_headers`]), until the library's steering router and CMSD layer take their place.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Wall-clock time is what this test measures: the players run in real time.
#![allow(clippy::disallowed_methods)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use multicdn::core::{CohortId, CohortPlan, SystemClock, TOTAL_BP};
use multicdn::prelude::*;
use multicdn::steering::video::{
    BitrateLadder, Protocol, SteeringConfig, SteeringRequest, cmsd_dynamic,
};
use serde_json::{Value, json};
use support::browser::{drive, driver, evals};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The steering TTL the players get: short, so the test is quick.
const TTL: Duration = Duration::from_secs(2);
/// The clip's segment duration (make-media.sh).
const SEGMENT: Duration = Duration::from_secs(2);
/// What a switch may take on top of TTL + one segment: the steering round trip, the player's
/// scheduling of its next fragment, a loaded machine.
const SLACK: Duration = Duration::from_secs(3);
/// The pathways, as the plan, the manifests and the edges name them.
const A: &str = "cdn-a";
const B: &str = "cdn-b";

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

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
    let ffmpeg = Command::new("ffmpeg").arg("-version").output();
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
    let out = Command::new("bash")
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
// The edges

/// One CDN origin: serves the clip under `/hls/` and `/dash/`.
#[derive(Debug)]
struct Edge {
    name: &'static str,
    media: PathBuf,
    /// Answers 503 to everything while set.
    down: AtomicBool,
    /// The `mb` (kbps) of the `CMSD-Dynamic` it adds to segments; 0 for none.
    cap_kbps: AtomicU32,
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

/// What every edge response carries: CORS for the page's origin, and the header the players
/// need to see. The library's CMSD layer is to send the same.
fn cors(headers: &mut HeaderMap) {
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("CMSD-Dynamic"),
    );
}

/// The edge's quality cap on a segment response, by hand: `CMSD-Dynamic: "<edge>";mb=<kbps>;du`
/// from the library's [`cmsd_dynamic`], while a cap is set. To be replaced by
/// `multicdn::service::cmsd::CmsdLayer` once it lands.
fn edge_headers(edge: &Edge, headers: &mut HeaderMap) {
    let kbps = edge.cap_kbps.load(Ordering::SeqCst);
    if kbps > 0 {
        let value = cmsd_dynamic(edge.name, kbps).unwrap();
        headers.insert("cmsd-dynamic", HeaderValue::from_str(&value).unwrap());
    }
}

async fn edge_file(edge: &Edge, family: &'static str, file: &str) -> Response {
    let mut r = if edge.down.load(Ordering::SeqCst) {
        edge.refused.fetch_add(1, Ordering::SeqCst);
        (StatusCode::SERVICE_UNAVAILABLE, "down for the test\n").into_response()
    } else if file.is_empty()
        || file.starts_with('.')
        || !file
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        (StatusCode::NOT_FOUND, "no such file\n").into_response()
    } else {
        match std::fs::read(edge.media.join(file)) {
            Ok(bytes) => {
                let mut r = ([(header::CONTENT_TYPE, content_type(file))], bytes).into_response();
                if file.starts_with("chunk-") {
                    *edge.segments.lock().unwrap().entry(family).or_default() += 1;
                    edge_headers(edge, r.headers_mut());
                }
                r
            }
            Err(_) => (StatusCode::NOT_FOUND, "no such file\n").into_response(),
        }
    };
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    cors(r.headers_mut());
    r
}

fn edge_router(edge: Arc<Edge>) -> Router {
    let hls = edge.clone();
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
                let edge = edge.clone();
                async move { edge_file(&edge, "dash", &file).await }
            }),
        )
}

// ---------------------------------------------------------------------------------------------
// The steering server

/// Where the players find things.
#[derive(Debug, Clone)]
struct Hosts {
    steering: String,
    a: String,
    b: String,
}

/// The steering server's state: the handler, the clip, and what the players reported.
struct Steering {
    handler: ContentSteering,
    media: PathBuf,
    hosts: Hosts,
    /// Requests from the players (not the hostile clients): (protocol, status, rejected report).
    players: Mutex<Vec<(Protocol, u16, Option<String>)>>,
    /// Requests from the hostile clients, by status.
    hostile: Mutex<BTreeMap<u16, u64>>,
}

/// The multivariant playlist tagged for content steering, by hand: every variant and audio
/// rendition once per pathway, with `PATHWAY-ID` and its own audio group, pointing at that
/// pathway's edge; `#EXT-X-CONTENT-STEERING` names the steering server and the first pathway.
/// To be replaced by the library's `/manifests/{*path}` once it lands.
fn tag_hls(master: &str, hosts: &Hosts) -> String {
    let mut head = Vec::new();
    let mut body = Vec::new();
    for line in master.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("#EXT-X-MEDIA:") || line.starts_with("#EXT-X-STREAM-INF:") {
            body.push(line);
        } else if line.starts_with('#') {
            if body.is_empty() {
                head.push(line.to_owned());
            }
        } else {
            body.push(line);
        }
    }
    head.push(format!(
        "#EXT-X-CONTENT-STEERING:SERVER-URI=\"{}/steering/hls.json\",PATHWAY-ID=\"{A}\"",
        hosts.steering
    ));
    for (pathway, origin) in [(A, &hosts.a), (B, &hosts.b)] {
        for line in &body {
            let line = if let Some(attrs) = line.strip_prefix("#EXT-X-MEDIA:") {
                let group = attr(attrs, "GROUP-ID").unwrap();
                let uri = attr(attrs, "URI").unwrap();
                format!(
                    "#EXT-X-MEDIA:{}",
                    attrs
                        .replacen(
                            &format!("GROUP-ID=\"{group}\""),
                            &format!("GROUP-ID=\"{group}-{pathway}\""),
                            1
                        )
                        .replacen(
                            &format!("URI=\"{uri}\""),
                            &format!("URI=\"{origin}/hls/{uri}\""),
                            1
                        )
                )
            } else if let Some(attrs) = line.strip_prefix("#EXT-X-STREAM-INF:") {
                let audio = attr(attrs, "AUDIO").unwrap();
                format!(
                    "#EXT-X-STREAM-INF:{},PATHWAY-ID=\"{pathway}\"",
                    attrs.replacen(
                        &format!("AUDIO=\"{audio}\""),
                        &format!("AUDIO=\"{audio}-{pathway}\""),
                        1
                    )
                )
            } else {
                format!("{origin}/hls/{line}")
            };
            head.push(line);
        }
    }
    head.join("\n") + "\n"
}

/// The MPD tagged for content steering, by hand: a `BaseURL` per pathway (`serviceLocation`)
/// and `<ContentSteering>` naming the steering server, queried before playback starts. To be
/// replaced by the library's `/manifests/{*path}` once it lands.
fn tag_dash(mpd: &str, hosts: &Hosts) -> String {
    let at = mpd.find("<Period").expect("the MPD has no Period");
    let tags = format!(
        "<ContentSteering defaultServiceLocation=\"{A}\" queryBeforeStart=\"true\">{}/steering/dash.json</ContentSteering>\n\
         \t<BaseURL serviceLocation=\"{A}\">{}/dash/</BaseURL>\n\
         \t<BaseURL serviceLocation=\"{B}\">{}/dash/</BaseURL>\n\t",
        hosts.steering, hosts.a, hosts.b
    );
    format!("{}{tags}{}", &mpd[..at], &mpd[at..])
}

fn steering_answer(state: &Steering, protocol: Protocol, query: &str, hostile: bool) -> Response {
    let request = SteeringRequest::from_query_string(protocol, query, Vec::new());
    let r = state.handler.handle(&request, SystemClock.now());
    if hostile {
        *state.hostile.lock().unwrap().entry(r.status).or_default() += 1;
    } else {
        state.players.lock().unwrap().push((
            protocol,
            r.status,
            r.rejected.as_ref().map(ToString::to_string),
        ));
    }
    let mut headers = HeaderMap::new();
    for (k, v) in &r.headers {
        headers.insert(
            HeaderName::try_from(k.as_str()).unwrap(),
            HeaderValue::try_from(v.as_str()).unwrap(),
        );
    }
    cors(&mut headers);
    (StatusCode::from_u16(r.status).unwrap(), headers, r.body).into_response()
}

fn manifest(state: &Steering, file: &str) -> Response {
    let read = |name: &str| std::fs::read_to_string(state.media.join(name)).unwrap();
    let tagged = match file {
        "hls/master.m3u8" => tag_hls(&read("master.m3u8"), &state.hosts),
        "dash/manifest.mpd" => tag_dash(&read("manifest.mpd"), &state.hosts),
        _ => return (StatusCode::NOT_FOUND, "no such manifest\n").into_response(),
    };
    let kind = content_type(file);
    let mut r = ([(header::CONTENT_TYPE, kind)], tagged).into_response();
    cors(r.headers_mut());
    r
}

/// The steering routes, by hand around the library's [`ContentSteering`] handler:
/// `/steering/hls.json`, `/steering/dash.json` (CORS `*`) and `/manifests/{*path}`. A request
/// with `x-hostile` is counted apart from the players'. To be replaced by
/// `multicdn::service::steering`'s router once it lands.
fn steering_router(state: Arc<Steering>) -> Router {
    let (hls, dash, manifests) = (state.clone(), state.clone(), state);
    Router::new()
        .route(
            "/steering/hls.json",
            get(move |RawQuery(q): RawQuery, h: HeaderMap| {
                let s = hls.clone();
                async move {
                    let hostile = h.contains_key("x-hostile");
                    steering_answer(&s, Protocol::Hls, q.as_deref().unwrap_or(""), hostile)
                }
            }),
        )
        .route(
            "/steering/dash.json",
            get(move |RawQuery(q): RawQuery, h: HeaderMap| {
                let s = dash.clone();
                async move {
                    let hostile = h.contains_key("x-hostile");
                    steering_answer(&s, Protocol::Dash, q.as_deref().unwrap_or(""), hostile)
                }
            }),
        )
        .route(
            "/manifests/{*path}",
            get(move |UrlPath(path): UrlPath<String>| {
                let s = manifests.clone();
                async move { manifest(&s, &path) }
            }),
        )
}

// ---------------------------------------------------------------------------------------------
// The page server and the lab the page controls

/// Everything `/control/<action>` may change.
struct Lab {
    steerer: ContentSteeringSteerer,
    plan: SharedPlan,
    a: Arc<Edge>,
    b: Arc<Edge>,
    ladder: BitrateLadder,
    steering_url: String,
    hostile: Mutex<Option<JoinHandle<usize>>>,
}

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

/// Everyone on `first`, the other pathway as the fallback.
fn plan(first: &str) -> SteeringPlan {
    let other = if first == A { B } else { A };
    SteeringPlan {
        record: "video.example.com".into(),
        ttl: TTL,
        cohorts: vec![CohortPlan {
            cohort: CohortId::new("everyone").unwrap(),
            networks: ["*".parse().unwrap()].into(),
            weights: Weights::new([(p(first), TOTAL_BP), (p(other), 0)]).unwrap(),
        }],
    }
}

impl Lab {
    async fn prefer(&self, first: &str) {
        self.steerer
            .apply(&plan(first), &ApplyOptions::default())
            .await
            .unwrap();
    }

    fn cap(&self, kbps: u32) {
        for edge in [&self.a, &self.b] {
            edge.cap_kbps.store(kbps, Ordering::SeqCst);
        }
    }

    /// Back to the start: everyone on `cdn-a`, both edges up, no cap.
    async fn reset(&self) {
        self.prefer(A).await;
        self.plan.set_unavailable(BTreeSet::new());
        self.a.down.store(false, Ordering::SeqCst);
        self.b.down.store(false, Ordering::SeqCst);
        self.cap(0);
    }

    async fn control(&self, action: &str) -> Result<(), String> {
        let rungs = self.ladder.rungs();
        match action {
            "prefer-a" => self.prefer(A).await,
            "prefer-b" => self.prefer(B).await,
            "down-a" => {
                self.plan.set_unavailable([p(A)].into());
                self.a.down.store(true, Ordering::SeqCst);
            }
            // The ladder is kept highest first.
            "cap-low" => self.cap(rungs[rungs.len() - 1].kbps),
            "cap-lift" => self.cap(rungs[0].kbps),
            "hostile" => {
                let url = self.steering_url.clone();
                *self.hostile.lock().unwrap() = Some(tokio::spawn(hostile_clients(url)));
            }
            _ => return Err(format!("unknown action {action}")),
        }
        Ok(())
    }
}

/// The steering server's other clients: a few hundred requests with empty throughputs,
/// malformed and hostile query strings. Returns how many were answered.
async fn hostile_clients(steering: String) -> usize {
    let long = "x".repeat(4000);
    let many = vec!["cdn-a"; 40].join(",");
    let queries = [
        "_HLS_pathway=cdn-a&_HLS_throughput=".to_owned(),
        "_HLS_pathway=cdn-a,cdn-b&_HLS_throughput=,".to_owned(),
        "_DASH_pathway=%22cdn-a,cdn-b%22&_DASH_throughput=,5000000".to_owned(),
        "_DASH_pathway=&_DASH_throughput=".to_owned(),
        "_HLS_throughput=NaN&_HLS_pathway=cdn-a".to_owned(),
        "_HLS_pathway=cdn-a&_HLS_throughput=-1e308".to_owned(),
        "_HLS_pathway=%00%ff%fe&_HLS_throughput=1".to_owned(),
        "session=../../etc/passwd&version=-1".to_owned(),
        "session=%zz%&&&==&_HLS_pathway".to_owned(),
        format!("session={long}&_HLS_pathway={long}&_HLS_throughput=1"),
        format!("_HLS_pathway={many}&_HLS_throughput=1"),
        "_HLS_pathway=cdn-a&_HLS_pathway=cdn-b&_HLS_throughput=1&_HLS_throughput=x".to_owned(),
        "%3Cscript%3Ealert(1)%3C/script%3E=1".to_owned(),
        String::new(),
    ];
    let client = reqwest::Client::new();
    let mut answered = 0;
    for round in 0..25 {
        for (i, q) in queries.iter().enumerate() {
            let family = if (round + i) % 2 == 0 { "hls" } else { "dash" };
            let r = client
                .get(format!("{steering}/steering/{family}.json?{q}"))
                .header("x-hostile", "1")
                .send()
                .await;
            if r.is_ok() {
                answered += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    answered
}

fn file_response(path: &Path, kind: &'static str) -> Response {
    match std::fs::read(path) {
        Ok(bytes) => ([(header::CONTENT_TYPE, kind)], Body::from(bytes)).into_response(),
        Err(e) => (StatusCode::NOT_FOUND, format!("{}: {e}\n", path.display())).into_response(),
    }
}

fn page_router(lab: Arc<Lab>, modules: PathBuf) -> Router {
    let dir = Path::new(MANIFEST_DIR);
    let page = dir.join("tests/players/player.html");
    let cmsd = dir.join("src/service/assets/cmsd-hls.js");
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
            get(move || async move { file_response(&cmsd, js) }),
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
                move |State(lab): State<Arc<Lab>>, UrlPath(action): UrlPath<String>| async move {
                    match lab.control(&action).await {
                        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
                        Err(e) => (StatusCode::BAD_REQUEST, e),
                    }
                },
            ),
        )
        .with_state(lab)
}

async fn serve(router: Router) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, router).await.unwrap() });
    base
}

// ---------------------------------------------------------------------------------------------
// Driving the page

/// The steps that open the player page and wait until both players play from `cdn-a`.
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
     time: player[k].time, cap: player[k].cap, mb: player[k].mb, \
     video: player[k].segments.filter((s) => s.type === 'video').map((s) => [s.host, s.height, s.at]) })))";

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "not finished: in scenario a at least one of the players does not reach cdn-b within 15 s \
            of the plan change (players start on cdn-a and play); run with --ignored"]
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

    let edge = |name| {
        Arc::new(Edge {
            name,
            media: media.clone(),
            down: AtomicBool::new(false),
            cap_kbps: AtomicU32::new(0),
            segments: Mutex::new(BTreeMap::new()),
            refused: AtomicU64::new(0),
        })
    };
    let (a, b) = (edge(A), edge(B));
    let a_base = serve(edge_router(a.clone())).await;
    let b_base = serve(edge_router(b.clone())).await;
    let a_host = a_base.trim_start_matches("http://").to_owned();
    let b_host = b_base.trim_start_matches("http://").to_owned();

    let shared = SharedPlan::new();
    let steerer = ContentSteeringSteerer::new(p("content-steering"), shared.clone())
        .with_known_pathways(vec![p(A), p(B)]);
    let config = SteeringConfig::default()
        .ttl(TTL)
        .reload_uris("/steering/hls.json", "/steering/dash.json");
    let steering_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let steering_base = format!("http://{}", steering_l.local_addr().unwrap());
    let steering = Arc::new(Steering {
        handler: ContentSteering::new(config, shared.clone()),
        media: media.clone(),
        hosts: Hosts {
            steering: steering_base.clone(),
            a: a_base.clone(),
            b: b_base.clone(),
        },
        players: Mutex::new(Vec::new()),
        hostile: Mutex::new(BTreeMap::new()),
    });
    let router = steering_router(steering.clone());
    tokio::spawn(async move { axum::serve(steering_l, router).await.unwrap() });

    let lab = Arc::new(Lab {
        steerer,
        plan: shared.clone(),
        a: a.clone(),
        b: b.clone(),
        ladder,
        steering_url: steering_base.clone(),
        hostile: Mutex::new(None),
    });
    let page = serve(page_router(lab.clone(), modules)).await;
    let no_errors = |_: &str| false;
    let switch_bound = (TTL + SEGMENT + SLACK).as_millis() as f64;
    let started = Instant::now();

    // a. A plan preferring cdn-a, then one preferring cdn-b.
    lab.reset().await;
    let mut steps = open(&page, &steering_base, &a_host);
    steps.extend([
        json!({"eval": "control('prefer-b').then((t) => { window.t0 = t; return t; })"}),
        json!({"wait_fn": both(&format!("s.host === '{b_host}'"), "t0"), "timeout_ms": 15000}),
        json!({"eval": first_after("t0", &format!("s.host === '{b_host}'"))}),
        json!({"sleep_ms": 2500}),
        json!({"eval": first_after("t0", "true")}),
        json!({"eval": SUMMARY}),
    ]);
    let t = Instant::now();
    let result = drive(&driver, job(steps)).await;
    let v = evals(&result);
    let switch = ms(v[1]);
    let summary: Value = serde_json::from_str(v[3].as_str().unwrap()).unwrap();
    println!(
        "a. plan change cdn-a -> cdn-b: hls.js on cdn-b after {:.0} ms, dash.js after {:.0} ms \
         (bound {switch_bound:.0} ms = TTL {} s + segment {} s + slack {} s); page {:.1} s",
        switch[0],
        switch[1],
        TTL.as_secs(),
        SEGMENT.as_secs(),
        SLACK.as_secs(),
        t.elapsed().as_secs_f64()
    );
    assert_clean(&result, "plan change", &no_errors);
    for (player, ms) in ["hls.js", "dash.js"].iter().zip(&switch) {
        assert!(
            *ms <= switch_bound,
            "{player} took {ms} ms to follow the plan (bound {switch_bound} ms): {summary}"
        );
    }
    // Before the change every video segment came from cdn-a; well after it, every one from cdn-b.
    for s in summary.as_array().unwrap() {
        let t0 = v[0].as_f64().unwrap();
        for seg in s["video"].as_array().unwrap() {
            let (host, at) = (seg[0].as_str().unwrap(), seg[2].as_f64().unwrap());
            if at < t0 {
                assert_eq!(host, a_host, "{} before the change: {s}", s["player"]);
            } else if at > t0 + switch_bound + 500.0 {
                assert_eq!(host, b_host, "{} after the change: {s}", s["player"]);
            }
        }
    }

    // b. cdn-a unavailable and answering 503.
    lab.reset().await;
    let refused_before = a.refused.load(Ordering::SeqCst);
    let mut steps = open(&page, &steering_base, &a_host);
    steps.extend([
        json!({"eval": "control('down-a').then((t) => { window.t0 = t; return t; })"}),
        json!({"wait_fn": both(&format!("s.host === '{b_host}'"), "t0"), "timeout_ms": 15000}),
        json!({"eval": first_after("t0", &format!("s.host === '{b_host}'"))}),
        json!({"sleep_ms": 5000}),
        // Requests to cdn-a after each player's first cdn-b segment.
        json!({"eval": format!(
            "['hls', 'dash'].map((k) => {{ const segs = player[k].segments; \
             const i = segs.findIndex((s) => s.at >= window.t0 && s.host === '{b_host}'); \
             return segs.slice(i).filter((s) => s.host === '{a_host}').map((s) => s.url); }})"
        )}),
        json!({"eval": "['hls', 'dash'].map((k) => player[k].time)"}),
        json!({"eval": SUMMARY}),
    ]);
    let t = Instant::now();
    let result = drive(&driver, job(steps)).await;
    let v = evals(&result);
    let switch = ms(v[1]);
    let back = v[2].as_array().unwrap();
    let summary = v[4];
    println!(
        "b. cdn-a down (unavailable + 503): hls.js on cdn-b after {:.0} ms, dash.js after {:.0} ms; \
         cdn-a refused {} requests; page {:.1} s",
        switch[0],
        switch[1],
        a.refused.load(Ordering::SeqCst) - refused_before,
        t.elapsed().as_secs_f64()
    );
    let a_origin = a_base.clone();
    assert_clean(&result, "cdn-a down", &|text| {
        text.contains("503") || text.contains(&a_origin)
    });
    for (player, ms) in ["hls.js", "dash.js"].iter().zip(&switch) {
        assert!(
            *ms <= switch_bound,
            "{player} took {ms} ms to leave cdn-a (bound {switch_bound} ms): {summary}"
        );
    }
    for (player, urls) in ["hls.js", "dash.js"].iter().zip(back) {
        assert_eq!(
            urls.as_array().unwrap().len(),
            0,
            "{player} went back to cdn-a: {urls}"
        );
    }
    lab.reset().await;

    // c. The edges cap at the low rung, then lift the cap.
    let mut steps = open(&page, &steering_base, &a_host);
    steps.extend([
        json!({
            "wait_fn": format!(
                "player.hls.height === {h} && player.dash.height === {h}",
                h = high.1
            ),
            "timeout_ms": 20000,
        }),
        json!({"eval": "control('cap-low').then((t) => { window.t1 = t; return t; })"}),
        json!({"wait_fn": both(&format!("s.height === {}", low.1), "t1"), "timeout_ms": 20000}),
        json!({"eval": first_after("t1", &format!("s.height === {}", low.1))}),
        json!({"eval": "control('cap-lift').then((t) => { window.t2 = t; return t; })"}),
        json!({"wait_fn": both(&format!("s.height === {}", high.1), "t2"), "timeout_ms": 20000}),
        json!({"eval": first_after("t2", &format!("s.height === {}", high.1))}),
        json!({"eval": "[player.hls.cap, player.hls.mb]"}),
        json!({"eval": SUMMARY}),
    ]);
    let t = Instant::now();
    let result = drive(&driver, job(steps)).await;
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
    assert_clean(&result, "quality cap", &no_errors);
    assert_eq!(
        v[4],
        &json!([-1, high.0]),
        "the lift leaves hls.js uncapped"
    );
    lab.reset().await;

    // d. Hostile and empty reports from other clients while the players play.
    let mut steps = open(&page, &steering_base, &a_host);
    steps.extend([
        json!({"eval": "control('hostile').then((t) => { window.t3 = t; window.v3 = [player.hls.time, player.dash.time]; return t; })"}),
        json!({
            "wait_fn": "player.hls.time > window.v3[0] + 5 && player.dash.time > window.v3[1] + 5 \
                        && !player.hls.error && !player.dash.error",
            "timeout_ms": 20000,
        }),
        json!({"eval": both("true", "t3")}),
        json!({"eval": SUMMARY}),
    ]);
    let players_before = steering.players.lock().unwrap().len();
    let t = Instant::now();
    let result = drive(&driver, job(steps)).await;
    let v = evals(&result);
    let answered = lab
        .hostile
        .lock()
        .unwrap()
        .take()
        .expect("the page started no hostile clients");
    let answered = answered.await.unwrap();
    let hostile = steering.hostile.lock().unwrap().clone();
    let players = steering.players.lock().unwrap().clone();
    let during = &players[players_before..];
    println!(
        "d. {answered} hostile steering requests answered {hostile:?}; the players made {} \
         steering requests meanwhile, statuses {:?}; page {:.1} s",
        during.len(),
        during.iter().map(|(_, s, _)| *s).collect::<BTreeSet<_>>(),
        t.elapsed().as_secs_f64()
    );
    assert_clean(&result, "hostile clients", &no_errors);
    assert_eq!(answered, 14 * 25, "every hostile request is answered");
    assert!(
        hostile.keys().all(|s| *s < 500),
        "a hostile request got a server error: {hostile:?}"
    );
    assert_eq!(
        v[1],
        &json!(true),
        "both players went on fetching: {}",
        v[2]
    );
    assert!(
        during.iter().all(|(_, s, _)| *s == 200),
        "a player's steering request failed: {during:?}"
    );

    // What the handler made of the players' own reports, and what the edges served.
    let mut reports: BTreeMap<(String, Option<String>), u64> = BTreeMap::new();
    for (protocol, _, rejected) in &players {
        *reports
            .entry((format!("{protocol:?}"), rejected.clone()))
            .or_default() += 1;
    }
    for ((protocol, rejected), n) in &reports {
        match rejected {
            None => println!("{protocol}: {n} steering requests with a readable (or no) report"),
            Some(why) => {
                println!("{protocol}: {n} steering requests whose report was set aside: {why}")
            }
        }
    }
    for e in [&a, &b] {
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
    let hls_steering = players
        .iter()
        .filter(|(p, _, _)| *p == Protocol::Hls)
        .count();
    let dash_steering = players.len() - hls_steering;
    assert!(
        hls_steering > 0 && dash_steering > 0,
        "both players asked the steering server: {players:?}"
    );
}
