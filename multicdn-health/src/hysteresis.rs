//! Hysteresis: fail fast, recover slow.
//!
//! Pure consecutive counters, in the shape of pingora's `consecutive_counter`: a provider goes
//! down after `down_after` consecutive down rounds and comes back after `up_after` consecutive up
//! rounds. A round with no verdict changes nothing: it neither extends nor breaks a streak. A
//! flapping edge (bad, good, bad, ...) therefore never moves traffic either way.

use multicdn_core::HealthState;
use serde::{Deserialize, Serialize};

/// One round's vote, after the quorum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vote {
    /// The quorum said down.
    Down,
    /// The quorum said up.
    Up,
    /// No verdict: the streaks stay as they are.
    Abstain,
}

/// The thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hysteresis {
    down_after: u32,
    up_after: u32,
}

impl Hysteresis {
    /// Down after `down_after` consecutive down rounds, up after `up_after` up rounds (each at
    /// least 1).
    pub fn new(down_after: u32, up_after: u32) -> Hysteresis {
        Hysteresis {
            down_after: down_after.max(1),
            up_after: up_after.max(1),
        }
    }

    /// Consecutive down rounds before down.
    pub fn down_after(&self) -> u32 {
        self.down_after
    }

    /// Consecutive up rounds before up.
    pub fn up_after(&self) -> u32 {
        self.up_after
    }
}

/// A provider's health and its current streaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Streak {
    /// The health in force.
    pub state: HealthState,
    /// Consecutive down rounds so far.
    pub down_rounds: u32,
    /// Consecutive up rounds so far.
    pub up_rounds: u32,
}

impl Streak {
    /// Counts one round. Returns the new state when it flips.
    pub fn record(&mut self, rules: &Hysteresis, vote: Vote) -> Option<HealthState> {
        match vote {
            Vote::Abstain => None,
            Vote::Down => {
                self.down_rounds = self.down_rounds.saturating_add(1);
                self.up_rounds = 0;
                if self.state == HealthState::Up && self.down_rounds >= rules.down_after {
                    self.state = HealthState::Down;
                    return Some(HealthState::Down);
                }
                None
            }
            Vote::Up => {
                self.up_rounds = self.up_rounds.saturating_add(1);
                self.down_rounds = 0;
                if self.state == HealthState::Down && self.up_rounds >= rules.up_after {
                    self.state = HealthState::Up;
                    return Some(HealthState::Up);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(votes: &[Vote]) -> (Streak, Vec<HealthState>) {
        let rules = Hysteresis::new(2, 10);
        let mut s = Streak::default();
        let flips = votes.iter().filter_map(|v| s.record(&rules, *v)).collect();
        (s, flips)
    }

    #[test]
    fn two_down_rounds_demote_and_one_does_not() {
        assert_eq!(run(&[Vote::Down]).1, vec![]);
        assert_eq!(run(&[Vote::Down, Vote::Down]).1, vec![HealthState::Down]);
        assert_eq!(run(&[Vote::Down, Vote::Up, Vote::Down]).1, vec![]);
    }

    #[test]
    fn ten_up_rounds_recover_and_nine_do_not() {
        let mut v = vec![Vote::Down, Vote::Down];
        v.extend([Vote::Up; 9]);
        let (s, flips) = run(&v);
        assert_eq!(
            (s.state, flips),
            (HealthState::Down, vec![HealthState::Down])
        );
        v.push(Vote::Up);
        let (s, flips) = run(&v);
        assert_eq!(s.state, HealthState::Up);
        assert_eq!(flips, vec![HealthState::Down, HealthState::Up]);
    }

    #[test]
    fn no_verdict_neither_extends_nor_breaks_a_streak() {
        let (s, flips) = run(&[Vote::Down, Vote::Abstain, Vote::Abstain, Vote::Down]);
        assert_eq!(flips, vec![HealthState::Down]);
        assert_eq!(s.down_rounds, 2);
    }

    #[test]
    fn a_flapping_edge_never_moves() {
        let v: Vec<Vote> = (0..100)
            .map(|i| if i % 2 == 0 { Vote::Down } else { Vote::Up })
            .collect();
        assert_eq!(run(&v).1, vec![]);
    }

    proptest! {
        #[test]
        fn flips_only_at_the_end_of_a_long_enough_streak(
            votes in proptest::collection::vec(prop_oneof![Just(Vote::Down), Just(Vote::Up), Just(Vote::Abstain)], 0..200),
            down_after in 1u32..5,
            up_after in 1u32..12,
        ) {
            let rules = Hysteresis::new(down_after, up_after);
            let mut s = Streak::default();
            let mut counted: Vec<Vote> = Vec::new();
            for v in votes {
                let before = s.state;
                let flip = s.record(&rules, v);
                if v != Vote::Abstain { counted.push(v); }
                if let Some(to) = flip {
                    prop_assert_ne!(to, before);
                    let (want, n) = match to {
                        HealthState::Down => (Vote::Down, down_after),
                        HealthState::Up => (Vote::Up, up_after),
                    };
                    let tail = counted.iter().rev().take_while(|x| **x == want).count();
                    prop_assert!(tail >= n as usize);
                    prop_assert_eq!(tail, n as usize, "flipped later than it should");
                }
                // And it never stays put past a long enough streak.
                let (opposite, n) = match s.state {
                    HealthState::Up => (Vote::Down, down_after),
                    HealthState::Down => (Vote::Up, up_after),
                };
                let tail = counted.iter().rev().take_while(|x| **x == opposite).count();
                prop_assert!(tail < n as usize, "should have flipped");
            }
        }
    }
}
