//! The purge fan-out against loopback servers: parallel purges and their report, a provider
//! that fails (the error, the demotion event, the other provider still purged), refusals
//! before sending, the queued mode paced at the slowest provider's ceiling, and the way back
//! after a miss (what each provider missed, re-sent to it alone, and its recovery).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use multicdn_core::{
    Error, Event, ManualClock, ProviderId, PurgeRequest, PurgeScope, Stopwatch, Timestamp,
};
use multicdn_providers::cloudflare::CloudflareLimits;
use multicdn_providers::fanout::{
    EventSink, FanoutError, FanoutMember, Outstanding, PurgeFanout, QueueProgress,
};
use multicdn_providers::fastly::FastlyLimits;
use multicdn_providers::http::RateLimit;
use multicdn_test_support::{PurgeApi, PurgeLimits};
use serde_json::json;
use support::strict::CloudflarePurge;
use support::vendors::{FASTLY_TOKEN, SERVICE, cloudflare, fast, fastly, pid, tags};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

fn cf_success() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(
        json!({"success": true, "errors": [], "messages": [], "result": {"id": "cf-purge"}}),
    )
}

fn cf_401() -> ResponseTemplate {
    ResponseTemplate::new(401).set_body_json(json!({
        "success": false, "errors": [{"code": 10000, "message": "Authentication error"}], "messages": [], "result": null
    }))
}

struct EchoKeys;

impl Respond for EchoKeys {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        let map: serde_json::Map<String, serde_json::Value> = body["surrogate_keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| (k.as_str().unwrap().to_owned(), json!("fastly-purge")))
            .collect();
        ResponseTemplate::new(200).set_body_json(map)
    }
}

async fn fastly_ok(expect: u64) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("fastly-key", FASTLY_TOKEN))
        .and(path(format!("/service/{SERVICE}/purge")))
        .respond_with(EchoKeys)
        .expect(expect)
        .mount(&server)
        .await;
    server
}

fn members(fastly_base: &str, cf_base: &str) -> Vec<FanoutMember> {
    vec![
        FanoutMember::new(Arc::new(fastly(fastly_base, fast(2)))),
        FanoutMember::new(Arc::new(cloudflare(
            cf_base,
            CloudflareLimits::default(),
            fast(2),
        ))),
    ]
}

#[tokio::test]
async fn both_providers_purge_in_parallel_and_the_report_names_the_slowest() {
    let f = fastly_ok(1).await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_success().set_delay(Duration::from_millis(150)))
        .expect(2)
        .mount(&cf)
        .await;
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri()));
    let watch = Stopwatch::start();
    let report = fanout.purge(&PurgeRequest::tags(tags(150))).await.unwrap();
    let took = watch.elapsed();
    // Two Cloudflare requests of 150 ms, sent together: parallel, not one after the other.
    assert!(took < Duration::from_millis(290), "{took:?}");
    assert_eq!(report.receipts.len(), 2);
    assert_eq!(
        report.slowest.as_ref().map(|p| p.as_str()),
        Some("cloudflare")
    );
    assert!(report.worst_acknowledged_in >= Duration::from_millis(150));
    let fastly_receipt = &report.receipts[0];
    assert_eq!((fastly_receipt.items, fastly_receipt.requests), (150, 1));
    let cf_receipt = &report.receipts[1];
    assert_eq!(
        (
            cf_receipt.items,
            cf_receipt.requests,
            cf_receipt.purge_ids.len()
        ),
        (150, 2, 2)
    );
    assert!(fastly_receipt.acknowledged_in <= cf_receipt.acknowledged_in);
}

