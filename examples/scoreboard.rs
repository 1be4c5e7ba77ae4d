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
//! `unknown` excepted), the twelve with the most samples (up to 64 names are learnt while
//! reading, later ones are counted as unknown providers).
//!
//! The input is read once, a block at a time: memory holds the scoreboard and a few MiB of
//! input whatever the input's size (a line longer than 64 KiB is counted as not JSON and
//! skipped). `--threads N` parses on N threads, each into its own shard of the scoreboard,
//! read together at the end without being merged, and the window is read on N threads too (`scripts/ingest-vs-duckdb`
//! measures both against DuckDB).
//!
//! `examples/data/beacons.ndjson` is a small sample: 300 navigation and probe beacons from six
//! networks in six countries over 50 minutes, and four deliberately bad lines.
//!
//! Exit codes: 0 at least one valid beacon; 1 no valid beacon; 2 usage or configuration error
//! (an unreadable input, policy or prefix file).

#[path = "tools/common.rs"]
mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use common::{FINDING, Fail, OK};
use multicdn_core::{Clock, NetworkKey, ProviderId, SystemClock, Timestamp};
use multicdn_examples::summary::dashboard;
use multicdn_steering::ingest::Ingestor;
use multicdn_steering::resolve::{NetworkResolver, NoResolver, PrefixTable};
use multicdn_steering::scoreboard::{Metric, Scoreboard, ScoreboardConfig, ScoreboardShards};

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
    /// Threads that parse and count (each into a shard, the shards read together at the end);
    /// 1 reads on one thread.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => ExitCode::from(code),
        Err(fail) => fail.report(),
    }
}

/// The most providers taken from the beacons themselves (one dashboard column each).
const MAX_DISCOVERED: usize = 12;

/// The most provider names learnt from the beacons while reading (the columns are the
/// [`MAX_DISCOVERED`] most frequent of them; later names count as unknown).
const MAX_LEARNT: usize = 64;

fn run(cli: Cli) -> Result<u8, Fail> {
    let policy = cli.policy.as_deref().map(common::load_policy).transpose()?;
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
    let providers: Vec<ProviderId> = policy
        .as_ref()
        .map(|p| p.provider_ids())
        .unwrap_or_default();
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
    let mut board = (0..cli.threads)
        .map(|_| Scoreboard::new(config.clone(), &providers))
        .collect::<Result<Vec<_>, _>>()
        .and_then(ScoreboardShards::new)
        .map_err(|e| Fail::error(format!("error: scoreboard: {e}")))?;

    let resolver: Arc<dyn NetworkResolver> = match &cli.prefixes {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Fail::error(format!("error: cannot read {}: {e}", path.display())))?;
            Arc::new(
                PrefixTable::from_lines_on(&text, usize::from(cli.threads))
                    .map_err(|e| Fail::error(format!("error: {}: {e}", path.display())))?,
            )
        }
        None => Arc::new(NoResolver),
    };
    // One pass over the input, in bounded memory. With --at the window ends there; without,
    // at the newest line not dated in the future, found as the lines go by.
    let ingest =
        Ingestor::new(resolver).discover_providers(if policy.is_none() { MAX_LEARNT } else { 0 });
    let mut ingest = match at {
        Some(at) => ingest.received_at(at),
        None => ingest.replay_until(SystemClock.now()),
    };
    let (name, input): (&str, std::io::Result<Box<dyn std::io::Read + Send>>) = if cli.input == "-"
    {
        ("stdin", Ok(Box::new(std::io::stdin())))
    } else {
        let file = std::fs::File::open(&cli.input);
        (
            cli.input.as_str(),
            file.map(|f| Box::new(f) as Box<dyn std::io::Read + Send>),
        )
    };
    // With --threads N, N shards read as one: their window is read without merging them.
    input
        .and_then(|input| ingest.ingest_reader_shards(input, &mut board))
        .map_err(|e| Fail::error(format!("error: cannot read {name}: {e}")))?;
    let report = ingest.take_report();
    let now = at.or(report.newest).unwrap_or(Timestamp::EPOCH);
    // The scoreboard's size is counted as the read walks its cells.
    let (snapshot, size) = board.snapshot_sized_on(now, window, usize::from(cli.threads));
    let providers: Vec<ProviderId> = if policy.is_some() {
        board.providers().to_vec()
    } else {
        // The most frequent names, by samples in the window, then by name.
        let mut seen: Vec<(u64, ProviderId)> = board
            .providers()
            .iter()
            .map(|p| {
                let n = [Metric::Ttfb, Metric::Probe]
                    .into_iter()
                    .map(|m| snapshot.cell(m, NetworkKey::Global, p).stats.samples)
                    .sum::<u64>();
                (n, p.clone())
            })
            .collect();
        seen.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let others = seen.len().saturating_sub(MAX_DISCOVERED);
        if others > 0 {
            eprintln!(
                "note: {others} more provider name(s) in the beacons are not shown: the dashboard shows the {MAX_DISCOVERED} most frequent, and names past the first {MAX_LEARNT} are counted as unknown providers (name them with --policy)"
            );
        }
        let mut top: Vec<ProviderId> = seen
            .into_iter()
            .take(MAX_DISCOVERED)
            .map(|(_, p)| p)
            .collect();
        top.sort();
        top
    };

    common::out!(
        "{} lines: {} beacons, {} samples ({} clamped to the plausible maximum, {} without a known network)",
        report.lines,
        report.beacons,
        report.samples,
        report.clamped,
        report.unresolved
    );
    common::out!(
        "scoreboard: {} cells in {:.1} MiB{}",
        size.cells,
        size.heap_bytes as f64 / f64::from(1u32 << 20),
        match board.shards() {
            1 => String::new(),
            n => format!(" ({n} shards)"),
        }
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
    // The process ends here: the system takes the memory back at once, where dropping the
    // board and the snapshot would free their hundreds of thousands of allocations one by one.
    std::mem::forget((board, snapshot, ingest));
    Ok(OK)
}
