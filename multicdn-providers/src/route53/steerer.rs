//! [`Route53Steerer`]: the [`Steerer`] over a hosted zone.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use multicdn_core::policy::Share;
use multicdn_core::{
    ApplyOptions, CohortChange, CohortId, Error, Policy, ProviderId, Steerer, SteeringDiff,
    SteeringPlan, SteeringState,
};

use super::changes::{RecordSetDiff, diff_sets};
use super::client::{HealthCheckLookup, Route53Client, bare_zone_id, provider_id};
use super::health::{HealthCheckSpec, policy_checks};
use super::layout::{
    LayoutInputs, RecordSet, cohort_of_pool, desired_sets, normalise_name, read_state,
};

/// Steers one record in one hosted zone through Route 53 (the layout is in the module docs).
#[derive(Debug, Clone)]
pub struct Route53Steerer {
    client: Route53Client,
    zone_id: String,
    record: String,
    inputs: LayoutInputs,
    max_touched: Share,
    sync_timeout: Duration,
    sync_poll: Duration,
    comment: String,
}

impl Route53Steerer {
    /// Steers `record` in the hosted zone `zone_id` (named `zone`), to the given edge hosts.
    pub fn new(
        client: Route53Client,
        zone_id: &str,
        zone: &str,
        record: &str,
        edges: BTreeMap<ProviderId, String>,
    ) -> Route53Steerer {
        Route53Steerer {
            client,
            zone_id: bare_zone_id(zone_id).to_owned(),
            record: normalise_name(record),
            inputs: LayoutInputs {
                zone: normalise_name(zone),
                zone_id: bare_zone_id(zone_id).to_owned(),
                edges,
                health_checks: BTreeMap::new(),
            },
            max_touched: Share::percent(30),
            sync_timeout: Duration::from_secs(300),
            sync_poll: Duration::from_secs(5),
            comment: "multicdn steering".to_owned(),
        }
    }

    /// Steers the policy's record in its zone (hosted zone `zone_id`), to its providers' edge
    /// hosts (and the static fallback's host, when the policy has one), refusing plans over its
    /// `guardrails.max_touched_per_apply`.
    pub fn from_policy(client: Route53Client, zone_id: &str, policy: &Policy) -> Route53Steerer {
        let edges = policy.answer_targets();
        Route53Steerer::new(
            client,
            zone_id,
            &policy.steering.zone,
            &policy.steering.record,
            edges,
        )
        .with_max_touched(policy.steering.guardrails.max_touched_per_apply)
    }

    /// Attaches these health checks (by provider) to the weighted sets.
    pub fn with_health_checks(mut self, checks: BTreeMap<ProviderId, String>) -> Route53Steerer {
        self.inputs.health_checks = checks;
        self
    }

    /// Refuses, unless forced, a plan touching more than `share` of the record's sets.
    pub fn with_max_touched(mut self, share: Share) -> Route53Steerer {
        self.max_touched = share;
        self
    }

    /// How long and how often to poll for `INSYNC` when asked to wait.
    pub fn with_sync_wait(mut self, timeout: Duration, poll: Duration) -> Route53Steerer {
        self.sync_timeout = timeout;
        self.sync_poll = poll;
        self
    }

    /// The hosted zone's id (without `/hostedzone/`).
    pub fn zone_id(&self) -> &str {
        &self.zone_id
    }

    /// The client.
    pub fn client(&self) -> &Route53Client {
        &self.client
    }

    /// The health checks attached, by provider.
    pub fn health_checks(&self) -> &BTreeMap<ProviderId, String> {
        &self.inputs.health_checks
    }

