//! The shipped browser script and the dashboard in a real Chromium, end to end on loopback.
//!
//! Two "CDN" origins (small axum servers) serve a page that loads `rum.js` from the service and
//! names itself in `Server-Timing`, as the rendered Fastly VCL and Cloudflare rules do, and a
//! probe object with `Timing-Allow-Origin` and CORS. Chromium loads each page twice and runs the
//! probe on each load; the navigation and probe beacons reach the receiver and are counted under
//! the provider that served the page and the network of the client (127.0.0.0/8 is AS64500 in
//! GB here). Then Chromium opens `/dashboard/` and the table shows those cells; the screenshot
//! goes to `target/browser-artifacts/dashboard.png`, the CI artifact.
//!
//! The browser is driven by `tests/browser/drive.mjs` (Node, playwright-core): `.ci/run`
//! installs Chromium, runs `npm ci` there and sets `MULTICDN_BROWSER_DRIVER`. Without the
//! driver, Node or Chromium the test says why and passes; with `CI` set it fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use multicdn::prelude::*;
use multicdn::service::{ClientLimit, ServeLimits, Service, ServiceConfig};
use multicdn::steering::resolve::PrefixTable;
use multicdn::steering::scoreboard::Metric;
use serde_json::{Value, json};
use support::browser::{drive, driver, evals};
use support::{POLICY, p, start};
use tokio::net::TcpListener;

const PREFIXES: &str = "127.0.0.0/8  AS64500  GB\n";

/// A 1x1 transparent GIF, the probe object.
const GIF: &[u8] = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff\x21\xf9\x04\x01\x00\x00\x00\x00\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02\x44\x01\x00\x3b";

/// The elements a `dom` step read.
fn dom<'a>(result: &'a Value, selector: &str) -> &'a [Value] {
    result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["dom"] == selector)
        .and_then(|s| s["elements"].as_array())
        .unwrap_or_else(|| panic!("no dom step read {selector}: {result}"))
}

/// One CDN edge: its page names it in `Server-Timing` and loads the script from the service;
/// its probe object lets the site's pages (`pages`) time it and read it.
fn edge(
    cdn: &'static str,
    pop: &'static str,
    cache: &'static str,
    service: &str,
    pages: &[String],
) -> Router {
    let page = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\">\
         <title>{cdn}</title><script async src=\"{service}/rum/rum.js\"></script></head>\
         <body><h1>served by {cdn}</h1></body></html>\n"
    );
    let timing = format!("cdn;desc=\"{cdn}\", pop;desc=\"{pop}\", cache;desc=\"{cache}\"");
    let allowed = pages.to_vec();
    let tao = pages.join(", ");
    Router::new()
        .route(
            "/",
            get(move || {
                let page = page.clone();
                let timing = timing.clone();
                async move { ([("server-timing", timing)], Html(page)) }
            }),
        )
        .route(
            "/probe.gif",
            get(move |headers: HeaderMap| {
                let allowed = allowed.clone();
                let tao = tao.clone();
                async move { probe_object(&headers, &allowed, &tao) }
            }),
        )
}

fn probe_object(headers: &HeaderMap, allowed: &[String], tao: &str) -> Response {
    let mut r = (
        [
            (header::CONTENT_TYPE, "image/gif"),
            (header::CACHE_CONTROL, "no-store"),
            (header::VARY, "Origin"),
        ],
        GIF,
    )
        .into_response();
    let h = r.headers_mut();
    h.insert("timing-allow-origin", HeaderValue::from_str(tao).unwrap());
    if let Some(origin) = headers.get(header::ORIGIN)
        && allowed.iter().any(|a| a.as_bytes() == origin.as_bytes())
    {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    r
}

async fn listen() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    (l, base)
}

