//! Two or more controllers, of which exactly one steers (feature `nats`): rounds gated on the
//! [lease](crate::lease), the loop's state where a standby reads it, and a takeover that goes
//! on from the step a failover had reached.
//!
//! Every contender runs the same [`Controller`] (same policy, actuators behind
//! [`FencedSteerer`](crate::lease::FencedSteerer)) inside a [`Leader`]. The lease is renewed
//! every third of its TTL on its own schedule, so a long round does not let it lapse. A round
//! runs only while this contender holds it, and goes in three writes to the [`SharedStore`]:
//!
//! 1. **Intent.** Once the round has decided, before anything is applied: the round's number,
//!    its plan and the term go into the store's head, compared-and-set on the head's revision
//!    after the lease has been checked on the server. A deposed leader's intent fails there,
//!    and the round applies nothing, journals nothing and changes nothing
//!    ([`crate::Deposed`]).
//! 2. **Apply**, through the fenced actuators (each write re-checks the lease).
//! 3. **Commit.** The state after the round (engine memory, plan, ledger, purges owed,
//!    operator switches, the round's record with its term) as an object, then the head
//!    compared-and-set to it, then the round's record as a journal object. A journal record
//!    missing after a crash between the last two is written back from the state on load (the
//!    state carries it), so the journal has no gap and no duplicate.
//!
//! A contender that becomes leader (first start, or the holder died or paused past its lease)
//! reads the store before its first round: the loop's state as the last leader committed it,
//! and its intent if it began a round it never committed. Each actuator is asked whether that
//! round's plan is already in force; one that holds it is not written again, so a plan the dead
//! leader applied is applied once. The round's record says so ([`Takeover`](crate::Takeover)).
//!
//! The head lives in a key-value bucket (history 1, no expiry), the state and the journal in
//! an object store, so their size is not bounded by the server's message size.
//!
//! ```no_run
//! # async fn demo(controller: multicdn::Controller) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use multicdn::leader::{Leader, SharedStore, StoreConfig};
//! use multicdn::lease::{LeaseConfig, NatsLease};
//!
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let lease = NatsLease::open(client.clone(), LeaseConfig::new("controller-eu-1", Duration::from_secs(15))).await?;
//! let store = SharedStore::open(client, StoreConfig::default()).await?;
//! let leader = Leader::new(controller, lease, store);
//! leader.run(tokio::signal::ctrl_c().map(|_| ())).await;
//! # Ok(()) }
//! # use futures::FutureExt;
//! ```

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::object_store::{self, ObjectStore};
use futures::{FutureExt, StreamExt};
use multicdn_core::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::Controller;
use crate::controller::{Deposed, RoundGate, RoundReport, every};
use crate::lease::{LeaseError, LeaseState, NatsLease, Term};
use crate::record::{Intent, RoundRecord};
use crate::shards::{ShardSet, ShardStatus};
use crate::store::{ControllerState, Saved, reconcile};
use multicdn_steering::scoreboard::{Scoreboard, ScoreboardConfig};

/// Where the shared state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The key-value bucket holding the head (`multicdn-controller`).
    pub bucket: String,
    /// The object store holding the state and the journal (`multicdn-controller`).
    pub objects: String,
    /// Deadline of each request to the server (a state of many megabytes takes longer).
    pub timeout: Duration,
    /// How many of the journal's last rounds a contender reads when it takes over (the older
    /// ones stay in the store, one object a round).
    pub journal_window: usize,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig {
            bucket: "multicdn-controller".into(),
            objects: "multicdn-controller".into(),
            timeout: Duration::from_secs(5),
            journal_window: 200,
        }
    }
}

/// The shared store could not be read or written, or a write was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SharedStoreError {
    /// The server did not answer in time, or refused the request.
    #[error("NATS JetStream unavailable for the controller's state ({what}): {message}")]
    Unavailable {
        /// What was being done.
        what: String,
        /// What the client said.
        message: String,
    },
    /// What the store holds is not a controller's state.
    #[error("the controller's shared state is unreadable ({what}): {message}")]
    Corrupt {
        /// What was read.
        what: String,
        /// What the parser said.
        message: String,
    },
    /// Another controller wrote the head since this one last read it: this one is deposed.
    #[error(
        "fenced: another controller wrote the shared state (head revision {found:?}, expected {expected:?})"
    )]
    Fenced {
        /// The revision this controller last read or wrote.
        expected: Option<u64>,
        /// The revision found, when it could be read.
        found: Option<u64>,
    },
}

