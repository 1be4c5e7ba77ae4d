//! The purge fan-out: one purge sent to every provider in parallel, each batched and paced by
//! its own limits, and a report of what each acknowledged and how long the slowest took (the
//! staleness window the application can reason about).
//!
//! A purge that one provider missed is never a warning. If any provider still fails after its
//! retries, [`PurgeFanout::purge`] returns [`FanoutError::Missed`] naming every provider that
//! failed, its error and the items it missed (with the receipts of those that succeeded), and
//! emits [`Event::PurgeMissed`] for each to the [`EventSink`], the signal the steering engine
//! uses to demote a provider until it has been purged.
//!
//! A purge that some provider cannot do at all (purge by host on Fastly, a soft purge on
//! Cloudflare) is refused before anything is sent to anyone ([`FanoutError::Refused`]): purging
//! one provider but not another is the very thing this module exists to prevent.
//!
//! ## Missed purges and the way back
//!
//! The fan-out remembers, per provider, what it missed and has not been purged of since: the
//! items by kind, and whether a purge of everything was missed ([`PurgeFanout::outstanding`],
//! one [`Outstanding`] per provider). Each provider is in one of two states:
//!
//! - **in step** (nothing outstanding): a purge it acknowledges changes nothing; a purge it
//!   misses records what it missed, emits [`Event::PurgeMissed`] (which demotes it) and makes
//!   it *behind*;
//! - **behind** (something outstanding): a purge it acknowledges clears the misses it covers
//!   (the same items of the same kind; a purge of everything clears them all; a soft purge
//!   clears only what was missed soft), whichever call sent it: [`PurgeFanout::purge`],
//!   [`PurgeFanout::purge_queued`] or [`PurgeFanout::retry_missed`]. A purge it misses adds to
//!   what is outstanding and emits [`Event::PurgeMissed`] again. When a call in which the
//!   provider missed nothing clears the last of it, the fan-out emits
//!   [`Event::PurgeRecovered`] once (to the [`EventSink`] and in the report's `recovered` and
//!   `events`) and the provider is in step again.
//!
//! [`PurgeFanout::retry_missed`] re-sends exactly what each behind provider missed, by kind,
//! to that provider only (batched, paced and retried as any purge); providers in step are
//! sent nothing. The record lives in memory, shared by clones of the fan-out, and is updated
//! as each provider's answers arrive. To keep it across a restart, write
//! [`PurgeFanout::outstanding`] down (each [`Outstanding`] serialises as the purges that would
//! clear it) and hand it to the next process's fan-out with [`PurgeFanout::restore`], which
//! returns the providers to demote at startup.
//!
//! [`PurgeFanout::purge_queued`] is for large imports: thousands of tags fed through at the
//! slowest provider's ceiling (every provider's budgets at once, so none is sent faster than
//! it accepts), with a progress callback, rather than discovering the limit with 429s.
//!
//! ```
//! use std::sync::Arc;
//! use multicdn_core::{Error, ProviderId, PurgeReceipt, PurgeRequest, Purger};
//! use multicdn_providers::fanout::{FanoutMember, Pacing, PurgeFanout};
//!
//! /// A purger that acknowledges everything (stands in for Fastly or Cloudflare).
//! #[derive(Debug)]
//! struct Acks(ProviderId);
//!
//! #[async_trait::async_trait]
//! impl Purger for Acks {
//!     fn provider(&self) -> &ProviderId {
//!         &self.0
//!     }
//!     async fn purge(&self, r: &PurgeRequest) -> Result<PurgeReceipt, Error> {
//!         let n = r.scope.items().len();
//!         Ok(PurgeReceipt::new(self.0.clone(), vec![], n, 1, 1, Default::default()))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let member = |name: &str, per_request| {
//!     let p = Acks(ProviderId::new(name).unwrap());
//!     // A purger of one's own says nothing of its pacing: the fan-out assumes every kind,
//!     // 100 items a request; `with_pacing` tells it better.
//!     FanoutMember::new(Arc::new(p)).with_pacing(Pacing::unlimited(per_request))
//! };
//! let fanout = PurgeFanout::new(vec![member("fastly", 256), member("cloudflare", 100)]);
//! let report = fanout.purge(&PurgeRequest::tags(["price-42"])).await.unwrap();
//! assert_eq!(report.receipts.len(), 2);
//! println!("providers may disagree for up to {:?}", report.worst_acknowledged_in);
//! # }
//! ```
//!
//! With the real adapters, each brings its own pacing and checks ([`Purger::pacing`],
//! [`Purger::validate`]):
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use multicdn_core::{Policy, ProviderId};
//! # use multicdn_providers::cloudflare::CloudflarePurger;
//! # use multicdn_providers::fanout::{FanoutMember, PurgeFanout};
//! # use multicdn_providers::fastly::FastlyPurger;
//! # use multicdn_providers::http::HttpSettings;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::load("policy.yaml")?;
//! let id = |s: &str| ProviderId::new(s);
//! let fastly = FastlyPurger::from_spec_env(id("fastly")?, &policy.providers[&id("fastly")?], None, HttpSettings::default())?;
//! let cloudflare = CloudflarePurger::from_spec_env(id("cloudflare")?, &policy.providers[&id("cloudflare")?], None, HttpSettings::default())?;
//! let fanout = PurgeFanout::new([FanoutMember::new(Arc::new(fastly)), FanoutMember::new(Arc::new(cloudflare))]);
//! # let _ = fanout;
//! # Ok(())
//! # }
//! ```

