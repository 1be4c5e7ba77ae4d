//! The Controller: the whole loop as one embeddable service.
//!
//! Each round, at `now`:
//!
//! 1. **Health in.** Run one round of the monitor's probes (when it has one), take every event
//!    reported since the last round (quorum verdicts, recoveries, missed and recovered purges
//!    from the fan-out, the embedder's own) and fold them, with drains and holds, into the
//!    [`HealthLedger`].
//! 2. **Beacons in.** Beacons arrive at any time ([`Controller::ingest_bytes`],
//!    [`Controller::record`], [`Controller::consume`] for a stream) into a
//!    [`SharedScoreboard`]: a beacon locks only its network's shard. The round expires old
//!    buckets and copies the scoreboard a shard at a time, so a receiver waits at most for one
//!    shard's copy, and only when it writes to that shard at that moment.
//! 3. **Decide.** Snapshots of every window -> cohort inputs ->
//!    [`decide`](multicdn_steering::engine::decide), with the ledger's health and the
//!    scoreboard's own newest sample as the deadman's `data_as_of`. The copy, the snapshots
//!    and the decision run inside a tokio runtime on its blocking threads (`spawn_blocking`),
//!    not on a thread serving connections; so does freeing a finished round's snapshot
//!    ([`Controller::run`]).
//! 4. **Apply** the same plan on every actuator, each attempt's error classified, retryable
//!    errors retried with backoff; an actuator that still fails keeps its old plan, the round
//!    is recorded as partial, and the next round applies the plan to it again. In dry-run mode
//!    nothing is applied.
//! 5. **Record.** The round's [`RoundRecord`] (what was decided, what was applied where) goes to
//!    the journal, and the engine's memory, the plan, the ledger and the purges still owed go
//!    to the [`StateStore`], so a restart continues where the last round stopped.
//!
//! The plan in force is published on a watch channel ([`Controller::plans`]) for readers such
//! as the content-steering server.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use multicdn_core::{
    ApplyOptions, Clock, Event, Policy, ProviderHealth, ProviderId, Scorer, Steerer, SteeringPlan,
    SystemClock, Timestamp,
};
use multicdn_health::Monitor;
use multicdn_providers::fanout::{
    EventSink, FanoutError, FanoutReport, Outstanding, PurgeFanout, UnknownProviders,
};
use multicdn_steering::beacon::{Beacon, Received};
use multicdn_steering::engine::cohorts::cohort_inputs_over;
use multicdn_steering::engine::{self, EngineState, Inputs};
use multicdn_steering::error::SteeringError;
use multicdn_steering::ingest::{IngestReport, Ingestor};
use multicdn_steering::journal::{Journal, JournalEntry};
use multicdn_steering::resolve::{NetworkResolver, NoResolver};
use multicdn_steering::scoreboard::{Metric, Recorded, Scoreboard, ScoreboardConfig, Snapshot};
use multicdn_steering::scorer::P75Ttfb;
use multicdn_steering::shared::SharedScoreboard;
use multicdn_steering::video::{ContentSteeringSteerer, SharedPlan};
use tokio::sync::{mpsc, watch};
use tokio::time::MissedTickBehavior;
use tracing::Instrument;

use crate::ledger::{HealthLedger, OutReason};
use crate::operator::{Command, Operator, OperatorError, OperatorRecord, Overrides};
use crate::record::{ApplyOutcome, ApplyRecord, ErrorRecord, Intent, RoundRecord, Takeover};
use crate::store::{ControllerState, MemoryStore, Saved, StateStore, StoreError};

/// Calls `tick` now and then every `interval` until `shutdown` completes; a tick in flight
/// finishes first.
pub(crate) async fn every<F, Fut>(
    interval: Duration,
    shutdown: impl Future<Output = ()>,
    mut tick: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            _ = ticker.tick() => {}
        }
        tick().await;
    }
}

/// Leadership as a round sees it, for controllers of which only one may apply (see
/// `multicdn::leader` for the one on NATS JetStream). [`Controller::round_with`] asks
/// [`RoundGate::begin`] once the round has decided and before it applies anything, and hands
/// [`RoundGate::commit`] the state once the round is journaled.
#[async_trait::async_trait]
pub trait RoundGate: Send + Sync {
    /// Records `intent` where a successor reads it and returns the term this controller leads
    /// in; `Err(why)` when it does not lead (any more): the round applies nothing, is not
    /// journaled, and leaves the controller's state as it was.
    async fn begin(&self, intent: &Intent) -> Result<u64, String>;
    /// Saves the state after the round where a successor reads it (the journal's new record is
    /// `state.last`). An error is the round's store error.
    async fn commit(&self, state: &ControllerState) -> Result<(), String>;
}

/// A round that was not applied because its controller does not lead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("round {round} not applied: {why}")]
#[non_exhaustive]
pub struct Deposed {
    /// The round that would have been.
    pub round: u64,
    /// What the gate said.
    pub why: String,
}

/// Beacons as they arrive: NDJSON bytes as the receiver logged them, or beacons already parsed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum BeaconInput {
    /// NDJSON lines (see [`multicdn_steering::ingest`]).
    Bytes(Vec<u8>),
    /// One parsed beacon.
    Parsed(Received),
}

impl From<Vec<u8>> for BeaconInput {
    fn from(b: Vec<u8>) -> BeaconInput {
        BeaconInput::Bytes(b)
    }
}

impl From<Received> for BeaconInput {
    fn from(r: Received) -> BeaconInput {
        BeaconInput::Parsed(r)
    }
}

