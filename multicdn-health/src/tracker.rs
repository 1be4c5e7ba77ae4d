//! The health of every monitored provider: observations in, verdicts and events out.
//!
//! [`HealthTracker`] is synchronous and takes time as a parameter. It keeps each runner's newest
//! observation per provider, and at the end of each round passes them through the
//! [`Quorum`] and the [`Hysteresis`] counters. An operator's drain flag lives beside the health,
//! never inside it (pingora's `enabled` apart from `healthy`): draining a provider for
//! maintenance does not make it unhealthy, and a recovery does not undrain it.
//!
//! It emits three different events, because they mean different things to a human
//! (seed 000, section 19): [`Event::ProbeUnhappy`] for each failed observation (log it, never
//! page), [`Event::QuorumDown`] when the quorum and hysteresis agree a provider is down (page,
//! and steer away), and [`Event::Recovered`] when it has been up long enough to trust again.

use std::collections::BTreeMap;

use multicdn_core::{Event, HealthState, Observation, Outcome, ProviderId, RegionId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::config::HealthConfig;
use crate::error::HealthError;
use crate::hysteresis::{Hysteresis, Streak, Vote};
use crate::quorum::{Quorum, RoundVerdict};

/// One provider's health as the tracker keeps it, as of the last round: its streaks, verdict
/// and drain flag. The engine takes the smaller [`multicdn_core::ProviderHealth`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TrackedHealth {
    /// The health in force, after quorum and hysteresis.
    pub state: HealthState,
    /// Drained by an operator: healthy or not, it should carry no traffic. Kept apart from
    /// `state`.
    pub drained: bool,
    /// Consecutive down rounds so far.
    pub down_rounds: u32,
    /// Consecutive up rounds so far.
    pub up_rounds: u32,
    /// The last round's verdict (`None` before the first round).
    pub last_verdict: Option<RoundVerdict>,
    /// When `state` last changed (`None` if it never has).
    pub changed_at: Option<Timestamp>,
}

impl TrackedHealth {
    fn new() -> TrackedHealth {
        TrackedHealth {
            state: HealthState::Up,
            drained: false,
            down_rounds: 0,
            up_rounds: 0,
            last_verdict: None,
            changed_at: None,
        }
    }

    /// Healthy and not drained: it may carry traffic.
    pub fn in_service(&self) -> bool {
        self.state == HealthState::Up && !self.drained
    }
}

/// Every provider's health at one moment: cheap to clone and to share, serialisable for a
/// status page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[non_exhaustive]
pub struct HealthSnapshot {
    /// When the last round concluded (`None` before the first).
    pub at: Option<Timestamp>,
    /// Rounds concluded so far.
    pub rounds: u64,
    /// Each provider's health.
    pub providers: BTreeMap<ProviderId, TrackedHealth>,
}

impl HealthSnapshot {
    /// A provider's health, if it is monitored.
    pub fn get(&self, provider: &ProviderId) -> Option<&TrackedHealth> {
        self.providers.get(provider)
    }

    /// A provider's state, if it is monitored.
    pub fn state(&self, provider: &ProviderId) -> Option<HealthState> {
        self.get(provider).map(|h| h.state)
    }

    /// True when the provider is monitored and down. An unmonitored provider is not down.
    pub fn is_down(&self, provider: &ProviderId) -> bool {
        self.state(provider) == Some(HealthState::Down)
    }

    /// True when the provider is monitored, up and not drained.
    pub fn in_service(&self, provider: &ProviderId) -> bool {
        self.get(provider).is_some_and(TrackedHealth::in_service)
    }
}

#[derive(Debug, Clone)]
struct Entry {
    streak: Streak,
    drained: bool,
    last_verdict: Option<RoundVerdict>,
    changed_at: Option<Timestamp>,
    latest: BTreeMap<RegionId, Observation>,
}

