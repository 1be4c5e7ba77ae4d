//! `policy`: validate a multicdn policy file and summarise it, or render its cache section for
//! each CDN.
//!
//! ```text
//! cargo run --example policy -- check examples/policy.yaml
//! cargo run --example policy -- render examples/policy.yaml --provider fastly
//! cargo run --example policy -- render examples/policy.yaml --out rendered/
//! cargo run --example policy -- render examples/policy-shield.yaml --provider shield
//! ```
//!
//! `render` prints Fastly VCL snippets and Cloudflare rulesets from the policy's `cache`
//! section, the same bytes for the same policy (so renderings can be reviewed in version
//! control), and prints a warning on stderr for every feature a provider cannot express as
//! written. With `--strict`, a feature a provider cannot express at all is an error. With
//! `--out DIR`, each rendering is written to `DIR/fastly.vcl` and `DIR/cloudflare.json`.
//! A policy with a `shield` section also renders the origin shield's Varnish VCL
//! (`shield.vcl`) from the same cache section, with its origin and purge ACL.
//!
//! Exit codes: 0 valid (check) or rendered (render); 1 the file cannot be read (or `--out`
//! cannot be written); 2 invalid (every problem printed with file:line:column and the field),
//! or a rendering refused (strict mode, or a never-cached route a provider cannot express).

#[path = "tools/common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use multicdn_core::ProviderKind;
use multicdn_core::policy::{Policy, PolicyError};
use multicdn_providers::render::RenderMode;
use multicdn_providers::render::cloudflare_rules::{CloudflareTarget, render_cloudflare};
use multicdn_providers::render::fastly_vcl::render_fastly;

/// Check a multicdn policy file, or render its cache section for each CDN.
#[derive(Debug, Parser)]
#[command(
    name = "policy",
    version,
    after_help = "Exit codes: 0 valid or rendered; 1 the file cannot be read (or --out cannot be written); \
                  2 invalid policy, or a rendering refused (--strict, or a never-cached route a provider cannot express)."
)]
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
    /// Render the cache section as Fastly VCL snippets and Cloudflare rulesets; warnings for
    /// what a provider cannot express go to stderr.
    Render {
        /// The policy file.
        path: PathBuf,
        /// Which CDN to render for.
        #[arg(long, value_enum, default_value_t = Vendor::All)]
        provider: Vendor,
        /// Refuse (exit 2) when a provider cannot express a feature, instead of rendering the
        /// rest and warning.
        #[arg(long)]
        strict: bool,
        /// Write `fastly.vcl`, `cloudflare.json` (and `shield.vcl`) into this directory
        /// instead of stdout.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

/// The renderers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Vendor {
    /// Fastly VCL snippets.
    Fastly,
    /// Cloudflare cache and header rulesets.
    Cloudflare,
    /// The origin shield's Varnish VCL (needs the policy's `shield` section).
    Shield,
    /// Every one the policy has.
    All,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { path } => check(&path),
        Command::Render {
            path,
            provider,
            strict,
            out,
        } => render(&path, provider, strict, out.as_deref()),
    }
}

fn check(path: &Path) -> ExitCode {
    match Policy::load(path) {
        Ok(policy) => {
            common::out_part!(
                "{}",
                multicdn_examples::summary::policy_summary(&policy, path)
            );
            ExitCode::SUCCESS
        }
        Err(e) => load_failure(e),
    }
}

fn load_failure(e: PolicyError) -> ExitCode {
    if let e @ PolicyError::Read { .. } = e {
        eprintln!("error: {e}");
        return ExitCode::from(1);
    }
    let n = e.diagnostics().len();
    eprintln!("{e}");
    eprintln!("{n} problem{} found", if n == 1 { "" } else { "s" });
    ExitCode::from(2)
}

/// One rendered file: its name and its bytes.
struct Rendered {
    file: &'static str,
    text: String,
}

fn render(path: &Path, vendor: Vendor, strict: bool, out: Option<&Path>) -> ExitCode {
    let policy = match Policy::load(path) {
        Ok(p) => p,
        Err(e) => return load_failure(e),
    };
    let mode = if strict {
        RenderMode::Strict
    } else {
        RenderMode::Lenient
    };
    let mut rendered = Vec::new();
    let mut refused = false;
    if matches!(vendor, Vendor::Fastly | Vendor::All) {
        match render_fastly(&policy.site, &policy.cache, mode) {
            Ok(r) => {
                for w in &r.warnings {
                    eprintln!("warning: fastly: {w}");
                }
                rendered.push(Rendered {
                    file: "fastly.vcl",
                    text: r.to_vcl_file(),
                });
            }
            Err(e) => {
                eprintln!("error: {}: {e}", path.display());
                refused = true;
            }
        }
    }
    if matches!(vendor, Vendor::Cloudflare | Vendor::All) {
        // The zone's plan decides what Cloudflare can match; take it from the policy's
        // Cloudflare provider (Pro when the policy has none).
        let spec = policy
            .providers
            .iter()
            .find(|(_, s)| s.kind == ProviderKind::Cloudflare);
        let target = match spec {
            Some((_, spec)) => CloudflareTarget::from_spec(spec),
            None => {
                eprintln!(
                    "note: {} names no cloudflare provider; rendering for a Pro zone",
                    path.display()
                );
                CloudflareTarget::default()
            }
        };
        match render_cloudflare(&policy.site, &policy.cache, target, mode) {
            Ok(r) => {
                for w in &r.warnings {
                    eprintln!("warning: cloudflare: {w}");
                }
                rendered.push(Rendered {
                    file: "cloudflare.json",
                    text: r.to_json_file(),
                });
            }
            Err(e) => {
                eprintln!("error: {}: {e}", path.display());
                refused = true;
            }
        }
    }
    match (&policy.shield, vendor) {
        (Some(spec), Vendor::Shield | Vendor::All) => {
            let target = multicdn_providers::render::shield_vcl::ShieldTarget::from_spec(spec);
            match multicdn_providers::render::shield_vcl::render_shield(
                &policy.cache,
                &target,
                mode,
            ) {
                Ok(r) => {
                    for w in &r.warnings {
                        eprintln!("warning: shield: {w}");
                    }
                    rendered.push(Rendered {
                        file: "shield.vcl",
                        text: r.vcl,
                    });
                }
                Err(e) => {
                    eprintln!("error: {}: {e}", path.display());
                    refused = true;
                }
            }
        }
        (None, Vendor::Shield) => {
            eprintln!(
                "error: {}: the policy has no shield section; add one (url, origin_host, purgers) to render the shield",
                path.display()
            );
            return ExitCode::from(2);
        }
        _ => {}
    }
    if refused {
        eprintln!("rendering refused; nothing written");
        return ExitCode::from(2);
    }
    match out {
        Some(dir) => {
            if let Err(e) = std::fs::create_dir_all(dir) {
                eprintln!("error: cannot create {}: {e}", dir.display());
                return ExitCode::from(1);
            }
            for r in &rendered {
                let file = dir.join(r.file);
                if let Err(e) = std::fs::write(&file, &r.text) {
                    eprintln!("error: cannot write {}: {e}", file.display());
                    return ExitCode::from(1);
                }
                common::out!("wrote {}", file.display());
            }
        }
        None => {
            let headers = rendered.len() > 1;
            for (i, r) in rendered.iter().enumerate() {
                if headers {
                    if i > 0 {
                        common::out!();
                    }
                    common::out!("==> {} <==", r.file);
                }
                common::out_part!("{}", r.text);
            }
        }
    }
    ExitCode::SUCCESS
}
