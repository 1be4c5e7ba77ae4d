//! Every reason a provider is out, folded into the one health value the engine reads.
//!
//! A provider can be out for several reasons at once: the probes' quorum says it is down, it
//! missed a purge, an operator drained it, someone holds it out by hand. Each reason is kept
//! on its own and cleared only by its own signal (a recovery clears the quorum verdict, never a
//! missed purge), and the provider is up only when none is left. The time it went down is the
//! time the first reason arrived, so the engine's failover steps count from the start of the
//! outage however many reasons join it; the time it came back is when the last one cleared.
//!
//! ```
//! use multicdn::HealthLedger;
//! use multicdn_core::{Event, HealthState, ProviderId, Timestamp};
//!
//! let fastly = ProviderId::new("fastly")?;
//! let t = |s: u64| Timestamp::from_millis(s * 1_000);
//! let mut ledger = HealthLedger::new([fastly.clone()], t(0));
//! ledger.record(&Event::QuorumDown { provider: fastly.clone(), failing: vec![], voting: 5, at: t(10) });
//! ledger.record(&Event::PurgeMissed {
//!     provider: fastly.clone(), items: vec!["price-list".into()], scope: "tags".into(),
//!     error: "401".into(), at: t(20),
//! });
//! ledger.record(&Event::Recovered { provider: fastly.clone(), at: t(30) });
//! // Still out: the missed purge holds it, and it has been down since the first reason.
//! let h = ledger.health()[&fastly];
//! assert_eq!((h.state, h.since), (HealthState::Down, t(10)));
//! ledger.record(&Event::PurgeRecovered { provider: fastly.clone(), at: t(40) });
//! assert_eq!(ledger.health()[&fastly].state, HealthState::Up);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;

use multicdn_core::{Event, ProviderHealth, ProviderId, Timestamp};
use serde::{Deserialize, Serialize};

/// Why a provider is out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutReason {
    /// The probes' quorum says it is down (cleared by [`Event::Recovered`]).
    QuorumDown {
        /// Since when.
        since: Timestamp,
    },
    /// It missed a purge and serves content the others dropped (cleared by
    /// [`Event::PurgeRecovered`]).
    PurgeMissed {
        /// Since when.
        since: Timestamp,
        /// Items missed so far (empty for a purge of everything).
        items: usize,
    },
    /// An operator drained it for maintenance (healthy or not, it carries no traffic).
    Drained {
        /// Since when.
        since: Timestamp,
    },
    /// Held out by hand, with the operator's note.
    Held {
        /// Since when.
        since: Timestamp,
        /// Why.
        note: String,
    },
}

impl OutReason {
    /// Since when this reason holds.
    pub fn since(&self) -> Timestamp {
        match self {
            OutReason::QuorumDown { since }
            | OutReason::PurgeMissed { since, .. }
            | OutReason::Drained { since }
            | OutReason::Held { since, .. } => *since,
        }
    }

    /// `quorum_down`, `purge_missed`, `drained` or `held`.
    pub fn kind(&self) -> &'static str {
        match self {
            OutReason::QuorumDown { .. } => "quorum_down",
            OutReason::PurgeMissed { .. } => "purge_missed",
            OutReason::Drained { .. } => "drained",
            OutReason::Held { .. } => "held",
        }
    }
}

impl fmt::Display for OutReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutReason::QuorumDown { since } => write!(f, "quorum says down since {since}"),
            OutReason::PurgeMissed { since, items } => {
                write!(f, "missed a purge ({items} items) since {since}")
            }
            OutReason::Drained { since } => write!(f, "drained since {since}"),
            OutReason::Held { since, note } => write!(f, "held out since {since}: {note}"),
        }
    }
}

/// One provider in the ledger: every reason it is out, and the health they add up to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LedgerEntry {
    /// Every reason it is out, in the order they arrived (empty: up).
    pub reasons: Vec<OutReason>,
    /// The health the engine reads: down since the first reason, up since the last cleared.
    pub health: ProviderHealth,
}