#[tokio::test]
async fn one_provider_failing_yields_the_error_and_the_demotion_event_while_the_other_completes() {
    let f = fastly_ok(1).await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_401())
        .expect(1)
        .mount(&cf)
        .await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let clock = ManualClock::new(Timestamp::from_secs(1_000));
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri()))
        .with_events(EventSink::channel(tx))
        .with_clock(Arc::new(clock));
    let err = fanout
        .purge(&PurgeRequest::tags(["price-1", "price-2"]))
        .await
        .unwrap_err();

    let FanoutError::Missed {
        failures,
        held,
        receipts,
        events,
    } = &err
    else {
        panic!("expected a missed purge, got {err:?}");
    };
    assert!(held.is_empty(), "without a shield nothing is held back");
    assert_eq!(failures.len(), 1);
    let failure = &failures[0];
    assert_eq!(failure.provider.as_str(), "cloudflare");
    assert_eq!(failure.missed, ["price-1", "price-2"]);
    assert_eq!(failure.scope, "tags");
    assert!(failure.error.is_auth());
    // Fastly's purge still completed.
    assert_eq!(receipts.len(), 1);
    assert_eq!(
        (receipts[0].provider.as_str(), receipts[0].items),
        ("fastly", 2)
    );
    // The error names the provider and the items.
    let text = err.to_string();
    assert!(
        text.contains("purge missed on cloudflare: 2 tags (price-1, price-2) not purged"),
        "{text}"
    );
    assert!(text.contains("authentication failed"), "{text}");
    // The demotion event, on the channel and in the error.
    let event = rx.try_recv().unwrap();
    assert!(rx.try_recv().is_err(), "one event per failed provider");
    match &event {
        Event::PurgeMissed {
            provider,
            items,
            scope,
            error,
            at,
        } => {
            assert_eq!(provider.as_str(), "cloudflare");
            assert_eq!(items, &["price-1", "price-2"]);
            assert_eq!(scope, "tags");
            assert!(error.contains("authentication failed"));
            assert_eq!(*at, Timestamp::from_secs(1_000));
        }
        other => panic!("expected PurgeMissed, got {other:?}"),
    }
    assert_eq!(
        event.health_signal(),
        Some(multicdn_core::HealthState::Down)
    );
    assert_eq!(events, &[event]);
    assert_eq!(err.failed_providers().len(), 1);
}

#[tokio::test]
async fn a_provider_failing_part_way_misses_exactly_its_failed_and_unsent_chunks() {
    let f = fastly_ok(1).await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_success())
        .up_to_n_times(1)
        .mount(&cf)
        .await;
    Mock::given(CloudflarePurge)
        .respond_with(ResponseTemplate::new(502).set_body_string("bad gateway"))
        .expect(2)
        .mount(&cf)
        .await;
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri())).with_in_flight(1);
    let all = tags(250);
    let err = fanout
        .purge(&PurgeRequest::tags(all.clone()))
        .await
        .unwrap_err();
    let FanoutError::Missed { failures, .. } = &err else {
        panic!("{err:?}");
    };
    let failure = &failures[0];
    // The first chunk was acknowledged; the second failed (after 2 attempts); the third was
    // not sent to a provider that is being demoted.
    assert_eq!(failure.missed, all[100..]);
    let acked = failure.acknowledged.as_ref().unwrap();
    assert_eq!((acked.items, acked.requests), (100, 1));
    assert!(failure.error.may_have_applied());
}

#[tokio::test]
async fn a_kind_one_provider_cannot_do_is_refused_before_anything_is_sent() {
    let f = fastly_ok(0).await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_success())
        .expect(0)
        .mount(&cf)
        .await;
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri()))
        .with_events(EventSink::new(move |e| seen.lock().unwrap().push(e)));
    let hosts = PurgeRequest {
        scope: PurgeScope::Hosts(vec!["www.example.com".into()]),
        soft: false,
    };
    let err = fanout.purge(&hosts).await.unwrap_err();
    let FanoutError::Refused { errors, reason } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(errors.len(), 1);
    assert!(
        matches!(&errors[0], Error::Unsupported { provider, .. } if provider.as_str() == "fastly")
    );
    assert!(reason.contains("purge by hosts"), "{reason}");
    // A soft purge: Cloudflare cannot.
    let err = fanout
        .purge(&PurgeRequest::tags(["a"]).soft())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("cloudflare") && err.to_string().contains("soft purge"),
        "{err}"
    );
    assert!(
        events.lock().unwrap().is_empty(),
        "a refusal demotes no one"
    );
    assert!(err.failed_providers().is_empty());
    let empty = PurgeFanout::new(Vec::<FanoutMember>::new())
        .purge(&PurgeRequest::tags(["a"]))
        .await
        .unwrap_err();
    assert!(empty.to_string().contains("no providers"), "{empty}");
}

