//! `shardsim`: where one controller stops keeping up past one machine.
//!
//! ```text
//! cargo run --release --example shardsim                                  # 64 shards, 10 M beacons/s
//! cargo run --release --example shardsim -- --shards 16 --networks 50000,200000
//! ```
//!
//! Sharded ingest (`multicdn::shards`) spreads the beacons over workers by network, so the
//! beacon rate is a matter of how many workers there are: each takes its shard's share. What
//! does not spread is the controller: every round it reads every shard's snapshot, merges the
//! cells into one scoreboard and decides over all of them. This program builds the scoreboards
//! the shards of such an estate hold and times the controller's part for real, on this
//! machine's one core:
//!
//! - **the estate**: `--networks` active networks (ASNs, Zipf traffic of exponent `--zipf`
//!   over 40 countries), each measured on every provider (navigation TTFB and the probe), so
//!   every network has a cell per provider and metric, each with the window's buckets (the
//!   policy's: 1 h of 15-minute buckets);
//! - **the traffic**: `--beacons-per-second` over the whole estate, a network's share by its
//!   Zipf weight; a cell's samples over the window set the size of its sketches (so the
//!   busiest cells are as big as they get in production, a thin tail stays small). The
//!   samples are log-normal around a per-network, per-provider latency;
//! - **the shards**: each network in the shard `shard_of` gives it; a shard's snapshot is its
//!   scoreboard serialised as the workers publish it;
//! - **the controller's round**: decode every shard's snapshot, merge them, then one whole
//!   [`Controller`] round on the merged scoreboard (the example policy: health in, cohorts
//!   assembled, decide, apply on an in-memory DNS, journal).
//!
//! It prints, per network count and shard count: the snapshot bytes each interval (what the
//! controller reads), the merge and the round in milliseconds, the share of the round interval
//! they take, and how many workers the beacon rate needs at `--worker-rate` (a worker's
//! measured beacons per second: see the README's figures). Where merge + round exceeds the
//! round interval, one controller no longer keeps up.
//!
//! Exit codes: 0 simulated; 2 bad flags.

#[path = "tools/common.rs"]
mod common;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use multicdn::prelude::*;
use multicdn::shards::shard_of;
use multicdn::steering::beacon::ClientNetwork;
use multicdn::steering::scoreboard::{Metric, Sample, Scoreboard, ScoreboardConfig};
use multicdn_core::clock::Stopwatch;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng};

const POLICY: &str = include_str!("policy.yaml");

const COUNTRIES: [&str; 40] = [
    "US", "GB", "DE", "FR", "JP", "BR", "IN", "CA", "AU", "NL", "ES", "IT", "MX", "KR", "SE", "PL",
    "TR", "ID", "AR", "ZA", "NG", "EG", "SG", "HK", "TW", "TH", "VN", "PH", "MY", "CH", "AT", "BE",
    "DK", "NO", "FI", "IE", "PT", "CZ", "RO", "CL",
];

