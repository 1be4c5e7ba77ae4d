//! Sharded beacon ingest over NATS JetStream (feature `nats`): receivers publish accepted
//! beacons in batches, one ingest worker per shard builds that shard's scoreboard and
//! publishes it as a snapshot, and the controller merges the latest snapshot of every shard.
//!
//! **Shard key.** [`shard_of`] is FNV-1a (64 bit) of `asn:` and the ASN's four bytes big
//! endian, else of `cc:` and the two-letter country code, else shard 0; modulo the number
//! of shards. It is written down here and never changes, so one network's beacons meet in
//! one shard whatever process or version publishes them; every scoreboard cell (metric,
//! provider, ASN, country) therefore lives in exactly one shard and the merge only adds.
//!
//! **Stream.** `MULTICDN_BEACONS` over `multicdn.beacons.*`; shard `n` is the subject
//! `multicdn.beacons.<n>` ([`ShardsConfig`]). Each message is one batch, a JSON array of
//! [`Received`] (the receive time, the resolved network and the beacon as parsed; every
//! number round-trips exactly), with a `Nats-Msg-Id` of `<publisher id>-<batch seq>`: a
//! publish retried after a lost acknowledgement is dropped by the stream's duplicate window.
//!
//! **Guarantees.** A [`BeaconPublisher`] never blocks a receiver: [`BeaconPublisher::offer`]
//! puts the beacon in a bounded buffer or counts it as dropped; a batch that could not be
//! published is kept and retried with backoff, its beacons still counted against the bound.
//! An [`IngestWorker`] acknowledges a batch only after a snapshot holding its samples is
//! in the key-value bucket (`multicdn_shards`, key `shard-<n>`); the snapshot also lists the
//! stream sequences it applied whose acknowledgement the server has not confirmed, so a
//! redelivered batch (the worker died between snapshot and ack) is acknowledged, not counted
//! again. Snapshots are written by revision: a second worker of the same shard (a zombie) is
//! fenced, never overwrites a newer snapshot. [`ShardSet::read`] merges and says how old
//! each shard's evidence is; a shard that stops publishing makes [`Merged::as_of`] old (or
//! `None`), so the deadman sees its networks as stale rather than silently absent.
//!
//! ```no_run
//! # async fn demo(board: multicdn::steering::scoreboard::Scoreboard) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use multicdn::core::{Clock, SystemClock};
//! use multicdn::shards::{BeaconPublisher, IngestWorker, PublisherConfig, ShardSet, ShardsConfig, WorkerConfig};
//!
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let shards = ShardsConfig::new(4);
//! // In each receiver: ServiceConfig::publisher(publisher.clone()).
//! let publisher = BeaconPublisher::start(client.clone(), PublisherConfig::new("rx-eu-1", shards.clone()), Arc::new(SystemClock)).await?;
//! // One worker per shard (here shard 0), each in its own process.
//! let worker = IngestWorker::open(client.clone(), WorkerConfig::new(0, "ingest-a", shards.clone()), board.clone(), vec![], Arc::new(SystemClock)).await?;
//! tokio::spawn(worker.run(std::future::pending::<()>()));
//! // In the controller, every round: the merged board and the evidence time for the deadman.
//! let set = ShardSet::open(client, shards).await?;
//! let merged = set.read(&board, SystemClock.now()).await?;
//! let _ = (merged.board, merged.as_of, publisher.stats());
//! # Ok(())
//! # }
//! ```
//!
//! [`shard_of`]: crate::shards::shard_of
//! [`ShardsConfig`]: crate::shards::ShardsConfig
//! [`Received`]: multicdn_steering::beacon::Received
//! [`BeaconPublisher`]: crate::shards::BeaconPublisher
//! [`BeaconPublisher::offer`]: crate::shards::BeaconPublisher::offer
//! [`IngestWorker`]: crate::shards::IngestWorker
//! [`ShardSet::read`]: crate::shards::ShardSet::read
//! [`Merged::as_of`]: crate::shards::Merged::as_of

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::object_store::{self, ObjectStore};
use async_nats::jetstream::{self, AckKind, stream};
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use multicdn_core::{Clock, Timestamp};
use multicdn_steering::beacon::{Beacon, ClientNetwork, Received};
use multicdn_steering::scoreboard::Scoreboard;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc};

/// The FNV-1a 64-bit offset basis and prime.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = FNV_OFFSET;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    }
    h
}

/// The shard of `network` among `shards` (see the module documentation): FNV-1a of the
/// ASN, else of the country code, else 0. `shards` 0 or 1 is shard 0.
pub fn shard_of(network: &ClientNetwork, shards: u16) -> u16 {
    if shards <= 1 {
        return 0;
    }
    let h = match (network.asn, network.country) {
        (Some(asn), _) => fnv1a(&[b"asn:", &asn.to_be_bytes()]),
        (None, Some(country)) => fnv1a(&[b"cc:", country.as_str().as_bytes()]),
        (None, None) => return 0,
    };
    // The remainder is below `shards`, a u16.
    u16::try_from(h % u64::from(shards)).unwrap_or(0)
}

/// Why a publisher, a worker or the merge could not do its work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// The configuration is not usable.
    #[error("shard configuration: {0}")]
    Config(String),
    /// The server did not answer in time, refused, or JetStream is not enabled on it.
    #[error("NATS JetStream unavailable ({what}, {target}): {message}")]
    Unavailable {
        /// What was being done.
        what: &'static str,
        /// The stream, subject, consumer or key concerned.
        target: String,
        /// What the client said.
        message: String,
    },
    /// A message or a snapshot does not decode, or does not fit this worker's scoreboard.
    #[error("corrupt {target}: {message}")]
    Corrupt {
        /// The subject and stream sequence, or the key.
        target: String,
        /// Why.
        message: String,
    },
    /// Another worker wrote the shard's snapshot since this one read or wrote it: this worker
    /// is a zombie of its shard and stops.
    #[error(
        "fenced: shard {shard}'s snapshot {key} was written by another worker (expected revision {expected:?}); this worker stops"
    )]
    Fenced {
        /// The shard.
        shard: u16,
        /// The key.
        key: String,
        /// The revision this worker last wrote or read (`None`: it expected no key).
        expected: Option<u64>,
    },
    /// A snapshot is larger than the server takes in one message.
    #[error(
        "shard {shard}'s snapshot {key} is {bytes} bytes; the server takes at most {max} (raise max_payload, or use more shards)"
    )]
    TooLarge {
        /// The shard.
        shard: u16,
        /// The key.
        key: String,
        /// The snapshot's size.
        bytes: usize,
        /// The server's `max_payload`.
        max: usize,
    },
}

