//! `warm`: fill every CDN's cache with the top URLs, one CDN after another.
//!
//! ```text
//! cargo run --example warm -- --policy examples/policy.yaml --urls top-urls.txt --rate 50
//! ```
//!
//! `--urls FILE` lists one path (`/products/1`) or full URL per line (only its path and query
//! are used; `#` starts a comment). Each path is fetched through each provider's edge with the
//! site's `Host` and `Accept-Encoding: br, gzip`, providers one after another (never together,
//! so the origin sees one CDN's misses at a time), at most `--concurrency` requests in flight
//! and `--rate` a second. A progress bar on stderr follows the run.
//!
//! Before warming, one probe round (every runner of the policy's health section, quorum as the
//! policy says) decides which providers are down; a down provider is skipped, because warming
//! through a broken edge only floods the origin. `--no-health-gate` skips the probe round.
//!
//! Exit codes: 0 every provider warmed with 2xx answers; 1 a provider was skipped as down, or
//! answered outside 2xx, or did not answer; 2 usage or configuration error.

#[path = "tools/common.rs"]
mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use common::{FINDING, Fail, OK, ms};
use indicatif::{ProgressBar, ProgressStyle};
use multicdn_core::policy::Policy;
use multicdn_core::{Clock, HealthCheck, ProviderId, SystemClock};
use multicdn_health::{
    HttpProbe, Quorum, WarmOutcome, WarmProgress, Warmer, edges_from_policy, targets_from_policy,
};

/// Warm every CDN's cache with a list of URLs, one CDN at a time.
#[derive(Debug, Parser)]
#[command(
    name = "warm",
    version,
    after_help = "Exit codes: 0 every provider warmed with 2xx answers; 1 a provider was skipped as down, \
                  or answered outside 2xx; 2 usage or configuration error."
)]
struct Cli {
    /// The policy file (providers, edge hosts, site host, health section).
    #[arg(long, value_name = "PATH")]
    policy: PathBuf,
    /// A file of paths or URLs, one a line.
    #[arg(long, value_name = "FILE")]
    urls: PathBuf,
    /// Warm this provider's edge at URL instead of https://{edge_host} (repeatable).
    #[arg(long = "edge", value_name = "PROVIDER=URL", value_parser = common::parse_edge)]
    edges: Vec<(ProviderId, String)>,
    /// Requests in flight at once per provider.
    #[arg(long, value_name = "N", default_value_t = 8)]
    concurrency: usize,
    /// At most N requests a second per provider (default: no limit).
    #[arg(long, value_name = "N")]
    rate: Option<u32>,
    /// Warm every provider without asking health first.
    #[arg(long)]
    no_health_gate: bool,
    /// Each request's deadline.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = common::parse_duration)]
    timeout: Duration,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(code) => ExitCode::from(code),
        Err(fail) => fail.report(),
    }
}

/// The paths of a URL list: a full URL gives its path and query; blank lines and comments are
/// skipped.
fn read_paths(file: &std::path::Path) -> Result<Vec<String>, Fail> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Fail::error(format!("error: cannot read {}: {e}", file.display())))?;
    let mut paths = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let path = if line.starts_with('/') {
            line.to_owned()
        } else if let Ok(url) = url::Url::parse(line) {
            match url.query() {
                Some(q) => format!("{}?{q}", url.path()),
                None => url.path().to_owned(),
            }
        } else {
            return Err(Fail::error(format!(
                "error: {}:{}: {line:?} is neither a path (/products/1) nor a URL",
                file.display(),
                n + 1
            )));
        };
        paths.push(path);
    }
    if paths.is_empty() {
        return Err(Fail::error(format!(
            "error: {} lists no URLs; write one path or URL a line",
            file.display()
        )));
    }
    Ok(paths)
}

