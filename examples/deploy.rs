//! `deploy`: put the policy's cache section on both CDNs (Fastly VCL snippets, Cloudflare
//! rulesets), and check that what is deployed is still what the policy says.
//!
//! ```text
//! FASTLY_API_TOKEN=... CLOUDFLARE_API_TOKEN=... \
//!     cargo run --example deploy -- plan  --policy examples/policy.yaml
//! cargo run --example deploy -- diff  --policy examples/policy.yaml --vendor fastly
//! cargo run --example deploy -- apply --policy examples/policy.yaml [--force]
//! cargo run --example deploy -- drift --policy examples/policy.yaml --vendor cloudflare
//! # against emulators on loopback:
//! cargo run --example deploy -- plan --policy examples/policy.yaml \
//!     --fastly-endpoint http://127.0.0.1:8080 --cloudflare-endpoint http://127.0.0.1:8081
//! ```
//!
//! Every provider of kind `fastly` (its `service_id`) or `cloudflare` (its `zone_id`) in the
//! policy is deployed, or only one vendor's with `--vendor`. Each reads what is deployed first
//! (Fastly: the active version's snippets; Cloudflare: both entry-point rulesets).
//!
//! - `plan` prints what would change and every write `apply` would send, in order, with its
//!   method, path and a short summary of its body (Fastly: clone the active version, write the
//!   snippets on the draft, validate, activate; Cloudflare: one PUT of the whole rule list per
//!   phase that changes). It only reads.
//! - `diff` prints what would change; exit 1 when something would.
//! - `apply` deploys. Every snippet and rule multicdn writes carries a fingerprint of itself;
//!   one the plan would overwrite or delete that multicdn did not write as it is now (edited
//!   or added on the console) is a console edit, and `apply` refuses the whole deploy (exit 1,
//!   nothing sent to any provider) unless `--force`.
//! - `drift` compares what is deployed with the policy's rendering; exit 1 on any difference.
//!
//! API tokens come from the environment variables the policy's `token_env` fields name; they
//! are never printed. Renderings are lenient by default (what a provider cannot express is
//! named on stderr); `--strict` refuses them instead.
//!
//! Exit codes: 0 fine (`plan` printed, `diff`/`drift` found nothing, `apply` applied or had
//! nothing to do); 1 the finding (`diff` would change something, `drift` found a difference,
//! `apply` refused to overwrite console edits without `--force`); 2 usage, configuration,
//! credential or vendor error (including a failed Fastly validation).

#[path = "tools/common.rs"]
mod common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use common::{FINDING, Fail, OK};
use multicdn_core::policy::{Policy, ProviderSpec};
use multicdn_core::{ProviderId, ProviderKind, Secret};
use multicdn_providers::cloudflare::deploy::{CloudflareDeployPlan, CloudflareDeployer};
use multicdn_providers::fastly::deploy::{FastlyDeployPlan, FastlyDeployed, FastlyDeployer};
use multicdn_providers::http::HttpSettings;
use multicdn_providers::render::RenderMode;
use multicdn_providers::render::cloudflare_rules::{
    CloudflareRendering, CloudflareTarget, render_cloudflare,
};
use multicdn_providers::render::fastly_vcl::{FastlyRendering, render_fastly};
use multicdn_providers::render::plan::{ConsoleEdit, DeployError, DeployOptions, PlannedCall};

/// Plan, diff, apply and check both CDNs' configuration from the policy's cache section.
#[derive(Debug, Parser)]
#[command(
    name = "deploy",
    version,
    after_help = "Exit codes: 0 fine (diff/drift: nothing differs; apply: applied or nothing to do); \
                  1 diff would change something, drift found a difference, or apply refused to overwrite \
                  console edits without --force; 2 usage, configuration, credential or vendor error."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print what would change and every write apply would send; reads only.
    Plan(Common),
    /// Print what would change; exit 1 when something would.
    Diff(Common),
    /// Deploy; refuses to overwrite console edits unless --force.
    Apply(ApplyArgs),
    /// Compare what is deployed with the policy; exit 1 on drift.
    Drift(Common),
}

