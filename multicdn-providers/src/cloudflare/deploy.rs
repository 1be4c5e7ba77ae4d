//! Deploying the rendered rulesets to a Cloudflare zone: plan first, then apply.
//!
//! [`CloudflareDeployer::plan`] reads both entry-point rulesets
//! (`GET /zones/{zone}/rulesets/phases/{phase}/entrypoint`; 404 means none yet) and diffs every
//! rule against the rendering, by `ref`. The PUT that applies it replaces the whole rule list,
//! so rules the policy does not render (added on the console) show up as removals: the policy
//! is the single source of truth.
//!
//! [`CloudflareDeployer::apply`] needs `confirm = true`, checks that each phase's ruleset
//! version is still the one planned against, then `PUT`s the whole rule list of every phase
//! that changes. Cloudflare's envelope is read on every answer: `success:false` is an error
//! carrying every code and message.
//!
//! [`CloudflareDeployer::drift`] reads both rulesets back and reports every rule that differs
//! from the rendering (ids, versions and timestamps Cloudflare adds are not compared).
//!
//! ## Console edits
//! Every rule multicdn writes carries ` [multicdn <16 hex>]` at the end of its description:
//! the [`fingerprint`] of the rule as written. A rule whose `ref` is not `multicdn-...`
//! (added on the console), or whose fingerprint is missing or no longer matches (edited
//! there), is a console edit: the plan lists it in [`CloudflareDeployPlan::console_edits`]
//! when the PUT would overwrite or drop it, and [`CloudflareDeployer::apply_with`] refuses
//! such a plan unless forced. The mark is stripped on reading, so plans and drift compare the
//! rules alone.

use std::collections::BTreeMap;
use std::fmt;

use multicdn_core::policy::ProviderSpec;
use multicdn_core::{Error, ProviderId, ProviderKind, Secret};
use reqwest::{Method, RequestBuilder};
use serde_json::{Value, json};

use crate::http::{Answer, HttpSettings, VendorHttp, encode_segment};
use crate::render::cloudflare_rules::{CloudflareRendering, RULE_PREFIX, Rule, Ruleset, sorted};
use crate::render::plan::{
    Change, ConsoleEdit, DeployError, DeployOptions, Drift, PlannedCall, console_edits, diff,
    fingerprint,
};
use crate::spec::required_field;

/// Deploys rendered rulesets to one Cloudflare zone.
#[derive(Clone)]
pub struct CloudflareDeployer {
    id: ProviderId,
    zone_id: String,
    token: Secret,
    /// `Authorization: Bearer ...`, built once and marked sensitive.
    bearer: http::HeaderValue,
    http: VendorHttp,
}

impl fmt::Debug for CloudflareDeployer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudflareDeployer")
            .field("id", &self.id)
            .field("zone_id", &self.zone_id)
            .field("token", &self.token)
            .field("http", &self.http)
            .finish()
    }
}

/// A zone's entry-point ruleset as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct DeployedRuleset {
    /// The ruleset's id.
    pub id: Option<String>,
    /// Its version (changes on every write).
    pub version: Option<String>,
    /// Its rules keyed by `ref` (or `id:<id>` for a rule without one), in order, each
    /// description without multicdn's mark.
    pub rules: Vec<(String, Rule)>,
    /// Rules multicdn did not write as they are (added or edited outside multicdn), keyed as
    /// in `rules`, with what was found.
    pub unverified: BTreeMap<String, String>,
}

/// How the mark multicdn appends to each rule's description starts.
const MARK: &str = " [multicdn ";

fn rule_fingerprint(r: &Rule) -> String {
    let parameters = sorted(r.action_parameters.clone()).to_string();
    fingerprint(&[
        &r.reference,
        &r.description,
        &r.expression,
        &r.action,
        &parameters,
        if r.enabled { "on" } else { "off" },
    ])
}

/// The rule as multicdn writes it: its description followed by the mark.
pub fn as_written(r: &Rule) -> Rule {
    Rule {
        description: format!("{}{MARK}{}]", r.description, rule_fingerprint(r)),
        ..r.clone()
    }
}