fn tight_server_limits() -> PurgeLimits {
    PurgeLimits {
        fastly_purges: (2_000.0, 2_000),
        fastly_non_read: (1.0, 10),
        cloudflare_purge: (20.0, 2),
        cloudflare_global: (1_000.0, 1_000),
    }
}

fn tight_members(server: &PurgeApi) -> Vec<FanoutMember> {
    let f = fastly(&server.fastly_base(), fast(4))
        .with_limits(FastlyLimits::default().with_purges(RateLimit::new(2_000.0, 2_000)));
    let cf = cloudflare(
        &server.cloudflare_base(),
        CloudflareLimits::default()
            .with_purge(RateLimit::new(20.0, 2))
            .with_global(RateLimit::new(1_000.0, 1_000)),
        fast(4),
    );
    vec![
        FanoutMember::new(Arc::new(f)),
        FanoutMember::new(Arc::new(cf)),
    ]
}

#[tokio::test]
async fn queued_purge_reports_progress_and_paces_to_the_slowest_provider_without_429s() {
    let server = PurgeApi::start_limited(tight_server_limits())
        .await
        .unwrap();
    let fanout = PurgeFanout::new(tight_members(&server));
    let request = PurgeRequest::tags(tags(1_000));
    // Cloudflare is the ceiling: 10 chunks of 100, 2 at once then 20 a second.
    let ideal = fanout.ideal_times(&request);
    assert_eq!(ideal[0].0.as_str(), "cloudflare");
    assert_eq!(ideal[0].1, Duration::from_millis(400));
    let mut seen: Vec<QueueProgress> = Vec::new();
    let report = fanout
        .purge_queued(&request, |p| seen.push(p.clone()))
        .await
        .unwrap();
    assert_eq!(server.too_many(), 0, "the queue never provokes a 429");
    assert_eq!(seen.len(), 10);
    assert!(seen.windows(2).all(|w| w[0].chunks_done < w[1].chunks_done));
    let last = seen.last().unwrap();
    assert_eq!(
        (
            last.chunks_done,
            last.chunks_total,
            last.items_done,
            last.items_total
        ),
        (10, 10, 1_000, 1_000)
    );
    assert!(
        report.elapsed >= Duration::from_millis(400),
        "{:?}",
        report.elapsed
    );
    assert!(
        report.elapsed < Duration::from_millis(900),
        "{:?}",
        report.elapsed
    );
    assert_eq!(report.ideal, Duration::from_millis(400));
    for r in &report.receipts {
        assert_eq!((r.items, r.requests), (1_000, 10), "{r:?}");
    }
}

#[tokio::test]
async fn an_unpaced_burst_past_the_limit_is_answered_429_by_the_test_server() {
    // The loopback server really enforces the limits: a purger whose own budget is looser
    // than the server's meets 429s (and retries through them).
    let server = PurgeApi::start_limited(tight_server_limits())
        .await
        .unwrap();
    let cf = cloudflare(
        &server.cloudflare_base(),
        CloudflareLimits::default().with_purge(RateLimit::new(1_000.0, 1_000)),
        fast(10).with_backoff(Duration::from_millis(20), Duration::from_millis(60)),
    );
    use multicdn_core::Purger;
    let r = cf.purge(&PurgeRequest::tags(tags(500))).await.unwrap();
    assert!(server.too_many() > 0);
    assert!(r.attempts > r.requests, "{r:?}");
}

#[tokio::test]
async fn a_provider_failing_in_a_queued_purge_is_dropped_and_demoted_once_while_the_other_finishes()
{
    let f = fastly_ok(5).await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_401())
        .mount(&cf)
        .await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri()))
        .with_events(EventSink::channel(tx))
        .with_queue_in_flight(1);
    let all = tags(500);
    let mut failed_seen = Vec::new();
    let err = fanout
        .purge_queued(&PurgeRequest::tags(all.clone()), |p| {
            failed_seen.push(p.failed.len())
        })
        .await
        .unwrap_err();
    let FanoutError::Missed {
        failures,
        receipts,
        events,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(failures[0].provider.as_str(), "cloudflare");
    assert_eq!(failures[0].missed, all);
    assert_eq!(receipts[0].items, 500);
    assert_eq!(events.len(), 1);
    // Only the first chunk reached Cloudflare; the rest were not sent.
    assert_eq!(cf.received_requests().await.unwrap().len(), 1);
    assert!(matches!(rx.try_recv().unwrap(), Event::PurgeMissed { items, .. } if items == all));
    assert!(rx.try_recv().is_err());
    assert_eq!(failed_seen, [1, 1, 1, 1, 1]);
    // What it missed is remembered for a retry; Fastly has nothing outstanding.
    let outstanding = fanout.outstanding();
    assert_eq!(outstanding.len(), 1);
    assert_eq!(outstanding[&pid("cloudflare")].items("tags").len(), 500);
}

