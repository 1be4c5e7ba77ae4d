use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::id::ProviderId;

/// The statistics of one scoreboard cell (metric × network × provider × window).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CellStats {
    /// How many samples the cell holds.
    pub samples: u64,
    /// Age of the newest sample.
    #[serde(with = "crate::policy::units::duration_ms")]
    pub age: Duration,
    /// Median, in milliseconds.
    pub p50: Option<f64>,
    /// 75th percentile, in milliseconds.
    pub p75: Option<f64>,
    /// 90th percentile, in milliseconds.
    pub p90: Option<f64>,
    /// 99th percentile, in milliseconds.
    pub p99: Option<f64>,
    /// Share of requests that succeeded, 0.0 to 1.0, when errors are measured.
    pub availability: Option<f64>,
    /// The provider's current share of this cohort's traffic, in basis points.
    pub share_bp: Option<u32>,
    /// When the cell's loads also timed another provider of the cohort (the paired probe):
    /// how many such pairs there are. A scorer may then accept fewer than its `min_samples`
    /// (down to its `min_pairs`): the engine judges a paired difference by its own, smaller,
    /// error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<u64>,
}

impl CellStats {
    /// Stats with a sample count, an age and a p75.
    pub fn new(samples: u64, age: Duration, p75: Option<f64>) -> CellStats {
        CellStats {
            samples,
            age,
            p75,
            ..CellStats::default()
        }
    }
}

/// A provider's score in one cell: lower is better. Or the reason no score can be given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Score {
    /// A comparable value (milliseconds for latency scorers; lower is better).
    Value {
        /// The score.
        value: f64,
    },
    /// Not enough, or not fresh enough, data; or excluded (under the availability threshold).
    CannotScore {
        /// Why.
        reason: String,
    },
}

impl Score {
    /// The value, if scored.
    pub fn value(&self) -> Option<f64> {
        match self {
            Score::Value { value } => Some(*value),
            Score::CannotScore { .. } => None,
        }
    }
}

/// [`Scorer`] turns one cell into a score, or says it cannot. Pure and synchronous.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
pub trait Scorer: fmt::Debug + Send + Sync {
    /// Scores `provider` from its cell.
    fn score(&self, provider: &ProviderId, cell: &CellStats) -> Score;
}

impl<T: Scorer + ?Sized> Scorer for Arc<T> {
    fn score(&self, provider: &ProviderId, cell: &CellStats) -> Score {
        (**self).score(provider, cell)
    }
}
