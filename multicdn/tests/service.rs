//! The service over real HTTP on loopback: beacons in through every check, the dashboard's
//! API, `/metrics`, the admin switches, and the server's connection limits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use multicdn::prelude::*;
use multicdn::service::{ClientLimit, Reject, ServeLimits, Service, ServiceConfig};
use multicdn::steering::resolve::PrefixTable;
use multicdn::steering::scoreboard::Metric;
use support::{POLICY, p, start};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PREFIXES: &str = "
    127.0.0.0/8      AS64500  GB
    203.0.113.0/24   AS64501  DE
    198.51.100.0/24  AS64502  FR
";

struct Running {
    service: Service,
    base: String,
    admin: String,
    clock: ManualClock,
    actuators: Vec<Arc<MemorySteerer>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn running(tune: impl FnOnce(ServiceConfig) -> ServiceConfig) -> Running {
    running_with(Policy::load(POLICY).unwrap(), tune).await
}

async fn running_with(
    policy: Policy,
    tune: impl FnOnce(ServiceConfig) -> ServiceConfig,
) -> Running {
    let clock = ManualClock::new(start());
    let a = Arc::new(MemorySteerer::new());
    let b = Arc::new(MemorySteerer::new());
    let controller = Controller::builder(policy.clone())
        .shared_clock(Arc::new(clock.clone()))
        .resolver(PrefixTable::from_lines(PREFIXES).unwrap())
        .shared_actuator("dns-a", a.clone())
        .shared_actuator("dns-b", b.clone())
        .build()
        .unwrap();
    let config = tune(
        ServiceConfig::for_policy(&policy)
            .admin_token(TOKEN)
            .client_limit(ClientLimit {
                per_second: NonZeroU32::new(1000).unwrap(),
                burst: NonZeroU32::new(1000).unwrap(),
                buckets: 1024,
            }),
    );
    let service = Service::new(controller, config);
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", public.local_addr().unwrap());
    let admin_base = format!("http://{}", admin.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let s = service.clone();
    tokio::spawn(async move {
        let _ = s
            .serve(public, ServeLimits::default(), async {
                let _ = rx.await;
            })
            .await;
    });
    let admin_router = service.admin_router();
    tokio::spawn(async move {
        let _ = multicdn::service::serve(
            admin,
            admin_router,
            ServeLimits::default(),
            std::future::pending(),
        )
        .await;
    });
    Running {
        service,
        base,
        admin: admin_base,
        clock,
        actuators: vec![a, b],
        _stop: tx,
    }
}

/// Behind a trusted proxy on loopback (so `X-Forwarded-For` names the client), with this
/// per-client limit.
fn behind_proxy(
    per_second: u32,
    burst: u32,
    buckets: u32,
) -> impl FnOnce(ServiceConfig) -> ServiceConfig {
    move |c| {
        c.trusted_proxies(["127.0.0.0/8".parse().unwrap()])
            .client_limit(ClientLimit {
                per_second: NonZeroU32::new(per_second).unwrap(),
                burst: NonZeroU32::new(burst).unwrap(),
                buckets,
            })
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// What `navigator.sendBeacon(url, JSON.stringify(b))` sends.
async fn beacon(r: &Running, path: &str, body: &str) -> reqwest::Response {
    client()
        .post(format!("{}{path}", r.base))
        .header("content-type", "text/plain;charset=UTF-8")
        .header("origin", "https://www.example.com")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

const TOKEN: &str = "correct horse battery staple";

/// An admin call with the token.
async fn admin(r: &Running, path: &str, body: serde_json::Value) -> reqwest::Response {
    client()
        .post(format!("{}{path}", r.admin))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn nav(id: &str, provider: &str, ttfb: f64) -> String {
    format!(
        r#"{{"id":"{id}","path":"/products/1","ttfb":{ttfb},"provider":"{provider}","pop":"LHR","cache":"HIT"}}"#
    )
}

fn samples(r: &Running, network: &str, provider: &str, metric: Metric) -> u64 {
    r.service
        .controller()
        .snapshot(r.clock.now())
        .cell(metric, network.parse().unwrap(), &p(provider))
        .stats
        .samples
}

#[tokio::test]
async fn beacons_are_counted_under_their_provider_and_the_clients_network() {
    let r = running(|c| c).await;
    for i in 0..5 {
        let resp = beacon(&r, "/rum/nav", &nav(&format!("n{i}"), "fastly", 120.0)).await;
        assert_eq!(resp.status(), 204);
    }
    // The probe beacon, as the shipped script sends it, and as JSON from a fetch fallback.
    let resp = beacon(
        &r,
        "/rum/cdn",
        r#"{"id":"p1","times":{"fastly":80.5,"cloudflare":null},"best":"fastly"}"#,
    )
    .await;
    assert_eq!(resp.status(), 204);
    let resp = client()
        .post(format!("{}/rum/cdn", r.base))
        .header("content-type", "application/json")
        .body(r#"{"id":"p2","times":[90,70],"best":"cloudflare"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);

    assert_eq!(samples(&r, "AS64500", "fastly", Metric::Ttfb), 5);
    assert_eq!(samples(&r, "GB", "fastly", Metric::Ttfb), 5);
    assert_eq!(samples(&r, "AS64500", "cloudflare", Metric::Ttfb), 0);
    assert_eq!(samples(&r, "AS64500", "fastly", Metric::Probe), 2);
    assert_eq!(samples(&r, "AS64500", "cloudflare", Metric::Probe), 2);
    assert_eq!(r.service.accepted(false), 5);
    assert_eq!(r.service.accepted(true), 2);

    // The dashboard's table has the cell, marked thin (5 of the policy's 200).
    let board: serde_json::Value = client()
        .get(format!("{}/api/v1/board", r.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let gb = &board["countries"][0];
    assert_eq!(gb["key"], "GB");
    let fastly = gb["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["provider"] == "fastly")
        .unwrap();
    assert_eq!(fastly["samples"], 5);
    assert_eq!(fastly["share"], 1.0);
    assert_eq!(fastly["steerable"], false);
    assert_eq!(fastly["status"], "too few samples (5 of 200)");
    assert_eq!(board["networks"][0]["key"], "AS64500");
    assert_eq!(board["networks"][0]["country"], "GB");
}

#[tokio::test]
async fn every_bad_beacon_is_refused_and_counted_and_no_valid_one_is_lost() {
    let r = running(|c| c).await;
    let mut valid = 0;
    for i in 0..3 {
        assert_eq!(
            beacon(&r, "/rum/nav", &nav(&format!("ok{i}"), "cloudflare", 90.0))
                .await
                .status(),
            204
        );
        valid += 1;
    }
    // Oversized: 413, unread.
    let big = format!(
        r#"{{"ttfb":1,"provider":"fastly","path":"{}"}}"#,
        "x".repeat(9000)
    );
    let resp = beacon(&r, "/rum/nav", &big).await;
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.headers()["x-multicdn-reject"], "too_large");
    // Not JSON: 400. JSON but not a beacon: 422.
    assert_eq!(beacon(&r, "/rum/nav", "{\"ttfb\": 1,").await.status(), 400);
    assert_eq!(
        beacon(&r, "/rum/nav", r#"{"hello":"world"}"#)
            .await
            .status(),
        422
    );
    // The client's "unknown" (no Server-Timing) and a typo: 422.
    assert_eq!(
        beacon(&r, "/rum/nav", &nav("u1", "unknown", 90.0))
            .await
            .status(),
        422
    );
    assert_eq!(
        beacon(&r, "/rum/cdn", r#"{"times":{"fastly":1,"akamai":2}}"#)
            .await
            .status(),
        422
    );
    // Implausible times.
    assert_eq!(
        beacon(&r, "/rum/nav", &nav("i1", "fastly", -4.0))
            .await
            .status(),
        422
    );
    // A client clock an hour ahead: refused; five seconds ahead: fine, stamped with the
    // server's time.
    let ahead = r.clock.now().plus(Duration::from_secs(3600)).as_millis();
    let body = format!(r#"{{"at":{ahead},"ttfb":50,"provider":"fastly"}}"#);
    let resp = beacon(&r, "/rum/nav", &body).await;
    assert_eq!(
        (
            resp.status().as_u16(),
            resp.headers()["x-multicdn-reject"].to_str().unwrap()
        ),
        (422, "clock_skew")
    );
    let near = r.clock.now().plus(Duration::from_secs(5)).as_millis();
    let body = format!(r#"{{"at":{near},"ttfb":50,"provider":"fastly"}}"#);
    assert_eq!(beacon(&r, "/rum/nav", &body).await.status(), 204);
    valid += 1;
    // A retried send: answered as received, recorded once.
    assert_eq!(
        beacon(&r, "/rum/nav", &nav("ok0", "cloudflare", 90.0))
            .await
            .status(),
        204
    );
    // Another site's page; a form post.
    let resp = client()
        .post(format!("{}/rum/nav", r.base))
        .header("origin", "https://evil.example.net")
        .body(nav("o1", "fastly", 50.0))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let resp = client()
        .post(format!("{}/rum/nav", r.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("ttfb=1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    // A forged X-Forwarded-For from a peer that is not a trusted proxy is not believed: the
    // beacon counts under the socket's network (GB), not the header's (DE).
    let resp = client()
        .post(format!("{}/rum/nav", r.base))
        .header("x-forwarded-for", "203.0.113.9")
        .body(nav("f1", "fastly", 70.0))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    valid += 1;
    assert_eq!(r.service.forwarded_ignored(), 1);
    assert_eq!(samples(&r, "DE", "fastly", Metric::Ttfb), 0);

    let s = &r.service;
    let counted = [
        (Reject::TooLarge, 1),
        (Reject::Malformed, 1),
        (Reject::NotABeacon, 1),
        (Reject::UnknownProvider, 1),
        (Reject::Implausible, 1),
        (Reject::ClockSkew, 1),
        (Reject::Duplicate, 1),
        (Reject::Origin, 1),
        (Reject::ContentType, 1),
    ];
    for (reason, n) in counted {
        assert_eq!(s.rejected(false, reason), n, "{reason:?}");
    }
    assert_eq!(s.rejected(true, Reject::UnknownProvider), 1);
    assert_eq!(s.accepted(false), valid);
    let stored =
        samples(&r, "GB", "fastly", Metric::Ttfb) + samples(&r, "GB", "cloudflare", Metric::Ttfb);
    assert_eq!(
        stored, valid,
        "every valid beacon is in the scoreboard once"
    );
    let metrics = s.metrics_text();
    assert!(
        metrics.contains(r#"multicdn_beacons_rejected_total{kind="nav",reason="clock_skew"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_trusted_proxy_names_the_client_and_a_burst_over_the_limit_is_refused() {
    let r = running(behind_proxy(1, 5, 4096)).await;
    let send = |client_ip: &'static str, id: String| {
        let base = r.base.clone();
        async move {
            client()
                .post(format!("{base}/rum/nav"))
                .header("x-forwarded-for", format!("{client_ip}, 127.0.0.2"))
                .body(nav(&id, "fastly", 60.0))
                .send()
                .await
                .unwrap()
        }
    };
    let mut codes = Vec::new();
    for i in 0..8 {
        codes.push(send("203.0.113.9", format!("b{i}")).await.status().as_u16());
    }
    assert_eq!(codes, [204, 204, 204, 204, 204, 429, 429, 429]);
    let limited = send("203.0.113.9", "b9".into()).await;
    assert_eq!(limited.headers()["retry-after"], "1");
    // Another client behind the same proxy has its own bucket.
    assert_eq!(send("198.51.100.20", "c1".into()).await.status(), 204);
    assert_eq!(samples(&r, "AS64501", "fastly", Metric::Ttfb), 5);
    assert_eq!(samples(&r, "DE", "fastly", Metric::Ttfb), 5);
    assert_eq!(samples(&r, "FR", "fastly", Metric::Ttfb), 1);
    assert_eq!(r.service.rejected(false, Reject::RateLimited), 4);
    assert_eq!(r.service.forwarded_ignored(), 0);
}

#[tokio::test]
async fn the_admin_switches_need_the_token_and_the_static_switch_reaches_every_actuator() {
    let r = running(|c| c).await;
    let url = format!("{}/admin/static", r.admin);
    let body = serde_json::json!({"on": true, "who": "alice", "why": "vendor incident INC-42"});
    let resp = client().post(&url).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert!(resp.headers().contains_key("www-authenticate"));
    let resp = client()
        .post(&url)
        .bearer_auth("guess")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // The switch is not on the public listener at all.
    let resp = client()
        .post(format!("{}/admin/static", r.base))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert!(r.service.controller().operator_log().await.is_empty());

    // First a normal round moves Europe (a RUM move needs evidence; a drain does it at once).
    let resp = admin(
        &r,
        "/admin/drain",
        serde_json::json!({"provider": "cloudflare", "on": true, "who": "bob", "why": "maintenance"}),
    )
    .await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    support::feed(r.service.controller(), r.clock.now());
    r.service.round(r.clock.now()).await;
    let static_plan = r.service.controller().policy().static_plan();
    let europe: CohortId = "europe".parse().unwrap();
    for a in &r.actuators {
        let state = a.current().await.unwrap();
        assert_ne!(
            state.cohort(&europe).unwrap().weights,
            static_plan.cohort(&europe).unwrap().weights,
            "the drain moved Europe off the static split"
        );
    }

    let resp = client()
        .post(&url)
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    r.clock.advance(Duration::from_secs(30));
    support::feed(r.service.controller(), r.clock.now());
    let report = r.service.round(r.clock.now()).await;
    assert_eq!(report.record.applied.len(), 2);
    for a in &r.actuators {
        let state = a.current().await.unwrap();
        for c in &static_plan.cohorts {
            assert_eq!(
                state.cohort(&c.cohort).unwrap().weights,
                c.weights,
                "{}",
                c.cohort
            );
        }
    }
    let log = r.service.controller().operator_log().await;
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[1].operator.who.as_str(), log[1].operator.why.as_str()),
        ("alice", "vendor incident INC-42")
    );
    let journal: serde_json::Value = client()
        .get(format!("{}/api/v1/journal", r.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(journal["operator"][0]["action"], "static mode on");
    assert_eq!(journal["operator"][0]["who"], "alice");
    let metrics = client()
        .get(format!("{}/metrics", r.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"multicdn_operator_switches_total{command="static"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("multicdn_rounds_total 2"), "{metrics}");
    assert!(metrics.contains("multicdn_static_mode 1"), "{metrics}");
    assert!(
        metrics.contains(r#"multicdn_provider_up{provider="cloudflare"} 0"#),
        "{metrics}"
    );

    // A switch without why, or with a bad pin, is refused and changes nothing.
    let resp = admin(
        &r,
        "/admin/pins",
        serde_json::json!({"network": "AS7922", "weights": {"fastly": "60%", "cloudflare": "30%"},
            "until": "2027-01-01T00:00:00Z", "who": "alice", "why": "peering"}),
    )
    .await;
    assert_eq!(resp.status(), 422);
    assert!(resp.text().await.unwrap().contains("sums to 90.00%"));
    let resp = admin(
        &r,
        "/admin/dry-run",
        serde_json::json!({"on": true, "who": "alice", "why": ""}),
    )
    .await;
    assert_eq!(resp.status(), 422);
    assert!(!r.service.controller().is_dry_run());
    assert_eq!(r.service.controller().operator_log().await.len(), 2);
}

#[tokio::test]
async fn the_script_is_configured_from_the_policy_and_the_dashboard_is_served() {
    let r = running(|c| c).await;
    let js = client()
        .get(format!("{}/rum/rum.js", r.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        js.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    let js = js.text().await.unwrap();
    assert!(!js.contains("__MULTICDN_CONFIG__"));
    assert!(
        js.contains(&format!("\"nav\":\"{}/rum/nav\"", r.base)),
        "{js}"
    );
    assert!(js.contains("https://fastly.cdn.example.com/_multicdn/probe.gif"));
    assert!(js.contains("\"sample\":0.02"));
    let html = client()
        .get(format!("{}/dashboard/", r.base))
        .send()
        .await
        .unwrap();
    assert_eq!(html.status(), 200);
    assert!(html.text().await.unwrap().contains("id=\"board\""));
    // CORS preflight for a JSON send from the site.
    let pre = client()
        .request(reqwest::Method::OPTIONS, format!("{}/rum/nav", r.base))
        .header("origin", "https://www.example.com")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert!(pre.status().is_success(), "{}", pre.status());
    assert_eq!(
        pre.headers()["access-control-allow-origin"],
        "https://www.example.com"
    );
    assert_eq!(pre.headers()["access-control-allow-credentials"], "true");
}

#[tokio::test]
async fn the_server_refuses_past_its_connection_cap_and_drops_slow_headers() {
    let policy = Policy::load(POLICY).unwrap();
    let controller = Controller::builder(policy.clone()).build().unwrap();
    let service = Service::new(controller, ServiceConfig::for_policy(&policy));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = service.clone();
    tokio::spawn(async move {
        let limits = ServeLimits::default()
            .max_connections(2)
            .header_timeout(Duration::from_millis(300));
        let _ = s.serve(listener, limits, std::future::pending()).await;
    });
    // Two idle connections take both slots (headers never finish).
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        idle.push(c);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), third.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("Retry-After: 1"));
    // The slow ones are closed after the header timeout; their slots free up.
    for mut c in idle {
        let mut buf = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf)).await;
        assert!(
            n.is_ok(),
            "a connection with unfinished headers was held past the timeout"
        );
    }
    let resp = client()
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.text().await.unwrap(), "ok\n");
    assert!(
        service
            .metrics_text()
            .contains("multicdn_http_connections_refused_total 1")
    );
}

#[tokio::test]
async fn a_flood_of_bad_beacons_from_many_addresses_leaves_the_receivers_state_bounded() {
    let r = running(behind_proxy(10, 30, 256)).await;
    let c = client();
    let bad = [
        "{\"ttfb\":".to_owned(),
        nav("x", "unknown", 50.0),
        r#"{"times":{"akamai":3}}"#.to_owned(),
    ];
    for i in 0..1500u32 {
        let ip = std::net::Ipv4Addr::from(0xCB00_7100 | (i & 0xff)).to_string();
        let ip = if i % 2 == 0 {
            format!("2001:db8:{:x}::1", i)
        } else {
            ip
        };
        let body = bad[i as usize % bad.len()].replace("\"x\"", &format!("\"bad{i}\""));
        let resp = c
            .post(format!("{}/rum/nav", r.base))
            .header("x-forwarded-for", ip)
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_client_error(), "{}", resp.status());
    }
    let (buckets, ids) = r.service.footprint();
    assert!(buckets <= 256, "{buckets} rate buckets for a table of 256");
    assert_eq!(ids, 0, "no refused beacon's id is remembered");
    // Valid beacons still get in and are remembered, within the configured count.
    for i in 0..20 {
        let resp = c
            .post(format!("{}/rum/nav", r.base))
            .header("x-forwarded-for", format!("198.51.100.{i}"))
            .body(nav(&format!("ok{i}"), "fastly", 40.0))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 204);
    }
    assert_eq!(r.service.footprint().1, 20);
    assert_eq!(samples(&r, "FR", "fastly", Metric::Ttfb), 20);
}

#[tokio::test]
async fn a_running_drill_and_its_report_are_served() {
    let src = include_str!("../../examples/policy-standby.yaml")
        .replace("at: 2027-01-12T10:00:00Z", "at: 2026-12-01T09:01:00Z");
    let r = running_with(
        Policy::from_yaml(&src, "policy-standby.yaml").unwrap(),
        |c| c,
    )
    .await;
    let get = || async {
        client()
            .get(format!("{}/api/v1/drills", r.base))
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    let before = get().await;
    assert_eq!(before["drills"][0]["name"], "q1-standby");
    assert!(
        before["drills"][0]["report"]
            .as_str()
            .unwrap()
            .contains("not begun")
    );
    // Fresh beacons every round, so the deadman stays quiet.
    let feed = |now: Timestamp| {
        let line = format!(
            "{{\"at\":{},\"asn\":3320,\"country\":\"DE\",\"ttfb\":40,\"provider\":\"fastly\"}}\n",
            now.as_millis()
        );
        r.service
            .controller()
            .ingest_bytes(line.repeat(50).as_bytes());
    };
    for step in [0, 60, 90] {
        r.clock.advance(std::time::Duration::from_secs(step));
        feed(r.clock.now());
        r.service.controller().round(r.clock.now()).await;
    }
    let during = get().await;
    let d = &during["drills"][0];
    assert_eq!(d["to"], "cloudflare");
    assert_eq!(d["time_to_shift_s"], 90);
    assert!(d["progress"]["regions"]["europe"].is_object(), "{d}");
    assert!(
        d["report"]
            .as_str()
            .unwrap()
            .contains("complete after 90 s"),
        "{}",
        d["report"]
    );
    // Everything is on the standby now, on every actuator.
    let applied = r.actuators[0].current().await.unwrap();
    assert!(
        applied
            .cohorts
            .iter()
            .all(|c| c.weights.get(&"cloudflare".parse().unwrap()) == 10_000),
        "{applied:?}"
    );
}

/// With a shard publisher (feature `nats`): every accepted beacon is offered to it, and what
/// its full buffer refuses (here the server is gone, so nothing leaves) is counted.
#[cfg(feature = "nats")]
#[tokio::test]
async fn beacons_the_shard_publisher_drops_are_counted() {
    use multicdn::shards::{BeaconPublisher, PublisherConfig, ShardsConfig};
    let Some(mut nats) = multicdn_test_support::NatsServer::start().unwrap() else {
        let why = "nats-server is not installed (apt-get install nats-server; .ci/run does)";
        assert!(
            !std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false"),
            "cannot run in CI: {why}"
        );
        return;
    };
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut config = PublisherConfig::new("rx", ShardsConfig::new(2));
    config.buffer = 2;
    let publisher = BeaconPublisher::start(client, config, Arc::new(SystemClock))
        .await
        .unwrap();
    nats.stop();
    let r = running(|c| c.publisher(publisher.clone())).await;
    for i in 0..5 {
        let resp = beacon(&r, "/rum/nav", &nav(&format!("d{i}"), "fastly", 100.0)).await;
        assert_eq!(
            resp.status(),
            204,
            "a beacon is accepted whatever the publisher does"
        );
    }
    let s = publisher.stats();
    assert_eq!((s.offered, s.buffered, s.dropped), (5, 2, 3), "{s:?}");
    let metrics = r.service.metrics_text();
    assert!(
        metrics.contains("multicdn_beacons_publish_dropped_total 3"),
        "{metrics}"
    );
}
