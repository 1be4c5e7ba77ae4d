//! The delivery layer as a service a team runs: beacons in, the one dashboard out, metrics,
//! and the operator's switches, around one [`Controller`].
//!
//! ```text
//!             browsers (rum.js)                     people               Prometheus
//!    POST /rum/nav, /rum/cdn   GET /rum/rum.js   GET /dashboard/, /api/v1/*   GET /metrics
//!                 │                                      │                        │
//!                 ▼                                      ▼                        ▼
//!       receiver (origin, type, size, client, rate, beacon) ──► Controller ◄── rounds (Service::run)
//!                                                                    ▲
//!                          admin router (bearer token): static, pins, drain, dry run
//! ```
//!
//! [`Service::router`] is the public router (mount it in your own axum server or serve it with
//! [`serve`]); [`Service::admin_router`] holds the switches, behind a bearer token, for a
//! separate listener. [`Service::run`] runs the controller's rounds and keeps the metrics and
//! the dashboard's history; [`serve`] is an HTTP/1.1 server that reads headers with a
//! timeout, caps connections and answers overload with `503`.
//!
//! ```no_run
//! # async fn demo(policy: multicdn::core::Policy) -> Result<(), Box<dyn std::error::Error>> {
//! use multicdn::prelude::*;
//! use multicdn::service::{Service, ServiceConfig, ServeLimits, serve};
//!
//! let controller = Controller::builder(policy.clone()).build()?;
//! let config = ServiceConfig::for_policy(&policy).admin_token("a long random secret");
//! let service = Service::new(controller, config);
//! let public = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! let admin = tokio::net::TcpListener::bind("127.0.0.1:8081").await?;
//! let rounds = service.clone();
//! tokio::spawn(async move { rounds.run(std::future::pending()).await });
//! tokio::spawn(serve(admin, service.admin_router(), ServeLimits::default(), std::future::pending()));
//! serve(public, service.router(), ServeLimits::default(), std::future::pending()).await?;
//! # Ok(()) }
//! ```

mod admin;
mod api;
mod assets;
pub mod cmsd;
mod history;
mod metrics;
mod receiver;
mod server;
pub mod steering;

pub use assets::CMSD_HLS_JS;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::routing::{any, get};
use ipnet::IpNet;
use multicdn_core::secret::Secret;
use multicdn_core::{Policy, ProviderId, Timestamp};

use crate::controller::{Controller, RoundReport};

pub use receiver::{ClientLimit, Reject};
pub use server::{ServeLimits, serve};

use history::History;
use metrics::Metrics;
use receiver::{Cors, Kind, Receiver};

/// What the service needs beyond the policy.
#[derive(Clone)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// Origins allowed to send beacons (`https://www.example.com`); `*` allows any.
    pub origins: Vec<String>,
    /// Proxies whose `Forwarded` / `X-Forwarded-For` are believed (`10.0.0.0/8`).
    pub trusted_proxies: Vec<IpNet>,
    /// The largest beacon body, in bytes.
    pub body_limit: usize,
    /// How long a body may take to arrive.
    pub body_timeout: Duration,
    /// The per-client rate limit.
    pub client_limit: ClientLimit,
    /// How far ahead of the receive time a client's own clock may be.
    pub skew: Duration,
    /// Beacon ids remembered to refuse duplicates.
    pub remembered_ids: usize,
    /// The bearer token of the admin router; none: every switch is refused.
    pub admin_token: Option<Secret>,
    /// The service's public base URL as browsers reach it (`https://rum.example.com`); none:
    /// from the request's `Host`.
    pub public_url: Option<String>,
    /// Rounds of history kept for the dashboard's charts.
    pub history: usize,
    /// Where accepted beacons are also published for sharded ingest (feature `nats`).
    #[cfg(feature = "nats")]
    pub publisher: Option<crate::shards::BeaconPublisher>,
}

impl fmt::Debug for ServiceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceConfig")
            .field("origins", &self.origins)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("body_limit", &self.body_limit)
            .field("client_limit", &self.client_limit)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

impl ServiceConfig {
    /// Defaults for `policy`'s site: beacons from `https://<site.host>`, 8 KiB bodies within
    /// 5 s, 10 beacons a second per client (bursts of 30), 5 minutes of clock skew, the last
    /// 100,000 beacon ids, a day of 30-second rounds of history, no admin token.
    pub fn for_policy(policy: &Policy) -> ServiceConfig {
        ServiceConfig {
            origins: vec![format!("https://{}", policy.site.host)],
            trusted_proxies: Vec::new(),
            body_limit: 8 * 1024,
            body_timeout: Duration::from_secs(5),
            client_limit: ClientLimit::default(),
            skew: Duration::from_secs(300),
            remembered_ids: 100_000,
            admin_token: None,
            public_url: None,
            history: 2880,
            #[cfg(feature = "nats")]
            publisher: None,
        }
    }