/// How a failing actuator is retried within a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts in all (at least 1).
    pub attempts: u32,
    /// Wait before the second attempt; doubled after each (a vendor's `Retry-After` wins).
    pub backoff: Duration,
    /// The longest wait.
    pub max_backoff: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            attempts: 3,
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// The controller could not be built or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// The scoreboard could not be built from the policy.
    #[error("scoreboard: {0}")]
    Scoreboard(#[from] SteeringError),
    /// The store could not be read.
    #[error("state store: {0}")]
    Store(#[from] StoreError),
    /// The saved missed purges name providers the fan-out does not purge.
    #[error("restoring missed purges: {0}")]
    Restore(#[from] UnknownProviders),
    /// Two actuators share a name.
    #[error("two actuators are named {0}")]
    DuplicateActuator(String),
    /// An operator switch was refused.
    #[error("operator switch refused: {0}")]
    Operator(#[from] OperatorError),
}

struct Actuator {
    name: String,
    steerer: Arc<dyn Steerer>,
}

/// What the loop carries between rounds.
struct Loop {
    round: u64,
    plan: SteeringPlan,
    engine: EngineState,
    ledger: HealthLedger,
    rounds: Vec<RoundRecord>,
    /// The plan each actuator is known to hold (`None`: unknown, apply).
    applied: Vec<Option<SteeringPlan>>,
    overrides: Overrides,
    operator: Vec<OperatorRecord>,
    /// What a takeover found, for the next round's record.
    takeover: Option<Takeover>,
}

/// A round decided and not yet applied, the loop's state locked meanwhile.
struct Decided<'a> {
    decision: engine::Decision,
    events: Vec<Event>,
    snapshot: Snapshot,
    plan_changed: bool,
    dry_run: bool,
    guard: tokio::sync::MutexGuard<'a, Loop>,
}

/// Operator records kept (switches are rare; this is years of them).
const OPERATOR_KEPT: usize = 10_000;

struct Inner {
    policy: Arc<Policy>,
    clock: Arc<dyn Clock>,
    actuators: Vec<Actuator>,
    monitor: Option<Monitor>,
    fanout: Option<PurgeFanout>,
    video: Vec<SharedPlan>,
    store: Arc<dyn StateStore>,
    scorer: Box<dyn Scorer>,
    board: SharedScoreboard,
    /// When the scoreboard is fed whole from elsewhere (merged shards): how recent its
    /// evidence is, capping the newest sample as the deadman's `data_as_of`.
    fed_as_of: Mutex<Option<Option<Timestamp>>>,
    ingestor: Mutex<Ingestor<Arc<dyn NetworkResolver>>>,
    resolver: Arc<dyn NetworkResolver>,
    probe_order: Vec<String>,
    events_tx: mpsc::UnboundedSender<Event>,
    events_rx: Mutex<mpsc::UnboundedReceiver<Event>>,
    state: tokio::sync::Mutex<Loop>,
    plan_tx: watch::Sender<Arc<SteeringPlan>>,
    dry_run: AtomicBool,
    retry: Retry,
    interval: Duration,
    apply: ApplyOptions,
}

/// Runs `job` on the runtime's blocking threads (inline when there is no tokio runtime), so
/// the connections a runtime thread serves do not wait for it; a panic in it is resumed here.
pub(crate) async fn off_runtime<T, F>(job: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => match runtime.spawn_blocking(job).await {
            Ok(done) => done,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Only a runtime shutting down cancels a blocking task, and it drops the
                // future awaiting it with it.
                Err(_) => std::future::pending().await,
            },
        },
        Err(_) => job(),
    }
}

/// Drops `value` on the runtime's blocking threads (inline when there is no tokio runtime):
/// a round's report holds the snapshot of the whole scoreboard, hundreds of thousands of
/// allocations to free, which would otherwise hold a thread serving connections for tens of
/// milliseconds.
pub(crate) fn drop_off_runtime<T: Send + 'static>(value: T) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn_blocking(move || drop(value));
        }
        Err(_) => drop(value),
    }
}

/// Runs the loop: health and beacons in, decide, apply on every actuator, journal, store.
/// Cheap to clone: clones share one loop.
#[derive(Clone)]
pub struct Controller {
    inner: Arc<Inner>,
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field(
                "actuators",
                &self
                    .inner
                    .actuators
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("monitor", &self.inner.monitor.is_some())
            .field("fanout", &self.inner.fanout.is_some())
            .field("store", &self.inner.store)
            .field("dry_run", &self.is_dry_run())
            .finish()
    }
}

/// What the policy does not say: actuators, monitor, purge fan-out, resolver, clock, store.
pub struct ControllerBuilder {
    policy: Policy,
    actuators: Vec<Actuator>,
    monitor: Option<Monitor>,
    fanout: Option<PurgeFanout>,
    video: Vec<SharedPlan>,
    clock: Arc<dyn Clock>,
    store: Arc<dyn StateStore>,
    resolver: Arc<dyn NetworkResolver>,
    scorer: Option<Box<dyn Scorer>>,
    dry_run: bool,
    retry: Retry,
    interval: Option<Duration>,
    apply: ApplyOptions,
}

