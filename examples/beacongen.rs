//! `beacongen`: write a realistic beacon log and the prefix table that resolves it, for
//! benchmarks and for comparing the ingest path with other tools.
//!
//! ```text
//! cargo run --release --example beacongen -- --prefixes target/prefixes.txt > target/beacons.ndjson
//! cargo run --release --example beacongen -- --lines 20000000 --out big.ndjson --prefixes p.txt
//! ```
//!
//! What the log holds (Zipf networks over 20,000 ASNs, a routing-table-like prefix mix with
//! nested IPv4 and IPv6 prefixes, navigation and probe beacons in any field order with extra
//! fields and escaped strings, six hours of timestamps, a few bad lines) is described, with the
//! source of each default, in `multicdn_steering::sim::beacons`. The same flags write the same
//! bytes.
//!
//! Exit codes: 0 written; 2 usage error or a file that cannot be written.

#[path = "tools/common.rs"]
mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use common::{Fail, OK};
use multicdn_steering::sim::beacons::LogSpec;

/// Write a realistic NDJSON beacon log (and its prefix table).
#[derive(Debug, Parser)]
#[command(name = "beacongen", version)]
struct Cli {
    /// Lines to write.
    #[arg(long, default_value_t = 2_000_000)]
    lines: usize,
    /// ASNs the traffic comes from (Zipf-weighted).
    #[arg(long, default_value_t = 20_000)]
    asns: u32,
    /// IPv4 prefixes in the table.
    #[arg(long, default_value_t = 250_000)]
    v4_prefixes: usize,
    /// IPv6 prefixes in the table.
    #[arg(long, default_value_t = 50_000)]
    v6_prefixes: usize,
    /// The time the lines cover.
    #[arg(long, default_value = "6h", value_parser = common::parse_duration)]
    span: Duration,
    /// The random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where to write the log (default: stdout).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Where to write the prefix table (`prefix ASN country` a line), for `scoreboard --prefixes`.
    #[arg(long, value_name = "FILE")]
    prefixes: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => ExitCode::from(code),
        Err(fail) => fail.report(),
    }
}

fn run(cli: Cli) -> Result<u8, Fail> {
    let spec = LogSpec {
        lines: cli.lines,
        asns: cli.asns.max(1),
        v4_prefixes: cli.v4_prefixes.max(cli.asns as usize),
        v6_prefixes: cli.v6_prefixes.max(cli.asns as usize),
        span: cli.span,
        seed: cli.seed,
        ..LogSpec::default()
    };
    let prefixes = spec.prefixes();
    if let Some(path) = &cli.prefixes {
        std::fs::write(path, prefixes.to_text())
            .map_err(|e| Fail::error(format!("error: cannot write {}: {e}", path.display())))?;
    }
    let written = match &cli.out {
        Some(path) => std::fs::File::create(path)
            .and_then(|mut f| spec.write_lines(&prefixes, &mut f).and_then(|()| f.flush()))
            .map_err(|e| format!("{}: {e}", path.display())),
        None => {
            let mut out = std::io::stdout().lock();
            match spec.write_lines(&prefixes, &mut out) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    return Ok(common::CLOSED_PIPE);
                }
                other => other.map_err(|e| format!("stdout: {e}")),
            }
        }
    };
    written.map_err(|e| Fail::error(format!("error: cannot write {e}")))?;
    Ok(OK)
}
