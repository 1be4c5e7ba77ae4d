//! `serve`: the delivery layer as one running service: beacons in, rounds of decide -> apply,
//! the dashboard, `/metrics` and the admin switches.
//!
//! ```text
//! # On loopback, with no account: two emulated CDN edges, both purge APIs, in-memory DNS,
//! # synthetic users; open the dashboard it prints.
//! cargo run --example serve
//! # Against the vendors: the policy's providers and purge tokens, DNS in Route 53 or NS1.
//! MULTICDN_ADMIN_TOKEN=... FASTLY_API_TOKEN=... CLOUDFLARE_API_TOKEN=... \
//! AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \
//! cargo run --example serve -- --policy policy.yaml --dns route53 --zone-id Z123 \
//!     --listen 0.0.0.0:8080 --admin-listen 127.0.0.1:8081 --prefixes prefixes.txt \
//!     --trusted-proxy 10.0.0.0/8 --public-url https://rum.example.com --state /var/lib/multicdn
//! ```
//!
//! The public listener serves `POST /rum/nav` and `/rum/cdn` (the beacons), `GET /rum/rum.js`
//! (the browser script, configured from the policy: put
//! `<script async src="https://rum.example.com/rum/rum.js"></script>` on the site's pages),
//! `/dashboard/`, `/api/v1/*`, `/metrics`, and content steering for video players
//! (`/steering/hls.json`, `/steering/dash.json`, following every round's plan). The admin
//! listener (keep it private) takes the
//! switches with `Authorization: Bearer $MULTICDN_ADMIN_TOKEN`:
//!
//! ```text
//! curl -H "Authorization: Bearer $TOKEN" -d '{"on":true,"who":"alice","why":"INC-42"}' \
//!      -H 'content-type: application/json' http://127.0.0.1:8081/admin/static
//! ```
//!
//! With no `--policy` it runs the embedded example policy on loopback: the emulated edges serve
//! pages that load `rum.js` (open one in a browser and its beacons arrive) and the probe
//! object, the purge APIs take purges, the five health regions probe the edges in-process, and
//! `--users` synthetic users per second send beacons from documentation networks through the
//! loopback "proxy" so the dashboard fills. A missed purge, a drain or the static switch shows
//! on the dashboard and in `/metrics` within a round.
//!
//! Against the vendors, health runs in-process for every region of the policy (a real
//! deployment runs the probes from several regions: see the `probe` tool), purges go to each
//! provider with the token its `token_env` names, and the plan goes to `--dns` (Route 53 health
//! checks or NS1 monitors are provisioned at start). `--state DIR` keeps the controller's
//! state and journal across restarts.
//!
//! With `--nats URL`, several `serve` processes run as one: each contends for a lease on the
//! NATS server (JetStream) and only the holder runs rounds, writing the DNS through a fence
//! that refuses a deposed leader's writes; the loop's state and journal live there, so a
//! standby that takes over goes on from the step a failover had reached (`multicdn::leader`).
//! Give each a `--name`; `--lease-ttl` bounds how long a dead leader's traffic goes unsteered.
//! `--shards N` adds sharded ingest: every process's receiver publishes the beacons it accepts
//! to the shards' stream, `--ingest 0,1` runs those shards' workers in the process, and the
//! leader decides on the merge of every shard's snapshot (`multicdn::shards`).
//!
//! Stops on Ctrl-C (or after `--run-for`), finishing the round in flight. Exit codes: 0
//! stopped cleanly; 2 it could not start (policy, listener, credentials, vendor).

#[path = "tools/common.rs"]
mod common;

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use common::{Fail, OK};
use multicdn::prelude::*;
use multicdn::service::steering::SteeringService;
use multicdn::service::{ServeLimits, Service, ServiceConfig, serve};
use multicdn::steering::resolve::{NetworkResolver, PrefixTable};
use multicdn::steering::video::SteeringConfig;
use multicdn_providers::http::HttpSettings;
use multicdn_providers::ns1::{self, Ns1Client};
use multicdn_providers::route53::{self, AwsCredentials, Route53Client};
use multicdn_test_support::{EdgeServer, PurgeApi};

