//! The content-steering handler, free of any HTTP framework: a [`SteeringRequest`] (query
//! parameters, the client's networks, HLS or DASH) in, a [`SteeringResponse`] (status, headers,
//! JSON body) out. Time is a parameter, so the handler is tested without a clock or a socket;
//! the `content-steering` example wires it into axum in a dozen lines.
//!
//! What one request does:
//! 1. the overload limiter (a token bucket) may answer `429` with `Retry-After` (hls.js waits
//!    that long before asking again);
//! 2. the players' reports, `_HLS_pathway`/`_HLS_throughput` (DASH: `_DASH_pathway`/
//!    `_DASH_throughput`, comma-separated lists paired by position, throughput in bits per
//!    second), become [`PathwayMeasurement`]s returned in the response for the caller to feed
//!    its scoreboard. A malformed report is returned as a [`MeasurementError`] and never stops
//!    the manifest: a bad beacon must not break playback;
//! 3. the session (`session` in the query, minted on the first request) and the client's
//!    networks pick the cohort and the pathway order from the plan in force;
//! 4. the manifest carries `TTL` (shortened while an incident is declared, so sessions move in
//!    seconds rather than minutes), `RELOAD-URI` with `session` and the plan `version`, the
//!    order, and the configured `PATHWAY-CLONES`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use multicdn_core::{CohortId, NetworkKey, ProviderId, Timestamp};

use super::actuator::{SharedPlan, cohort_for, fnv1a, pathway_priority};
use super::manifest::{PathwayClone, SteeringManifest, UriReplacement, is_valid_pathway_id};
use super::sessions::{Clients, RerouteRule, Sessions};

/// Which player family asks: it names the query parameters players report with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// HLS: `_HLS_pathway`, `_HLS_throughput`.
    Hls,
    /// DASH: `_DASH_pathway`, `_DASH_throughput`.
    Dash,
}

impl Protocol {
    /// The parameter naming the pathway(s) the player used.
    pub fn pathway_param(self) -> &'static str {
        match self {
            Protocol::Hls => "_HLS_pathway",
            Protocol::Dash => "_DASH_pathway",
        }
    }

    /// The parameter carrying the measured throughput(s), bits per second.
    pub fn throughput_param(self) -> &'static str {
        match self {
            Protocol::Hls => "_HLS_throughput",
            Protocol::Dash => "_DASH_throughput",
        }
    }
}

/// One manifest request.
#[derive(Debug, Clone, PartialEq)]
pub struct SteeringRequest {
    /// HLS or DASH.
    pub protocol: Protocol,
    /// The query parameters, decoded, in order.
    pub query: Vec<(String, String)>,
    /// The client's networks (ASN, country, continent), as resolved by the caller.
    pub networks: Vec<NetworkKey>,
    /// The client's address, for per-client limits (`None`: not limited per client).
    pub client: Option<IpAddr>,
}