impl ShardError {
    fn unavailable(what: &'static str, target: impl Into<String>, e: impl fmt::Display) -> Self {
        ShardError::Unavailable {
            what,
            target: target.into(),
            message: e.to_string(),
        }
    }
}

/// `request`'s outcome, or [`ShardError::Unavailable`] when it takes longer than `timeout`.
async fn within<T, E>(
    timeout: Duration,
    what: &'static str,
    target: &str,
    request: impl Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, ShardError> {
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| ShardError::unavailable(what, target, format!("no answer within {timeout:?}")))
}

/// `request`'s value, or [`ShardError::Unavailable`] for an error or no answer within `timeout`.
async fn answer<T, E: fmt::Display>(
    timeout: Duration,
    what: &'static str,
    target: &str,
    request: impl Future<Output = Result<T, E>>,
) -> Result<T, ShardError> {
    within(timeout, what, target, request)
        .await?
        .map_err(|e| ShardError::unavailable(what, target, e))
}

fn name_ok(s: &str, extra: &[u8]) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || extra.contains(&b))
}

/// Where the shards live: the stream, its subjects, the snapshot bucket, how many shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardsConfig {
    /// The stream (`MULTICDN_BEACONS`).
    pub stream: String,
    /// The subject prefix (`multicdn.beacons`): shard `n` is `<prefix>.<n>`.
    pub prefix: String,
    /// The key-value bucket of the snapshots' heads (`multicdn_shards`): small, compared-and-set
    /// by revision.
    pub bucket: String,
    /// The object store of the snapshots' scoreboards (`multicdn_shards`), of any size.
    pub objects: String,
    /// How many shards; every publisher, worker and reader must agree.
    pub shards: u16,
    /// The stream's duplicate window: a batch published again within it is dropped (2 min).
    pub duplicate_window: Duration,
    /// How long the stream keeps batches (1 h): longer than a worker may be away.
    pub max_age: Duration,
    /// Deadline of each request to the server (2 s).
    pub timeout: Duration,
}

impl ShardsConfig {
    /// `shards` shards in `MULTICDN_BEACONS` / `multicdn.beacons.*` / `multicdn_shards`.
    pub fn new(shards: u16) -> ShardsConfig {
        ShardsConfig {
            stream: "MULTICDN_BEACONS".into(),
            prefix: "multicdn.beacons".into(),
            bucket: "multicdn_shards".into(),
            objects: "multicdn_shards".into(),
            shards,
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(3600),
            timeout: Duration::from_secs(2),
        }
    }

    /// The subject of shard `shard`.
    pub fn subject(&self, shard: u16) -> String {
        format!("{}.{shard}", self.prefix)
    }

    /// The snapshot key of shard `shard`.
    pub fn key(shard: u16) -> String {
        format!("shard-{shard}")
    }

    fn validate(&self) -> Result<(), ShardError> {
        if !name_ok(&self.stream, b"") {
            return Err(ShardError::Config(format!(
                "stream {:?}: use 1 to 64 of A-Z a-z 0-9 - _",
                self.stream
            )));
        }
        if !name_ok(&self.bucket, b"") {
            return Err(ShardError::Config(format!(
                "bucket {:?}: use 1 to 64 of A-Z a-z 0-9 - _",
                self.bucket
            )));
        }
        if !name_ok(&self.objects, b"") {
            return Err(ShardError::Config(format!(
                "objects {:?}: use 1 to 64 of A-Z a-z 0-9 - _",
                self.objects
            )));
        }
        if !name_ok(&self.prefix, b".")
            || self.prefix.starts_with('.')
            || self.prefix.ends_with('.')
        {
            return Err(ShardError::Config(format!(
                "prefix {:?}: dot-separated tokens of A-Z a-z 0-9 - _",
                self.prefix
            )));
        }
        if self.shards == 0 {
            return Err(ShardError::Config("shards 0: at least one shard".into()));
        }
        if self.timeout.is_zero() || self.duplicate_window.is_zero() {
            return Err(ShardError::Config(format!(
                "timeout {:?} and duplicate_window {:?}: both more than zero",
                self.timeout, self.duplicate_window
            )));
        }
        Ok(())
    }

    /// A JetStream context with this deadline.
    fn context(&self, client: async_nats::Client) -> jetstream::Context {
        let mut js = jetstream::new(client);
        js.set_timeout(self.timeout);
        js
    }

    /// The stream, created when missing.
    async fn ensure_stream(&self, js: &jetstream::Context) -> Result<stream::Stream, ShardError> {
        answer(
            self.timeout,
            "opening the beacon stream",
            &self.stream,
            js.get_or_create_stream(stream::Config {
                name: self.stream.clone(),
                description: Some("multicdn beacon batches, one subject per shard".into()),
                subjects: vec![format!("{}.*", self.prefix)],
                duplicate_window: self.duplicate_window,
                max_age: self.max_age,
                storage: stream::StorageType::File,
                ..Default::default()
            }),
        )
        .await
    }

    /// The snapshot bucket, created when missing.
    async fn ensure_bucket(&self, js: &jetstream::Context) -> Result<kv::Store, ShardError> {
        if let Ok(Ok(store)) =
            tokio::time::timeout(self.timeout, js.get_key_value(&self.bucket)).await
        {
            return Ok(store);
        }
        answer(
            self.timeout,
            "creating the snapshot bucket",
            &self.bucket,
            js.create_key_value(kv::Config {
                bucket: self.bucket.clone(),
                description: "multicdn shard snapshots".into(),
                history: 1,
                ..Default::default()
            }),
        )
        .await
    }
}

/// The snapshots' object store, created when missing.
impl ShardsConfig {
    async fn ensure_objects(&self, js: &jetstream::Context) -> Result<ObjectStore, ShardError> {
        if let Ok(Ok(store)) =
            tokio::time::timeout(self.timeout, js.get_object_store(&self.objects)).await
        {
            return Ok(store);
        }
        answer(
            self.timeout,
            "creating the snapshot object store",
            &self.objects,
            js.create_object_store(object_store::Config {
                bucket: self.objects.clone(),
                description: Some("multicdn shard scoreboards".into()),
                ..Default::default()
            }),
        )
        .await
    }
}

