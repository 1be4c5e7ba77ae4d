//! Two controllers, one steering, against a real `nats-server -js` on loopback: the standby
//! takes over a failover in progress from the shared store and goes on from its step; a
//! leader that dies between its intent and its apply, or between its apply and its commit,
//! leaves a journal without gap or duplicate and a plan applied exactly once; a leader paused
//! past its lease is refused when it wakes.
//!
//! Without `nats-server` the tests say they are skipped; with `CI` set they fail.

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Lease expiry is server time: the tests wait in real time.
#![allow(clippy::disallowed_methods)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use multicdn::ApplyOutcome;
use multicdn::leader::{Leader, SharedStore, Step, StoreConfig};
use multicdn::lease::{FencedSteerer, LeaseConfig, LeaseState, NatsLease};
use multicdn::prelude::*;
use multicdn_core::{Error, SteeringDiff, SteeringState};
use multicdn_test_support::NatsServer;
use support::{POLICY, europe, feed, p, quorum_down, start};

const TTL: Duration = Duration::from_secs(2);

fn server() -> Option<NatsServer> {
    NatsServer::start_or_skip("the leader tests").unwrap()
}

/// What the shared actuator does on the next apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Apply,
    /// Hangs before sending anything (the process dies there).
    HangBefore,
    /// Applies, then hangs (the process dies before it journals).
    HangAfter,
}

/// The one DNS both contenders write to, behind a switch that makes a write hang.
#[derive(Debug, Clone)]
struct Dns {
    inner: MemorySteerer,
    next: Arc<Mutex<Next>>,
}