/// The embedded example policy (the quickstart's).
const EMBEDDED_POLICY: &str = include_str!("policy.yaml");

/// Documentation networks the synthetic users come from, as the loopback demo's prefix table
/// names them: (address, country, fastly ms, cloudflare ms).
const DEMO_NETWORKS: [(&str, &str, f64, f64); 6] = [
    ("203.0.113.10", "GB", 38.0, 61.0),
    ("203.0.113.140", "DE", 45.0, 52.0),
    ("198.51.100.10", "US", 70.0, 95.0),
    ("198.51.100.140", "FR", 55.0, 49.0),
    ("192.0.2.10", "AU", 140.0, 80.0),
    ("192.0.2.140", "JP", 120.0, 98.0),
];

const DEMO_PREFIXES: &str = "
    127.0.0.0/8       AS64496  GB
    203.0.113.0/25    AS64500  GB
    203.0.113.128/25  AS64501  DE
    198.51.100.0/25   AS7922   US
    198.51.100.128/25 AS3215   FR
    192.0.2.0/25      AS1221   AU
    192.0.2.128/25    AS2516   JP
";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Dns {
    /// An in-memory steerer (what users would be answered; nothing leaves the process).
    Memory,
    /// Route 53 (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, --zone-id).
    Route53,
    /// NS1 (NS1_API_KEY).
    Ns1,
}

/// Run the delivery layer as a service.
#[derive(Debug, Parser)]
#[command(
    name = "serve",
    version,
    after_help = "Exit codes: 0 stopped cleanly; 2 it could not start."
)]
struct Cli {
    /// The policy file; without it, the embedded example policy on loopback.
    #[arg(long, value_name = "PATH")]
    policy: Option<PathBuf>,
    /// The public listener (beacons, script, dashboard, API, metrics).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The admin listener (keep it private).
    #[arg(long, default_value = "127.0.0.1:8081")]
    admin_listen: SocketAddr,
    /// Where the plan goes.
    #[arg(long, value_enum, default_value_t = Dns::Memory)]
    dns: Dns,
    /// Route 53's hosted zone id.
    #[arg(long)]
    zone_id: Option<String>,
    /// The DNS vendor's API endpoint (an emulator's, say).
    #[arg(long)]
    dns_endpoint: Option<String>,
    /// Fastly's API base (an emulator's, say).
    #[arg(long)]
    fastly_api: Option<String>,
    /// Cloudflare's API base.
    #[arg(long)]
    cloudflare_api: Option<String>,
    /// The prefix table resolving client addresses to networks (`prefix ASN country` lines).
    #[arg(long, value_name = "PATH")]
    prefixes: Option<PathBuf>,
    /// A proxy whose X-Forwarded-For / Forwarded is believed (repeatable), like 10.0.0.0/8.
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    trusted_proxies: Vec<ipnet::IpNet>,
    /// An origin allowed to send beacons (repeatable); default https://<site.host>.
    #[arg(long = "origin", value_name = "ORIGIN")]
    origins: Vec<String>,
    /// The public base URL browsers reach this service at.
    #[arg(long)]
    public_url: Option<String>,
    /// Keep the controller's state and journal in this directory.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
    /// Decide and journal, apply nothing.
    #[arg(long)]
    dry_run: bool,
    /// Synthetic users per second in the loopback demo (0: none).
    #[arg(long, default_value_t = 20)]
    users: u32,
    /// Stop after this long (`90s`, `10m`); default: until Ctrl-C.
    #[arg(long, value_parser = common::parse_duration)]
    run_for: Option<Duration>,
    /// Time between rounds (default: the policy's health interval).
    #[arg(long, value_parser = common::parse_duration)]
    interval: Option<Duration>,
    /// Probe this provider's edge at this base URL instead of the policy's host (repeatable):
    /// `fastly=http://127.0.0.1:9001`.
    #[arg(long = "edge", value_name = "ID=URL", value_parser = common::parse_edge)]
    edges: Vec<(ProviderId, String)>,
    /// One of several controllers: contend for the lease on this NATS server (JetStream) and
    /// steer only while holding it; the loop's state is shared there.
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// This controller's name among them (default: host and process id).
    #[arg(long, requires = "nats")]
    name: Option<String>,
    /// How long a leader's tenure lasts without renewal.
    #[arg(long, default_value = "15s", value_parser = common::parse_duration, requires = "nats")]
    lease_ttl: Duration,
    /// Sharded ingest over NATS with this many shards: accepted beacons are published to the
    /// shards' stream, and the leader decides on the merge of every shard's snapshot.
    #[arg(long, requires = "nats")]
    shards: Option<u16>,
    /// Run the ingest workers of these shards in this process as well (comma-separated).
    #[arg(long, value_delimiter = ',', requires = "shards")]
    ingest: Vec<u16>,
}