fn unavailable(what: impl Into<String>) -> impl FnOnce(String) -> SharedStoreError {
    let what = what.into();
    move |message| SharedStoreError::Unavailable { what, message }
}

async fn answer<T, E: fmt::Display>(
    timeout: Duration,
    what: &str,
    request: impl Future<Output = Result<T, E>>,
) -> Result<T, SharedStoreError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(what)(e.to_string())),
        Err(_) => Err(unavailable(what)(format!("no answer within {timeout:?}"))),
    }
}

/// The head: which state object is current, and the round begun after it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Head {
    /// The last committed round (0: none).
    round: u64,
    /// The object holding that round's state.
    #[serde(default)]
    state: Option<String>,
    /// The state object before it, kept one commit longer for a reader that read the
    /// previous head a moment ago (the next commit deletes it).
    #[serde(default)]
    kept: Option<String>,
    /// The round begun and not yet committed.
    #[serde(default)]
    intent: Option<Intent>,
}

const HEAD: &str = "head";

/// An object's bytes, whole; `None` when there is no such object or it was deleted. The
/// object's info is read first: reading the chunks of a deleted object would wait for chunks
/// that never come.
pub(crate) async fn read_object(
    objects: &ObjectStore,
    name: &str,
) -> Result<Option<Vec<u8>>, String> {
    match objects.info(name).await {
        Ok(info) if info.deleted => return Ok(None),
        Ok(_) => {}
        Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    }
    let mut object = match objects.get(name).await {
        Ok(o) => o,
        Err(e) if e.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut bytes = Vec::new();
    object
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Some(bytes))
}

fn journal_name(round: u64) -> String {
    format!("journal-{round:012}")
}

/// The loop's state shared between contenders: a head key compared-and-set by revision, the
/// state and the journal as objects. Clones share it.
#[derive(Clone)]
pub struct SharedStore {
    kv: kv::Store,
    objects: ObjectStore,
    config: Arc<StoreConfig>,
    /// The head's revision this contender last read or wrote, and the head.
    seen: Arc<Mutex<Option<(u64, Head)>>>,
}

impl fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What a contender found in the store on becoming leader.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Loaded {
    /// The state and the journal.
    pub saved: Saved,
    /// The round the last leader began and did not commit.
    pub intent: Option<Intent>,
}

impl SharedStore {
    /// Opens (creating if needed) the head's bucket and the object store on `client`'s server.
    pub async fn open(
        client: async_nats::Client,
        config: StoreConfig,
    ) -> Result<SharedStore, SharedStoreError> {
        let mut js = jetstream::new(client);
        js.set_timeout(config.timeout);
        let t = config.timeout;
        let kv = match answer(
            t,
            "opening the head's bucket",
            js.get_key_value(&config.bucket),
        )
        .await
        {
            Ok(kv) => kv,
            Err(e) => {
                tracing::debug!(error = %e, "no controller bucket yet; creating it");
                answer(
                    t,
                    "creating the head's bucket",
                    js.create_key_value(kv::Config {
                        bucket: config.bucket.clone(),
                        description: "multicdn controller state head".into(),
                        history: 1,
                        ..Default::default()
                    }),
                )
                .await?
            }
        };
        let objects = match answer(
            t,
            "opening the object store",
            js.get_object_store(&config.objects),
        )
        .await
        {
            Ok(o) => o,
            Err(e) => {
                tracing::debug!(error = %e, "no controller object store yet; creating it");
                answer(
                    t,
                    "creating the object store",
                    js.create_object_store(object_store::Config {
                        bucket: config.objects.clone(),
                        description: Some("multicdn controller state and journal".into()),
                        ..Default::default()
                    }),
                )
                .await?
            }
        };
        Ok(SharedStore {
            kv,
            objects,
            config: Arc::new(config),
            seen: Arc::new(Mutex::new(None)),
        })
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Option<(u64, Head)>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn read_head(&self) -> Result<Option<(u64, Head)>, SharedStoreError> {
        let entry = answer(self.config.timeout, "reading the head", self.kv.entry(HEAD)).await?;
        let Some(entry) = entry else { return Ok(None) };
        if entry.operation != Operation::Put {
            return Ok(None);
        }
        let head: Head =
            serde_json::from_slice(&entry.value).map_err(|e| SharedStoreError::Corrupt {
                what: format!("{}/{HEAD}", self.config.bucket),
                message: e.to_string(),
            })?;
        Ok(Some((entry.revision, head)))
    }

    /// An object's bytes; `None` when it is not there (or no longer).
    async fn get_object(&self, name: &str) -> Result<Option<Vec<u8>>, SharedStoreError> {
        let what = format!("reading {}/{name}", self.config.objects);
        answer(self.config.timeout, &what, read_object(&self.objects, name)).await
    }

    /// A round's journal record; `None` when the store has none for it.
    async fn get_record(&self, round: u64) -> Result<Option<RoundRecord>, SharedStoreError> {
        let name = journal_name(round);
        let Some(bytes) = self.get_object(&name).await? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| SharedStoreError::Corrupt {
                what: format!("{}/{name}", self.config.objects),
                message: e.to_string(),
            })
    }

