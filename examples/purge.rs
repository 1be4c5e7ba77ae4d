//! `purge`: purge every CDN at once, or show what that would send.
//!
//! ```text
//! cargo run --example purge -- --policy examples/policy.yaml --tag product-123 --dry-run
//! FASTLY_API_TOKEN=... CLOUDFLARE_API_TOKEN=... \
//!     cargo run --example purge -- --policy examples/policy.yaml --tag product-123 --tag price-list
//! ```
//!
//! One purge fans out to every provider in the policy in parallel, each batched and paced by
//! its own documented limits (Fastly: 256 surrogate keys a request; Cloudflare: its plan's
//! items per request and requests per second). API tokens come from the environment variables
//! the policy's `token_env` fields name; they are never printed. `--fastly-api` and
//! `--cloudflare-api` point the adapters at another API address (an emulator on loopback).
//!
//! With a `shield` section in the policy, the origin shield is purged first (`PURGE` to
//! `shield.url`, or `--shield-api`) and the CDNs only with what it acknowledged: a CDN purged
//! before the shield would refill from the shield's stale copy. What the shield misses is
//! held back from every CDN (printed as `HELD`) and the purge exits 1.
//!
//! `--dry-run` sends nothing: it prints, per provider, the items, the batches and requests it
//! would get, and the least time its documented limits allow (the slowest provider's is the
//! fan-out's). Without it, the purge runs and prints, per provider, the purge ids, requests,
//! attempts and the time to its last acknowledgement, then the worst case: the window in
//! which the CDNs may disagree.
//!
//! Long lists of items (the purge's, a provider's missed ones) are summarised: the count and
//! the first few; `--verbose` prints every item.
//!
//! A purge some provider cannot do at all (by host or prefix on Fastly, a soft purge on
//! Cloudflare) is refused before anything is sent to anyone.
//!
//! Exit codes: 0 every provider acknowledged (or the dry run is possible); 1 a provider missed
//! the purge (it is named with the items it missed: demote it until it is purged); 2 usage or
//! configuration error (a token variable that is unset is named, a purge a provider cannot do).

#[path = "tools/common.rs"]
mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Parser};
use common::{FINDING, Fail, OK, ms};
use multicdn_core::policy::Policy;
use multicdn_core::{PurgeReceipt, PurgeRequest, PurgeScope};
use multicdn_providers::fanout::{FanoutError, PurgeFanout};
use multicdn_providers::http::HttpSettings;

/// Purge every CDN in the policy at once (or show what would be sent).
#[derive(Debug, Parser)]
#[command(
    name = "purge",
    version,
    group(ArgGroup::new("what").required(true).multiple(false)
        .args(["tag", "url", "host", "prefix", "everything"])),
    after_help = "Exit codes: 0 every provider acknowledged (or the dry run is possible); \
                  1 a provider missed the purge (named, with the items it missed); \
                  2 usage or configuration error (an unset token variable is named)."
)]
struct Cli {
    /// The policy file (providers, their ids and token_env variables).
    #[arg(long, value_name = "PATH")]
    policy: PathBuf,
    /// Purge a tag: a Fastly surrogate key, a Cloudflare cache tag (repeatable).
    #[arg(long, value_name = "TAG")]
    tag: Vec<String>,
    /// Purge a full URL, https://www.example.com/css/site.css (repeatable).
    #[arg(long, value_name = "URL")]
    url: Vec<String>,
    /// Purge everything under a hostname (repeatable; Cloudflare only).
    #[arg(long, value_name = "HOST")]
    host: Vec<String>,
    /// Purge a URL prefix without scheme, www.example.com/products (repeatable; Cloudflare only).
    #[arg(long, value_name = "PREFIX")]
    prefix: Vec<String>,
    /// Purge everything each provider holds for the service or zone.
    #[arg(long)]
    everything: bool,
    /// Mark stale instead of evicting, where the provider supports it.
    #[arg(long)]
    soft: bool,
    /// Print the batches, requests and ideal time per provider; send nothing.
    #[arg(long)]
    dry_run: bool,
    /// Fastly API base URL (default https://api.fastly.com).
    #[arg(long, value_name = "URL")]
    fastly_api: Option<String>,
    /// Cloudflare API base URL (default https://api.cloudflare.com/client/v4).
    #[arg(long, value_name = "URL")]
    cloudflare_api: Option<String>,
    /// Where the origin shield takes PURGE requests, instead of the policy's shield.url.
    #[arg(long, value_name = "URL")]
    shield_api: Option<String>,
    /// Each request's deadline.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = common::parse_duration)]
    timeout: Duration,
    /// List every item (the purge's, a provider's missed ones) instead of the first few.
    #[arg(long)]
    verbose: bool,
}

