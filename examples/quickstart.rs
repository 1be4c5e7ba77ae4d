//! The quickstart: the whole multicdn loop on one machine, with no account and no credentials.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! Two emulated CDN edges and both vendors' purge APIs start on loopback; five probe runners,
//! synthetic users on seven networks, the scoreboard, the decision engine and the in-memory
//! steerer run a scripted day of incidents on simulated time (see `examples/scenario.rs`). It
//! prints the timeline from the journal, the dashboard (p75 TTFB by provider by country with
//! each provider's share), the loop's own health, and checks that each part of the story
//! happened. Exit 0 when they all did, 1 when one did not, 2 when it could not start.

#[path = "tools/common.rs"]
mod common;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use multicdn_examples::scenario::{self, Options, offset};
use multicdn_steering::journal::JournalFile;

/// Run the multicdn loop on loopback through a scripted incident.
#[derive(Debug, Parser)]
#[command(
    name = "quickstart",
    version,
    after_help = "Exit codes: 0 every part of the story happened, 1 a check failed, 2 it could not start."
)]
struct Cli {
    /// Simulated hours to play (the script needs at least 7).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(7..=48))]
    hours: u32,
    /// Synthetic users per network per 30-second tick (enough to fill the scoreboard's cells).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(20..=1000))]
    users: u32,
    /// Seed for the synthetic users and the steerer's choices.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Also print remeasurements (journal entries that moved nothing).
    #[arg(long)]
    verbose: bool,
    /// Write the journal as JSON lines to this file.
    #[arg(long, value_name = "PATH")]
    journal: Option<PathBuf>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let options = Options {
        hours: cli.hours,
        users_per_tick: cli.users,
        seed: cli.seed,
        verbose: cli.verbose,
    };
    common::out!(
        "multicdn quickstart: two emulated CDNs on loopback, {} simulated hours\n",
        cli.hours
    );
    let report = match scenario::run(&options).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    common::out!("== timeline (from the journal and the health events)");
    for line in &report.timeline {
        common::out!("{}  {}", offset(report.start, line.at), line.text);
    }
    common::out!("\n== dashboard: p75 TTFB by provider by country, last hour (share of requests)");
    common::out_part!("{}", report.dashboard);
    let end = report.timeline.last().map(|l| l.at).unwrap_or(report.start);
    let health = report.journal.loop_health(
        report.start,
        end,
        std::time::Duration::from_secs(4 * 3600),
        3,
    );
    common::out!("\n== loop health");
    let by_rule: Vec<String> = health
        .by_rule
        .iter()
        .map(|(rule, n)| format!("{rule:?} {n}").to_lowercase())
        .collect();
    common::out!("moves: {} ({})", health.moves, by_rule.join(", "));
    common::out!("oscillating cohorts: {}", health.oscillating.len());
    if let Some(mean) = health.mean_gain_ms {
        common::out!(
            "realized improvement: {} moves measured again after settling, mean gain {mean:.1} ms",
            health.improvements.len()
        );
    }
    let mut best = health.improvements.clone();
    best.sort_by(|a, b| b.gain_ms().total_cmp(&a.gain_ms()));
    for i in best.iter().take(3) {
        common::out!(
            "  {} moved at {}: {:.0} ms -> {:.0} ms ({:.0} ms better)",
            i.cohort,
            offset(report.start, i.moved_at),
            i.before_ms,
            i.after_ms,
            i.gain_ms()
        );
    }
    if let Some(path) = &cli.journal {
        match JournalFile::open(path).and_then(|mut f| f.append(report.journal.entries())) {
            Ok(()) => common::out!("journal written to {}", path.display()),
            Err(e) => {
                eprintln!("error: writing the journal: {e}");
                return ExitCode::from(2);
            }
        }
    }
    common::out!("\n== checks");
    for (what, ok) in &report.checks {
        common::out!("{} {what}", if *ok { "ok  " } else { "FAIL" });
    }
    if report.all_held() {
        common::out!("\nevery part of the story happened; see examples/scenario.rs for the script");
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