impl SteeringRequest {
    /// Builds a request from a raw query string (`session=a&_HLS_pathway=cdn-a`), decoding
    /// percent-escapes and `+`.
    pub fn from_query_string(
        protocol: Protocol,
        query: &str,
        networks: Vec<NetworkKey>,
    ) -> SteeringRequest {
        let query = url::form_urlencoded::parse(query.trim_start_matches('?').as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        SteeringRequest {
            protocol,
            query,
            networks,
            client: None,
        }
    }

    /// The same request from `client` (per-client limits apply to it).
    pub fn from_client(mut self, client: IpAddr) -> SteeringRequest {
        self.client = Some(client);
        self
    }

    /// The first value of a query parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What a player reported about one pathway: a measurement for the scoreboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathwayMeasurement {
    /// The pathway id as the player sent it.
    pub pathway: String,
    /// Throughput the player measured on it, bits per second.
    pub throughput_bps: u64,
    /// The client's finest known network, when the caller resolved one.
    pub network: Option<NetworkKey>,
    /// When the report arrived.
    pub at: Timestamp,
}

impl PathwayMeasurement {
    /// The pathway as a provider id, when it is one (pathway ids allow uppercase; provider ids
    /// do not).
    pub fn provider(&self) -> Option<ProviderId> {
        ProviderId::new(&self.pathway).ok()
    }
}

/// The most pathways one report may list.
pub const MAX_REPORTED_PATHWAYS: usize = 16;

/// Why a player's report could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MeasurementError {
    /// A pathway id is empty or has characters pathway ids cannot have.
    #[error("{param}: pathway id {value:?} is not valid (1 to 64 of A-Z a-z 0-9 . - _)")]
    PathwayId {
        /// The parameter.
        param: &'static str,
        /// The value read.
        value: String,
    },
    /// A throughput is not a non-negative number of bits per second.
    #[error("{param}: throughput {value:?} is not a non-negative number of bits per second")]
    Throughput {
        /// The parameter.
        param: &'static str,
        /// The value read.
        value: String,
    },
    /// The two lists differ in length, so they cannot be paired.
    #[error(
        "{pathway_param} lists {pathways} pathway(s) but {throughput_param} lists {throughputs} \
         throughput(s); they are paired by position and must be the same length"
    )]
    CountMismatch {
        /// The pathway parameter.
        pathway_param: &'static str,
        /// The throughput parameter.
        throughput_param: &'static str,
        /// How many pathways.
        pathways: usize,
        /// How many throughputs.
        throughputs: usize,
    },
    /// More pathways than [`MAX_REPORTED_PATHWAYS`].
    #[error("{param} lists {count} pathways; at most {MAX_REPORTED_PATHWAYS} are read")]
    TooMany {
        /// The parameter.
        param: &'static str,
        /// How many were listed.
        count: usize,
    },
}

fn list(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(|s| s.trim().trim_matches('"').trim())
        .collect()
}

fn parse_bps(value: &str) -> Option<u64> {
    if let Ok(n) = value.parse::<u64>() {
        return Some(n);
    }
    let f: f64 = value.parse().ok()?;
    (f.is_finite() && f >= 0.0 && f < u64::MAX as f64).then(|| f.round() as u64)
}

/// What a request reported: the measurements read, and why any entry was not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reports {
    /// One per pathway with a throughput, in the order reported.
    pub measurements: Vec<PathwayMeasurement>,
    /// Entries that could not be read; the rest of the report still counts.
    pub rejected: Vec<MeasurementError>,
}

/// Reads the players' pathway reports from a request, leniently: pathways and throughputs are
/// paired by position; a pair with an empty value (dash.js sends `_DASH_throughput=87231000,`
/// for a location it has no sample for) is skipped, a pair that is malformed is skipped and
/// named in [`Reports::rejected`], and the other pairs still count. Two lists of different
/// lengths cannot be paired safely, so none of their pairs count. No report is empty
/// [`Reports`].
pub fn parse_measurements(request: &SteeringRequest, at: Timestamp) -> Reports {
    let pathway_param = request.protocol.pathway_param();
    let throughput_param = request.protocol.throughput_param();
    let mut out = Reports::default();
    let (Some(pathways), Some(throughputs)) = (
        request.param(pathway_param),
        request.param(throughput_param),
    ) else {
        return out;
    };
    let mut pathways = list(pathways);
    let mut throughputs = list(throughputs);
    if pathways.len() != throughputs.len() {
        out.rejected.push(MeasurementError::CountMismatch {
            pathway_param,
            throughput_param,
            pathways: pathways.len(),
            throughputs: throughputs.len(),
        });
        return out;
    }
    if pathways.len() > MAX_REPORTED_PATHWAYS {
        out.rejected.push(MeasurementError::TooMany {
            param: pathway_param,
            count: pathways.len(),
        });
        pathways.truncate(MAX_REPORTED_PATHWAYS);
        throughputs.truncate(MAX_REPORTED_PATHWAYS);
    }
    let network = request
        .networks
        .iter()
        .min_by_key(|n| n.granularity())
        .copied();
    for (p, t) in pathways.into_iter().zip(throughputs) {
        if p.is_empty() || t.is_empty() {
            continue;
        }
        if !is_valid_pathway_id(p) {
            out.rejected.push(MeasurementError::PathwayId {
                param: pathway_param,
                value: p.chars().take(80).collect(),
            });
            continue;
        }
        match parse_bps(t) {
            Some(throughput_bps) => out.measurements.push(PathwayMeasurement {
                pathway: p.to_owned(),
                throughput_bps,
                network,
                at,
            }),
            None => out.rejected.push(MeasurementError::Throughput {
                param: throughput_param,
                value: t.chars().take(80).collect(),
            }),
        }
    }
    out
}

