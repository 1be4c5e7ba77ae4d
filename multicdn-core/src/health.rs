//! A provider's health as the decision engine takes it: up or down, and since when.
//!
//! One type for every crate: the `multicdn` crate's health ledger folds quorum verdicts, missed
//! purges, drains and holds into one of these per provider, and the engine reads it.

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::event::HealthState;

/// A provider's health as the engine needs it: the state and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderHealth {
    /// Up or down.
    pub state: HealthState,
    /// When it entered that state (failover steps count from here).
    pub since: Timestamp,
}

impl ProviderHealth {
    /// Up since `since`.
    pub fn up(since: Timestamp) -> ProviderHealth {
        ProviderHealth {
            state: HealthState::Up,
            since,
        }
    }

    /// Down since `since`.
    pub fn down(since: Timestamp) -> ProviderHealth {
        ProviderHealth {
            state: HealthState::Down,
            since,
        }
    }

    /// True when down.
    pub fn is_down(&self) -> bool {
        self.state == HealthState::Down
    }
}
