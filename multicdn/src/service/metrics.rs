//! The service's Prometheus metrics, in one registry the service owns (no process-wide
//! globals: two services in one process, or a team's own registry, never collide).
//!
//! Names follow the Prometheus conventions: a `multicdn_` prefix, `_total` on counters, base
//! units (`_seconds`), labels for what varies.

use std::sync::atomic::AtomicU64;

use multicdn_steering::journal::{Guardrail, Rule};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::receiver::{Kind, Reject};
use crate::controller::RoundReport;
use crate::record::ApplyOutcome;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectLabel {
    kind: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GuardrailLabel {
    guardrail: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActuatorLabel {
    actuator: String,
    class: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MetricLabel {
    metric: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabel {
    command: &'static str,
}

/// Every metric the service exports.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    accepted: Family<KindLabel, Counter>,
    rejected: Family<RejectLabel, Counter>,
    forwarded_ignored: Counter,
    unresolved: Counter,
    #[cfg(feature = "nats")]
    publish_dropped: Counter,
    cells: Family<MetricLabel, Gauge>,
    steerable: Family<MetricLabel, Gauge>,
    moves: Family<RuleLabel, Counter>,
    holds: Family<GuardrailLabel, Counter>,
    provider_up: Family<ProviderLabel, Gauge>,
    purge_misses: Family<ProviderLabel, Counter>,
    actuator_errors: Family<ActuatorLabel, Counter>,
    rounds: Counter,
    partial_rounds: Counter,
    round_seconds: Histogram,
    operator: Family<CommandLabel, Counter>,
    connections_refused: Counter,
    static_mode: Gauge<f64, AtomicU64>,
    /// Per kind: the accepted counter and the rejected counters by reason, looked up once
    /// (the receiver's path takes no lock for its counters).
    hot: [(Counter, Vec<Counter>); 2],
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("multicdn");
        let m = Metrics {
            accepted: Family::default(),
            rejected: Family::default(),
            forwarded_ignored: Counter::default(),
            unresolved: Counter::default(),
            #[cfg(feature = "nats")]
            publish_dropped: Counter::default(),
            cells: Family::default(),
            steerable: Family::default(),
            moves: Family::default(),
            holds: Family::default(),
            provider_up: Family::default(),
            purge_misses: Family::default(),
            actuator_errors: Family::default(),
            rounds: Counter::default(),
            partial_rounds: Counter::default(),
            round_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            operator: Family::default(),
            connections_refused: Counter::default(),
            static_mode: Gauge::default(),
            registry: Registry::default(),
            hot: Default::default(),
        };
        registry.register(
            "beacons_accepted",
            "Beacons taken into the scoreboard, by kind (nav, probe)",
            m.accepted.clone(),
        );
        registry.register(
            "beacons_rejected",
            "Beacons refused, by kind and reason",
            m.rejected.clone(),
        );
        registry.register(
            "beacons_forwarded_ignored",
            "Beacons whose X-Forwarded-For or Forwarded came from a peer that is not a trusted proxy (the header was not believed; the socket address was used)",
            m.forwarded_ignored.clone(),
        );
        #[cfg(feature = "nats")]
        registry.register(
            "beacons_publish_dropped",
            "Accepted beacons the shard publisher refused because its buffer was full (taken here, not published to the shards)",
            m.publish_dropped.clone(),
        );
        registry.register(
            "beacons_unresolved",
            "Accepted beacons whose client address resolved to no network (counted globally only)",
            m.unresolved.clone(),
        );
        registry.register(
            "scoreboard_cells",
            "Scoreboard cells with samples in the window, by metric (ttfb, probe), countries and networks",
            m.cells.clone(),
        );
        registry.register(
            "scoreboard_cells_steerable",
            "Scoreboard cells with enough fresh samples to steer on, by metric",
            m.steerable.clone(),
        );
        registry.register(
            "moves",
            "Cohort weight changes decided, by rule",
            m.moves.clone(),
        );
        registry.register(
            "guardrail_holds",
            "Moves a guardrail capped, by guardrail",
            m.holds.clone(),
        );
        registry.register(
            "provider_up",
            "1 when the provider may carry traffic, 0 when the health ledger holds it out",
            m.provider_up.clone(),
        );
        registry.register(
            "purge_misses",
            "Purges a provider missed after its retries (each demotes it until purged)",
            m.purge_misses.clone(),
        );
        registry.register(
            "actuator_errors",
            "Plan applies that failed after their retries, by actuator and class (retryable, fatal, auth)",
            m.actuator_errors.clone(),
        );
        registry.register("rounds", "Controller rounds run", m.rounds.clone());
        registry.register(
            "rounds_partial",
            "Rounds whose plan reached some actuators and not others",
            m.partial_rounds.clone(),
        );
        registry.register(
            "round_duration_seconds",
            "How long a round took: health, decide, apply, store",
            m.round_seconds.clone(),
        );
        registry.register(
            "operator_switches",
            "Operator switches used, by command",
            m.operator.clone(),
        );
        registry.register(
            "http_connections_refused",
            "Connections answered 503 because the server was at its connection cap",
            m.connections_refused.clone(),
        );
        registry.register(
            "static_mode",
            "1 while the plan in force is the static weights (the big red switch or the deadman)",
            m.static_mode.clone(),
        );
        let hot = [Kind::Nav, Kind::Probe].map(|kind| {
            let accepted = m
                .accepted
                .get_or_create(&KindLabel { kind: kind.label() })
                .clone();
            let rejected = Reject::ALL
                .iter()
                .map(|r| {
                    m.rejected
                        .get_or_create(&RejectLabel {
                            kind: kind.label(),
                            reason: r.label(),
                        })
                        .clone()
                })
                .collect();
            (accepted, rejected)
        });
        Metrics { registry, hot, ..m }
    }

    pub(crate) fn accepted(&self, kind: Kind) {
        self.hot[kind as usize].0.inc();
    }

    pub(crate) fn rejected(&self, kind: Kind, reason: Reject) {
        if let Some(c) = self.hot[kind as usize].1.get(reason as usize) {
            c.inc();
        }
    }

    pub(crate) fn rejected_count(&self, kind: Kind, reason: Reject) -> u64 {
        self.hot[kind as usize]
            .1
            .get(reason as usize)
            .map_or(0, Counter::get)
    }

    pub(crate) fn accepted_count(&self, kind: Kind) -> u64 {
        self.hot[kind as usize].0.get()
    }

    pub(crate) fn forwarded_ignored(&self) {
        self.forwarded_ignored.inc();
    }

    pub(crate) fn forwarded_ignored_count(&self) -> u64 {
        self.forwarded_ignored.get()
    }

    #[cfg(feature = "nats")]
    pub(crate) fn publish_dropped(&self) {
        self.publish_dropped.inc();
    }

    pub(crate) fn unresolved(&self) {
        self.unresolved.inc();
    }

    pub(crate) fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    pub(crate) fn operator(&self, command: &'static str) {
        self.operator.get_or_create(&CommandLabel { command }).inc();
    }

    pub(crate) fn cells(&self, metric: &'static str, cells: usize, steerable: usize) {
        let label = MetricLabel { metric };
        self.cells
            .get_or_create(&label)
            .set(i64::try_from(cells).unwrap_or(i64::MAX));
        self.steerable
            .get_or_create(&label)
            .set(i64::try_from(steerable).unwrap_or(i64::MAX));
    }

    pub(crate) fn provider_up(&self, provider: &str, up: bool) {
        self.provider_up
            .get_or_create(&ProviderLabel {
                provider: provider.to_owned(),
            })
            .set(i64::from(up));
    }

    /// Counts what a round did.
    pub(crate) fn round(&self, report: &RoundReport, seconds: f64) {
        self.rounds.inc();
        self.round_seconds.observe(seconds);
        if report.partial() {
            self.partial_rounds.inc();
        }
        for e in &report.record.decided {
            if e.is_move() {
                self.moves
                    .get_or_create(&RuleLabel {
                        rule: rule_label(e.rule),
                    })
                    .inc();
            }
            if let Some(g) = e.evidence.capped_by {
                self.holds
                    .get_or_create(&GuardrailLabel {
                        guardrail: guardrail_label(g),
                    })
                    .inc();
            }
        }
        for a in &report.record.applied {
            if let ApplyOutcome::Failed { error, .. } = &a.outcome {
                let class = if error.auth {
                    "auth"
                } else if error.retryable {
                    "retryable"
                } else {
                    "fatal"
                };
                self.actuator_errors
                    .get_or_create(&ActuatorLabel {
                        actuator: a.actuator.clone(),
                        class,
                    })
                    .inc();
            }
        }
        for e in &report.events {
            if let multicdn_core::Event::PurgeMissed { provider, .. } = e {
                self.purge_misses
                    .get_or_create(&ProviderLabel {
                        provider: provider.to_string(),
                    })
                    .inc();
            }
        }
        let is_static = matches!(
            report.record.mode,
            multicdn_steering::engine::Mode::Static | multicdn_steering::engine::Mode::Deadman
        );
        self.static_mode.set(if is_static { 1.0 } else { 0.0 });
    }

    /// The text exposition (OpenMetrics).
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// A rule as a label value (`rum`, `failover`).
pub(crate) fn rule_label(rule: Rule) -> String {
    serde_json::to_value(rule)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{rule:?}").to_lowercase())
}

fn guardrail_label(g: Guardrail) -> String {
    serde_json::to_value(g)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{g:?}").to_lowercase())
}
