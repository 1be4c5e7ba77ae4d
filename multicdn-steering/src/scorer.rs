//! The scorers: one scoreboard cell in, one comparable number out (lower is better), or the
//! reason no number can be given.
//!
//! - [`P75Ttfb`]: the cell's p75, in milliseconds.
//! - [`AvailabilityThenLatency`]: providers under an availability threshold are not scored at
//!   all (so they can never win); the rest score by latency.
//! - [`CostAware`]: wraps another scorer and adds a penalty as a provider's share nears or
//!   passes its commercial commit, so cheaper capacity wins close calls.
//!
//! ```
//! use std::time::Duration;
//! use multicdn_core::{CellStats, ProviderId, Scorer};
//! use multicdn_steering::scorer::AvailabilityThenLatency;
//!
//! let scorer = AvailabilityThenLatency::new(0.99, 200);
//! let mut cell = CellStats::new(500, Duration::from_secs(30), Some(140.0));
//! cell.availability = Some(0.97);
//! let fastly = ProviderId::new("fastly")?;
//! assert!(scorer.score(&fastly, &cell).value().is_none());
//! cell.availability = Some(0.999);
//! assert_eq!(scorer.score(&fastly, &cell).value(), Some(140.0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;

use multicdn_core::policy::RumPolicy;
use multicdn_core::{CellStats, ProviderId, Score, Scorer};
use serde::{Deserialize, Serialize};

fn cannot(reason: String) -> Score {
    Score::CannotScore { reason }
}

/// Which percentile of a cell a scorer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Percentile {
    /// p50.
    P50,
    /// p75.
    #[default]
    P75,
    /// p90.
    P90,
    /// p99.
    P99,
}

impl Percentile {
    /// The nearest of the four to a policy's `percentile` (75 for p75).
    pub fn nearest(p: u8) -> Percentile {
        match p {
            0..=62 => Percentile::P50,
            63..=82 => Percentile::P75,
            83..=94 => Percentile::P90,
            _ => Percentile::P99,
        }
    }

    pub(crate) fn read(self, cell: &CellStats) -> Option<f64> {
        match self {
            Percentile::P50 => cell.p50,
            Percentile::P75 => cell.p75,
            Percentile::P90 => cell.p90,
            Percentile::P99 => cell.p99,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Percentile::P50 => "p50",
            Percentile::P75 => "p75",
            Percentile::P90 => "p90",
            Percentile::P99 => "p99",
        }
    }
}

/// The minimum a cell needs: `min_samples` samples, or `min_pairs` samples that are each one
/// of `min_pairs` paired loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Minimum {
    samples: u64,
    pairs: u64,
}

impl Minimum {
    fn unpaired(samples: u64) -> Minimum {
        Minimum {
            samples,
            pairs: samples,
        }
    }

    fn refuses(&self, cell: &CellStats) -> Option<String> {
        if cell.samples >= self.samples {
            return None;
        }
        match cell.pairs {
            Some(pairs) if pairs >= self.pairs && cell.samples >= self.pairs => None,
            Some(pairs) => Some(format!(
                "{} samples and {pairs} pairs, {} samples or {} pairs needed",
                cell.samples, self.samples, self.pairs
            )),
            None => Some(format!("{} samples, {} needed", cell.samples, self.samples)),
        }
    }
}

fn latency(p: Percentile, min: Minimum, cell: &CellStats) -> Score {
    if let Some(why) = min.refuses(cell) {
        return cannot(why);
    }
    match p.read(cell) {
        Some(v) if v.is_finite() => Score::Value { value: v },
        _ => cannot(format!("no {} in the cell", p.name())),
    }
}

/// Scores by the cell's p75 TTFB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct P75Ttfb {
    min: Minimum,
}

impl P75Ttfb {
    /// Refuses cells under `min_samples`, paired or not.
    pub fn new(min_samples: u64) -> P75Ttfb {
        P75Ttfb {
            min: Minimum::unpaired(min_samples),
        }
    }

    /// Accepts a paired cell from `min_pairs` pairs.
    pub fn min_pairs(mut self, min_pairs: u64) -> Self {
        self.min.pairs = min_pairs;
        self
    }
}

impl Scorer for P75Ttfb {
    fn score(&self, _provider: &ProviderId, cell: &CellStats) -> Score {
        latency(Percentile::P75, self.min, cell)
    }
}

/// Drops providers under an availability threshold, then scores by latency.
///
/// A cell with no availability measured (navigation beacons only come from pages that
/// loaded) is scored by latency alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AvailabilityThenLatency {
    threshold: f64,
    min: Minimum,
    percentile: Percentile,
}

impl AvailabilityThenLatency {
    /// `threshold` is a fraction (0.99 for 99%); cells under `min_samples` are refused,
    /// paired or not.
    pub fn new(threshold: f64, min_samples: u64) -> AvailabilityThenLatency {
        AvailabilityThenLatency {
            threshold,
            min: Minimum::unpaired(min_samples),
            percentile: Percentile::P75,
        }
    }

    /// The policy's threshold, minimum samples and pairs, and percentile.
    pub fn from_policy(rum: &RumPolicy) -> AvailabilityThenLatency {
        AvailabilityThenLatency {
            threshold: rum.availability_threshold.fraction(),
            min: Minimum {
                samples: rum.min_samples,
                pairs: rum.min_pairs,
            },
            percentile: Percentile::nearest(rum.percentile),
        }
    }