    /// Also publishes every accepted beacon to its shard (feature `nats`); a beacon the
    /// publisher drops is counted in `multicdn_beacons_publish_dropped_total`.
    #[cfg(feature = "nats")]
    pub fn publisher(mut self, publisher: crate::shards::BeaconPublisher) -> Self {
        self.publisher = Some(publisher);
        self
    }

    /// Sets the admin token.
    pub fn admin_token(mut self, token: impl Into<String>) -> Self {
        self.admin_token = Some(Secret::new(token.into()));
        self
    }

    /// Sets the origins allowed to send beacons.
    pub fn origins(mut self, origins: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.origins = origins.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the trusted proxies.
    pub fn trusted_proxies(mut self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        self.trusted_proxies = nets.into_iter().collect();
        self
    }

    /// Sets the per-client rate limit.
    pub fn client_limit(mut self, limit: ClientLimit) -> Self {
        self.client_limit = limit;
        self
    }

    /// Sets the public base URL.
    pub fn public_url(mut self, url: impl Into<String>) -> Self {
        self.public_url = Some(url.into().trim_end_matches('/').to_owned());
        self
    }

    fn allows_origin(&self, origin: &[u8]) -> bool {
        self.origins
            .iter()
            .any(|o| o == "*" || o.as_bytes().eq_ignore_ascii_case(origin))
    }
}

/// The service: cheap to clone, clones share everything.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

struct Inner {
    controller: Controller,
    config: ServiceConfig,
    metrics: Metrics,
    receiver: Receiver,
    cors: Cors,
    history: Mutex<History>,
    providers: Vec<ProviderId>,
}

impl fmt::Debug for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Service")
            .field("controller", &self.inner.controller)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// A service around `controller`.
    pub fn new(controller: Controller, config: ServiceConfig) -> Service {
        let providers = controller.policy().provider_ids();
        Service {
            inner: Arc::new(Inner {
                receiver: Receiver::new(config.client_limit, config.remembered_ids),
                cors: Cors::new(&config.origins),
                history: Mutex::new(History::new(config.history)),
                metrics: Metrics::new(),
                providers,
                controller,
                config,
            }),
        }
    }

    /// The controller.
    pub fn controller(&self) -> &Controller {
        &self.inner.controller
    }

    fn providers(&self) -> &[ProviderId] {
        &self.inner.providers
    }

    /// Beacons refused so far for `reason`, at `/rum/nav` (`nav`) or `/rum/cdn` (`probe`).
    pub fn rejected(&self, probe: bool, reason: Reject) -> u64 {
        let kind = if probe { Kind::Probe } else { Kind::Nav };
        self.inner.metrics.rejected_count(kind, reason)
    }

    /// Beacons accepted so far at `/rum/nav` (`probe` false) or `/rum/cdn`.
    pub fn accepted(&self, probe: bool) -> u64 {
        let kind = if probe { Kind::Probe } else { Kind::Nav };
        self.inner.metrics.accepted_count(kind)
    }

    /// Beacons whose forwarding header came from an untrusted peer and was not believed.
    pub fn forwarded_ignored(&self) -> u64 {
        self.inner.metrics.forwarded_ignored_count()
    }

    /// What the receiver holds whatever it is sent: rate buckets in use (at most
    /// [`ClientLimit::buckets`]) and beacon ids remembered (at most
    /// [`ServiceConfig::remembered_ids`], and only of accepted beacons).
    pub fn footprint(&self) -> (usize, usize) {
        self.inner.receiver.footprint()
    }

    /// The Prometheus text exposition.
    pub fn metrics_text(&self) -> String {
        self.inner.metrics.encode()
    }

    /// One controller round at `now`, observed: metrics, history, rate table tidied.
    pub async fn round(&self, now: Timestamp) -> RoundReport {
        let started = multicdn_core::clock::Stopwatch::start();
        let report = self.inner.controller.round(now).await;
        self.observe(&report, started.elapsed().as_secs_f64(), now)
            .await;
        report
    }