/// `r` with multicdn's mark stripped from its description, and `None` when multicdn wrote it
/// as it is, or what was found instead.
fn read_written(mut r: Rule) -> (Rule, Option<String>) {
    if !r.reference.starts_with(RULE_PREFIX) {
        return (
            r,
            Some("added outside multicdn (its ref is not multicdn-...)".into()),
        );
    }
    let marked = r
        .description
        .strip_suffix(']')
        .and_then(|d| d.rsplit_once(MARK))
        .map(|(d, mark)| (d.to_owned(), mark.to_owned()));
    let Some((description, mark)) = marked else {
        return (
            r,
            Some("not written by multicdn (its description has no multicdn mark)".into()),
        );
    };
    r.description = description;
    if rule_fingerprint(&r) == mark {
        (r, None)
    } else {
        (
            r,
            Some("edited since multicdn wrote it (its multicdn mark no longer matches)".into()),
        )
    }
}

/// What a deploy would change in one phase.
#[derive(Debug, Clone, PartialEq)]
pub struct PhasePlan {
    /// The phase.
    pub phase: String,
    /// The deployed ruleset's version, `None` when the zone has no entry point yet.
    pub deployed_version: Option<String>,
    /// The whole rule list that will be PUT.
    pub rendered: Ruleset,
    /// Rule additions, updates and removals.
    pub changes: Vec<Change<Rule>>,
    /// Rules the PUT would overwrite or drop that multicdn did not write as they are.
    pub console_edits: Vec<ConsoleEdit>,
}

/// What a deploy would change on Cloudflare, computed before anything is written.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudflareDeployPlan {
    /// The provider.
    pub provider: ProviderId,
    /// The zone.
    pub zone_id: String,
    /// One entry per phase, cache settings first.
    pub phases: Vec<PhasePlan>,
}

impl CloudflareDeployPlan {
    /// True when the zone already runs the rendering.
    pub fn is_empty(&self) -> bool {
        self.phases.iter().all(|p| p.changes.is_empty())
    }

    /// Every console edit of every phase, keyed `phase/ref`.
    pub fn console_edits(&self) -> Vec<ConsoleEdit> {
        self.phases
            .iter()
            .flat_map(|p| {
                p.console_edits.iter().map(|e| ConsoleEdit {
                    key: format!("{}/{}", p.phase, e.key),
                    what: e.what.clone(),
                })
            })
            .collect()
    }

    /// Every write applying the plan sends, in order, as it will be sent: one PUT of the
    /// whole rule list per phase that changes. Empty when there is nothing to change.
    pub fn calls(&self) -> Vec<PlannedCall> {
        self.phases
            .iter()
            .filter(|p| !p.changes.is_empty())
            .map(|p| PlannedCall {
                method: "PUT",
                path: entrypoint_path(&self.zone_id, &p.phase),
                body: format!(
                    "json: description, {} rule(s) ({}), each marked",
                    p.rendered.rules.len(),
                    p.rendered
                        .rules
                        .iter()
                        .map(|r| r.reference.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
            .collect()
    }
}

fn entrypoint_path(zone_id: &str, phase: &str) -> String {
    format!(
        "/zones/{zone_id}/rulesets/phases/{}/entrypoint",
        encode_segment(phase)
    )
}

impl fmt::Display for CloudflareDeployPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} zone {}:", self.provider, self.zone_id)?;
        for p in &self.phases {
            let version = p
                .deployed_version
                .as_deref()
                .map_or("no entry point yet".to_owned(), |v| format!("version {v}"));
            if p.changes.is_empty() {
                write!(f, "\n  {} ({version}): unchanged", p.phase)?;
                continue;
            }
            write!(
                f,
                "\n  {} ({version}): replace the rule list, {} change(s)",
                p.phase,
                p.changes.len()
            )?;
            for c in &p.changes {
                write!(f, "\n    {}", c.to_string().replace('\n', "\n  "))?;
            }
            for e in &p.console_edits {
                write!(f, "\n    console edit, overwritten only when forced: {e}")?;
            }
        }
        Ok(())
    }
}

/// What an apply did: each phase written, with its new version.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CloudflareDeployed {
    /// `(phase, new ruleset version)` for every phase written; empty when nothing changed.
    pub written: Vec<(String, Option<String>)>,
}

