//! The five traits every part of the library meets at, with the types they exchange.
//!
//! | trait | one call | style |
//! |---|---|---|
//! | [`Provider`] | describes one CDN | sync |
//! | [`Purger`] | sends one purge, returns a receipt | async |
//! | [`HealthCheck`] | probes one target once | async |
//! | [`Steerer`] | reads the answers in force, plans and applies a steering plan | async |
//! | [`Scorer`] | turns one scoreboard cell into a score | sync, pure |
//!
//! With the `mock` feature, `mockall` mocks (`MockPurger`, `MockSteerer`, ...) are exported so
//! downstream teams can mock these traits in their own tests.

mod health;
mod pacing;
mod provider;
mod purge;
mod score;
mod steer;

pub use health::{FailReason, HealthCheck, Observation, Outcome, Target};
pub use pacing::{Budget, DEFAULT_ITEMS_PER_REQUEST, KindPacing, Pacing, RateLimit, Unit};
pub use provider::{Provider, ProviderKind};
pub use purge::{PurgeReceipt, PurgeRequest, PurgeScope, Purger};
pub use score::{CellStats, Score, Scorer};
pub use steer::{
    ApplyOptions, CohortChange, CohortPlan, Steerer, SteeringDiff, SteeringPlan, SteeringState,
};

#[cfg(any(test, feature = "mock"))]
pub use health::MockHealthCheck;
#[cfg(any(test, feature = "mock"))]
pub use provider::MockProvider;
#[cfg(any(test, feature = "mock"))]
pub use purge::MockPurger;
#[cfg(any(test, feature = "mock"))]
pub use score::MockScorer;
#[cfg(any(test, feature = "mock"))]
pub use steer::MockSteerer;