    async fn observe(&self, report: &RoundReport, seconds: f64, now: Timestamp) {
        self.inner.metrics.round(report, seconds);
        let ledger = self.inner.controller.ledger().await;
        for p in self.providers() {
            self.inner
                .metrics
                .provider_up(p.as_str(), !ledger.get(p).is_some_and(|e| e.is_out()));
        }
        // Reading every cell of the snapshot (the counts, the history's p75s) takes tens of
        // milliseconds on a large board: a blocking thread does it, not one serving beacons.
        let inner = Arc::clone(&self.inner);
        let snapshot = Arc::clone(&report.snapshot);
        crate::controller::off_runtime(move || {
            for (label, metric) in [
                ("ttfb", multicdn_steering::scoreboard::Metric::Ttfb),
                ("probe", multicdn_steering::scoreboard::Metric::Probe),
            ] {
                let (cells, steerable) = api::count_cells(&snapshot, metric, &inner.providers);
                inner.metrics.cells(label, cells, steerable);
            }
            inner
                .history
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(now, &snapshot, &inner.providers);
        })
        .await;
        self.inner.receiver.tidy();
    }

    /// Runs a round now and then every controller interval, by the controller's clock, until
    /// `shutdown` completes; a round in flight finishes first.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let clock = self.inner.controller.clock();
        crate::controller::every(self.inner.controller.interval(), shutdown, || async {
            crate::controller::drop_off_runtime(self.round(clock.now()).await);
        })
        .await;
    }

    /// As [`Service::run`], behind `leader` (feature `nats`): the controller's rounds run
    /// only while this process holds the lease, each observed as [`Service::run`] observes
    /// them; a follower serves beacons, the dashboard and the API meanwhile.
    #[cfg(feature = "nats")]
    pub async fn run_led(
        &self,
        leader: &crate::leader::Leader,
        shutdown: impl Future<Output = ()>,
    ) {
        let clock = self.inner.controller.clock();
        leader
            .run_observed(shutdown, |report, took| {
                let now = clock.now();
                async move {
                    self.observe(&report, took.as_secs_f64(), now).await;
                    crate::controller::drop_off_runtime(report);
                }
            })
            .await;
    }

    /// The public router: beacons, the script, the dashboard, the JSON API and `/metrics`.
    /// Serve it with [`serve`] or with `axum::serve(..).into_make_service_with_connect_info::<SocketAddr>()`
    /// (the receiver needs the peer address).
    pub fn router(&self) -> Router {
        // The beacon routes answer their own CORS preflight (OPTIONS) and any other method.
        Router::new()
            .route("/rum/nav", any(receiver::nav))
            .route("/rum/cdn", any(receiver::cdn))
            .route("/rum/rum.js", get(assets::script))
            .route("/dashboard", get(assets::dashboard_redirect))
            .route("/dashboard/", get(assets::dashboard_html))
            .route("/dashboard/dashboard.js", get(assets::dashboard_js))
            .route("/dashboard/dashboard.css", get(assets::dashboard_css))
            .route("/api/v1/board", get(api::board))
            .route("/api/v1/weights", get(api::weights))
            .route("/api/v1/loop", get(api::loop_health))
            .route("/api/v1/health", get(api::health))
            .route("/api/v1/drills", get(api::drills))
            .route("/api/v1/journal", get(api::journal))
            .route("/api/v1/history", get(api::history))
            .route("/metrics", get(api::metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .with_state(self.clone())
    }

    /// Serves the public router on `listener` with `limits` (see [`serve`]), counting the
    /// connections refused at the cap in `multicdn_http_connections_refused_total`.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        limits: ServeLimits,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        self.serve_with(listener, Router::new(), limits, shutdown)
            .await
    }

    /// [`Service::serve`] with `extra` routes beside the public ones (the content-steering
    /// routes of a [`steering::SteeringService`], say) on the same listener and limits.
    pub async fn serve_with(
        &self,
        listener: tokio::net::TcpListener,
        extra: Router,
        limits: ServeLimits,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let s = self.clone();
        let refused: Arc<dyn Fn() + Send + Sync> =
            Arc::new(move || s.inner.metrics.connection_refused());
        server::serve_counted(
            listener,
            self.router().merge(extra),
            limits,
            shutdown,
            server::Hooks {
                refused: Some(refused),
                beacons: Some(self.clone()),
            },
        )
        .await
    }

    /// The admin router: the operator's switches, each behind the bearer token.
    pub fn admin_router(&self) -> Router {
        admin::router(self.clone())
    }
}