/// How many items a summary names before it counts the rest.
const FIRST_FEW: usize = 5;

/// `items` joined, or the first few and how many more unless `verbose`.
fn listed<S: AsRef<str>>(items: &[S], verbose: bool) -> String {
    let shown = if verbose { items.len() } else { FIRST_FEW };
    let mut out = items
        .iter()
        .take(shown)
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > shown {
        out.push_str(&format!(
            ", ... and {} more (--verbose lists them all)",
            items.len() - shown
        ));
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(code) => ExitCode::from(code),
        Err(fail) => fail.report(),
    }
}

fn request(cli: &Cli) -> PurgeRequest {
    let scope = if !cli.tag.is_empty() {
        PurgeScope::Tags(cli.tag.clone())
    } else if !cli.url.is_empty() {
        PurgeScope::Urls(cli.url.clone())
    } else if !cli.host.is_empty() {
        PurgeScope::Hosts(cli.host.clone())
    } else if !cli.prefix.is_empty() {
        PurgeScope::Prefixes(cli.prefix.clone())
    } else {
        PurgeScope::Everything
    };
    PurgeRequest {
        scope,
        soft: cli.soft,
    }
}

/// The token a provider's `token_env` names. A dry run sends nothing, so it can go on
/// without one (and says so); a real purge cannot.
fn fanout(cli: &Cli, policy: &Policy) -> Result<PurgeFanout, Fail> {
    let settings = HttpSettings::default().with_request_timeout(cli.timeout);
    common::purge_fanout(
        policy,
        &cli.policy,
        &settings,
        &common::VendorApis {
            fastly: cli.fastly_api.clone(),
            cloudflare: cli.cloudflare_api.clone(),
            shield: cli.shield_api.clone(),
        },
        cli.dry_run,
    )
}