impl fmt::Debug for ControllerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerBuilder")
            .field("actuators", &self.actuators.len())
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl ControllerBuilder {
    /// Adds an actuator: every round's plan is applied on it. `name` identifies it in the
    /// journal (`route53`, `ns1`, `memory`, `content-steering`).
    pub fn actuator(mut self, name: impl Into<String>, steerer: impl Steerer + 'static) -> Self {
        self.actuators.push(Actuator {
            name: name.into(),
            steerer: Arc::new(steerer),
        });
        self
    }

    /// Adds a shared actuator.
    pub fn shared_actuator(mut self, name: impl Into<String>, steerer: Arc<dyn Steerer>) -> Self {
        self.actuators.push(Actuator {
            name: name.into(),
            steerer,
        });
        self
    }

    /// Adds the content-steering actuator (named `content-steering`): every round's plan is put
    /// in force for the players, and the providers the ledger has out (down, drained, held,
    /// owing purges) are no longer offered to them, from the round they go out to the round
    /// they come back. The [`ContentSteering`](multicdn_steering::video::ContentSteering)
    /// handler serving the steerer's [`SharedPlan`] follows both while it runs.
    pub fn content_steering(mut self, steerer: ContentSteeringSteerer) -> Self {
        self.video.push(steerer.shared_plan());
        self.actuator("content-steering", steerer)
    }

    /// The health monitor: each round runs one round of its probes and takes its verdicts.
    pub fn monitor(mut self, monitor: Monitor) -> Self {
        self.monitor = Some(monitor);
        self
    }

    /// The purge fan-out: its missed and recovered purges reach the ledger, and what each
    /// provider still owes is saved and restored with the rest of the state. Its own event
    /// sink is replaced by the controller's.
    pub fn purge_fanout(mut self, fanout: PurgeFanout) -> Self {
        self.fanout = Some(fanout);
        self
    }

    /// The clock (default: the system clock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// A shared clock.
    pub fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Where the state lives (default: in memory only).
    pub fn store(mut self, store: impl StateStore + 'static) -> Self {
        self.store = Arc::new(store);
        self
    }

    /// Resolves beacons' client addresses to networks (default: none; beacons must carry
    /// `asn`/`country`).
    pub fn resolver(mut self, resolver: impl NetworkResolver + 'static) -> Self {
        self.resolver = Arc::new(resolver);
        self
    }

    /// How cells are scored (default: p75 TTFB with the policy's minimum samples).
    pub fn scorer(mut self, scorer: impl Scorer + 'static) -> Self {
        self.scorer = Some(Box::new(scorer));
        self
    }

    /// Decide and journal, apply nothing.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// How a failing actuator is retried within a round.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The time between rounds in [`Controller::run`] (default: the policy's health interval).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Options every apply is made with (default: forced, since the engine's guardrails have
    /// already bounded the change).
    pub fn apply_options(mut self, options: ApplyOptions) -> Self {
        self.apply = options;
        self
    }

    /// Builds the controller, restoring the store's state when it holds one.
    pub fn build(self) -> Result<Controller, ControllerError> {
        let mut names: Vec<&str> = self.actuators.iter().map(|a| a.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w.first() == w.get(1)) {
            return Err(ControllerError::DuplicateActuator(
                w.first().copied().unwrap_or_default().to_owned(),
            ));
        }
        let policy = Arc::new(self.policy);
        let providers = policy.provider_ids();
        let board = Scoreboard::new(
            ScoreboardConfig::from_policy(&policy.steering.rum),
            &providers,
        )?;
        let now = self.clock.now();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let fanout = self
            .fanout
            .map(|f| f.with_events(EventSink::channel(events_tx.clone())));
        let saved = self.store.load()?;
        let mut state = match saved {
            Some(saved) => Loop {
                round: saved.state.round,
                plan: saved.state.plan,
                engine: saved.state.engine,
                ledger: saved.state.ledger,
                rounds: saved.journal,
                applied: vec![None; self.actuators.len()],
                overrides: saved.state.overrides,
                operator: saved.state.operator,
                takeover: None,
            },
            None => Loop {
                round: 0,
                plan: policy.static_plan(),
                engine: EngineState::new(),
                ledger: HealthLedger::new(providers.iter().cloned(), now),
                rounds: Vec::new(),
                applied: vec![None; self.actuators.len()],
                overrides: Overrides::default(),
                operator: Vec::new(),
                takeover: None,
            },
        };
        for p in &providers {
            state.ledger.ensure(p, now);
        }
        if let (Some(f), Some(saved)) = (&fanout, self.store.load()?) {
            f.restore(&saved.state.outstanding)?;
            for (p, o) in &saved.state.outstanding {
                if !o.is_empty() {
                    state.ledger.purge_outstanding(p, o.item_count(), now);
                }
            }
        }
        let scorer = self
            .scorer
            .unwrap_or_else(|| Box::new(P75Ttfb::new(policy.steering.rum.min_samples)));
        let probe_order: Vec<String> = providers.iter().map(|p| p.as_str().to_owned()).collect();
        let (plan_tx, _) = watch::channel(Arc::new(state.plan.clone()));
        let interval = self.interval.unwrap_or(policy.health.interval.get());
        Ok(Controller {
            inner: Arc::new(Inner {
                actuators: self.actuators,
                monitor: self.monitor,
                fanout,
                video: self.video,
                store: self.store,
                scorer,
                board: SharedScoreboard::new(board),
                fed_as_of: Mutex::new(None),
                resolver: Arc::clone(&self.resolver),
                probe_order: probe_order.clone(),
                ingestor: Mutex::new(
                    Ingestor::new(self.resolver)
                        .probe_order(probe_order)
                        .clock(Arc::clone(&self.clock)),
                ),
                events_tx,
                events_rx: Mutex::new(events_rx),
                state: tokio::sync::Mutex::new(state),
                plan_tx,
                dry_run: AtomicBool::new(self.dry_run),
                retry: self.retry,
                interval,
                apply: self.apply,
                clock: self.clock,
                policy,
            }),
        })
    }
}