impl CloudflareDeployer {
    /// A deployer for `zone_id` at `base_url` (HTTPS, or HTTP on loopback).
    pub fn new(
        id: ProviderId,
        zone_id: impl Into<String>,
        token: Secret,
        base_url: &str,
        settings: HttpSettings,
    ) -> Result<CloudflareDeployer, Error> {
        let zone_id = zone_id.into();
        super::check_zone_id(&id, &zone_id)?;
        let bearer = super::bearer_header(&id, &token)?;
        let http = VendorHttp::new(id.clone(), base_url, settings)?;
        Ok(CloudflareDeployer {
            id,
            zone_id,
            token,
            bearer,
            http,
        })
    }

    /// A deployer from the policy's provider entry (`kind: cloudflare`, `zone_id`);
    /// `base_url` overrides Cloudflare's API address.
    pub fn from_spec(
        id: ProviderId,
        spec: &ProviderSpec,
        token: Secret,
        base_url: Option<&str>,
        settings: HttpSettings,
    ) -> Result<CloudflareDeployer, Error> {
        let zone_id = required_field(
            &id,
            spec,
            ProviderKind::Cloudflare,
            "zone_id",
            spec.zone_id.as_ref(),
            "to deploy to Cloudflare",
        )?;
        CloudflareDeployer::new(
            id,
            zone_id,
            token,
            base_url.unwrap_or(super::DEFAULT_BASE_URL),
            settings,
        )
    }