/// The state machine behind the monitor, usable on its own: feed it observations from any
/// source, conclude a round, read the verdicts.
///
/// ```
/// use std::time::Duration;
/// use multicdn_core::{Event, FailReason, HealthState, Observation, Outcome, ProviderId, RegionId, Timestamp};
/// use multicdn_health::{HealthConfig, HealthTracker};
///
/// let fastly = ProviderId::new("fastly")?;
/// let mut tracker = HealthTracker::new(&HealthConfig::default(), [fastly.clone()])?;
/// let now = Timestamp::from_secs(1_000);
/// for round in 0..2 {
///     for runner in ["eu-west", "us-east", "us-west"] {
///         let fail = Outcome::Fail { reason: FailReason::Status { got: 503 } };
///         let o = Observation::new(fastly.clone(), RegionId::new(runner)?, now, fail, Duration::from_millis(30));
///         tracker.observe(o)?; // a ProbeUnhappy event each
///     }
///     let events = tracker.conclude_round(now);
///     assert_eq!(events.iter().any(|e| matches!(e, Event::QuorumDown { .. })), round == 1);
/// }
/// assert_eq!(tracker.snapshot().state(&fastly), Some(HealthState::Down));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct HealthTracker {
    quorum: Quorum,
    hysteresis: Hysteresis,
    rounds: u64,
    last_round: Option<Timestamp>,
    providers: BTreeMap<ProviderId, Entry>,
}

impl HealthTracker {
    /// A tracker for `providers`, all starting up, none drained.
    pub fn new(
        config: &HealthConfig,
        providers: impl IntoIterator<Item = ProviderId>,
    ) -> Result<HealthTracker, HealthError> {
        config.validate()?;
        Ok(HealthTracker {
            quorum: Quorum::new(config.quorum, config.fresh_for),
            hysteresis: Hysteresis::new(config.down_after, config.up_after),
            rounds: 0,
            last_round: None,
            providers: providers
                .into_iter()
                .map(|p| {
                    (
                        p,
                        Entry {
                            streak: Streak::default(),
                            drained: false,
                            last_verdict: None,
                            changed_at: None,
                            latest: BTreeMap::new(),
                        },
                    )
                })
                .collect(),
        })
    }

