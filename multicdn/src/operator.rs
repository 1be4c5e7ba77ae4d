//! The operator's switches: the big red switch (static mode), pins, drains and dry run, set at
//! run time, each use recorded with who asked and why.
//!
//! The policy file says what the loop does by default; an operator on call needs to change it
//! now, without a deploy: "serve the static weights", "hold AS7922 at 50/50 until the peering
//! work is done", "take fastly out", "stop applying while we look". [`Controller::operate`]
//! takes a [`Command`] with an [`Operator`] (who, why), checks it against the policy, applies it
//! from the next round, saves it with the controller's state (a restart keeps it) and keeps an
//! [`OperatorRecord`] of it beside the engine's journal.
//!
//! [`Controller::operate`]: crate::Controller::operate

use std::collections::BTreeMap;

use multicdn_core::policy::{Pin, Share};
use multicdn_core::{NetworkKey, Policy, ProviderId, Timestamp};
use serde::{Deserialize, Serialize};

/// Who asked for a switch, and why: both required, both journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operator {
    /// The person or system (`alice`, `pagerduty-runbook`).
    pub who: String,
    /// Why, in words the next person on call understands.
    pub why: String,
}

impl Operator {
    /// An operator with a reason.
    pub fn new(who: impl Into<String>, why: impl Into<String>) -> Operator {
        Operator {
            who: who.into(),
            why: why.into(),
        }
    }
}

/// One switch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Command {
    /// The big red switch: serve the policy's static weights (on) or steer again (off).
    Static {
        /// On or off.
        on: bool,
    },
    /// Pin a network to a split until a time (replaces an earlier pin of the same network).
    Pin {
        /// The network (`AS7922`, `DE`).
        network: NetworkKey,
        /// The split, summing to 100%.
        weights: BTreeMap<ProviderId, Share>,
        /// When the pin lapses.
        until: Timestamp,
    },
    /// Remove a network's pin, the operator's or the policy file's.
    Unpin {
        /// The network.
        network: NetworkKey,
    },
    /// Drain a provider (no traffic, healthy or not) or undrain it.
    Drain {
        /// The provider.
        provider: ProviderId,
        /// On or off.
        on: bool,
    },
    /// Decide and journal but apply nothing (on), or apply again (off).
    DryRun {
        /// On or off.
        on: bool,
    },
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on_off = |on: bool| if on { "on" } else { "off" };
        match self {
            Command::Static { on } => write!(f, "static mode {}", on_off(*on)),
            Command::Pin {
                network,
                weights,
                until,
            } => {
                write!(f, "pin {network} at ")?;
                for (i, (p, s)) in weights.iter().enumerate() {
                    let sep = if i == 0 { "" } else { " / " };
                    write!(f, "{sep}{p} {s}")?;
                }
                write!(f, " until {until}")
            }
            Command::Unpin { network } => write!(f, "unpin {network}"),
            Command::Drain { provider, on } => write!(f, "drain {provider} {}", on_off(*on)),
            Command::DryRun { on } => write!(f, "dry run {}", on_off(*on)),
        }
    }
}

/// A switch as used: when, by whom, why, and the round it first applies to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorRecord {
    /// When it was used.
    pub at: Timestamp,
    /// Who and why.
    pub operator: Operator,
    /// What.
    pub command: Command,
    /// The first round it applies to.
    pub from_round: u64,
}

/// A switch refused, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// `who` or `why` is empty.
    #[error("an operator switch needs who ({who:?}) and why ({why:?}); both are journaled")]
    Unattributed {
        /// As given.
        who: String,
        /// As given.
        why: String,
    },
    /// A provider the policy does not name.
    #[error("{0} is not a provider of this policy")]
    UnknownProvider(ProviderId),
    /// The pin's split is not a split of this policy's providers summing to 100%.
    #[error("the pin of {network}: {reason}")]
    BadPin {
        /// The network.
        network: NetworkKey,
        /// What is wrong.
        reason: String,
    },
    /// Nothing is pinned for that network.
    #[error("{0} is not pinned")]
    NotPinned(NetworkKey),
}

/// What the operator's switches change in the policy the engine reads. Saved with the state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Overrides {
    /// The static switch as set by an operator (`None`: as the policy says).
    #[serde(default)]
    pub static_mode: Option<bool>,
    /// Pins set by operators (on top of the policy's).
    #[serde(default)]
    pub pins: Vec<Pin>,
    /// Networks whose policy pin an operator removed.
    #[serde(default)]
    pub unpinned: Vec<NetworkKey>,
}

impl Overrides {
    /// No switch is set: the policy as written.
    pub fn is_empty(&self) -> bool {
        self.static_mode.is_none() && self.pins.is_empty() && self.unpinned.is_empty()
    }

    /// The policy with the switches applied.
    pub fn apply_to(&self, policy: &Policy) -> Policy {
        let mut p = policy.clone();
        if let Some(on) = self.static_mode {
            p.steering.guardrails.static_mode = on;
        }
        p.steering.pins.retain(|pin| {
            !self.unpinned.contains(&pin.network)
                && !self.pins.iter().any(|o| o.network == pin.network)
        });
        p.steering.pins.extend(self.pins.iter().cloned());
        p
    }

