//! Content steering as a service: the steering JSON for HLS and DASH players over HTTP, with
//! CORS for the site's origins, the client's address and networks read the way the beacon
//! receiver reads them, and the operator's incident switch on a separate, token-guarded router.
//!
//! | route | what |
//! |---|---|
//! | `GET /steering/hls.json` | the steering manifest for hls.js and other HLS players (`_HLS_pathway`, `_HLS_throughput` read) |
//! | `GET /steering/dash.json` | the same for dash.js (`_DASH_pathway`, `_DASH_throughput`) |
//! | `GET /manifests/{*path}` | the origin's multivariant playlist (`.m3u8`) or MPD (`.mpd`) at `path`, tagged for steering |
//! | `GET /steering/cmsd-hls.js` | the hls.js snippet that caps its ABR at the edges' `CMSD-Dynamic` `mb` ([`CMSD_HLS_JS`](super::CMSD_HLS_JS)) |
//! | `POST /admin/steering/incident`, `DELETE …` | declare or end an incident (admin router, bearer token) |
//!
//! The plan served is the [`SharedPlan`] the Controller's
//! [`ContentSteeringSteerer`](multicdn_steering::video::ContentSteeringSteerer) writes every
//! round, so a change of plan, or a provider the health ledger has out, reaches the next
//! request: no restart. Every answer carries CORS headers for the configured origins (a
//! preflight is answered, not refused), and `Cache-Control: no-store`.
//!
//! ```no_run
//! # async fn demo(policy: multicdn::core::Policy) -> Result<(), Box<dyn std::error::Error>> {
//! use multicdn::service::steering::SteeringService;
//! use multicdn::service::{ServeLimits, serve};
//! use multicdn::steering::video::{ContentSteeringSteerer, SharedPlan, SteeringConfig};
//!
//! let plan = SharedPlan::new();
//! let steerer = ContentSteeringSteerer::new("content-steering".parse()?, plan.clone());
//! // ... hand `steerer` to `Controller::builder(policy).content_steering(steerer)` ...
//! let steering = SteeringService::new(SteeringConfig::from_policy(&policy), plan)
//!     .origins([format!("https://{}", policy.site.host)])
//!     .admin_token("a long random secret");
//! let public = tokio::net::TcpListener::bind("0.0.0.0:8082").await?;
//! serve(public, steering.router(), ServeLimits::default(), std::future::pending()).await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ipnet::IpNet;
use multicdn_core::secret::Secret;
use multicdn_core::{Clock, NetworkKey, SystemClock};
use multicdn_steering::resolve::NetworkResolver;
use multicdn_steering::video::tagging::{TagError, TagOptions, tag_dash, tag_hls};
use multicdn_steering::video::{
    ContentSteering, Protocol, SharedPlan, SteeringConfig, SteeringRequest, SteeringResponse,
};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::admin::check_bearer;
use super::receiver::client_address;

/// Counts of what the steering routes answered.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SteeringStats {
    /// Manifests served (200).
    pub served: u64,
    /// Requests a limit held back (HLS answered 200 with a long TTL, DASH 429).
    pub limited: u64,
    /// Report entries that could not be read (each skipped, the rest of the report counted).
    pub rejected_reports: u64,
    /// Requests answered 503 (no plan and no default order).
    pub unavailable: u64,
}

#[derive(Default)]
struct Counters {
    served: AtomicU64,
    limited: AtomicU64,
    rejected_reports: AtomicU64,
    unavailable: AtomicU64,
}

/// Where untagged manifests come from and what they are tagged with.
struct Manifests {
    source: url::Url,
    options: TagOptions,
    steering_base: url::Url,
    client: reqwest::Client,
}

/// The largest origin manifest read.
pub const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;

struct Inner {
    handler: ContentSteering,
    manifests: Option<Manifests>,
    clock: Arc<dyn Clock>,
    origins: Vec<String>,
    trusted_proxies: Vec<IpNet>,
    resolver: Option<Arc<dyn NetworkResolver>>,
    admin_token: Option<Secret>,
    counters: Counters,
}

