//! `policy`: validate a multicdn policy file and summarise it.
//!
//! ```text
//! cargo run --example policy -- check examples/policy.yaml
//! ```
//!
//! Exit codes: 0 valid, 2 invalid (every problem printed with file:line:column and the field),
//! 1 the file cannot be read.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use multicdn_core::policy::{Policy, PolicyError};

/// Check a multicdn policy file.
#[derive(Debug, Parser)]
#[command(name = "policy", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a policy file: exit 0 and a summary when valid, 2 with every problem when not,
    /// 1 when it cannot be read.
    Check {
        /// The policy file.
        path: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { path } => check(&path),
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    match Policy::load(path) {
        Ok(policy) => {
            print!(
                "{}",
                multicdn_examples::summary::policy_summary(&policy, path)
            );
            ExitCode::SUCCESS
        }
        Err(e @ PolicyError::Read { .. }) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
        Err(e) => {
            let n = e.diagnostics().len();
            eprintln!("{e}");
            eprintln!("{n} problem{} found", if n == 1 { "" } else { "s" });
            ExitCode::from(2)
        }
    }
}