    async fn put_object(&self, name: &str, bytes: &[u8]) -> Result<(), SharedStoreError> {
        let what = format!("writing {}/{name}", self.config.objects);
        let mut reader = bytes;
        answer(
            self.config.timeout,
            &what,
            self.objects.put(name, &mut reader),
        )
        .await
        .map(|_| ())
    }

    /// Everything committed so far (`None`: nothing yet), and an intent left unfinished. A
    /// journal record the last leader did not write (it died between the state and the
    /// journal) is written back from the state. The head's revision read here is the one the
    /// next write compares against.
    pub async fn load(&self) -> Result<Option<Loaded>, SharedStoreError> {
        // A leader's commits retire state objects: one read between a head and its state
        // may find the state gone after two commits; the head is read again then, once.
        let mut retired = None;
        let (revision, head, state_name, bytes) = loop {
            let Some((revision, head)) = self.read_head().await? else {
                *self.seen() = None;
                return Ok(None);
            };
            let Some(state_name) = head.state.clone() else {
                *self.seen() = Some((revision, head));
                return Ok(None);
            };
            match self.get_object(&state_name).await? {
                Some(bytes) => break (revision, head, state_name, bytes),
                None if retired.is_none() => retired = Some(state_name),
                None => {
                    return Err(SharedStoreError::Corrupt {
                        what: format!("{}/{HEAD}", self.config.bucket),
                        message: format!(
                            "the head names the state object {state_name}, which is not in {} \
                             (nor was {}, read just before)",
                            self.config.objects,
                            retired.unwrap_or_default()
                        ),
                    });
                }
            }
        };
        let intent = head.intent.clone().filter(|i| i.round == head.round + 1);
        let state: ControllerState =
            serde_json::from_slice(&bytes).map_err(|e| SharedStoreError::Corrupt {
                what: format!("{}/{state_name}", self.config.objects),
                message: e.to_string(),
            })?;
        // The journal's last rounds, read by name (no listing), several at a time.
        let first = state
            .round
            .saturating_sub(self.config.journal_window.saturating_sub(1) as u64)
            .max(1);
        let records: Vec<Result<Option<RoundRecord>, SharedStoreError>> =
            futures::stream::iter(first..=state.round)
                .map(|round| self.get_record(round))
                .buffered(16)
                .collect()
                .await;
        let mut lines = Vec::with_capacity(records.len());
        for r in records {
            lines.extend(r?);
        }
        let (journal, repaired) = reconcile(&state, lines, first);
        if repaired && let Some(last) = &state.last {
            let bytes = encode(last)?;
            self.put_object(&journal_name(last.round), &bytes).await?;
            tracing::warn!(
                round = last.round,
                "wrote back a journal record the last leader left unwritten"
            );
        }
        *self.seen() = Some((revision, head));
        Ok(Some(Loaded {
            saved: Saved { state, journal },
            intent,
        }))
    }