    /// Accepts a paired cell from `min_pairs` pairs.
    pub fn min_pairs(mut self, min_pairs: u64) -> Self {
        self.min.pairs = min_pairs;
        self
    }

    /// Reads another percentile.
    pub fn percentile(mut self, p: Percentile) -> Self {
        self.percentile = p;
        self
    }
}

impl Scorer for AvailabilityThenLatency {
    fn score(&self, _provider: &ProviderId, cell: &CellStats) -> Score {
        if let Some(a) = cell.availability
            && a < self.threshold
        {
            return cannot(format!(
                "availability {:.2}% is under the threshold {:.2}%",
                a * 100.0,
                self.threshold * 100.0
            ));
        }
        latency(self.percentile, self.min, cell)
    }
}

/// A provider's commercial commit, as a share of traffic.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Commit {
    /// The share the commit covers, in basis points; above it, overage is billed.
    pub share_bp: u32,
    /// How far below the commit the penalty starts ramping, in basis points.
    pub ramp_bp: u32,
    /// The penalty at the commit, in milliseconds of score.
    pub penalty_at_commit_ms: f64,
    /// The penalty added per percent above the commit, in milliseconds of score.
    pub overage_ms_per_percent: f64,
}

impl Commit {
    /// A commit at `share_bp`, ramping over the 10 points below it up to `penalty_at_commit_ms`,
    /// then `overage_ms_per_percent` more per percent past it.
    pub fn new(share_bp: u32, penalty_at_commit_ms: f64, overage_ms_per_percent: f64) -> Commit {
        Commit {
            share_bp,
            ramp_bp: 1000,
            penalty_at_commit_ms,
            overage_ms_per_percent,
        }
    }

    /// The penalty at `share_bp`.
    pub fn penalty(&self, share_bp: u32) -> f64 {
        let start = self.share_bp.saturating_sub(self.ramp_bp);
        if share_bp <= start {
            0.0
        } else if share_bp <= self.share_bp {
            let ramp = f64::from(self.ramp_bp.max(1));
            self.penalty_at_commit_ms * f64::from(share_bp - start) / ramp
        } else {
            self.penalty_at_commit_ms
                + self.overage_ms_per_percent * f64::from(share_bp - self.share_bp) / 100.0
        }
    }
}

/// Adds a cost penalty to another scorer's value as a provider nears or passes its commit.
/// The provider's share comes from the cell (`share_bp`); a cell without one gets no penalty.
#[derive(Debug, Clone)]
pub struct CostAware<S> {
    inner: S,
    commits: BTreeMap<ProviderId, Commit>,
}

impl<S: Scorer> CostAware<S> {
    /// Wraps `inner` with per-provider commits.
    pub fn new(inner: S, commits: impl IntoIterator<Item = (ProviderId, Commit)>) -> CostAware<S> {
        CostAware {
            inner,
            commits: commits.into_iter().collect(),
        }
    }
}

impl<S: Scorer> Scorer for CostAware<S> {
    fn score(&self, provider: &ProviderId, cell: &CellStats) -> Score {
        match self.inner.score(provider, cell) {
            Score::Value { value } => {
                let penalty = match (self.commits.get(provider), cell.share_bp) {
                    (Some(c), Some(share)) => c.penalty(share),
                    _ => 0.0,
                };
                Score::Value {
                    value: value + penalty,
                }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    fn cell(samples: u64, p75: f64) -> CellStats {
        CellStats::new(samples, Duration::from_secs(1), Some(p75))
    }

    #[test]
    fn p75_refuses_thin_cells() {
        let s = P75Ttfb::new(200);
        assert_eq!(s.score(&p("a"), &cell(500, 120.0)).value(), Some(120.0));
        let Score::CannotScore { reason } = s.score(&p("a"), &cell(40, 120.0)) else {
            panic!()
        };
        assert!(reason.contains("40 samples, 200 needed"), "{reason}");
    }

    #[test]
    fn availability_gates_before_latency() {
        let s = AvailabilityThenLatency::new(0.99, 10).percentile(Percentile::P75);
        let mut c = cell(100, 50.0);
        c.availability = Some(0.95);
        let Score::CannotScore { reason } = s.score(&p("a"), &c) else {
            panic!()
        };
        assert!(reason.contains("95.00%"), "{reason}");
        c.availability = None;
        assert_eq!(s.score(&p("a"), &c).value(), Some(50.0));
        assert_eq!(Percentile::nearest(75), Percentile::P75);
        assert_eq!(Percentile::nearest(99), Percentile::P99);
    }

    #[test]
    fn cost_penalty_ramps_towards_the_commit_and_grows_past_it() {
        let commit = Commit::new(6000, 20.0, 5.0);
        assert_eq!(commit.penalty(4000), 0.0);
        assert_eq!(commit.penalty(5000), 0.0);
        assert_eq!(commit.penalty(5500), 10.0);
        assert_eq!(commit.penalty(6000), 20.0);
        assert_eq!(commit.penalty(7000), 70.0);
        let s = CostAware::new(P75Ttfb::new(1), [(p("fastly"), commit)]);
        let mut c = cell(100, 100.0);
        c.share_bp = Some(7000);
        assert_eq!(s.score(&p("fastly"), &c).value(), Some(170.0));
        assert_eq!(s.score(&p("cloudflare"), &c).value(), Some(100.0));
        c.share_bp = None;
        assert_eq!(s.score(&p("fastly"), &c).value(), Some(100.0));
    }
}