#[tokio::test]
async fn a_malformed_item_is_refused_everywhere_before_anything_is_sent() {
    // A key with a space is a valid Cloudflare tag but not a Fastly surrogate key: purging it
    // on Cloudflare alone would leave the providers disagreeing, so nothing is sent.
    let f = fastly_ok(0).await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_success())
        .expect(0)
        .mount(&cf)
        .await;
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri()));
    let err = fanout
        .purge(&PurgeRequest::tags(["ok", "has space"]))
        .await
        .unwrap_err();
    let FanoutError::Refused { errors, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(
        matches!(&errors[0], Error::InvalidRequest { provider, .. } if provider.as_str() == "fastly")
    );
    assert!(err.to_string().contains("whitespace"), "{err}");
    let queued = fanout
        .purge_queued(&PurgeRequest::tags(["has space"]), |_| {})
        .await
        .unwrap_err();
    assert!(matches!(queued, FanoutError::Refused { .. }), "{queued:?}");
}

#[tokio::test]
async fn a_failed_provider_stops_setting_the_pace_of_a_queued_purge() {
    let f = fastly_ok(5).await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_401())
        .mount(&cf)
        .await;
    // Cloudflare would allow one chunk, then one every 500 ms: 2 s for 5 chunks.
    let slow_cf = cloudflare(
        &cf.uri(),
        CloudflareLimits::default().with_purge(RateLimit::new(2.0, 1)),
        fast(1),
    );
    let fanout = PurgeFanout::new(vec![
        FanoutMember::new(Arc::new(fastly(&f.uri(), fast(1)))),
        FanoutMember::new(Arc::new(slow_cf)),
    ])
    .with_queue_in_flight(1);
    let watch = Stopwatch::start();
    let err = fanout
        .purge_queued(&PurgeRequest::tags(tags(500)), |_| {})
        .await
        .unwrap_err();
    assert!(
        watch.elapsed() < Duration::from_millis(400),
        "{:?}",
        watch.elapsed()
    );
    let FanoutError::Missed { receipts, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(receipts[0].items, 500);
}

/// Collects every event the fan-out emits.
fn collecting() -> (EventSink, Arc<Mutex<Vec<Event>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    (
        EventSink::new(move |e| seen.lock().unwrap().push(e)),
        events,
    )
}

fn recovered_events(events: &Mutex<Vec<Event>>) -> Vec<Event> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Event::PurgeRecovered { .. }))
        .cloned()
        .collect()
}

/// The JSON bodies of the requests `server` received after the first `skip`.
async fn bodies_after(server: &MockServer, skip: usize) -> Vec<serde_json::Value> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .skip(skip)
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

/// Cloudflare answering 401 `fails` times, then acknowledging.
async fn cloudflare_failing_then_ok(fails: u64) -> MockServer {
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_401())
        .up_to_n_times(fails)
        .mount(&cf)
        .await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_success())
        .mount(&cf)
        .await;
    cf
}