/// Where one controller stops keeping up past one machine.
#[derive(Debug, Parser)]
#[command(name = "shardsim", version)]
struct Cli {
    /// Shard counts to simulate (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
    shards: Vec<u16>,
    /// Active network counts to simulate (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "10000,50000,100000")]
    networks: Vec<u32>,
    /// Beacons per second over the whole estate.
    #[arg(long, default_value_t = 10_000_000.0)]
    beacons_per_second: f64,
    /// Zipf exponent of the networks' traffic.
    #[arg(long, default_value_t = 1.0)]
    zipf: f64,
    /// Beacons per second one ingest worker takes (measured: README, "Past one machine").
    #[arg(long, default_value_t = 60_000.0)]
    worker_rate: f64,
    /// The controller's round interval.
    #[arg(long, default_value = "30s", value_parser = common::parse_duration)]
    round_interval: Duration,
    /// Samples a cell's bucket holds at most in the simulation (its sketch saturates well
    /// before: more only costs time to build).
    #[arg(long, default_value_t = 2_000)]
    max_bucket_samples: u64,
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut SmallRng) -> f64 {
    let u: f64 = 1.0 - rng.random::<f64>();
    let v: f64 = rng.random();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

struct Row {
    networks: u32,
    shards: u16,
    cells: usize,
    snapshot_bytes: usize,
    merge: Duration,
    round: Duration,
    workers: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    if cli.shards.contains(&0) || cli.networks.contains(&0) {
        return Err("--shards and --networks take counts above zero".into());
    }
    if !(cli.beacons_per_second > 0.0 && cli.worker_rate > 0.0 && cli.zipf >= 0.0) {
        return Err(
            "--beacons-per-second and --worker-rate above zero, --zipf not negative".into(),
        );
    }
    let policy =
        Policy::from_yaml(POLICY, "examples/policy.yaml (embedded)").map_err(|e| e.to_string())?;
    let providers = policy.provider_ids();
    let config = ScoreboardConfig::from_policy(&policy.steering.rum);
    let window = policy.steering.rum.window.get();
    let bucket = config.bucket;
    let buckets = (window.as_secs() / bucket.as_secs().max(1)).max(1);
    let now = Timestamp::parse_rfc3339("2026-12-01T12:00:00Z").map_err(|e| e.to_string())?;
    let start = Timestamp::from_millis(now.as_millis() - window.as_millis() as u64 + 1);
    println!(
        "estate: {} beacons/s, Zipf {} over the networks, {} providers, {} metrics, {} buckets of {:?} in the {:?} window",
        cli.beacons_per_second,
        cli.zipf,
        providers.len(),
        2,
        buckets,
        bucket,
        window
    );
    println!(
        "controller: round every {:?}; a worker takes {} beacons/s",
        cli.round_interval, cli.worker_rate
    );
    let mut rows = Vec::new();
    for &networks in &cli.networks {
        for &shards in &cli.shards {
            rows.push(simulate(
                cli, &policy, &providers, &config, networks, shards, start, now, buckets,
            )?);
        }
    }
    println!();
    println!(
        "{:>9} {:>6} {:>9} {:>14} {:>9} {:>9} {:>10} {:>8}",
        "networks",
        "shards",
        "cells",
        "snapshots MB",
        "merge ms",
        "round ms",
        "% of round",
        "workers"
    );
    for r in &rows {
        let total = r.merge + r.round;
        let share = total.as_secs_f64() / cli.round_interval.as_secs_f64() * 100.0;
        println!(
            "{:>9} {:>6} {:>9} {:>14.1} {:>9.0} {:>9.0} {:>9.1}% {:>8}{}",
            r.networks,
            r.shards,
            r.cells,
            r.snapshot_bytes as f64 / 1e6,
            r.merge.as_secs_f64() * 1e3,
            r.round.as_secs_f64() * 1e3,
            share,
            r.workers,
            if share > 100.0 {
                "  <- one controller no longer keeps up"
            } else {
                ""
            }
        );
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn simulate(
    cli: &Cli,
    policy: &Policy,
    providers: &[ProviderId],
    config: &ScoreboardConfig,
    networks: u32,
    shards: u16,
    start: Timestamp,
    now: Timestamp,
    buckets: u64,
) -> Result<Row, String> {
    let mut boards: Vec<Scoreboard> = (0..shards)
        .map(|_| Scoreboard::new(config.clone(), providers))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let slots: Vec<_> = providers
        .iter()
        .filter_map(|p| boards.first().and_then(|b| b.provider_slot(p.as_str())))
        .collect();
    let harmonic: f64 = (1..=networks).map(|r| f64::from(r).powf(-cli.zipf)).sum();
    let window_ms = now.as_millis() - start.as_millis();
    let per_bucket_ms = window_ms / buckets;
    let mut rng = SmallRng::seed_from_u64(u64::from(networks) * 7919 + u64::from(shards));
    for rank in 1..=networks {
        let country = Country::new(COUNTRIES[(rank as usize * 31) % COUNTRIES.len()])
            .map_err(|e| e.to_string())?;
        let network = ClientNetwork::new(Some(1_000 + rank), Some(country));
        let board = &mut boards[usize::from(shard_of(&network, shards))];
        let share = f64::from(rank).powf(-cli.zipf) / harmonic;
        // Beacons a provider's cell gets a bucket: the network's share of the estate's rate
        // over one bucket, split over the providers (the probe on a small sample).
        let per_bucket =
            cli.beacons_per_second * share * (per_bucket_ms as f64 / 1e3) / providers.len() as f64;
        let base = 30.0 + 120.0 * rng.random::<f64>();
        for (m, metric) in [Metric::Ttfb, Metric::Probe].into_iter().enumerate() {
            let fraction = if m == 0 { 1.0 } else { 0.02 };
            let n = ((per_bucket * fraction).round() as u64).clamp(1, cli.max_bucket_samples);
            for slot in &slots {
                let typical = base * (0.15 * normal(&mut rng)).exp();
                for b in 0..buckets {
                    for k in 0..n {
                        let at = Timestamp::from_millis(
                            start.as_millis() + b * per_bucket_ms + (k * per_bucket_ms) / n,
                        );
                        let value = typical * (0.5 * normal(&mut rng)).exp();
                        board.insert(&Sample {
                            at,
                            metric,
                            provider: *slot,
                            network,
                            value: Some(value),
                        });
                    }
                }
            }
        }
    }
    let snapshots: Vec<Vec<u8>> = boards
        .iter()
        .map(serde_json::to_vec)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let snapshot_bytes = snapshots.iter().map(Vec::len).sum();
    let cells = boards.iter().map(Scoreboard::cells).sum();
    drop(boards);

    let controller = Controller::builder(policy.clone())
        .actuator("dns", MemorySteerer::new())
        .clock(ManualClock::new(now))
        .build()
        .map_err(|e| e.to_string())?;
    // The controller's part: decode and merge every shard, then one round.
    let clock = Stopwatch::start();
    let mut merged = Scoreboard::new(config.clone(), providers).map_err(|e| e.to_string())?;
    for bytes in &snapshots {
        let shard: Scoreboard = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        merged.merge(&shard).map_err(|e| e.to_string())?;
    }
    let merge = clock.elapsed();
    controller
        .feed_scoreboard(merged, Some(now))
        .map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let clock = Stopwatch::start();
    let report = runtime.block_on(controller.round(now));
    let round = clock.elapsed();
    eprintln!(
        "{networks} networks, {shards} shards: {cells} cells, round {} mode {:?}, {} cohorts in the plan",
        report.record.round,
        report.record.mode,
        report.plan.cohorts.len()
    );
    Ok(Row {
        networks,
        shards,
        cells,
        snapshot_bytes,
        merge,
        round,
        workers: (cli.beacons_per_second / cli.worker_rate).ceil() as u64,
    })
}
