//! [`Ns1Steerer`]: the [`Steerer`] over one NS1 record.

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;
use multicdn_core::policy::Share;
use multicdn_core::{
    ApplyOptions, Error, Policy, ProviderId, Steerer, SteeringDiff, SteeringPlan, SteeringState,
};

use super::client::{Ns1Client, provider_id};
use super::monitor::{MonitorSpec, monitor_regions};
use super::record::{Ns1Record, RecordInputs, build_record, read_state};

/// A dry run: the cohorts whose weights change (before and after), and whether the record
/// is created or rewritten at all.
#[derive(Debug, Clone, PartialEq)]
pub struct Ns1Diff {
    /// Cohort by cohort.
    pub cohorts: SteeringDiff,
    /// The record does not exist yet.
    pub create: bool,
    /// The record as it would be sent differs from the one in force.
    pub changed: bool,
    /// The record that would be sent.
    pub record: Ns1Record,
}

impl Ns1Diff {
    /// True when nothing would be sent.
    pub fn is_empty(&self) -> bool {
        !self.changed
    }
}

impl fmt::Display for Ns1Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.changed {
            return writeln!(f, "no changes");
        }
        let verb = if self.create { "create" } else { "update" };
        writeln!(f, "{verb} {} {}", self.record.domain, self.record.rtype)?;
        if self.cohorts.is_empty() {
            writeln!(
                f,
                "weights unchanged (answers, feeds, filters or regions differ)"
            )
        } else {
            write!(f, "{}", self.cohorts)
        }
    }
}

/// Steers one record through NS1 (layout in the module docs).
#[derive(Debug, Clone)]
pub struct Ns1Steerer {
    client: Ns1Client,
    record: String,
    inputs: RecordInputs,
    source_id: Option<String>,
    max_touched: Share,
}

impl Ns1Steerer {
    /// Steers `record` in `zone` to the given edge hosts.
    pub fn new(
        client: Ns1Client,
        zone: &str,
        record: &str,
        edges: BTreeMap<ProviderId, String>,
    ) -> Ns1Steerer {
        Ns1Steerer {
            client,
            record: record.trim_end_matches('.').to_ascii_lowercase(),
            inputs: RecordInputs {
                zone: zone.trim_end_matches('.').to_ascii_lowercase(),
                edges,
                feeds: BTreeMap::new(),
            },
            source_id: None,
            max_touched: Share::percent(30),
        }
    }

    /// Steers the policy's record in its zone, to its providers' edge hosts (and the static
    /// fallback's host, when the policy has one), refusing plans over its
    /// `guardrails.max_touched_per_apply`.
    pub fn from_policy(client: Ns1Client, policy: &Policy) -> Ns1Steerer {
        let edges = policy.answer_targets();
        Ns1Steerer::new(
            client,
            &policy.steering.zone,
            &policy.steering.record,
            edges,
        )
        .with_max_touched(policy.steering.guardrails.max_touched_per_apply)
    }

    /// Refuses, unless forced, a plan changing more than `share` of the cohorts in force.
    pub fn with_max_touched(mut self, share: Share) -> Ns1Steerer {
        self.max_touched = share;
        self
    }

    /// Drives answers' `up` from these feeds (by provider) on data source `source_id`.
    pub fn with_feeds(
        mut self,
        source_id: &str,
        feeds: BTreeMap<ProviderId, String>,
    ) -> Ns1Steerer {
        self.source_id = Some(source_id.to_owned());
        self.inputs.feeds = feeds;
        self
    }

    /// Makes (or finds) the data source `source_name` and one feed per provider, and drives
    /// the answers from them. Returns the feed ids.
    pub async fn provision_feeds(
        &mut self,
        source_name: &str,
    ) -> Result<BTreeMap<ProviderId, String>, Error> {
        let source = self.client.ensure_source(source_name).await?;
        let providers: Vec<ProviderId> = self.inputs.edges.keys().cloned().collect();
        let feeds = self.client.ensure_feeds(&source, &providers).await?;
        self.source_id = Some(source);
        self.inputs.feeds = feeds.clone();
        Ok(feeds)
    }

    /// One `http` monitoring job per provider from the policy's health section
    /// ([`monitor`](super::monitor)).
    pub fn monitor_specs(&self, policy: &Policy) -> Result<Vec<MonitorSpec>, Error> {
        let invalid = |message: String| Error::InvalidRequest {
            provider: provider_id(),
            message,
        };
        let regions = monitor_regions(&policy.health).map_err(invalid)?;
        self.inputs
            .edges
            .iter()
            .map(|(p, edge)| MonitorSpec::new(p.clone(), edge, &policy.health, regions.clone()))
            .collect::<Result<Vec<_>, String>>()
            .map_err(invalid)
    }

    /// Makes (or finds) one `http` monitoring job per provider from the policy's health
    /// section, with the notify list, `nsone_monitoring` data source `source_name` and feeds
    /// that carry their verdicts, and drives each provider's live answers' `up` from its
    /// job's feed. Returns the feed ids.
    pub async fn provision_monitors(
        &mut self,
        policy: &Policy,
        source_name: &str,
    ) -> Result<BTreeMap<ProviderId, String>, Error> {
        let specs = self.monitor_specs(policy)?;
        let (source, feeds) = self.client.ensure_monitors(source_name, &specs).await?;
        self.source_id = Some(source);
        self.inputs.feeds = feeds.clone();
        Ok(feeds)
    }