#[tokio::test]
async fn a_missed_purge_retried_successfully_is_recovered_once_and_leaves_nothing_outstanding() {
    let f = fastly_ok(1).await;
    let cf = cloudflare_failing_then_ok(1).await;
    let (sink, events) = collecting();
    let clock = ManualClock::new(Timestamp::from_secs(1_000));
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri()))
        .with_events(sink)
        .with_clock(Arc::new(clock.clone()));
    let request = PurgeRequest::tags(["price-1", "price-2"]);
    assert!(fanout.purge(&request).await.is_err());
    let outstanding = fanout.outstanding();
    assert_eq!(
        outstanding.keys().map(|p| p.as_str()).collect::<Vec<_>>(),
        ["cloudflare"]
    );
    let missed = &outstanding[&pid("cloudflare")];
    assert_eq!(missed.items("tags"), ["price-1", "price-2"]);
    assert!(!missed.everything());
    assert_eq!(missed.requests(), std::slice::from_ref(&request));

    clock.advance(Duration::from_secs(60));
    let report = fanout.retry_missed().await.unwrap();
    assert_eq!(report.recovered, [pid("cloudflare")]);
    let recovered = Event::PurgeRecovered {
        provider: pid("cloudflare"),
        at: Timestamp::from_secs(1_060),
    };
    assert_eq!(report.events, std::slice::from_ref(&recovered));
    assert_eq!(
        recovered.health_signal(),
        Some(multicdn_core::HealthState::Up)
    );
    assert_eq!(
        report.receipts.len(),
        1,
        "only Cloudflare was sent anything"
    );
    assert_eq!(
        (
            report.receipts[0].provider.as_str(),
            report.receipts[0].items
        ),
        ("cloudflare", 2)
    );
    assert!(fanout.outstanding().is_empty());
    assert_eq!(recovered_events(&events), [recovered]);

    // Nothing outstanding: a second retry sends nothing and emits nothing.
    let again = fanout.retry_missed().await.unwrap();
    assert!(again.receipts.is_empty() && again.recovered.is_empty());
    assert_eq!(cf.received_requests().await.unwrap().len(), 2);
    assert_eq!(events.lock().unwrap().len(), 2, "one missed, one recovered");
    // A later purge both acknowledge recovers no one: nothing was outstanding.
    let f2 = fastly_ok(1).await;
    let calm = PurgeFanout::new(members(&f2.uri(), &cf.uri()));
    assert!(calm.purge(&request).await.unwrap().recovered.is_empty());
}

#[tokio::test]
async fn misses_kept_across_a_restart_are_restored_and_retried() {
    let f = fastly_ok(1).await;
    let cf = cloudflare_failing_then_ok(1).await;
    let before = PurgeFanout::new(members(&f.uri(), &cf.uri()));
    let request = PurgeRequest::tags(["price-1", "price-2"]);
    assert!(before.purge(&request).await.is_err());
    // What a service writes down before it stops...
    let kept = serde_json::to_string(&before.outstanding()).unwrap();
    drop(before);

    // ...and hands to the fan-out of the process that replaces it.
    let after = PurgeFanout::new(members(&f.uri(), &cf.uri()));
    let record: std::collections::BTreeMap<ProviderId, Outstanding> =
        serde_json::from_str(&kept).unwrap();
    assert_eq!(after.restore(&record).unwrap(), [pid("cloudflare")]);
    assert_eq!(
        after.outstanding()[&pid("cloudflare")].requests(),
        std::slice::from_ref(&request)
    );
    let report = after.retry_missed().await.unwrap();
    assert_eq!(report.recovered, [pid("cloudflare")]);
    assert_eq!(
        report.receipts.len(),
        1,
        "only Cloudflare was sent anything"
    );
    assert_eq!(report.receipts[0].items, 2);
    assert!(after.outstanding().is_empty());

    // Misses of a provider the fan-out cannot purge are refused, and nothing is restored.
    let mut stray = record.clone();
    stray.insert(pid("akamai"), record[&pid("cloudflare")].clone());
    let err = after.restore(&stray).unwrap_err();
    assert_eq!(err.providers, [pid("akamai")]);
    assert!(err.to_string().contains("akamai"), "{err}");
    assert!(after.outstanding().is_empty());
}

