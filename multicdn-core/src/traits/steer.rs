use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::id::{CohortId, ProviderId};
use crate::network::{NetworkKey, Networks};
use crate::weights::Weights;

/// One cohort's answer: the networks it covers and the split they get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CohortPlan {
    /// The cohort's name (`europe`, `default`, `as7922`).
    pub cohort: CohortId,
    /// The networks it covers: countries, continents, ASNs, or `*` for the default.
    pub networks: Networks,
    /// The split.
    pub weights: Weights,
}

/// What every actuator takes: one record, its TTL, and weights per cohort.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteeringPlan {
    /// The steered name (`www.example.com`).
    pub record: String,
    /// The answers' TTL.
    #[serde(with = "crate::policy::units::duration_ms")]
    pub ttl: Duration,
    /// The cohorts, in match order; exactly one covers `*`.
    pub cohorts: Vec<CohortPlan>,
}

impl SteeringPlan {
    /// The cohort named `id`.
    pub fn cohort(&self, id: &CohortId) -> Option<&CohortPlan> {
        self.cohorts.iter().find(|c| &c.cohort == id)
    }

    /// The plan as an actuator that cannot select by network (ASN) answers it: ASNs leave
    /// every cohort's networks and a cohort left with none is dropped, so those networks'
    /// users are answered by their country's, continent's or the `*` cohort. Route 53's
    /// geolocation is such an actuator ([`Steerer::selects_asns`]).
    pub fn without_asns(&self) -> SteeringPlan {
        let cohorts = self
            .cohorts
            .iter()
            .filter_map(|c| {
                if !c.networks.iter().any(|n| matches!(n, NetworkKey::Asn(_))) {
                    return Some(c.clone());
                }
                let networks: Networks = c
                    .networks
                    .iter()
                    .filter(|n| !matches!(n, NetworkKey::Asn(_)))
                    .cloned()
                    .collect();
                (!networks.is_empty()).then(|| CohortPlan {
                    cohort: c.cohort.clone(),
                    networks,
                    weights: c.weights.clone(),
                })
            })
            .collect();
        SteeringPlan {
            record: self.record.clone(),
            ttl: self.ttl,
            cohorts,
        }
    }

