//! `content-steering`: a content-steering server for HLS and DASH players.
//!
//! ```text
//! cargo run -p multicdn-examples --example content-steering -- --listen 127.0.0.1:8080
//! curl 'http://127.0.0.1:8080/hls.json?_HLS_pathway=cdn-a&_HLS_throughput=5000000' \
//!      -H 'X-Client-Network: AS7922,US'
//! ```
//!
//! Players find it through `#EXT-X-CONTENT-STEERING:SERVER-URI="http://.../hls.json"` (HLS) or
//! `<ContentSteering>http://.../dash.json</ContentSteering>` (DASH). The client's networks come
//! from the `X-Client-Network` header an edge or load balancer sets (ASN, country, continent,
//! comma-separated). `POST /incident` declares an incident (short TTL), `DELETE /incident` ends
//! it. Players' throughput reports are logged as they arrive.
//!
//! Exit codes: 0 after Ctrl-C, 1 when the address cannot be bound or the policy cannot be read.

#[path = "tools/common.rs"]
mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use multicdn_core::{
    ApplyOptions, Clock, CohortId, CohortPlan, NetworkKey, Policy, ProviderId, Steerer,
    SteeringPlan, SystemClock, Weights,
};
use multicdn_steering::video::{
    ContentSteering, ContentSteeringSteerer, Protocol, RateLimit, SharedPlan, SteeringConfig,
    SteeringRequest,
};

/// Serve content-steering manifests for HLS (/hls.json) and DASH (/dash.json).
#[derive(Debug, Parser)]
#[command(name = "content-steering", version)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// A multicdn policy file whose static plan is served. Without it: one cohort for every
    /// network, cdn-a 70% and cdn-b 30%.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Manifest TTL in seconds.
    #[arg(long, default_value_t = 300)]
    ttl: u64,
    /// Manifest TTL in seconds while an incident is declared.
    #[arg(long, default_value_t = 30)]
    incident_ttl: u64,
    /// Start with an incident declared.
    #[arg(long)]
    incident: bool,
    /// Answer 429 with Retry-After above this many requests per second.
    #[arg(long)]
    max_rps: Option<f64>,
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

#[derive(Debug)]
struct App {
    handler: ContentSteering,
    clock: SystemClock,
}

fn networks(headers: &HeaderMap) -> Vec<NetworkKey> {
    headers
        .get("x-client-network")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn serve(app: &App, protocol: Protocol, query: Option<String>, headers: &HeaderMap) -> Response {
    let request = SteeringRequest::from_query_string(
        protocol,
        query.as_deref().unwrap_or(""),
        networks(headers),
    );
    let r = app.handler.handle(&request, app.clock.now());
    for m in &r.measurements {
        let net = m
            .network
            .map(|n| n.to_string())
            .unwrap_or_else(|| "?".into());
        tracing::info!(
            network = %net,
            pathway = %m.pathway,
            mbps = m.throughput_bps as f64 / 1e6,
            "throughput report"
        );
    }
    if let Some(e) = &r.rejected {
        tracing::warn!("ignored a malformed report: {e}");
    }
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = HeaderMap::new();
    for (k, v) in &r.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::try_from(k.as_str()),
            HeaderValue::try_from(v.as_str()),
        ) {
            out.insert(k, v);
        }
    }
    (status, out, r.body).into_response()
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let plan = match &cli.policy {
        Some(path) => Policy::load(path)?.static_plan(),
        None => default_plan()?,
    };
    let shared = SharedPlan::new();
    let steerer = ContentSteeringSteerer::new(ProviderId::new("content-steering")?, shared.clone());
    steerer.apply(&plan, &ApplyOptions::default()).await?;
    let mut config = SteeringConfig::default()
        .ttl(Duration::from_secs(cli.ttl.max(1)))
        .incident_ttl(Duration::from_secs(cli.incident_ttl.max(1)));
    if let Some(rps) = cli.max_rps {
        config = config.rate_limit(RateLimit {
            per_second: rps,
            burst: rps.ceil().max(1.0) as u32,
        });
    }
    let handler = ContentSteering::new(config, shared);
    handler.set_incident(cli.incident);
    let app = Arc::new(App {
        handler,
        clock: SystemClock,
    });
    let router = Router::new()
        .route(
            "/hls.json",
            get(
                |State(a): State<Arc<App>>, RawQuery(q): RawQuery, h: HeaderMap| async move {
                    serve(&a, Protocol::Hls, q, &h)
                },
            ),
        )
        .route(
            "/dash.json",
            get(
                |State(a): State<Arc<App>>, RawQuery(q): RawQuery, h: HeaderMap| async move {
                    serve(&a, Protocol::Dash, q, &h)
                },
            ),
        )
        .route(
            "/incident",
            post(|State(a): State<Arc<App>>| async move {
                a.handler.set_incident(true);
                tracing::warn!(
                    "incident declared: TTL {}s",
                    a.handler.current_ttl().as_secs()
                );
                StatusCode::NO_CONTENT
            })
            .delete(|State(a): State<Arc<App>>| async move {
                a.handler.set_incident(false);
                tracing::info!("incident over: TTL {}s", a.handler.current_ttl().as_secs());
                StatusCode::NO_CONTENT
            }),
        )
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    let addr = listener.local_addr()?;
    common::out!("content steering for {} cohort(s):", plan.cohorts.len());
    for c in &plan.cohorts {
        common::out!("  {}: {}", c.cohort, c.weights);
    }
    common::out!("HLS  manifest: http://{addr}/hls.json");
    common::out!("DASH manifest: http://{addr}/dash.json");
    common::out!("Ctrl-C to stop");
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    common::out!("stopped");
    Ok(())
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