/// Where a shard's snapshots are: the head's bucket and the scoreboards' object store.
#[derive(Clone)]
struct Snapshots {
    heads: kv::Store,
    objects: ObjectStore,
    /// Deadline of a head read or write.
    timeout: Duration,
    /// Deadline of a scoreboard's read or write (they can be tens of megabytes).
    bulk_timeout: Duration,
}

impl fmt::Debug for Snapshots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshots").finish_non_exhaustive()
    }
}

impl Snapshots {
    async fn open(config: &ShardsConfig, js: &jetstream::Context) -> Result<Snapshots, ShardError> {
        Ok(Snapshots {
            heads: config.ensure_bucket(js).await?,
            objects: config.ensure_objects(js).await?,
            timeout: config.timeout,
            bulk_timeout: config.timeout * 15,
        })
    }

    async fn get_board(&self, name: &str) -> Result<Vec<u8>, ShardError> {
        let read = async {
            crate::leader::read_object(&self.objects, name)
                .await?
                .ok_or_else(|| format!("{name} was retired by a newer snapshot"))
        };
        answer(self.bulk_timeout, "reading a shard scoreboard", name, read).await
    }

    async fn put_board(&self, name: &str, bytes: &[u8]) -> Result<(), ShardError> {
        let mut reader = bytes;
        answer(
            self.bulk_timeout,
            "writing a shard scoreboard",
            name,
            self.objects.put(name, &mut reader),
        )
        .await
        .map(|_| ())
    }

    async fn delete_board(&self, name: &str) {
        if let Err(e) = answer(
            self.timeout,
            "deleting a shard scoreboard",
            name,
            self.objects.delete(name),
        )
        .await
        {
            tracing::debug!(error = %e, object = name, "an old shard scoreboard stays");
        }
    }
}

/// A batch as it travels: a JSON array of [`Received`].
pub fn encode_batch(beacons: &[Received]) -> Result<bytes::Bytes, ShardError> {
    serde_json::to_vec(beacons)
        .map(Into::into)
        .map_err(|e| ShardError::Corrupt {
            target: "a batch being encoded".into(),
            message: e.to_string(),
        })
}

/// A batch from its message payload.
pub fn decode_batch(payload: &[u8]) -> Result<Vec<Received>, serde_json::Error> {
    serde_json::from_slice(payload)
}

// ---------------------------------------------------------------------------------------------
// Publisher

/// How a [`BeaconPublisher`] buffers and batches.
#[derive(Debug, Clone, PartialEq)]
pub struct PublisherConfig {
    /// This receiver's name (`rx-eu-1`); with the start time it makes the publisher id.
    pub name: String,
    /// Where the shards live.
    pub shards: ShardsConfig,
    /// Beacons held at most: waiting for a batch, or in batches not yet acknowledged (50,000).
    pub buffer: usize,
    /// Beacons in one batch at most (500).
    pub batch_max: usize,
    /// How long a beacon waits for its batch to fill (50 ms).
    pub linger: Duration,
    /// How long a publish waits for the stream's acknowledgement (2 s).
    pub ack_timeout: Duration,
    /// The first retry's delay (50 ms); doubling up to `retry_max`.
    pub retry_min: Duration,
    /// The longest delay between retries (2 s).
    pub retry_max: Duration,
}

impl PublisherConfig {
    /// Defaults for the receiver `name`.
    pub fn new(name: impl Into<String>, shards: ShardsConfig) -> PublisherConfig {
        PublisherConfig {
            name: name.into(),
            shards,
            buffer: 50_000,
            batch_max: 500,
            linger: Duration::from_millis(50),
            ack_timeout: Duration::from_secs(2),
            retry_min: Duration::from_millis(50),
            retry_max: Duration::from_secs(2),
        }
    }

    fn validate(&self) -> Result<(), ShardError> {
        self.shards.validate()?;
        if !name_ok(&self.name, b".") {
            return Err(ShardError::Config(format!(
                "publisher name {:?}: use 1 to 64 of A-Z a-z 0-9 - _ .",
                self.name
            )));
        }
        if self.buffer == 0 || self.batch_max == 0 {
            return Err(ShardError::Config(format!(
                "buffer {} and batch_max {}: both at least 1",
                self.buffer, self.batch_max
            )));
        }
        if self.linger.is_zero() || self.ack_timeout.is_zero() || self.retry_min.is_zero() {
            return Err(ShardError::Config(
                "linger, ack_timeout and retry_min: all more than zero".into(),
            ));
        }
        if self.retry_max < self.retry_min {
            return Err(ShardError::Config(format!(
                "retry_max {:?} is shorter than retry_min {:?}",
                self.retry_max, self.retry_min
            )));
        }
        Ok(())
    }
}

/// What a publisher did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublisherStats {
    /// Beacons offered.
    pub offered: u64,
    /// Beacons in batches the stream acknowledged.
    pub published: u64,
    /// Batches the stream acknowledged.
    pub batches: u64,
    /// Beacons held now (waiting or in unacknowledged batches).
    pub buffered: usize,
    /// Beacons refused because the buffer was full or the publisher closed.
    pub dropped: u64,
    /// Publishes that failed or were not acknowledged in time (each retried).
    pub publish_errors: u64,
}

/// What [`BeaconPublisher::flush`] or [`BeaconPublisher::close`] left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushReport {
    /// Beacons still not acknowledged at the deadline (0: all published).
    pub left: usize,
    /// The counters then.
    pub stats: PublisherStats,
}

#[derive(Debug, Default)]
struct Counters {
    offered: AtomicU64,
    published: AtomicU64,
    batches: AtomicU64,
    buffered: AtomicUsize,
    dropped: AtomicU64,
    errors: AtomicU64,
    closed: AtomicBool,
    flush: AtomicBool,
}

struct PublisherInner {
    tx: mpsc::UnboundedSender<Received>,
    counters: Arc<Counters>,
    wake: Arc<Notify>,
    task: tokio::task::AbortHandle,
    buffer: usize,
    id: String,
}

