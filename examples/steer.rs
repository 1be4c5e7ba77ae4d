//! `steer`: put the policy's static steering weights into DNS (Route 53 or NS1).
//!
//! ```text
//! cargo run --example steer -- plan  --policy examples/policy.yaml --vendor route53
//! cargo run --example steer -- diff  --policy examples/policy.yaml --vendor route53 --zone-id Z123
//! cargo run --example steer -- apply --policy examples/policy.yaml --vendor ns1 --wait
//! # against an emulator on loopback (any AWS keys):
//! cargo run --example steer -- apply --policy examples/policy.yaml --vendor route53 \
//!     --endpoint http://127.0.0.1:5055 --create-zone
//! ```
//!
//! The plan is the policy's static weights (`Policy::static_plan`: every region's weights as
//! written; pins and RUM moves are the engine's business, not this tool's), the same plan the
//! deadman falls back to.
//!
//! - `plan` prints what would be written, without asking the vendor anything: for Route 53 the
//!   health checks (one `HTTPS_STR_MATCH` per provider from the policy's health section) and
//!   the record sets (geolocation aliases pointing at per-cohort pools of weighted CNAMEs, each
//!   carrying its provider's check), or the NS1 record (region groups, answers, filter chain)
//!   as JSON.
//! - `diff` reads what is in force and prints the dry run: each Route 53 health check found,
//!   missing or edited by hand (NS1: whether the monitors are in place), then every set (Route 53) or cohort (NS1) that would change,
//!   with its weight before and after. It sends nothing that writes.
//! - `apply` writes it: on Route 53 it first provisions the health checks (reusing those that
//!   exist, putting back any edited by hand), then writes the sets carrying them; on NS1 it
//!   first provisions one `http` monitoring job per provider (with the notify list, data
//!   source and feeds that carry its verdicts) and writes answers whose `up` follows them. Over a
//!   deployment of the older layout (geolocation CNAMEs chained to the pools) every set
//!   changes, so that first apply needs `--force`. A change touching more of the record than the policy's
//!   `guardrails.max_touched_per_apply` is refused unless `--force`; `--wait` waits until the
//!   vendor reports the change live (Route 53 `INSYNC`).
//!
//! Credentials: Route 53 reads `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and (if set)
//! `AWS_SESSION_TOKEN`; NS1 reads its API key from `NS1_API_KEY`. They are never printed.
//! Route 53 needs the hosted zone's id (`--zone-id`); against an emulator, `--create-zone`
//! creates a hosted zone for the policy's `steering.zone` first and prints its id.
//!
//! Exit codes: 0 done (`plan` printed, `diff` found nothing to change, `apply` applied or had
//! nothing to do); 1 `diff` found differences (like `diff(1)`, so a scheduled job can alert on
//! drift between the policy and DNS); 2 usage, configuration, credential or vendor error,
//! including a change refused by the guardrail without `--force`.

#[path = "tools/common.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use common::{FINDING, Fail, OK};
use multicdn_core::policy::Policy;
use multicdn_core::{ApplyOptions, ProviderId, Steerer, SteeringPlan};
use multicdn_providers::http::HttpSettings;
use multicdn_providers::ns1::record::{RecordInputs, build_record};
use multicdn_providers::ns1::{self, Ns1Client, Ns1Steerer};
use multicdn_providers::route53::health::policy_checks;
use multicdn_providers::route53::layout::{LayoutInputs, desired_sets};
use multicdn_providers::route53::{
    self, AwsCredentials, GeoLocation, HealthCheckSpec, RecordSet, Route53Client, Route53Steerer,
};

/// Plan, diff and apply the policy's static steering weights in Route 53 or NS1.
#[derive(Debug, Parser)]
#[command(
    name = "steer",
    version,
    after_help = "Exit codes: 0 done (diff: nothing to change); 1 diff found differences; \
                  2 usage, configuration, credential or vendor error (including a change refused without --force)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the records the plan becomes; asks the vendor nothing.
    Plan(Common),
    /// Print what applying would change against what is in force; writes nothing. Exit 1 when
    /// something would change.
    Diff(Common),
    /// Apply the plan.
    Apply(Common),
}

