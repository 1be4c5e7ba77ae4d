//! The controller on simulated time: rounds, every actuator, the ledger, the store.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use multicdn::ApplyOutcome;
use multicdn::prelude::*;
use multicdn_core::{Error, SteeringDiff, SteeringState};
use support::{POLICY, europe, feed, p, quorum_down, start};

/// A steerer that fails its first `failures` applies with a retryable timeout.
#[derive(Debug)]
struct Flaky {
    inner: MemorySteerer,
    failures: AtomicU32,
    calls: AtomicU32,
}

#[async_trait]
impl Steerer for Flaky {
    async fn current(&self) -> Result<SteeringState, Error> {
        self.inner.current().await
    }
    async fn apply(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<SteeringDiff, Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::Timeout {
                provider: p("route53"),
                request: "POST /2013-04-01/hostedzone/Z1/rrset".into(),
                after: Duration::from_secs(10),
            });
        }
        self.inner.apply(plan, options).await
    }
}

#[tokio::test]
async fn an_outage_demotes_in_steps_and_every_actuator_gets_the_same_plan() {
    let clock = ManualClock::new(start());
    let a = MemorySteerer::new();
    let b = MemorySteerer::new();
    let video = SharedPlan::new();
    let c = Controller::builder(Policy::load(POLICY).unwrap())
        .actuator("memory-a", a.clone())
        .actuator("memory-b", b.clone())
        .actuator(
            "content-steering",
            ContentSteeringSteerer::new(p("content-steering"), video.clone()),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut plans = c.plans();
    feed(&c, clock.now());
    let first = c.round(clock.now()).await;
    assert_eq!(europe(&first, "fastly"), 9_000);
    c.report(quorum_down("fastly", clock.now()));
    let mut shares = Vec::new();
    for _ in 0..4 {
        feed(&c, clock.now());
        let r = c.round(clock.now()).await;
        assert!(!r.partial(), "{:?}", r.record.applied);
        let plan = (*r.plan).clone();
        assert_eq!(a.current().await.unwrap().cohorts, plan.cohorts);
        assert_eq!(b.current().await.unwrap().cohorts, plan.cohorts);
        assert_eq!(video.get().unwrap().plan, plan);
        assert_eq!(**plans.borrow_and_update(), plan);
        shares.push(europe(&r, "fastly"));
        clock.advance(Duration::from_secs(30));
    }
    // 50% at once, the rest after the policy's 90 s interval: never all at once.
    assert_eq!(shares, [4_500, 4_500, 4_500, 0]);
    let rounds = c.rounds().await;
    assert_eq!(
        rounds.iter().map(|r| r.round).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(rounds[1].out[&p("fastly")][0].kind(), "quorum_down");
}

#[tokio::test]
async fn a_missed_purge_and_a_quorum_verdict_keep_a_provider_out_until_both_clear() {
    let clock = ManualClock::new(start());
    let c = Controller::builder(Policy::load(POLICY).unwrap())
        .actuator("memory", MemorySteerer::new())
        .clock(clock.clone())
        .build()
        .unwrap();
    let t0 = clock.now();
    c.report(quorum_down("fastly", t0));
    c.report(Event::PurgeMissed {
        provider: p("fastly"),
        items: vec!["price-list".into()],
        scope: "tags".into(),
        error: "401".into(),
        at: t0,
    });
    let step = async |events: Vec<Event>| {
        for e in events {
            c.report(e);
        }
        feed(&c, clock.now());
        let r = c.round(clock.now()).await;
        clock.advance(Duration::from_secs(120));
        r
    };
    let r = step(vec![]).await;
    assert_eq!(r.record.out[&p("fastly")].len(), 2);
    let r = step(vec![Event::Recovered {
        provider: p("fastly"),
        at: clock.now(),
    }])
    .await;
    // The recovery clears the verdict, not the missed purge: still out, all the way.
    assert_eq!(europe(&r, "fastly"), 0);
    assert_eq!(r.record.out[&p("fastly")][0].kind(), "purge_missed");
    let r = step(vec![Event::PurgeRecovered {
        provider: p("fastly"),
        at: clock.now(),
    }])
    .await;
    assert!(!r.record.out.contains_key(&p("fastly")));
    let ledger = c.ledger().await;
    assert_eq!(ledger.health()[&p("fastly")].state, HealthState::Up);
}

#[tokio::test]
async fn a_restart_mid_failover_continues_it_with_a_journal_without_gap_or_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(start());
    let build = || {
        Controller::builder(Policy::load(POLICY).unwrap())
            .actuator("memory", MemorySteerer::new())
            .clock(clock.clone())
            .store(FileStore::new(dir.path()))
            .build()
            .unwrap()
    };
    let first = build();
    feed(&first, clock.now());
    first.round(clock.now()).await;
    first.report(quorum_down("fastly", clock.now()));
    feed(&first, clock.now());
    let r = first.round(clock.now()).await;
    assert_eq!(europe(&r, "fastly"), 4_500);
    drop(first); // killed between rounds

    clock.advance(Duration::from_secs(90));
    let second = build();
    assert_eq!(second.last_round().await, 2);
    feed(&second, clock.now());
    let r = second.round(clock.now()).await;
    // The failover's second step, 90 s after the first: not a fresh start.
    assert_eq!(r.record.round, 3);
    assert_eq!(europe(&r, "fastly"), 0);
    assert!(
        r.record
            .decided
            .iter()
            .any(|e| e.cohort.as_str() == "europe" && e.evidence.note.contains("100%"))
    );
    drop(second);
    let text = std::fs::read_to_string(dir.path().join("journal.ndjson")).unwrap();
    let rounds: Vec<u64> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["round"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(rounds, [1, 2, 3]);
}

#[tokio::test]
async fn a_failing_actuator_does_not_hold_the_others_back_and_is_retried_next_round() {
    let clock = ManualClock::new(start());
    let good = MemorySteerer::new();
    let flaky = Arc::new(Flaky {
        inner: MemorySteerer::new(),
        failures: AtomicU32::new(2),
        calls: AtomicU32::new(0),
    });
    let c = Controller::builder(Policy::load(POLICY).unwrap())
        .shared_actuator("route53", flaky.clone())
        .actuator("memory", good.clone())
        .retry(Retry {
            attempts: 2,
            backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
        })
        .clock(clock.clone())
        .build()
        .unwrap();
    feed(&c, clock.now());
    let r = c.round(clock.now()).await;
    assert!(r.partial());
    let ApplyOutcome::Failed { error, attempts } = &r.record.applied[0].outcome else {
        panic!("{:?}", r.record.applied)
    };
    assert_eq!(*attempts, 2);
    assert!(error.retryable && error.may_have_applied, "{error:?}");
    assert!(matches!(
        r.record.applied[1].outcome,
        ApplyOutcome::Applied { .. }
    ));
    assert_eq!(good.current().await.unwrap().cohorts, r.plan.cohorts);
    // The journal keeps the partial round.
    assert!(c.rounds().await[0].partial());
    clock.advance(Duration::from_secs(30));
    feed(&c, clock.now());
    let r = c.round(clock.now()).await;
    assert!(!r.partial());
    assert!(matches!(
        r.record.applied[0].outcome,
        ApplyOutcome::Applied { attempts: 1, .. }
    ));
    assert_eq!(r.record.applied[1].outcome, ApplyOutcome::UpToDate);
    assert_eq!(flaky.inner.current().await.unwrap().cohorts, r.plan.cohorts);
    assert_eq!(flaky.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn dry_run_decides_and_journals_but_applies_nothing() {
    let clock = ManualClock::new(start());
    let dns = MemorySteerer::new();
    let c = Controller::builder(Policy::load(POLICY).unwrap())
        .actuator("memory", dns.clone())
        .dry_run(true)
        .clock(clock.clone())
        .build()
        .unwrap();
    c.report(quorum_down("fastly", clock.now()));
    feed(&c, clock.now());
    let r = c.round(clock.now()).await;
    assert!(r.record.dry_run && !r.partial());
    assert_eq!(r.record.applied[0].outcome, ApplyOutcome::DryRun);
    assert!(r.record.decided.iter().any(|e| e.is_move()));
    assert!(dns.current().await.unwrap().cohorts.is_empty());
}