    /// Checks `command` against `policy` and, for the switches kept here, applies it.
    pub(crate) fn update(
        &mut self,
        policy: &Policy,
        command: &Command,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), OperatorError> {
        match command {
            Command::Static { on } => {
                self.static_mode = (*on != policy.steering.guardrails.static_mode).then_some(*on);
            }
            Command::Pin {
                network,
                weights,
                until,
            } => {
                let bad = |reason: String| OperatorError::BadPin {
                    network: *network,
                    reason,
                };
                if *until <= now {
                    return Err(bad(format!(
                        "it lapses at {until}, which is not after now ({now})"
                    )));
                }
                let known = policy.provider_ids();
                if let Some(p) = weights.keys().find(|p| !known.contains(p)) {
                    return Err(bad(format!("{p} is not a provider of this policy")));
                }
                let total: u64 = weights.values().map(|s| u64::from(s.bp())).sum();
                if total != 10_000 {
                    return Err(bad(format!(
                        "the split sums to {}.{:02}%, not 100%",
                        total / 100,
                        total % 100
                    )));
                }
                let pin = Pin::new(*network, weights.clone(), *until, reason);
                pin.weights().map_err(|e| bad(e.to_string()))?;
                self.pins.retain(|p| p.network != *network);
                self.unpinned.retain(|n| n != network);
                self.pins.push(pin);
            }
            Command::Unpin { network } => {
                let ours = self.pins.iter().any(|p| p.network == *network);
                let policy_pin = policy.steering.pins.iter().any(|p| p.network == *network)
                    && !self.unpinned.contains(network);
                if !ours && !policy_pin {
                    return Err(OperatorError::NotPinned(*network));
                }
                self.pins.retain(|p| p.network != *network);
                if policy_pin {
                    self.unpinned.push(*network);
                }
            }
            Command::Drain { provider, .. } => {
                if !policy.provider_ids().contains(provider) {
                    return Err(OperatorError::UnknownProvider(provider.clone()));
                }
            }
            Command::DryRun { .. } => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn policy() -> Policy {
        Policy::from_yaml(include_str!("../../examples/policy.yaml"), "policy.yaml").unwrap()
    }

    fn split(a: u32, b: u32) -> BTreeMap<ProviderId, Share> {
        [
            (ProviderId::new("fastly").unwrap(), Share::percent(a)),
            (ProviderId::new("cloudflare").unwrap(), Share::percent(b)),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn a_pin_replaces_the_policy_pin_and_unpin_removes_either() {
        let pol = policy();
        let now = Timestamp::from_millis(1_700_000_000_000);
        let net: NetworkKey = "AS7922".parse().unwrap();
        let mut o = Overrides::default();
        let until = Timestamp::from_millis(1_800_000_000_000);
        o.update(
            &pol,
            &Command::Pin {
                network: net,
                weights: split(70, 30),
                until,
            },
            "test",
            now,
        )
        .unwrap();
        let eff = o.apply_to(&pol);
        let pins: Vec<_> = eff
            .steering
            .pins
            .iter()
            .filter(|p| p.network == net)
            .collect();
        assert_eq!(pins.len(), 1);
        assert_eq!(pins[0].weights, split(70, 30));
        o.update(&pol, &Command::Unpin { network: net }, "test", now)
            .unwrap();
        assert!(
            o.apply_to(&pol)
                .steering
                .pins
                .iter()
                .all(|p| p.network != net)
        );
        assert_eq!(
            o.update(&pol, &Command::Unpin { network: net }, "test", now),
            Err(OperatorError::NotPinned(net))
        );
    }

    #[test]
    fn a_pin_must_split_the_policys_providers_to_100_percent_and_lapse_later() {
        let pol = policy();
        let now = Timestamp::from_millis(1_700_000_000_000);
        let net: NetworkKey = "DE".parse().unwrap();
        let mut o = Overrides::default();
        let later = Timestamp::from_millis(1_800_000_000_000);
        let err = o
            .update(
                &pol,
                &Command::Pin {
                    network: net,
                    weights: split(70, 20),
                    until: later,
                },
                "t",
                now,
            )
            .unwrap_err();
        assert!(err.to_string().contains("sums to 90.00%"), "{err}");
        let err = o
            .update(
                &pol,
                &Command::Pin {
                    network: net,
                    weights: split(50, 50),
                    until: now,
                },
                "t",
                now,
            )
            .unwrap_err();
        assert!(err.to_string().contains("not after now"), "{err}");
        let mut w = split(50, 50);
        w.insert(ProviderId::new("akamai").unwrap(), Share::percent(0));
        let err = o
            .update(
                &pol,
                &Command::Pin {
                    network: net,
                    weights: w,
                    until: later,
                },
                "t",
                now,
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("akamai is not a provider"),
            "{err}"
        );
        assert!(o.is_empty());
    }
}