mod missed;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use futures::future::join_all;
use multicdn_core::{
    Clock, Error, Event, ProviderId, PurgeReceipt, PurgeRequest, PurgeScope, Purger, Stopwatch,
    SystemClock,
};

pub use missed::Outstanding;
/// What a purger accepts and how it is paced: its own to say, through [`Purger::pacing`].
pub use multicdn_core::{Budget, KindPacing, Pacing, Unit};

use crate::http::{Pacer, batch};

/// Chunks one provider sends at once in [`PurgeFanout::purge`] by default.
const DEFAULT_IN_FLIGHT: usize = 4;
/// Chunks in flight at once in [`PurgeFanout::purge_queued`] by default.
const DEFAULT_QUEUE_IN_FLIGHT: usize = 8;

/// One provider in a fan-out: its purger and how it is batched and paced. The pacing is the
/// purger's own ([`Purger::pacing`]) unless [`FanoutMember::with_pacing`] overrides it; every
/// purge is checked with the purger's [`Purger::validate`] before anything is sent to anyone.
#[derive(Debug, Clone)]
pub struct FanoutMember {
    purger: Arc<dyn Purger>,
    pacing: Pacing,
}

impl FanoutMember {
    /// A member: any purger, the library's (`Arc::new(FastlyPurger::...)`) or a team's own,
    /// paced as it says.
    pub fn new(purger: Arc<dyn Purger>) -> FanoutMember {
        let pacing = purger.pacing();
        FanoutMember { purger, pacing }
    }

    /// Batches and paces this member as `pacing` says instead (a contract with higher limits
    /// than the purger knows of, or a test).
    pub fn with_pacing(mut self, pacing: Pacing) -> FanoutMember {
        self.pacing = pacing;
        self
    }

    /// The provider.
    pub fn provider(&self) -> &ProviderId {
        self.purger.provider()
    }

    /// The pacing.
    pub fn pacing(&self) -> &Pacing {
        &self.pacing
    }

    /// The purger.
    pub fn purger(&self) -> &Arc<dyn Purger> {
        &self.purger
    }
}

impl From<Arc<dyn Purger>> for FanoutMember {
    fn from(purger: Arc<dyn Purger>) -> FanoutMember {
        FanoutMember::new(purger)
    }
}

/// Where [`Event::PurgeMissed`] and [`Event::PurgeRecovered`] go: a callback, or a tokio
/// channel the steering engine reads.
#[derive(Clone)]
pub struct EventSink(Arc<dyn Fn(Event) + Send + Sync>);

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EventSink")
    }
}

impl EventSink {
    /// Calls `f` with each event.
    pub fn new(f: impl Fn(Event) + Send + Sync + 'static) -> EventSink {
        EventSink(Arc::new(f))
    }

    /// Sends each event on `tx` (a closed channel drops it: the event is still in the error).
    pub fn channel(tx: tokio::sync::mpsc::UnboundedSender<Event>) -> EventSink {
        EventSink::new(move |e| {
            if tx.send(e).is_err() {
                tracing::warn!("purge event channel closed; the event is only in the error");
            }
        })
    }

    fn emit(&self, event: Event) {
        (self.0)(event);
    }
}

/// What every provider acknowledged.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FanoutReport {
    /// One receipt per provider: purge ids, items, requests, attempts, and the time from the
    /// start of the fan-out to its last acknowledgement.
    pub receipts: Vec<PurgeReceipt>,
    /// The slowest acknowledgement: the window in which providers may disagree.
    pub worst_acknowledged_in: Duration,
    /// The provider that acknowledged last.
    pub slowest: Option<ProviderId>,
    /// Wall time of the whole call.
    pub elapsed: Duration,
    /// The least time the providers' documented limits allow for this purge (the slowest
    /// provider's), from full buckets.
    pub ideal: Duration,
    /// The providers this call brought back in step: they had missed purges, and now have
    /// nothing outstanding.
    pub recovered: Vec<ProviderId>,
    /// The events emitted (one [`Event::PurgeRecovered`] per recovered provider).
    pub events: Vec<Event>,
}

/// One provider that missed (part of) a purge.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ProviderFailure {
    /// The provider.
    pub provider: ProviderId,
    /// The purge kind (`tags`, `urls`, ...).
    pub scope: String,
    /// The items it did not acknowledge (empty for a purge of everything).
    pub missed: Vec<String>,
    /// The first error, after its retries.
    pub error: Error,
    /// What it did acknowledge, if anything.
    pub acknowledged: Option<PurgeReceipt>,
}