    /// The health check each provider gets from the policy's health section
    /// (`HTTPS_STR_MATCH` on its edge host, [`health::policy_checks`](super::health::policy_checks)).
    /// `regions`: Route 53 checker regions, or `None` to derive them from the policy's probe
    /// regions.
    pub fn health_check_specs(
        &self,
        policy: &Policy,
        regions: Option<Vec<String>>,
    ) -> Result<Vec<HealthCheckSpec>, Error> {
        policy_checks(policy, regions).map_err(|message| Error::InvalidRequest {
            provider: provider_id(),
            message,
        })
    }

    /// Provisions one `HTTPS_STR_MATCH` check per provider from the policy's health section
    /// (an existing check with the same configuration is reused), attaches them, and returns
    /// their ids. `regions`: Route 53 checker regions, or `None` to derive them from the
    /// policy's probe regions.
    pub async fn provision_health_checks(
        &mut self,
        policy: &Policy,
        regions: Option<Vec<String>>,
    ) -> Result<BTreeMap<ProviderId, String>, Error> {
        let specs = self.health_check_specs(policy, regions)?;
        let ids = self.client.provision_health_checks(&specs).await?;
        self.inputs.health_checks = ids.clone();
        Ok(ids)
    }

    /// Looks up the policy's checks without creating or changing any, attaches those that
    /// exist, and returns every lookup (for a dry run: a check missing or edited is what an
    /// apply would create or put back).
    pub async fn find_health_checks(
        &mut self,
        policy: &Policy,
        regions: Option<Vec<String>>,
    ) -> Result<Vec<HealthCheckLookup>, Error> {
        let specs = self.health_check_specs(policy, regions)?;
        let found = self.client.find_health_checks(&specs).await?;
        self.inputs.health_checks = found
            .iter()
            .filter_map(|f| Some((f.spec.provider.clone(), f.id.clone()?)))
            .collect();
        Ok(found)
    }

    /// The managed record sets in force (the record's geolocation sets and its pools).
    pub async fn record_sets(&self) -> Result<Vec<RecordSet>, Error> {
        self.client
            .list_record_sets(&self.zone_id, &self.record)
            .await
    }

    fn wanted(&self, plan: &SteeringPlan) -> Result<Vec<RecordSet>, Error> {
        desired_sets(plan, &self.inputs).map_err(|message| Error::InvalidRequest {
            provider: provider_id(),
            message: format!("plan for {}: {message}", plan.record),
        })
    }

    /// The dry run at set level: every set the plan would create, change or delete, with its
    /// weight before and after. Sends nothing that writes. An invalid plan fails before any
    /// request.
    pub async fn dry_run(&self, plan: &SteeringPlan) -> Result<RecordSetDiff, Error> {
        let wanted = self.wanted(plan)?;
        let existing = self
            .client
            .list_record_sets(&self.zone_id, &plan.record)
            .await?;
        self.diff(plan, &existing, &wanted)
    }

    fn diff(
        &self,
        plan: &SteeringPlan,
        existing: &[RecordSet],
        wanted: &[RecordSet],
    ) -> Result<RecordSetDiff, Error> {
        diff_sets(&plan.record, existing, wanted).map_err(|message| Error::InvalidRequest {
            provider: provider_id(),
            message,
        })
    }