/// Resolves once `rx` says stop (owned, for spawned tasks).
async fn stopped_owned(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The lease and the shared state of `--nats`.
struct Cluster {
    client: async_nats::Client,
    lease: multicdn::lease::NatsLease,
    store: multicdn::leader::SharedStore,
}

async fn cluster(cli: &Cli) -> Result<Option<Cluster>, Fail> {
    use multicdn::leader::{SharedStore, StoreConfig};
    use multicdn::lease::{LeaseConfig, NatsLease};
    let Some(url) = &cli.nats else {
        return Ok(None);
    };
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(url.as_str())
        .await
        .map_err(|e| fail(&format!("connecting to NATS at {url}"))(e.to_string()))?;
    let name = cli.name.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "controller".into());
        format!("{host}-{}", std::process::id())
    });
    let lease = NatsLease::open(client.clone(), LeaseConfig::new(name, cli.lease_ttl))
        .await
        .map_err(|e| fail("the controller lease")(e.to_string()))?;
    let store = SharedStore::open(client.clone(), StoreConfig::default())
        .await
        .map_err(|e| fail("the shared controller state")(e.to_string()))?;
    Ok(Some(Cluster {
        client,
        lease,
        store,
    }))
}

#[tokio::main]
async fn main() -> ExitCode {
    common::init_tracing();
    match run(Cli::parse()).await {
        Ok(code) => ExitCode::from(code),
        Err(f) => f.report(),
    }
}

fn fail(what: &str) -> impl FnOnce(String) -> Fail + '_ {
    move |e| Fail::error(format!("error: {what}: {e}"))
}

/// 128 random bits as hex, for the loopback demo's admin token.
fn random_token() -> String {
    let a = RandomState::new().hash_one(std::process::id());
    let b = RandomState::new().hash_one(a);
    format!("{a:016x}{b:016x}")
}

/// What the loopback demo keeps running: the emulated edges and purge APIs.
struct Loopback {
    edges: Vec<(ProviderId, EdgeServer)>,
    purge: PurgeApi,
}

async fn loopback(policy: &mut Policy, public: &str) -> Result<Loopback, Fail> {
    let mut edges = Vec::new();
    for (id, pop) in [("fastly", "LHR"), ("cloudflare", "AMS")] {
        let edge = EdgeServer::start(id, pop, &policy.health.expect)
            .await
            .map_err(|e| fail("starting an emulated edge")(e.to_string()))?;
        edge.set_page_script(&format!("{public}/rum/rum.js"));
        let id = ProviderId::new(id).map_err(|e| fail("provider id")(e.to_string()))?;
        policy
            .steering
            .rum
            .probe
            .objects
            .insert(id.clone(), edge.url("/_multicdn/probe.gif"));
        edges.push((id, edge));
    }
    let purge = PurgeApi::start()
        .await
        .map_err(|e| fail("starting the emulated purge APIs")(e.to_string()))?;
    Ok(Loopback { edges, purge })
}