async fn run(cli: Cli) -> Result<u8, Fail> {
    let policy = common::load_policy(&cli.policy)?;
    let request = request(&cli);
    let fanout = fanout(&cli, &policy)?;
    let kind = request.scope.kind();
    let mut items: Vec<&String> = request.scope.items().iter().collect();
    items.sort();
    items.dedup();
    common::out!(
        "purge {kind}{}{}: {}",
        if request.soft { " (soft)" } else { "" },
        if cli.dry_run { ", dry run" } else { "" },
        if items.is_empty() {
            "everything".to_owned()
        } else {
            format!("{} item(s): {}", items.len(), listed(&items, cli.verbose))
        }
    );

    if cli.dry_run {
        return dry_run(&fanout, &request, items.len());
    }
    match fanout.purge(&request).await {
        Ok(report) => {
            for r in &report.receipts {
                print_receipt(r);
            }
            common::out!(
                "worst case: {} (slowest {}); the CDNs may disagree for that long. Ideal by the documented limits: {}",
                ms(report.worst_acknowledged_in),
                report
                    .slowest
                    .as_ref()
                    .map_or("-".to_owned(), ToString::to_string),
                ms(report.ideal)
            );
            Ok(OK)
        }
        Err(FanoutError::Refused { reason, .. }) => Err(Fail::error(format!(
            "error: purge refused, nothing was sent: {reason}"
        ))),
        Err(FanoutError::Missed {
            failures,
            held,
            receipts,
            ..
        }) => {
            for r in &receipts {
                print_receipt(r);
            }
            for f in &failures {
                common::out!(
                    "{:<12} MISSED {} {}: {}",
                    f.provider.as_str(),
                    f.missed.len(),
                    f.scope,
                    f.error
                );
                if !f.missed.is_empty() {
                    common::out!(
                        "{:<12}   not purged: {}",
                        "",
                        listed(&f.missed, cli.verbose)
                    );
                }
                if let Some(a) = &f.acknowledged {
                    common::out!(
                        "{:<12}   acknowledged before failing: {} item(s), ids {}",
                        "",
                        a.items,
                        a.purge_ids.join(", ")
                    );
                }
            }
            for h in &held {
                common::out!(
                    "{:<12} HELD: not sent what the shield missed (purged before the shield, it would refill from the shield's stale copy)",
                    h.as_str()
                );
            }
            let cdns: Vec<&str> = failures
                .iter()
                .map(|f| f.provider.as_str())
                .filter(|p| fanout.shield().is_none_or(|s| s.provider().as_str() != *p))
                .collect();
            if cdns.len() < failures.len() {
                eprintln!(
                    "the origin shield missed the purge: nothing it missed was sent to the CDNs; run the purge again once the shield answers"
                );
            }
            if !cdns.is_empty() {
                eprintln!(
                    "purge missed on {}: demote {} until purged, then run the purge again",
                    cdns.join(", "),
                    if cdns.len() == 1 { "it" } else { "them" }
                );
            }
            Ok(FINDING)
        }
        Err(other) => Err(Fail::error(format!("error: {other}"))),
    }
}

fn print_receipt(r: &PurgeReceipt) {
    let ids = if r.purge_ids.is_empty() {
        "-".to_owned()
    } else {
        r.purge_ids.join(", ")
    };
    common::out!(
        "{:<12} ok: {} item(s) in {} request(s), {} attempt(s), acknowledged in {}; purge ids {ids}",
        r.provider.as_str(),
        r.items,
        r.requests,
        r.attempts,
        ms(r.acknowledged_in)
    );
}

fn dry_run(fanout: &PurgeFanout, request: &PurgeRequest, items: usize) -> Result<u8, Fail> {
    let ideal = fanout.ideal_times(request);
    let mut refused = Vec::new();
    for m in fanout.shield().into_iter().chain(fanout.members()) {
        let provider = m.provider();
        if let Err(feature) = m.pacing().check(request) {
            common::out!("{:<12} REFUSED: {feature}", provider.as_str());
            refused.push(format!("{provider}: {feature}"));
            continue;
        }
        let Some(k) = m.pacing().for_scope(&request.scope) else {
            continue;
        };
        let requests = k.requests_for(items);
        let time = ideal
            .iter()
            .find(|(p, _)| p == provider)
            .map_or(Duration::ZERO, |(_, t)| *t);
        common::out!(
            "{:<12} {} batch(es) of up to {} item(s): {requests} request(s), at least {} by its documented limits",
            provider.as_str(),
            requests,
            k.per_request,
            ms(time)
        );
    }
    if !refused.is_empty() {
        return Err(Fail::error(format!(
            "error: this purge would be refused before anything is sent: {}; purge by tags or URLs (without --soft) works on every provider",
            refused.join("; ")
        )));
    }
    let shield = fanout.shield().map(|s| s.provider());
    if let Some((slowest, _)) = ideal.iter().find(|(p, _)| Some(p) != shield) {
        common::out!(
            "ideal fan-out time: {} ({slowest} is the slowest CDN{}); nothing was sent",
            ms(fanout.ideal_time(request)),
            if shield.is_some() {
                ", after the shield"
            } else {
                ""
            }
        );
    }
    Ok(OK)
}