/// The content-steering routes around one [`ContentSteering`] handler. Clones share it.
#[derive(Clone)]
pub struct SteeringService {
    inner: Arc<Inner>,
}

impl fmt::Debug for SteeringService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SteeringService")
            .field("origins", &self.inner.origins)
            .field("trusted_proxies", &self.inner.trusted_proxies)
            .field("resolver", &self.inner.resolver.is_some())
            .field(
                "admin_token",
                &self.inner.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

impl SteeringService {
    /// Serves `plan` as `config` says. The reload URIs are set to this router's routes
    /// (relative, so the router can be mounted under any prefix).
    pub fn new(config: SteeringConfig, plan: SharedPlan) -> SteeringService {
        let config = config.reload_uris("hls.json", "dash.json");
        SteeringService {
            inner: Arc::new(Inner {
                handler: ContentSteering::new(config, plan),
                manifests: None,
                clock: Arc::new(SystemClock),
                origins: Vec::new(),
                trusted_proxies: Vec::new(),
                resolver: None,
                admin_token: None,
                counters: Counters::default(),
            }),
        }
    }

    /// Applies a builder step. The builder methods configure a service before it is cloned or
    /// served; on a clone that is shared they change nothing, and say so.
    fn with(mut self, f: impl FnOnce(&mut Inner)) -> SteeringService {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => f(inner),
            None => tracing::error!(
                "SteeringService: a builder method was called on a clone that is shared; configure the service before cloning or serving it"
            ),
        }
        self
    }

    /// The origins whose pages may fetch the steering manifests (`https://www.example.com`;
    /// `*` for any). Without any, browsers on other origins are refused by CORS.
    pub fn origins(self, origins: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let origins = origins.into_iter().map(Into::into).collect();
        self.with(|i| i.origins = origins)
    }

    /// Proxies whose `Forwarded` / `X-Forwarded-For` (and `X-Client-Network`) are believed.
    pub fn trusted_proxies(self, proxies: impl IntoIterator<Item = IpNet>) -> Self {
        let proxies = proxies.into_iter().collect();
        self.with(|i| i.trusted_proxies = proxies)
    }

    /// Resolves clients' addresses to their networks (the cohort they fall in).
    pub fn resolver(self, resolver: Arc<dyn NetworkResolver>) -> Self {
        self.with(|i| i.resolver = Some(resolver))
    }

    /// The bearer token of the admin router; without one every switch is refused.
    pub fn admin_token(self, token: impl Into<String>) -> Self {
        let token = Secret::new(token.into());
        self.with(|i| i.admin_token = Some(token))
    }

    /// Serves `GET /manifests/{*path}`: the origin's multivariant playlist (`.m3u8`) or MPD
    /// (`.mpd`) at `source` + `path`, tagged with `options`' pathways (one copy of every
    /// variant per pathway, `PATHWAY-ID`; or `<BaseURL serviceLocation>`) and the steering
    /// tag pointing at this router under `steering_base` (the URL players reach it at,
    /// `https://steer.example.com/`; `options.server_uri` is replaced). The origin is read
    /// with a 10 s deadline and at most [`MAX_MANIFEST_BYTES`]; an origin that fails or a
    /// manifest that cannot be tagged is a `502` saying why.
    pub fn manifests(
        self,
        source: url::Url,
        steering_base: url::Url,
        options: TagOptions,
    ) -> Result<Self, TagError> {
        let mut checked = options.clone();
        checked.server_uri = steering_base
            .join("steering/hls.json")
            .map_or_else(|_| String::new(), |u| u.to_string());
        checked.validate()?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Ok(self.with(|i| {
            i.manifests = Some(Manifests {
                source,
                options,
                steering_base,
                client,
            })
        }))
    }

    /// Reads time from `clock`.
    pub fn clock(self, clock: Arc<dyn Clock>) -> Self {
        self.with(|i| i.clock = clock)
    }

    /// The handler.
    pub fn handler(&self) -> &ContentSteering {
        &self.inner.handler
    }

    /// What the routes answered so far.
    pub fn stats(&self) -> SteeringStats {
        let c = &self.inner.counters;
        SteeringStats {
            served: c.served.load(Ordering::Relaxed),
            limited: c.limited.load(Ordering::Relaxed),
            rejected_reports: c.rejected_reports.load(Ordering::Relaxed),
            unavailable: c.unavailable.load(Ordering::Relaxed),
        }
    }

    /// The public routes (`/steering/hls.json`, `/steering/dash.json`). Serve it with
    /// [`serve`](super::serve) (header timeout, connection cap) or with
    /// `axum::serve(..).into_make_service_with_connect_info::<SocketAddr>()`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/steering/hls.json", get(hls))
            .route("/steering/dash.json", get(dash))
            .route("/manifests/{*path}", get(manifest))
            .route("/steering/cmsd-hls.js", get(super::assets::cmsd_hls))
            .layer(self.cors())
            .with_state(self.clone())
    }

    /// The admin routes: `POST` / `DELETE /admin/steering/incident`, behind the bearer token.
    /// Serve them on a listener players cannot reach.
    pub fn admin_router(&self) -> Router {
        Router::new()
            .route(
                "/admin/steering/incident",
                post(incident_on).delete(incident_off),
            )
            .route_layer(middleware::from_fn_with_state(self.clone(), authorize))
            .with_state(self.clone())
    }

    fn cors(&self) -> CorsLayer {
        let layer = CorsLayer::new()
            .allow_methods([Method::GET])
            .max_age(Duration::from_secs(86_400));
        if self.inner.origins.iter().any(|o| o == "*") {
            layer.allow_origin(AllowOrigin::any())
        } else {
            let list: Vec<HeaderValue> = self
                .inner
                .origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok())
                .collect();
            layer.allow_origin(AllowOrigin::list(list))
        }
    }

    /// The client's networks: resolved from its address, else the `X-Client-Network` header
    /// (`AS7922,US,NA`) when a trusted proxy sent it.
    fn networks(&self, client: IpAddr, peer: IpAddr, headers: &HeaderMap) -> Vec<NetworkKey> {
        if let Some(r) = &self.inner.resolver {
            let net = r.resolve(client);
            if net.asn.is_some() || net.country.is_some() {
                return net.cuts();
            }
        }
        let trusted = self.inner.trusted_proxies.iter().any(|n| n.contains(&peer));
        if !trusted {
            return Vec::new();
        }
        headers
            .get("x-client-network")
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(',')
                    .take(4)
                    .filter_map(|s| s.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn answer(
        &self,
        protocol: Protocol,
        peer: SocketAddr,
        query: Option<String>,
        headers: &HeaderMap,
    ) -> Response {
        let (client, _) = client_address(peer.ip(), headers, &self.inner.trusted_proxies);
        let networks = self.networks(client, peer.ip(), headers);
        let request =
            SteeringRequest::from_query_string(protocol, query.as_deref().unwrap_or(""), networks)
                .from_client(client);
        let r = self.inner.handler.handle(&request, self.inner.clock.now());
        self.count(&r);
        for e in &r.rejected {
            tracing::debug!(client = %client, "a report entry was skipped: {e}");
        }
        respond(r)
    }

    fn count(&self, r: &SteeringResponse) {
        let c = &self.inner.counters;
        if r.limited {
            c.limited.fetch_add(1, Ordering::Relaxed);
        }
        match r.status {
            200 => c.served.fetch_add(1, Ordering::Relaxed),
            503 => c.unavailable.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        c.rejected_reports
            .fetch_add(r.rejected.len() as u64, Ordering::Relaxed);
    }
}

fn plain(status: StatusCode, msg: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg + "\n",
    )
        .into_response()
}

async fn manifest(State(s): State<SteeringService>, Path(path): Path<String>) -> Response {
    let Some(m) = &s.inner.manifests else {
        return plain(
            StatusCode::NOT_FOUND,
            "this server tags no manifests".into(),
        );
    };
    let (protocol, kind, route) = if path.ends_with(".m3u8") {
        (
            Protocol::Hls,
            "application/vnd.apple.mpegurl",
            "steering/hls.json",
        )
    } else if path.ends_with(".mpd") {
        (Protocol::Dash, "application/dash+xml", "steering/dash.json")
    } else {
        return plain(
            StatusCode::NOT_FOUND,
            format!("{path:?} is neither a multivariant playlist (.m3u8) nor an MPD (.mpd)"),
        );
    };
    if path.split('/').any(|seg| seg == ".." || seg == ".") || path.contains('\\') {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("{path:?} leaves the origin's tree"),
        );
    }
    let Ok(url) = m.source.join(&path) else {
        return plain(StatusCode::BAD_REQUEST, format!("{path:?} is not a path"));
    };
    if !url.as_str().starts_with(m.source.as_str()) {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("{path:?} leaves the origin's tree"),
        );
    }
    let body = match fetch(&m.client, &url).await {
        Ok(b) => b,
        Err(why) => return plain(StatusCode::BAD_GATEWAY, why),
    };
    let mut options = m.options.clone();
    options.server_uri = match m.steering_base.join(route) {
        Ok(u) => u.to_string(),
        Err(e) => return plain(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let tagged = match protocol {
        Protocol::Hls => tag_hls(&body, &url, &options),
        Protocol::Dash => tag_dash(&body, &url, &options),
    };
    match tagged {
        Ok(t) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, kind),
                (header::CACHE_CONTROL, "no-store"),
            ],
            t,
        )
            .into_response(),
        Err(e) => plain(
            StatusCode::BAD_GATEWAY,
            format!("the origin's {url} cannot be tagged: {e}"),
        ),
    }
}