    /// The provider.
    pub fn provider(&self) -> &ProviderId {
        &self.id
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, path)
            .header("Authorization", self.bearer.clone())
            .header("Accept", "application/json")
    }

    fn path(&self, phase: &str) -> String {
        entrypoint_path(&self.zone_id, phase)
    }

    /// Reads an answer's envelope: `Ok(None)` for a 404 when `missing_ok`, the `result` of a
    /// successful envelope, or the error it means.
    fn read(&self, label: &str, answer: &Answer, missing_ok: bool) -> Result<Option<Value>, Error> {
        if missing_ok && answer.status.as_u16() == 404 {
            return Ok(None);
        }
        let envelope = super::read_answer(&self.http, label, answer)?;
        Ok(Some(envelope.result.unwrap_or(Value::Null)))
    }

    /// The zone's entry-point ruleset of `phase`, `None` when it has none yet.
    pub async fn entrypoint(&self, phase: &str) -> Result<Option<DeployedRuleset>, Error> {
        let path = self.path(phase);
        let label = format!("GET {path}");
        let sent = self
            .http
            .send(
                &label,
                || self.request(Method::GET, &path),
                |a| self.read(&label, a, true),
            )
            .await?;
        sent.value
            .map(|result| self.deployed(&label, &result))
            .transpose()
    }

    fn deployed(&self, label: &str, result: &Value) -> Result<DeployedRuleset, Error> {
        let unexpected = |message: String| Error::UnexpectedResponse {
            provider: self.id.clone(),
            request: label.to_owned(),
            message,
        };
        let rules = match result.get("rules") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(rules)) => rules.clone(),
            Some(other) => return Err(unexpected(format!("rules is not a list: {other}"))),
        };
        let mut out = Vec::with_capacity(rules.len());
        let mut unverified = BTreeMap::new();
        for (i, r) in rules.iter().enumerate() {
            let text = |field: &str| r.get(field).and_then(Value::as_str).map(str::to_owned);
            let reference = text("ref");
            let key = match (&reference, text("id")) {
                (Some(reference), _) => reference.clone(),
                (None, Some(id)) => format!("id:{id}"),
                (None, None) => format!("#{i}"),
            };
            let Some(action) = text("action") else {
                return Err(unexpected(format!("rule {key} has no action")));
            };
            let Some(expression) = text("expression") else {
                return Err(unexpected(format!("rule {key} has no expression")));
            };
            let (rule, found) = read_written(Rule {
                reference: reference.unwrap_or_else(|| key.clone()),
                description: text("description").unwrap_or_default(),
                expression,
                action,
                action_parameters: r.get("action_parameters").cloned().unwrap_or(Value::Null),
                enabled: r.get("enabled").and_then(Value::as_bool).unwrap_or(true),
            });
            if let Some(what) = found {
                unverified.insert(key.clone(), what);
            }
            out.push((key, rule));
        }
        Ok(DeployedRuleset {
            id: result.get("id").and_then(Value::as_str).map(str::to_owned),
            version: result.get("version").and_then(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .or_else(|| v.as_u64().map(|n| n.to_string()))
            }),
            rules: out,
            unverified,
        })
    }

    /// What deploying `rendering` would change; reads only.
    pub async fn plan(
        &self,
        rendering: &CloudflareRendering,
    ) -> Result<CloudflareDeployPlan, Error> {
        let mut phases = Vec::new();
        for ruleset in rendering.rulesets() {
            let deployed = self.entrypoint(&ruleset.phase).await?;
            let (version, rules, unverified) = match deployed {
                Some(d) => (d.version, d.rules, d.unverified),
                None => (None, Vec::new(), BTreeMap::new()),
            };
            let changes = diff(&rules, &keyed(ruleset));
            let console_edits = console_edits(&changes, &unverified);
            phases.push(PhasePlan {
                phase: ruleset.phase.clone(),
                deployed_version: version,
                rendered: ruleset.clone(),
                changes,
                console_edits,
            });
        }
        Ok(CloudflareDeployPlan {
            provider: self.id.clone(),
            zone_id: self.zone_id.clone(),
            phases,
        })
    }

    /// Applies `plan`; `confirm` must be `true` or nothing is sent. A plan with
    /// [console edits](CloudflareDeployPlan::console_edits) is refused; see
    /// [`Self::apply_with`].
    pub async fn apply(
        &self,
        plan: &CloudflareDeployPlan,
        confirm: bool,
    ) -> Result<CloudflareDeployed, DeployError> {
        self.apply_with(plan, DeployOptions::default().confirm(confirm))
            .await
    }

    /// Applies `plan` when `options.confirm`; a plan that would overwrite or drop console
    /// edits only with `options.force`. Refusals send nothing.
    pub async fn apply_with(
        &self,
        plan: &CloudflareDeployPlan,
        options: DeployOptions,
    ) -> Result<CloudflareDeployed, DeployError> {
        if let Some(refusal) = options.refusal(&self.id, &plan.console_edits()) {
            return Err(refusal);
        }
        if plan.provider != self.id || plan.zone_id != self.zone_id {
            return Err(DeployError::PlanOutdated {
                provider: self.id.clone(),
                what: format!("the plan is for {} zone {}", plan.provider, plan.zone_id),
            });
        }
        let changing: Vec<&PhasePlan> = plan
            .phases
            .iter()
            .filter(|p| !p.changes.is_empty())
            .collect();
        // Every phase is checked before any is written.
        for p in &changing {
            let now = self.entrypoint(&p.phase).await?.and_then(|d| d.version);
            if now != p.deployed_version {
                return Err(DeployError::PlanOutdated {
                    provider: self.id.clone(),
                    what: format!(
                        "{} moved from version {} to {} since the plan",
                        p.phase,
                        p.deployed_version.as_deref().unwrap_or("(none)"),
                        now.as_deref().unwrap_or("(none)")
                    ),
                });
            }
        }
        let mut written = Vec::new();
        for p in changing {
            let path = self.path(&p.phase);
            let label = format!("PUT {path}");
            let rules: Vec<Rule> = p.rendered.rules.iter().map(as_written).collect();
            let body = json!({
                "description": "multicdn: rendered from the policy's cache section",
                "rules": rules,
            });
            let sent = self
                .http
                .send(
                    &label,
                    || self.request(Method::PUT, &path).json(&body),
                    |a| self.read(&label, a, false),
                )
                .await
                .map_err(|source| {
                    if written.is_empty() {
                        DeployError::Vendor(source)
                    } else {
                        DeployError::Partial {
                            done: written
                                .iter()
                                .map(|(phase, v): &(String, Option<String>)| {
                                    format!("{phase} (version {})", v.as_deref().unwrap_or("?"))
                                })
                                .collect::<Vec<_>>()
                                .join(", "),
                            source,
                        }
                    }
                })?;
            let version = sent
                .value
                .as_ref()
                .and_then(|r| r.get("version"))
                .and_then(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .or_else(|| v.as_u64().map(|n| n.to_string()))
                });
            written.push((p.phase.clone(), version));
        }
        Ok(CloudflareDeployed { written })
    }

    /// Every rule of both entry points that differs from `rendering`.
    pub async fn drift(&self, rendering: &CloudflareRendering) -> Result<Drift<Rule>, Error> {
        let mut differences = Vec::new();
        let mut versions = Vec::new();
        for ruleset in rendering.rulesets() {
            let deployed = self.entrypoint(&ruleset.phase).await?;
            let (version, rules) = match deployed {
                Some(d) => (d.version, d.rules),
                None => (None, Vec::new()),
            };
            versions.push(format!(
                "{} {}",
                ruleset.phase,
                version.map_or("(none)".to_owned(), |v| format!("v{v}"))
            ));
            for mut c in diff(&rules, &keyed(ruleset)) {
                c.key = format!("{}/{}", ruleset.phase, c.key);
                differences.push(c);
            }
        }
        Ok(Drift {
            provider: self.id.clone(),
            source: format!("zone {}: {}", self.zone_id, versions.join(", ")),
            differences,
            unmanaged: Vec::new(),
        })
    }
}