    /// Every provider any cohort names, sorted and deduplicated.
    pub fn providers(&self) -> Vec<ProviderId> {
        let mut all: Vec<ProviderId> = self
            .cohorts
            .iter()
            .flat_map(|c| c.weights.providers().cloned())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Checks what the type system cannot: cohort names unique, exactly one `*` cohort, every
    /// provider in `known` (when given). Actuators call this before sending anything.
    pub fn check(&self, known: Option<&[ProviderId]>) -> Result<(), String> {
        let mut names: Vec<&CohortId> = self.cohorts.iter().map(|c| &c.cohort).collect();
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("cohort {} appears twice", w[0]));
        }
        let defaults = self
            .cohorts
            .iter()
            .filter(|c| c.networks.contains(&NetworkKey::Global))
            .count();
        if defaults != 1 {
            return Err(format!(
                "a plan needs exactly one cohort covering \"*\" (found {defaults})"
            ));
        }
        if let Some(known) = known {
            for c in &self.cohorts {
                if let Some(p) = c.weights.providers().find(|p| !known.contains(p)) {
                    return Err(format!(
                        "cohort {} names unknown provider {p} (known: {})",
                        c.cohort,
                        known
                            .iter()
                            .map(ProviderId::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The answers in force, as read back from an actuator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SteeringState {
    /// The record read.
    pub record: String,
    /// The cohorts found, with their weights as the vendor holds them.
    pub cohorts: Vec<CohortPlan>,
}

impl SteeringState {
    /// The cohort named `id`.
    pub fn cohort(&self, id: &CohortId) -> Option<&CohortPlan> {
        self.cohorts.iter().find(|c| &c.cohort == id)
    }
}

/// One cohort's change in a dry run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CohortChange {
    /// The cohort.
    pub cohort: CohortId,
    /// Weights in force (`None`: the cohort does not exist yet).
    pub before: Option<Weights>,
    /// Weights after applying (`None`: the cohort is removed).
    pub after: Option<Weights>,
}

/// What applying a plan would change, cohort by cohort. Empty means nothing to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SteeringDiff {
    /// The cohorts that change.
    pub changes: Vec<CohortChange>,
    /// How many cohorts the plan and the state hold between them.
    pub cohorts_total: usize,
}

impl SteeringDiff {
    /// Compares what is in force with a plan.
    pub fn between(state: &SteeringState, plan: &SteeringPlan) -> SteeringDiff {
        let mut changes = Vec::new();
        for c in &plan.cohorts {
            let before = state.cohort(&c.cohort).map(|s| s.weights.clone());
            if before.as_ref() != Some(&c.weights) {
                changes.push(CohortChange {
                    cohort: c.cohort.clone(),
                    before,
                    after: Some(c.weights.clone()),
                });
            }
        }
        let mut removed = 0;
        for s in &state.cohorts {
            if plan.cohort(&s.cohort).is_none() {
                removed += 1;
                changes.push(CohortChange {
                    cohort: s.cohort.clone(),
                    before: Some(s.weights.clone()),
                    after: None,
                });
            }
        }
        SteeringDiff {
            changes,
            cohorts_total: plan.cohorts.len() + removed,
        }
    }

    /// True when applying would change nothing.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The share of cohorts the change touches, 0.0 to 1.0.
    pub fn touched_share(&self) -> f64 {
        if self.cohorts_total == 0 {
            0.0
        } else {
            self.changes.len() as f64 / self.cohorts_total as f64
        }
    }
}

impl fmt::Display for SteeringDiff {
    /// One line a cohort: `~ europe: fastly 90%, cloudflare 10% -> fastly 70%, cloudflare 30%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.changes.is_empty() {
            return writeln!(f, "no changes");
        }
        for c in &self.changes {
            match (&c.before, &c.after) {
                (None, Some(a)) => writeln!(f, "+ {}: {a}", c.cohort)?,
                (Some(b), None) => writeln!(f, "- {}: {b}", c.cohort)?,
                (Some(b), Some(a)) => writeln!(f, "~ {}: {b} -> {a}", c.cohort)?,
                (None, None) => {}
            }
        }
        Ok(())
    }
}

/// How to apply a plan.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct ApplyOptions {
    /// Apply even when the plan touches more than the steerer's safety share of cohorts.
    pub force: bool,
    /// Wait until the vendor reports the change live everywhere (Route 53 `INSYNC`).
    pub wait_for_sync: bool,
}

impl ApplyOptions {
    /// Sets `force`.
    pub fn force(mut self, force: bool) -> ApplyOptions {
        self.force = force;
        self
    }

    /// Sets `wait_for_sync`.
    pub fn wait_for_sync(mut self, wait: bool) -> ApplyOptions {
        self.wait_for_sync = wait;
        self
    }
}

/// [`Steerer`] reads the answers in force and applies a steering plan. Actuators translate;
/// they never decide.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait Steerer: fmt::Debug + Send + Sync {
    /// The answers in force.
    async fn current(&self) -> Result<SteeringState, Error>;

    /// A dry run: what applying `plan` would change. Sends nothing that writes.
    async fn plan(&self, plan: &SteeringPlan) -> Result<SteeringDiff, Error> {
        let state = self.current().await?;
        Ok(SteeringDiff::between(&state, plan))
    }

    /// Applies `plan` and returns what changed.
    async fn apply(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<SteeringDiff, Error>;

    /// Whether it can answer per network (ASN). One that cannot (Route 53: geolocation only)
    /// is handed [`SteeringPlan::without_asns`] by a controller. Default: it can.
    fn selects_asns(&self) -> bool {
        true
    }
}

#[async_trait]
impl<T: Steerer + ?Sized> Steerer for Arc<T> {
    async fn current(&self) -> Result<SteeringState, Error> {
        (**self).current().await
    }
    async fn plan(&self, plan: &SteeringPlan) -> Result<SteeringDiff, Error> {
        (**self).plan(plan).await
    }
    async fn apply(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<SteeringDiff, Error> {
        (**self).apply(plan, options).await
    }
    fn selects_asns(&self) -> bool {
        (**self).selects_asns()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn cohort(name: &str, networks: &[&str], fastly: f64) -> CohortPlan {
        let f = ProviderId::new("fastly").unwrap();
        let c = ProviderId::new("cloudflare").unwrap();
        CohortPlan {
            cohort: CohortId::new(name).unwrap(),
            networks: networks.iter().map(|n| n.parse().unwrap()).collect(),
            weights: Weights::from_percentages([(f, fastly), (c, 100.0 - fastly)]).unwrap(),
        }
    }

    #[test]
    fn without_asns_drops_asn_only_cohorts_and_asns_from_mixed_ones() {
        let plan = SteeringPlan {
            record: "www.example.com".into(),
            ttl: Duration::from_secs(30),
            cohorts: vec![
                cohort("default", &["*"], 50.0),
                cohort("as7922", &["AS7922"], 10.0),
                cohort("europe", &["DE", "AS3320"], 90.0),
            ],
        };
        let geo = plan.without_asns();
        let names: Vec<&str> = geo.cohorts.iter().map(|c| c.cohort.as_str()).collect();
        assert_eq!(names, ["default", "europe"]);
        assert_eq!(
            geo.cohorts[1].networks,
            ["DE".parse::<NetworkKey>().unwrap()]
        );
        assert_eq!(geo.cohorts[1].weights, plan.cohorts[2].weights);
        assert!(geo.check(None).is_ok());
        // A plan without ASNs is its own projection.
        assert_eq!(geo.without_asns(), geo);
    }
}