#[derive(Debug, Args)]
struct Common {
    /// The policy file (steering section, providers' edge hosts).
    #[arg(long, value_name = "PATH")]
    policy: PathBuf,
    /// The DNS provider.
    #[arg(long, value_enum)]
    vendor: Vendor,
    /// The vendor's API address (an emulator on loopback, say).
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// Route 53: the hosted zone id (Z0123456789ABC or /hostedzone/Z0123456789ABC).
    #[arg(long, value_name = "ID")]
    zone_id: Option<String>,
    /// Route 53: create a hosted zone for the policy's steering.zone and use it (emulators).
    #[arg(long, conflicts_with = "zone_id")]
    create_zone: bool,
    /// Apply even when the change touches more than guardrails.max_touched_per_apply.
    #[arg(long)]
    force: bool,
    /// Wait until the change is live (Route 53 INSYNC).
    #[arg(long)]
    wait: bool,
    /// Each request's deadline.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = common::parse_duration)]
    timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Vendor {
    /// Amazon Route 53.
    Route53,
    /// NS1.
    Ns1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Plan,
    Diff,
    Apply,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let (action, args) = match cli.command {
        Command::Plan(a) => (Action::Plan, a),
        Command::Diff(a) => (Action::Diff, a),
        Command::Apply(a) => (Action::Apply, a),
    };
    match run(action, args).await {
        Ok(code) => ExitCode::from(code),
        Err(fail) => fail.report(),
    }
}

fn edges(policy: &Policy) -> BTreeMap<ProviderId, String> {
    policy
        .providers
        .iter()
        .map(|(id, spec)| (id.clone(), spec.edge_host.clone()))
        .collect()
}

async fn run(action: Action, args: Common) -> Result<u8, Fail> {
    let policy = common::load_policy(&args.policy)?;
    let plan = policy.static_plan();
    common::out!(
        "static plan for {} (ttl {}s): {}",
        plan.record,
        plan.ttl.as_secs(),
        plan.cohorts
            .iter()
            .map(|c| format!("{} {}", c.cohort, c.weights))
            .collect::<Vec<_>>()
            .join("; ")
    );
    match args.vendor {
        Vendor::Route53 => route53(action, &args, &policy, &plan).await,
        Vendor::Ns1 => ns1(action, &args, &policy, &plan).await,
    }
}

fn vendor_error(e: multicdn_core::Error) -> Fail {
    Fail::error(format!("error: {e}"))
}

fn describe_set(s: &RecordSet) -> String {
    let mut line = format!("{} {}", s.name, s.rtype);
    if let Some(id) = &s.set_identifier {
        line.push_str(&format!(" [{id}]"));
    }
    match &s.geo {
        Some(GeoLocation::Continent(c)) => line.push_str(&format!(" geo continent {c}")),
        Some(GeoLocation::Country(c)) => line.push_str(&format!(" geo country {c}")),
        Some(GeoLocation::Default) => line.push_str(" geo default"),
        Some(GeoLocation::Subdivision(c, d)) => line.push_str(&format!(" geo {c}-{d}")),
        None => {}
    }
    if let Some(w) = s.weight {
        line.push_str(&format!(" weight {w}"));
    }
    if let Some(ttl) = s.ttl {
        line.push_str(&format!(" ttl {ttl}"));
    }
    match &s.alias {
        Some(a) => line.push_str(&format!(
            " alias -> {}{}",
            a.dns_name,
            if a.evaluate_target_health {
                " (evaluate target health)"
            } else {
                ""
            }
        )),
        None => line.push_str(&format!(" -> {}", s.values.join(", "))),
    }
    if let Some(hc) = &s.health_check_id {
        line.push_str(&format!(" (health check {hc})"));
    }
    line
}

/// `fastly: HTTPS_STR_MATCH example.map.fastly.net:443/_health/v3.txt contains "healthy-v3",
/// every 30s, down after 2, from eu-west-1, us-east-1, ... [multicdn-…]`.
fn describe_check(spec: &HealthCheckSpec) -> String {
    format!(
        "{}: {} {}:{}{} contains {:?}, every {}s, down after {}, from {} [{}]",
        spec.provider,
        spec.check_type.as_str(),
        spec.fqdn,
        spec.port,
        spec.resource_path,
        spec.search_string,
        spec.request_interval,
        spec.failure_threshold,
        spec.regions.join(", "),
        spec.caller_reference()
    )
}

fn health_specs(policy: &Policy, args: &Common) -> Result<Vec<HealthCheckSpec>, Fail> {
    policy_checks(policy, None).map_err(|e| {
        Fail::error(format!(
            "error: {}: Route 53 cannot check the policy's health object: {e}",
            args.policy.display()
        ))
    })
}

async fn route53(
    action: Action,
    args: &Common,
    policy: &Policy,
    plan: &SteeringPlan,
) -> Result<u8, Fail> {
    if action == Action::Plan {
        let specs = health_specs(policy, args)?;
        let inputs = LayoutInputs {
            zone: policy.steering.zone.clone(),
            zone_id: args
                .zone_id
                .as_deref()
                .map(|z| route53::bare_zone_id(z).to_owned())
                .unwrap_or_default(),
            edges: edges(policy),
            health_checks: BTreeMap::new(),
        };
        let sets = desired_sets(plan, &inputs).map_err(|e| {
            Fail::error(format!(
                "error: {}: Route 53 cannot express the plan: {e}",
                args.policy.display()
            ))
        })?;
        common::out!(
            "{} health checks (made on apply unless they exist):",
            specs.len()
        );
        for spec in &specs {
            common::out!("  {}", describe_check(spec));
        }
        common::out!("{} record sets:", sets.len());
        let provider_of = |s: &RecordSet| {
            let value = s.values.first()?;
            policy
                .providers
                .iter()
                .find(|(_, spec)| spec.edge_host.eq_ignore_ascii_case(value))
                .map(|(id, _)| id.clone())
        };
        for s in &sets {
            match provider_of(s) {
                Some(p) if s.weight.is_some() => {
                    common::out!("  {} (health check: {p}'s)", describe_set(s))
                }
                _ => common::out!("  {}", describe_set(s)),
            }
        }
        return Ok(OK);
    }
    let credentials = AwsCredentials::from_env().map_err(vendor_error)?;
    let endpoint = args
        .endpoint
        .as_deref()
        .unwrap_or(route53::DEFAULT_ENDPOINT);
    let settings = HttpSettings::default().with_request_timeout(args.timeout);
    let client = Route53Client::new(endpoint, credentials, settings).map_err(vendor_error)?;
    let zone_id = match (&args.zone_id, args.create_zone) {
        (Some(id), _) => id.clone(),
        (None, true) => {
            let reference = format!("multicdn-steer-{}", std::process::id());
            let id = client
                .create_hosted_zone(&policy.steering.zone, &reference)
                .await
                .map_err(vendor_error)?;
            common::out!("created hosted zone {} for {}", id, policy.steering.zone);
            id
        }
        (None, false) => {
            return Err(Fail::error(
                "error: Route 53 needs the hosted zone: pass --zone-id ID (or --create-zone against an emulator)",
            ));
        }
    };
    let mut steerer = Route53Steerer::from_policy(client, &zone_id, policy);
    match action {
        Action::Diff => {
            let found = steerer
                .find_health_checks(policy, None)
                .await
                .map_err(vendor_error)?;
            let mut checks_differ = false;
            for f in &found {
                let state = match (&f.id, f.differences.is_empty()) {
                    (Some(id), true) => format!("exists, {id}"),
                    (Some(id), false) => {
                        checks_differ = true;
                        format!(
                            "{id} edited since it was made ({}); apply puts it back",
                            f.differences.join("; ")
                        )
                    }
                    (None, _) => {
                        checks_differ = true;
                        "missing; apply creates it and attaches it to the provider's weighted sets"
                            .to_owned()
                    }
                };
                common::out!("health check {}: {state}", describe_check(&f.spec));
            }
            let diff = steerer.dry_run(plan).await.map_err(vendor_error)?;
            common::out_part!("{diff}");
            Ok(if diff.is_empty() && !checks_differ {
                OK
            } else {
                FINDING
            })
        }
        _ => {
            let checks = steerer
                .provision_health_checks(policy, None)
                .await
                .map_err(vendor_error)?;
            for (provider, id) in &checks {
                common::out!("health check for {provider}: {id}");
            }
            let options = ApplyOptions::default()
                .force(args.force)
                .wait_for_sync(args.wait);
            let diff = steerer
                .apply_sets(plan, &options)
                .await
                .map_err(vendor_error)?;
            if diff.is_empty() {
                common::out!("nothing to change: Route 53 already answers as the plan says");
            } else {
                common::out_part!("{diff}");
                common::out!(
                    "applied {} change(s) to zone {zone_id}{}",
                    diff.changes.len(),
                    if args.wait { " (in sync)" } else { "" }
                );
            }
            Ok(OK)
        }
    }
}

async fn ns1(
    action: Action,
    args: &Common,
    policy: &Policy,
    plan: &SteeringPlan,
) -> Result<u8, Fail> {
    if args.zone_id.is_some() || args.create_zone {
        return Err(Fail::error(
            "error: --zone-id and --create-zone are for Route 53; NS1 takes the zone from the policy's steering.zone",
        ));
    }
    if action == Action::Plan {
        let inputs = RecordInputs {
            zone: policy.steering.zone.clone(),
            edges: edges(policy),
            feeds: BTreeMap::new(),
        };
        let record = build_record(plan, &inputs).map_err(|e| {
            Fail::error(format!(
                "error: {}: NS1 cannot express the plan: {e}",
                args.policy.display()
            ))
        })?;
        let json = serde_json::to_string_pretty(&record)
            .map_err(|e| Fail::error(format!("error: writing JSON: {e}")))?;
        common::out!("{json}");
        return Ok(OK);
    }
    let endpoint = args.endpoint.as_deref().unwrap_or(ns1::DEFAULT_BASE);
    let settings = HttpSettings::default().with_request_timeout(args.timeout);
    let client = Ns1Client::from_env(endpoint, "NS1_API_KEY", settings).map_err(vendor_error)?;
    let mut steerer = Ns1Steerer::from_policy(client, policy);
    let monitors = format!("multicdn {}", policy.steering.record);
    match action {
        Action::Diff => {
            let found = steerer
                .find_monitors(policy, &monitors)
                .await
                .map_err(vendor_error)?;
            match &found {
                Some(feeds) => common::out!(
                    "monitors in place ({monitors}): {}",
                    feeds
                        .iter()
                        .map(|(p, f)| format!("{p} feed {f}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => common::out!(
                    "monitors ({monitors}) missing or not as the policy's health section says: apply makes them and drives the answers' up from them"
                ),
            }
            let diff = steerer.dry_run(plan).await.map_err(vendor_error)?;
            common::out_part!("{diff}");
            Ok(if diff.is_empty() && found.is_some() {
                OK
            } else {
                FINDING
            })
        }
        _ => {
            let options = ApplyOptions::default()
                .force(args.force)
                .wait_for_sync(args.wait);
            let feeds = steerer
                .provision_monitors(policy, &monitors)
                .await
                .map_err(vendor_error)?;
            for (provider, feed) in &feeds {
                common::out!("monitor for {provider}: feed {feed}");
            }
            let preview = steerer.dry_run(plan).await.map_err(vendor_error)?;
            if preview.is_empty() {
                common::out!("nothing to change: NS1 already answers as the plan says");
                return Ok(OK);
            }
            common::out_part!("{preview}");
            let diff = steerer.apply(plan, &options).await.map_err(vendor_error)?;
            common::out!(
                "applied {} {}: {} cohort(s) changed weights",
                preview.record.domain,
                preview.record.rtype,
                diff.changes.len()
            );
            Ok(OK)
        }
    }
}