fn monitor(policy: &Policy, overrides: &BTreeMap<ProviderId, String>) -> Result<Monitor, Fail> {
    let targets =
        targets_from_policy(policy, overrides).map_err(|e| fail("probe targets")(e.to_string()))?;
    let mut builder = Monitor::builder(HealthConfig::from_policy(&policy.health)).targets(targets);
    for region in &policy.health.regions {
        let probe = HttpProbe::builder(region.clone())
            .build()
            .map_err(|e| fail("probe")(e.to_string()))?;
        builder = builder.runner(probe);
    }
    builder.build().map_err(|e| fail("monitor")(e.to_string()))
}

async fn actuator(cli: &Cli, policy: &Policy) -> Result<Arc<dyn Steerer>, Fail> {
    let settings = HttpSettings::default();
    let vendor = |e: multicdn_core::Error| fail("DNS vendor")(e.to_string());
    Ok(match cli.dns {
        Dns::Memory => {
            let m = MemorySteerer::new();
            m.apply(&policy.static_plan(), &ApplyOptions::default().force(true))
                .await
                .map_err(vendor)?;
            Arc::new(m)
        }
        Dns::Route53 => {
            let zone = cli.zone_id.as_deref().ok_or_else(|| {
                Fail::error("error: --dns route53 needs --zone-id (the hosted zone's id)")
            })?;
            let endpoint = cli
                .dns_endpoint
                .as_deref()
                .unwrap_or(route53::DEFAULT_ENDPOINT);
            let client = Route53Client::new(
                endpoint,
                AwsCredentials::from_env().map_err(vendor)?,
                settings,
            )
            .map_err(vendor)?;
            let mut s = Route53Steerer::from_policy(client, zone, policy);
            s.provision_health_checks(policy, None)
                .await
                .map_err(vendor)?;
            Arc::new(s)
        }
        Dns::Ns1 => {
            let endpoint = cli.dns_endpoint.as_deref().unwrap_or(ns1::DEFAULT_BASE);
            let client = Ns1Client::from_env(endpoint, "NS1_API_KEY", settings).map_err(vendor)?;
            let mut s = Ns1Steerer::from_policy(client, policy);
            s.provision_monitors(policy, &format!("multicdn {}", policy.steering.record))
                .await
                .map_err(vendor)?;
            Arc::new(s)
        }
    })
}

/// Synthetic users: every second, `users` navigation beacons (and a probe beacon on every
/// tenth) from the demo networks, sent through the loopback "proxy" with X-Forwarded-For.
async fn demo_users(base: String, origin: String, users: u32) {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no synthetic users");
            return;
        }
    };
    let noise = RandomState::new();
    let mut n: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        for _ in 0..users {
            n += 1;
            let (ip, _, fastly, cloudflare) =
                DEMO_NETWORKS[(n % DEMO_NETWORKS.len() as u64) as usize];
            // Heavy-tailed noise around each network's typical time.
            let u = (noise.hash_one(n) % 10_000) as f64 / 10_000.0;
            let spread = 1.0 + 0.6 * (-(1.0 - u).ln());
            let (provider, typical) = if noise.hash_one(!n).is_multiple_of(3) {
                ("cloudflare", cloudflare)
            } else {
                ("fastly", fastly)
            };
            let nav = format!(
                r#"{{"id":"demo-{n}","path":"/products/{}","ttfb":{:.1},"provider":"{provider}","pop":"","cache":"HIT"}}"#,
                n % 50,
                typical * spread
            );
            let mut sends = vec![("/rum/nav", nav)];
            if n.is_multiple_of(10) {
                sends.push((
                    "/rum/cdn",
                    format!(
                        r#"{{"id":"demo-p{n}","times":{{"fastly":{:.1},"cloudflare":{:.1}}}}}"#,
                        fastly * spread,
                        cloudflare * spread
                    ),
                ));
            }
            for (path, body) in sends {
                let _ = client
                    .post(format!("{base}{path}"))
                    .header("content-type", "text/plain;charset=UTF-8")
                    .header("origin", &origin)
                    .header("x-forwarded-for", ip)
                    .body(body)
                    .send()
                    .await;
            }
        }
    }
}