/// The origin's manifest, at most [`MAX_MANIFEST_BYTES`], as text.
async fn fetch(client: &reqwest::Client, url: &url::Url) -> Result<String, String> {
    let mut resp = client
        .get(url.clone())
        .send()
        .await
        .map_err(|e| format!("the origin did not answer for {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("the origin answered {} for {url}", resp.status()));
    }
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if body.len() + c.len() > MAX_MANIFEST_BYTES {
                    return Err(format!(
                        "the origin's {url} is larger than {MAX_MANIFEST_BYTES} bytes"
                    ));
                }
                body.extend_from_slice(&c);
            }
            Ok(None) => break,
            Err(e) => return Err(format!("reading {url} from the origin failed: {e}")),
        }
    }
    String::from_utf8(body).map_err(|_| format!("the origin's {url} is not UTF-8 text"))
}

fn respond(r: SteeringResponse) -> Response {
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

async fn hls(
    State(s): State<SteeringService>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    s.answer(Protocol::Hls, peer, q, &headers)
}

async fn dash(
    State(s): State<SteeringService>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    s.answer(Protocol::Dash, peer, q, &headers)
}

async fn authorize(State(s): State<SteeringService>, req: Request, next: Next) -> Response {
    match check_bearer(
        s.inner.admin_token.as_ref(),
        req.headers(),
        "Bearer realm=\"multicdn-steering\"",
        "the steering switches are off: no admin token is configured",
    ) {
        None => next.run(req).await,
        Some(r) => r,
    }
}

async fn incident_on(State(s): State<SteeringService>) -> Response {
    s.inner.handler.set_incident(true);
    tracing::warn!(
        ttl_s = s.inner.handler.current_ttl().as_secs(),
        "content steering: incident declared"
    );
    incident_state(&s)
}

async fn incident_off(State(s): State<SteeringService>) -> Response {
    s.inner.handler.set_incident(false);
    tracing::info!(
        ttl_s = s.inner.handler.current_ttl().as_secs(),
        "content steering: incident over"
    );
    incident_state(&s)
}

fn incident_state(s: &SteeringService) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({
            "incident": s.inner.handler.incident(),
            "ttl_s": s.inner.handler.current_ttl().as_secs(),
        })
        .to_string(),
    )
        .into_response()
}
