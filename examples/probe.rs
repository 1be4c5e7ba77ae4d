//! `probe`: is each CDN in the policy serving the site right now?
//!
//! ```text
//! cargo run --example probe -- --policy examples/policy.yaml
//! cargo run --example probe -- --policy examples/policy.yaml --edge fastly=http://127.0.0.1:8080 --json
//! ```
//!
//! Fetches the policy's health object (`health.path`) through every provider's edge once from
//! each in-process runner, with the site's `Host` and `Cache-Control: no-cache`, and judges
//! each answer by status *and* content (a 200 carrying an error page fails). Runners are named
//! after the policy's probe regions (`--regions N` takes the first N, `--region NAME` names
//! them); here they all probe from this machine, so they stand for the runner set a
//! deployment spreads across regions. Prints one table per provider (runner, pass/fail, why,
//! status, latency, who served it) and the quorum verdict: a provider is down when at least
//! `health.quorum` runners fail it (capped at the number of runners).
//!
//! Exit codes: 0 no provider is down; 1 at least one provider failed from a quorum of
//! runners; 2 usage or configuration error (unreadable or invalid policy, a bad `--edge`).

#[path = "tools/common.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use common::{FINDING, Fail, ms};
use multicdn_core::{Clock, HealthCheck, Observation, Outcome, ProviderId, RegionId, SystemClock};
use multicdn_health::{HttpProbe, Quorum, RoundVerdict, targets_from_policy};
use serde::Serialize;

/// Probe every CDN edge the policy names, once, from in-process runners.
#[derive(Debug, Parser)]
#[command(
    name = "probe",
    version,
    after_help = "Exit codes: 0 no provider is down; 1 a provider failed from a quorum of runners; \
                  2 usage or configuration error."
)]
struct Cli {
    /// The policy file (providers, edge hosts, health section).
    #[arg(long, value_name = "PATH")]
    policy: PathBuf,
    /// Probe this provider's edge at URL instead of https://{edge_host} (repeatable).
    #[arg(long = "edge", value_name = "PROVIDER=URL", value_parser = common::parse_edge)]
    edges: Vec<(ProviderId, String)>,
    /// Use the first N of the policy's probe regions as runners.
    #[arg(long, value_name = "N", conflicts_with = "region")]
    regions: Option<usize>,
    /// Name a runner (repeatable); default: every region in the policy's health section.
    #[arg(long, value_name = "NAME")]
    region: Vec<String>,
    /// Print the observations and verdicts as JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// One provider's result.
#[derive(Debug, Serialize)]
struct ProviderResult {
    provider: ProviderId,
    url: String,
    verdict: RoundVerdict,
    observations: Vec<Observation>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(code) => ExitCode::from(code),
        Err(fail) => fail.report(),
    }
}

fn runners(cli: &Cli, policy_regions: &[RegionId]) -> Result<Vec<RegionId>, Fail> {
    if !cli.region.is_empty() {
        return cli
            .region
            .iter()
            .map(|r| {
                RegionId::new(r.as_str())
                    .map_err(|e| Fail::error(format!("error: --region {r:?}: {e}")))
            })
            .collect();
    }
    match cli.regions {
        Some(n) if n == 0 || n > policy_regions.len() => Err(Fail::error(format!(
            "error: --regions {n}: the policy's health.regions lists {} regions; choose 1 to {}",
            policy_regions.len(),
            policy_regions.len()
        ))),
        Some(n) => Ok(policy_regions[..n].to_vec()),
        None => Ok(policy_regions.to_vec()),
    }
}

async fn run(cli: Cli) -> Result<u8, Fail> {
    let policy = common::load_policy(&cli.policy)?;
    let overrides = common::overrides(&cli.edges)?;
    let targets = targets_from_policy(&policy, &overrides)
        .map_err(|e| Fail::error(format!("error: {}: {e}", cli.policy.display())))?;
    let runners = runners(&cli, &policy.health.regions)?;
    let quorum_needed = policy.health.quorum.min(runners.len()).max(1);
    let probes = runners
        .iter()
        .map(|r| {
            HttpProbe::new(r.clone())
                .map_err(|e| Fail::error(format!("error: probe for runner {r}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;

    // Every runner probes every target at once: a handful of requests.
    let mut checks = Vec::new();
    for probe in &probes {
        for target in &targets {
            checks.push(async move { probe.check(target).await });
        }
    }
    let mut by_provider: BTreeMap<ProviderId, Vec<Observation>> = BTreeMap::new();
    for result in futures::future::join_all(checks).await {
        match result {
            Ok(o) => by_provider.entry(o.provider.clone()).or_default().push(o),
            Err(e) => return Err(Fail::error(format!("error: probe could not run: {e}"))),
        }
    }

    // Everything was observed just now: a freshness window of an hour keeps every vote.
    let quorum = Quorum::new(quorum_needed, Duration::from_secs(3600));
    let now = SystemClock.now();
    let mut results = Vec::new();
    for target in &targets {
        let mut observations = by_provider.remove(&target.provider).unwrap_or_default();
        observations.sort_by(|a, b| a.runner.cmp(&b.runner));
        results.push(ProviderResult {
            provider: target.provider.clone(),
            url: target.url.clone(),
            verdict: quorum.decide(now, &observations),
            observations,
        });
    }
    let down = results.iter().filter(|r| r.verdict.is_down()).count();

    if cli.json {
        let doc = serde_json::json!({
            "quorum": quorum_needed,
            "runners": runners,
            "providers": results,
            "down": results.iter().filter(|r| r.verdict.is_down()).map(|r| &r.provider).collect::<Vec<_>>(),
        });
        match serde_json::to_string_pretty(&doc) {
            Ok(s) => common::out!("{s}"),
            Err(e) => return Err(Fail::error(format!("error: writing JSON: {e}"))),
        }
    } else {
        common::out!(
            "{} runners ({}), quorum {quorum_needed}",
            runners.len(),
            runners
                .iter()
                .map(RegionId::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        );
        for r in &results {
            print_table(r, quorum_needed);
        }
    }
    Ok(if down > 0 { FINDING } else { common::OK })
}

fn print_table(r: &ProviderResult, quorum: usize) {
    common::out!("\n{}  GET {}", r.provider, r.url);
    common::out!(
        "  {:<14} {:<6} {:>6} {:>9}  {:<22} reason",
        "runner",
        "result",
        "status",
        "latency",
        "served-by"
    );
    for o in &r.observations {
        let (result, reason) = match &o.outcome {
            Outcome::Pass => ("pass", String::new()),
            Outcome::Fail { reason } => ("FAIL", reason.to_string()),
        };
        let status = o.status.map_or("-".to_owned(), |s| s.to_string());
        let served = o
            .served_by
            .as_ref()
            .map_or("-".to_owned(), |s| s.to_string());
        common::out!(
            "  {:<14} {result:<6} {status:>6} {:>9}  {served:<22} {reason}",
            o.runner.as_str(),
            ms(o.latency)
        );
    }
    let passing = r.observations.iter().filter(|o| o.passed()).count();
    let total = r.observations.len();
    let verdict = match &r.verdict {
        RoundVerdict::Down { failing, .. } => format!(
            "DOWN: {} of {total} runners fail it (quorum {quorum}): {}",
            failing.len(),
            failing
                .iter()
                .map(RegionId::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        RoundVerdict::Up { .. } => {
            format!("up: {passing} of {total} runners pass (quorum {quorum})")
        }
        _ => format!(
            "no verdict: {passing} of {total} runners pass, neither side reaches the quorum of {quorum}"
        ),
    };
    common::out!("  verdict: {} {verdict}", r.provider);
}