impl LedgerEntry {
    fn up(at: Timestamp) -> LedgerEntry {
        LedgerEntry {
            reasons: Vec::new(),
            health: ProviderHealth::up(at),
        }
    }

    /// True when some reason holds it out.
    pub fn is_out(&self) -> bool {
        !self.reasons.is_empty()
    }

    fn add(&mut self, reason: OutReason) {
        let kind = reason.kind();
        let at = reason.since();
        match self.reasons.iter_mut().find(|r| r.kind() == kind) {
            // A missed purge on top of a missed purge: more items, the same start.
            Some(OutReason::PurgeMissed { items, .. }) => {
                if let OutReason::PurgeMissed { items: more, .. } = reason {
                    *items += more;
                }
            }
            Some(OutReason::Held { note, .. }) => {
                if let OutReason::Held { note: new, .. } = reason {
                    *note = new;
                }
            }
            Some(_) => {}
            None => {
                if self.reasons.is_empty() {
                    self.health = ProviderHealth::down(at);
                }
                self.reasons.push(reason);
            }
        }
    }

    fn clear(&mut self, kind: &str, at: Timestamp) -> bool {
        let before = self.reasons.len();
        self.reasons.retain(|r| r.kind() != kind);
        let cleared = self.reasons.len() != before;
        if cleared && self.reasons.is_empty() {
            self.health = ProviderHealth::up(at);
        }
        cleared
    }
}

/// Every provider's reasons to be out, and the engine's health input they add up to.
/// Serialisable, so it survives a restart with the rest of the controller's state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HealthLedger {
    providers: BTreeMap<ProviderId, LedgerEntry>,
}

impl HealthLedger {
    /// Every provider up since `at`.
    pub fn new(providers: impl IntoIterator<Item = ProviderId>, at: Timestamp) -> HealthLedger {
        HealthLedger {
            providers: providers
                .into_iter()
                .map(|p| (p, LedgerEntry::up(at)))
                .collect(),
        }
    }

    /// Adds a provider (up since `at`) if it is not in the ledger yet.
    pub fn ensure(&mut self, provider: &ProviderId, at: Timestamp) {
        self.providers
            .entry(provider.clone())
            .or_insert_with(|| LedgerEntry::up(at));
    }

    fn entry(&mut self, provider: &ProviderId, at: Timestamp) -> &mut LedgerEntry {
        self.providers
            .entry(provider.clone())
            .or_insert_with(|| LedgerEntry::up(at))
    }

    /// Folds one event in: a quorum verdict or a missed purge adds a reason, a recovery or a
    /// completed purge clears its own. An unhappy probe changes nothing. Returns true when
    /// the provider's health changed.
    pub fn record(&mut self, event: &Event) -> bool {
        let at = event.at();
        let provider = event.provider().clone();
        let was = self.entry(&provider, at).health;
        let entry = self.entry(&provider, at);
        match event {
            Event::QuorumDown { .. } => entry.add(OutReason::QuorumDown { since: at }),
            Event::Recovered { .. } => {
                entry.clear("quorum_down", at);
            }
            Event::PurgeMissed { items, .. } => entry.add(OutReason::PurgeMissed {
                since: at,
                items: items.len(),
            }),
            Event::PurgeRecovered { .. } => {
                entry.clear("purge_missed", at);
            }
            _ => {}
        }
        entry.health != was
    }

    /// Drains (or undrains) a provider for maintenance. Returns true when its health changed.
    pub fn set_drained(&mut self, provider: &ProviderId, drained: bool, at: Timestamp) -> bool {
        let entry = self.entry(provider, at);
        let was = entry.health;
        if drained {
            entry.add(OutReason::Drained { since: at });
        } else {
            entry.clear("drained", at);
        }
        entry.health != was
    }