    /// Looks the monitors up without writing; when all are in place (as the policy says),
    /// drives the answers from their feeds and returns the feed ids, otherwise `None` (an
    /// apply would make or fix them).
    pub async fn find_monitors(
        &mut self,
        policy: &Policy,
        source_name: &str,
    ) -> Result<Option<BTreeMap<ProviderId, String>>, Error> {
        let specs = self.monitor_specs(policy)?;
        let Some((source, feeds)) = self.client.find_monitors(source_name, &specs).await? else {
            return Ok(None);
        };
        self.source_id = Some(source);
        self.inputs.feeds = feeds.clone();
        Ok(Some(feeds))
    }

    /// Marks providers up or down through their feeds, without rewriting the record.
    pub async fn set_up(&self, states: &BTreeMap<ProviderId, bool>) -> Result<(), Error> {
        let Some(source) = &self.source_id else {
            return Err(Error::InvalidRequest {
                provider: provider_id(),
                message: "no data source is configured: call provision_feeds or with_feeds first"
                    .into(),
            });
        };
        if let Some(p) = states.keys().find(|p| !self.inputs.feeds.contains_key(*p)) {
            return Err(Error::InvalidRequest {
                provider: provider_id(),
                message: format!(
                    "provider {p} has no data feed (feeds: {})",
                    self.inputs
                        .feeds
                        .keys()
                        .map(ProviderId::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        self.client.publish_up(source, states).await
    }

    fn build(&self, plan: &SteeringPlan) -> Result<Ns1Record, Error> {
        build_record(plan, &self.inputs).map_err(|message| Error::InvalidRequest {
            provider: provider_id(),
            message: format!("plan for {}: {message}", plan.record),
        })
    }

    /// The dry run: what applying `plan` would send. Fails before any request when the plan
    /// is invalid, and before any write when the record is new and the zone already holds
    /// other record types at its name (a CNAME cannot stand beside them).
    pub async fn dry_run(&self, plan: &SteeringPlan) -> Result<Ns1Diff, Error> {
        let record = self.build(plan)?;
        let existing = self
            .client
            .get_record(&record.zone, &record.domain, &record.rtype)
            .await?;
        if existing.is_none() {
            // A new CNAME: NS1 refuses one beside other types at the name; say so first.
            let types = self.client.types_at(&record.zone, &record.domain).await?;
            crate::dns::check_cname_alone(&record.domain, types.iter().map(String::as_str))
                .map_err(|message| Error::InvalidRequest {
                    provider: provider_id(),
                    message: format!("plan for {}: {message}", plan.record),
                })?;
        }
        let state = existing
            .as_ref()
            .map(|r| read_state(r, &self.inputs.edges))
            .unwrap_or_default();
        let changed = existing.as_ref().is_none_or(|e| !same_record(e, &record));
        let mut cohorts = SteeringDiff::between(&state, plan);
        if !changed {
            cohorts.changes.clear();
        }
        Ok(Ns1Diff {
            cohorts,
            create: existing.is_none(),
            changed,
            record,
        })
    }
}

fn same_record(a: &Ns1Record, b: &Ns1Record) -> bool {
    a.same_as(b)
}

#[async_trait]
impl Steerer for Ns1Steerer {
    async fn current(&self) -> Result<SteeringState, Error> {
        let record = self
            .client
            .get_record(&self.inputs.zone, &self.record, "CNAME")
            .await?;
        Ok(record
            .map(|r| read_state(&r, &self.inputs.edges))
            .unwrap_or_else(|| SteeringState {
                record: self.record.clone(),
                cohorts: Vec::new(),
            }))
    }

    async fn plan(&self, plan: &SteeringPlan) -> Result<SteeringDiff, Error> {
        Ok(self.dry_run(plan).await?.cohorts)
    }

    async fn apply(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<SteeringDiff, Error> {
        let diff = self.dry_run(plan).await?;
        if diff.is_empty() {
            return Ok(diff.cohorts);
        }
        let limit = self.max_touched.fraction();
        if !diff.create && diff.cohorts.touched_share() > limit && !options.force {
            return Err(Error::InvalidRequest {
                provider: provider_id(),
                message: format!(
                    "the plan changes {} of {} cohorts of {} ({:.0}%), more than the {:.0}% allowed (guardrails.max_touched_per_apply); review the dry run and apply with force if it is intended:\n{}",
                    diff.cohorts.changes.len(),
                    diff.cohorts.cohorts_total,
                    plan.record,
                    diff.cohorts.touched_share() * 100.0,
                    limit * 100.0,
                    diff.cohorts
                ),
            });
        }
        if diff.create {
            self.client.create_record(&diff.record).await?;
        } else {
            self.client.update_record(&diff.record).await?;
        }
        Ok(diff.cohorts)
    }
}