    fn unknown(&self, provider: &ProviderId) -> HealthError {
        HealthError::UnknownProvider {
            provider: provider.clone(),
            known: self
                .providers
                .keys()
                .map(ProviderId::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    fn entry(&mut self, provider: &ProviderId) -> Result<&mut Entry, HealthError> {
        if !self.providers.contains_key(provider) {
            return Err(self.unknown(provider));
        }
        // Present, as just checked.
        self.providers
            .get_mut(provider)
            .ok_or_else(|| HealthError::UnknownProvider {
                provider: provider.clone(),
                known: String::new(),
            })
    }

    /// Records one observation, from this process or from a runner anywhere else. It replaces
    /// that runner's previous observation of the provider unless it is older. Returns a
    /// [`Event::ProbeUnhappy`] for a failed observation that was kept.
    pub fn observe(&mut self, observation: Observation) -> Result<Option<Event>, HealthError> {
        let entry = self.entry(&observation.provider)?;
        if let Some(kept) = entry.latest.get(&observation.runner)
            && kept.at > observation.at
        {
            return Ok(None);
        }
        let event = match &observation.outcome {
            Outcome::Pass => None,
            Outcome::Fail { reason } => Some(Event::ProbeUnhappy {
                provider: observation.provider.clone(),
                runner: observation.runner.clone(),
                reason: reason.clone(),
                at: observation.at,
            }),
        };
        entry.latest.insert(observation.runner.clone(), observation);
        Ok(event)
    }

    /// Ends a round at `now`: each provider's fresh observations meet in the quorum, the verdict
    /// passes through hysteresis, and a flip becomes [`Event::QuorumDown`] or
    /// [`Event::Recovered`].
    pub fn conclude_round(&mut self, now: Timestamp) -> Vec<Event> {
        let mut events = Vec::new();
        for (provider, entry) in &mut self.providers {
            // Stale observations will never vote again: drop them.
            entry.latest.retain(|_, o| self.quorum.is_fresh(o.at, now));
            let verdict = self.quorum.decide(now, entry.latest.values());
            let vote = match verdict {
                RoundVerdict::Down { .. } => Vote::Down,
                RoundVerdict::Up { .. } => Vote::Up,
                RoundVerdict::NoVerdict { .. } => Vote::Abstain,
            };
            match entry.streak.record(&self.hysteresis, vote) {
                Some(HealthState::Down) => {
                    entry.changed_at = Some(now);
                    let (failing, voting) = match &verdict {
                        RoundVerdict::Down { failing, voting } => (failing.clone(), *voting),
                        _ => (Vec::new(), verdict.voting()),
                    };
                    events.push(Event::QuorumDown {
                        provider: provider.clone(),
                        failing,
                        voting,
                        at: now,
                    });
                }
                Some(HealthState::Up) => {
                    entry.changed_at = Some(now);
                    events.push(Event::Recovered {
                        provider: provider.clone(),
                        at: now,
                    });
                }
                None => {}
            }
            entry.last_verdict = Some(verdict);
        }
        self.rounds += 1;
        self.last_round = Some(now);
        events
    }

    /// Drains (`true`) or undrains a provider. Health is untouched: a drained provider is still
    /// probed, and its verdicts still flip.
    pub fn set_drained(&mut self, provider: &ProviderId, drained: bool) -> Result<(), HealthError> {
        self.entry(provider)?.drained = drained;
        Ok(())
    }

    /// The providers, sorted.
    pub fn providers(&self) -> impl Iterator<Item = &ProviderId> {
        self.providers.keys()
    }

    /// Every provider's health now.
    pub fn snapshot(&self) -> HealthSnapshot {
        HealthSnapshot {
            at: self.last_round,
            rounds: self.rounds,
            providers: self
                .providers
                .iter()
                .map(|(p, e)| {
                    let mut h = TrackedHealth::new();
                    h.state = e.streak.state;
                    h.drained = e.drained;
                    h.down_rounds = e.streak.down_rounds;
                    h.up_rounds = e.streak.up_rounds;
                    h.last_verdict = e.last_verdict.clone();
                    h.changed_at = e.changed_at;
                    (p.clone(), h)
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multicdn_core::FailReason;
    use std::time::Duration;

    const RUNNERS: [&str; 5] = ["eu-west", "us-east", "us-west", "ap-southeast", "sa-east"];

    fn fastly() -> ProviderId {
        ProviderId::new("fastly").unwrap()
    }

    fn obs(runner: &str, pass: bool, at: Timestamp) -> Observation {
        let outcome = if pass {
            Outcome::Pass
        } else {
            Outcome::Fail {
                reason: FailReason::Timeout,
            }
        };
        Observation::new(
            fastly(),
            RegionId::new(runner).unwrap(),
            at,
            outcome,
            Duration::from_millis(50),
        )
    }

    /// One round at `t`: runners in `failing` fail, the others pass.
    fn round(t: &mut HealthTracker, at: Timestamp, failing: &[&str]) -> Vec<Event> {
        let mut events = Vec::new();
        for r in RUNNERS {
            events.extend(t.observe(obs(r, !failing.contains(&r), at)).unwrap());
        }
        events.extend(t.conclude_round(at));
        events
    }

    fn tracker() -> HealthTracker {
        HealthTracker::new(&HealthConfig::default(), [fastly()]).unwrap()
    }

    fn at(round: u64) -> Timestamp {
        Timestamp::from_secs(1_000_000 + round * 30)
    }

    #[test]
    fn one_runner_failing_forever_never_demotes_but_is_logged_each_time() {
        let mut t = tracker();
        for i in 0..50 {
            let events = round(&mut t, at(i), &["ap-southeast"]);
            assert_eq!(events.len(), 1);
            assert!(
                matches!(&events[0], Event::ProbeUnhappy { runner, .. } if runner.as_str() == "ap-southeast")
            );
        }
        assert_eq!(t.snapshot().state(&fastly()), Some(HealthState::Up));
    }

    #[test]
    fn two_bad_quorum_rounds_demote_with_the_failing_runners_named() {
        let mut t = tracker();
        let bad = ["eu-west", "us-east", "us-west"];
        let first = round(&mut t, at(0), &bad);
        assert!(
            first
                .iter()
                .all(|e| matches!(e, Event::ProbeUnhappy { .. }))
        );
        let second = round(&mut t, at(1), &bad);
        let down: Vec<&Event> = second
            .iter()
            .filter(|e| matches!(e, Event::QuorumDown { .. }))
            .collect();
        assert_eq!(down.len(), 1);
        match down[0] {
            Event::QuorumDown {
                failing,
                voting,
                at: when,
                ..
            } => {
                assert_eq!(failing.len(), 3);
                assert_eq!(*voting, 5);
                assert_eq!(*when, at(1));
            }
            _ => unreachable!(),
        }
        let snap = t.snapshot();
        assert!(snap.is_down(&fastly()));
        assert_eq!(snap.get(&fastly()).unwrap().changed_at, Some(at(1)));
    }

    #[test]
    fn ten_good_rounds_recover_and_nine_do_not() {
        let mut t = tracker();
        round(&mut t, at(0), &RUNNERS);
        round(&mut t, at(1), &RUNNERS);
        for i in 2..11 {
            assert!(round(&mut t, at(i), &[]).is_empty());
        }
        assert!(
            t.snapshot().is_down(&fastly()),
            "nine good rounds must not recover"
        );
        let events = round(&mut t, at(11), &[]);
        assert_eq!(
            events,
            vec![Event::Recovered {
                provider: fastly(),
                at: at(11)
            }]
        );
        assert!(t.snapshot().in_service(&fastly()));
    }

    #[test]
    fn an_isolated_runner_can_never_mark_a_cdn_down() {
        let mut t = tracker();
        for i in 0..20 {
            t.observe(obs("ap-southeast", false, at(i))).unwrap();
            let events = t.conclude_round(at(i));
            assert!(events.is_empty());
        }
        let snap = t.snapshot();
        assert_eq!(snap.state(&fastly()), Some(HealthState::Up));
        assert!(matches!(
            snap.get(&fastly()).unwrap().last_verdict,
            Some(RoundVerdict::NoVerdict {
                voting: 1,
                failing: 1,
                needed: 3
            })
        ));
    }

    #[test]
    fn when_runners_go_quiet_the_last_verdict_stands() {
        let mut t = tracker();
        round(&mut t, at(0), &RUNNERS);
        round(&mut t, at(1), &RUNNERS);
        assert!(t.snapshot().is_down(&fastly()));
        // Every runner goes silent for an hour: no verdict, still down, no event.
        for i in 2..120 {
            assert!(t.conclude_round(at(i)).is_empty());
        }
        let snap = t.snapshot();
        assert!(snap.is_down(&fastly()));
        assert!(matches!(
            snap.get(&fastly()).unwrap().last_verdict,
            Some(RoundVerdict::NoVerdict { voting: 0, .. })
        ));
    }

    #[test]
    fn stale_failures_stop_voting() {
        let mut t = tracker();
        // Three runners fail once, then go quiet; two keep passing.
        round(&mut t, at(0), &["eu-west", "us-east", "us-west"]);
        // 120 s later the failures are older than fresh_for (90 s): only two runners vote.
        for r in ["ap-southeast", "sa-east"] {
            t.observe(obs(r, true, at(4))).unwrap();
        }
        assert!(t.conclude_round(at(4)).is_empty());
        let snap = t.snapshot();
        let h = snap.get(&fastly()).unwrap();
        assert_eq!(h.state, HealthState::Up);
        assert!(matches!(
            h.last_verdict,
            Some(RoundVerdict::NoVerdict {
                voting: 2,
                failing: 0,
                ..
            })
        ));
        // The stale observations were dropped, not merely ignored.
        assert_eq!(t.providers[&fastly()].latest.len(), 2);
    }

    #[test]
    fn an_older_observation_does_not_replace_a_newer_one() {
        let mut t = tracker();
        t.observe(obs("eu-west", true, at(5))).unwrap();
        assert_eq!(t.observe(obs("eu-west", false, at(4))).unwrap(), None);
        assert_eq!(
            t.providers[&fastly()].latest[&RegionId::new("eu-west").unwrap()].at,
            at(5)
        );
    }

    #[test]
    fn drain_is_kept_apart_from_health() {
        let mut t = tracker();
        t.set_drained(&fastly(), true).unwrap();
        let snap = t.snapshot();
        let h = snap.get(&fastly()).unwrap();
        assert_eq!(
            (h.state, h.drained, h.in_service()),
            (HealthState::Up, true, false)
        );
        // Going down and recovering leaves the drain alone.
        round(&mut t, at(0), &RUNNERS);
        round(&mut t, at(1), &RUNNERS);
        for i in 2..12 {
            round(&mut t, at(i), &[]);
        }
        let snap = t.snapshot();
        let h = snap.get(&fastly()).unwrap();
        assert_eq!((h.state, h.drained), (HealthState::Up, true));
        t.set_drained(&fastly(), false).unwrap();
        assert!(t.snapshot().in_service(&fastly()));
    }

    #[test]
    fn observations_of_unknown_providers_are_refused_by_name() {
        let mut t = tracker();
        let mut o = obs("eu-west", false, at(0));
        o.provider = ProviderId::new("akamai").unwrap();
        let e = t.observe(o).unwrap_err().to_string();
        assert_eq!(e, "unknown provider akamai: monitored providers are fastly");
        assert!(
            t.set_drained(&ProviderId::new("akamai").unwrap(), true)
                .is_err()
        );
    }

    #[test]
    fn snapshots_serialise() {
        let mut t = tracker();
        round(&mut t, at(0), &RUNNERS);
        let json = serde_json::to_string(&t.snapshot()).unwrap();
        assert!(json.contains("\"verdict\":\"down\""), "{json}");
        let back: HealthSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t.snapshot());
    }
}
