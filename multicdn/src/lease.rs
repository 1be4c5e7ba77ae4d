//! Exactly one controller steers: a lease in a NATS JetStream key-value bucket, and a fencing
//! token that refuses a deposed leader's writes (feature `nats`).
//!
//! Seed 002: "two independent optimizers steering the same traffic against each other is the
//! distributed-systems bug you get to keep". Two or more controllers run; each calls
//! [`NatsLease::try_acquire`] every [`NatsLease::renew_interval`] (a third of the lease's TTL).
//! The key is created by the first; the holder renews it by revision (compare-and-set), so a
//! renewal from anyone else fails; the bucket's `max_age` is the TTL, so a holder that stops
//! renewing (killed, paused, partitioned) loses the key when its last write ages out, and the
//! next contender creates it again.
//!
//! **Fencing.** Each tenure has a *term*: the key's revision at the write that acquired it
//! (JetStream revisions only grow, so a later leader always has a higher term). Renewals carry
//! the term unchanged. [`FencedSteerer`] wraps an actuator: before every write it re-reads the
//! key, and a term or holder other than its own refuses the write
//! ([`multicdn_core::Error::InvalidRequest`], nothing sent). A leader that was paused past its
//! lease and wakes up mid-round is refused at its next write. What remains is the moment
//! between the re-read and the vendor's write: no DNS vendor takes a fencing token, so that
//! window is as short as one key read.
//!
//! ```no_run
//! # async fn demo(steerer: std::sync::Arc<dyn multicdn::core::Steerer>) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use multicdn::lease::{LeaseConfig, LeaseState, NatsLease, FencedSteerer};
//!
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let lease = NatsLease::open(client, LeaseConfig::new("controller-eu-1", Duration::from_secs(15))).await?;
//! let fenced = FencedSteerer::new(lease.clone(), steerer, "route53".parse()?);
//! loop {
//!     match lease.try_acquire().await? {
//!         LeaseState::Leader(term) => { /* run a round that applies through `fenced` */ let _ = term; }
//!         LeaseState::Follower { holder, .. } => { /* decide and journal, apply nothing */ let _ = holder; }
//!     }
//!     tokio::time::sleep(lease.renew_interval()).await;
//! }
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::kv::{self, Operation};
use async_trait::async_trait;
use multicdn_core::{
    ApplyOptions, Error, ProviderId, Steerer, SteeringDiff, SteeringPlan, SteeringState,
};
use serde::{Deserialize, Serialize};

/// The bucket and key a lease lives in, who contends, and for how long a tenure lasts
/// without renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The key-value bucket (`multicdn-lease`).
    pub bucket: String,
    /// The key (`controller`): one lease per key.
    pub key: String,
    /// This contender's name, unique among them (`controller-eu-1`).
    pub holder: String,
    /// How long a tenure lasts without renewal; the bucket's `max_age`.
    pub ttl: Duration,
    /// Deadline of each request to the server.
    pub timeout: Duration,
}

impl LeaseConfig {
    /// The lease `multicdn-lease` / `controller` for `holder`, lasting `ttl`, with requests
    /// of at most 2 s and a quarter of the TTL (a renewal must fit in a renewal interval).
    pub fn new(holder: impl Into<String>, ttl: Duration) -> LeaseConfig {
        LeaseConfig {
            bucket: "multicdn-lease".into(),
            key: "controller".into(),
            holder: holder.into(),
            ttl,
            timeout: (ttl / 4).min(Duration::from_secs(2)),
        }
    }

    /// In another bucket and key.
    pub fn at(mut self, bucket: impl Into<String>, key: impl Into<String>) -> LeaseConfig {
        self.bucket = bucket.into();
        self.key = key.into();
        self
    }

    fn validate(&self) -> Result<(), LeaseError> {
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name_ok(&self.bucket) {
            return Err(LeaseError::Config(format!(
                "bucket {:?}: use 1 to 64 of A-Z a-z 0-9 - _",
                self.bucket
            )));
        }
        if !name_ok(&self.key) {
            return Err(LeaseError::Config(format!(
                "key {:?}: use 1 to 64 of A-Z a-z 0-9 - _",
                self.key
            )));
        }
        if self.holder.trim().is_empty() || self.holder.len() > 256 {
            return Err(LeaseError::Config(format!(
                "holder {:?}: name this contender (1 to 256 characters)",
                self.holder
            )));
        }
        if self.ttl < Duration::from_secs(1) {
            return Err(LeaseError::Config(format!(
                "ttl {:?}: a lease lasts at least 1 s",
                self.ttl
            )));
        }
        if self.timeout.is_zero() || self.timeout >= self.ttl {
            return Err(LeaseError::Config(format!(
                "timeout {:?}: more than zero and shorter than the ttl {:?}",
                self.timeout, self.ttl
            )));
        }
        Ok(())
    }
}

/// A tenure: who holds the lease, and its term (the fencing token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Term {
    /// The holder.
    pub holder: String,
    /// The key's revision at the write that acquired the lease: it only grows from one tenure
    /// to the next.
    pub term: u64,
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (term {})", self.holder, self.term)
    }
}