/// A fan-out that did not purge everywhere.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FanoutError {
    /// Nothing was sent: some provider cannot do this purge at all, or there are no providers.
    #[error("purge refused, nothing was sent: {reason}")]
    Refused {
        /// Why, and what would be valid.
        reason: String,
        /// Each provider's refusal.
        errors: Vec<Error>,
    },
    /// At least one provider missed the purge after its retries; it must be demoted until it
    /// has been purged.
    #[error("purge missed on {}{}", describe(.failures), held_back(.held))]
    Missed {
        /// Every provider that failed (the shield among them, when it did).
        failures: Vec<ProviderFailure>,
        /// The providers not sent what the shield missed (its failure's `missed`, or the whole
        /// purge of everything): every provider when the shield failed, none otherwise. They
        /// are sent it once the shield has been purged of it.
        held: Vec<ProviderId>,
        /// The providers that acknowledged everything.
        receipts: Vec<PurgeReceipt>,
        /// The events emitted: one [`Event::PurgeMissed`] per failed provider, and one
        /// [`Event::PurgeRecovered`] per provider this call brought back in step.
        events: Vec<Event>,
    },
}

/// [`PurgeFanout::restore`] was handed misses of providers it has no member for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot restore missed purges of {}: no member of this fan-out purges {}",
    names(.providers),
    if .providers.len() == 1 { "it" } else { "them" }
)]
pub struct UnknownProviders {
    /// The providers, in order.
    pub providers: Vec<ProviderId>,
}

