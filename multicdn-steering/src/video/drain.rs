//! Gradual drain back to a recovered node.
//!
//! When a node comes back, new sessions go to it at once; sessions already playing elsewhere
//! move over `period`, at no more than `max_share_per_minute` of them per minute, so neither the
//! node they leave nor the node they join sees its load swing. Progress is linear in time, and
//! which sessions move first is a deterministic function of the session id (the same FNV point
//! the pathway choice uses), so a session moves once and never bounces back.
//!
//! ```
//! use std::time::Duration;
//! use multicdn_core::Timestamp;
//! use multicdn_steering::video::drain::{Drain, DrainConfig};
//!
//! let drain = Drain::new(Timestamp::from_secs(0), DrainConfig::default());
//! assert_eq!(drain.progress(Timestamp::from_secs(0)), 0.0);
//! assert_eq!(drain.progress(Timestamp::from_secs(180)), 0.5);
//! assert!(drain.is_done(Timestamp::from_secs(360)));
//! ```

use std::time::Duration;

use multicdn_core::Timestamp;

use super::actuator::session_point;

/// How fast sessions move back.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct DrainConfig {
    /// How long moving every existing session takes (default 6 minutes; the seed says 5 to 10).
    pub period: Duration,
    /// The most of the existing sessions moved in any minute (default 0.25). When the period is
    /// shorter than this bound allows, the bound wins and the drain takes longer.
    pub max_share_per_minute: f64,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            period: Duration::from_secs(360),
            max_share_per_minute: 0.25,
        }
    }
}

impl DrainConfig {
    /// Sets the period.
    pub fn period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Sets the rate bound.
    pub fn max_share_per_minute(mut self, share: f64) -> Self {
        self.max_share_per_minute = share;
        self
    }

    /// How long the drain really takes: the period, or longer when the rate bound requires.
    pub fn effective_period(&self) -> Duration {
        let by_rate = if self.max_share_per_minute > 0.0 && self.max_share_per_minute.is_finite() {
            Duration::from_secs_f64((60.0 / self.max_share_per_minute).min(1e9))
        } else {
            Duration::from_secs(1_000_000_000)
        };
        self.period.max(by_rate)
    }

    /// The most of the existing sessions allowed to move during `dt`.
    pub fn bound_for(&self, dt: Duration) -> f64 {
        self.max_share_per_minute * dt.as_secs_f64() / 60.0
    }
}

/// One drain in progress.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drain {
    started: Timestamp,
    config: DrainConfig,
}

impl Drain {
    /// A drain starting at `started`.
    pub fn new(started: Timestamp, config: DrainConfig) -> Drain {
        Drain { started, config }
    }

    /// When it started.
    pub fn started(&self) -> Timestamp {
        self.started
    }

    /// The configuration.
    pub fn config(&self) -> DrainConfig {
        self.config
    }

    /// The share (0.0–1.0) of the sessions that were elsewhere at the start which should have
    /// moved by `now`.
    pub fn progress(&self, now: Timestamp) -> f64 {
        let total = self.config.effective_period().as_secs_f64();
        if total <= 0.0 {
            return 1.0;
        }
        (now.since(self.started).as_secs_f64() / total).clamp(0.0, 1.0)
    }

    /// Whether every session has moved.
    pub fn is_done(&self, now: Timestamp) -> bool {
        self.progress(now) >= 1.0
    }

    /// Whether the existing session `session` should be on the recovered node by `now`. New
    /// sessions do not ask: they always go to the recovered node.
    pub fn should_move(&self, session: &str, now: Timestamp) -> bool {
        let point = f64::from(session_point(session, "drain")) / 10_000.0;
        point < self.progress(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_bound_stretches_a_short_period() {
        let c = DrainConfig::default().period(Duration::from_secs(60));
        assert_eq!(c.effective_period(), Duration::from_secs(240));
        let d = Drain::new(Timestamp::EPOCH, c);
        assert_eq!(d.progress(Timestamp::from_secs(60)), 0.25);
    }

    #[test]
    fn sessions_move_once_and_in_proportion() {
        let d = Drain::new(Timestamp::EPOCH, DrainConfig::default());
        let sessions: Vec<String> = (0..4000).map(|i| format!("s{i}")).collect();
        let mut moved_before = vec![false; sessions.len()];
        for t in (0..=360).step_by(30) {
            let now = Timestamp::from_secs(t);
            let moved: Vec<bool> = sessions.iter().map(|s| d.should_move(s, now)).collect();
            for (b, a) in moved_before.iter().zip(&moved) {
                assert!(!*b || *a, "a moved session came back");
            }
            let share = moved.iter().filter(|m| **m).count() as f64 / sessions.len() as f64;
            assert!((share - d.progress(now)).abs() < 0.03, "{t}: {share}");
            moved_before = moved;
        }
    }

    #[test]
    fn a_clock_stepping_back_reads_as_no_progress() {
        let d = Drain::new(Timestamp::from_secs(100), DrainConfig::default());
        assert_eq!(d.progress(Timestamp::from_secs(50)), 0.0);
    }
}