    /// Applies `plan` and returns the set-level changes made. Refuses, unless forced, a
    /// plan touching more than the allowed share of the record's existing sets (creating a
    /// record from nothing is never refused). Batches go in order, one batch (atomic) when
    /// the changes fit.
    pub async fn apply_sets(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<RecordSetDiff, Error> {
        let wanted = self.wanted(plan)?;
        let existing = self
            .client
            .list_record_sets(&self.zone_id, &plan.record)
            .await?;
        self.apply_diff(plan, options, self.diff(plan, &existing, &wanted)?)
            .await
    }

    async fn apply_diff(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
        diff: RecordSetDiff,
    ) -> Result<RecordSetDiff, Error> {
        if diff.is_empty() {
            return Ok(diff);
        }
        let limit = self.max_touched.fraction();
        if diff.sets_before > 0 && diff.touched_share() > limit && !options.force {
            return Err(Error::InvalidRequest {
                provider: provider_id(),
                message: format!(
                    "the plan touches {} of {}'s {} sets ({:.0}%), more than the {:.0}% allowed (guardrails.max_touched_per_apply); review the dry run and apply with force if it is intended:\n{diff}",
                    diff.changes.len(),
                    plan.record,
                    diff.sets_total,
                    diff.touched_share() * 100.0,
                    limit * 100.0
                ),
            });
        }
        let batches = diff.batches();
        let count = batches.len();
        for (i, batch) in batches.into_iter().enumerate() {
            let comment = if count == 1 {
                self.comment.clone()
            } else {
                format!("{} (batch {} of {count})", self.comment, i + 1)
            };
            let info = match self
                .client
                .change_record_sets(&self.zone_id, &comment, batch)
                .await
            {
                Ok(info) => info,
                Err(e) => {
                    if i > 0 {
                        tracing::warn!(record = %plan.record, applied = i, of = count, error = %e, "a later batch failed; earlier batches are in force");
                    }
                    return Err(e);
                }
            };
            if options.wait_for_sync {
                self.client
                    .wait_in_sync(&info.id, self.sync_timeout, self.sync_poll)
                    .await?;
            }
        }
        Ok(diff)
    }

    /// The cohort-level view of a set-level diff: cohorts whose weights change, and cohorts
    /// whose sets change for other reasons (a health check, a network moved).
    fn cohort_diff(
        &self,
        state: &SteeringState,
        plan: &SteeringPlan,
        sets: &RecordSetDiff,
    ) -> SteeringDiff {
        let mut diff = SteeringDiff::between(state, plan);
        let mut touched: BTreeSet<CohortId> = BTreeSet::new();
        for c in &sets.changes {
            let mut candidates = vec![c.set.name.clone()];
            candidates.extend(c.set.target().map(str::to_owned));
            if let Some(b) = &c.before {
                candidates.extend(b.target().map(str::to_owned));
            }
            touched.extend(
                candidates
                    .iter()
                    .filter_map(|n| cohort_of_pool(n, &plan.record)),
            );
        }
        for cohort in touched {
            if diff.changes.iter().any(|c| c.cohort == cohort) {
                continue;
            }
            let before = state.cohort(&cohort).map(|c| c.weights.clone());
            let after = plan.cohort(&cohort).map(|c| c.weights.clone());
            if before.is_some() || after.is_some() {
                diff.changes.push(CohortChange {
                    cohort,
                    before,
                    after,
                });
            }
        }
        if sets.is_empty() {
            diff.changes.clear();
        }
        diff
    }
}

#[async_trait]
impl Steerer for Route53Steerer {
    async fn current(&self) -> Result<SteeringState, Error> {
        let sets = self.record_sets().await?;
        Ok(read_state(&self.record, &sets))
    }

    async fn plan(&self, plan: &SteeringPlan) -> Result<SteeringDiff, Error> {
        let wanted = self.wanted(plan)?;
        let existing = self
            .client
            .list_record_sets(&self.zone_id, &plan.record)
            .await?;
        let sets = self.diff(plan, &existing, &wanted)?;
        Ok(self.cohort_diff(&read_state(&plan.record, &existing), plan, &sets))
    }

    /// Route 53 geolocation selects by continent, country and subdivision, never by ASN.
    fn selects_asns(&self) -> bool {
        false
    }

    async fn apply(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<SteeringDiff, Error> {
        // Validated first: nothing is read or sent for an invalid plan.
        let wanted = self.wanted(plan)?;
        let existing = self
            .client
            .list_record_sets(&self.zone_id, &plan.record)
            .await?;
        let state = read_state(&plan.record, &existing);
        let sets = self
            .apply_diff(plan, options, self.diff(plan, &existing, &wanted)?)
            .await?;
        Ok(self.cohort_diff(&state, plan, &sets))
    }
}