/// What one round did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RoundReport {
    /// The round's record, as journaled.
    pub record: RoundRecord,
    /// The plan decided.
    pub plan: Arc<SteeringPlan>,
    /// The events folded into the ledger this round, in order.
    pub events: Vec<Event>,
    /// The state could not be saved (the round still happened; the next save catches up).
    pub store_error: Option<String>,
    /// The scoreboard as the round read it (for metrics and dashboards: no second read).
    pub snapshot: Arc<Snapshot>,
}

impl RoundReport {
    /// The plan reached some actuators and not others.
    pub fn partial(&self) -> bool {
        self.record.partial()
    }
}

impl Controller {
    /// A builder for a controller running `policy`.
    pub fn builder(policy: Policy) -> ControllerBuilder {
        ControllerBuilder {
            policy,
            actuators: Vec::new(),
            monitor: None,
            fanout: None,
            video: Vec::new(),
            clock: Arc::new(SystemClock),
            store: Arc::new(MemoryStore::new()),
            resolver: Arc::new(NoResolver),
            scorer: None,
            dry_run: false,
            retry: Retry::default(),
            interval: None,
            apply: ApplyOptions::default().force(true),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The monitor, if it has one.
    pub fn monitor(&self) -> Option<&Monitor> {
        self.inner.monitor.as_ref()
    }

    /// The purge fan-out, if it has one (purges sent through it reach the ledger).
    pub fn fanout(&self) -> Option<&PurgeFanout> {
        self.inner.fanout.as_ref()
    }

    /// Sends one purge to every provider; a provider that misses it is held out from the next
    /// round until it has been purged.
    pub async fn purge(
        &self,
        request: &multicdn_core::PurgeRequest,
    ) -> Option<Result<FanoutReport, FanoutError>> {
        Some(self.inner.fanout.as_ref()?.purge(request).await)
    }

    /// Sends each provider exactly what it missed.
    pub async fn retry_missed(&self) -> Option<Result<FanoutReport, FanoutError>> {
        Some(self.inner.fanout.as_ref()?.retry_missed().await)
    }

    /// Reports an event from elsewhere (another monitor, a vendor status feed): folded into
    /// the ledger at the next round.
    pub fn report(&self, event: Event) {
        // The receiver lives as long as the controller.
        let _ = self.inner.events_tx.send(event);
    }

    /// Drains (or undrains) a provider: it carries no traffic from the next round, healthy or
    /// not. Reaches the monitor's record too.
    pub async fn set_drained(&self, provider: &ProviderId, drained: bool) {
        if let Some(m) = &self.inner.monitor {
            let _ = m.set_drained(provider, drained);
        }
        let now = self.inner.clock.now();
        self.inner
            .state
            .lock()
            .await
            .ledger
            .set_drained(provider, drained, now);
    }

    /// Holds a provider out by hand, with a note, until [`Controller::release`].
    pub async fn hold(&self, provider: &ProviderId, note: impl Into<String>) {
        let now = self.inner.clock.now();
        self.inner
            .state
            .lock()
            .await
            .ledger
            .hold(provider, note, now);
    }

    /// Releases a manual hold.
    pub async fn release(&self, provider: &ProviderId) {
        let now = self.inner.clock.now();
        self.inner.state.lock().await.ledger.release(provider, now);
    }

    /// Turns dry-run mode on or off: decide and journal, apply nothing.
    pub fn set_dry_run(&self, dry_run: bool) {
        self.inner.dry_run.store(dry_run, Ordering::SeqCst);
    }

    /// Whether dry-run mode is on.
    pub fn is_dry_run(&self) -> bool {
        self.inner.dry_run.load(Ordering::SeqCst)
    }

    /// Reads NDJSON beacon lines into the scoreboard.
    pub fn ingest_bytes(&self, bytes: &[u8]) {
        // The lines go into a board of their own, then into the shared one's shards: the
        // receivers keep writing meanwhile.
        let mut batch = match Scoreboard::new(
            self.inner.board.config().clone(),
            &self.inner.board.providers(),
        ) {
            Ok(b) => b,
            // The shared board's own configuration and providers: already accepted once.
            Err(e) => {
                tracing::error!(error = %e, "a batch board for beacon lines");
                return;
            }
        };
        self.inner
            .ingestor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ingest_bytes(bytes, &mut batch);
        if let Err(e) = self.inner.board.absorb(batch) {
            tracing::error!(error = %e, "beacon lines into the scoreboard");
        }
    }

    /// Records one parsed beacon; what became of it (for a probe beacon, the first of its
    /// times not stored, else [`Recorded::Stored`]).
    pub fn record(&self, received: &Received) -> Recorded {
        let board = &self.inner.board;
        match &received.beacon {
            Beacon::Navigation(nav) => board.record_navigation(received.at, received.network, nav),
            Beacon::Probe(probe) => board
                .record_probe(
                    received.at,
                    received.network,
                    probe,
                    &self.inner.probe_order,
                )
                .into_iter()
                .find(|r| !matches!(r, Recorded::Stored | Recorded::Clamped))
                .unwrap_or(Recorded::Stored),
        }
    }

    /// How often [`Controller::run`] runs a round.
    pub fn interval(&self) -> Duration {
        self.inner.interval
    }

    /// Records a batch of parsed beacons under one lock.
    pub fn record_all<'a>(&self, beacons: impl IntoIterator<Item = &'a Received>) {
        for r in beacons {
            self.record(r);
        }
    }

    /// Takes every beacon of `stream` into the scoreboard until it ends.
    pub async fn consume<S, B>(&self, stream: S)
    where
        S: Stream<Item = B>,
        B: Into<BeaconInput>,
    {
        let mut stream = std::pin::pin!(stream);
        while let Some(b) = stream.next().await {
            match b.into() {
                BeaconInput::Bytes(bytes) => self.ingest_bytes(&bytes),
                BeaconInput::Parsed(r) => {
                    self.record(&r);
                }
            }
        }
    }

    /// What the beacon lines held so far (bad lines by reason).
    pub fn ingest_report(&self) -> IngestReport {
        self.inner
            .ingestor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .report()
            .clone()
    }

    /// The scoreboard over the policy's window, read at `now`.
    pub fn snapshot(&self, now: Timestamp) -> Snapshot {
        self.inner
            .board
            .copy()
            .snapshot(now, self.inner.policy.steering.rum.window.get())
    }

    /// The plan in force, as it changes: a watch channel for readers (the content-steering
    /// server, a status page).
    pub fn plans(&self) -> watch::Receiver<Arc<SteeringPlan>> {
        self.inner.plan_tx.subscribe()
    }

    /// The plan the last round decided.
    pub async fn plan(&self) -> SteeringPlan {
        self.inner.state.lock().await.plan.clone()
    }

    /// The health ledger as of the last round (or the last drain/hold).
    pub async fn ledger(&self) -> HealthLedger {
        self.inner.state.lock().await.ledger.clone()
    }

    /// Every round so far (restored rounds included), in order.
    pub async fn rounds(&self) -> Vec<RoundRecord> {
        self.inner.state.lock().await.rounds.clone()
    }

    /// The engine's journal: every decided change of every round, in order.
    pub async fn journal(&self) -> Journal {
        let mut j = Journal::new();
        j.extend(
            self.inner
                .state
                .lock()
                .await
                .rounds
                .iter()
                .flat_map(|r| r.decided.iter().cloned()),
        );
        j
    }

    /// Every drill of the policy that has begun: its progress, abort and figures per region
    /// (read them as text with [`engine::drill::report`]).
    pub async fn drills(&self) -> BTreeMap<multicdn_core::CohortId, engine::DrillProgress> {
        self.inner.state.lock().await.engine.drills.clone()
    }

    /// The engine's memory as of the last round.
    pub async fn engine_state(&self) -> EngineState {
        self.inner.state.lock().await.engine.clone()
    }

    /// The number of the last round concluded (0 before the first).
    pub async fn last_round(&self) -> u64 {
        self.inner.state.lock().await.round
    }

    /// The last round's record (`None` before the first).
    pub async fn last_record(&self) -> Option<RoundRecord> {
        self.inner.state.lock().await.rounds.last().cloned()
    }

    fn take_events(&self) -> Vec<Event> {
        let mut rx = self
            .inner
            .events_rx
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        while let Ok(e) = rx.try_recv() {
            out.push(e);
        }
        out
    }

    /// One round at `now`: health in, decide, apply, journal, store. For tests and
    /// simulations; [`Controller::run`] calls it every interval.
    pub async fn round(&self, now: Timestamp) -> RoundReport {
        let span = tracing::info_span!("round", at = %now, round = tracing::field::Empty);
        async {
            let decided = self.decide_round(now).await;
            self.finish_round(decided, now, &span, None, None).await
        }
        .instrument(span.clone())
        .await
    }

    /// One round at `now` behind `gate`: decided as [`Controller::round`] does, then applied
    /// only when [`RoundGate::begin`] says this controller leads (its term goes into the
    /// round's record), and committed through the gate once journaled. A round the gate
    /// refuses applies nothing, journals nothing and leaves the state as it was.
    pub async fn round_with(
        &self,
        now: Timestamp,
        gate: &dyn RoundGate,
    ) -> Result<RoundReport, Deposed> {
        let span = tracing::info_span!(
            "round",
            at = %now,
            round = tracing::field::Empty,
            term = tracing::field::Empty
        );
        async {
            let decided = self.decide_round(now).await;
            let intent = Intent {
                round: decided.guard.round + 1,
                at: now,
                term: 0,
                plan: decided.decision.plan.clone(),
            };
            match gate.begin(&intent).await {
                Ok(term) => {
                    span.record("term", term);
                    Ok(self
                        .finish_round(decided, now, &span, Some(term), Some(gate))
                        .await)
                }
                Err(why) => {
                    tracing::warn!(round = intent.round, why = %why, "not leading: nothing applied");
                    Err(Deposed {
                        round: intent.round,
                        why,
                    })
                }
            }
        }
        .instrument(span.clone())
        .await
    }

    /// Replaces the loop's memory with what another controller saved (a standby taking over):
    /// the round count, the plan, the engine's memory (a failover in progress goes on from its
    /// step), the ledger, the journal, the purges owed and the operator's switches. `intent`
    /// is the round the other controller began and did not journal, if any: each actuator is
    /// asked whether that plan (else the last journaled one) is already in force, and one that
    /// holds it is not written again while the plan stays the same. What was found goes into
    /// the next round's record.
    pub async fn restore(
        &self,
        saved: Saved,
        intent: Option<Intent>,
    ) -> Result<Takeover, ControllerError> {
        let now = self.inner.clock.now();
        if let Some(f) = &self.inner.fanout {
            f.restore(&saved.state.outstanding)?;
        }
        let intent = intent.filter(|i| i.round == saved.state.round + 1);
        let check = intent
            .as_ref()
            .map_or(&saved.state.plan, |i| &i.plan)
            .clone();
        let geo_only = check.without_asns();
        let mut applied = Vec::with_capacity(self.inner.actuators.len());
        let (mut in_force, mut not_in_force) = (Vec::new(), Vec::new());
        for a in &self.inner.actuators {
            let plan = if a.steerer.selects_asns() {
                &check
            } else {
                &geo_only
            };
            let held = match a.steerer.plan(plan).await {
                Ok(diff) => diff.changes.is_empty(),
                Err(e) => {
                    tracing::warn!(actuator = %a.name, error = %e, "reading the plan in force at takeover");
                    false
                }
            };
            if held {
                in_force.push(a.name.clone());
            } else {
                not_in_force.push(a.name.clone());
            }
            applied.push(held.then(|| plan.clone()));
        }
        let takeover = Takeover {
            from_term: intent
                .as_ref()
                .map(|i| i.term)
                .or_else(|| saved.state.last.as_ref().and_then(|l| l.term)),
            unfinished_round: intent.as_ref().map(|i| i.round),
            in_force,
            not_in_force,
        };
        let mut guard = self.inner.state.lock().await;
        let st = &mut *guard;
        let mut ledger = saved.state.ledger;
        for p in self.inner.policy.provider_ids() {
            ledger.ensure(&p, now);
        }
        for (p, o) in &saved.state.outstanding {
            if !o.is_empty() {
                ledger.purge_outstanding(p, o.item_count(), now);
            }
        }
        *st = Loop {
            round: saved.state.round,
            plan: saved.state.plan,
            engine: saved.state.engine,
            ledger,
            rounds: saved.journal,
            applied,
            overrides: saved.state.overrides,
            operator: saved.state.operator,
            takeover: Some(takeover.clone()),
        };
        let plan = Arc::new(st.plan.clone());
        self.inner.plan_tx.send_replace(plan);
        tracing::warn!(
            round = st.round,
            unfinished = ?takeover.unfinished_round,
            in_force = takeover.in_force.join(", "),
            not_in_force = takeover.not_in_force.join(", "),
            "took over the loop's state"
        );
        Ok(takeover)
    }

    /// The state as the store gets it after each round.
    pub async fn state(&self) -> ControllerState {
        let st = self.inner.state.lock().await;
        self.state_to_save(&st, st.rounds.last().cloned())
    }

    /// Replaces the scoreboard with one built elsewhere (the merge of every shard's), whose
    /// evidence is complete up to `as_of` (`None`: not known to be complete at all). From
    /// now on the deadman reads the older of the scoreboard's newest sample and `as_of`, so a
    /// feed that stops (a shard that stopped publishing) makes the data stale rather than
    /// silently thinner. The scoreboard must have the policy's bucket length.
    pub fn feed_scoreboard(
        &self,
        board: Scoreboard,
        as_of: Option<Timestamp>,
    ) -> Result<(), ControllerError> {
        if board.config().bucket_ms() != self.inner.board.config().bucket_ms() {
            return Err(ControllerError::Scoreboard(SteeringError::Merge(format!(
                "the fed scoreboard's buckets are {} ms, the policy's {} ms",
                board.config().bucket_ms(),
                self.inner.board.config().bucket_ms()
            ))));
        }
        self.inner
            .board
            .replace(board)
            .map_err(ControllerError::Scoreboard)?;
        *self
            .inner
            .fed_as_of
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(as_of);
        Ok(())
    }

    /// Health and beacons in, decide: everything but applying. The state stays locked until
    /// the round is finished (or dropped, refused by a gate, leaving it as it was).
    async fn decide_round(&self, now: Timestamp) -> Decided<'_> {
        let mut events = Vec::new();
        if let Some(m) = &self.inner.monitor {
            events.extend(m.round_once().await.events);
        }
        events.extend(self.take_events());
        let mut guard = self.inner.state.lock().await;
        let st = &mut *guard;
        for e in &events {
            st.ledger.record(e);
        }
        self.sync_monitor(&mut st.ledger, now);
        let health: BTreeMap<ProviderId, ProviderHealth> = st.ledger.health();

        let effective;
        let policy: &Policy = if st.overrides.is_empty() {
            &self.inner.policy
        } else {
            effective = st.overrides.apply_to(&self.inner.policy);
            &effective
        };
        // The round copies the scoreboard a shard at a time, aging each as it goes: the
        // receivers record beacons meanwhile, and one waits only when it writes to the shard
        // being copied. The copy, reading it (every window of the ladder) and deciding run on
        // a blocking thread, so the connections a runtime thread serves never wait for them.
        let fed = *self
            .inner
            .fed_as_of
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let job = {
            let inner = Arc::clone(&self.inner);
            let policy = policy.clone();
            let plan = st.plan.clone();
            let engine_state = st.engine.clone();
            move || {
                let mut engine_state = engine_state;
                let board = inner.board.copy_expired(now);
                // Drills: the baseline before one begins, its watch (and abort) while it runs,
                // the figures after it (the decision carries what they note into the state).
                engine::drill::observe(&policy, &mut engine_state, now, &mut |window| {
                    board.snapshot(now, window)
                });
                // Every window of the policy's ladder in one pass: a network too thin in
                // `window` is judged on its own longer history, never on a coarser cut.
                let ladder = board.snapshots(now, &policy.steering.rum.read_windows());
                // The newest sample the longest window holds: after a pipeline outage longer
                // than `window` the deadman still knows when evidence stopped.
                let newest = ladder.last().and_then(Snapshot::newest_sample);
                let data_as_of = match fed {
                    None => newest,
                    Some(cap) => newest.zip(cap).map(|(n, c)| n.min(c)),
                };
                let cohorts = cohort_inputs_over(
                    &policy,
                    &ladder,
                    Metric::Ttfb,
                    inner.scorer.as_ref(),
                    &plan,
                );
                let decision = engine::decide(
                    now,
                    &Inputs {
                        policy: &policy,
                        current: &plan,
                        cohorts: &cohorts,
                        health: &health,
                        data_as_of,
                        state: &engine_state,
                    },
                );
                // The round's record (dashboard, API) shows the decision window.
                let window = policy.steering.rum.window.get();
                let snapshot = match ladder.into_iter().find(|s| s.window >= window) {
                    Some(first) => first,
                    None => board.snapshot(now, window),
                };
                (decision, snapshot)
            }
        };
        let (decision, snapshot) = off_runtime(job).await;
        let plan_changed = decision.plan != st.plan;
        let dry_run = self.is_dry_run();
        Decided {
            decision,
            events,
            snapshot,
            plan_changed,
            dry_run,
            guard,
        }
    }

