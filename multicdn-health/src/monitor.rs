//! The monitor loop: every in-process runner probes every target each interval, with bounded
//! concurrency; the observations (and any that arrive from runners elsewhere) meet in the
//! quorum; verdicts and events are published.
//!
//! The library owns no runtime. [`Monitor::run`] is a future the embedder drives, with a
//! shutdown signal; [`Monitor::round_once`] runs one round on demand. The current verdicts are
//! readable at any time, without waiting for a round ([`Monitor::snapshot`],
//! [`Monitor::watch`]), and events go to every [`Monitor::subscribe`]r. Rounds are paced with
//! `tokio::time`, observations are stamped by an injected [`Clock`], so tests run on paused time.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use multicdn_core::{
    Clock, Event, HealthCheck, Observation, ProviderId, SystemClock, Target, Timestamp,
};
use tokio::sync::{broadcast, watch};
use tokio::time::MissedTickBehavior;

use crate::config::HealthConfig;
use crate::error::HealthError;
use crate::tracker::{HealthSnapshot, HealthTracker};

/// What one round did.
#[derive(Debug)]
#[non_exhaustive]
pub struct RoundReport {
    /// When the round concluded (by the monitor's clock).
    pub at: Timestamp,
    /// Probes that produced an observation.
    pub observed: usize,
    /// Of those, how many failed.
    pub failed: usize,
    /// Probes that could not run at all (an invalid target): no vote.
    pub errors: Vec<HealthError>,
    /// Events of the round, in order: each failed probe, then any verdict that flipped.
    pub events: Vec<Event>,
}

/// Runs rounds of probes and keeps the verdicts. Cheap to clone: clones share one state.
#[derive(Debug, Clone)]
pub struct Monitor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    targets: Vec<Target>,
    runners: Vec<Arc<dyn HealthCheck>>,
    concurrency: usize,
    interval: Duration,
    clock: Arc<dyn Clock>,
    tracker: Mutex<HealthTracker>,
    verdicts: watch::Sender<Arc<HealthSnapshot>>,
    events: broadcast::Sender<Event>,
}

impl Monitor {
    /// A monitor with `config`'s quorum, hysteresis and interval.
    pub fn builder(config: HealthConfig) -> MonitorBuilder {
        MonitorBuilder {
            config,
            targets: Vec::new(),
            runners: Vec::new(),
            concurrency: 16,
            clock: Arc::new(SystemClock),
            event_capacity: 1024,
        }
    }

    fn tracker(&self) -> MutexGuard<'_, HealthTracker> {
        // The tracker is never left half-updated by a panic (its methods do not panic), so a
        // poisoned lock still holds a consistent state.
        self.inner
            .tracker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn publish_snapshot(&self, tracker: &HealthTracker) {
        self.inner
            .verdicts
            .send_replace(Arc::new(tracker.snapshot()));
    }

    fn publish(&self, event: &Event) {
        match event {
            Event::ProbeUnhappy {
                provider,
                runner,
                reason,
                ..
            } => tracing::info!(%provider, %runner, %reason, "probe unhappy"),
            Event::QuorumDown {
                provider,
                failing,
                voting,
                ..
            } => tracing::warn!(%provider, failing = failing.len(), voting, "quorum says down"),
            Event::Recovered { provider, .. } => tracing::info!(%provider, "recovered"),
            other => tracing::info!(provider = %other.provider(), "health event"),
        }
        // No subscribers is fine: the verdicts are still readable.
        let _ = self.inner.events.send(event.clone());
    }

    /// The verdicts as of the last round (all up before the first). Never waits for a round.
    pub fn snapshot(&self) -> Arc<HealthSnapshot> {
        self.inner.verdicts.borrow().clone()
    }

    /// A receiver that sees every new snapshot (after each round, or a drain).
    pub fn watch(&self) -> watch::Receiver<Arc<HealthSnapshot>> {
        self.inner.verdicts.subscribe()
    }

    /// Events from now on: probes unhappy, quorum down, recovered. A subscriber that falls more
    /// than the channel's capacity behind loses the oldest (and is told so by `recv`).
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    /// The targets probed each round.
    pub fn targets(&self) -> &[Target] {
        &self.inner.targets
    }

    /// Feeds an observation from anywhere (a runner in another region, over any transport) into
    /// the same quorum. It votes at the next round's end while fresh. A failed observation is
    /// published as [`Event::ProbeUnhappy`] and returned.
    pub fn ingest(&self, observation: Observation) -> Result<Option<Event>, HealthError> {
        let event = self.tracker().observe(observation)?;
        if let Some(e) = &event {
            self.publish(e);
        }
        Ok(event)
    }

    /// Drains or undrains a provider. Health is kept apart: a drained provider is still probed,
    /// and [`HealthSnapshot::in_service`] says whether it may carry traffic.
    pub fn set_drained(&self, provider: &ProviderId, drained: bool) -> Result<(), HealthError> {
        let mut tracker = self.tracker();
        tracker.set_drained(provider, drained)?;
        self.publish_snapshot(&tracker);
        Ok(())
    }