    /// Holds a provider out by hand, with a note. Returns true when its health changed.
    pub fn hold(&mut self, provider: &ProviderId, note: impl Into<String>, at: Timestamp) -> bool {
        let entry = self.entry(provider, at);
        let was = entry.health;
        entry.add(OutReason::Held {
            since: at,
            note: note.into(),
        });
        entry.health != was
    }

    /// Releases a manual hold. Returns true when the provider's health changed.
    pub fn release(&mut self, provider: &ProviderId, at: Timestamp) -> bool {
        let entry = self.entry(provider, at);
        let was = entry.health;
        entry.clear("held", at);
        entry.health != was
    }

    /// Marks a provider as having missed purges (restored from a fan-out's outstanding
    /// record at start), unless that reason is already held.
    pub fn purge_outstanding(&mut self, provider: &ProviderId, items: usize, at: Timestamp) {
        let entry = self.entry(provider, at);
        if !entry.reasons.iter().any(|r| r.kind() == "purge_missed") {
            entry.add(OutReason::PurgeMissed { since: at, items });
        }
    }

    /// True when `provider` is held out for a quorum verdict.
    pub fn quorum_down(&self, provider: &ProviderId) -> bool {
        self.reasons(provider)
            .iter()
            .any(|r| matches!(r, OutReason::QuorumDown { .. }))
    }

    /// Clears a quorum verdict without a recovery event (the monitor's own record says the
    /// provider has been up long enough). Returns true when the health changed.
    pub fn clear_quorum(&mut self, provider: &ProviderId, at: Timestamp) -> bool {
        let entry = self.entry(provider, at);
        let was = entry.health;
        entry.clear("quorum_down", at);
        entry.health != was
    }

    /// Every reason `provider` is out (empty: up, or unknown).
    pub fn reasons(&self, provider: &ProviderId) -> &[OutReason] {
        self.providers
            .get(provider)
            .map_or(&[], |e| e.reasons.as_slice())
    }

    /// One provider's entry.
    pub fn get(&self, provider: &ProviderId) -> Option<&LedgerEntry> {
        self.providers.get(provider)
    }

    /// Every provider's entry.
    pub fn entries(&self) -> impl Iterator<Item = (&ProviderId, &LedgerEntry)> + '_ {
        self.providers.iter()
    }

    /// The engine's health input: one value per provider.
    pub fn health(&self) -> BTreeMap<ProviderId, ProviderHealth> {
        self.providers
            .iter()
            .map(|(p, e)| (p.clone(), e.health))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multicdn_core::HealthState;

    fn t(s: u64) -> Timestamp {
        Timestamp::from_millis(s * 1000)
    }

    #[test]
    fn a_drain_and_a_hold_each_keep_a_provider_out_until_their_own_release() {
        let p = ProviderId::new("cloudflare").unwrap();
        let mut l = HealthLedger::new([p.clone()], t(0));
        assert!(l.set_drained(&p, true, t(5)));
        assert!(!l.hold(&p, "vendor incident ticket 42", t(6)));
        assert_eq!(l.reasons(&p).len(), 2);
        assert!(!l.set_drained(&p, false, t(7)));
        assert_eq!(l.health()[&p].state, HealthState::Down);
        assert_eq!(l.health()[&p].since, t(5));
        assert!(l.release(&p, t(9)));
        assert_eq!(l.health()[&p], ProviderHealth::up(t(9)));
        // A recovery never undrains.
        l.set_drained(&p, true, t(10));
        l.record(&Event::Recovered {
            provider: p.clone(),
            at: t(11),
        });
        assert!(l.health()[&p].is_down());
    }

    #[test]
    fn round_trips_through_json() {
        let p = ProviderId::new("fastly").unwrap();
        let mut l = HealthLedger::new([p.clone()], t(0));
        l.hold(&p, "x", t(1));
        let back: HealthLedger = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert_eq!(back, l);
    }
}
