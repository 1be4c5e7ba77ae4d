//! Quorum: the runners' latest fresh observations of one provider become one round's verdict.
//!
//! Pure: observations and `now` in, a [`RoundVerdict`] out. A runner votes with its newest
//! observation, and only while that observation is fresh. A provider is down when at least K
//! fresh runners fail it, and up when at least K fresh runners pass it. Anything else (too few
//! fresh runners, or a split where neither side reaches K) is no verdict, and whatever was
//! decided before stands. So an isolated runner can never mark a CDN down, however sure it is.

use std::collections::BTreeMap;
use std::time::Duration;

use multicdn_core::{Observation, RegionId, Timestamp};
use serde::{Deserialize, Serialize};

/// One round's verdict on one provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RoundVerdict {
    /// At least K fresh runners failed the provider.
    Down {
        /// The runners whose fresh observation failed, sorted.
        failing: Vec<RegionId>,
        /// Runners with a fresh observation.
        voting: usize,
    },
    /// At least K fresh runners passed the provider.
    Up {
        /// Runners whose fresh observation passed.
        passing: usize,
        /// Runners with a fresh observation.
        voting: usize,
    },
    /// Neither side reached K: too few fresh runners, or a split. The last verdict stands.
    NoVerdict {
        /// Runners with a fresh observation.
        voting: usize,
        /// Fresh runners that failed it.
        failing: usize,
        /// K: how many had to agree.
        needed: usize,
    },
}

impl RoundVerdict {
    /// True for a down verdict.
    pub fn is_down(&self) -> bool {
        matches!(self, RoundVerdict::Down { .. })
    }

    /// True for an up verdict.
    pub fn is_up(&self) -> bool {
        matches!(self, RoundVerdict::Up { .. })
    }

    /// Runners with a fresh observation.
    pub fn voting(&self) -> usize {
        match self {
            RoundVerdict::Down { voting, .. }
            | RoundVerdict::Up { voting, .. }
            | RoundVerdict::NoVerdict { voting, .. } => *voting,
        }
    }
}

/// K of N, with a freshness window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quorum {
    needed: usize,
    fresh_for: Duration,
}

impl Quorum {
    /// `needed` fresh runners must agree (at least 1); an observation votes for `fresh_for`.
    pub fn new(needed: usize, fresh_for: Duration) -> Quorum {
        Quorum {
            needed: needed.max(1),
            fresh_for,
        }
    }

    /// K.
    pub fn needed(&self) -> usize {
        self.needed
    }

    /// How long an observation votes.
    pub fn fresh_for(&self) -> Duration {
        self.fresh_for
    }

    /// Whether an observation made at `at` still votes at `now`. A runner's clock may run a
    /// little ahead: a stamp up to `fresh_for` in the future counts as fresh, one further ahead
    /// does not (it would otherwise vote for as long as that clock is wrong).
    pub fn is_fresh(&self, at: Timestamp, now: Timestamp) -> bool {
        now.since(at) <= self.fresh_for && at.since(now) <= self.fresh_for
    }

