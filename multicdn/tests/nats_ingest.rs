//! Sharded beacon ingest against a real `nats-server -js` on loopback: publishers batch to
//! shard subjects, one worker per shard snapshots and acknowledges, the merge equals a single
//! process fed the same beacons (cell by cell, counts exact) through killed workers, a
//! restarted server and malformed messages; a shard that stops publishing makes `as_of` old.
//!
//! Without `nats-server` the tests say they are skipped; with `CI` set they fail.

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// The tests wait in real time, against a real server.
#![allow(clippy::disallowed_methods)]

#[path = "support/beacons.rs"]
mod gen_beacons;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gen_beacons::{base, beacons, reference, start};
use multicdn::core::{Clock, SystemClock};
use multicdn::shards::{
    BeaconPublisher, IngestWorker, Merged, PublisherConfig, ShardSet, ShardsConfig, WorkerConfig,
    WorkerCounters, shard_of,
};
use multicdn::steering::beacon::{ClientNetwork, Received};
use multicdn::steering::scoreboard::Scoreboard;
use multicdn_test_support::NatsServer;
use tokio::task::JoinHandle;

fn server() -> Option<NatsServer> {
    NatsServer::start_or_skip("the ingest tests").unwrap()
}

async fn client(server: &NatsServer) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(server.url())
        .await
        .unwrap()
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

const SHARDS: u16 = 4;
/// The span of the tests' beacons: within the three closed 15-minute buckets and the open one
/// that the workers keep (they drop older ones before each snapshot), wherever the wall clock
/// falls in its quarter hour.
const HOUR: Duration = Duration::from_secs(35 * 60);

fn shards() -> ShardsConfig {
    let mut c = ShardsConfig::new(SHARDS);
    c.timeout = Duration::from_millis(800);
    c
}

fn publisher_config(name: &str, buffer: usize) -> PublisherConfig {
    let mut c = PublisherConfig::new(name, shards());
    c.buffer = buffer;
    c.batch_max = 50;
    c.linger = Duration::from_millis(10);
    c.ack_timeout = Duration::from_millis(500);
    c.retry_min = Duration::from_millis(20);
    c.retry_max = Duration::from_millis(200);
    c
}

fn worker_config(shard: u16, name: &str) -> WorkerConfig {
    let mut c = WorkerConfig::new(shard, name, shards());
    c.ack_wait = Duration::from_secs(1);
    c.snapshot_every = Duration::from_millis(200);
    c.pull_max = 8;
    c
}

async fn worker(server: &NatsServer, shard: u16, name: &str) -> IngestWorker {
    IngestWorker::open(
        client(server).await,
        worker_config(shard, name),
        base(),
        vec![],
        clock(),
    )
    .await
    .unwrap()
}

async fn publisher(server: &NatsServer, name: &str, buffer: usize) -> BeaconPublisher {
    BeaconPublisher::start(
        client(server).await,
        publisher_config(name, buffer),
        clock(),
    )
    .await
    .unwrap()
}

async fn all_workers(server: &NatsServer, shards: std::ops::Range<u16>) -> Vec<Running> {
    let mut out = Vec::new();
    for shard in shards {
        out.push(run(worker(server, shard, &format!("w{shard}")).await));
    }
    out
}

struct Running {
    task: JoinHandle<Result<multicdn::shards::WorkerStats, multicdn::shards::ShardError>>,
    counters: WorkerCounters,
    stop: tokio::sync::oneshot::Sender<()>,
}