#[derive(Debug, Args)]
struct Common {
    /// The policy file (providers with service_id/zone_id and token_env, the cache section).
    #[arg(long, value_name = "PATH")]
    policy: PathBuf,
    /// Which CDNs.
    #[arg(long, value_enum, default_value = "all")]
    vendor: Vendor,
    /// Fastly's API address (default https://api.fastly.com).
    #[arg(long, value_name = "URL")]
    fastly_endpoint: Option<String>,
    /// Cloudflare's API address (default https://api.cloudflare.com/client/v4).
    #[arg(long, value_name = "URL")]
    cloudflare_endpoint: Option<String>,
    /// Refuse a rendering that cannot express a feature, instead of naming it and going on.
    #[arg(long)]
    strict: bool,
    /// Each request's deadline.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = common::parse_duration)]
    timeout: Duration,
}

#[derive(Debug, Args)]
struct ApplyArgs {
    #[command(flatten)]
    common: Common,
    /// Overwrite snippets and rules edited or added outside multicdn (console edits).
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Vendor {
    /// Fastly services.
    Fastly,
    /// Cloudflare zones.
    Cloudflare,
    /// Both.
    All,
}

impl Vendor {
    fn includes(self, kind: ProviderKind) -> bool {
        match self {
            Vendor::Fastly => kind == ProviderKind::Fastly,
            Vendor::Cloudflare => kind == ProviderKind::Cloudflare,
            Vendor::All => matches!(kind, ProviderKind::Fastly | ProviderKind::Cloudflare),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Plan,
    Diff,
    Apply { force: bool },
    Drift,
}

/// One provider to deploy to, with its rendering.
enum Target {
    Fastly(FastlyDeployer, FastlyRendering),
    Cloudflare(CloudflareDeployer, CloudflareRendering),
}

/// One provider's plan.
enum Planned {
    Fastly(FastlyDeployPlan),
    Cloudflare(CloudflareDeployPlan),
}

impl Planned {
    fn is_empty(&self) -> bool {
        match self {
            Planned::Fastly(p) => p.is_empty(),
            Planned::Cloudflare(p) => p.is_empty(),
        }
    }

    fn calls(&self) -> Vec<PlannedCall> {
        match self {
            Planned::Fastly(p) => p.calls(),
            Planned::Cloudflare(p) => p.calls(),
        }
    }

    fn console_edits(&self) -> Vec<ConsoleEdit> {
        match self {
            Planned::Fastly(p) => p.console_edits.clone(),
            Planned::Cloudflare(p) => p.console_edits(),
        }
    }

    /// The reads the plan was made from, for `plan`'s output.
    fn reads(&self) -> Vec<String> {
        match self {
            Planned::Fastly(p) => vec![
                format!("GET /service/{}/version", p.service_id),
                format!(
                    "GET /service/{}/version/{}/snippet",
                    p.service_id, p.base_version
                ),
            ],
            Planned::Cloudflare(p) => p
                .phases
                .iter()
                .map(|ph| {
                    format!(
                        "GET /zones/{}/rulesets/phases/{}/entrypoint",
                        p.zone_id, ph.phase
                    )
                })
                .collect(),
        }
    }
}

impl std::fmt::Display for Planned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Planned::Fastly(p) => p.fmt(f),
            Planned::Cloudflare(p) => p.fmt(f),
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let (action, args) = match Cli::parse().command {
        Command::Plan(a) => (Action::Plan, a),
        Command::Diff(a) => (Action::Diff, a),
        Command::Apply(a) => (Action::Apply { force: a.force }, a.common),
        Command::Drift(a) => (Action::Drift, a),
    };
    match run(action, &args).await {
        Ok(code) => ExitCode::from(code),
        Err(fail) => fail.report(),
    }
}

/// The token a provider's `token_env` names (never printed).
fn token(id: &ProviderId, spec: &ProviderSpec) -> Result<Secret, Fail> {
    let Some(var) = spec.token_env.as_deref() else {
        return Err(Fail::error(format!(
            "error: providers.{id}.token_env is not set in the policy; name the environment variable holding {id}'s API token"
        )));
    };
    Secret::from_env(var).ok_or_else(|| {
        Fail::error(format!(
            "error: the environment variable {var} (providers.{id}.token_env) is unset or empty; it must hold {id}'s API token"
        ))
    })
}

fn targets(args: &Common, policy: &Policy) -> Result<Vec<Target>, Fail> {
    let mode = if args.strict {
        RenderMode::Strict
    } else {
        RenderMode::Lenient
    };
    let refused = |id: &ProviderId, e: &dyn std::fmt::Display| {
        Fail::error(format!(
            "error: {}: rendering for {id} refused: {e}",
            args.policy.display()
        ))
    };
    let settings = HttpSettings::default().with_request_timeout(args.timeout);
    let mut out = Vec::new();
    for (id, spec) in &policy.providers {
        if !args.vendor.includes(spec.kind) {
            continue;
        }
        let setup = |e: multicdn_core::Error| {
            Fail::error(format!(
                "error: {}: provider {id}: {e}",
                args.policy.display()
            ))
        };
        let token = token(id, spec)?;
        if spec.kind == ProviderKind::Fastly {
            let rendering =
                render_fastly(&policy.site, &policy.cache, mode).map_err(|e| refused(id, &e))?;
            notes(id, rendering.warnings.iter());
            let deployer = FastlyDeployer::from_spec(
                id.clone(),
                spec,
                token,
                args.fastly_endpoint.as_deref(),
                settings.clone(),
            )
            .map_err(setup)?;
            out.push(Target::Fastly(deployer, rendering));
        } else {
            let target = CloudflareTarget::from_spec(spec);
            let rendering = render_cloudflare(&policy.site, &policy.cache, target, mode)
                .map_err(|e| refused(id, &e))?;
            notes(id, rendering.warnings.iter());
            let deployer = CloudflareDeployer::from_spec(
                id.clone(),
                spec,
                token,
                args.cloudflare_endpoint.as_deref(),
                settings.clone(),
            )
            .map_err(setup)?;
            out.push(Target::Cloudflare(deployer, rendering));
        }
    }
    if out.is_empty() {
        return Err(Fail::error(format!(
            "error: {}: no provider of kind {} in the policy; deploy knows fastly and cloudflare",
            args.policy.display(),
            match args.vendor {
                Vendor::Fastly => "fastly",
                Vendor::Cloudflare => "cloudflare",
                Vendor::All => "fastly or cloudflare",
            }
        )));
    }
    Ok(out)
}

fn notes<'a>(
    id: &ProviderId,
    warnings: impl Iterator<Item = &'a multicdn_providers::render::RenderWarning>,
) {
    for w in warnings {
        eprintln!("note: {id}: {w}");
    }
}

fn vendor_error(e: impl std::fmt::Display) -> Fail {
    Fail::error(format!("error: {e}"))
}

async fn plan(target: &Target) -> Result<Planned, Fail> {
    match target {
        Target::Fastly(d, r) => d.plan(r).await.map(Planned::Fastly),
        Target::Cloudflare(d, r) => d.plan(r).await.map(Planned::Cloudflare),
    }
    .map_err(vendor_error)
}

async fn run(action: Action, args: &Common) -> Result<u8, Fail> {
    let policy = common::load_policy(&args.policy)?;
    let targets = targets(args, &policy)?;
    if action == Action::Drift {
        return drift(&targets).await;
    }
    let mut plans = Vec::with_capacity(targets.len());
    for t in &targets {
        plans.push(plan(t).await?);
    }
    match action {
        Action::Plan => {
            for p in &plans {
                common::out!("{p}");
                common::out!("  read: {}", p.reads().join(", "));
                let calls = p.calls();
                if calls.is_empty() {
                    common::out!("  apply would send nothing");
                } else {
                    common::out!("  apply would send {} write(s), in order:", calls.len());
                    for c in &calls {
                        common::out!("    {c}");
                    }
                }
            }
            common::out!("plan only: nothing was written");
            Ok(OK)
        }
        Action::Diff => {
            for p in &plans {
                common::out!("{p}");
            }
            let changing = plans.iter().filter(|p| !p.is_empty()).count();
            common::out!("{changing} of {} provider(s) would change", plans.len());
            Ok(if changing == 0 { OK } else { FINDING })
        }
        Action::Apply { force } => apply(&targets, &plans, force).await,
        Action::Drift => Ok(OK),
    }
}

async fn apply(targets: &[Target], plans: &[Planned], force: bool) -> Result<u8, Fail> {
    for p in plans {
        common::out!("{p}");
    }
    // Every provider's console edits are checked before anything is sent to any of them.
    let edits: Vec<ConsoleEdit> = plans.iter().flat_map(Planned::console_edits).collect();
    if !edits.is_empty() && !force {
        eprintln!(
            "refused: the deploy would overwrite {} item(s) changed outside multicdn; nothing was sent:",
            edits.len()
        );
        for e in &edits {
            eprintln!("  {e}");
        }
        eprintln!("bring the change into the policy, or apply with --force to overwrite it");
        return Ok(FINDING);
    }
    let options = DeployOptions::default().confirm(true).force(force);
    for (t, p) in targets.iter().zip(plans) {
        let done = match (t, p) {
            (Target::Fastly(d, _), Planned::Fastly(plan)) => {
                d.apply_with(plan, options).await.map(|done| match done {
                    FastlyDeployed::Activated { previous, version } => format!(
                        "{}: version {version} validated and activated (was {previous})",
                        d.provider()
                    ),
                    _ => format!("{}: nothing to change", d.provider()),
                })
            }
            (Target::Cloudflare(d, _), Planned::Cloudflare(plan)) => {
                d.apply_with(plan, options).await.map(|done| {
                    if done.written.is_empty() {
                        return format!("{}: nothing to change", d.provider());
                    }
                    let phases: Vec<String> = done
                        .written
                        .iter()
                        .map(|(phase, v)| {
                            format!("{phase} (version {})", v.as_deref().unwrap_or("?"))
                        })
                        .collect();
                    format!("{}: wrote {}", d.provider(), phases.join(", "))
                })
            }
            _ => continue,
        };
        match done {
            Ok(line) => common::out!("{line}"),
            Err(e @ DeployError::ConsoleEdits { .. }) => {
                eprintln!("refused: {e}");
                return Ok(FINDING);
            }
            Err(e) => return Err(vendor_error(e)),
        }
    }
    Ok(OK)
}

async fn drift(targets: &[Target]) -> Result<u8, Fail> {
    let mut drifted = 0;
    for t in targets {
        let (shown, clean) = match t {
            Target::Fastly(d, r) => {
                let drift = d.drift(r).await.map_err(vendor_error)?;
                (drift.to_string(), drift.is_clean())
            }
            Target::Cloudflare(d, r) => {
                let drift = d.drift(r).await.map_err(vendor_error)?;
                (drift.to_string(), drift.is_clean())
            }
        };
        common::out!("{shown}");
        if !clean {
            drifted += 1;
        }
    }
    if drifted == 0 {
        common::out!("no drift: every provider runs the policy's rendering");
        Ok(OK)
    } else {
        common::out!("drift on {drifted} of {} provider(s)", targets.len());
        Ok(FINDING)
    }
}
