//! The monitor: rounds, quorum and hysteresis end to end, with real HTTP probes against loopback

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests and their helpers fail loudly
//! edges, and the loop itself on paused time with runners that do no I/O.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use multicdn_core::{
    Clock, Error, Event, FailReason, HealthCheck, HealthState, ManualClock, Observation, Outcome,
    Policy, Severity, Target, Timestamp,
};
use multicdn_health::{
    HealthConfig, HealthError, HttpProbe, Monitor, RoundVerdict, targets_from_policy,
};
use support::{BrokenPath, EdgeServer, FakeRunner, REGIONS, edge, id, region};

const START: Timestamp = Timestamp::from_secs(1_800_000_000);
const INTERVAL: Duration = Duration::from_secs(30);

fn policy() -> Policy {
    Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap()
}

/// Two loopback edges (fastly, cloudflare) and a monitor over them built from the policy, with
/// five real HTTP runners; `broken` names runners whose path to the edges is dead.
struct Live {
    fastly: EdgeServer,
    cloudflare: EdgeServer,
    clock: ManualClock,
    monitor: Monitor,
}

async fn live(broken: &[&str]) -> Live {
    let fastly = edge("fastly").await;
    let cloudflare = edge("cloudflare").await;
    let overrides = BTreeMap::from([
        (id("fastly"), fastly.base_url()),
        (id("cloudflare"), cloudflare.base_url()),
    ]);
    let policy = policy();
    let clock = ManualClock::new(START);
    let mut builder = Monitor::builder(HealthConfig::from_policy(&policy.health))
        .clock(clock.clone())
        .concurrency(8)
        .targets(targets_from_policy(&policy, &overrides).unwrap());
    let dead = support::dead_port_url().await;
    for r in REGIONS {
        let probe = HttpProbe::builder(region(r))
            .clock(clock.clone())
            .build()
            .unwrap();
        builder = if broken.contains(&r) {
            builder.runner(BrokenPath {
                probe,
                base: dead.clone(),
            })
        } else {
            builder.runner(probe)
        };
    }
    Live {
        fastly,
        cloudflare,
        clock,
        monitor: builder.build().unwrap(),
    }
}

impl Live {
    async fn round(&self) -> Vec<Event> {
        self.clock.advance(INTERVAL);
        let report = self.monitor.round_once().await;
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        report.events
    }
}

fn paging(events: &[Event]) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| e.severity() == Severity::Page)
        .collect()
}

#[tokio::test]
async fn one_runner_failing_forever_never_demotes() {
    let l = live(&["ap-southeast"]).await;
    for _ in 0..30 {
        let events = l.round().await;
        // Two unhappy probes (one per provider), both from the broken runner; nothing pages.
        assert_eq!(events.len(), 2, "{events:?}");
        for e in &events {
            match e {
                Event::ProbeUnhappy { runner, reason, .. } => {
                    assert_eq!(runner.as_str(), "ap-southeast");
                    assert!(matches!(reason, FailReason::Connect { .. }), "{reason:?}");
                }
                other => panic!("only probe-unhappy events expected, got {other:?}"),
            }
        }
    }
    let snap = l.monitor.snapshot();
    assert!(snap.in_service(&id("fastly")) && snap.in_service(&id("cloudflare")));
    assert_eq!(snap.rounds, 30);
}

#[tokio::test]
async fn two_bad_quorum_rounds_demote() {
    let l = live(&[]).await;
    l.fastly.set_healthy(false);
    let first = l.round().await;
    assert_eq!(first.len(), 5, "five unhappy probes of fastly: {first:?}");
    assert!(paging(&first).is_empty());
    assert_eq!(
        l.monitor.snapshot().state(&id("fastly")),
        Some(HealthState::Up)
    );

    let second = l.round().await;
    let pages = paging(&second);
    assert_eq!(pages.len(), 1, "{second:?}");
    match pages[0] {
        Event::QuorumDown {
            provider,
            failing,
            voting,
            at,
            ..
        } => {
            assert_eq!(provider, &id("fastly"));
            assert_eq!((failing.len(), *voting), (5, 5));
            assert_eq!(*at, START + 2 * INTERVAL);
        }
        other => panic!("expected quorum down, got {other:?}"),
    }
    let snap = l.monitor.snapshot();
    assert!(snap.is_down(&id("fastly")));
    assert!(snap.in_service(&id("cloudflare")));
    // The edges saw the probes: 2 rounds x 5 runners each.
    assert_eq!(l.fastly.requests().len(), 10);
    assert_eq!(l.cloudflare.requests().len(), 10);
}

