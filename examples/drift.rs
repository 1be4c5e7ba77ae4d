//! `drift`: do the CDNs serve the same thing?
//!
//! ```text
//! cargo run --example drift -- --policy examples/policy.yaml --path / --path /products/1
//! cargo run --example drift -- --policy examples/policy.yaml --path /products/1 \
//!     --edge fastly=http://127.0.0.1:8080 --edge cloudflare=http://127.0.0.1:8081 \
//!     --allow surrogate-key --allow cache-tag
//! ```
//!
//! Fetches each path through every provider's edge with the site's `Host`, without following
//! redirects, and compares statuses and headers with the first provider's (the baseline).
//! Headers that legitimately differ between CDNs (`date`, `age`, `server`, `cf-ray`,
//! `x-cache`, `server-timing`, ...) are ignored; `--allow HEADER` (or `HEADER@/path`) adds an
//! expected difference, `--ignore HEADER` ignores one more header everywhere. Every
//! difference is printed with the path, the header and both values.
//!
//! Exit codes: 0 the edges agree; 1 they differ, or a path could not be fetched through an
//! edge (so it could not be compared); 2 usage or configuration error.

#[path = "tools/common.rs"]
mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use common::{FINDING, Fail, OK};
use multicdn_core::ProviderId;
use multicdn_health::{AllowedDifference, DriftChecker, edges_from_policy};

/// Compare what every CDN edge serves for the same paths.
#[derive(Debug, Parser)]
#[command(
    name = "drift",
    version,
    after_help = "Exit codes: 0 the edges agree; 1 they differ (or a path could not be fetched through an edge); \
                  2 usage or configuration error."
)]
struct Cli {
    /// The policy file (providers, edge hosts, site host).
    #[arg(long, value_name = "PATH")]
    policy: PathBuf,
    /// A path to compare (repeatable), like /products/1.
    #[arg(long = "path", value_name = "PATH", required = true)]
    paths: Vec<String>,
    /// Fetch this provider's edge at URL instead of https://{edge_host} (repeatable).
    #[arg(long = "edge", value_name = "PROVIDER=URL", value_parser = common::parse_edge)]
    edges: Vec<(ProviderId, String)>,
    /// A header expected to differ (repeatable); HEADER@/path limits it to one path.
    #[arg(long = "allow", value_name = "HEADER[@PATH]")]
    allow: Vec<String>,
    /// A header to ignore everywhere, on top of the built-in list (repeatable).
    #[arg(long = "ignore", value_name = "HEADER")]
    ignore: Vec<String>,
    /// Each fetch's deadline.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = common::parse_duration)]
    timeout: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(code) => ExitCode::from(code),
        Err(fail) => fail.report(),
    }
}

async fn run(cli: Cli) -> Result<u8, Fail> {
    let policy = common::load_policy(&cli.policy)?;
    let overrides = common::overrides(&cli.edges)?;
    let edges = edges_from_policy(&policy, &overrides)
        .map_err(|e| Fail::error(format!("error: {}: {e}", cli.policy.display())))?;
    if edges.len() < 2 {
        return Err(Fail::error(format!(
            "error: {}: drift compares edges, and the policy names {} provider(s); it needs at least 2",
            cli.policy.display(),
            edges.len()
        )));
    }
    let mut builder = DriftChecker::builder(edges.clone())
        .host(policy.site.host.clone())
        .timeout(cli.timeout);
    for h in &cli.ignore {
        builder = builder.ignore(h);
    }
    for a in &cli.allow {
        builder = builder.allow(match a.split_once('@') {
            Some((header, path)) => AllowedDifference::header_on(header, path),
            None => AllowedDifference::header(a.as_str()),
        });
    }
    let checker = builder
        .build()
        .map_err(|e| Fail::error(format!("error: {e}")))?;
    let report = checker.check(&cli.paths).await;

    if cli.json {
        let s = serde_json::to_string_pretty(&report)
            .map_err(|e| Fail::error(format!("error: writing JSON: {e}")))?;
        common::out!("{s}");
    } else {
        let names: Vec<&str> = edges.iter().map(|e| e.provider.as_str()).collect();
        common::out!(
            "{} paths through {} (baseline {})",
            report.paths,
            names.join(", "),
            names.first().copied().unwrap_or("-")
        );
        for d in &report.differences {
            common::out!("{d}");
        }
        for f in &report.failures {
            common::out!(
                "FAILED {} through {}: {} (not compared)",
                f.path,
                f.provider,
                f.reason
            );
        }
        if report.is_clean() {
            common::out!("no drift: every edge answered alike");
        } else {
            common::out!(
                "{} difference(s), {} failed fetch(es)",
                report.differences.len(),
                report.failures.len()
            );
        }
    }
    Ok(if report.is_clean() { OK } else { FINDING })
}
