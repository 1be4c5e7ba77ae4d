//! Signals that cross crates: a health verdict reaching the engine, a missed purge demoting a
//! provider. They are values, so no crate calls into another to deliver them.

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::id::{ProviderId, RegionId};
use crate::traits::FailReason;

/// A provider's health as the steering engine sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Serving correctly.
    #[default]
    Up,
    /// Demoted: quorum says down, or it missed a purge.
    Down,
}

/// How loud an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// For logs and dashboards: one probe unhappy, a recovery.
    Info,
    /// Page someone: quorum down, a missed purge.
    Page,
}

/// Something that happened to a provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// One runner's probe failed. A probe problem until a quorum agrees: log it, never page.
    ProbeUnhappy {
        /// The provider.
        provider: ProviderId,
        /// The runner that failed.
        runner: RegionId,
        /// Why.
        reason: FailReason,
        /// When.
        at: Timestamp,
    },
    /// A quorum of runners agreed, for long enough, that the provider is down.
    QuorumDown {
        /// The provider.
        provider: ProviderId,
        /// Runners that voted down in the deciding round.
        failing: Vec<RegionId>,
        /// Runners with a fresh vote in that round.
        voting: usize,
        /// When.
        at: Timestamp,
    },
    /// The provider passed enough consecutive rounds to be trusted again.
    Recovered {
        /// The provider.
        provider: ProviderId,
        /// When.
        at: Timestamp,
    },
    /// A purge did not complete on this provider after its retries: it is serving content
    /// every other provider has dropped, and must be demoted until purged.
    PurgeMissed {
        /// The provider.
        provider: ProviderId,
        /// The items it missed (tags, URLs, ...); empty for a purge of everything.
        items: Vec<String>,
        /// The purge kind (`tags`, `urls`, ...).
        scope: String,
        /// The error, as text.
        error: String,
        /// When.
        at: Timestamp,
    },
    /// A provider that missed a purge has since been purged successfully.
    PurgeRecovered {
        /// The provider.
        provider: ProviderId,
        /// When.
        at: Timestamp,
    },
}

impl Event {
    /// The provider concerned.
    pub fn provider(&self) -> &ProviderId {
        match self {
            Event::ProbeUnhappy { provider, .. }
            | Event::QuorumDown { provider, .. }
            | Event::Recovered { provider, .. }
            | Event::PurgeMissed { provider, .. }
            | Event::PurgeRecovered { provider, .. } => provider,
        }
    }

    /// When it happened.
    pub fn at(&self) -> Timestamp {
        match self {
            Event::ProbeUnhappy { at, .. }
            | Event::QuorumDown { at, .. }
            | Event::Recovered { at, .. }
            | Event::PurgeMissed { at, .. }
            | Event::PurgeRecovered { at, .. } => *at,
        }
    }

    /// Whether to page on it. Only a quorum verdict or a missed purge pages.
    pub fn severity(&self) -> Severity {
        match self {
            Event::QuorumDown { .. } | Event::PurgeMissed { .. } => Severity::Page,
            _ => Severity::Info,
        }
    }

    /// What the event means for steering: `Some(Down)` demotes, `Some(Up)` restores, `None`
    /// changes nothing (a single unhappy probe never moves traffic).
    pub fn health_signal(&self) -> Option<HealthState> {
        match self {
            Event::QuorumDown { .. } | Event::PurgeMissed { .. } => Some(HealthState::Down),
            Event::Recovered { .. } | Event::PurgeRecovered { .. } => Some(HealthState::Up),
            Event::ProbeUnhappy { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_quorum_and_missed_purges_page_or_demote() {
        let p = ProviderId::new("fastly").unwrap();
        let unhappy = Event::ProbeUnhappy {
            provider: p.clone(),
            runner: RegionId::new("ap-southeast").unwrap(),
            reason: FailReason::Timeout,
            at: Timestamp::EPOCH,
        };
        assert_eq!(unhappy.severity(), Severity::Info);
        assert_eq!(unhappy.health_signal(), None);
        let missed = Event::PurgeMissed {
            provider: p.clone(),
            items: vec!["product-1".into()],
            scope: "tags".into(),
            error: "401".into(),
            at: Timestamp::EPOCH,
        };
        assert_eq!(missed.severity(), Severity::Page);
        assert_eq!(missed.health_signal(), Some(HealthState::Down));
        let json = serde_json::to_string(&missed).unwrap();
        assert!(json.contains("\"event\":\"purge_missed\""), "{json}");
    }
}