    /// The verdict at `now` from observations of one provider. Each runner votes once, with its
    /// newest observation, and only if that is fresh.
    pub fn decide<'a>(
        &self,
        now: Timestamp,
        observations: impl IntoIterator<Item = &'a Observation>,
    ) -> RoundVerdict {
        let mut newest: BTreeMap<&RegionId, &Observation> = BTreeMap::new();
        for o in observations {
            match newest.get(&o.runner) {
                Some(kept) if kept.at >= o.at => {}
                _ => {
                    newest.insert(&o.runner, o);
                }
            }
        }
        let fresh: Vec<&Observation> = newest
            .into_values()
            .filter(|o| self.is_fresh(o.at, now))
            .collect();
        let voting = fresh.len();
        let failing: Vec<RegionId> = fresh
            .iter()
            .filter(|o| !o.passed())
            .map(|o| o.runner.clone())
            .collect();
        let passing = voting - failing.len();
        if failing.len() >= self.needed {
            RoundVerdict::Down { failing, voting }
        } else if passing >= self.needed {
            RoundVerdict::Up { passing, voting }
        } else {
            RoundVerdict::NoVerdict {
                voting,
                failing: failing.len(),
                needed: self.needed,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multicdn_core::{FailReason, Outcome, ProviderId};
    use proptest::prelude::*;

    const NOW: Timestamp = Timestamp::from_secs(10_000);

    fn obs(runner: &str, pass: bool, age_s: u64) -> Observation {
        let outcome = if pass {
            Outcome::Pass
        } else {
            Outcome::Fail {
                reason: FailReason::Status { got: 503 },
            }
        };
        Observation::new(
            ProviderId::new("fastly").unwrap(),
            RegionId::new(runner).unwrap(),
            NOW - Duration::from_secs(age_s),
            outcome,
            Duration::from_millis(40),
        )
    }

    fn q() -> Quorum {
        Quorum::new(3, Duration::from_secs(90))
    }

    #[test]
    fn three_of_five_failing_is_down() {
        let o = [
            obs("eu-west", false, 1),
            obs("us-east", false, 1),
            obs("us-west", false, 1),
            obs("ap-southeast", true, 1),
            obs("sa-east", true, 1),
        ];
        let v = q().decide(NOW, &o);
        assert_eq!(
            v,
            RoundVerdict::Down {
                failing: vec![
                    RegionId::new("eu-west").unwrap(),
                    RegionId::new("us-east").unwrap(),
                    RegionId::new("us-west").unwrap()
                ],
                voting: 5
            }
        );
    }

    #[test]
    fn one_failing_runner_of_five_is_up() {
        let o = [
            obs("ap-southeast", false, 1),
            obs("eu-west", true, 1),
            obs("us-east", true, 1),
            obs("us-west", true, 1),
            obs("sa-east", true, 1),
        ];
        assert_eq!(
            q().decide(NOW, &o),
            RoundVerdict::Up {
                passing: 4,
                voting: 5
            }
        );
    }

    #[test]
    fn stale_observations_do_not_vote() {
        let o = [
            obs("eu-west", false, 91),
            obs("us-east", false, 200),
            obs("us-west", false, 1),
            obs("sa-east", false, 1),
        ];
        assert_eq!(
            q().decide(NOW, &o),
            RoundVerdict::NoVerdict {
                voting: 2,
                failing: 2,
                needed: 3
            }
        );
        // At exactly the freshness limit an observation still votes.
        let o = [
            obs("eu-west", false, 90),
            obs("us-west", false, 1),
            obs("sa-east", false, 0),
        ];
        assert!(q().decide(NOW, &o).is_down());
    }

    #[test]
    fn an_isolated_runner_has_no_verdict() {
        let o = [obs("ap-southeast", false, 0)];
        assert_eq!(
            q().decide(NOW, &o),
            RoundVerdict::NoVerdict {
                voting: 1,
                failing: 1,
                needed: 3
            }
        );
    }

    #[test]
    fn a_split_below_quorum_either_way_has_no_verdict() {
        let o = [
            obs("eu-west", false, 1),
            obs("us-east", false, 1),
            obs("us-west", true, 1),
            obs("sa-east", true, 1),
        ];
        assert!(matches!(
            q().decide(NOW, &o),
            RoundVerdict::NoVerdict { voting: 4, .. }
        ));
    }

    #[test]
    fn each_runner_votes_once_with_its_newest_observation() {
        // eu-west failed long ago and passed since: it votes pass, once.
        let o = [
            obs("eu-west", false, 30),
            obs("eu-west", true, 1),
            obs("eu-west", false, 60),
            obs("us-east", false, 1),
            obs("us-west", false, 1),
        ];
        assert_eq!(
            q().decide(NOW, &o),
            RoundVerdict::NoVerdict {
                voting: 3,
                failing: 2,
                needed: 3
            }
        );
    }

    #[test]
    fn slightly_future_stamps_are_fresh_and_far_future_ones_are_not() {
        assert!(q().is_fresh(NOW + Duration::from_secs(5), NOW));
        assert!(q().is_fresh(NOW + Duration::from_secs(90), NOW));
        assert!(!q().is_fresh(NOW + Duration::from_secs(91), NOW));
        assert!(!q().is_fresh(NOW + Duration::from_secs(86_400), NOW));
    }

    proptest! {
        #[test]
        fn down_needs_k_fresh_failures_and_up_needs_k_fresh_passes(
            votes in proptest::collection::vec((0usize..8, any::<bool>(), 0u64..200), 0..20),
            needed in 1usize..6,
        ) {
            let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
            let o: Vec<Observation> =
                votes.iter().map(|(r, pass, age)| obs(names[*r], *pass, *age)).collect();
            let quorum = Quorum::new(needed, Duration::from_secs(90));
            let v = quorum.decide(NOW, &o);
            // The same verdict computed naively: newest per runner, fresh only.
            let mut newest: BTreeMap<&str, (u64, bool)> = BTreeMap::new();
            for (r, pass, age) in &votes {
                let e = newest.entry(names[*r]).or_insert((*age, *pass));
                if *age < e.0 { *e = (*age, *pass); }
            }
            let fresh: Vec<bool> =
                newest.values().filter(|(age, _)| *age <= 90).map(|(_, p)| *p).collect();
            let fails = fresh.iter().filter(|p| !**p).count();
            let passes = fresh.len() - fails;
            prop_assert_eq!(v.voting(), fresh.len());
            prop_assert_eq!(v.is_down(), fails >= needed);
            prop_assert_eq!(v.is_up(), fails < needed && passes >= needed);
            if fresh.len() < needed {
                prop_assert!(!v.is_down() && !v.is_up());
            }
        }
    }
}