    /// Compares-and-sets the head: from the revision last seen to `head`.
    async fn swap_head(&self, head: Head) -> Result<(), SharedStoreError> {
        let expected = self.seen().as_ref().map(|(r, _)| *r);
        let bytes = encode(&head)?;
        let t = self.config.timeout;
        let written = match expected {
            Some(rev) => tokio::time::timeout(t, self.kv.update(HEAD, bytes.into(), rev))
                .await
                .map_err(|_| unavailable("writing the head")(format!("no answer within {t:?}")))?
                .map_err(|e| match e.kind() {
                    kv::UpdateErrorKind::WrongLastRevision => None,
                    _ => Some(e.to_string()),
                }),
            None => tokio::time::timeout(t, self.kv.create(HEAD, bytes.into()))
                .await
                .map_err(|_| unavailable("writing the head")(format!("no answer within {t:?}")))?
                .map_err(|e| match e.kind() {
                    kv::CreateErrorKind::AlreadyExists => None,
                    _ => Some(e.to_string()),
                }),
        };
        match written {
            Ok(revision) => {
                *self.seen() = Some((revision, head));
                Ok(())
            }
            Err(Some(message)) => Err(unavailable("writing the head")(message)),
            Err(None) => {
                let found = self.read_head().await.ok().flatten().map(|(r, _)| r);
                Err(SharedStoreError::Fenced { expected, found })
            }
        }
    }

    /// Records the round about to be applied (compared-and-set on the head).
    pub async fn begin(&self, intent: &Intent) -> Result<(), SharedStoreError> {
        let mut head = self
            .seen()
            .as_ref()
            .map(|(_, h)| h.clone())
            .unwrap_or_default();
        head.intent = Some(intent.clone());
        self.swap_head(head).await
    }

    /// Commits the state after a round: the state object, the head (compared-and-set), the
    /// round's journal record; then the state object two commits old is deleted (the one
    /// before is kept for readers of the previous head).
    pub async fn commit(&self, state: &ControllerState, term: u64) -> Result<(), SharedStoreError> {
        let name = format!("state-{:012}-{term}", state.round);
        self.put_object(&name, &encode(state)?).await?;
        let (previous, retired) = self
            .seen()
            .as_ref()
            .map(|(_, h)| (h.state.clone(), h.kept.clone()))
            .unwrap_or_default();
        let kept = previous.filter(|p| *p != name);
        self.swap_head(Head {
            round: state.round,
            state: Some(name.clone()),
            kept: kept.clone(),
            intent: None,
        })
        .await?;
        if let Some(last) = &state.last
            && last.round == state.round
        {
            self.put_object(&journal_name(last.round), &encode(last)?)
                .await?;
        }
        if let Some(old) = retired.filter(|p| *p != name && Some(p) != kept.as_ref())
            && let Err(e) = answer(
                self.config.timeout,
                "deleting the previous state",
                self.objects.delete(&old),
            )
            .await
        {
            tracing::debug!(error = %e, object = %old, "the previous state object stays");
        }
        Ok(())
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, SharedStoreError> {
    serde_json::to_vec(value).map_err(|e| SharedStoreError::Corrupt {
        what: "encoding".into(),
        message: e.to_string(),
    })
}

/// What one [`Leader::step`] did.
#[derive(Debug)]
#[non_exhaustive]
pub enum Step {
    /// This contender leads: the round ran.
    Led(Box<RoundReport>),
    /// Another contender leads (or nobody yet): no round.
    Following {
        /// Who holds the lease, if anyone was seen.
        holder: Option<Term>,
    },
    /// The round was refused: this contender was deposed between the lease's renewal and the
    /// round's first write. Nothing was applied; the next leadership starts from the store.
    Deposed(Deposed),
    /// The store could not be read when taking over: no round (the lease is kept; the next
    /// step tries again).
    Unavailable(SharedStoreError),
}

struct Gate<'a> {
    lease: &'a NatsLease,
    store: &'a SharedStore,
    term: Term,
}

#[async_trait::async_trait]
impl RoundGate for Gate<'_> {
    async fn begin(&self, intent: &Intent) -> Result<u64, String> {
        self.lease
            .check(&self.term)
            .await
            .map_err(|e| e.to_string())?;
        let mut intent = intent.clone();
        intent.term = self.term.term;
        self.store.begin(&intent).await.map_err(|e| e.to_string())?;
        Ok(self.term.term)
    }