#[tokio::test]
async fn ten_good_rounds_recover_and_nine_do_not() {
    let l = live(&[]).await;
    l.fastly.set_healthy(false);
    l.round().await;
    l.round().await;
    assert!(l.monitor.snapshot().is_down(&id("fastly")));
    l.fastly.set_healthy(true);
    for i in 1..=9 {
        let events = l.round().await;
        assert!(events.is_empty(), "round {i}: {events:?}");
        assert!(
            l.monitor.snapshot().is_down(&id("fastly")),
            "recovered after only {i} rounds"
        );
    }
    let tenth = l.round().await;
    assert_eq!(
        tenth,
        vec![Event::Recovered {
            provider: id("fastly"),
            at: START + 12 * INTERVAL
        }]
    );
    assert!(l.monitor.snapshot().in_service(&id("fastly")));
}

#[tokio::test]
async fn a_flapping_edge_never_moves_traffic() {
    let l = live(&[]).await;
    for i in 0..20 {
        l.fastly.set_healthy(i % 2 == 1);
        let events = l.round().await;
        assert!(paging(&events).is_empty(), "round {i}: {events:?}");
        assert!(events.iter().all(|e| e.health_signal().is_none()));
    }
    assert!(l.monitor.snapshot().in_service(&id("fastly")));
}

#[tokio::test]
async fn an_error_page_outage_takes_a_provider_down_too() {
    // Edges answering 200 with an error page: the content check fails, the quorum agrees.
    let l = live(&[]).await;
    let mut target = Target::new(id("fastly"), l.fastly.url("/error-page"), "healthy-v3");
    target.host = Some("www.example.com".into());
    let mut builder = Monitor::builder(HealthConfig::default())
        .clock(l.clock.clone())
        .target(target);
    for r in REGIONS {
        builder = builder.runner(
            HttpProbe::builder(region(r))
                .clock(l.clock.clone())
                .build()
                .unwrap(),
        );
    }
    let m = builder.build().unwrap();
    m.round_once().await;
    let report = m.round_once().await;
    assert!(
        report
            .events
            .iter()
            .any(|e| matches!(e, Event::QuorumDown { .. }))
    );
    let snap = m.snapshot();
    match &snap.get(&id("fastly")).unwrap().last_verdict {
        Some(RoundVerdict::Down { failing, .. }) => assert_eq!(failing.len(), 5),
        other => panic!("{other:?}"),
    }
}

// ---- the loop, on paused time, with runners that do no I/O ----

fn fake_monitor(clock: &ManualClock, runners: &[FakeRunner], config: HealthConfig) -> Monitor {
    let mut b = Monitor::builder(config)
        .clock(clock.clone())
        .target(Target::new(
            id("fastly"),
            "https://a.example.net/_health/v3.txt",
            "healthy-v3",
        ))
        .target(Target::new(
            id("cloudflare"),
            "https://b.example.net/_health/v3.txt",
            "healthy-v3",
        ));
    for r in runners {
        b = b.runner(r.clone());
    }
    b.build().unwrap()
}

fn five(clock: &ManualClock) -> Vec<FakeRunner> {
    REGIONS.iter().map(|r| FakeRunner::new(r, clock)).collect()
}

#[tokio::test(start_paused = true)]
async fn verdicts_are_readable_before_any_round() {
    let clock = ManualClock::new(START);
    let m = fake_monitor(&clock, &five(&clock), HealthConfig::default());
    let snap = m.snapshot();
    assert_eq!(snap.rounds, 0);
    assert_eq!(snap.at, None);
    assert!(snap.in_service(&id("fastly")) && snap.in_service(&id("cloudflare")));
}

