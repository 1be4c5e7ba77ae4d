//! The business case for a second CDN: reads probe beacons (NDJSON, one received beacon a
//! line, from a file or `-` for stdin, streamed) and cost inputs (YAML), and prints the
//! expected annual outage loss against the multi-CDN cost, each provider's commit shortfall,
//! the regions where the performance argument holds, and a verdict.
//!
//! ```text
//! cargo run -p multicdn-examples --example case -- --costs examples/case.yaml probes.ndjson
//! ```

use std::io::{BufRead, BufReader, Read};
use std::process::ExitCode;

use clap::Parser;
use multicdn_steering::case::{CaseError, CostInputs, EvidenceBuilder, cost_case};

/// Prices the multi-CDN case from probe data and cost inputs.
#[derive(Debug, Parser)]
#[command(name = "case")]
struct Args {
    /// The cost inputs (YAML).
    #[arg(long, default_value = "examples/case.yaml")]
    costs: String,
    /// Probe beacons, one JSON object a line; `-` reads stdin.
    beacons: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("case: {e}");
            ExitCode::from(2)
        }
    }
}

fn money(currency: &str, v: f64) -> String {
    let sign = if v < 0.0 { "-" } else { "" };
    let whole = v.abs().round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{currency}{out}")
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let inputs = CostInputs::load(&args.costs)?;
    let input: Box<dyn Read> = if args.beacons == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(
            std::fs::File::open(&args.beacons)
                .map_err(|e| format!("{}: cannot read: {e}", args.beacons))?,
        )
    };
    let mut builder = EvidenceBuilder::new(inputs.evidence_config());
    let mut lines = 0u64;
    for line in BufReader::new(input).lines() {
        let line = line.map_err(|e| format!("{}: cannot read: {e}", args.beacons))?;
        lines += 1;
        builder.add_line(&line);
    }
    let malformed = builder.malformed();
    if builder.probes() + builder.ignored() == 0 && malformed > 0 {
        return Err(Box::new(CaseError::NoBeacons { malformed }));
    }
    let (probes, ignored) = (builder.probes(), builder.ignored());
    let evidence = builder.finish();
    let case = cost_case(&inputs);
    let c = inputs.currency.as_str();
    let cfg = inputs.evidence_config();
    let [a, b] = &cfg.providers;

    println!(
        "Input: {lines} lines, {probes} probe beacons, {ignored} other beacons, {malformed} malformed"
    );
    println!();
    println!("Outage insurance");
    println!(
        "  expected annual outage loss:   {} ({} h over {} years at {}/h)",
        money(c, case.expected_annual_loss),
        inputs.outage_hours,
        inputs.outage_years,
        money(c, inputs.cost_per_hour)
    );
    println!(
        "  avoided by multi-CDN:          {} / year",
        money(c, case.multi_avoided)
    );
    println!(
        "  avoided by standby:            {} / year",
        money(c, case.standby_avoided)
    );
    println!();
    println!("Contracts under the split");
    for s in &case.shortfalls {
        println!(
            "  {:<12} usage {} / month, commit {}, shortfall {}",
            s.provider,
            money(c, s.usage_monthly),
            money(c, s.commit_monthly),
            money(c, s.shortfall_monthly)
        );
    }
    println!(
        "  both contracts {} / month against {} on one CDN",
        money(c, case.contracts_monthly),
        money(c, case.single_monthly)
    );
    println!();
    println!("Cost");
    println!(
        "  multi-CDN over one CDN:        {} / month, {} / year",
        money(c, case.multi_extra_monthly),
        money(c, case.multi_extra_annual)
    );
    println!(
        "  configured standby:            {} / year",
        money(c, case.standby_annual)
    );
    println!(
        "  multi-CDN net:                 {} / year",
        money(c, case.multi_net)
    );
    println!(
        "  standby net:                   {} / year",
        money(c, case.standby_net)
    );
    println!();
    println!(
        "Performance (p75 {a} - {b}; holds at >= {} ms, >= {} pairs, sign test p < {})",
        inputs.material_ms, inputs.min_pairs, inputs.alpha
    );
    for e in &evidence {
        let p = |i: usize| e.stats[i].p75.map_or("-".to_owned(), |v| format!("{v:.1}"));
        println!(
            "  {:<8} {a} p75 {} (n={}), {b} p75 {} (n={}), diff {}, pairs {}, p={:.2e}: {}",
            e.region,
            p(0),
            e.stats[0].samples,
            p(1),
            e.stats[1].samples,
            e.p75_difference_ms
                .map_or("-".to_owned(), |d| format!("{d:+.1} ms")),
            e.pairs,
            e.p_value,
            if e.argument_holds {
                "holds"
            } else {
                "no claim"
            }
        );
    }
    let holds: Vec<&str> = evidence
        .iter()
        .filter(|e| e.argument_holds)
        .map(|e| e.region.as_str())
        .collect();
    println!(
        "  the performance argument holds in: {}",
        if holds.is_empty() {
            "none".to_owned()
        } else {
            holds.join(", ")
        }
    );
    println!();
    println!("Verdict: {}", case.verdict);
    Ok(())
}