fn keyed(ruleset: &Ruleset) -> Vec<(String, Rule)> {
    ruleset
        .rules
        .iter()
        .map(|r| (r.reference.clone(), r.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> Rule {
        Rule {
            reference: "multicdn-cache-route-0".into(),
            description: "cache.routes[0]: ^/products/".into(),
            expression: "(starts_with(http.request.uri.path, \"/products/\"))".into(),
            action: "set_cache_settings".into(),
            action_parameters: json!({"cache": true, "edge_ttl": {"mode": "override_origin", "default": 3600}}),
            enabled: true,
        }
    }

    #[test]
    fn a_rule_as_written_reads_back_as_rendered_and_verified() {
        let r = rule();
        let w = as_written(&r);
        assert!(
            w.description
                .starts_with("cache.routes[0]: ^/products/ [multicdn ")
        );
        assert_eq!(read_written(w), (r, None));
    }

    #[test]
    fn a_rule_keeps_its_mark_whatever_order_cloudflare_lists_parameters_in() {
        let mut w = as_written(&rule());
        w.action_parameters =
            json!({"edge_ttl": {"default": 3600, "mode": "override_origin"}, "cache": true});
        assert_eq!(read_written(w).1, None);
    }

    #[test]
    fn edited_unmarked_and_foreign_rules_are_not_verified() {
        let mut edited = as_written(&rule());
        edited.action_parameters["edge_ttl"]["default"] = json!(600);
        let (back, found) = read_written(edited);
        assert_eq!(back.description, rule().description, "the mark is stripped");
        assert!(found.unwrap().contains("edited since multicdn wrote it"));
        assert!(read_written(rule()).1.unwrap().contains("no multicdn mark"));
        let foreign = Rule {
            reference: "c0ffee".into(),
            ..rule()
        };
        assert!(
            read_written(foreign)
                .1
                .unwrap()
                .contains("added outside multicdn")
        );
    }
}