/// A bound on manifest requests: `per_second` sustained, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests per second, sustained.
    pub per_second: f64,
    /// Requests allowed at once after a quiet period.
    pub burst: u32,
}

/// A token bucket driven by the time it is given.
#[derive(Debug)]
pub(crate) struct Bucket {
    limit: RateLimit,
    tokens: f64,
    last: Option<Timestamp>,
}

impl Bucket {
    pub(crate) fn new(mut limit: RateLimit) -> Bucket {
        // A rate that is not a positive number never refills: the burst, then 429s.
        if !limit.per_second.is_finite() || limit.per_second < 0.0 {
            limit.per_second = 0.0;
        }
        Bucket {
            limit,
            tokens: f64::from(limit.burst),
            last: None,
        }
    }

    /// Takes a token, or says how long until one is available.
    pub(crate) fn take(&mut self, now: Timestamp) -> Result<(), Duration> {
        if let Some(last) = self.last {
            let refill = now.since(last).as_secs_f64() * self.limit.per_second;
            self.tokens = (self.tokens + refill).min(f64::from(self.limit.burst));
        }
        if self.last.is_none_or(|l| now > l) {
            self.last = Some(now);
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        if self.limit.per_second <= 0.0 {
            return Err(Duration::from_secs(60));
        }
        let wait = (1.0 - self.tokens) / self.limit.per_second;
        Err(Duration::try_from_secs_f64(wait).unwrap_or(Duration::from_secs(60)))
    }
}

/// How the handler answers.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SteeringConfig {
    /// `TTL` in normal operation (players default to 300 s).
    pub ttl: Duration,
    /// `TTL` while an incident is declared, so sessions move quickly.
    pub incident_ttl: Duration,
    /// Where HLS players reload from (relative to the manifest URI, or absolute).
    pub hls_reload_uri: String,
    /// Where DASH players reload from.
    pub dash_reload_uri: String,
    /// `PATHWAY-CLONES`, sent on every manifest when not empty.
    pub clones: Vec<PathwayClone>,
    /// The order served while no plan is in force. Empty: answer 503 until a plan arrives.
    pub default_pathways: Vec<ProviderId>,
    /// The overload bound over every client; `None`: none.
    pub rate_limit: Option<RateLimit>,
    /// The bound per client address; `None`: none.
    pub client_limit: Option<RateLimit>,
    /// The `TTL` an HLS player gets instead of a 429 when a limit is reached (hls.js stops
    /// asking for good after a 429): a 200 with the plan's order, asking it back later.
    pub overload_ttl: Duration,
    /// The collapse rule ([`RerouteRule`]); [`RerouteRule::off`] serves every session its plan
    /// order.
    pub reroute: RerouteRule,
    /// Most sessions remembered (beyond them, sessions get their plan order, unremembered).
    pub max_sessions: usize,
    /// Most client addresses with a bucket of their own.
    pub max_clients: usize,
}

