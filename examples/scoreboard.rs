//! `scoreboard`: read RUM beacons (NDJSON) and print the dashboard.
//!
//! ```text
//! cargo run --example scoreboard -- examples/data/beacons.ndjson
//! cargo run --example scoreboard -- --policy examples/policy.yaml --window 30m examples/data/beacons.ndjson
//! zcat beacons.ndjson.gz | cargo run --example scoreboard -- --prefixes prefixes.txt -
//! ```
//!
//! Each line is one beacon as the receiver logged it (the shapes `multicdn_steering::ingest`
//! reads): a navigation beacon with `ttfb` and `provider`, or a probe beacon with `times` per
//! provider, each with the receiver's `at` (milliseconds since the epoch) and either the
//! client's `asn` and `country` or its `ip`, resolved with `--prefixes FILE` (lines of
//! `prefix ASN country`, like `203.0.113.0/24 AS64500 DE`).
//!
//! It prints the dashboard (p75 TTFB by provider by country over the window, with each
//! provider's share of the requests; a `*` marks a cell with fewer samples than steering needs),
//! the probe beacons' p75 and availability when there are any, and what was skipped, counted
//! by reason, with the first few bad lines. The window ends at `--at`, or else at the newest
//! beacon not dated in the future (after the wall clock plus five minutes of skew); beacons
//! after the window's end (beyond that skew) or before the retention are skipped and counted.
//! Providers come from `--policy`; without one, from the beacons themselves (the client's
//! `unknown` excepted), the twelve most frequent names, the rest counted as unknown.
//!
//! `examples/data/beacons.ndjson` is a small sample: 300 navigation and probe beacons from six
//! networks in six countries over 50 minutes, and four deliberately bad lines.
//!
//! Exit codes: 0 at least one valid beacon; 1 no valid beacon; 2 usage or configuration error
//! (an unreadable input, policy or prefix file).

#[path = "tools/common.rs"]
mod common;

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use common::{FINDING, Fail, OK};
use multicdn_core::{Clock, NetworkKey, ProviderId, SystemClock, Timestamp};
use multicdn_examples::summary::dashboard;
use multicdn_steering::ingest::{DEFAULT_SKEW, Ingestor};
use multicdn_steering::resolve::{NetworkResolver, NoResolver, PrefixTable};
use multicdn_steering::scoreboard::{Metric, Scoreboard, ScoreboardConfig};

/// Ingest NDJSON RUM beacons and print p75 TTFB by provider by country.
#[derive(Debug, Parser)]
#[command(
    name = "scoreboard",
    version,
    after_help = "Exit codes: 0 at least one valid beacon; 1 no valid beacon; 2 usage or configuration error."
)]
struct Cli {
    /// The beacons, one JSON object a line; `-` reads stdin.
    #[arg(value_name = "FILE.ndjson", default_value = "-")]
    input: String,
    /// The policy file: its providers, and its rum section's window and min_samples.
    #[arg(long, value_name = "PATH")]
    policy: Option<PathBuf>,
    /// A prefix table (`prefix ASN country` a line) for beacons that carry an `ip`.
    #[arg(long, value_name = "FILE")]
    prefixes: Option<PathBuf>,
    /// The window the dashboard covers (default: the policy's rum.window, or 1h).
    #[arg(long, value_name = "DURATION", value_parser = common::parse_duration)]
    window: Option<Duration>,
    /// The end of the window, RFC 3339 (default: the newest beacon).
    #[arg(long, value_name = "TIME")]
    at: Option<String>,
    /// Samples a cell needs to steer (default: the policy's rum.min_samples, or 200).
    #[arg(long, value_name = "N")]
    min_samples: Option<u64>,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => ExitCode::from(code),
        Err(fail) => fail.report(),
    }
}

fn read_input(input: &str) -> Result<Vec<u8>, Fail> {
    let mut bytes = Vec::new();
    let read = if input == "-" {
        std::io::stdin().lock().read_to_end(&mut bytes).map(|_| ())
    } else {
        std::fs::File::open(input).and_then(|mut f| f.read_to_end(&mut bytes).map(|_| ()))
    };
    read.map_err(|e| {
        let name = if input == "-" { "stdin" } else { input };
        Fail::error(format!("error: cannot read {name}: {e}"))
    })?;
    Ok(bytes)
}

/// The most providers taken from the beacons themselves (one dashboard column each).
const MAX_DISCOVERED: usize = 12;