impl Drop for PublisherInner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Publishes accepted beacons to their shards in batches (see the module documentation).
/// Clones share one buffer and one background task; the task ends when the last clone is
/// dropped (what it still held is lost: call [`close`](Self::close) first).
#[derive(Clone)]
pub struct BeaconPublisher {
    inner: Arc<PublisherInner>,
}

impl fmt::Debug for BeaconPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BeaconPublisher")
            .field("id", &self.inner.id)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

struct Batch {
    shard: u16,
    id: String,
    payload: bytes::Bytes,
    beacons: usize,
}

impl BeaconPublisher {
    /// Makes sure the stream exists and starts the background task. The publisher id is
    /// `<name>-<start time in ms>`, so a restarted receiver never reuses a message id inside
    /// the duplicate window.
    pub async fn start(
        client: async_nats::Client,
        config: PublisherConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<BeaconPublisher, ShardError> {
        config.validate()?;
        let js = config.shards.context(client);
        config.shards.ensure_stream(&js).await?;
        let id = format!("{}-{}", config.name, clock.now().as_millis());
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let wake = Arc::new(Notify::new());
        let task = tokio::spawn(publish_loop(
            js,
            config.clone(),
            id.clone(),
            rx,
            counters.clone(),
            wake.clone(),
        ));
        Ok(BeaconPublisher {
            inner: Arc::new(PublisherInner {
                tx,
                counters,
                wake,
                task: task.abort_handle(),
                buffer: config.buffer,
                id,
            }),
        })
    }

    /// The publisher id (the prefix of its message ids).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Takes `beacon` into the buffer, or returns false (counted as dropped) when the buffer
    /// is full or the publisher closed. Never waits.
    pub fn offer(&self, beacon: &Received) -> bool {
        let c = &self.inner.counters;
        c.offered.fetch_add(1, Ordering::Relaxed);
        let cap = self.inner.buffer;
        let taken = !c.closed.load(Ordering::Relaxed)
            && c.buffered
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < cap).then_some(n + 1)
                })
                .is_ok();
        if taken && self.inner.tx.send(beacon.clone()).is_ok() {
            return true;
        }
        if taken {
            c.buffered.fetch_sub(1, Ordering::AcqRel);
        }
        c.dropped.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// The counters.
    pub fn stats(&self) -> PublisherStats {
        let c = &self.inner.counters;
        PublisherStats {
            offered: c.offered.load(Ordering::Relaxed),
            published: c.published.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            buffered: c.buffered.load(Ordering::Acquire),
            dropped: c.dropped.load(Ordering::Relaxed),
            publish_errors: c.errors.load(Ordering::Relaxed),
        }
    }

    /// Publishes what is buffered now without waiting for batches to fill, and waits until
    /// the buffer is empty or `deadline` has passed.
    pub async fn flush(&self, deadline: Duration) -> FlushReport {
        self.inner.counters.flush.store(true, Ordering::Release);
        self.inner.wake.notify_one();
        let step = Duration::from_millis(5);
        let mut waited = Duration::ZERO;
        while self.inner.counters.buffered.load(Ordering::Acquire) > 0 && waited < deadline {
            tokio::time::sleep(step).await;
            waited += step;
            self.inner.wake.notify_one();
        }
        let stats = self.stats();
        FlushReport {
            left: stats.buffered,
            stats,
        }
    }

    /// Refuses further beacons, flushes within `deadline` and stops the task; reports what
    /// was left unpublished.
    pub async fn close(&self, deadline: Duration) -> FlushReport {
        self.inner.counters.closed.store(true, Ordering::Release);
        let report = self.flush(deadline).await;
        self.inner.task.abort();
        if report.left > 0 {
            tracing::warn!(publisher = %self.inner.id, left = report.left, "closed with beacons unpublished");
        }
        report
    }
}

/// Seals batches: their message ids and payloads.
struct Sealer {
    id: String,
    seq: u64,
    counters: Arc<Counters>,
}

impl Sealer {
    fn seal(&mut self, shard: u16, beacons: Vec<Received>, sealed: &mut VecDeque<Batch>) {
        self.seq += 1;
        match encode_batch(&beacons) {
            Ok(payload) => sealed.push_back(Batch {
                shard,
                id: format!("{}-{}", self.id, self.seq),
                payload,
                beacons: beacons.len(),
            }),
            Err(e) => {
                // Not reachable for beacons that came from JSON; counted, never held forever.
                tracing::error!(error = %e, "a batch does not encode; its beacons are dropped");
                let c = &self.counters;
                c.buffered.fetch_sub(beacons.len(), Ordering::AcqRel);
                c.dropped.fetch_add(beacons.len() as u64, Ordering::Relaxed);
            }
        }
    }

    fn seal_all(&mut self, open: &mut HashMap<u16, Vec<Received>>, sealed: &mut VecDeque<Batch>) {
        for (shard, list) in open.iter_mut() {
            if !list.is_empty() {
                let part = std::mem::take(list);
                self.seal(*shard, part, sealed);
            }
        }
    }
}

