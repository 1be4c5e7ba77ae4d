//! The numbers that turn observations into verdicts: quorum, hysteresis, interval, freshness.

use std::time::Duration;

use multicdn_core::policy::HealthPolicy;

use crate::error::HealthError;

/// How observations become a verdict (seed 000, section 9). The policy file's `health` section
/// is where these are written; [`HealthConfig::from_policy`] reads them.
///
/// The defaults are the seed's: 3 runners must agree, 2 bad rounds to go down, 10 good rounds
/// to come back, a round every 30 s, and an observation votes for 90 s (three rounds).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthConfig {
    /// How many runners with fresh observations must agree (K of N).
    pub quorum: usize,
    /// Consecutive down rounds before a provider is marked down.
    pub down_after: u32,
    /// Consecutive up rounds before a down provider is marked up again.
    pub up_after: u32,
    /// Time between rounds of the monitor loop.
    pub interval: Duration,
    /// How long an observation keeps its vote.
    pub fresh_for: Duration,
}

impl Default for HealthConfig {
    fn default() -> HealthConfig {
        HealthConfig {
            quorum: 3,
            down_after: 2,
            up_after: 10,
            interval: Duration::from_secs(30),
            fresh_for: Duration::from_secs(90),
        }
    }
}

impl HealthConfig {
    /// The health section of a (validated) policy.
    pub fn from_policy(policy: &HealthPolicy) -> HealthConfig {
        HealthConfig {
            quorum: policy.quorum,
            down_after: policy.down_after,
            up_after: policy.up_after,
            interval: policy.interval.get(),
            fresh_for: policy.fresh_for().get(),
        }
    }

    /// Sets how many fresh runners must agree.
    pub fn with_quorum(mut self, quorum: usize) -> HealthConfig {
        self.quorum = quorum;
        self
    }

    /// Sets the consecutive down rounds before down.
    pub fn with_down_after(mut self, rounds: u32) -> HealthConfig {
        self.down_after = rounds;
        self
    }

    /// Sets the consecutive up rounds before up.
    pub fn with_up_after(mut self, rounds: u32) -> HealthConfig {
        self.up_after = rounds;
        self
    }

    /// Sets the time between rounds.
    pub fn with_interval(mut self, interval: Duration) -> HealthConfig {
        self.interval = interval;
        self
    }

    /// Sets how long an observation votes.
    pub fn with_fresh_for(mut self, fresh_for: Duration) -> HealthConfig {
        self.fresh_for = fresh_for;
        self
    }

    /// Checks that the numbers can work together.
    pub fn validate(&self) -> Result<(), HealthError> {
        if self.quorum == 0 {
            return Err(HealthError::config(
                "quorum",
                "must be at least 1 runner; 3 of 5 regions is usual",
            ));
        }
        if self.down_after == 0 {
            return Err(HealthError::config(
                "down_after",
                "must be at least 1 round",
            ));
        }
        if self.up_after == 0 {
            return Err(HealthError::config("up_after", "must be at least 1 round"));
        }
        if self.interval.is_zero() {
            return Err(HealthError::config(
                "interval",
                "must be longer than zero, like 30s",
            ));
        }
        if self.fresh_for < self.interval {
            return Err(HealthError::config(
                "fresh_for",
                format!(
                    "{:?} is shorter than the interval ({:?}): no observation would survive to \
                     the next round; use at least one interval, usually three",
                    self.fresh_for, self.interval
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_seed_numbers() {
        let c = HealthConfig::default();
        assert_eq!((c.quorum, c.down_after, c.up_after), (3, 2, 10));
        assert_eq!(c.fresh_for, 3 * c.interval);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn reads_the_policy_health_section() {
        let policy = multicdn_core::Policy::load(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/policy.yaml"
        ))
        .unwrap();
        let c = HealthConfig::from_policy(&policy.health);
        assert_eq!(c, HealthConfig::default());
    }

    #[test]
    fn rejects_settings_that_cannot_work() {
        let bad = [
            HealthConfig::default().with_quorum(0),
            HealthConfig::default().with_down_after(0),
            HealthConfig::default().with_up_after(0),
            HealthConfig::default().with_interval(Duration::ZERO),
            HealthConfig::default().with_fresh_for(Duration::from_secs(1)),
        ];
        for c in bad {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.starts_with("invalid setting"), "{e}");
        }
    }
}