#[async_trait]
impl Steerer for Dns {
    async fn current(&self) -> Result<SteeringState, Error> {
        self.inner.current().await
    }
    async fn apply(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<SteeringDiff, Error> {
        let next = std::mem::replace(&mut *self.next.lock().unwrap(), Next::Apply);
        if next == Next::HangBefore {
            std::future::pending::<()>().await;
        }
        let diff = self.inner.apply(plan, options).await?;
        if next == Next::HangAfter {
            std::future::pending::<()>().await;
        }
        Ok(diff)
    }
}

struct Contender {
    leader: Leader,
    dns: Dns,
}

async fn contender(
    server: &NatsServer,
    name: &str,
    dns: &MemorySteerer,
    clock: &ManualClock,
) -> Contender {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(server.url())
        .await
        .unwrap();
    let lease = NatsLease::open(client.clone(), LeaseConfig::new(name, TTL))
        .await
        .unwrap();
    let store = SharedStore::open(client, StoreConfig::default())
        .await
        .unwrap();
    let shared = Dns {
        inner: dns.clone(),
        next: Arc::new(Mutex::new(Next::Apply)),
    };
    let controller = Controller::builder(Policy::load(POLICY).unwrap())
        .actuator(
            "dns",
            FencedSteerer::new(lease.clone(), shared.clone(), p("dns")),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    Contender {
        leader: Leader::new(controller, lease, store),
        dns: shared,
    }
}

/// Contends until this contender leads (the other's lease has to age out first).
async fn lead(c: &Contender) -> Duration {
    let started = Instant::now();
    loop {
        if let LeaseState::Leader(_) = c.leader.contend().await.unwrap() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < TTL * 4,
            "no takeover within {:?}",
            TTL * 4
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server, simulated time, the DNS both write to, and the two contenders.
async fn pair() -> Option<(NatsServer, ManualClock, MemorySteerer, Contender, Contender)> {
    let server = server()?;
    let clock = ManualClock::new(start());
    let dns = MemorySteerer::new();
    let a = contender(&server, "a", &dns, &clock).await;
    let b = contender(&server, "b", &dns, &clock).await;
    Some((server, clock, dns, a, b))
}

async fn led(c: &Contender, clock: &ManualClock) -> Box<multicdn::RoundReport> {
    feed(c.leader.controller(), clock.now());
    match c.leader.step(clock.now()).await {
        Step::Led(r) => {
            assert!(r.store_error.is_none(), "{:?}", r.store_error);
            r
        }
        other => panic!("expected a round, got {other:?}"),
    }
}

/// The journal as the shared store holds it, read by a third party.
async fn journal(server: &NatsServer) -> Vec<RoundRecord> {
    let client = async_nats::connect(server.url()).await.unwrap();
    let store = SharedStore::open(client, StoreConfig::default())
        .await
        .unwrap();
    store.load().await.unwrap().unwrap().saved.journal
}

fn changed(journal: &[RoundRecord]) -> u64 {
    journal
        .iter()
        .flat_map(|r| &r.applied)
        .filter(|a| matches!(a.outcome, ApplyOutcome::Applied { changes, .. } if changes > 0))
        .count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_goes_on_with_the_failover_where_the_dead_leader_left_it() {
    let Some((server, clock, dns, a, b)) = pair().await else {
        return;
    };
    lead(&a).await;
    assert!(matches!(
        b.leader.contend().await.unwrap(),
        LeaseState::Follower { .. }
    ));
    // The follower runs no round.
    assert!(matches!(
        b.leader.step(clock.now()).await,
        Step::Following { .. }
    ));

    let first = led(&a, &clock).await;
    assert_eq!(europe(&first, "fastly"), 9_000);
    a.leader
        .controller()
        .report(quorum_down("fastly", clock.now()));
    let second = led(&a, &clock).await;
    assert_eq!(europe(&second, "fastly"), 4_500, "the first failover step");
    clock.advance(Duration::from_secs(30));
    led(&a, &clock).await;
    let a_term = a.leader.lease().held().unwrap().term;

    // A dies (no more renewals, nothing released): B takes over once the lease ages out.
    drop(a);
    let took = lead(&b).await;
    assert!(
        took <= TTL + Duration::from_secs(1),
        "takeover took {took:?}"
    );
    clock.advance(Duration::from_secs(30));
    let fourth = led(&b, &clock).await;
    assert_eq!(fourth.record.round, 4);
    assert_eq!(
        europe(&fourth, "fastly"),
        4_500,
        "B goes on from A's step (a fresh start would answer the static 9,000)"
    );
    let takeover = fourth.record.takeover.clone().unwrap();
    assert_eq!(takeover.from_term, Some(a_term));
    assert_eq!(takeover.unfinished_round, None);
    assert_eq!(takeover.in_force, ["dns"]);
    clock.advance(Duration::from_secs(30));
    let fifth = led(&b, &clock).await;
    assert_eq!(
        europe(&fifth, "fastly"),
        0,
        "the second step, 90 s after the first, as the policy says"
    );
    let b_term = b.leader.lease().held().unwrap().term;
    assert!(b_term > a_term);

    let journal = journal(&server).await;
    assert_eq!(
        journal.iter().map(|r| r.round).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(
        journal.iter().map(|r| r.term).collect::<Vec<_>>(),
        [a_term, a_term, a_term, b_term, b_term].map(Some)
    );
    assert_eq!(changed(&journal), dns.applied(), "each plan applied once");
    assert_eq!(dns.current().await.unwrap().cohorts, fifth.plan.cohorts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_dead_mid_round_leaves_each_plan_applied_exactly_once() {
    for (case, hang) in [("after", Next::HangAfter), ("before", Next::HangBefore)] {
        let Some((server, clock, dns, a, b)) = pair().await else {
            return;
        };
        lead(&a).await;
        led(&a, &clock).await;
        let round = a.leader.controller().last_round().await;
        // The next round changes the plan (fastly is down: both contenders' monitors see it)
        // and dies in its write.
        for c in [&a, &b] {
            c.leader
                .controller()
                .report(quorum_down("fastly", clock.now()));
        }
        clock.advance(Duration::from_secs(100));
        *a.dns.next.lock().unwrap() = hang;
        let applied_before = dns.applied();
        let dying = {
            let leader = a.leader.clone();
            let now = clock.now();
            feed(leader.controller(), now);
            tokio::spawn(async move { leader.step(now).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!dying.is_finished(), "{case}: the write should hang");
        dying.abort();
        drop(a);
        let expected = u64::from(hang == Next::HangAfter);
        assert_eq!(dns.applied() - applied_before, expected, "{case}");

        lead(&b).await;
        let r = led(&b, &clock).await;
        assert_eq!(
            r.record.round,
            round + 1,
            "{case}: the unfinished round is redone"
        );
        let takeover = r.record.takeover.clone().unwrap();
        assert_eq!(takeover.unfinished_round, Some(round + 1), "{case}");
        let outcome = &r.record.applied[0].outcome;
        if hang == Next::HangAfter {
            assert_eq!(takeover.in_force, ["dns"], "{case}");
            assert_eq!(
                outcome,
                &ApplyOutcome::UpToDate,
                "{case}: not written twice"
            );
        } else {
            assert_eq!(takeover.not_in_force, ["dns"], "{case}");
            assert!(
                matches!(outcome, ApplyOutcome::Applied { changes, .. } if *changes > 0),
                "{case}: {outcome:?}"
            );
        }
        assert_eq!(
            dns.applied() - applied_before,
            1,
            "{case}: applied exactly once"
        );
        let journal = journal(&server).await;
        let rounds: Vec<u64> = journal.iter().map(|r| r.round).collect();
        assert_eq!(rounds, (1..=round + 1).collect::<Vec<_>>(), "{case}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_is_refused_when_it_wakes() {
    let Some((server, clock, dns, a, b)) = pair().await else {
        return;
    };
    lead(&a).await;
    led(&a, &clock).await;
    // A is paused: it renews nothing; B takes over and runs a round with a new plan.
    lead(&b).await;
    b.leader
        .controller()
        .report(quorum_down("fastly", clock.now()));
    clock.advance(Duration::from_secs(30));
    let r = led(&b, &clock).await;
    assert_eq!(europe(&r, "fastly"), 4_500);
    let applied = dns.applied();
    // A wakes still believing it leads and starts a round: refused before any write.
    assert!(a.leader.lease().held().is_some());
    a.leader
        .controller()
        .report(quorum_down("cloudflare", clock.now()));
    feed(a.leader.controller(), clock.now());
    match a.leader.step(clock.now()).await {
        Step::Deposed(d) => assert!(d.why.contains("fenced"), "{d}"),
        other => panic!("expected the round refused, got {other:?}"),
    }
    assert_eq!(
        dns.applied(),
        applied,
        "nothing written by the deposed leader"
    );
    assert_eq!(dns.current().await.unwrap().cohorts, r.plan.cohorts);
    // Its round left nothing in the journal, and its next renewal finds B.
    assert_eq!(journal(&server).await.len(), 2);
    assert!(matches!(
        a.leader.contend().await.unwrap(),
        LeaseState::Follower { .. }
    ));
}

/// Navigation beacons from German networks (both providers equal) at `at`, only those whose
/// network is in one of `shards` (of two).
fn beacons_in(shards: &[u16], at: Timestamp) -> Vec<multicdn::steering::beacon::Received> {
    use multicdn::steering::beacon::{Beacon, ClientNetwork, NavigationBeacon, Received};
    let de = Country::new("DE").unwrap();
    let mut out = Vec::new();
    for asn in 3_000..3_040u32 {
        let network = ClientNetwork::new(Some(asn), Some(de));
        if !shards.contains(&multicdn::shards::shard_of(&network, 2)) {
            continue;
        }
        for (i, cdn) in ["fastly", "cloudflare"].into_iter().enumerate() {
            for k in 0..10 {
                out.push(Received {
                    at,
                    network,
                    beacon: Beacon::Navigation(NavigationBeacon::new(
                        "/",
                        40.0 + f64::from(k + i as u32),
                        cdn,
                        "",
                        "HIT",
                    )),
                });
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_decides_on_the_merged_shards_and_a_stopped_shard_makes_the_evidence_stale() {
    use multicdn::shards::{
        BeaconPublisher, IngestWorker, PublisherConfig, ShardSet, ShardsConfig, WorkerConfig,
    };
    use multicdn::steering::engine::Mode;
    use multicdn::steering::scoreboard::{Scoreboard, ScoreboardConfig};
    let Some((server, clock, _dns, a, _b)) = pair().await else {
        return;
    };
    let connect = || async { async_nats::connect(server.url()).await.unwrap() };
    let config = ShardsConfig::new(2);
    let policy = Policy::load(POLICY).unwrap();
    let board = Scoreboard::new(
        ScoreboardConfig::from_policy(&policy.steering.rum),
        &policy.provider_ids(),
    )
    .unwrap();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let mut workers = Vec::new();
    for shard in 0..2 {
        let c = WorkerConfig::new(shard, format!("w{shard}"), config.clone());
        workers.push(
            IngestWorker::open(connect().await, c, board.clone(), vec![], shared.clone())
                .await
                .unwrap(),
        );
    }
    let publisher = BeaconPublisher::start(
        connect().await,
        PublisherConfig::new("r1", config.clone()),
        shared.clone(),
    )
    .await
    .unwrap();
    let leader = a
        .leader
        .clone()
        .with_shards(ShardSet::open(connect().await, config).await.unwrap())
        .unwrap();
    lead(&a).await;

    // Both shards publish: the round decides on their merged evidence.
    let fed = beacons_in(&[0, 1], clock.now());
    for b in &fed {
        assert!(publisher.offer(b));
    }
    assert_eq!(publisher.flush(Duration::from_secs(5)).await.left, 0);
    let mut applied = 0;
    for w in &mut workers {
        for _ in 0..50 {
            if w.pull(Duration::from_millis(50)).await.unwrap() == 0 && w.board().cells() > 0 {
                break;
            }
        }
        w.checkpoint().await.unwrap();
        applied += w.board().quality().stored;
    }
    assert_eq!(applied, fed.len() as u64, "every beacon in a shard");
    let Step::Led(r) = leader.step(clock.now()).await else {
        panic!("a leader's round")
    };
    assert_eq!(r.record.mode, Mode::Steering, "{:?}", r.record.decided);
    assert_eq!(leader.shard_status().len(), 2);
    assert!(leader.shard_status().iter().all(|s| s.cells > 0));

    // Twenty minutes on, shard 1's worker has stopped; shard 0's goes on with fresh beacons.
    clock.advance(Duration::from_secs(20 * 60));
    for b in beacons_in(&[0], clock.now()) {
        assert!(publisher.offer(&b));
    }
    assert_eq!(publisher.flush(Duration::from_secs(5)).await.left, 0);
    let w0 = &mut workers[0];
    for _ in 0..20 {
        w0.pull(Duration::from_millis(50)).await.unwrap();
    }
    w0.checkpoint().await.unwrap();
    let Step::Led(r) = leader.step(clock.now()).await else {
        panic!("a leader's round")
    };
    assert_eq!(
        r.record.mode,
        Mode::Deadman,
        "shard 1 stopped publishing 20 minutes ago (stale_after 15m): {:?}",
        leader.shard_status()
    );
}