    /// Applies a decided round on every actuator, journals it and saves the state (and commits
    /// it through the gate, when there is one).
    async fn finish_round(
        &self,
        decided: Decided<'_>,
        now: Timestamp,
        span: &tracing::Span,
        term: Option<u64>,
        gate: Option<&dyn RoundGate>,
    ) -> RoundReport {
        let Decided {
            decision,
            events,
            snapshot,
            plan_changed,
            dry_run,
            mut guard,
        } = decided;
        let st = &mut *guard;
        let out: BTreeMap<ProviderId, Vec<OutReason>> = st
            .ledger
            .entries()
            .filter(|(_, e)| e.is_out())
            .map(|(p, e)| (p.clone(), e.reasons.clone()))
            .collect();
        if !dry_run {
            for video in &self.inner.video {
                video.set_unavailable(out.keys().cloned().collect());
            }
        }
        let mut applied = Vec::with_capacity(self.inner.actuators.len());
        let geo_only = decision.plan.without_asns();
        for (i, a) in self.inner.actuators.iter().enumerate() {
            // An actuator that cannot select by ASN gets the plan without ASN cohorts: those
            // networks follow their country's cohort there.
            let plan = if a.steerer.selects_asns() {
                &decision.plan
            } else {
                &geo_only
            };
            let outcome = if dry_run {
                ApplyOutcome::DryRun
            } else if st.applied.get(i).and_then(Option::as_ref) == Some(plan) {
                ApplyOutcome::UpToDate
            } else {
                let outcome = self
                    .apply_one(a, plan)
                    .instrument(tracing::info_span!("apply", actuator = %a.name))
                    .await;
                if let Some(slot) = st.applied.get_mut(i) {
                    *slot = outcome.in_force().then(|| plan.clone());
                }
                outcome
            };
            applied.push(ApplyRecord {
                actuator: a.name.clone(),
                outcome,
            });
        }
        st.round += 1;
        span.record("round", st.round);
        let record = RoundRecord {
            round: st.round,
            at: now,
            mode: decision.mode,
            dry_run,
            out,
            decided: decision.journal,
            plan_changed,
            applied,
            term,
            takeover: st.takeover.take(),
        };
        if record.partial() {
            let failed: Vec<String> = record.failed().iter().map(|a| a.actuator.clone()).collect();
            tracing::warn!(
                round = record.round,
                failed = failed.join(", "),
                "plan applied to some actuators only; the next round retries the others"
            );
        }
        st.plan = decision.plan;
        st.engine = decision.state;
        st.rounds.push(record.clone());
        let mut store_error = self.save(st, Some(record.clone()));
        if let Some(g) = gate
            && let Err(e) = g
                .commit(&self.state_to_save(st, Some(record.clone())))
                .await
        {
            tracing::error!(round = record.round, error = %e, "the round could not be committed to the shared store");
            store_error = Some(match store_error {
                Some(local) => format!("{local}; shared store: {e}"),
                None => format!("shared store: {e}"),
            });
        }
        let plan = Arc::new(st.plan.clone());
        self.inner.plan_tx.send_if_modified(|p| {
            if **p == *plan {
                false
            } else {
                *p = plan.clone();
                true
            }
        });
        RoundReport {
            record,
            plan,
            events,
            store_error,
            snapshot: Arc::new(snapshot),
        }
    }

