//! `cascade`: replay the Mumbai failure of the fault-isolation scenario, with and without
//! quality caps as load shedding, print the timelines and chart every node's load.
//!
//! ```text
//! cargo run -p multicdn-examples --example cascade -- --svg cascade.svg
//! ```
//!
//! The scenario (the library's `Topology::seed` and `Scenario::seed`): Mumbai (400 Gbps)
//! serves India, 300 Gbps; Singapore (125 Gbps) its own 100 Gbps at 4K; Tokyo (200 Gbps) 170;
//! Sydney (100 Gbps) 85. Mumbai dies at 1:00 and comes back at 10:00. A node loaded above its
//! capacity for 30 s collapses. With shedding, a node above 90% caps quality on the ladder
//! 2160p 25 Mbps … 480p 5 Mbps … 240p 1 Mbps and lifts the cap below 85%; India drains back to
//! Mumbai over 6 minutes, at most 25% of its sessions a minute.
//!
//! Exit codes: 0 done, 1 the chart cannot be written, 2 the flags describe no valid run.

use std::io::{self, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use multicdn_steering::video::sim::{Scenario, Timeline, simulate};
use multicdn_steering::video::svg;
use multicdn_steering::video::{DrainConfig, Topology};

/// Replay a CDN node failure with and without quality caps as load shedding.
#[derive(Debug, Parser)]
#[command(name = "cascade", version)]
struct Cli {
    /// Run only with shedding.
    #[arg(long, conflicts_with = "no_shedding")]
    shedding: bool,
    /// Run only without shedding.
    #[arg(long)]
    no_shedding: bool,
    /// Where to write the SVG chart.
    #[arg(long, default_value = "cascade.svg")]
    svg: PathBuf,
    /// Simulation step in seconds (players honour a cap one step after it is set, so keep it
    /// under the 30 s overload tolerance).
    #[arg(long, default_value_t = 10)]
    step_seconds: u64,
    /// How long to simulate, in minutes.
    #[arg(long, default_value_t = 20)]
    minutes: u64,
    /// How long India takes to drain back to Mumbai, in minutes.
    #[arg(long, default_value_t = 6)]
    drain_minutes: u64,
}

fn summary(tl: &Timeline) -> String {
    let collapses = tl.collapses();
    if collapses.is_empty() {
        let peaks: Vec<String> = tl
            .node_ids
            .iter()
            .enumerate()
            .map(|(n, id)| {
                let peak = tl.peak_load(n);
                format!(
                    "{id} {peak:.0} Gbps ({:.0}%)",
                    peak / tl.capacities[n] * 100.0
                )
            })
            .collect();
        format!("no node collapsed; peak loads: {}", peaks.join(", "))
    } else {
        let list: Vec<String> = collapses
            .iter()
            .map(|(t, n)| format!("{n} at {}:{:02}", t.as_secs() / 60, t.as_secs() % 60))
            .collect();
        format!("collapsed: {}", list.join(", "))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        // stdout closed (piped into `head`): nothing left to say.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: &Cli) -> io::Result<ExitCode> {
    let mut out = io::stdout().lock();
    let runs: Vec<(bool, &str)> = match (cli.shedding, cli.no_shedding) {
        (true, false) => vec![(true, "with shedding")],
        (false, true) => vec![(false, "without shedding")],
        _ => vec![(false, "without shedding"), (true, "with shedding")],
    };
    let step = Duration::from_secs(cli.step_seconds);
    if step >= Duration::from_secs(30) {
        eprintln!(
            "warning: a {}s step is not shorter than the 30 s overload tolerance; \
             nodes will collapse before a cap can act",
            cli.step_seconds
        );
    }
    writeln!(out, "{}", Topology::seed())?;
    let mut charts = Vec::new();
    for (shedding, name) in runs {
        let scenario = Scenario::seed(shedding)
            .step(step)
            .duration(Duration::from_secs(cli.minutes * 60))
            .drain(DrainConfig::default().period(Duration::from_secs(cli.drain_minutes * 60)));
        let tl = match simulate(&scenario) {
            Ok(tl) => tl,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(ExitCode::from(2));
            }
        };
        writeln!(out, "== {name} ==")?;
        write!(out, "{tl}")?;
        writeln!(out, "=> {}\n", summary(&tl))?;
        charts.push(svg::timeline_chart(&format!("Mumbai fails: {name}"), &tl));
    }
    let doc = svg::render(&charts, 1000, 380);
    if let Err(e) = std::fs::write(&cli.svg, doc) {
        eprintln!("error: cannot write {}: {e}", cli.svg.display());
        return Ok(ExitCode::from(1));
    }
    writeln!(out, "chart written to {}", cli.svg.display())?;
    Ok(ExitCode::SUCCESS)
}
