//! Tokens never reach a `Debug` string, an error or a log line, across successes, retries,
//! refusals, timeouts and a failed fan-out, with every tracing level captured.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use multicdn_core::{PurgeRequest, Purger};
use multicdn_providers::cloudflare::CloudflareLimits;
use multicdn_providers::fanout::{EventSink, FanoutMember, PurgeFanout};
use serde_json::json;
use support::logs::capture;
use support::strict::{CloudflarePurge, FastlyPurge};
use support::vendors::{CLOUDFLARE_TOKEN, FASTLY_TOKEN, cloudflare, fast, fastly};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn a_token_never_appears_in_debug_output_errors_or_captured_logs() {
    let (logs, _guard) = capture();
    let mut seen = String::new();

    let f = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(ResponseTemplate::new(503).set_body_json(json!({"msg": "unavailable"})))
        .up_to_n_times(1)
        .mount(&f)
        .await;
    Mock::given(FastlyPurge)
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "ok", "id": "1"})))
        .mount(&f)
        .await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({
            "success": false, "errors": [{"code": 10000, "message": "Authentication error"}], "messages": [], "result": null
        })))
        .mount(&cf)
        .await;
    let slow = MockServer::start().await;
    Mock::given(FastlyPurge)
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_millis(300)))
        .mount(&slow)
        .await;

    let fp = fastly(&f.uri(), fast(3));
    let cp = cloudflare(&cf.uri(), CloudflareLimits::default(), fast(3));
    seen += &format!("{fp:?}\n{cp:?}\n");
    // A retried success.
    seen += &format!("{:?}\n", fp.purge(&PurgeRequest::tags(["a"])).await);
    // An authentication failure.
    let e = cp.purge(&PurgeRequest::tags(["a"])).await.unwrap_err();
    seen += &format!("{e}\n{e:?}\n");
    // A timeout.
    let timeout = fastly(
        &slow.uri(),
        fast(1).with_request_timeout(Duration::from_millis(30)),
    );
    let e = timeout.purge(&PurgeRequest::tags(["a"])).await.unwrap_err();
    seen += &format!("{e}\n{e:?}\n");
    // A refused request.
    let e = cp
        .purge(&PurgeRequest::tags(["a"]).soft())
        .await
        .unwrap_err();
    seen += &format!("{e}\n{e:?}\n");
    // A failed fan-out, its events and its Debug.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let fanout = PurgeFanout::new(vec![
        FanoutMember::new(Arc::new(fp)),
        FanoutMember::new(Arc::new(cp)),
    ])
    .with_events(EventSink::channel(tx));
    seen += &format!("{fanout:?}\n");
    let e = fanout
        .purge(&PurgeRequest::tags(["a", "b"]))
        .await
        .unwrap_err();
    seen += &format!("{e}\n{e:?}\n");
    while let Ok(event) = rx.try_recv() {
        seen += &format!("{event:?}\n{}\n", serde_json::to_string(&event).unwrap());
    }

    let logged = logs.text();
    assert!(logged.contains("retrying"), "the capture works: {logged}");
    assert!(logged.contains("purge missed"), "{logged}");
    for token in [FASTLY_TOKEN, CLOUDFLARE_TOKEN] {
        assert!(!seen.contains(token), "token in output: {seen}");
        assert!(!logged.contains(token), "token in logs: {logged}");
    }
    assert!(seen.contains("[redacted]"));
}