/// The background task: batches per shard, publishes the oldest sealed batch until the
/// stream acknowledges it.
async fn publish_loop(
    js: jetstream::Context,
    config: PublisherConfig,
    id: String,
    mut rx: mpsc::UnboundedReceiver<Received>,
    counters: Arc<Counters>,
    wake: Arc<Notify>,
) {
    let shards = config.shards.shards;
    let mut open: HashMap<u16, Vec<Received>> = HashMap::new();
    let mut sealed: VecDeque<Batch> = VecDeque::new();
    let mut backoff = None;
    let mut sealer = Sealer {
        id,
        seq: 0,
        counters: counters.clone(),
    };
    // Every linger, the partial batches go: a beacon waits at most one linger for its batch.
    let mut linger = tokio::time::interval(config.linger);
    linger.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let limit = config.batch_max.saturating_mul(usize::from(shards.max(1)));
    loop {
        let mut incoming = Vec::new();
        if sealed.is_empty() {
            tokio::select! {
                r = rx.recv() => match r {
                    Some(r) => incoming.push(r),
                    // Every handle is gone.
                    None => return,
                },
                _ = linger.tick() => sealer.seal_all(&mut open, &mut sealed),
                () = wake.notified() => {}
            }
        } else if futures::FutureExt::now_or_never(linger.tick()).is_some() {
            sealer.seal_all(&mut open, &mut sealed);
        }
        while incoming.len() < limit {
            match rx.try_recv() {
                Ok(r) => incoming.push(r),
                Err(_) => break,
            }
        }
        for r in incoming {
            let shard = shard_of(&r.network, shards);
            let list = open.entry(shard).or_default();
            list.push(r);
            if list.len() >= config.batch_max {
                let full = std::mem::take(list);
                sealer.seal(shard, full, &mut sealed);
            }
        }
        if counters.flush.swap(false, Ordering::AcqRel) {
            sealer.seal_all(&mut open, &mut sealed);
        }
        let Some(batch) = sealed.front() else {
            continue;
        };
        let subject = config.shards.subject(batch.shard);
        let publish = jetstream::context::Publish::build()
            .message_id(&batch.id)
            .payload(batch.payload.clone());
        let outcome = async {
            let ack = js
                .send_publish(subject.clone(), publish)
                .await
                .map_err(|e| e.to_string())?;
            ack.await.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(config.ack_timeout, outcome).await {
            Ok(Ok(_)) => {
                backoff = None;
                let n = batch.beacons;
                sealed.pop_front();
                counters.buffered.fetch_sub(n, Ordering::AcqRel);
                counters.published.fetch_add(n as u64, Ordering::Relaxed);
                counters.batches.fetch_add(1, Ordering::Relaxed);
            }
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e,
                    _ => format!("no acknowledgement within {:?}", config.ack_timeout),
                };
                counters.errors.fetch_add(1, Ordering::Relaxed);
                let delay = backoff
                    .get_or_insert_with(|| {
                        ExponentialBuilder::default()
                            .with_min_delay(config.retry_min)
                            .with_max_delay(config.retry_max)
                            .without_max_times()
                            .build()
                    })
                    .next()
                    .unwrap_or(config.retry_max);
                tracing::warn!(subject, batch = %batch.id, error = %why, ?delay, "publishing a beacon batch failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshots

/// What a worker publishes for its shard: the head (key `shard-<n>`, JSON, everything but the
/// scoreboard, and the name of the object holding the scoreboard) and the scoreboard (an
/// object of the snapshot object store, JSON), so a shard of any size fits.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardSnapshot {
    /// The shard.
    pub shard: u16,
    /// The worker that wrote it.
    pub worker: String,
    /// When it was written (the worker's clock): the freshness of this shard's evidence.
    pub published_at: Timestamp,
    /// Beacons applied in this shard since it began.
    pub beacons: u64,
    /// Batches applied in this shard since it began.
    pub batches: u64,
    /// The ack floor: every batch of this shard at or below this stream sequence is in
    /// `board` (or was terminated as malformed); a redelivery of one is acknowledged, not
    /// applied again, even when the server forgot its acknowledgement (a crash).
    #[serde(default)]
    pub floor: u64,
    /// Stream sequences above `floor` of batches in `board`: a redelivery of one is
    /// acknowledged, not applied again.
    pub applied: BTreeSet<u64>,
    /// The shard's scoreboard.
    pub board: Scoreboard,
}

/// A snapshot's head as the key holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Head {
    shard: u16,
    worker: String,
    published_at: Timestamp,
    beacons: u64,
    batches: u64,
    #[serde(default)]
    floor: u64,
    applied: BTreeSet<u64>,
    /// The object holding the scoreboard.
    board: String,
}

fn corrupt(target: &str) -> impl FnOnce(serde_json::Error) -> ShardError + '_ {
    move |e| ShardError::Corrupt {
        target: target.to_owned(),
        message: e.to_string(),
    }
}

/// Shard `shard`'s snapshot, its revision and its scoreboard's object, `None` when none was
/// written.
async fn read_snapshot(
    snapshots: &Snapshots,
    shard: u16,
) -> Result<Option<(ShardSnapshot, u64, String)>, ShardError> {
    // A worker may publish (and retire an old scoreboard) between the head and the object:
    // once more then, from the new head.
    match read_snapshot_once(snapshots, shard).await {
        Err(ShardError::Unavailable { .. }) => read_snapshot_once(snapshots, shard).await,
        other => other,
    }
}

async fn read_snapshot_once(
    snapshots: &Snapshots,
    shard: u16,
) -> Result<Option<(ShardSnapshot, u64, String)>, ShardError> {
    let key = ShardsConfig::key(shard);
    let entry = answer(
        snapshots.timeout,
        "reading a shard snapshot",
        &key,
        snapshots.heads.entry(&key),
    )
    .await?;
    let Some(entry) = entry else { return Ok(None) };
    if entry.operation != Operation::Put {
        return Ok(None);
    }
    let head: Head = serde_json::from_slice(&entry.value).map_err(corrupt(&key))?;
    if head.shard != shard {
        return Err(ShardError::Corrupt {
            target: key,
            message: format!("holds shard {}'s snapshot", head.shard),
        });
    }
    let bytes = snapshots.get_board(&head.board).await?;
    let board: Scoreboard = serde_json::from_slice(&bytes).map_err(corrupt(&head.board))?;
    Ok(Some((
        ShardSnapshot {
            shard,
            worker: head.worker,
            published_at: head.published_at,
            beacons: head.beacons,
            batches: head.batches,
            floor: head.floor,
            applied: head.applied,
            board,
        },
        entry.revision,
        head.board,
    )))
}

// ---------------------------------------------------------------------------------------------
// Worker

/// How an [`IngestWorker`] consumes and snapshots its shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The shard.
    pub shard: u16,
    /// This worker's name (`ingest-b-2`), written into its snapshots.
    pub name: String,
    /// Where the shards live.
    pub shards: ShardsConfig,
    /// How long the server waits for an acknowledgement before redelivering (30 s); longer
    /// than `snapshot_every`, since a batch is acknowledged at the snapshot after it.
    pub ack_wait: Duration,
    /// How often the shard's snapshot is published, busy or idle (5 s).
    pub snapshot_every: Duration,
    /// Batches asked for in one pull (64).
    pub pull_max: usize,
}

impl WorkerConfig {
    /// Defaults for shard `shard`.
    pub fn new(shard: u16, name: impl Into<String>, shards: ShardsConfig) -> WorkerConfig {
        WorkerConfig {
            shard,
            name: name.into(),
            shards,
            ack_wait: Duration::from_secs(30),
            snapshot_every: Duration::from_secs(5),
            pull_max: 64,
        }
    }

