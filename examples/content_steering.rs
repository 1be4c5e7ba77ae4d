//! `content-steering`: a content-steering server for HLS and DASH players, on its own.
//!
//! ```text
//! cargo run -p multicdn-examples --example content-steering -- --listen 127.0.0.1:8080
//! curl 'http://127.0.0.1:8080/steering/hls.json?_HLS_pathway=cdn-a&_HLS_throughput=5000000'
//! MULTICDN_ADMIN_TOKEN=secret cargo run -p multicdn-examples --example content-steering -- \
//!     --policy examples/policy.yaml --admin-listen 127.0.0.1:8081
//! curl -X POST -H 'Authorization: Bearer secret' http://127.0.0.1:8081/admin/steering/incident
//! ```
//!
//! Players find it through `#EXT-X-CONTENT-STEERING:SERVER-URI="http://.../steering/hls.json"`
//! (HLS) or `<ContentSteering>http://.../steering/dash.json</ContentSteering>` (DASH). This
//! serves a fixed plan (the policy's static weights, or cdn-a 70% / cdn-b 30%); the `serve`
//! tool serves the same routes following every round of the Controller. The TTL is the
//! policy's `steering.ttl` (`--ttl` overrides it), shorter while an incident is declared, a
//! provider is out or the plan has just changed. Each client address has its own limit; an
//! HLS client over it gets a 200 with a long TTL (hls.js stops for good after a 429), a DASH
//! client a 429 with `Retry-After`. CORS allows `--origin` (default: the policy's site, or any
//! origin without a policy). The incident switch is on `--admin-listen`, behind
//! `MULTICDN_ADMIN_TOKEN`, never on the players' port. Connections are capped and headers
//! must arrive within 10 s.
//!
//! Exit codes: 0 after Ctrl-C, 1 when an address cannot be bound or the policy cannot be read.

#[path = "tools/common.rs"]
mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use multicdn::service::steering::SteeringService;
use multicdn::service::{ServeLimits, serve};
use multicdn_core::{
    ApplyOptions, CohortId, CohortPlan, NetworkKey, Policy, ProviderId, Steerer, SteeringPlan,
    Weights,
};
use multicdn_steering::video::{ContentSteeringSteerer, RateLimit, SharedPlan, SteeringConfig};

/// Serve content-steering manifests for HLS (/steering/hls.json) and DASH (/steering/dash.json).
#[derive(Debug, Parser)]
#[command(name = "content-steering", version)]
struct Cli {
    /// Address players reach.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Address of the incident switch (keep it private); needs MULTICDN_ADMIN_TOKEN.
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// A multicdn policy file: its static plan, steering.ttl and site. Without it: one cohort
    /// for every network, cdn-a 70% and cdn-b 30%.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Manifest TTL in seconds, instead of the policy's steering.ttl (300 without a policy).
    #[arg(long)]
    ttl: Option<u64>,
    /// Manifest TTL in seconds while an incident is declared or a provider is out.
    #[arg(long)]
    incident_ttl: Option<u64>,
    /// Start with an incident declared.
    #[arg(long)]
    incident: bool,
    /// Bound on requests a second over every client (answered as for a client over its own).
    #[arg(long)]
    max_rps: Option<f64>,
    /// Origins whose pages may fetch the manifests (repeatable; `*` for any).
    #[arg(long = "origin", value_name = "ORIGIN")]
    origins: Vec<String>,
}

fn default_plan() -> Result<SteeringPlan, Box<dyn std::error::Error>> {
    let weights = Weights::from_percentages([
        (ProviderId::new("cdn-a")?, 70.0),
        (ProviderId::new("cdn-b")?, 30.0),
    ])?;
    Ok(SteeringPlan {
        record: "video".into(),
        ttl: Duration::from_secs(300),
        cohorts: vec![CohortPlan {
            cohort: CohortId::new("default")?,
            networks: [NetworkKey::Global].into(),
            weights,
        }],
    })
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let policy = cli.policy.as_ref().map(Policy::load).transpose()?;
    let (plan, mut config, origins) = match &policy {
        Some(p) => (
            p.static_plan(),
            SteeringConfig::from_policy(p),
            vec![format!("https://{}", p.site.host)],
        ),
        None => (
            default_plan()?,
            SteeringConfig::default().client_limit(RateLimit {
                per_second: 2.0,
                burst: 20,
            }),
            vec!["*".to_owned()],
        ),
    };
    if let Some(t) = cli.ttl {
        config = config.ttl(Duration::from_secs(t.max(1)));
    }
    if let Some(t) = cli.incident_ttl {
        config = config.incident_ttl(Duration::from_secs(t.max(1)));
    }
    if let Some(rps) = cli.max_rps {
        config = config.rate_limit(RateLimit {
            per_second: rps,
            burst: rps.ceil().max(1.0) as u32,
        });
    }
    let shared = SharedPlan::new();
    let steerer = ContentSteeringSteerer::new(ProviderId::new("content-steering")?, shared.clone());
    steerer.apply(&plan, &ApplyOptions::default()).await?;
    let origins = if cli.origins.is_empty() {
        origins
    } else {
        cli.origins.clone()
    };
    let mut service = SteeringService::new(config, shared).origins(origins);
    let token = std::env::var("MULTICDN_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty());
    if let Some(t) = &token {
        service = service.admin_token(t.clone());
    }
    service.handler().set_incident(cli.incident);

    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    let addr = listener.local_addr()?;
    common::out!("content steering for {} cohort(s):", plan.cohorts.len());
    for c in &plan.cohorts {
        common::out!("  {}: {}", c.cohort, c.weights);
    }
    common::out!("HLS  manifest: http://{addr}/steering/hls.json");
    common::out!("DASH manifest: http://{addr}/steering/dash.json");
    let admin = match cli.admin_listen {
        Some(a) => {
            let l = tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| format!("cannot listen on {a}: {e}"))?;
            common::out!(
                "incident switch: POST/DELETE http://{}/admin/steering/incident{}",
                l.local_addr()?,
                if token.is_some() {
                    ""
                } else {
                    " (refused: MULTICDN_ADMIN_TOKEN is not set)"
                }
            );
            Some(tokio::spawn(serve(
                l,
                service.admin_router(),
                ServeLimits::default(),
                ctrl_c(),
            )))
        }
        None => None,
    };
    common::out!("Ctrl-C to stop");
    // Players connect directly here: one address gets at most 64 connections.
    let limits = ServeLimits::default().per_client_connections(64);
    serve(listener, service.router(), limits, ctrl_c()).await?;
    if let Some(a) = admin {
        let _ = a.await;
    }
    let s = service.stats();
    common::out!(
        "stopped: {} served, {} over a limit, {} report entries skipped",
        s.served,
        s.limited,
        s.rejected_reports
    );
    Ok(())
}

async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}

#[tokio::main]
async fn main() -> ExitCode {
    common::init_tracing();
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