#[tokio::test(start_paused = true)]
async fn run_probes_every_interval_until_shutdown() {
    let clock = ManualClock::new(START);
    let runners = five(&clock);
    let m = fake_monitor(
        &clock,
        &runners,
        HealthConfig::default().with_interval(INTERVAL),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let looping = m.clone();
    let task = tokio::spawn(async move {
        looping
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    let mut watch = m.watch();
    // Rounds at 0 s, 30 s, 60 s and 90 s.
    tokio::time::sleep(Duration::from_secs(95)).await;
    assert_eq!(m.snapshot().rounds, 4);
    let calls: usize = runners.iter().map(|r| r.calls.load(Ordering::SeqCst)).sum();
    assert_eq!(calls, 4 * 5 * 2);
    assert!(watch.has_changed().unwrap());
    watch.mark_unchanged();

    stop.send(()).unwrap();
    task.await.unwrap();
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(m.snapshot().rounds, 4, "no round after shutdown");
    assert!(!watch.has_changed().unwrap());
}

#[tokio::test(start_paused = true)]
async fn the_loop_demotes_and_recovers_publishing_pages_apart_from_unhappy_probes() {
    let clock = ManualClock::new(START);
    let runners = five(&clock);
    let m = fake_monitor(&clock, &runners, HealthConfig::default());
    let mut events = m.subscribe();
    for r in &runners[..3] {
        r.fail(&id("fastly"), true);
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let looping = m.clone();
    let task = tokio::spawn(async move {
        looping
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    // Two rounds (0 s, 30 s): down.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(m.snapshot().is_down(&id("fastly")));
    for r in &runners[..3] {
        r.fail(&id("fastly"), false);
    }
    // Ten good rounds (60 s .. 330 s): recovered.
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(m.snapshot().in_service(&id("fastly")));
    stop.send(()).unwrap();
    task.await.unwrap();

    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    let unhappy = seen
        .iter()
        .filter(|e| matches!(e, Event::ProbeUnhappy { .. }))
        .count();
    assert_eq!(unhappy, 6, "three runners, two rounds");
    let signals: Vec<(Severity, Option<HealthState>)> = seen
        .iter()
        .filter(|e| e.health_signal().is_some())
        .map(|e| (e.severity(), e.health_signal()))
        .collect();
    assert_eq!(
        signals,
        vec![
            (Severity::Page, Some(HealthState::Down)),
            (Severity::Info, Some(HealthState::Up))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn observations_from_remote_runners_join_the_same_quorum() {
    let clock = ManualClock::new(START);
    // Two runners in this process, both failing fastly: short of a quorum of three.
    let local: Vec<FakeRunner> = ["eu-west", "us-east"]
        .iter()
        .map(|r| FakeRunner::new(r, &clock))
        .collect();
    for r in &local {
        r.fail(&id("fastly"), true);
    }
    let m = fake_monitor(&clock, &local, HealthConfig::default());
    for _ in 0..5 {
        m.round_once().await;
        clock.advance(INTERVAL);
    }
    assert!(
        !m.snapshot().is_down(&id("fastly")),
        "two runners cannot reach a quorum of three"
    );

    // A third runner elsewhere reports over the wire (JSON here; any transport would do).
    for _ in 0..2 {
        let remote = Observation::new(
            id("fastly"),
            region("ap-southeast"),
            clock.now(),
            Outcome::Fail {
                reason: FailReason::Timeout,
            },
            Duration::from_secs(3),
        );
        let wire = serde_json::to_vec(&remote).unwrap();
        let event = m.ingest(serde_json::from_slice(&wire).unwrap()).unwrap();
        assert!(matches!(event, Some(Event::ProbeUnhappy { .. })));
        m.round_once().await;
        clock.advance(INTERVAL);
    }
    assert!(m.snapshot().is_down(&id("fastly")));

    let stranger = Observation::new(
        id("akamai"),
        region("eu-west"),
        clock.now(),
        Outcome::Pass,
        Duration::ZERO,
    );
    assert!(matches!(
        m.ingest(stranger),
        Err(HealthError::UnknownProvider { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn an_isolated_runner_can_never_mark_a_cdn_down() {
    let clock = ManualClock::new(START);
    let alone = FakeRunner::new("ap-southeast", &clock);
    alone.fail(&id("fastly"), true);
    let m = fake_monitor(
        &clock,
        std::slice::from_ref(&alone),
        HealthConfig::default(),
    );
    for _ in 0..50 {
        let report = m.round_once().await;
        assert!(report.events.iter().all(|e| e.severity() == Severity::Info));
        clock.advance(INTERVAL);
    }
    assert!(!m.snapshot().is_down(&id("fastly")));
}

#[tokio::test(start_paused = true)]
async fn draining_is_published_and_kept_apart_from_health() {
    let clock = ManualClock::new(START);
    let m = fake_monitor(&clock, &five(&clock), HealthConfig::default());
    let mut watch = m.watch();
    m.set_drained(&id("cloudflare"), true).unwrap();
    assert!(watch.has_changed().unwrap());
    let snap = watch.borrow_and_update().clone();
    let h = snap.get(&id("cloudflare")).unwrap();
    assert_eq!(
        (h.state, h.drained, h.in_service()),
        (HealthState::Up, true, false)
    );
    m.round_once().await;
    assert!(
        m.snapshot().get(&id("cloudflare")).unwrap().drained,
        "a round does not undrain"
    );
    assert!(m.set_drained(&id("akamai"), true).is_err());
}

/// A runner that takes 100 ms (tokio time) per probe and records how many run at once.
#[derive(Debug, Clone)]
struct Slow {
    inner: FakeRunner,
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

#[async_trait]
impl HealthCheck for Slow {
    async fn check(&self, target: &Target) -> Result<Observation, Error> {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.inner.check(target).await
    }
}

#[tokio::test(start_paused = true)]
async fn probes_in_flight_never_exceed_the_concurrency() {
    let clock = ManualClock::new(START);
    let (now, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut b = Monitor::builder(HealthConfig::default())
        .clock(clock.clone())
        .concurrency(4);
    for i in 0..10 {
        b = b.target(Target::new(
            id(&format!("p{i}")),
            "https://x.example.net/h",
            "ok",
        ));
    }
    for r in REGIONS {
        b = b.runner(Slow {
            inner: FakeRunner::new(r, &clock),
            now: now.clone(),
            max: max.clone(),
        });
    }
    let m = b.build().unwrap();
    let report = m.round_once().await;
    assert_eq!(report.observed, 50);
    assert_eq!(max.load(Ordering::SeqCst), 4);
}

#[derive(Debug)]
struct Refuses;

#[async_trait]
impl HealthCheck for Refuses {
    async fn check(&self, target: &Target) -> Result<Observation, Error> {
        Err(Error::InvalidRequest {
            provider: target.provider.clone(),
            message: "target URL is not a URL".into(),
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_check_that_cannot_run_is_reported_and_casts_no_vote() {
    let m = Monitor::builder(HealthConfig::default())
        .target(Target::new(id("fastly"), "nope", "ok"))
        .runner(Refuses)
        .build()
        .unwrap();
    let report = m.round_once().await;
    assert_eq!((report.observed, report.errors.len()), (0, 1));
    let msg = report.errors[0].to_string();
    assert!(msg.contains("fastly") && msg.contains("not a URL"), "{msg}");
    assert!(matches!(
        m.snapshot().get(&id("fastly")).unwrap().last_verdict,
        Some(RoundVerdict::NoVerdict { voting: 0, .. })
    ));
}

#[test]
fn monitors_that_cannot_work_are_refused() {
    let t = || Target::new(id("fastly"), "https://a.example.net/h", "ok");
    let none = Monitor::builder(HealthConfig::default())
        .build()
        .unwrap_err();
    assert!(none.to_string().contains("at least one target"), "{none}");
    let twice = Monitor::builder(HealthConfig::default())
        .target(t())
        .target(t())
        .build()
        .unwrap_err();
    assert!(
        twice.to_string().contains("fastly has two targets"),
        "{twice}"
    );
    let zero = Monitor::builder(HealthConfig::default())
        .target(t())
        .concurrency(0)
        .build()
        .unwrap_err();
    assert!(zero.to_string().contains("concurrency"), "{zero}");
    let bad = Monitor::builder(HealthConfig::default().with_quorum(0))
        .target(t())
        .build()
        .unwrap_err();
    assert!(bad.to_string().contains("quorum"), "{bad}");
}

#[test]
fn the_loop_and_the_tools_can_be_spawned() {
    fn is_send<T: Send + 'static>(_: &T) {}
    let clock = ManualClock::new(START);
    let m = fake_monitor(&clock, &five(&clock), HealthConfig::default());
    let looping = m.clone();
    is_send(&async move { looping.run(std::future::pending()).await });
    let r = m.clone();
    is_send(&async move { r.round_once().await });
    let edges = vec![
        multicdn_health::Edge::new(id("fastly"), "http://127.0.0.1:1").unwrap(),
        multicdn_health::Edge::new(id("cloudflare"), "http://127.0.0.1:2").unwrap(),
    ];
    let drift = multicdn_health::DriftChecker::builder(edges.clone())
        .build()
        .unwrap();
    is_send(&async move { drift.check(&["/"]).await });
    let warmer = multicdn_health::Warmer::builder(edges).build().unwrap();
    let snap = m.snapshot();
    is_send(&async move {
        let paths = vec!["/a".to_owned()];
        warmer.warm(&paths, |p| snap.is_down(p), |_| {}).await
    });
}