    /// The durable consumer's name (`ingest-<shard>`).
    pub fn consumer(&self) -> String {
        format!("ingest-{}", self.shard)
    }

    fn validate(&self) -> Result<(), ShardError> {
        self.shards.validate()?;
        if self.shard >= self.shards.shards {
            return Err(ShardError::Config(format!(
                "shard {}: there are {} shards (0 to {})",
                self.shard,
                self.shards.shards,
                self.shards.shards - 1
            )));
        }
        if self.name.trim().is_empty() || self.name.len() > 256 {
            return Err(ShardError::Config(format!(
                "worker name {:?}: 1 to 256 characters",
                self.name
            )));
        }
        if self.snapshot_every.is_zero() || self.ack_wait <= self.snapshot_every {
            return Err(ShardError::Config(format!(
                "ack_wait {:?} must be longer than snapshot_every {:?} (more than zero)",
                self.ack_wait, self.snapshot_every
            )));
        }
        if self.pull_max == 0 {
            return Err(ShardError::Config("pull_max 0: at least 1".into()));
        }
        Ok(())
    }
}

/// What a worker did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerStats {
    /// Batches applied.
    pub batches: u64,
    /// Beacons applied.
    pub beacons: u64,
    /// Redelivered batches found already applied (acknowledged, not applied again).
    pub duplicates: u64,
    /// Messages that did not decode (terminated).
    pub malformed: u64,
    /// Snapshots published.
    pub snapshots: u64,
    /// Acknowledgements the server confirmed.
    pub acked: u64,
}

/// The counters of a worker, readable while it runs.
#[derive(Debug, Clone, Default)]
pub struct WorkerCounters(Arc<Mutex<WorkerStats>>);

impl WorkerCounters {
    /// The counters now.
    pub fn get(&self) -> WorkerStats {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut WorkerStats)) {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// Consumes one shard (see the module documentation). Drive it with [`run`](Self::run), or
/// step by step with [`pull`](Self::pull) and [`checkpoint`](Self::checkpoint).
pub struct IngestWorker {
    config: WorkerConfig,
    consumer: jetstream::consumer::Consumer<pull::Config>,
    snapshots: Snapshots,
    /// The objects holding the last two published scoreboards, newest last (the one before
    /// is deleted once a newer one is in force: a reader that read the previous head a moment
    /// ago still finds its scoreboard).
    objects: VecDeque<String>,
    clock: Arc<dyn Clock>,
    probe_order: Vec<String>,
    max_payload: usize,
    board: Scoreboard,
    /// Every batch at or below this stream sequence is applied or terminated.
    floor: u64,
    /// Every stream sequence above the floor applied.
    applied: BTreeSet<u64>,
    /// Messages to acknowledge once a snapshot holds them.
    unacked: Vec<jetstream::Message>,
    /// Messages in the last published snapshot, to acknowledge now.
    to_ack: Vec<jetstream::Message>,
    revision: Option<u64>,
    beacons: u64,
    batches: u64,
    counters: WorkerCounters,
    last_snapshot: Timestamp,
}

impl fmt::Debug for IngestWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IngestWorker")
            .field("config", &self.config)
            .field("revision", &self.revision)
            .field("applied", &self.applied.len())
            .field("stats", &self.counters.get())
            .finish_non_exhaustive()
    }
}

impl IngestWorker {
    /// Opens the stream, the bucket and the durable consumer `ingest-<shard>`, and loads the
    /// shard's last snapshot into `board` (an empty scoreboard with the providers and
    /// bucket length every shard uses; `probe_order` names the providers of probe beacons
    /// in array form, as the controller's).
    pub async fn open(
        client: async_nats::Client,
        config: WorkerConfig,
        board: Scoreboard,
        probe_order: Vec<String>,
        clock: Arc<dyn Clock>,
    ) -> Result<IngestWorker, ShardError> {
        config.validate()?;
        let max_payload = client.server_info().max_payload;
        let js = config.shards.context(client);
        let stream = config.shards.ensure_stream(&js).await?;
        let snapshots = Snapshots::open(&config.shards, &js).await?;
        let name = config.consumer();
        let consumer = answer(
            config.shards.timeout,
            "opening the shard's consumer",
            &name,
            stream.get_or_create_consumer(
                &name,
                pull::Config {
                    durable_name: Some(name.clone()),
                    description: Some(format!("multicdn ingest of shard {}", config.shard)),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: config.ack_wait,
                    filter_subject: config.shards.subject(config.shard),
                    max_ack_pending: 100_000,
                    ..Default::default()
                },
            ),
        )
        .await?;
        let mut worker = IngestWorker {
            last_snapshot: clock.now(),
            config,
            consumer,
            snapshots,
            objects: VecDeque::new(),
            clock,
            probe_order,
            max_payload,
            board,
            floor: 0,
            applied: BTreeSet::new(),
            unacked: Vec::new(),
            to_ack: Vec::new(),
            revision: None,
            beacons: 0,
            batches: 0,
            counters: WorkerCounters::default(),
        };
        if let Some((snap, revision, object)) =
            read_snapshot(&worker.snapshots, worker.config.shard).await?
        {
            worker.objects.push_back(object);
            worker
                .board
                .merge(&snap.board)
                .map_err(|e| ShardError::Corrupt {
                    target: ShardsConfig::key(worker.config.shard),
                    message: format!("the snapshot does not fit this worker's scoreboard: {e}"),
                })?;
            worker.floor = snap.floor;
            worker.applied = snap.applied;
            worker.beacons = snap.beacons;
            worker.batches = snap.batches;
            worker.revision = Some(revision);
            tracing::info!(shard = worker.config.shard, revision, from = %snap.worker, "loaded the shard's snapshot");
        }
        Ok(worker)
    }

    /// The counters (a handle that stays readable while the worker runs).
    pub fn counters(&self) -> WorkerCounters {
        self.counters.clone()
    }

    /// The shard's scoreboard as applied so far (not necessarily published).
    pub fn board(&self) -> &Scoreboard {
        &self.board
    }