/// What [`NatsLease::try_acquire`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// This contender holds the lease (acquired now or renewed).
    Leader(Term),
    /// Another does.
    Follower {
        /// Who holds it, and its term.
        holder: Term,
    },
}

/// Why the lease could not be read or written, or a write was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The configuration is not usable.
    #[error("lease configuration: {0}")]
    Config(String),
    /// The server did not answer within the deadline, or JetStream is not enabled on it.
    #[error("NATS JetStream unavailable for the lease ({what}): {message}")]
    Unavailable {
        /// What was being done.
        what: &'static str,
        /// What the client said.
        message: String,
    },
    /// The key holds something that is not a lease.
    #[error("the lease key holds {0:?}, which is not a multicdn lease")]
    Corrupt(String),
    /// A write under `ours` was refused: the lease is now `current` (or nobody's).
    #[error("fenced: {ours} no longer holds the lease ({})", current.as_ref().map_or_else(|| "nobody holds it".to_owned(), |c| format!("{c} holds it")))]
    Fenced {
        /// The tenure the write was made under.
        ours: Term,
        /// The tenure in force, if any.
        current: Option<Term>,
    },
}

fn unavailable(what: &'static str) -> impl FnOnce(String) -> LeaseError {
    move |message| LeaseError::Unavailable { what, message }
}

/// `request`'s outcome, or [`LeaseError::Unavailable`] when it takes longer than `timeout`.
async fn within<T, E>(
    timeout: Duration,
    what: &'static str,
    request: impl Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, LeaseError> {
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| unavailable(what)(format!("no answer within {timeout:?}")))
}

/// `request`'s value, or [`LeaseError::Unavailable`] for an error or no answer in time.
async fn answer<T, E: fmt::Display>(
    timeout: Duration,
    what: &'static str,
    request: impl Future<Output = Result<T, E>>,
) -> Result<T, LeaseError> {
    within(timeout, what, request)
        .await?
        .map_err(|e| unavailable(what)(e.to_string()))
}

/// What the key holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Value {
    holder: String,
    /// 0 on the acquiring write (its own revision is the term).
    term: u64,
}

#[derive(Debug, Default)]
struct Held {
    /// Our tenure and the key's last revision we wrote.
    tenure: Option<(Term, u64)>,
}

/// A lease in a JetStream key-value bucket. Clones share it.
#[derive(Clone)]
pub struct NatsLease {
    store: kv::Store,
    config: Arc<LeaseConfig>,
    held: Arc<Mutex<Held>>,
}

impl fmt::Debug for NatsLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsLease")
            .field("config", &self.config)
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

impl NatsLease {
    /// Opens (creating if needed) the lease's bucket on `client`'s server: history 1, and
    /// `max_age` the lease's TTL. A bucket that exists with another `max_age` is an error.
    pub async fn open(client: async_nats::Client, config: LeaseConfig) -> Result<Self, LeaseError> {
        config.validate()?;
        let mut js = jetstream::new(client);
        js.set_timeout(config.timeout);
        let store = match within(
            config.timeout,
            "opening the bucket",
            js.get_key_value(&config.bucket),
        )
        .await?
        {
            Ok(store) => store,
            Err(e) => {
                tracing::debug!(error = %e, "no lease bucket yet; creating it");
                answer(
                    config.timeout,
                    "creating the bucket",
                    js.create_key_value(kv::Config {
                        bucket: config.bucket.clone(),
                        description: "multicdn controller lease".into(),
                        history: 1,
                        max_age: config.ttl,
                        ..Default::default()
                    }),
                )
                .await?
            }
        };
        let info = answer(config.timeout, "reading the bucket", store.status()).await?;
        if info.max_age() != config.ttl {
            return Err(LeaseError::Config(format!(
                "bucket {} keeps entries {:?}, the lease's ttl is {:?}: use one ttl for every contender",
                config.bucket,
                info.max_age(),
                config.ttl
            )));
        }
        Ok(NatsLease {
            store,
            config: Arc::new(config),
            held: Arc::new(Mutex::new(Held::default())),
        })
    }

    /// How often to call [`try_acquire`](Self::try_acquire): a third of the TTL, so two
    /// renewals can fail before the tenure lapses.
    pub fn renew_interval(&self) -> Duration {
        self.config.ttl / 3
    }