#[tokio::test]
async fn a_retry_re_sends_only_the_missed_items_batched_and_only_to_the_provider_that_missed_them()
{
    let f = fastly_ok(1).await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_success())
        .up_to_n_times(1)
        .mount(&cf)
        .await;
    Mock::given(CloudflarePurge)
        .respond_with(ResponseTemplate::new(502).set_body_string("bad gateway"))
        .up_to_n_times(2)
        .mount(&cf)
        .await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_success())
        .mount(&cf)
        .await;
    let (sink, events) = collecting();
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri()))
        .with_events(sink)
        .with_in_flight(1);
    let all = tags(250);
    assert!(
        fanout
            .purge(&PurgeRequest::tags(all.clone()))
            .await
            .is_err()
    );
    // The first 100 were acknowledged; the rest are outstanding.
    assert_eq!(
        fanout.outstanding()[&pid("cloudflare")].items("tags"),
        all[100..].iter().map(String::as_str).collect::<Vec<_>>()
    );
    let before = cf.received_requests().await.unwrap().len();
    assert_eq!(before, 3, "one acknowledged chunk, one failed twice");

    let report = fanout.retry_missed().await.unwrap();
    assert_eq!(report.recovered, [pid("cloudflare")]);
    let sent = bodies_after(&cf, before).await;
    // Batched to Cloudflare's 100 a request, exactly the 150 missed tags, nothing else.
    assert_eq!(sent.len(), 2);
    let mut resent: Vec<String> = sent
        .iter()
        .flat_map(|b| {
            let tags = b["tags"].as_array().unwrap();
            assert!(tags.len() <= 100, "{b}");
            tags.iter().map(|t| t.as_str().unwrap().to_owned())
        })
        .collect();
    resent.sort();
    assert_eq!(resent, all[100..]);
    assert_eq!(report.receipts[0].requests, 2);
    // Fastly acknowledged the original purge and was sent nothing on retry.
    assert_eq!(f.received_requests().await.unwrap().len(), 1);
    assert_eq!(recovered_events(&events).len(), 1);
}

#[tokio::test]
async fn a_later_purge_covering_the_missed_items_clears_them_and_a_partial_one_does_not() {
    let f = fastly_ok(3).await;
    let cf = cloudflare_failing_then_ok(1).await;
    let (sink, events) = collecting();
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri())).with_events(sink);
    assert!(
        fanout
            .purge(&PurgeRequest::tags(["a", "b", "c"]))
            .await
            .is_err()
    );
    // Only part of what was missed: still behind, no recovery.
    let partial = fanout.purge(&PurgeRequest::tags(["a", "b"])).await.unwrap();
    assert!(partial.recovered.is_empty() && partial.events.is_empty());
    assert_eq!(
        fanout.outstanding()[&pid("cloudflare")].items("tags"),
        ["c"]
    );
    // A superset: every miss is covered.
    let report = fanout
        .purge(&PurgeRequest::tags(["a", "b", "c", "d"]))
        .await
        .unwrap();
    assert_eq!(report.recovered, [pid("cloudflare")]);
    assert!(fanout.outstanding().is_empty());
    assert_eq!(recovered_events(&events).len(), 1);
}

#[tokio::test]
async fn a_retry_that_fails_again_keeps_the_miss_and_recovers_nothing() {
    let f = fastly_ok(1).await;
    let cf = MockServer::start().await;
    Mock::given(CloudflarePurge)
        .respond_with(cf_401())
        .mount(&cf)
        .await;
    let (sink, events) = collecting();
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri())).with_events(sink);
    let request = PurgeRequest::tags(["price-1", "price-2"]);
    assert!(fanout.purge(&request).await.is_err());
    let before = fanout.outstanding();

    let err = fanout.retry_missed().await.unwrap_err();
    let FanoutError::Missed {
        failures,
        receipts,
        events: emitted,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].provider.as_str(), "cloudflare");
    assert_eq!(failures[0].missed, ["price-1", "price-2"]);
    assert!(receipts.is_empty(), "Fastly had nothing to retry");
    assert!(
        emitted
            .iter()
            .all(|e| matches!(e, Event::PurgeMissed { .. })),
        "{emitted:?}"
    );
    assert_eq!(fanout.outstanding(), before, "the miss is kept");
    assert!(recovered_events(&events).is_empty());
    assert_eq!(f.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_missed_purge_of_everything_is_retried_as_one_and_then_recovered() {
    let f = MockServer::start().await;
    Mock::given(method("POST"))
        .and(header("fastly-key", FASTLY_TOKEN))
        .and(path(format!("/service/{SERVICE}/purge_all")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "ok"})))
        .expect(1)
        .mount(&f)
        .await;
    Mock::given(method("POST"))
        .and(header("fastly-key", FASTLY_TOKEN))
        .and(path(format!("/service/{SERVICE}/purge/a")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"status": "ok", "id": "1"})))
        .expect(1)
        .mount(&f)
        .await;
    let cf = cloudflare_failing_then_ok(2).await;
    let (sink, events) = collecting();
    let fanout = PurgeFanout::new(members(&f.uri(), &cf.uri())).with_events(sink);
    assert!(fanout.purge(&PurgeRequest::tags(["a"])).await.is_err());
    assert!(fanout.purge(&PurgeRequest::everything()).await.is_err());
    // The missed purge of everything stands for the tag missed before it.
    let outstanding = fanout.outstanding();
    let missed = &outstanding[&pid("cloudflare")];
    assert!(missed.everything());
    assert_eq!(missed.item_count(), 0);
    assert_eq!(missed.requests(), [PurgeRequest::everything()]);

    let report = fanout.retry_missed().await.unwrap();
    assert_eq!(report.recovered, [pid("cloudflare")]);
    let sent = bodies_after(&cf, 2).await;
    assert_eq!(sent, [json!({"purge_everything": true})]);
    assert!(fanout.outstanding().is_empty());
    assert_eq!(recovered_events(&events).len(), 1);
}