/// The newest `at` no later than `latest`, and the providers the lines name most often, at
/// most [`MAX_DISCOVERED`] (for runs without a policy), with how many other names were seen.
fn scan(bytes: &[u8], latest: Timestamp) -> (Option<u64>, Vec<ProviderId>, usize) {
    let mut newest = None;
    let mut names: HashMap<String, u64> = HashMap::new();
    for line in bytes.split(|b| *b == b'\n') {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(at) = v.get("at").and_then(serde_json::Value::as_u64)
            && at <= latest.as_millis()
        {
            newest = Some(newest.map_or(at, |n: u64| n.max(at)));
        }
        if let Some(p) = v.get("provider").and_then(serde_json::Value::as_str) {
            *names.entry(p.to_owned()).or_default() += 1;
        }
        if let Some(times) = v.get("times").and_then(serde_json::Value::as_object) {
            for k in times.keys() {
                *names.entry(k.clone()).or_default() += 1;
            }
        }
    }
    let mut known: Vec<(u64, ProviderId)> = names
        .iter()
        .filter(|(n, _)| n.as_str() != "unknown")
        .filter_map(|(n, c)| Some((*c, ProviderId::new(n.as_str()).ok()?)))
        .collect();
    known.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let others = known.len().saturating_sub(MAX_DISCOVERED);
    let providers = known
        .into_iter()
        .take(MAX_DISCOVERED)
        .map(|(_, p)| p)
        .collect();
    (newest, providers, others)
}

fn run(cli: Cli) -> Result<u8, Fail> {
    let policy = cli.policy.as_deref().map(common::load_policy).transpose()?;
    let bytes = read_input(&cli.input)?;
    let at = cli
        .at
        .as_deref()
        .map(|at| {
            Timestamp::parse_rfc3339(at).map_err(|e| {
                Fail::error(format!(
                    "error: --at {at:?}: {e}; write 2026-12-01T09:00:00Z"
                ))
            })
        })
        .transpose()?;
    // Lines dated after the receive time (beyond the skew) are refused: without --at, the
    // newest line that is not in the future ends the window.
    let latest = at.unwrap_or_else(|| SystemClock.now()).plus(DEFAULT_SKEW);
    let (newest, discovered, others) = scan(&bytes, latest);

    let providers: Vec<ProviderId> = match &policy {
        Some(p) => p.provider_ids(),
        None => {
            if others > 0 {
                eprintln!(
                    "note: {others} more provider name(s) in the beacons are counted as unknown providers; the dashboard shows the {MAX_DISCOVERED} most frequent (name them with --policy)"
                );
            }
            discovered
        }
    };
    let window = cli.window.unwrap_or_else(|| {
        policy
            .as_ref()
            .map_or(Duration::from_secs(3600), |p| p.steering.rum.window.get())
    });
    let min_samples = cli
        .min_samples
        .unwrap_or_else(|| policy.as_ref().map_or(200, |p| p.steering.rum.min_samples));
    let bucket = (window / 4).max(Duration::from_secs(1));
    let config = ScoreboardConfig::default()
        .bucket(bucket)
        .retention(window.max(bucket))
        .fresh_for(window.max(bucket))
        .min_samples(min_samples);
    let mut board = Scoreboard::new(config, &providers)
        .map_err(|e| Fail::error(format!("error: scoreboard: {e}")))?;

    let resolver: Arc<dyn NetworkResolver> = match &cli.prefixes {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Fail::error(format!("error: cannot read {}: {e}", path.display())))?;
            Arc::new(
                PrefixTable::from_lines(&text)
                    .map_err(|e| Fail::error(format!("error: {}: {e}", path.display())))?,
            )
        }
        None => Arc::new(NoResolver),
    };
    let now = at.unwrap_or(Timestamp::from_millis(newest.unwrap_or(0)));
    let mut ingest = Ingestor::new(resolver).received_at(now);
    ingest.ingest_bytes(&bytes, &mut board);
    let report = ingest.take_report();

    let snapshot = board.snapshot(now, window);

    common::out!(
        "{} lines: {} beacons, {} samples ({} clamped to the plausible maximum, {} without a known network)",
        report.lines,
        report.beacons,
        report.samples,
        report.clamped,
        report.unresolved
    );
    let bad = report.bad_lines();
    if bad.is_empty() {
        common::out!("skipped: none");
    } else {
        common::out!("skipped {} line(s):", report.bad_total());
        for (reason, n) in &bad {
            common::out!("  {n:>6}  {reason}");
        }
        for (line, reason, detail) in report.examples.iter().take(5) {
            common::out!("  line {line}: {reason}: {detail}");
        }
    }
    if report.beacons == 0 {
        eprintln!("no valid beacon in {}", cli.input);
        return Ok(FINDING);
    }

    common::out!(
        "\n== dashboard: p75 TTFB by provider by country, {} ending {now} (share of requests; * fewer than {min_samples} samples)",
        humantime::format_duration(window)
    );
    common::out_part!("{}", dashboard(&snapshot, Metric::Ttfb, &providers));
    let probes: u64 = providers
        .iter()
        .map(|p| {
            snapshot
                .cell(Metric::Probe, NetworkKey::Global, p)
                .stats
                .samples
        })
        .sum();
    if probes > 0 {
        common::out!("\n== probe beacons: p75 fetch time by provider by country (availability)");
        common::out_part!("{}", dashboard(&snapshot, Metric::Probe, &providers));
    }
    Ok(OK)
}