    /// Pulls up to `pull_max` batches, waiting at most `wait`, and applies them; returns how
    /// many messages arrived. Nothing is acknowledged here (see [`checkpoint`](Self::checkpoint)).
    pub async fn pull(&mut self, wait: Duration) -> Result<usize, ShardError> {
        let wait = wait.max(Duration::from_millis(10));
        let subject = self.config.shards.subject(self.config.shard);
        let mut messages = answer(
            self.config.shards.timeout,
            "pulling batches",
            &subject,
            self.consumer
                .batch()
                .max_messages(self.config.pull_max)
                .expires(wait)
                .messages(),
        )
        .await?;
        let mut n = 0;
        // The pull ends at its expiry; a little slack for the server's answer.
        let until = wait + self.config.shards.timeout;
        loop {
            let next = match tokio::time::timeout(until, messages.next()).await {
                Ok(Some(Ok(m))) => m,
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    return Err(ShardError::unavailable("pulling batches", subject, e));
                }
                Err(_) => {
                    return Err(ShardError::unavailable(
                        "pulling batches",
                        subject,
                        format!("the pull did not end within {until:?}"),
                    ));
                }
            };
            n += 1;
            self.take(next, &subject).await;
        }
        Ok(n)
    }

    async fn take(&mut self, message: jetstream::Message, subject: &str) {
        let seq = match message.info() {
            Ok(info) => info.stream_sequence,
            Err(e) => {
                tracing::warn!(subject, error = %e, "a message without JetStream metadata; ignored");
                return;
            }
        };
        if seq <= self.floor || self.applied.contains(&seq) {
            self.counters.update(|s| s.duplicates += 1);
            self.unacked.push(message);
            return;
        }
        let batch = match decode_batch(&message.payload) {
            Ok(b) => b,
            Err(e) => {
                let err = ShardError::Corrupt {
                    target: format!("batch {seq} on {subject}"),
                    message: e.to_string(),
                };
                tracing::error!(error = %err, "terminating a malformed batch");
                self.counters.update(|s| s.malformed += 1);
                if let Err(e) = message.ack_with(AckKind::Term).await {
                    tracing::warn!(subject, seq, error = %e, "terminating a malformed batch failed; it will be redelivered");
                }
                return;
            }
        };
        for r in &batch {
            match &r.beacon {
                Beacon::Navigation(nav) => {
                    self.board.record_navigation(r.at, r.network, nav);
                }
                Beacon::Probe(probe) => {
                    self.board
                        .record_probe(r.at, r.network, probe, &self.probe_order);
                }
            }
        }
        self.applied.insert(seq);
        self.beacons += batch.len() as u64;
        self.batches += 1;
        self.counters.update(|s| {
            s.batches += 1;
            s.beacons += batch.len() as u64;
        });
        self.unacked.push(message);
    }

    /// Publishes the shard's snapshot (by revision) without acknowledging anything; the
    /// batches it holds are acknowledged by the next [`ack_snapshot`](Self::ack_snapshot).
    /// [`ShardError::Fenced`] when another worker wrote the key since.
    pub async fn publish_snapshot(&mut self) -> Result<(), ShardError> {
        let shard = self.config.shard;
        let key = ShardsConfig::key(shard);
        let now = self.clock.now();
        // Buckets past the retention go before the snapshot: a shard's board stays the size of
        // its window, however long the worker runs.
        self.board.expire(now);
        let object = format!(
            "shard-{shard}-{}-{}",
            now.as_millis(),
            self.revision.unwrap_or(0) + 1
        );
        let board = serde_json::to_vec(&self.board).map_err(corrupt(&object))?;
        self.snapshots.put_board(&object, &board).await?;
        let head = Head {
            shard,
            worker: self.config.name.clone(),
            published_at: now,
            beacons: self.beacons,
            batches: self.batches,
            floor: self.floor,
            applied: self.applied.clone(),
            board: object.clone(),
        };
        let value: bytes::Bytes = serde_json::to_vec(&head).map_err(corrupt(&key))?.into();
        if self.max_payload > 0 && value.len() > self.max_payload {
            self.snapshots.delete_board(&object).await;
            return Err(ShardError::TooLarge {
                shard,
                key,
                bytes: value.len(),
                max: self.max_payload,
            });
        }
        let timeout = self.config.shards.timeout;
        const WHAT: &str = "publishing a shard snapshot";
        let fenced = ShardError::Fenced {
            shard,
            key: key.clone(),
            expected: self.revision,
        };
        let written = match self.revision {
            Some(rev) => within(
                timeout,
                WHAT,
                &key,
                self.snapshots.heads.update(&key, value, rev),
            )
            .await?
            .map_err(|e| match e.kind() {
                kv::UpdateErrorKind::WrongLastRevision => fenced,
                _ => ShardError::unavailable(WHAT, &key, e),
            }),
            None => within(
                timeout,
                WHAT,
                &key,
                self.snapshots.heads.create(&key, value),
            )
            .await?
            .map_err(|e| match e.kind() {
                kv::CreateErrorKind::AlreadyExists => fenced,
                _ => ShardError::unavailable(WHAT, &key, e),
            }),
        };
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                if matches!(e, ShardError::Fenced { .. }) {
                    // This scoreboard is in force nowhere (after a timeout it may be).
                    self.snapshots.delete_board(&object).await;
                }
                return Err(e);
            }
        };
        self.objects.push_back(object);
        while self.objects.len() > 2 {
            if let Some(old) = self.objects.pop_front() {
                self.snapshots.delete_board(&old).await;
            }
        }
        self.revision = Some(written);
        self.last_snapshot = now;
        self.to_ack.append(&mut self.unacked);
        self.counters.update(|s| s.snapshots += 1);
        Ok(())
    }

    /// Acknowledges the batches held by the published snapshot, awaiting the server's
    /// confirmation, then raises the floor to the consumer's ack floor (never lowers it: a
    /// server that lost acknowledgements in a crash redelivers batches this worker knows it
    /// applied) and forgets the applied sequences below it. Returns how many were confirmed.
    pub async fn ack_snapshot(&mut self) -> usize {
        let timeout = self.config.shards.timeout;
        let shard = self.config.shard;
        let mut confirmed = 0;
        for message in std::mem::take(&mut self.to_ack) {
            match tokio::time::timeout(timeout, message.double_ack()).await {
                Ok(Ok(())) => confirmed += 1,
                Ok(Err(e)) => {
                    tracing::warn!(shard, error = %e, "an acknowledgement was not confirmed; the batch will be redelivered and recognised");
                }
                Err(_) => {
                    tracing::warn!(
                        shard,
                        "an acknowledgement was not confirmed in time; the batch will be redelivered and recognised"
                    );
                }
            }
        }
        self.counters.update(|s| s.acked += confirmed as u64);
        match tokio::time::timeout(timeout, self.consumer.info()).await {
            Ok(Ok(info)) => {
                let floor = info.ack_floor.stream_sequence;
                if floor > self.floor {
                    self.floor = floor;
                    self.applied = self.applied.split_off(&(floor + 1));
                }
            }
            Ok(Err(e)) => tracing::debug!(shard, error = %e, "reading the ack floor failed"),
            Err(_) => tracing::debug!(shard, "reading the ack floor timed out"),
        }
        confirmed
    }

    /// [`publish_snapshot`](Self::publish_snapshot), then [`ack_snapshot`](Self::ack_snapshot).
    pub async fn checkpoint(&mut self) -> Result<usize, ShardError> {
        self.publish_snapshot().await?;
        Ok(self.ack_snapshot().await)
    }

    /// Pulls, applies and checkpoints every `snapshot_every` (also when idle) until
    /// `shutdown` completes, then checkpoints once more. Returns the counters; stops early
    /// with [`ShardError::Fenced`] (another worker took the shard) — a server that is away
    /// is waited for, logged, never fatal.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<WorkerStats, ShardError> {
        let mut shutdown = std::pin::pin!(shutdown);
        // The first snapshot at once: the shard says it is alive.
        self.last_snapshot = Timestamp::EPOCH;
        loop {
            let now = self.clock.now();
            let due = self.last_snapshot.plus(self.config.snapshot_every);
            if now >= due {
                match self.checkpoint().await {
                    Ok(_) => {}
                    Err(e @ ShardError::Fenced { .. }) => return Err(e),
                    Err(e) => {
                        tracing::warn!(shard = self.config.shard, error = %e, "a snapshot failed; retrying");
                        self.last_snapshot = now
                            .minus(self.config.snapshot_every)
                            .plus(Duration::from_millis(200));
                    }
                }
                continue;
            }
            let wait = due.since(now).min(Duration::from_secs(1));
            tokio::select! {
                () = &mut shutdown => break,
                pulled = self.pull(wait) => {
                    if let Err(e) = pulled {
                        tracing::warn!(shard = self.config.shard, error = %e, "pulling failed; trying again");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
        self.checkpoint().await?;
        Ok(self.counters.get())
    }
}

// ---------------------------------------------------------------------------------------------
// Merge

/// One shard as the merge found it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardStatus {
    /// The shard.
    pub shard: u16,
    /// When its snapshot was published; `None`: never, or it does not read.
    pub published_at: Option<Timestamp>,
    /// How long ago, as of the read's `now`.
    pub age: Option<Duration>,
    /// Its scoreboard's cells.
    pub cells: usize,
    /// Beacons and batches applied in it.
    pub beacons: u64,
    /// Batches applied in it.
    pub batches: u64,
    /// The worker that wrote it.
    pub worker: Option<String>,
    /// Why its snapshot was not used (corrupt, or does not fit the board), if so.
    pub problem: Option<String>,
}

/// The merged scoreboard of every shard and how fresh its evidence is.
#[derive(Debug, Clone)]
pub struct Merged {
    /// Every shard's cells added to the base board.
    pub board: Scoreboard,
    /// Each shard, in order.
    pub shards: Vec<ShardStatus>,
    /// The evidence time for the deadman: the oldest shard's `published_at`, capped by the
    /// merged board's newest sample; `None` when a shard never published (or does not read)
    /// or the board holds no sample.
    pub as_of: Option<Timestamp>,
}

/// Reads and merges the shards' snapshots (for the controller).
#[derive(Debug, Clone)]
pub struct ShardSet {
    snapshots: Snapshots,
    shards: u16,
}

impl ShardSet {
    /// The snapshots of `config` (their bucket and object store created when missing).
    pub async fn open(
        client: async_nats::Client,
        config: ShardsConfig,
    ) -> Result<ShardSet, ShardError> {
        config.validate()?;
        let js = config.context(client);
        Ok(ShardSet {
            snapshots: Snapshots::open(&config, &js).await?,
            shards: config.shards,
        })
    }

    /// How many shards it reads.
    pub fn shards(&self) -> u16 {
        self.shards
    }

    /// Merges the latest snapshot of every shard into a copy of `base` (an empty scoreboard
    /// with the controller's providers and bucket length) as of `now`. A shard whose snapshot
    /// is missing, corrupt or does not fit is reported in its [`ShardStatus`] and makes
    /// `as_of` `None`; a bucket that cannot be read is [`ShardError::Unavailable`].
    ///
    /// The controller feeds `board` to its decision and `as_of` to the deadman in place of
    /// the board's own newest sample.
    pub async fn read(&self, base: &Scoreboard, now: Timestamp) -> Result<Merged, ShardError> {
        let mut board = base.clone();
        let mut shards = Vec::with_capacity(usize::from(self.shards));
        let mut oldest: Option<Option<Timestamp>> = None;
        for shard in 0..self.shards {
            let mut status = ShardStatus {
                shard,
                published_at: None,
                age: None,
                cells: 0,
                beacons: 0,
                batches: 0,
                worker: None,
                problem: None,
            };
            match read_snapshot(&self.snapshots, shard).await {
                Ok(Some((snap, _, _))) => match board.merge(&snap.board) {
                    Ok(()) => {
                        status.published_at = Some(snap.published_at);
                        status.age = Some(now.since(snap.published_at));
                        status.cells = snap.board.cells();
                        status.beacons = snap.beacons;
                        status.batches = snap.batches;
                        status.worker = Some(snap.worker);
                    }
                    Err(e) => status.problem = Some(format!("does not fit the board: {e}")),
                },
                Ok(None) => {}
                Err(e @ ShardError::Unavailable { .. }) => return Err(e),
                Err(e) => status.problem = Some(e.to_string()),
            }
            oldest = Some(match (oldest, status.published_at) {
                (None, p) => p,
                (Some(Some(a)), Some(b)) => Some(a.min(b)),
                _ => None,
            });
            shards.push(status);
        }
        let newest = board
            .snapshot(now, board.config().retention)
            .newest_sample();
        let as_of = match (oldest.flatten(), newest) {
            (Some(a), Some(n)) => Some(a.min(n)),
            _ => None,
        };
        Ok(Merged {
            board,
            shards,
            as_of,
        })
    }
}
