//! The content-steering routes over real HTTP on loopback: CORS for the site's origins (a
//! preflight answered), the plan followed live, the policy's TTL, lenient reports, per-client
//! limits through a trusted proxy, the incident switch behind its token on its own router, a
//! flood of idle connections that real players get past, and the CMSD layer's cap and lift.

#![cfg(feature = "service")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use multicdn::core::{
    ApplyOptions, CohortId, CohortPlan, NetworkKey, Policy, ProviderId, Steerer, SteeringPlan,
    Weights,
};
use multicdn::service::cmsd::QualityCap;
use multicdn::service::steering::SteeringService;
use multicdn::service::{ServeLimits, serve};
use multicdn::steering::video::{
    BitrateLadder, ContentSteeringSteerer, RateLimit, SharedPlan, SteeringConfig,
};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

const POLICY: &str = include_str!("../../examples/policy.yaml");
const PAGE: &str = "https://www.example.com";
const TOKEN: &str = "steering-admin-token-7d1f";

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

fn plan(weights: &[(&str, u32)]) -> SteeringPlan {
    SteeringPlan {
        record: "video".into(),
        ttl: Duration::from_secs(30),
        cohorts: vec![CohortPlan {
            cohort: CohortId::new("default").unwrap(),
            networks: NetworkKey::Global.into(),
            weights: Weights::new(weights.iter().map(|(id, bp)| (p(id), *bp))).unwrap(),
        }],
    }
}

struct Running {
    public: String,
    admin: String,
    steerer: ContentSteeringSteerer,
    service: SteeringService,
}

async fn listen(router: axum::Router, limits: ServeLimits) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = serve(l, router, limits, std::future::pending()).await;
    });
    addr
}

async fn start(config: SteeringConfig, limits: ServeLimits) -> Running {
    let shared = SharedPlan::new();
    let steerer = ContentSteeringSteerer::new(p("content-steering"), shared.clone());
    steerer
        .apply(
            &plan(&[("fastly", 9_000), ("cloudflare", 1_000)]),
            &ApplyOptions::default(),
        )
        .await
        .unwrap();
    let service = SteeringService::new(config, shared)
        .origins([PAGE])
        .trusted_proxies(["127.0.0.0/8".parse().unwrap()])
        .admin_token(TOKEN);
    let public = listen(service.router(), limits).await;
    let admin = listen(service.admin_router(), ServeLimits::default()).await;
    Running {
        public: format!("http://{public}"),
        admin: format!("http://{admin}"),
        steerer,
        service,
    }
}

fn policy_config() -> SteeringConfig {
    SteeringConfig::from_policy(&Policy::from_yaml(POLICY, "policy.yaml").unwrap())
}

async fn order(r: &Running, path: &str) -> (Vec<String>, u64) {
    let body: Value = reqwest::get(format!("{}{path}", r.public))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let order = body["PATHWAY-PRIORITY"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    (order, body["TTL"].as_u64().unwrap())
}

#[tokio::test]
async fn cors_is_answered_for_the_sites_origin_and_only_for_it() {
    let r = start(policy_config(), ServeLimits::default()).await;
    let c = reqwest::Client::new();
    let pre = c
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/steering/hls.json", r.public),
        )
        .header("Origin", PAGE)
        .header("Access-Control-Request-Method", "GET")
        .send()
        .await
        .unwrap();
    assert!(
        pre.status().is_success(),
        "preflight answered {}",
        pre.status()
    );
    assert_eq!(
        pre.headers()["access-control-allow-origin"]
            .to_str()
            .unwrap(),
        PAGE
    );
    let get = c
        .get(format!("{}/steering/dash.json", r.public))
        .header("Origin", PAGE)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(get.headers()["access-control-allow-origin"], PAGE);
    assert_eq!(get.headers()["cache-control"], "no-store");
    let other = c
        .get(format!("{}/steering/dash.json", r.public))
        .header("Origin", "https://elsewhere.example.net")
        .send()
        .await
        .unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn the_plan_is_followed_live_with_the_policys_ttl_and_a_short_one_around_changes() {
    let r = start(policy_config(), ServeLimits::default()).await;
    let (o, ttl) = order(&r, "/steering/hls.json?session=s1").await;
    assert_eq!(o[0], "fastly", "{o:?}");
    assert_eq!(ttl, 30, "steering.ttl of the policy");
    r.steerer
        .apply(
            &plan(&[("cloudflare", 10_000), ("fastly", 0)]),
            &ApplyOptions::default(),
        )
        .await
        .unwrap();
    let (o, ttl) = order(&r, "/steering/hls.json?session=s1").await;
    assert_eq!(o[0], "cloudflare", "the next request follows the new plan");
    assert_eq!(ttl, 10, "sessions come back soon after a change");
    // A provider the ledger has out is not offered at all.
    r.steerer
        .apply(
            &plan(&[("fastly", 5_000), ("cloudflare", 5_000)]),
            &ApplyOptions::default(),
        )
        .await
        .unwrap();
    r.steerer
        .shared_plan()
        .set_unavailable([p("fastly")].into());
    // (Ten sessions: the policy's per-client limit allows bursts of 20 from one address.)
    for s in 0..10 {
        let (o, _) = order(&r, &format!("/steering/dash.json?session=x{s}")).await;
        assert_eq!(o, ["cloudflare"], "{o:?}");
    }
    // The reload URI is relative and keeps the session.
    let body: Value = reqwest::get(format!("{}/steering/hls.json?session=abc", r.public))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        body["RELOAD-URI"]
            .as_str()
            .unwrap()
            .starts_with("hls.json?session=abc&version="),
        "{body}"
    );
}