    fn save(&self, st: &Loop, last: Option<RoundRecord>) -> Option<String> {
        let saved = self.state_to_save(st, last);
        self.inner.store.save(&saved).err().map(|e| {
            tracing::error!(error = %e, "the controller's state could not be saved");
            e.to_string()
        })
    }

    fn state_to_save(&self, st: &Loop, last: Option<RoundRecord>) -> ControllerState {
        ControllerState {
            round: st.round,
            plan: st.plan.clone(),
            engine: st.engine.clone(),
            ledger: st.ledger.clone(),
            outstanding: self
                .inner
                .fanout
                .as_ref()
                .map(PurgeFanout::outstanding)
                .unwrap_or_default(),
            // An operator's save between rounds appends no round to the journal.
            last,
            overrides: st.overrides.clone(),
            operator: st.operator.clone(),
        }
    }

    /// Uses an operator switch: checks it against the policy, applies it from the next round
    /// (drain and dry run at once), saves it with the state, and records who and why. A
    /// refused switch changes nothing.
    pub async fn operate(
        &self,
        operator: Operator,
        command: Command,
    ) -> Result<OperatorRecord, ControllerError> {
        if operator.who.trim().is_empty() || operator.why.trim().is_empty() {
            return Err(OperatorError::Unattributed {
                who: operator.who,
                why: operator.why,
            }
            .into());
        }
        let now = self.inner.clock.now();
        let mut guard = self.inner.state.lock().await;
        let st = &mut *guard;
        let reason = format!("{} ({})", operator.why, operator.who);
        st.overrides
            .update(&self.inner.policy, &command, &reason, now)?;
        match &command {
            Command::Drain { provider, on } => {
                if let Some(m) = &self.inner.monitor {
                    let _ = m.set_drained(provider, *on);
                }
                st.ledger.set_drained(provider, *on, now);
            }
            Command::DryRun { on } => self.set_dry_run(*on),
            Command::Static { .. } | Command::Pin { .. } | Command::Unpin { .. } => {}
        }
        let record = OperatorRecord {
            at: now,
            operator,
            command,
            from_round: st.round + 1,
        };
        tracing::warn!(
            who = %record.operator.who, why = %record.operator.why, command = %record.command,
            from_round = record.from_round, "operator switch"
        );
        st.operator.push(record.clone());
        if st.operator.len() > OPERATOR_KEPT {
            let excess = st.operator.len() - OPERATOR_KEPT;
            st.operator.drain(..excess);
        }
        if let Some(e) = self.save(st, None) {
            tracing::error!(error = %e, "the operator switch is in force but not saved");
        }
        Ok(record)
    }