fn names(providers: &[ProviderId]) -> String {
    providers
        .iter()
        .map(ProviderId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

impl FanoutError {
    /// The providers that missed the purge (none when it was refused).
    pub fn failed_providers(&self) -> Vec<&ProviderId> {
        match self {
            FanoutError::Missed { failures, .. } => failures.iter().map(|f| &f.provider).collect(),
            FanoutError::Refused { .. } => Vec::new(),
        }
    }
}

fn held_back(held: &[ProviderId]) -> String {
    if held.is_empty() {
        return String::new();
    }
    format!(
        "; held back from {} until the shield is purged of it (a CDN purged first would refill from the shield's stale copy)",
        names(held)
    )
}

fn describe(failures: &[ProviderFailure]) -> String {
    failures
        .iter()
        .map(|f| {
            let items = if f.missed.is_empty() {
                f.scope.clone()
            } else {
                let shown: Vec<&str> = f.missed.iter().take(5).map(String::as_str).collect();
                let more = f.missed.len().saturating_sub(shown.len());
                let more = if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                };
                format!(
                    "{} {} ({}{more})",
                    f.missed.len(),
                    f.scope,
                    shown.join(", ")
                )
            };
            format!("{}: {items} not purged: {}", f.provider, f.error)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Progress of a queued purge, after each chunk every provider has answered.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QueueProgress {
    /// Chunks answered by every provider.
    pub chunks_done: usize,
    /// Chunks in all.
    pub chunks_total: usize,
    /// Items in the chunks answered.
    pub items_done: usize,
    /// Items in all.
    pub items_total: usize,
    /// Since the start.
    pub elapsed: Duration,
    /// The least time the limits allow for the whole purge.
    pub ideal: Duration,
    /// Providers that have failed so far (no longer sent chunks).
    pub failed: Vec<ProviderId>,
}

/// Fans purges out to every provider, and remembers what each one missed until it has been
/// purged of it (clones share that record).
#[derive(Debug, Clone)]
pub struct PurgeFanout {
    members: Vec<FanoutMember>,
    shield: Option<FanoutMember>,
    sink: Option<EventSink>,
    clock: Arc<dyn Clock>,
    in_flight: usize,
    queue_in_flight: usize,
    outstanding: Arc<Mutex<BTreeMap<ProviderId, Outstanding>>>,
}

/// A chunk and its answer (`None`: not sent, the provider had already failed).
type ChunkResult = (Vec<String>, Option<Result<PurgeReceipt, Error>>);

/// What one provider did with its share of a purge.
struct MemberOutcome {
    provider: ProviderId,
    /// The kind of the purge it failed, or of its last one.
    scope: &'static str,
    ids: Vec<String>,
    items: usize,
    requests: u32,
    attempts: u32,
    last_ack: Option<Duration>,
    missed: Vec<String>,
    error: Option<Error>,
    /// Queued mode only: the items acknowledged so far.
    acked_items: HashSet<String>,
}

impl MemberOutcome {
    fn new(provider: ProviderId, scope: &'static str) -> MemberOutcome {
        MemberOutcome {
            provider,
            scope,
            ids: Vec::new(),
            items: 0,
            requests: 0,
            attempts: 0,
            last_ack: None,
            missed: Vec::new(),
            error: None,
            acked_items: HashSet::new(),
        }
    }

    fn acked(&mut self, r: PurgeReceipt, at: Duration) {
        self.ids.extend(r.purge_ids);
        self.items += r.items;
        self.requests += r.requests;
        self.attempts += r.attempts;
        self.last_ack = Some(self.last_ack.map_or(at, |l| l.max(at)));
    }

    /// Adds the outcome of the provider's next purge (after a failure there is none).
    fn absorb(&mut self, next: MemberOutcome) {
        self.scope = next.scope;
        self.ids.extend(next.ids);
        self.items += next.items;
        self.requests += next.requests;
        self.attempts += next.attempts;
        self.last_ack = self.last_ack.max(next.last_ack);
        self.missed.extend(next.missed);
        if self.error.is_none() {
            self.error = next.error;
        }
    }

    fn receipt(&self) -> PurgeReceipt {
        PurgeReceipt::new(
            self.provider.clone(),
            self.ids.clone(),
            self.items,
            self.requests,
            self.attempts,
            self.last_ack.unwrap_or_default(),
        )
    }
}

impl PurgeFanout {
    /// A fan-out over `members`: [`FanoutMember`]s, or any purgers as `Arc<dyn Purger>`.
    pub fn new<M: Into<FanoutMember>>(members: impl IntoIterator<Item = M>) -> PurgeFanout {
        PurgeFanout {
            members: members.into_iter().map(Into::into).collect(),
            shield: None,
            sink: None,
            clock: Arc::new(SystemClock),
            in_flight: DEFAULT_IN_FLIGHT,
            queue_in_flight: DEFAULT_QUEUE_IN_FLIGHT,
            outstanding: Arc::default(),
        }
    }

    /// Puts the origin shield in front of every provider: each purge is sent to the shield
    /// first, and to the providers only once the shield has acknowledged it, since a CDN
    /// purged before the shield refills from the shield's stale copy. What the shield misses
    /// is held back from every provider (the error's `held`), recorded as the shield's miss,
    /// and sent to the providers by the [`PurgeFanout::retry_missed`] or later purge that
    /// clears it from the shield. The providers are not demoted for it: every one of them
    /// would serve the shield's stale copy alike.
    pub fn with_shield(mut self, shield: impl Into<FanoutMember>) -> PurgeFanout {
        self.shield = Some(shield.into());
        self
    }

    /// The shield, if the fan-out has one.
    pub fn shield(&self) -> Option<&FanoutMember> {
        self.shield.as_ref()
    }

    /// The shield first, then the providers.
    fn everyone(&self) -> impl Iterator<Item = &FanoutMember> {
        self.shield.iter().chain(&self.members)
    }

    /// What of `request` the providers may be sent after the shield's `outcome` (all of it
    /// when there is no shield or it acknowledged everything; none of a purge of everything
    /// it missed).
    fn passed_by_shield(request: &PurgeRequest, outcome: &MemberOutcome) -> Option<PurgeRequest> {
        if outcome.error.is_none() {
            return Some(request.clone());
        }
        if matches!(request.scope, PurgeScope::Everything) {
            return None;
        }
        let missed: HashSet<&String> = outcome.missed.iter().collect();
        let acked: Vec<String> = batch::dedupe(request.scope.items())
            .into_iter()
            .filter(|i| !missed.contains(i))
            .collect();
        (!acked.is_empty()).then(|| PurgeRequest {
            scope: request.scope.with_items(acked),
            soft: request.soft,
        })
    }

    /// The providers held back by the shield's `outcome`: every one, when it missed anything.
    fn held_by(&self, outcome: Option<&MemberOutcome>) -> Vec<ProviderId> {
        match outcome {
            Some(o) if o.error.is_some() => {
                self.members.iter().map(|m| m.provider().clone()).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Delivers [`Event::PurgeMissed`] to `sink` as soon as a provider has failed, and
    /// [`Event::PurgeRecovered`] as soon as a provider that had missed purges has nothing
    /// outstanding.
    pub fn with_events(mut self, sink: EventSink) -> PurgeFanout {
        self.sink = Some(sink);
        self
    }

    /// Stamps events with `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> PurgeFanout {
        self.clock = clock;
        self
    }

    /// Sets the requests one provider has in flight in [`PurgeFanout::purge`] (default 4).
    pub fn with_in_flight(mut self, n: usize) -> PurgeFanout {
        self.in_flight = n.max(1);
        self
    }

    /// Sets the chunks in flight in [`PurgeFanout::purge_queued`] (default 8).
    pub fn with_queue_in_flight(mut self, n: usize) -> PurgeFanout {
        self.queue_in_flight = n.max(1);
        self
    }

    /// The members (the shield, if any, is [`PurgeFanout::shield`]).
    pub fn members(&self) -> &[FanoutMember] {
        &self.members
    }

    /// The least time each provider's documented limits allow for `request` (from full
    /// buckets), slowest first; the shield, if any, is listed too (its time comes before the
    /// providers', see [`PurgeFanout::ideal_time`]).
    pub fn ideal_times(&self, request: &PurgeRequest) -> Vec<(ProviderId, Duration)> {
        let mut times: Vec<(ProviderId, Duration)> = self
            .everyone()
            .filter_map(|m| Some((m.provider().clone(), Self::ideal_for(m, request)?)))
            .collect();
        times.sort_by_key(|t| std::cmp::Reverse(t.1));
        times
    }

    /// The least time `member`'s limits allow for `request`; `None` if it cannot do it.
    fn ideal_for(member: &FanoutMember, request: &PurgeRequest) -> Option<Duration> {
        let items = batch::dedupe(request.scope.items()).len();
        Some(member.pacing.for_scope(&request.scope)?.ideal_time(items))
    }

    /// What each provider missed and has not been purged of since; providers in step are not
    /// listed.
    pub fn outstanding(&self) -> BTreeMap<ProviderId, Outstanding> {
        self.record().clone()
    }

    /// Takes back what providers had outstanding, as [`PurgeFanout::outstanding`] returned it
    /// and a service kept across a restart (it serialises as the purges that would clear it):
    /// a miss must not be forgotten because the process that saw it stopped. It is added to
    /// what this fan-out already has; [`PurgeFanout::retry_missed`] re-sends it, and a purge
    /// that covers it clears it, as for a miss seen here. No event is emitted (the miss was
    /// reported when it happened); the returned list is every provider now behind, to demote
    /// at startup.
    ///
    /// A provider this fan-out has no member for is refused, and nothing is restored: its
    /// misses could never be retried.
    pub fn restore(
        &self,
        record: &BTreeMap<ProviderId, Outstanding>,
    ) -> Result<Vec<ProviderId>, UnknownProviders> {
        let unknown: Vec<ProviderId> = record
            .iter()
            .filter(|(p, o)| !o.is_empty() && !self.everyone().any(|m| m.purger.provider() == *p))
            .map(|(p, _)| p.clone())
            .collect();
        if !unknown.is_empty() {
            return Err(UnknownProviders { providers: unknown });
        }
        let mut mine = self.record();
        for (p, o) in record.iter().filter(|(_, o)| !o.is_empty()) {
            mine.entry(p.clone()).or_default().merge(o);
        }
        Ok(mine.keys().cloned().collect())
    }

    fn record(&self) -> std::sync::MutexGuard<'_, BTreeMap<ProviderId, Outstanding>> {
        // The record is updated whole under the lock; a panic elsewhere cannot leave it torn.
        self.outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Updates the provider's record with its outcome for `request`; the
    /// [`Event::PurgeRecovered`] emitted when this cleared its last miss.
    fn settle(&self, request: &PurgeRequest, out: &MemberOutcome) -> Option<Event> {
        let recovered = {
            let mut record = self.record();
            let was_behind = record.contains_key(&out.provider);
            let entry = record.entry(out.provider.clone()).or_default();
            if out.error.is_some() {
                if !matches!(request.scope, PurgeScope::Everything) {
                    let missed: HashSet<&String> = out.missed.iter().collect();
                    let acked: Vec<String> = batch::dedupe(request.scope.items())
                        .into_iter()
                        .filter(|i| !missed.contains(i))
                        .collect();
                    entry.acknowledged(request, &acked);
                }
                entry.missed(request, &out.missed);
            } else {
                entry.acknowledged(request, request.scope.items());
            }
            let in_step = entry.is_empty();
            if in_step {
                record.remove(&out.provider);
            }
            was_behind && in_step && out.error.is_none()
        };
        recovered.then(|| {
            let event = Event::PurgeRecovered {
                provider: out.provider.clone(),
                at: self.clock.now(),
            };
            tracing::info!(provider = %out.provider, "purged of everything it had missed; the purge demotion can be lifted");
            if let Some(sink) = &self.sink {
                sink.emit(event.clone());
            }
            event
        })
    }

    /// Re-sends what each provider missed ([`PurgeFanout::outstanding`]), by kind, to that
    /// provider only, batched, paced and retried as any purge; providers with nothing
    /// outstanding are sent nothing. A provider's purges go one after another and stop at its
    /// first failure (what was not sent stays outstanding).
    ///
    /// A provider left with nothing outstanding is reported in
    /// [`FanoutReport::recovered`] and its [`Event::PurgeRecovered`] emitted; one that misses
    /// again makes the call a [`FanoutError::Missed`], emits [`Event::PurgeMissed`] again and
    /// stays demoted. With nothing outstanding, nothing is sent and the report is empty.
    pub async fn retry_missed(&self) -> Result<FanoutReport, FanoutError> {
        let watch = Stopwatch::start();
        let record = self.outstanding();
        // The shield first: what it is purged of now may go to the providers too.
        let mut outcomes = Vec::new();
        let mut passed: Vec<PurgeRequest> = Vec::new();
        let mut shield_ideal = Duration::ZERO;
        if let Some(shield) = &self.shield
            && let Some(o) = record.get(shield.provider())
        {
            let requests = o.requests();
            shield_ideal = requests
                .iter()
                .filter_map(|r| Self::ideal_for(shield, r))
                .sum();
            let (total, events) = self
                .retry_member(shield, &requests, watch, |request, out| {
                    passed.extend(Self::passed_by_shield(request, out));
                })
                .await;
            outcomes.push((total, events));
        }
        let held = self.held_by(outcomes.first().map(|o| &o.0));
        let due: Vec<(&FanoutMember, Vec<PurgeRequest>)> = self
            .members
            .iter()
            .filter_map(|m| {
                let mut requests = record
                    .get(m.provider())
                    .map(Outstanding::requests)
                    .unwrap_or_default();
                requests.extend(passed.iter().cloned());
                (!requests.is_empty()).then_some((m, requests))
            })
            .collect();
        let ideal = shield_ideal
            + due
                .iter()
                .map(|(m, requests)| {
                    requests
                        .iter()
                        .filter_map(|r| Self::ideal_for(m, r))
                        .sum::<Duration>()
                })
                .max()
                .unwrap_or_default();
        outcomes.extend(
            join_all(
                due.iter().map(|(member, requests)| {
                    self.retry_member(member, requests, watch, |_, _| {})
                }),
            )
            .await,
        );
        self.finish(outcomes, held, watch, ideal)
    }

    /// Sends `requests` to `member` one after another, stopping at its first failure;
    /// `each` sees every request sent and its outcome.
    async fn retry_member(
        &self,
        member: &FanoutMember,
        requests: &[PurgeRequest],
        watch: Stopwatch,
        mut each: impl FnMut(&PurgeRequest, &MemberOutcome),
    ) -> (MemberOutcome, Vec<Event>) {
        let mut total = MemberOutcome::new(member.provider().clone(), "everything");
        let mut events = Vec::new();
        for request in requests {
            let (out, emitted) = self.run_member(member, request, watch).await;
            each(request, &out);
            events.extend(emitted);
            let failed = out.error.is_some();
            total.absorb(out);
            if failed {
                break;
            }
        }
        (total, events)
    }

    fn refuse_unsupported(&self, request: &PurgeRequest) -> Result<(), FanoutError> {
        if self.members.is_empty() {
            return Err(FanoutError::Refused {
                reason: "the fan-out has no providers".to_owned(),
                errors: Vec::new(),
            });
        }
        let errors: Vec<Error> = self
            .everyone()
            .filter_map(|m| {
                if let Err(feature) = m.pacing.check(request) {
                    return Some(Error::Unsupported {
                        provider: m.provider().clone(),
                        feature,
                    });
                }
                m.purger.validate(request).err()
            })
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = errors.iter().map(ToString::to_string).collect();
        Err(FanoutError::Refused {
            reason: format!(
                "{}; purge by tags or URLs (without soft) works on every provider, with well-formed items",
                names.join("; ")
            ),
            errors,
        })
    }

    fn emit_missed(
        &self,
        provider: &ProviderId,
        scope: &str,
        items: Vec<String>,
        error: &Error,
    ) -> Event {
        let event = Event::PurgeMissed {
            provider: provider.clone(),
            items,
            scope: scope.to_owned(),
            error: error.to_string(),
            at: self.clock.now(),
        };
        tracing::error!(provider = %provider, scope, error = %error, "purge missed; the provider must be demoted");
        if let Some(sink) = &self.sink {
            sink.emit(event.clone());
        }
        event
    }

    /// The chunks a member sends for `request`.
    fn chunks(member: &FanoutMember, request: &PurgeRequest) -> Vec<Vec<String>> {
        if matches!(request.scope, PurgeScope::Everything) {
            return vec![Vec::new()];
        }
        let per_request = member
            .pacing
            .for_scope(&request.scope)
            .map_or(1, |k| k.per_request);
        batch::chunks(request.scope.items(), per_request)
    }

    /// One member's share of [`PurgeFanout::purge`]: its chunks, a few at a time; after a
    /// failure the chunks not yet sent are not sent (the provider is being demoted) and
    /// count as missed.
    async fn run_member(
        &self,
        member: &FanoutMember,
        request: &PurgeRequest,
        watch: Stopwatch,
    ) -> (MemberOutcome, Vec<Event>) {
        let failed = AtomicBool::new(false);
        let mut out = MemberOutcome::new(member.provider().clone(), request.scope.kind());
        let results: Vec<ChunkResult> = futures::stream::iter(Self::chunks(member, request))
            .map(|chunk| {
                let failed = &failed;
                async move {
                    if failed.load(Ordering::SeqCst) {
                        return (chunk, None);
                    }
                    let part = PurgeRequest {
                        scope: request.scope.with_items(chunk.clone()),
                        soft: request.soft,
                    };
                    let r = member.purger.purge(&part).await;
                    if r.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    }
                    (chunk, Some(r))
                }
            })
            .buffer_unordered(self.in_flight)
            .collect()
            .await;
        for (chunk, result) in results {
            match result {
                Some(Ok(r)) => out.acked(r, watch.elapsed()),
                Some(Err(e)) => {
                    out.missed.extend(chunk);
                    out.error.get_or_insert(e);
                }
                None => out.missed.extend(chunk),
            }
        }
        let missed = out
            .error
            .as_ref()
            .map(|e| self.emit_missed(&out.provider, request.scope.kind(), out.missed.clone(), e));
        let recovered = self.settle(request, &out);
        (out, missed.into_iter().chain(recovered).collect())
    }

    /// Purges `request` on every provider in parallel, each batched and paced by its own
    /// limits; returns once every provider has acknowledged or failed.
    pub async fn purge(&self, request: &PurgeRequest) -> Result<FanoutReport, FanoutError> {
        self.refuse_unsupported(request)?;
        let watch = Stopwatch::start();
        let (mut outcomes, passed) = self.shield_first(request, watch).await;
        let held = self.held_by(outcomes.first().map(|o| &o.0));
        if let Some(passed) = &passed {
            outcomes.extend(
                join_all(
                    self.members
                        .iter()
                        .map(|m| self.run_member(m, passed, watch)),
                )
                .await,
            );
        }
        self.finish(outcomes, held, watch, self.ideal(request))
    }

    /// Purges the shield of `request`, if there is one: its outcome, and what the providers
    /// may be sent now.
    async fn shield_first(
        &self,
        request: &PurgeRequest,
        watch: Stopwatch,
    ) -> (Vec<(MemberOutcome, Vec<Event>)>, Option<PurgeRequest>) {
        let Some(shield) = &self.shield else {
            return (Vec::new(), Some(request.clone()));
        };
        let (out, events) = self.run_member(shield, request, watch).await;
        let passed = Self::passed_by_shield(request, &out);
        if out.error.is_some() {
            tracing::error!(
                held = out.missed.len(),
                "the shield missed a purge; the CDNs are not sent what it missed until it is purged of it"
            );
        }
        (vec![(out, events)], passed)
    }

    /// The least time the documented limits allow for `request` through the whole fan-out:
    /// the shield's (it goes first), then the slowest provider's.
    pub fn ideal_time(&self, request: &PurgeRequest) -> Duration {
        self.ideal(request)
    }

    fn ideal(&self, request: &PurgeRequest) -> Duration {
        let shield = self
            .shield
            .as_ref()
            .and_then(|s| Self::ideal_for(s, request))
            .unwrap_or_default();
        let edges = self
            .members
            .iter()
            .filter_map(|m| Self::ideal_for(m, request))
            .max()
            .unwrap_or_default();
        shield + edges
    }

    fn finish(
        &self,
        outcomes: Vec<(MemberOutcome, Vec<Event>)>,
        held: Vec<ProviderId>,
        watch: Stopwatch,
        ideal: Duration,
    ) -> Result<FanoutReport, FanoutError> {
        let mut receipts = Vec::new();
        let mut failures = Vec::new();
        let mut events = Vec::new();
        for (out, event) in outcomes {
            events.extend(event);
            match out.error.clone() {
                None => receipts.push(out.receipt()),
                Some(error) => failures.push(ProviderFailure {
                    provider: out.provider.clone(),
                    scope: out.scope.to_owned(),
                    acknowledged: (out.requests > 0).then(|| out.receipt()),
                    missed: out.missed,
                    error,
                }),
            }
        }
        if !failures.is_empty() {
            return Err(FanoutError::Missed {
                failures,
                held,
                receipts,
                events,
            });
        }
        let slowest = receipts
            .iter()
            .max_by_key(|r| r.acknowledged_in)
            .map(|r| (r.provider.clone(), r.acknowledged_in));
        Ok(FanoutReport {
            worst_acknowledged_in: slowest.as_ref().map(|s| s.1).unwrap_or_default(),
            slowest: slowest.map(|s| s.0),
            receipts,
            elapsed: watch.elapsed(),
            ideal,
            recovered: events
                .iter()
                .filter(|e| matches!(e, Event::PurgeRecovered { .. }))
                .map(|e| e.provider().clone())
                .collect(),
            events,
        })
    }

    /// Purges a large set of items (a catalogue import's tags) through a queue paced at the
    /// slowest provider's ceiling: each chunk (the smallest batch any provider takes) is
    /// released only when every provider's budgets can accept it, then sent to every provider
    /// at once, so no provider runs ahead of another and none is sent a request it would
    /// answer with 429. `progress` is called after each chunk every provider has answered.
    ///
    /// A provider that fails is sent no further chunks and no longer sets the pace; its
    /// [`Event::PurgeMissed`] is emitted at once, naming every item it had not acknowledged by
    /// then (chunks in flight included), and the error at the end names exactly the items it
    /// missed. The other providers carry on.
    pub async fn purge_queued(
        &self,
        request: &PurgeRequest,
        mut progress: impl FnMut(&QueueProgress),
    ) -> Result<FanoutReport, FanoutError> {
        self.refuse_unsupported(request)?;
        if matches!(request.scope, PurgeScope::Everything) {
            return self.purge(request).await;
        }
        let watch = Stopwatch::start();
        let ideal = self.ideal(request);
        let (mut outcomes, passed) = self.shield_first(request, watch).await;
        let held = self.held_by(outcomes.first().map(|o| &o.0));
        if let Some(passed) = &passed {
            outcomes.extend(
                self.queue_to_members(passed, &mut progress, watch, ideal)
                    .await,
            );
        }
        self.finish(outcomes, held, watch, ideal)
    }

    /// The queue of [`PurgeFanout::purge_queued`] over the providers (after the shield).
    async fn queue_to_members(
        &self,
        request: &PurgeRequest,
        progress: &mut impl FnMut(&QueueProgress),
        watch: Stopwatch,
        ideal: Duration,
    ) -> Vec<(MemberOutcome, Vec<Event>)> {
        let items = batch::dedupe(request.scope.items());
        let chunk_size = self
            .members
            .iter()
            .filter_map(|m| m.pacing.for_scope(&request.scope))
            .map(|k| k.per_request)
            .min()
            .unwrap_or(1);
        let chunks = batch::chunks(&items, chunk_size);
        // The queue's own buckets: every budget of every provider, in chunk units, each tagged
        // with its provider so a provider that has failed (and is sent nothing more) stops
        // setting the pace.
        let pacers: Vec<(usize, Pacer, Budget)> = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| Some((i, m.pacing.for_scope(&request.scope)?)))
            .flat_map(|(i, k)| {
                k.budgets
                    .iter()
                    .map(move |b| (i, Pacer::new(b.name, b.limit), *b))
            })
            .collect();
        let failed: Vec<AtomicBool> = self
            .members
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect();
        let mut outcomes: Vec<MemberOutcome> = self
            .members
            .iter()
            .map(|m| MemberOutcome::new(m.provider().clone(), request.scope.kind()))
            .collect();
        let mut events: Vec<Option<Event>> = self.members.iter().map(|_| None).collect();
        let mut state = QueueProgress {
            chunks_done: 0,
            chunks_total: chunks.len(),
            items_done: 0,
            items_total: items.len(),
            elapsed: Duration::ZERO,
            ideal,
            failed: Vec::new(),
        };
        let failed_ref = &failed;
        let pacers_ref = &pacers;
        let answered = futures::stream::iter(chunks)
            .then(|chunk| async move {
                for (member, pacer, budget) in pacers_ref {
                    if !failed_ref
                        .get(*member)
                        .is_some_and(|f| f.load(Ordering::SeqCst))
                    {
                        pacer.acquire(budget.cost(chunk.len())).await;
                    }
                }
                chunk
            })
            .map(|chunk| async move {
                let part = PurgeRequest {
                    scope: request.scope.with_items(chunk.clone()),
                    soft: request.soft,
                };
                let results = join_all(self.members.iter().enumerate().map(|(i, m)| {
                    let part = &part;
                    async move {
                        if failed_ref.get(i).is_some_and(|f| f.load(Ordering::SeqCst)) {
                            None
                        } else {
                            Some(m.purger.purge(part).await)
                        }
                    }
                }))
                .await;
                (chunk, results)
            })
            .buffer_unordered(self.queue_in_flight);
        let mut answered = std::pin::pin!(answered);
        while let Some((chunk, results)) = answered.next().await {
            let at = watch.elapsed();
            for (i, result) in results.into_iter().enumerate() {
                let (Some(out), Some(flag)) = (outcomes.get_mut(i), failed.get(i)) else {
                    continue;
                };
                match result {
                    Some(Ok(r)) => {
                        out.acked_items.extend(chunk.iter().cloned());
                        out.acked(r, at);
                    }
                    Some(Err(e)) => {
                        out.missed.extend(chunk.iter().cloned());
                        if out.error.is_none() {
                            flag.store(true, Ordering::SeqCst);
                            state.failed.push(out.provider.clone());
                            // Every item this provider has not acknowledged may be stale.
                            let unacked: Vec<String> = items
                                .iter()
                                .filter(|item| !out.acked_items.contains(*item))
                                .cloned()
                                .collect();
                            if let Some(slot) = events.get_mut(i) {
                                *slot = Some(self.emit_missed(
                                    &out.provider,
                                    request.scope.kind(),
                                    unacked,
                                    &e,
                                ));
                            }
                            out.error = Some(e);
                        }
                    }
                    None => out.missed.extend(chunk.iter().cloned()),
                }
            }
            state.chunks_done += 1;
            state.items_done += chunk.len();
            state.elapsed = watch.elapsed();
            progress(&state);
        }
        outcomes
            .into_iter()
            .zip(events)
            .map(|(out, missed)| {
                let recovered = self.settle(request, &out);
                let events = missed.into_iter().chain(recovered).collect();
                (out, events)
            })
            .collect()
    }
}