#[tokio::test]
async fn empty_and_hostile_reports_never_cost_a_manifest() {
    let r = start(policy_config(), ServeLimits::default()).await;
    let c = reqwest::Client::new();
    let long = "x".repeat(6000);
    let queries = [
        "_DASH_pathway=fastly,cloudflare&_DASH_throughput=87231000,".to_owned(),
        "_DASH_pathway=%22fastly%22&_DASH_throughput=".to_owned(),
        "_DASH_pathway=<script>&_DASH_throughput=1e999".to_owned(),
        format!("_DASH_pathway={long}&_DASH_throughput=1"),
        "session=%00%ff&_DASH_pathway=,,,,&_DASH_throughput=,,,,".to_owned(),
        "_DASH_pathway=a&_DASH_pathway=b&_DASH_throughput=1&_DASH_throughput=x".to_owned(),
    ];
    for q in &queries {
        let resp = c
            .get(format!("{}/steering/dash.json?{q}", r.public))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{q}");
        let body: Value = resp.json().await.unwrap();
        assert!(body["PATHWAY-PRIORITY"].is_array(), "{q}: {body}");
    }
    let stats = r.service.stats();
    assert_eq!(stats.served, queries.len() as u64);
    // The empty values are not errors; the script tag and the long id are (a pair whose
    // pathway is refused is not read further; a repeated parameter counts its first value).
    assert_eq!(stats.rejected_reports, 2, "{stats:?}");
}

#[tokio::test]
async fn each_client_behind_the_proxy_has_its_own_limit_and_hls_is_never_refused() {
    let config = SteeringConfig::default().client_limit(RateLimit {
        per_second: 0.01,
        burst: 3,
    });
    let r = start(config, ServeLimits::default()).await;
    let c = reqwest::Client::new();
    let ask = |path: &'static str, client: &'static str| {
        let c = c.clone();
        let url = format!("{}{path}", r.public);
        async move {
            c.get(url)
                .header("X-Forwarded-For", client)
                .send()
                .await
                .unwrap()
        }
    };
    for _ in 0..3 {
        assert_eq!(
            ask("/steering/dash.json", "198.51.100.7").await.status(),
            200
        );
    }
    let refused = ask("/steering/dash.json", "198.51.100.7").await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    // hls.js gives up for good after a 429: a 200 with a long TTL instead.
    let hls = ask("/steering/hls.json", "198.51.100.7").await;
    assert_eq!(hls.status(), 200);
    let body: Value = hls.json().await.unwrap();
    assert_eq!(body["TTL"], 600);
    // Another client behind the same proxy is not held back.
    assert_eq!(
        ask("/steering/dash.json", "198.51.100.8").await.status(),
        200
    );
    assert_eq!(r.service.stats().limited, 2);
}