    /// The configuration.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The tenure this contender believes it holds (it may have lapsed since the last call).
    pub fn held(&self) -> Option<Term> {
        self.lock().tenure.as_ref().map(|(t, _)| t.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn encode(&self, term: u64) -> Result<bytes::Bytes, LeaseError> {
        serde_json::to_vec(&Value {
            holder: self.config.holder.clone(),
            term,
        })
        .map(Into::into)
        .map_err(|e| LeaseError::Corrupt(e.to_string()))
    }

    /// The tenure in force, from the server; `None` when nobody holds the lease.
    pub async fn current(&self) -> Result<Option<Term>, LeaseError> {
        let entry = answer(
            self.config.timeout,
            "reading the lease",
            self.store.entry(&self.config.key),
        )
        .await?;
        let Some(entry) = entry else { return Ok(None) };
        if entry.operation != Operation::Put {
            return Ok(None);
        }
        let value: Value = serde_json::from_slice(&entry.value)
            .map_err(|_| LeaseError::Corrupt(String::from_utf8_lossy(&entry.value).into_owned()))?;
        Ok(Some(Term {
            holder: value.holder,
            term: if value.term == 0 {
                entry.revision
            } else {
                value.term
            },
        }))
    }

    /// Renews the lease if this contender holds it, takes it if nobody does, and otherwise
    /// says who does. A renewal that finds the lease taken (this contender's tenure lapsed)
    /// reports the new holder.
    pub async fn try_acquire(&self) -> Result<LeaseState, LeaseError> {
        let timeout = self.config.timeout;
        let ours = self.lock().tenure.clone();
        if let Some((term, revision)) = ours {
            let renewal = self
                .store
                .update(&self.config.key, self.encode(term.term)?, revision);
            match within(timeout, "renewing the lease", renewal).await? {
                Ok(next) => {
                    self.lock().tenure = Some((term.clone(), next));
                    return Ok(LeaseState::Leader(term));
                }
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    tracing::warn!(lease = %term, "the lease lapsed: another contender or an expiry took it");
                    self.lock().tenure = None;
                }
                Err(e) => return Err(unavailable("renewing the lease")(e.to_string())),
            }
        }
        // Take it, or say who holds it. The key can lapse between the two calls: once more then.
        for _ in 0..2 {
            let create = self.store.create(&self.config.key, self.encode(0)?);
            match within(timeout, "taking the lease", create).await? {
                Ok(revision) => {
                    let term = Term {
                        holder: self.config.holder.clone(),
                        term: revision,
                    };
                    tracing::info!(lease = %term, "acquired the lease");
                    self.lock().tenure = Some((term.clone(), revision));
                    return Ok(LeaseState::Leader(term));
                }
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                    if let Some(holder) = self.current().await? {
                        return Ok(LeaseState::Follower { holder });
                    }
                }
                Err(e) => return Err(unavailable("taking the lease")(e.to_string())),
            }
        }
        Err(unavailable("taking the lease")(
            "the key was freed and taken again while it was read; try again".into(),
        ))
    }

    /// Gives the lease up now (a clean shutdown), so another contender need not wait for the
    /// TTL. Does nothing unless this contender holds it.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let Some((_, revision)) = self.lock().tenure.take() else {
            return Ok(());
        };
        let delete = self
            .store
            .delete_expect_revision(&self.config.key, Some(revision));
        match within(self.config.timeout, "releasing the lease", delete).await? {
            Ok(()) => Ok(()),
            // Someone else's by now: nothing of ours to give up.
            Err(e) if e.kind() == kv::DeleteErrorKind::WrongLastRevision => Ok(()),
            Err(e) => Err(unavailable("releasing the lease")(e.to_string())),
        }
    }

    /// Checks that `ours` is still the tenure in force, from the server: the fence every
    /// write goes through.
    pub async fn check(&self, ours: &Term) -> Result<(), LeaseError> {
        let current = self.current().await?;
        if current.as_ref() == Some(ours) {
            Ok(())
        } else {
            Err(LeaseError::Fenced {
                ours: ours.clone(),
                current,
            })
        }
    }
}

/// An actuator behind the lease: every write first checks, on the server, that this
/// contender's tenure is still the one in force, and is refused (nothing sent) when it is
/// not, or when the lease cannot be read. Reads go through unfenced.
#[derive(Debug, Clone)]
pub struct FencedSteerer<S> {
    lease: NatsLease,
    inner: S,
    name: ProviderId,
}

impl<S: Steerer> FencedSteerer<S> {
    /// `inner` behind `lease`; a refused write is an error naming `name` (the actuator:
    /// `route53`, `content-steering`).
    pub fn new(lease: NatsLease, inner: S, name: ProviderId) -> FencedSteerer<S> {
        FencedSteerer { lease, inner, name }
    }

    /// The actuator behind the fence.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: Steerer> Steerer for FencedSteerer<S> {
    async fn current(&self) -> Result<SteeringState, Error> {
        self.inner.current().await
    }

    async fn plan(&self, plan: &SteeringPlan) -> Result<SteeringDiff, Error> {
        self.inner.plan(plan).await
    }

    async fn apply(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<SteeringDiff, Error> {
        let refuse = |message: String| Error::InvalidRequest {
            provider: self.name.clone(),
            message,
        };
        let Some(ours) = self.lease.held() else {
            return Err(refuse(
                "not applied: this controller does not hold the lease".into(),
            ));
        };
        self.lease
            .check(&ours)
            .await
            .map_err(|e| refuse(format!("not applied: {e}")))?;
        self.inner.apply(plan, options).await
    }

    fn selects_asns(&self) -> bool {
        self.inner.selects_asns()
    }
}