/// One probe round from every runner of the policy; the providers a quorum fails.
async fn down_providers(
    policy: &Policy,
    overrides: &std::collections::BTreeMap<ProviderId, String>,
) -> Result<BTreeSet<ProviderId>, Fail> {
    let targets =
        targets_from_policy(policy, overrides).map_err(|e| Fail::error(format!("error: {e}")))?;
    let runners = policy.health.regions.clone();
    let probes = runners
        .iter()
        .map(|r| HttpProbe::new(r.clone()).map_err(|e| Fail::error(format!("error: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let mut checks = Vec::new();
    for probe in &probes {
        for target in &targets {
            checks.push(async move { probe.check(target).await });
        }
    }
    let mut observations = Vec::new();
    for r in futures::future::join_all(checks).await {
        observations.push(r.map_err(|e| Fail::error(format!("error: probe could not run: {e}")))?);
    }
    let quorum = Quorum::new(
        policy.health.quorum.min(runners.len()).max(1),
        Duration::from_secs(3600),
    );
    let now = SystemClock.now();
    let mut down = BTreeSet::new();
    for t in &targets {
        let mine: Vec<_> = observations
            .iter()
            .filter(|o| o.provider == t.provider)
            .collect();
        let failing = mine.iter().filter(|o| !o.passed()).count();
        if quorum.decide(now, mine.iter().copied()).is_down() {
            common::out!(
                "health: {} is down ({failing} of {} runners fail it); it will not be warmed",
                t.provider,
                mine.len()
            );
            down.insert(t.provider.clone());
        } else {
            common::out!(
                "health: {} in service ({failing} of {} runners fail it)",
                t.provider,
                mine.len()
            );
        }
    }
    Ok(down)
}

async fn run(cli: Cli) -> Result<u8, Fail> {
    let policy = common::load_policy(&cli.policy)?;
    let overrides = common::overrides(&cli.edges)?;
    let paths = read_paths(&cli.urls)?;
    let edges = edges_from_policy(&policy, &overrides)
        .map_err(|e| Fail::error(format!("error: {}: {e}", cli.policy.display())))?;
    let mut builder = Warmer::builder(edges)
        .host(policy.site.host.clone())
        .concurrency(cli.concurrency)
        .timeout(cli.timeout);
    if let Some(rate) = cli.rate {
        builder = builder.rate_per_second(rate);
    }
    let warmer = builder
        .build()
        .map_err(|e| Fail::error(format!("error: {e}")))?;
    let down = if cli.no_health_gate {
        BTreeSet::new()
    } else {
        down_providers(&policy, &overrides).await?
    };

    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} {msg}")
            .map_err(|e| Fail::error(format!("error: progress bar: {e}")))?
            .progress_chars("=> "),
    );
    let report = warmer
        .warm(
            &paths,
            |p| down.contains(p),
            |p: &WarmProgress| {
                if bar.length() != Some(p.total as u64) || bar.prefix() != p.provider.as_str() {
                    bar.reset();
                    bar.set_length(p.total as u64);
                    bar.set_prefix(p.provider.as_str().to_owned());
                    bar.set_message(format!(
                        "provider {} of {}",
                        p.provider_index + 1,
                        p.providers
                    ));
                }
                bar.set_position(p.done as u64);
            },
        )
        .await;
    bar.finish_and_clear();

    common::out!(
        "{:<12} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "provider",
        "requests",
        "non-2xx",
        "failed",
        "mean",
        "p90"
    );
    let mut finding = false;
    for p in &report.providers {
        match &p.outcome {
            WarmOutcome::Warmed(s) => {
                finding |= s.non_2xx > 0 || s.failed > 0;
                common::out!(
                    "{:<12} {:>8} {:>8} {:>8} {:>9} {:>9}",
                    p.provider.as_str(),
                    s.requests,
                    s.non_2xx,
                    s.failed,
                    ms(s.mean),
                    ms(s.p90)
                );
            }
            WarmOutcome::SkippedDown => {
                finding = true;
                common::out!(
                    "{:<12} SKIPPED: health says it is down",
                    p.provider.as_str()
                );
            }
            _ => {
                finding = true;
                common::out!("{:<12} not warmed", p.provider.as_str());
            }
        }
    }
    Ok(if finding { FINDING } else { OK })
}