#[tokio::test]
async fn the_incident_switch_needs_the_token_and_is_not_on_the_players_port() {
    let r = start(policy_config(), ServeLimits::default()).await;
    let c = reqwest::Client::new();
    let on_public = c
        .post(format!("{}/admin/steering/incident", r.public))
        .send()
        .await
        .unwrap();
    assert_eq!(on_public.status(), 404, "players cannot reach the switch");
    let no_token = c
        .post(format!("{}/admin/steering/incident", r.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(no_token.status(), 401);
    let wrong = c
        .post(format!("{}/admin/steering/incident", r.admin))
        .bearer_auth("guess")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let on: Value = c
        .post(format!("{}/admin/steering/incident", r.admin))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(on["incident"], true);
    assert_eq!(order(&r, "/steering/hls.json").await.1, 10);
    let off = c
        .delete(format!("{}/admin/steering/incident", r.admin))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(off.status(), 200);
    assert_eq!(order(&r, "/steering/hls.json").await.1, 30);
}

/// The status a player's steering request gets, within 5 s.
async fn player_status(r: &Running) -> u16 {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .get(format!("{}/steering/hls.json", r.public))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn idle_connections_are_capped_and_timed_out_while_players_are_served() {
    let limits = ServeLimits::default()
        .max_connections(64)
        .header_timeout(Duration::from_millis(300));
    let r = start(policy_config(), limits).await;
    let addr = r.public.trim_start_matches("http://").to_owned();
    // 200 connections that send half a request and stall.
    let mut idle = Vec::new();
    for _ in 0..200 {
        if let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await {
            let _ = s
                .write_all(b"GET /steering/hls.json HTTP/1.1\r\nHost: x\r\n")
                .await;
            idle.push(s);
        }
    }
    // Past the header timeout, a player is answered.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(player_status(&r).await, 200);
    drop(idle);
}

#[tokio::test]
async fn the_hls_js_cmsd_snippet_is_served_beside_the_steering_routes() {
    let r = start(policy_config(), ServeLimits::default()).await;
    let resp = reqwest::Client::new()
        .get(format!("{}/steering/cmsd-hls.js", r.public))
        .header("Origin", PAGE)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert_eq!(resp.headers()["access-control-allow-origin"], PAGE);
    let body = resp.text().await.unwrap();
    assert_eq!(body, multicdn::service::CMSD_HLS_JS);
    assert!(body.contains("function multicdnCmsdHls(hls, Hls)"));
}

#[tokio::test]
async fn one_address_cannot_take_every_connection_slot() {
    use tokio::io::AsyncReadExt;
    let limits = ServeLimits::default()
        .max_connections(64)
        .per_client_connections(8)
        .header_timeout(Duration::from_secs(30));
    let r = start(policy_config(), limits).await;
    let addr: SocketAddr = r.public.trim_start_matches("http://").parse().unwrap();
    // Eight idle connections from 127.0.0.3 hold their slots (the header timeout is long)...
    let connect = || async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.3:0".parse().unwrap()).unwrap();
        let mut s = socket.connect(addr).await.unwrap();
        s.write_all(b"GET /steering/hls.json HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        s
    };
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(connect().await);
    }
    // ...so its ninth is answered 503 and closed at once,
    let mut ninth = connect().await;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), ninth.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("Retry-After: 1"), "{answer}");
    // while a player on another address is answered.
    assert_eq!(player_status(&r).await, 200);
    // A slot given back is free again for that address.
    drop(idle.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut again = connect().await;
    let mut buf = [0u8; 16];
    let waited = tokio::time::timeout(Duration::from_millis(500), again.read(&mut buf)).await;
    assert!(
        waited.is_err(),
        "the freed slot was given to the address again"
    );
    drop(idle);
}

#[tokio::test]
async fn the_cmsd_layer_caps_lifts_and_exposes_the_header() {
    let cap = QualityCap::new("edge-1", BitrateLadder::seed()).unwrap();
    let app = axum::Router::new()
        .route("/seg/{n}", axum::routing::get(|| async { "segment" }))
        .layer(cap.layer());
    let addr = listen(app, ServeLimits::default()).await;
    let get = || async move { reqwest::get(format!("http://{addr}/seg/1")).await.unwrap() };
    let r = get().await;
    assert!(r.headers().get("cmsd-dynamic").is_none(), "no cap yet");
    cap.cap_at("480p").unwrap();
    let r = get().await;
    assert_eq!(r.headers()["cmsd-dynamic"], "\"edge-1\";mb=5000;du");
    assert!(
        r.headers()["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .contains("CMSD-Dynamic")
    );
    cap.lift();
    assert_eq!(get().await.headers()["cmsd-dynamic"], "\"edge-1\";mb=25000");
    let err = cap.cap_at("8K").unwrap_err();
    assert!(err.to_string().contains("480p"), "{err}");
    assert!(QualityCap::new("edge\n1", BitrateLadder::seed()).is_err());
}

#[tokio::test]
async fn origin_manifests_are_served_tagged_for_steering() {
    use multicdn::steering::video::tagging::{Pathway, TagOptions};
    const MASTER: &str = "#EXTM3U\n#EXT-X-VERSION:6\n#EXT-X-STREAM-INF:BANDWIDTH=800000,RESOLUTION=640x360\nlow/index.m3u8\n#EXT-X-STREAM-INF:BANDWIDTH=3000000,RESOLUTION=1280x720\nhigh/index.m3u8\n";
    const MPD: &str = r#"<?xml version="1.0"?><MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="static" mediaPresentationDuration="PT30S" minBufferTime="PT2S" profiles="urn:mpeg:dash:profile:isoff-live:2011"><Period><AdaptationSet mimeType="video/mp4"><Representation id="v0" bandwidth="800000"/></AdaptationSet></Period></MPD>"#;
    let origin = axum::Router::new()
        .route("/vod/master.m3u8", axum::routing::get(|| async { MASTER }))
        .route("/vod/manifest.mpd", axum::routing::get(|| async { MPD }));
    let origin = listen(origin, ServeLimits::default()).await;
    let r = start(policy_config(), ServeLimits::default()).await;
    let options = TagOptions {
        server_uri: String::new(),
        default_pathway: "fastly".into(),
        pathways: vec![
            Pathway {
                id: "fastly".into(),
                base: "https://a.example.net/".parse().unwrap(),
            },
            Pathway {
                id: "cloudflare".into(),
                base: "https://b.example.net/".parse().unwrap(),
            },
        ],
    };
    let service = SteeringService::new(policy_config(), r.steerer.shared_plan())
        .origins([PAGE])
        .manifests(
            format!("http://{origin}/vod/").parse().unwrap(),
            "https://steer.example.com/".parse().unwrap(),
            options,
        )
        .unwrap();
    let addr = listen(service.router(), ServeLimits::default()).await;
    let hls = reqwest::get(format!("http://{addr}/manifests/master.m3u8"))
        .await
        .unwrap();
    assert_eq!(hls.status(), 200);
    assert_eq!(
        hls.headers()["content-type"],
        "application/vnd.apple.mpegurl"
    );
    let text = hls.text().await.unwrap();
    assert!(
        text.contains("#EXT-X-CONTENT-STEERING:SERVER-URI=\"https://steer.example.com/steering/hls.json\",PATHWAY-ID=\"fastly\""),
        "{text}"
    );
    assert!(
        text.contains("https://a.example.net/vod/high/index.m3u8"),
        "{text}"
    );
    assert!(
        text.contains("https://b.example.net/vod/low/index.m3u8"),
        "{text}"
    );
    assert_eq!(
        text.matches("PATHWAY-ID=\"cloudflare\"").count(),
        2,
        "{text}"
    );
    let dash = reqwest::get(format!("http://{addr}/manifests/manifest.mpd"))
        .await
        .unwrap();
    assert_eq!(dash.status(), 200);
    let text = dash.text().await.unwrap();
    assert!(text.contains("serviceLocation=\"cloudflare\""), "{text}");
    assert!(
        text.contains("https://steer.example.com/steering/dash.json"),
        "{text}"
    );
    // Outside the tree, not a manifest, or an origin that fails: said, never a panic.
    let get = |p: &'static str| async move {
        reqwest::get(format!("http://{addr}{p}"))
            .await
            .unwrap()
            .status()
    };
    assert!(get("/manifests/%2e%2e/secret.m3u8").await.is_client_error());
    assert!(
        get("/manifests/a/..%2f..%2fsecret.m3u8")
            .await
            .is_client_error()
    );
    assert_eq!(get("/manifests/segment.ts").await, 404);
    assert_eq!(get("/manifests/missing.m3u8").await, 502);
}
