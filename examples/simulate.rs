//! `simulate`: play a day with ground truth and judge the loop against the alternatives.
//!
//! ```text
//! cargo run --release --example simulate                      # the default day, seed 1
//! cargo run --release --example simulate -- --seed 2 --svg day.svg --network 0
//! cargo run --release --example simulate -- --journal 3     # why the 4th-busiest network moved
//! cargo run --release --example simulate -- --networks 200 --loads-per-sec 400 --policy my.yaml
//! ```
//!
//! The world (networks with Zipf traffic and diurnal volume, true latency per network and
//! provider, log-normal noise and outliers, caches whose hit ratio follows traffic share, DNS
//! lag, probe beacons, and the day's events) is described, default by default, in the
//! `multicdn_steering::sim` module documentation. Each flag overrides one parameter. The
//! report prints TTFB per strategy outside the outage window, capture, reversals, reaction to
//! the degradation, the deadman, floors and the hourly cap, and where the loop lost to the
//! oracle; `--svg` writes one network's planned weights against its truth, `--journal` prints
//! that network's journal (each move with its rule and evidence).
//!
//! Exit codes: 0 played; 2 usage or a world that cannot be played.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use multicdn_core::Policy;
use multicdn_steering::sim::{DEFAULT_POLICY, World, run};

#[derive(Debug, Parser)]
#[command(
    about = "Play a simulated day and compare the loop with static weights, each CDN alone and an oracle"
)]
struct Cli {
    /// Seed of every random draw.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A policy file (default: the simulator's estate, see the module docs).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Networks (ASNs).
    #[arg(long)]
    networks: Option<usize>,
    /// Zipf exponent of the networks' traffic.
    #[arg(long)]
    zipf: Option<f64>,
    /// Mean page loads per second, all networks.
    #[arg(long)]
    loads_per_sec: Option<f64>,
    /// Diurnal swing, as a fraction of the mean.
    #[arg(long)]
    diurnal: Option<f64>,
    /// Log-normal sigma of a provider's latency factor per network.
    #[arg(long)]
    provider_sigma: Option<f64>,
    /// Log-normal sigma of the per-user factor.
    #[arg(long)]
    user_sigma: Option<f64>,
    /// Share of page loads that are outliers (3-10x).
    #[arg(long)]
    outliers: Option<f64>,
    /// Median origin fetch on a cache miss, ms.
    #[arg(long)]
    miss_ms: Option<f64>,
    /// Time constant of the caches' hit ratio, minutes.
    #[arg(long)]
    cache_tau_min: Option<f64>,
    /// Share of page loads that run the probe.
    #[arg(long)]
    probe_rate: Option<f64>,
    /// Extra latency of the regional degradation (fastly in europe), ms.
    #[arg(long)]
    degradation_ms: Option<f64>,
    /// Extra latency of the region-wide shift (cloudflare in apac, from 20:00), ms.
    #[arg(long)]
    shift_ms: Option<f64>,
    /// Write an SVG of one network's weights against its truth here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// The network for the SVG, by traffic rank (0 is the busiest).
    #[arg(long, default_value_t = 0)]
    network: usize,
    /// Print the journal of one network's cohort over the day (why each move was made), by
    /// traffic rank.
    #[arg(long, value_name = "RANK")]
    journal: Option<usize>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let policy = match &cli.policy {
        Some(path) => Policy::load(path),
        None => Policy::from_yaml(DEFAULT_POLICY, "simulator policy"),
    };
    let policy = match policy {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut world = World {
        seed: cli.seed,
        journal_of: cli.journal,
        ..World::default()
    };
    macro_rules! set {
        ($($field:ident),*) => { $( if let Some(v) = cli.$field { world.$field = v; } )* };
    }
    set!(
        networks,
        zipf,
        loads_per_sec,
        diurnal,
        provider_sigma,
        user_sigma,
        outliers,
        miss_ms,
        cache_tau_min,
        probe_rate
    );
    if let Some(ms) = cli.degradation_ms {
        world.degradation.2 = ms;
    }
    if let Some(ms) = cli.shift_ms {
        world.shift.1 = ms;
    }
    if let Some(rank) = cli.journal.filter(|r| *r >= world.networks) {
        eprintln!("--journal {rank}: the day has {} networks", world.networks);
        return ExitCode::from(2);
    }
    let report = match run(&world, &policy) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    print!("{report}");
    if let Some(rank) = cli.journal {
        if let Some(asn) = report.asns().get(rank) {
            println!("journal of AS{asn} (rank {rank}):");
        }
        for line in report.journal() {
            println!("  {line}");
        }
    }
    if let Some(path) = &cli.svg {
        let Some(svg) = report.svg(cli.network) else {
            eprintln!(
                "no network {} (the day has {})",
                cli.network,
                report.asns().len()
            );
            return ExitCode::from(2);
        };
        if let Err(e) = std::fs::write(path, svg) {
            eprintln!("{}: cannot write the SVG: {e}", path.display());
            return ExitCode::from(2);
        }
        println!(
            "wrote {} (AS{})",
            path.display(),
            report.asns()[cli.network]
        );
    }
    ExitCode::SUCCESS
}