async fn run(cli: Cli) -> Result<u8, Fail> {
    let demo = cli.policy.is_none();
    let (mut policy, policy_path) = match &cli.policy {
        Some(path) => (common::load_policy(path)?, path.clone()),
        None => (
            Policy::from_yaml(EMBEDDED_POLICY, "examples/policy.yaml (embedded)")
                .map_err(|e| Fail::error(format!("{e}")))?,
            PathBuf::from("examples/policy.yaml (embedded)"),
        ),
    };
    let public_listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .map_err(|e| fail(&format!("listening on {}", cli.listen))(e.to_string()))?;
    let admin_listener = tokio::net::TcpListener::bind(cli.admin_listen)
        .await
        .map_err(|e| fail(&format!("listening on {}", cli.admin_listen))(e.to_string()))?;
    let public_addr = public_listener
        .local_addr()
        .map_err(|e| fail("listener")(e.to_string()))?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|e| fail("listener")(e.to_string()))?;
    let public = cli
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{public_addr}"));

    let lab = if demo {
        Some(loopback(&mut policy, &public).await?)
    } else {
        None
    };
    let mut overrides: BTreeMap<ProviderId, String> = lab
        .as_ref()
        .map(|l| {
            l.edges
                .iter()
                .map(|(p, e)| (p.clone(), e.base_url()))
                .collect()
        })
        .unwrap_or_default();
    overrides.extend(common::overrides(&cli.edges)?);
    let apis = match &lab {
        Some(l) => common::VendorApis {
            fastly: Some(l.purge.fastly_base()),
            cloudflare: Some(l.purge.cloudflare_base()),
            shield: None,
        },
        None => common::VendorApis {
            fastly: cli.fastly_api.clone(),
            cloudflare: cli.cloudflare_api.clone(),
            shield: None,
        },
    };
    if demo {
        // The emulated purge APIs take any token.
        for spec in policy.providers.values_mut() {
            spec.token_env = None;
        }
        if policy.shield.take().is_some() {
            eprintln!(
                "note: the loopback demo has no origin shield; purges skip the policy's shield section"
            );
        }
    }
    let fanout =
        common::purge_fanout(&policy, &policy_path, &HttpSettings::default(), &apis, demo)?;
    let resolver: Arc<dyn NetworkResolver> = match (&cli.prefixes, demo) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| fail(&format!("reading {}", path.display()))(e.to_string()))?;
            Arc::new(
                PrefixTable::from_lines(&text)
                    .map_err(|e| fail(&path.display().to_string())(e.to_string()))?,
            )
        }
        (None, true) => Arc::new(
            PrefixTable::from_lines(DEMO_PREFIXES)
                .map_err(|e| fail("demo prefixes")(e.to_string()))?,
        ),
        (None, false) => {
            tracing::warn!("no --prefixes: beacons count only under the global cut");
            Arc::new(multicdn::steering::resolve::NoResolver)
        }
    };
    // Content steering for video players, fed by the same rounds.
    let video_plan = SharedPlan::new();
    let content_steerer = ContentSteeringSteerer::new(
        ProviderId::new("content-steering").map_err(|e| fail("content steering")(e.to_string()))?,
        video_plan.clone(),
    );
    let cluster = cluster(&cli).await?;
    let dns_name = format!("{:?}", cli.dns).to_lowercase();
    let dns: Arc<dyn Steerer> = match &cluster {
        // Every write re-checks the lease: a deposed leader's is refused.
        Some(c) => Arc::new(multicdn::lease::FencedSteerer::new(
            c.lease.clone(),
            actuator(&cli, &policy).await?,
            ProviderId::new(&dns_name).map_err(|e| fail("actuator")(e.to_string()))?,
        )),
        None => actuator(&cli, &policy).await?,
    };
    let mut builder = Controller::builder(policy.clone())
        .content_steering(content_steerer)
        .shared_actuator(dns_name, dns)
        .monitor(monitor(&policy, &overrides)?)
        .purge_fanout(fanout)
        .resolver(resolver.clone())
        .dry_run(cli.dry_run);
    if let Some(dir) = &cli.state {
        builder = builder.store(FileStore::new(dir));
    }
    if let Some(interval) = cli.interval {
        builder = builder.interval(interval);
    }
    let controller = builder
        .build()
        .map_err(|e| fail("controller")(e.to_string()))?;

    let token = match std::env::var("MULTICDN_ADMIN_TOKEN") {
        Ok(t) if !t.trim().is_empty() => Some(t),
        _ if demo => Some(random_token()),
        _ => None,
    };
    let mut config = ServiceConfig::for_policy(&policy);
    let mut origins = cli.origins.clone();
    if let Some(l) = &lab {
        origins.extend(l.edges.iter().map(|(_, e)| e.base_url()));
        origins.push(format!("https://{}", policy.site.host));
    }
    if !origins.is_empty() {
        config = config.origins(origins);
    }
    let mut trusted = cli.trusted_proxies.clone();
    if demo {
        // The synthetic users come "through" loopback with X-Forwarded-For.
        trusted.extend("127.0.0.0/8".parse::<ipnet::IpNet>());
    }
    config = config.trusted_proxies(trusted).public_url(public.clone());
    if let Some(t) = &token {
        config = config.admin_token(t.clone());
    }
    let mut steering = SteeringService::new(SteeringConfig::from_policy(&policy), video_plan)
        .origins(config.origins.clone())
        .trusted_proxies(config.trusted_proxies.clone())
        .resolver(resolver);
    if let Some(t) = &token {
        steering = steering.admin_token(t.clone());
    }
    // Players and browsers that connect directly get a per-address connection cap, so one host
    // cannot take every slot; behind trusted proxies every connection comes from a few
    // addresses, so there the global cap is the only one.
    let public_limits = if config.trusted_proxies.is_empty() {
        ServeLimits::default().per_client_connections(64)
    } else {
        ServeLimits::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shards_config = cli.shards.map(multicdn::shards::ShardsConfig::new);
    let mut workers = Vec::new();
    let mut publisher_handle = None;
    if let (Some(c), Some(sc)) = (&cluster, &shards_config) {
        let holder = c.lease.config().holder.clone();
        let publisher = multicdn::shards::BeaconPublisher::start(
            c.client.clone(),
            multicdn::shards::PublisherConfig::new(format!("receiver-{holder}"), sc.clone()),
            controller.clock(),
        )
        .await
        .map_err(|e| fail("the shard publisher")(e.to_string()))?;
        publisher_handle = Some(publisher.clone());
        config = config.publisher(publisher);
        for &shard in &cli.ingest {
            let board = multicdn::steering::scoreboard::Scoreboard::new(
                multicdn::steering::scoreboard::ScoreboardConfig::from_policy(&policy.steering.rum),
                &policy.provider_ids(),
            )
            .map_err(|e| fail("scoreboard")(e.to_string()))?;
            let probe_order = policy
                .provider_ids()
                .iter()
                .map(|p| p.as_str().to_owned())
                .collect();
            let worker = multicdn::shards::IngestWorker::open(
                c.client.clone(),
                multicdn::shards::WorkerConfig::new(
                    shard,
                    format!("ingest-{holder}-{shard}"),
                    sc.clone(),
                ),
                board,
                probe_order,
                controller.clock(),
            )
            .await
            .map_err(|e| fail(&format!("the ingest worker of shard {shard}"))(e.to_string()))?;
            workers.push(tokio::spawn(worker.run(stopped_owned(stop_rx.clone()))));
        }
    }
    let service = Service::new(controller, config);

    common::out!("multicdn serve: {}", policy_path.display());
    common::out!("  dashboard   {public}/dashboard/");
    common::out!("  script      {public}/rum/rum.js");
    common::out!("  metrics     {public}/metrics");
    common::out!("  steering    {public}/steering/hls.json, {public}/steering/dash.json");
    common::out!("  admin       http://{admin_addr}/admin/...");
    match (&token, demo) {
        (Some(t), true) => common::out!("  admin token {t} (generated for this run)"),
        (Some(_), false) => common::out!("  admin token from MULTICDN_ADMIN_TOKEN"),
        (None, _) => {
            common::out!("  admin       off: set MULTICDN_ADMIN_TOKEN to enable the switches")
        }
    }
    if let Some(l) = &lab {
        for (p, e) in &l.edges {
            common::out!(
                "  a page through {p}: {} (loads rum.js)",
                e.url("/products/1")
            );
        }
    }

    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let rounds = {
        let s = service.clone();
        let rx = stop_rx.clone();
        match cluster {
            Some(c) => {
                common::out!(
                    "  leadership  lease {} on {}",
                    c.lease.config().holder,
                    cli.nats.as_deref().unwrap_or_default()
                );
                let set = match &shards_config {
                    Some(sc) => Some(
                        multicdn::shards::ShardSet::open(c.client.clone(), sc.clone())
                            .await
                            .map_err(|e| fail("the shards' snapshots")(e.to_string()))?,
                    ),
                    None => None,
                };
                let mut leader =
                    multicdn::leader::Leader::new(s.controller().clone(), c.lease, c.store);
                if let Some(set) = set {
                    leader = leader
                        .with_shards(set)
                        .map_err(|e| fail("the shards' snapshots")(e.to_string()))?;
                }
                tokio::spawn(async move { s.run_led(&leader, stopped(rx)).await })
            }
            None => tokio::spawn(async move { s.run(stopped(rx)).await }),
        }
    };
    let admin = tokio::spawn(serve(
        admin_listener,
        service.admin_router().merge(steering.admin_router()),
        ServeLimits::default(),
        stopped(stop_rx.clone()),
    ));
    let users = (demo && cli.users > 0).then(|| {
        tokio::spawn(demo_users(
            public.clone(),
            format!("https://{}", policy.site.host),
            cli.users,
        ))
    });
    let s = service.clone();
    let public_server = tokio::spawn({
        let rx = stop_rx.clone();
        async move {
            s.serve_with(
                public_listener,
                steering.router(),
                public_limits,
                stopped(rx),
            )
            .await
        }
    });
    match cli.run_for {
        Some(d) => tokio::time::sleep(d).await,
        None => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    common::out!("stopping: finishing the round in flight");
    let _ = stop_tx.send(true);
    if let Some(u) = users {
        u.abort();
    }
    let _ = rounds.await;
    for w in workers {
        match w.await {
            Ok(Ok(stats)) => common::out!("ingest worker stopped: {stats:?}"),
            Ok(Err(e)) => common::out!("an ingest worker stopped with an error: {e}"),
            Err(e) => common::out!("an ingest worker failed: {e}"),
        }
    }
    let _ = admin.await;
    let served = public_server.await;
    if let Some(p) = publisher_handle {
        // What the receiver accepted goes to the shards before the process ends.
        let report = p.close(Duration::from_secs(5)).await;
        if report.left > 0 {
            common::out!(
                "{} beacons could not be published to the shards before stopping",
                report.left
            );
        }
    }
    drop(lab);
    common::out!(
        "served {} navigation and {} probe beacons over {} rounds",
        service.accepted(false),
        service.accepted(true),
        service.controller().last_round().await
    );
    match served {
        Ok(Ok(())) => Ok(OK),
        Ok(Err(e)) => Err(fail("public listener")(e.to_string())),
        Err(e) => Err(Fail::error(format!(
            "error: the public listener stopped: {e}"
        ))),
    }
}