/// A team's own purger (an in-house cache): it says what it accepts and how it is paced, and
/// nothing else is needed for the fan-out to batch, refuse and check it like the vendors'.
#[derive(Debug)]
struct InHouse {
    id: ProviderId,
    batches: Mutex<Vec<usize>>,
}

#[async_trait::async_trait]
impl multicdn_core::Purger for InHouse {
    fn provider(&self) -> &ProviderId {
        &self.id
    }
    async fn purge(&self, request: &PurgeRequest) -> Result<multicdn_core::PurgeReceipt, Error> {
        let n = request.scope.items().len();
        self.batches.lock().unwrap().push(n);
        Ok(multicdn_core::PurgeReceipt::new(
            self.id.clone(),
            vec![],
            n,
            1,
            1,
            Duration::ZERO,
        ))
    }
    fn pacing(&self) -> multicdn_core::Pacing {
        multicdn_core::Pacing::default().with_kind(
            &PurgeScope::Tags(vec![]),
            Some(multicdn_core::KindPacing::new(3, vec![])),
        )
    }
    fn validate(&self, request: &PurgeRequest) -> Result<(), Error> {
        self.pacing()
            .check(request)
            .map_err(|feature| Error::Unsupported {
                provider: self.id.clone(),
                feature,
            })?;
        match request.scope.items().iter().find(|t| t.contains(' ')) {
            Some(t) => Err(Error::InvalidRequest {
                provider: self.id.clone(),
                message: format!("tag {t:?} has a space"),
            }),
            None => Ok(()),
        }
    }
}

#[tokio::test]
async fn a_third_party_purger_brings_its_own_pacing_and_checks_to_the_fan_out() {
    let f = fastly_ok(1).await;
    let own = Arc::new(InHouse {
        id: pid("in-house"),
        batches: Mutex::new(Vec::new()),
    });
    let fanout = PurgeFanout::new([
        FanoutMember::new(Arc::new(fastly(&f.uri(), fast(1)))),
        FanoutMember::new(own.clone()),
    ]);
    // Its three-tags-a-request limit batches seven tags as 3 + 3 + 1; Fastly sends one batch.
    let report = fanout
        .purge(&PurgeRequest::tags(tags(7).iter().map(String::as_str)))
        .await
        .unwrap();
    assert_eq!(report.receipts.len(), 2);
    assert_eq!(*own.batches.lock().unwrap(), [3, 3, 1]);
    // It cannot purge URLs: refused before Fastly is sent anything (fastly_ok expects 1 call).
    let refused = fanout
        .purge(&PurgeRequest::urls(["https://www.example.com/a"]))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, FanoutError::Refused { reason, .. } if reason.contains("in-house") && reason.contains("purge by urls")),
        "{refused}"
    );
    // Its own check refuses a malformed tag everywhere.
    let bad = fanout
        .purge(&PurgeRequest::tags(["ok", "not ok"]))
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("has a space"), "{bad}");
    assert_eq!(own.batches.lock().unwrap().len(), 3);
}