fn samples(
    service: &Service,
    clock: &ManualClock,
    network: &str,
    provider: &str,
    metric: Metric,
) -> u64 {
    service
        .controller()
        .snapshot(clock.now())
        .cell(metric, network.parse().unwrap(), &p(provider))
        .stats
        .samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beacons_from_a_real_browser_reach_the_scoreboard_and_the_dashboard_shows_them() {
    let Some(driver) = driver() else { return };

    let (fastly_l, fastly) = listen().await;
    let (cloudflare_l, cloudflare) = listen().await;
    let (service_l, base) = listen().await;
    let pages = vec![fastly.clone(), cloudflare.clone()];

    // The example policy, probing the two loopback edges on every page load.
    let text = std::fs::read_to_string(POLICY)
        .unwrap()
        .replacen("sample: 2%", "sample: 100%", 1)
        .replacen(
            "https://fastly.cdn.example.com/_multicdn/probe.gif",
            &format!("{fastly}/probe.gif"),
            1,
        )
        .replacen(
            "https://cloudflare.cdn.example.com/_multicdn/probe.gif",
            &format!("{cloudflare}/probe.gif"),
            1,
        );
    let policy = Policy::from_yaml(&text, "browser-test.yaml").unwrap();
    assert_eq!(
        policy.steering.rum.probe.objects[&p("fastly")],
        format!("{fastly}/probe.gif"),
        "the example policy's probe section changed: update this test"
    );
    let clock = ManualClock::new(start());
    let controller = Controller::builder(policy.clone())
        .shared_clock(Arc::new(clock.clone()))
        .resolver(PrefixTable::from_lines(PREFIXES).unwrap())
        .shared_actuator("dns-a", Arc::new(MemorySteerer::new()))
        .shared_actuator("dns-b", Arc::new(MemorySteerer::new()))
        .build()
        .unwrap();
    let config = ServiceConfig::for_policy(&policy)
        .origins(pages.clone())
        .client_limit(ClientLimit {
            per_second: NonZeroU32::new(1000).unwrap(),
            burst: NonZeroU32::new(1000).unwrap(),
            buckets: 1024,
        });
    let service = Service::new(controller, config);
    // Every server stops with the test's runtime.
    let s = service.clone();
    tokio::spawn(async move {
        s.serve(service_l, ServeLimits::default(), std::future::pending())
            .await
    });
    for (l, router) in [
        (fastly_l, edge("fastly", "LHR", "HIT", &base, &pages)),
        (
            cloudflare_l,
            edge("cloudflare", "AMS", "MISS", &base, &pages),
        ),
    ] {
        tokio::spawn(async move { axum::serve(l, router).await });
    }

    // Each edge's page, twice; on each load the probe runs once more on demand (the sampled
    // run at idle may add its own beacons).
    let mut steps = Vec::new();
    for origin in [&fastly, &fastly, &cloudflare, &cloudflare] {
        steps.push(json!({"goto": format!("{origin}/")}));
        steps.push(json!({"wait_fn": "window.multicdn !== undefined"}));
        steps.push(json!({"eval": "window.multicdn.probe()"}));
    }
    steps.push(json!({"eval": "performance.getEntriesByType('navigation')[0].serverTiming.map(t => t.name + '=' + t.description)"}));
    steps.push(json!({"eval": "performance.getEntriesByType('resource').filter(e => e.name.includes('/probe.gif')).map(e => e.responseStart > 0)"}));
    steps.push(json!({"eval": "window.multicdn.verdict()"}));
    let result = drive(&driver, json!({"timeout_ms": 60000, "steps": steps})).await;
    let values = evals(&result);

    // The probe timed both edges through CORS, from Resource Timing (Timing-Allow-Origin).
    for probe in &values[..4] {
        for cdn in ["fastly", "cloudflare"] {
            assert!(
                probe["times"][cdn].as_f64().is_some_and(|t| t > 0.0),
                "{probe}"
            );
        }
        assert!(
            ["fastly", "cloudflare"].contains(&probe["best"].as_str().unwrap()),
            "{probe}"
        );
        assert_eq!(probe["id"].as_str().unwrap().len(), 16, "{probe}");
    }
    assert_eq!(
        values[4],
        &json!(["cdn=cloudflare", "pop=AMS", "cache=MISS"])
    );
    let timed = values[5].as_array().unwrap();
    assert!(
        !timed.is_empty() && timed.iter().all(|t| t == true),
        "{}",
        values[5]
    );
    // Two probes on this origin at least: the verdict holds, with weight.
    let verdict = values[6];
    assert!(
        ["fastly", "cloudflare"].contains(&verdict["provider"].as_str().unwrap()),
        "{verdict}"
    );
    assert!(
        verdict["weight"]
            .as_f64()
            .is_some_and(|w| w > 0.0 && w < 1.0),
        "{verdict}"
    );
    assert_eq!(verdict["ttl_ms"], 6 * 3600 * 1000);

    // Beacons are fire-and-forget: wait (10 s at most) for the receiver to have them all.
    for _ in 0..200 {
        if service.accepted(false) >= 4 && service.accepted(true) >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        service.accepted(false),
        4,
        "navigation beacons: one a page load"
    );
    assert!(
        service.accepted(true) >= 4,
        "probe beacons: {}",
        service.accepted(true)
    );
    for network in ["AS64500", "GB"] {
        for cdn in ["fastly", "cloudflare"] {
            assert_eq!(
                samples(&service, &clock, network, cdn, Metric::Ttfb),
                2,
                "{network} {cdn}"
            );
            assert!(
                samples(&service, &clock, network, cdn, Metric::Probe) >= 4,
                "{network} {cdn}"
            );
        }
    }

    // The dashboard, as an operator opens it.
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("browser-artifacts");
    let shot = artifacts.join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let gb = "#board tr[data-key=\"GB\"] td[data-provider]";
    let asn = "#networks tr[data-key=\"AS64500\"] td[data-provider]";
    let probe = "#board tr[data-key=\"GB\"] td[data-provider][data-samples]";
    let job = json!({"timeout_ms": 60000, "steps": [
        {"goto": format!("{base}/dashboard/")},
        {"wait_for": "#board tr[data-key=\"GB\"] td[data-provider=\"cloudflare\"][data-samples=\"2\"]"},
        {"wait_for": "#networks tr[data-key=\"AS64500\"]"},
        {"wait_for": "#health li[data-provider]"},
        {"dom": gb},
        {"dom": asn},
        {"dom": "#board tr[data-key=\"all\"] td[data-provider]"},
        {"screenshot": shot.to_str().unwrap()},
        // The journal search goes to the API and says what it found.
        {"fill": "#journal-form [name=network]", "value": "GB"},
        {"click": "#journal-form button[type=submit]"},
        {"wait_fn": "document.querySelector('#journal-status').textContent.includes('decision')"},
        {"dom": "#journal-status"},
        // The probe metric: the same table from the probe beacons.
        {"eval": "(() => { const m = document.querySelector('#metric'); m.value = 'probe'; m.dispatchEvent(new Event('change')); })()"},
        {"wait_fn": "document.querySelector('#board-caption').textContent.startsWith('Probe time')"},
        {"dom": probe},
    ]});
    let result = drive(&driver, job).await;
    for selector in [gb, asn] {
        let cells = dom(&result, selector);
        assert_eq!(cells.len(), 2, "{selector}: {cells:?}");
        for cell in cells {
            let a = &cell["attrs"];
            assert_eq!(a["data-samples"], "2", "{selector}: {cell}");
            assert_eq!(a["data-share"], "0.5", "{selector}: {cell}");
            assert!(
                a["data-p75"].as_str().unwrap().parse::<f64>().unwrap() > 0.0,
                "{cell}"
            );
            // 2 of the policy's 200 samples: not steerable, and marked so.
            assert_eq!(a["class"], "thin", "{cell}");
            assert!(cell["text"].as_str().unwrap().ends_with('*'), "{cell}");
        }
    }
    let all = dom(&result, "#board tr[data-key=\"all\"] td[data-provider]");
    assert!(
        all.iter().all(|c| c["attrs"]["data-samples"] == "2"),
        "{all:?}"
    );
    let status = dom(&result, "#journal-status")[0]["text"].as_str().unwrap();
    assert!(status.ends_with("operator action(s)"), "{status}");
    let cells = dom(&result, probe);
    assert_eq!(cells.len(), 2, "{cells:?}");
    for cell in cells {
        let n: u64 = cell["attrs"]["data-samples"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(n >= 4, "every probe timed both edges: {cell}");
    }
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "{}",
        shot.display()
    );
}