    /// Every operator switch used, oldest first.
    pub async fn operator_log(&self) -> Vec<OperatorRecord> {
        self.inner.state.lock().await.operator.clone()
    }

    /// The operator's switches in force.
    pub async fn overrides(&self) -> Overrides {
        self.inner.state.lock().await.overrides.clone()
    }

    /// The network of a client address, by the controller's resolver.
    pub fn resolve(&self, ip: std::net::IpAddr) -> multicdn_steering::beacon::ClientNetwork {
        self.inner.resolver.resolve(ip)
    }

    /// The controller's clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.inner.clock)
    }

    /// A quorum verdict restored from the store outlives the monitor's memory (a new monitor
    /// starts every provider up and never flips an up provider to recovered): once the monitor
    /// has seen the provider up for the policy's `up_after` rounds, the verdict is cleared as a
    /// recovery would. Drains set on the monitor directly reach the ledger too.
    fn sync_monitor(&self, ledger: &mut HealthLedger, now: Timestamp) {
        let Some(m) = &self.inner.monitor else {
            return;
        };
        let snapshot = m.snapshot();
        let up_after = self.inner.policy.health.up_after;
        for (p, h) in &snapshot.providers {
            if ledger.quorum_down(p)
                && h.state == multicdn_core::HealthState::Up
                && h.up_rounds >= up_after
            {
                ledger.clear_quorum(p, now);
            }
            let drained = ledger.reasons(p).iter().any(|r| r.kind() == "drained");
            if h.drained != drained {
                ledger.set_drained(p, h.drained, now);
            }
        }
    }

    async fn apply_one(&self, a: &Actuator, plan: &SteeringPlan) -> ApplyOutcome {
        let retry = self.inner.retry;
        let attempts = retry.attempts.max(1);
        let mut wait = retry.backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match a.steerer.apply(plan, &self.inner.apply).await {
                Ok(diff) => {
                    return ApplyOutcome::Applied {
                        changes: diff.changes.len(),
                        attempts: attempt,
                    };
                }
                Err(e) => {
                    tracing::warn!(
                        actuator = %a.name, attempt, error = %e, retryable = e.is_retryable(),
                        "apply failed"
                    );
                    if !e.is_retryable() || attempt >= attempts {
                        return ApplyOutcome::Failed {
                            error: ErrorRecord::from(&e),
                            attempts: attempt,
                        };
                    }
                    let pause = e.retry_after().unwrap_or(wait).min(retry.max_backoff);
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                    wait = (wait * 2).min(retry.max_backoff);
                }
            }
        }
    }

    /// Runs a round now and then every interval, by `clock`, until `shutdown` completes. A
    /// round in flight at shutdown finishes first (a plan is never half-applied by the
    /// controller's own choice). Beacons are taken in meanwhile through [`Controller::consume`]
    /// or the ingest methods.
    pub async fn run(&self, clock: impl Clock, shutdown: impl Future<Output = ()>) {
        every(self.inner.interval, shutdown, || async {
            drop_off_runtime(self.round(clock.now()).await);
        })
        .await;
    }

    /// The engine's journal entries of the last round (for printing a timeline).
    pub async fn last_decided(&self) -> Vec<JournalEntry> {
        self.inner
            .state
            .lock()
            .await
            .rounds
            .last()
            .map(|r| r.decided.clone())
            .unwrap_or_default()
    }

    /// What each provider still owes of missed purges.
    pub fn outstanding(&self) -> BTreeMap<ProviderId, Outstanding> {
        self.inner
            .fanout
            .as_ref()
            .map(PurgeFanout::outstanding)
            .unwrap_or_default()
    }
}