impl Default for SteeringConfig {
    fn default() -> Self {
        SteeringConfig {
            ttl: Duration::from_secs(300),
            incident_ttl: Duration::from_secs(30),
            hls_reload_uri: "/hls.json".into(),
            dash_reload_uri: "/dash.json".into(),
            clones: Vec::new(),
            default_pathways: Vec::new(),
            rate_limit: None,
            client_limit: None,
            overload_ttl: Duration::from_secs(600),
            reroute: RerouteRule::default(),
            max_sessions: 200_000,
            max_clients: 65_536,
        }
    }
}

impl SteeringConfig {
    /// Sets the normal TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the incident TTL.
    pub fn incident_ttl(mut self, ttl: Duration) -> Self {
        self.incident_ttl = ttl;
        self
    }

    /// Sets the reload URIs for HLS and DASH.
    pub fn reload_uris(mut self, hls: impl Into<String>, dash: impl Into<String>) -> Self {
        self.hls_reload_uri = hls.into();
        self.dash_reload_uri = dash.into();
        self
    }

    /// Sets the pathway clones.
    pub fn clones(mut self, clones: Vec<PathwayClone>) -> Self {
        self.clones = clones;
        self
    }

    /// Sets the order served before any plan is in force.
    pub fn default_pathways(mut self, pathways: Vec<ProviderId>) -> Self {
        self.default_pathways = pathways;
        self
    }

    /// Bounds the request rate over every client.
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }

    /// Bounds each client address's request rate.
    pub fn client_limit(mut self, limit: RateLimit) -> Self {
        self.client_limit = Some(limit);
        self
    }

    /// Sets the TTL HLS players get when a limit is reached.
    pub fn overload_ttl(mut self, ttl: Duration) -> Self {
        self.overload_ttl = ttl;
        self
    }

    /// Sets the collapse rule.
    pub fn reroute(mut self, rule: RerouteRule) -> Self {
        self.reroute = rule;
        self
    }

    /// The configuration a policy describes: `steering.ttl` as the TTL (and, shorter, while an
    /// incident or a failover is in progress: the smaller of the TTL and 10 s), the live
    /// providers then the standbys as the order before any plan arrives, and a per-client
    /// limit of 2 requests a second (bursts of 20: a household of players starting together).
    pub fn from_policy(policy: &multicdn_core::Policy) -> SteeringConfig {
        let ttl = policy.steering.ttl.0.max(Duration::from_secs(1));
        let (live, standby): (Vec<ProviderId>, Vec<ProviderId>) = policy
            .providers
            .keys()
            .cloned()
            .partition(|p| !policy.is_standby(p));
        let clones = policy
            .providers
            .iter()
            .flat_map(|(id, spec)| {
                spec.video_pathways(id)
                    .into_iter()
                    .map(|(clone, host)| PathwayClone {
                        base_id: id.as_str().to_owned(),
                        id: clone,
                        uri_replacement: UriReplacement {
                            host: Some(host),
                            params: BTreeMap::new(),
                        },
                    })
            })
            .collect();
        SteeringConfig::default()
            .ttl(ttl)
            .clones(clones)
            .incident_ttl(ttl.min(Duration::from_secs(10)))
            .overload_ttl((ttl * 4).max(Duration::from_secs(120)))
            .default_pathways(live.into_iter().chain(standby).collect())
            .client_limit(RateLimit {
                per_second: 2.0,
                burst: 20,
            })
    }
}

/// The handler's answer, plus what it learned for the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct SteeringResponse {
    /// HTTP status: 200, 429 (overload) or 503 (no plan and no default order).
    pub status: u16,
    /// Response headers.
    pub headers: Vec<(String, String)>,
    /// The JSON body.
    pub body: String,
    /// The manifest sent, on 200.
    pub manifest: Option<SteeringManifest>,
    /// The session the manifest was built for (minted on a first request).
    pub session: Option<String>,
    /// The cohort the client fell in.
    pub cohort: Option<CohortId>,
    /// The players' reports, for the scoreboard.
    pub measurements: Vec<PathwayMeasurement>,
    /// The entries of the players' report that could not be read (the others count).
    pub rejected: Vec<MeasurementError>,
    /// Whether a limit was reached (HLS: answered 200 with [`SteeringConfig::overload_ttl`];
    /// DASH: 429 with `Retry-After`).
    pub limited: bool,
}