    async fn commit(&self, state: &ControllerState) -> Result<(), String> {
        self.store
            .commit(state, self.term.term)
            .await
            .map_err(|e| e.to_string())
    }
}

#[derive(Debug, Default)]
struct Tenure {
    /// The term whose state this contender has loaded (and leads in).
    loaded: Option<u64>,
    /// A round was journaled here but not committed to the store: commit before the next.
    uncommitted: bool,
}

/// A controller that runs rounds only while it holds the lease (see the module
/// documentation). Clones share it.
#[derive(Clone)]
pub struct Leader {
    controller: Controller,
    lease: NatsLease,
    store: SharedStore,
    tenure: Arc<tokio::sync::Mutex<Tenure>>,
    shards: Option<Arc<Shards>>,
}

/// The shards' snapshots a leader merges before each round.
struct Shards {
    set: ShardSet,
    /// An empty scoreboard with the policy's providers and bucket length.
    base: Scoreboard,
    /// The last merge's shards, for the dashboard and the logs.
    last: Mutex<Vec<ShardStatus>>,
}

impl fmt::Debug for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leader")
            .field("lease", &self.lease)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl Leader {
    /// `controller` behind `lease`, its state shared through `store`. Its actuators should be
    /// [`FencedSteerer`](crate::lease::FencedSteerer)s on the same lease.
    pub fn new(controller: Controller, lease: NatsLease, store: SharedStore) -> Leader {
        Leader {
            controller,
            lease,
            store,
            tenure: Arc::new(tokio::sync::Mutex::new(Tenure::default())),
            shards: None,
        }
    }

    /// Takes the evidence from sharded ingest ([`crate::shards`]): before each round it leads,
    /// the latest snapshot of every shard is merged and fed to the controller
    /// ([`Controller::feed_scoreboard`]), with the merge's `as_of` as the deadman's evidence
    /// time: a shard that stops publishing makes the data stale (static weights after
    /// `stale_after`), never silently thinner. A merge that cannot be read feeds nothing, so
    /// the last one's `as_of` ages the same way.
    pub fn with_shards(mut self, set: ShardSet) -> Result<Leader, crate::ControllerError> {
        let policy = self.controller.policy();
        let base = Scoreboard::new(
            ScoreboardConfig::from_policy(&policy.steering.rum),
            &policy.provider_ids(),
        )?;
        self.shards = Some(Arc::new(Shards {
            set,
            base,
            last: Mutex::new(Vec::new()),
        }));
        Ok(self)
    }

    /// Each shard as the last merge found it (empty without shards or before the first).
    pub fn shard_status(&self) -> Vec<ShardStatus> {
        self.shards
            .as_ref()
            .map(|s| {
                s.last
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            })
            .unwrap_or_default()
    }

    async fn merge_shards(&self, now: Timestamp) {
        let Some(shards) = &self.shards else { return };
        match shards.set.read(&shards.base, now).await {
            Ok(merged) => {
                for s in &merged.shards {
                    if let Some(problem) = &s.problem {
                        tracing::warn!(shard = s.shard, problem = %problem, "a shard's snapshot is not used");
                    } else if s.published_at.is_none() {
                        tracing::warn!(
                            shard = s.shard,
                            "a shard has published no snapshot: its networks have no evidence"
                        );
                    }
                }
                *shards.last.lock().unwrap_or_else(PoisonError::into_inner) = merged.shards;
                if let Err(e) = self.controller.feed_scoreboard(merged.board, merged.as_of) {
                    tracing::error!(error = %e, "the merged scoreboard does not fit the controller's");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the shards could not be read: the evidence ages until they can");
            }
        }
    }

    /// The controller.
    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    /// The lease.
    pub fn lease(&self) -> &NatsLease {
        &self.lease
    }

    /// The shared store.
    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    /// Renews the lease (or tries to take it) now; what it found.
    pub async fn contend(&self) -> Result<LeaseState, LeaseError> {
        let state = self.lease.try_acquire().await;
        if !matches!(state, Ok(LeaseState::Leader(_))) {
            // Whatever this contender loaded is stale once it stops leading.
            self.tenure.lock().await.loaded = None;
        }
        state
    }

    /// One round at `now` if this contender holds the lease (as last renewed): on becoming
    /// leader it first takes over the state from the store.
    pub async fn step(&self, now: Timestamp) -> Step {
        let Some(term) = self.lease.held() else {
            self.tenure.lock().await.loaded = None;
            return Step::Following {
                holder: self.lease.current().await.ok().flatten(),
            };
        };
        let mut tenure = self.tenure.lock().await;
        if tenure.loaded != Some(term.term) {
            match self.store.load().await {
                Ok(Some(loaded)) => {
                    if let Err(e) = self.controller.restore(loaded.saved, loaded.intent).await {
                        return Step::Unavailable(SharedStoreError::Corrupt {
                            what: "the state taken over".into(),
                            message: e.to_string(),
                        });
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot take over: the shared state is unreadable");
                    return Step::Unavailable(e);
                }
            }
            tenure.loaded = Some(term.term);
            tenure.uncommitted = false;
            tracing::info!(lease = %term, "leading");
        }
        if tenure.uncommitted {
            let state = self.controller.state().await;
            match self.store.commit(&state, term.term).await {
                Ok(()) => tenure.uncommitted = false,
                Err(e @ SharedStoreError::Fenced { .. }) => {
                    tenure.loaded = None;
                    return Step::Deposed(Deposed {
                        round: state.round + 1,
                        why: e.to_string(),
                    });
                }
                Err(e) => return Step::Unavailable(e),
            }
        }
        self.merge_shards(now).await;
        let gate = Gate {
            lease: &self.lease,
            store: &self.store,
            term,
        };
        match self.controller.round_with(now, &gate).await {
            Ok(report) => {
                if report.store_error.is_some() {
                    tenure.uncommitted = true;
                }
                Step::Led(Box::new(report))
            }
            Err(d) => {
                tenure.loaded = None;
                Step::Deposed(d)
            }
        }
    }

    /// Renews the lease every [`NatsLease::renew_interval`] until `shutdown`, then releases
    /// it (so a standby need not wait for the TTL).
    pub async fn keep_lease(&self, shutdown: impl Future<Output = ()>) {
        every(self.lease.renew_interval(), shutdown, || async {
            match self.contend().await {
                Ok(LeaseState::Leader(_)) => {}
                Ok(LeaseState::Follower { holder }) => {
                    tracing::debug!(holder = %holder, "following");
                }
                Err(e) => tracing::warn!(error = %e, "the lease could not be renewed"),
            }
        })
        .await;
        if let Err(e) = self.lease.release().await {
            tracing::warn!(error = %e, "the lease could not be released; it lapses after its ttl");
        }
    }

    /// Contends for the lease and runs a round every controller interval while leading, until
    /// `shutdown`; a round in flight finishes first, then the lease is released.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        self.run_observed(shutdown, |_, _| async {}).await;
    }

    /// As [`Leader::run`], calling `observe` with every round led and how long it took.
    pub async fn run_observed<F, Fut>(&self, shutdown: impl Future<Output = ()>, observe: F)
    where
        F: Fn(Box<RoundReport>, Duration) -> Fut,
        Fut: Future<Output = ()>,
    {
        let shutdown = shutdown.shared();
        let _ = self.contend().await;
        let clock = self.controller.clock();
        let rounds = every(self.controller.interval(), shutdown.clone(), || async {
            let started = multicdn_core::clock::Stopwatch::start();
            if let Step::Led(report) = self.step(clock.now()).await {
                observe(report, started.elapsed()).await;
            }
        });
        tokio::join!(rounds, self.keep_lease(shutdown));
    }
}