fn run(w: IngestWorker) -> Running {
    let counters = w.counters();
    let (stop, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(w.run(async move {
        let _ = rx.await;
    }));
    Running {
        task,
        counters,
        stop,
    }
}

async fn stop_all(workers: Vec<Running>) {
    for w in workers {
        let _ = w.stop.send(());
        tokio::time::timeout(Duration::from_secs(5), w.task)
            .await
            .expect("a worker stops within 5 s")
            .unwrap()
            .unwrap();
    }
}

async fn merged(server: &NatsServer) -> Merged {
    let set = ShardSet::open(client(server).await, shards())
        .await
        .unwrap();
    set.read(&base(), start().plus(HOUR)).await.unwrap()
}

fn json(board: &Scoreboard) -> String {
    serde_json::to_string(board).unwrap()
}

/// Waits (at most `limit`) until the merged board holds `stored` samples; returns it.
async fn merged_with(server: &NatsServer, stored: u64, limit: Duration) -> Merged {
    let set = ShardSet::open(client(server).await, shards())
        .await
        .unwrap();
    let deadline = Instant::now() + limit;
    loop {
        let m = set.read(&base(), start().plus(HOUR)).await.unwrap();
        let got = m.board.quality().stored;
        if got == stored {
            return m;
        }
        assert!(
            got < stored,
            "the merge holds {got} samples, more than the {stored} fed"
        );
        assert!(
            Instant::now() < deadline,
            "the merge holds {got} of {stored} samples after {limit:?}: {:?}",
            m.shards
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn assert_same(merged: &Merged, expected: &Scoreboard) {
    assert_eq!(merged.board.cells(), expected.cells());
    assert_eq!(merged.board.quality(), expected.quality());
    assert!(
        json(&merged.board) == json(expected),
        "the merged scoreboard differs from the single-process one"
    );
    assert_eq!(
        merged.shards.iter().map(|s| s.cells).sum::<usize>(),
        expected.cells(),
        "every cell lives in exactly one shard"
    );
}

async fn offer_all(p: &BeaconPublisher, list: &[Received]) -> Vec<Received> {
    let mut taken = Vec::new();
    for (i, r) in list.iter().enumerate() {
        if p.offer(r) {
            taken.push(r.clone());
        }
        if i % 500 == 0 {
            tokio::task::yield_now().await;
        }
    }
    taken
}

#[test]
fn the_shard_key_is_fixed_and_spreads_networks() {
    let de = multicdn::core::Country::new("DE").unwrap();
    // FNV-1a written down: these values never change.
    let fixed: Vec<u16> = [3320, 7922, 13335, 1, 65000]
        .iter()
        .map(|a| shard_of(&ClientNetwork::new(Some(*a), Some(de)), 64))
        .collect();
    assert_eq!(fixed, fixed_expected());
    assert_eq!(shard_of(&ClientNetwork::new(None, None), 64), 0);
    assert_eq!(
        shard_of(&ClientNetwork::new(Some(3320), Some(de)), 64),
        shard_of(&ClientNetwork::new(Some(3320), None), 64),
        "the ASN decides, not the country"
    );
    let mut seen = [0u32; 4];
    for asn in 0..4000 {
        seen[usize::from(shard_of(&ClientNetwork::new(Some(asn), None), 4))] += 1;
    }
    assert!(seen.iter().all(|n| (800..1200).contains(n)), "{seen:?}");
}

fn fixed_expected() -> Vec<u16> {
    // FNV-1a 64 of b"asn:" ++ asn.to_be_bytes(), modulo 64, computed independently below.
    [3320u32, 7922, 13335, 1, 65000]
        .iter()
        .map(|a| {
            let mut h: u64 = 0xcbf29ce484222325;
            for b in b"asn:".iter().chain(a.to_be_bytes().iter()) {
                h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
            }
            (h % 64) as u16
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_publishers_four_workers_merge_to_the_single_process_scoreboard() {
    let Some(server) = server() else { return };
    let all = beacons(1, 12_000, 400, start(), HOUR);
    let a = publisher(&server, "rx-a", 100_000).await;
    let b = publisher(&server, "rx-b", 100_000).await;
    let workers = all_workers(&server, 0..SHARDS).await;
    let (left, right) = all.split_at(all.len() / 2);
    assert_eq!(offer_all(&a, left).await.len(), left.len());
    assert_eq!(offer_all(&b, right).await.len(), right.len());
    for p in [&a, &b] {
        let report = p.flush(Duration::from_secs(10)).await;
        assert_eq!(report.left, 0, "{report:?}");
        assert_eq!(report.stats.dropped, 0);
    }
    assert_eq!(a.stats().published + b.stats().published, all.len() as u64);
    let expected = reference(&all);
    let m = merged_with(&server, expected.quality().stored, Duration::from_secs(10)).await;
    assert_same(&m, &expected);
    assert_eq!(
        m.shards.iter().map(|s| s.beacons).sum::<u64>(),
        all.len() as u64
    );
    assert!(m.shards.iter().all(|s| s.cells > 0 && s.worker.is_some()));
    stop_all(workers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_loses_nothing_and_counts_nothing_twice() {
    let Some(server) = server() else { return };
    let all = beacons(2, 8_000, 300, start(), HOUR);
    let p = publisher(&server, "rx", 100_000).await;
    offer_all(&p, &all).await;
    assert_eq!(p.flush(Duration::from_secs(10)).await.left, 0);

    // Shard 0: applies batches, dies before any snapshot.
    let mut w0 = worker(&server, 0, "w0-doomed").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while w0.counters().get().batches < 3 {
        w0.pull(Duration::from_millis(200)).await.unwrap();
        assert!(Instant::now() < deadline, "shard 0 received no batches");
    }
    drop(w0);
    // Shard 1: applies batches, publishes its snapshot, applies more, dies before acking.
    let mut w1 = worker(&server, 1, "w1-doomed").await;
    while w1.counters().get().batches < 3 {
        w1.pull(Duration::from_millis(200)).await.unwrap();
        assert!(Instant::now() < deadline, "shard 1 received no batches");
    }
    w1.publish_snapshot().await.unwrap();
    let in_snapshot = w1.counters().get().batches;
    w1.pull(Duration::from_millis(200)).await.unwrap();
    // Shard 2: a running worker aborted mid-flight (its task and connection dropped).
    let doomed2 = run(worker(&server, 2, "w2-doomed").await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    doomed2.task.abort();
    let _ = doomed2.task.await;
    drop(w1);

    let workers = all_workers(&server, 0..SHARDS).await;
    let expected = reference(&all);
    let m = merged_with(&server, expected.quality().stored, Duration::from_secs(12)).await;
    assert_same(&m, &expected);
    assert_eq!(
        m.shards.iter().map(|s| s.beacons).sum::<u64>(),
        all.len() as u64
    );
    let dup1 = workers[1].counters.get().duplicates;
    assert!(
        dup1 >= in_snapshot,
        "shard 1's replacement acknowledged {dup1} redelivered batches without applying them; the dead worker's snapshot held {in_snapshot}"
    );
    // Nothing is redelivered after all is acknowledged: the merge stays put.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_same(&merged(&server).await, &expected);
    stop_all(workers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing_with_a_large_buffer() {
    let Some(mut server) = server() else { return };
    let all = beacons(3, 6_000, 300, start(), HOUR);
    let p = publisher(&server, "rx", 100_000).await;
    let workers = all_workers(&server, 0..SHARDS).await;
    let (first, rest) = all.split_at(2_000);
    offer_all(&p, first).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.stop();
    offer_all(&p, rest).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let held = p.stats().buffered;
    assert!(held > 0, "the publisher holds what it cannot publish");
    server.restart().unwrap();
    let report = p.flush(Duration::from_secs(10)).await;
    assert_eq!(report.left, 0, "{report:?}");
    assert_eq!(report.stats.dropped, 0);
    assert!(report.stats.publish_errors > 0, "{report:?}");
    let expected = reference(&all);
    let m = merged_with(&server, expected.quality().stored, Duration::from_secs(12)).await;
    assert_same(&m, &expected);
    stop_all(workers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_with_a_tiny_buffer_drops_and_counts_what_it_drops() {
    let Some(mut server) = server() else { return };
    let all = beacons(4, 3_000, 200, start(), HOUR);
    let p = publisher(&server, "rx", 100).await;
    let workers = all_workers(&server, 0..SHARDS).await;
    let (first, rest) = all.split_at(500);
    let mut taken = offer_all(&p, first).await;
    server.stop();
    taken.extend(offer_all(&p, rest).await);
    server.restart().unwrap();
    let report = p.flush(Duration::from_secs(10)).await;
    assert_eq!(report.left, 0, "{report:?}");
    let s = report.stats;
    assert!(s.dropped > 0, "{s:?}");
    assert!(s.buffered <= 100);
    assert_eq!(s.offered, all.len() as u64);
    assert_eq!(s.published + s.dropped, s.offered, "{s:?}");
    let expected = reference(&taken);
    let m = merged_with(&server, expected.quality().stored, Duration::from_secs(12)).await;
    assert_same(&m, &expected);
    assert_eq!(
        m.shards.iter().map(|s| s.beacons).sum::<u64>() + s.dropped,
        s.offered
    );
    stop_all(workers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_stops_publishing_makes_the_evidence_old() {
    let Some(server) = server() else { return };
    let set = ShardSet::open(client(&server).await, shards())
        .await
        .unwrap();
    let p = publisher(&server, "rx", 100_000).await;
    // Shard 3 never gets a worker: no evidence time at all.
    let mut workers = all_workers(&server, 0..3).await;
    let live =
        |n: usize, seed: u64| beacons(seed, n, 200, SystemClock.now(), Duration::from_millis(1));
    offer_all(&p, &live(500, 5)).await;
    p.flush(Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = set.read(&base(), SystemClock.now()).await.unwrap();
    assert_eq!(m.as_of, None, "shard 3 never published: {:?}", m.shards);
    assert_eq!(m.shards[3].published_at, None);
    assert!(m.shards[..3].iter().all(|s| s.published_at.is_some()));

    workers.push(run(worker(&server, 3, "w3").await));
    let deadline = Instant::now() + Duration::from_secs(5);
    let fresh = loop {
        let m = set.read(&base(), SystemClock.now()).await.unwrap();
        if let Some(t) = m.as_of {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "as_of stayed None: {:?}",
            m.shards
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(SystemClock.now().since(fresh) < Duration::from_secs(2));

    // Shard 1's worker dies; beacons keep coming; the others keep publishing.
    let dead = workers.remove(1);
    dead.task.abort();
    let _ = dead.task.await;
    for i in 0..15 {
        offer_all(&p, &live(50, 100 + i)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    p.flush(Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let now = SystemClock.now();
    let m = set.read(&base(), now).await.unwrap();
    let stale = m.shards[1].published_at.unwrap();
    assert_eq!(
        m.as_of,
        Some(stale),
        "the stale shard sets the evidence time"
    );
    assert!(m.shards[1].age.unwrap() >= Duration::from_millis(1500));
    for s in [0usize, 2, 3] {
        assert!(
            m.shards[s].age.unwrap() < Duration::from_millis(1000),
            "{:?}",
            m.shards[s]
        );
    }
    assert!(now.since(m.as_of.unwrap()) >= Duration::from_millis(1500));
    stop_all(workers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_batch_is_counted_and_terminated_and_the_worker_goes_on() {
    let Some(server) = server() else { return };
    let w = worker(&server, 0, "w0").await;
    let running = run(w);
    let js = async_nats::jetstream::new(client(&server).await);
    let subject = shards().subject(0);
    for junk in [&b"not json"[..], br#"[{"at":1}]"#, br#"{"beacons":[]}"#] {
        js.publish(subject.clone(), junk.to_vec().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // Then a good batch for shard 0.
    let good: Vec<Received> = beacons(6, 2_000, 300, start(), HOUR)
        .into_iter()
        .filter(|r| shard_of(&r.network, SHARDS) == 0)
        .collect();
    let payload = multicdn::shards::encode_batch(&good).unwrap();
    js.publish(subject, payload).await.unwrap().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while running.counters.get().batches < 1 {
        assert!(Instant::now() < deadline, "{:?}", running.counters.get());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running.counters.get().malformed, 3);
    // Terminated, not redelivered after the ack wait.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stats = running.counters.get();
    assert_eq!(
        (stats.malformed, stats.batches, stats.duplicates),
        (3, 1, 0)
    );
    let expected = reference(&good);
    let m = merged_with(&server, expected.quality().stored, Duration::from_secs(5)).await;
    assert!(json(&m.board) == json(&expected));
    stop_all(vec![running]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_worker_of_a_shard_is_fenced() {
    let Some(server) = server() else { return };
    let mut a = worker(&server, 2, "a").await;
    a.checkpoint().await.unwrap();
    let mut b = worker(&server, 2, "b").await;
    b.checkpoint().await.unwrap();
    let err = a.checkpoint().await.unwrap_err();
    assert!(
        matches!(err, multicdn::shards::ShardError::Fenced { shard: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("shard-2"), "{err}");
}

/// End-to-end rate on this machine: two publishers, four workers, from the first offer to
/// the merged scoreboard holding every beacon.
///
/// ```text
/// cargo test --release -p multicdn --features nats --test nats_ingest -- --ignored --nocapture end_to_end
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints beacons per second"]
async fn end_to_end_rate_two_publishers_four_workers() {
    let Some(server) = server() else { return };
    let n: usize = std::env::var("BEACONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    // 300 networks: a shard snapshot must fit in one message (1 MB by default).
    let all = beacons(7, n, 300, start(), HOUR);
    let expected = reference(&all);
    let mut pubs = Vec::new();
    for name in ["rx-a", "rx-b"] {
        let mut c = PublisherConfig::new(name, shards());
        c.buffer = n;
        c.batch_max = 500;
        c.linger = Duration::from_millis(20);
        c.ack_timeout = Duration::from_secs(2);
        pubs.push(
            BeaconPublisher::start(client(&server).await, c, clock())
                .await
                .unwrap(),
        );
    }
    let mut workers = Vec::new();
    for shard in 0..SHARDS {
        let mut c = WorkerConfig::new(shard, format!("w{shard}"), shards());
        c.snapshot_every = Duration::from_millis(500);
        c.ack_wait = Duration::from_secs(10);
        c.pull_max = 64;
        let w = IngestWorker::open(client(&server).await, c, base(), vec![], clock())
            .await
            .unwrap();
        workers.push(run(w));
    }
    let began = Instant::now();
    let (left, right) = all.split_at(n / 2);
    let (a, b) = (pubs[0].clone(), pubs[1].clone());
    let (l, r) = (left.to_vec(), right.to_vec());
    let ta = tokio::spawn(async move { offer_all(&a, &l).await.len() });
    let tb = tokio::spawn(async move { offer_all(&b, &r).await.len() });
    assert_eq!(ta.await.unwrap() + tb.await.unwrap(), n, "nothing dropped");
    let offered = began.elapsed();
    for p in &pubs {
        assert_eq!(p.flush(Duration::from_secs(60)).await.left, 0);
    }
    let published = began.elapsed();
    let m = merged_with(&server, expected.quality().stored, Duration::from_secs(120)).await;
    let merged_at = began.elapsed();
    assert_same(&m, &expected);
    let batches: u64 = pubs.iter().map(|p| p.stats().batches).sum();
    println!(
        "{n} beacons ({batches} batches, {} cells): offered in {offered:.2?}, published in {published:.2?}, in the merged scoreboard after {merged_at:.2?}: {:.0} beacons/s end to end",
        m.board.cells(),
        n as f64 / merged_at.as_secs_f64()
    );
    stop_all(workers).await;
}