impl SteeringResponse {
    /// The first value of a header (names compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn error(status: u16, message: &str, extra: Vec<(String, String)>) -> SteeringResponse {
        let mut headers = vec![
            ("Content-Type".to_owned(), "application/json".to_owned()),
            ("Cache-Control".to_owned(), "no-store".to_owned()),
        ];
        headers.extend(extra);
        SteeringResponse {
            status,
            headers,
            body: serde_json::json!({ "error": message }).to_string(),
            manifest: None,
            session: None,
            cohort: None,
            measurements: Vec::new(),
            rejected: Vec::new(),
            limited: false,
        }
    }
}

/// The content-steering handler. Share it behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct ContentSteering {
    config: SteeringConfig,
    plan: SharedPlan,
    incident: AtomicBool,
    bucket: Option<Mutex<Bucket>>,
    clients: Option<Mutex<Clients>>,
    sessions: Mutex<Sessions>,
    minted: AtomicU64,
    /// The plan version last seen, and when it changed (`None` before the first change).
    version: Mutex<(u64, Option<Timestamp>)>,
}

fn valid_session(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A lock whose holder panicked still holds whole values (each update completes before the
/// next); serve from it rather than fail every request after.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ContentSteering {
    /// A handler serving the plan in `plan` (written by a
    /// [`ContentSteeringSteerer`](super::actuator::ContentSteeringSteerer)).
    pub fn new(config: SteeringConfig, plan: SharedPlan) -> ContentSteering {
        let bucket = config.rate_limit.map(|l| Mutex::new(Bucket::new(l)));
        let clients = config
            .client_limit
            .map(|l| Mutex::new(Clients::new(l, config.max_clients.max(1))));
        let sessions = Mutex::new(Sessions::new(config.max_sessions, config.reroute));
        ContentSteering {
            config,
            plan,
            incident: AtomicBool::new(false),
            bucket,
            clients,
            sessions,
            minted: AtomicU64::new(0),
            version: Mutex::new((0, None)),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SteeringConfig {
        &self.config
    }

    /// The plan served.
    pub fn plan(&self) -> &SharedPlan {
        &self.plan
    }

    /// Declares or ends an incident: while declared, manifests carry the incident TTL.
    pub fn set_incident(&self, incident: bool) {
        self.incident.store(incident, Ordering::SeqCst);
    }

    /// Whether an incident is declared.
    pub fn incident(&self) -> bool {
        self.incident.load(Ordering::SeqCst)
    }

    /// The TTL served now: the short one while an incident is declared, while a failover is in
    /// progress (a provider is unavailable) and for one normal TTL after the plan changed (so
    /// sessions that reload during a change come back soon for the next step); the normal one
    /// otherwise.
    pub fn current_ttl(&self) -> Duration {
        let failover = self.plan.get().is_some_and(|p| !p.unavailable.is_empty());
        if self.incident() || failover {
            self.config.incident_ttl
        } else {
            self.config.ttl
        }
    }

    /// [`ContentSteering::current_ttl`] at `now`, noting a plan change at `version`.
    fn ttl_at(&self, version: u64, failover: bool, now: Timestamp) -> Duration {
        let changed = {
            let mut v = lock(&self.version);
            if v.0 != version {
                if v.0 != 0 {
                    v.1 = Some(now);
                }
                v.0 = version;
            }
            v.1.is_some_and(|at| now.since(at) < self.config.ttl)
        };
        if self.incident() || failover || changed {
            self.config.incident_ttl
        } else {
            self.config.ttl
        }
    }

    fn mint_session(&self, now: Timestamp) -> String {
        let n = self.minted.fetch_add(1, Ordering::Relaxed);
        let h = fnv1a(&[&now.as_millis().to_be_bytes(), &n.to_be_bytes()]);
        format!("{h:016x}")
    }

    /// Whether a limit refuses this request, and how long until it would not.
    fn limited(&self, request: &SteeringRequest, now: Timestamp) -> Option<Duration> {
        if let (Some(clients), Some(ip)) = (&self.clients, request.client)
            && let Err(wait) = lock(clients).take(ip, now)
        {
            return Some(wait);
        }
        if let Some(bucket) = &self.bucket
            && let Err(wait) = lock(bucket).take(now)
        {
            return Some(wait);
        }
        None
    }

    /// Answers one manifest request at time `now`: the limits (per client, then overall), the
    /// players' reports, the session's cohort and pathway order from the plan in force
    /// (providers unavailable left out, the collapse rule applied), and the TTL.
    pub fn handle(&self, request: &SteeringRequest, now: Timestamp) -> SteeringResponse {
        let limited = self.limited(request, now);
        if let (Some(wait), Protocol::Dash) = (limited, request.protocol) {
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            let mut r = SteeringResponse::error(
                429,
                "the steering server is overloaded; retry after the Retry-After delay",
                vec![("Retry-After".to_owned(), secs.to_string())],
            );
            r.limited = true;
            return r;
        }
        let Reports {
            mut measurements,
            rejected,
        } = parse_measurements(request, now);
        // A clone's throughput is its provider's (the same CDN through another host).
        for m in &mut measurements {
            if let Some(c) = self.config.clones.iter().find(|c| c.id == m.pathway) {
                m.pathway.clone_from(&c.base_id);
            }
        }
        let session = request
            .param("session")
            .filter(|s| valid_session(s))
            .map(str::to_owned)
            .unwrap_or_else(|| self.mint_session(now));
        let in_force = self.plan.get();
        let (order, cohort, version) = match &in_force {
            Some(p) => match cohort_for(&p.plan, &request.networks) {
                Some(c) => (
                    p.offered(pathway_priority(
                        &c.weights,
                        Some(&session),
                        c.cohort.as_str(),
                    )),
                    Some(c),
                    p.version,
                ),
                None => (
                    p.offered(self.config.default_pathways.clone()),
                    None,
                    p.version,
                ),
            },
            None => (self.config.default_pathways.clone(), None, 0),
        };
        if order.is_empty() {
            let retry = self.current_ttl().as_secs().max(1);
            let mut r = SteeringResponse::error(
                503,
                "no steering plan is in force yet",
                vec![("Retry-After".to_owned(), retry.to_string())],
            );
            r.measurements = measurements;
            r.rejected = rejected;
            return r;
        }
        // Under a limit the answer is the plan's order, unremembered: the cheapest 200.
        let order = if limited.is_some() {
            order
        } else {
            let weighted = |p: &ProviderId| cohort.is_none_or(|c| c.weights.get(p) > 0);
            lock(&self.sessions).serve(
                &session,
                cohort.map_or("", |c| c.cohort.as_str()),
                &measurements,
                order,
                weighted,
                now,
            )
        };
        let failover = in_force.as_ref().is_some_and(|p| !p.unavailable.is_empty());
        let ttl = if limited.is_some() {
            self.config.overload_ttl
        } else {
            self.ttl_at(version, failover, now)
        };
        let base = match request.protocol {
            Protocol::Hls => &self.config.hls_reload_uri,
            Protocol::Dash => &self.config.dash_reload_uri,
        };
        let sep = if base.contains('?') { '&' } else { '?' };
        let reload = format!("{base}{sep}session={session}&version={version}");
        // Each provider's clones (its further hosts) right after it; clones of a provider not
        // offered are not sent.
        let clones: Vec<PathwayClone> = self
            .config
            .clones
            .iter()
            .filter(|c| order.iter().any(|p| p.as_str() == c.base_id))
            .cloned()
            .collect();
        let mut priority = Vec::with_capacity(order.len() + clones.len());
        for p in &order {
            priority.push(p.as_str().to_owned());
            priority.extend(
                clones
                    .iter()
                    .filter(|c| c.base_id == p.as_str())
                    .map(|c| c.id.clone()),
            );
        }
        let manifest = SteeringManifest::new(ttl.as_secs().max(1), priority)
            .with_reload_uri(reload)
            .with_clones(clones);
        let body = match manifest.to_json() {
            Ok(b) => b,
            Err(e) => return SteeringResponse::error(500, &e.to_string(), Vec::new()),
        };
        SteeringResponse {
            status: 200,
            headers: vec![
                ("Content-Type".to_owned(), "application/json".to_owned()),
                ("Cache-Control".to_owned(), "no-store".to_owned()),
            ],
            body,
            manifest: Some(manifest),
            session: Some(session),
            cohort: cohort.map(|c| c.cohort.clone()),
            measurements,
            rejected,
            limited: limited.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(q: &str) -> SteeringRequest {
        SteeringRequest::from_query_string(Protocol::Hls, q, vec!["AS7922".parse().unwrap()])
    }

    #[test]
    fn token_bucket_refills_with_the_time_it_is_given() {
        let mut b = Bucket::new(RateLimit {
            per_second: 2.0,
            burst: 2,
        });
        let t = Timestamp::from_secs(100);
        assert!(b.take(t).is_ok());
        assert!(b.take(t).is_ok());
        let wait = b.take(t).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(b.take(t + Duration::from_millis(500)).is_ok());
        // A clock stepping back never adds tokens.
        assert!(b.take(Timestamp::from_secs(1)).is_err());
    }

    #[test]
    fn a_nonsense_rate_never_panics_and_never_refills() {
        for rate in [f64::NAN, -1.0, 0.0, f64::INFINITY] {
            let mut b = Bucket::new(RateLimit {
                per_second: rate,
                burst: 1,
            });
            assert!(b.take(Timestamp::EPOCH).is_ok());
            assert!(b.take(Timestamp::from_secs(10)).is_err(), "{rate}");
        }
    }

    #[test]
    fn reads_paired_lists_and_tolerates_quotes() {
        let r = SteeringRequest::from_query_string(
            Protocol::Dash,
            "_DASH_pathway=%22cdn-a%22,%22cdn-b%22&_DASH_throughput=5000000,1200000.4",
            vec![],
        );
        let m = parse_measurements(&r, Timestamp::EPOCH).measurements;
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[1].pathway.as_str(), m[1].throughput_bps),
            ("cdn-b", 1_200_000)
        );
    }

    #[test]
    fn malformed_reports_are_errors_not_panics() {
        let bad = [
            "_HLS_pathway=cdn-a&_HLS_throughput=fast",
            "_HLS_pathway=cdn-a&_HLS_throughput=-5",
            "_HLS_pathway=cdn-a&_HLS_throughput=NaN",
            "_HLS_pathway=cdn-a,cdn-b&_HLS_throughput=1",
            "_HLS_pathway=cdn%20a&_HLS_throughput=1",
            "_HLS_pathway=a,a,a,a,a,a,a,a,a,a,a,a,a,a,a,a,a&_HLS_throughput=1",
        ];
        for q in bad {
            let r = parse_measurements(&req(q), Timestamp::EPOCH);
            assert!(r.measurements.is_empty() && !r.rejected.is_empty(), "{q}");
        }
        assert!(
            parse_measurements(&req("_HLS_pathway=cdn-a"), Timestamp::EPOCH)
                .measurements
                .is_empty()
        );
    }

    #[test]
    fn an_empty_or_bad_entry_skips_its_pathway_never_the_report() {
        // dash.js with no sample for its second location.
        let r = SteeringRequest::from_query_string(
            Protocol::Dash,
            "_DASH_pathway=cdn-a,cdn-b&_DASH_throughput=87231000,",
            vec![],
        );
        let got = parse_measurements(&r, Timestamp::EPOCH);
        assert_eq!(got.measurements.len(), 1);
        assert_eq!(got.measurements[0].throughput_bps, 87_231_000);
        assert!(got.rejected.is_empty(), "an empty value is not an error");
        let got = parse_measurements(
            &req("_HLS_pathway=,cdn-b&_HLS_throughput=1,2"),
            Timestamp::EPOCH,
        );
        assert_eq!(got.measurements.len(), 1);
        // One malformed entry among good ones: the good ones count, the bad one is named.
        let got = parse_measurements(
            &req("_HLS_pathway=cdn-a,cdn%20b,cdn-c&_HLS_throughput=5,6,x"),
            Timestamp::EPOCH,
        );
        assert_eq!(got.measurements.len(), 1);
        assert_eq!(got.rejected.len(), 2);
        assert!(got.rejected[0].to_string().contains("not valid"));
        // More than 16: the first 16 count, and the excess is named.
        let many = (0..20)
            .map(|i| format!("p{i}"))
            .collect::<Vec<_>>()
            .join(",");
        let tps = vec!["1"; 20].join(",");
        let got = parse_measurements(
            &req(&format!("_HLS_pathway={many}&_HLS_throughput={tps}")),
            Timestamp::EPOCH,
        );
        assert_eq!(got.measurements.len(), MAX_REPORTED_PATHWAYS);
        assert!(matches!(
            got.rejected[0],
            MeasurementError::TooMany { count: 20, .. }
        ));
    }

    #[test]
    fn measurements_carry_the_finest_network() {
        let r = SteeringRequest::from_query_string(
            Protocol::Hls,
            "_HLS_pathway=cdn-a&_HLS_throughput=100",
            vec!["DE".parse().unwrap(), "AS3320".parse().unwrap()],
        );
        let m = parse_measurements(&r, Timestamp::from_secs(5)).measurements;
        assert_eq!(m[0].network, Some(NetworkKey::Asn(3320)));
        assert_eq!(m[0].at, Timestamp::from_secs(5));
        assert_eq!(m[0].provider().unwrap().as_str(), "cdn-a");
    }

    #[test]
    fn a_forged_session_is_replaced_by_a_fresh_one() {
        let h = ContentSteering::new(
            SteeringConfig::default().default_pathways(vec![ProviderId::new("a").unwrap()]),
            SharedPlan::new(),
        );
        let r = h.handle(&req("session=../../etc"), Timestamp::EPOCH);
        let s = r.session.unwrap();
        assert!(valid_session(&s) && s != "../../etc");
        let r = h.handle(&req("session=abc-1"), Timestamp::EPOCH);
        assert_eq!(r.session.as_deref(), Some("abc-1"));
    }

    proptest! {
        #[test]
        fn parsing_any_query_never_panics(q in "\\PC{0,80}", dash in any::<bool>()) {
            let protocol = if dash { Protocol::Dash } else { Protocol::Hls };
            let r = SteeringRequest::from_query_string(protocol, &q, vec![]);
            let _ = parse_measurements(&r, Timestamp::EPOCH);
        }

        #[test]
        fn any_paired_report_reads_back(
            reports in prop::collection::vec(("[a-z][a-z0-9-]{0,10}", any::<u32>()), 1..8)
        ) {
            let pathways: Vec<&str> = reports.iter().map(|(p, _)| p.as_str()).collect();
            let throughputs: Vec<String> = reports.iter().map(|(_, t)| t.to_string()).collect();
            let q = format!(
                "_HLS_pathway={}&_HLS_throughput={}",
                pathways.join(","),
                throughputs.join(",")
            );
            let r = SteeringRequest::from_query_string(Protocol::Hls, &q, vec![]);
            let m = parse_measurements(&r, Timestamp::EPOCH).measurements;
            prop_assert_eq!(m.len(), reports.len());
            for (got, (p, t)) in m.iter().zip(&reports) {
                prop_assert_eq!(&got.pathway, p);
                prop_assert_eq!(got.throughput_bps, u64::from(*t));
            }
        }
    }
}