    /// One round: every runner probes every target (at most `concurrency` at once), then the
    /// round concludes at the clock's `now` and the verdicts are published.
    pub async fn round_once(&self) -> RoundReport {
        let inner = &self.inner;
        // The probes as a plain list of futures (no closures in the stream's type), so the
        // round, and `run`, stay `Send` for any embedder's `tokio::spawn`.
        let mut probes = Vec::with_capacity(inner.runners.len() * inner.targets.len());
        for runner in &inner.runners {
            for target in &inner.targets {
                probes.push(async move { (target, runner.check(target).await) });
            }
        }
        let mut results = futures::stream::iter(probes).buffer_unordered(inner.concurrency);

        let mut observed = 0;
        let mut failed = 0;
        let mut errors = Vec::new();
        let mut events = Vec::new();
        while let Some((target, result)) = results.next().await {
            match result {
                Ok(o) => {
                    observed += 1;
                    failed += usize::from(!o.passed());
                    let kept = self.tracker().observe(o);
                    match kept {
                        Ok(Some(e)) => {
                            self.publish(&e);
                            events.push(e);
                        }
                        Ok(None) => {}
                        Err(e) => errors.push(e),
                    }
                }
                Err(source) => {
                    tracing::warn!(provider = %target.provider, error = %source, "probe could not run");
                    errors.push(HealthError::Check {
                        provider: target.provider.clone(),
                        source: Box::new(source),
                    });
                }
            }
        }

        let at = inner.clock.now();
        let flips = {
            let mut tracker = self.tracker();
            let flips = tracker.conclude_round(at);
            self.publish_snapshot(&tracker);
            flips
        };
        for e in &flips {
            self.publish(e);
        }
        events.extend(flips);
        RoundReport {
            at,
            observed,
            failed,
            errors,
            events,
        }
    }

    /// Runs a round at once and then every interval until `shutdown` completes. A round still
    /// in flight at shutdown is abandoned; the verdicts stay as the last finished round left
    /// them. A round that overruns the interval delays the next instead of bunching them.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let mut ticker = tokio::time::interval(self.inner.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = ticker.tick() => {}
            }
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = self.round_once() => {}
            }
        }
    }
}

/// Builds a [`Monitor`].
#[derive(Debug)]
pub struct MonitorBuilder {
    config: HealthConfig,
    targets: Vec<Target>,
    runners: Vec<Arc<dyn HealthCheck>>,
    concurrency: usize,
    clock: Arc<dyn Clock>,
    event_capacity: usize,
}

impl MonitorBuilder {
    /// Adds a target. One target per provider: it is that provider's health object.
    pub fn target(mut self, target: Target) -> MonitorBuilder {
        self.targets.push(target);
        self
    }

    /// Adds targets (from [`targets_from_policy`](crate::targets_from_policy), say).
    pub fn targets(mut self, targets: impl IntoIterator<Item = Target>) -> MonitorBuilder {
        self.targets.extend(targets);
        self
    }

    /// Adds an in-process runner: a check whose observations name its region. A monitor with
    /// no runners only concludes rounds from [`Monitor::ingest`]ed observations.
    pub fn runner(mut self, check: impl HealthCheck + 'static) -> MonitorBuilder {
        self.runners.push(Arc::new(check));
        self
    }

    /// Adds a shared in-process runner.
    pub fn shared_runner(mut self, check: Arc<dyn HealthCheck>) -> MonitorBuilder {
        self.runners.push(check);
        self
    }

    /// Probes in flight at once, across runners and targets (default 16).
    pub fn concurrency(mut self, n: usize) -> MonitorBuilder {
        self.concurrency = n;
        self
    }

    /// The clock that decides freshness and stamps rounds (default: the system clock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> MonitorBuilder {
        self.clock = Arc::new(clock);
        self
    }

    /// The clock, shared with the probes.
    pub fn shared_clock(mut self, clock: Arc<dyn Clock>) -> MonitorBuilder {
        self.clock = clock;
        self
    }

    /// Events kept for a slow subscriber (default 1,024).
    pub fn event_capacity(mut self, n: usize) -> MonitorBuilder {
        self.event_capacity = n;
        self
    }

    /// The monitor, with every provider up and none drained.
    pub fn build(self) -> Result<Monitor, HealthError> {
        if self.targets.is_empty() {
            return Err(HealthError::config(
                "targets",
                "add at least one target; targets_from_policy gives one per provider",
            ));
        }
        let mut providers: Vec<ProviderId> =
            self.targets.iter().map(|t| t.provider.clone()).collect();
        providers.sort();
        if let Some(w) = providers.windows(2).find(|w| w[0] == w[1]) {
            return Err(HealthError::config(
                "targets",
                format!(
                    "provider {} has two targets; give each provider exactly one health object",
                    w[0]
                ),
            ));
        }
        if self.concurrency == 0 {
            return Err(HealthError::config(
                "concurrency",
                "must be at least 1 probe in flight",
            ));
        }
        if self.event_capacity == 0 {
            return Err(HealthError::config(
                "event_capacity",
                "must be at least 1 event",
            ));
        }
        let tracker = HealthTracker::new(&self.config, providers)?;
        let (verdicts, _) = watch::channel(Arc::new(tracker.snapshot()));
        let (events, _) = broadcast::channel(self.event_capacity);
        Ok(Monitor {
            inner: Arc::new(Inner {
                targets: self.targets,
                runners: self.runners,
                concurrency: self.concurrency,
                interval: self.config.interval,
                clock: self.clock,
                tracker: Mutex::new(tracker),
                verdicts,
                events,
            }),
        })
    }
}
