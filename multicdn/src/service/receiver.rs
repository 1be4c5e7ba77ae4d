//! The beacon receiver: `POST /rum/nav` and `POST /rum/cdn`, as browsers send them.
//!
//! `navigator.sendBeacon(url, string)` sends the JSON text as `text/plain;charset=UTF-8` (a
//! CORS-safelisted request: no preflight); a `fetch` fallback may send `application/json`
//! after a preflight. Both are read. For every request, in this order, so that a flood costs
//! as little as possible:
//!
//! 1. **Origin**: a browser's `Origin` must be one of the site's origins.
//! 2. **Content type**: `text/plain`, `application/json` or none.
//! 3. **Size**: the body is read up to the cap (a `Content-Length` above it is refused
//!    unread), within a time limit.
//! 4. **Client**: the socket's address, or the client named by `Forwarded` /
//!    `X-Forwarded-For` when, and only when, the socket's peer is a configured trusted proxy
//!    (walking the chain from the right past trusted proxies). A forwarding header from anyone
//!    else is not believed, and counted.
//! 5. **Rate**: a token bucket per client (per address, per /64 for IPv6), in a table of fixed
//!    size, so memory stays bounded whatever the number of addresses.
//! 6. **Beacon**: the JSON is parsed once; times must be plausible, providers the policy's. A
//!    client's own `at` is never used: the server stamps the receive time, and a client clock
//!    ahead of it by more than the skew marks a beacon as forged or broken. A beacon `id` seen
//!    before is a duplicate (a retried send): answered as accepted, counted, never recorded
//!    twice.
//!
//! Every refusal is counted by kind and reason (`multicdn_beacons_rejected_total`) and
//! answered with a status a client can act on: 403, 415, 413, 408, 429 (with `Retry-After`),
//! 400 for JSON that does not parse, 422 for a beacon that parses but cannot be used.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault};
use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::{Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{ConnectInfo, State};
use axum::http::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ipnet::IpNet;
use multicdn_core::Timestamp;
use multicdn_steering::beacon::{Beacon, ClientNetwork, NavigationBeacon, ProbeBeacon, Received};
use multicdn_steering::engine::state::IdHasher;
use multicdn_steering::scoreboard::Recorded;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::Service;

/// Which endpoint a beacon came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// `/rum/nav`: a page load.
    Nav,
    /// `/rum/cdn`: a probe run.
    Probe,
}

impl Kind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Nav => "nav",
            Kind::Probe => "probe",
        }
    }
}

/// Why a beacon was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reject {
    /// An `Origin` that is not one of the site's.
    Origin,
    /// A content type other than `text/plain` or `application/json`.
    ContentType,
    /// A body over the cap.
    TooLarge,
    /// The body did not arrive within the time limit.
    Timeout,
    /// Over the client's rate limit.
    RateLimited,
    /// Not JSON (or not UTF-8).
    Malformed,
    /// JSON, but not the endpoint's beacon (a field missing or of the wrong type).
    NotABeacon,
    /// A provider the policy does not name (the client's `unknown` included).
    UnknownProvider,
    /// A time that cannot be real (negative, zero, not finite).
    Implausible,
    /// The client's own clock is ahead of the receive time by more than the allowed skew.
    ClockSkew,
    /// A beacon id seen before.
    Duplicate,
}

impl Reject {
    /// Every reason, for reports.
    pub const ALL: [Reject; 11] = [
        Reject::Origin,
        Reject::ContentType,
        Reject::TooLarge,
        Reject::Timeout,
        Reject::RateLimited,
        Reject::Malformed,
        Reject::NotABeacon,
        Reject::UnknownProvider,
        Reject::Implausible,
        Reject::ClockSkew,
        Reject::Duplicate,
    ];

    /// The metric label (`unknown_provider`).
    pub fn label(self) -> &'static str {
        match self {
            Reject::Origin => "origin",
            Reject::ContentType => "content_type",
            Reject::TooLarge => "too_large",
            Reject::Timeout => "timeout",
            Reject::RateLimited => "rate_limited",
            Reject::Malformed => "malformed",
            Reject::NotABeacon => "not_a_beacon",
            Reject::UnknownProvider => "unknown_provider",
            Reject::Implausible => "implausible",
            Reject::ClockSkew => "clock_skew",
            Reject::Duplicate => "duplicate",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Reject::Origin => StatusCode::FORBIDDEN,
            Reject::ContentType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Reject::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Reject::Timeout => StatusCode::REQUEST_TIMEOUT,
            Reject::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Reject::Malformed => StatusCode::BAD_REQUEST,
            // A retried send: the client did its job; nothing is recorded twice.
            Reject::Duplicate => StatusCode::NO_CONTENT,
            Reject::NotABeacon
            | Reject::UnknownProvider
            | Reject::Implausible
            | Reject::ClockSkew => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }

    fn message(self) -> &'static str {
        match self {
            Reject::Origin => "this origin may not send beacons here",
            Reject::ContentType => "send text/plain or application/json",
            Reject::TooLarge => "the beacon is over the size limit",
            Reject::Timeout => "the body did not arrive in time",
            Reject::RateLimited => "too many beacons from this client; retry later",
            Reject::Malformed => "the body is not JSON",
            Reject::NotABeacon => "not a beacon for this endpoint",
            Reject::UnknownProvider => "a provider this site does not use",
            Reject::Implausible => "a time that cannot be real",
            Reject::ClockSkew => "the beacon is dated in the future",
            Reject::Duplicate => "already received",
        }
    }
}

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        let mut r = (self.status(), self.message()).into_response();
        r.headers_mut()
            .insert("x-multicdn-reject", HeaderValue::from_static(self.label()));
        if self == Reject::RateLimited {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// The per-client limits of the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimit {
    /// Beacons a second a client may send, sustained.
    pub per_second: NonZeroU32,
    /// Beacons a client may send at once.
    pub burst: NonZeroU32,
    /// Buckets in the table (clients hash into them; memory is bounded by this).
    pub buckets: u32,
}

impl Default for ClientLimit {
    fn default() -> ClientLimit {
        ClientLimit {
            per_second: NonZeroU32::MIN.saturating_add(9),
            burst: NonZeroU32::MIN.saturating_add(29),
            buckets: 1 << 17,
        }
    }
}

/// The receiver's own state: the rate table and the ids seen.
pub(crate) struct Receiver {
    limiter: DefaultKeyedRateLimiter<u32>,
    buckets: u32,
    hasher: RandomState,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("buckets", &self.buckets)
            .finish_non_exhaustive()
    }
}

/// The beacon ids seen lately, as keyed 64-bit hashes (no allocation per beacon), oldest
/// forgotten first.
struct Seen {
    set: HashSet<u64, BuildHasherDefault<IdHasher>>,
    order: VecDeque<u64>,
    cap: usize,
}

impl Seen {
    /// Remembers `key`; false when it was already there.
    fn insert(&mut self, key: u64) -> bool {
        if !self.set.insert(key) {
            return false;
        }
        if self.order.len() >= self.cap
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        self.order.push_back(key);
        true
    }
}

impl Receiver {
    pub(crate) fn new(limit: ClientLimit, remembered: usize) -> Receiver {
        Receiver {
            limiter: RateLimiter::keyed(
                Quota::per_second(limit.per_second).allow_burst(limit.burst),
            ),
            buckets: limit.buckets.max(1),
            hasher: RandomState::new(),
            seen: Mutex::new(Seen {
                set: HashSet::default(),
                order: VecDeque::new(),
                cap: remembered.max(1),
            }),
        }
    }

    fn allow(&self, client: IpAddr) -> bool {
        let key = match client {
            IpAddr::V4(v4) => u64::from(u32::from(v4)),
            // A client holds a /64.
            IpAddr::V6(v6) => (u128::from(v6) >> 64) as u64 ^ (1 << 63),
        };
        let bucket = (self.hasher.hash_one(key) % u64::from(self.buckets)) as u32;
        self.limiter.check_key(&bucket).is_ok()
    }

    /// Rate buckets in use and beacon ids remembered.
    pub(crate) fn footprint(&self) -> (usize, usize) {
        let ids = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .order
            .len();
        (self.limiter.len(), ids)
    }

    /// Forgets buckets that are full again (call now and then).
    pub(crate) fn tidy(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }

    fn first_time(&self, kind: Kind, id: &str) -> bool {
        // Keyed with this process's random key: a client cannot aim collisions.
        let key = self.hasher.hash_one((kind, id));
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key)
    }
}

/// Named once (a name given as a string is parsed on every lookup).
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The client's address: the socket's, or the forwarded client's through trusted proxies.
/// The flag says a forwarding header came from an untrusted peer (and was not believed).
///
/// The hops are those of `Forwarded` (RFC 7239) when present, else of `X-Forwarded-For`,
/// read from the right (the nearest proxy) without collecting them; `None` for a hop that
/// does not parse.
pub(crate) fn client_address(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> (IpAddr, bool) {
    let peer = canonical(peer);
    let mut forwarded = headers
        .get_all(header::FORWARDED)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .peekable();
    if forwarded.peek().is_some() {
        let hops = forwarded
            .flat_map(|v| v.split(','))
            .filter_map(forwarded_for);
        return walk_back(peer, hops.rev(), trusted);
    }
    let hops = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(node_address);
    walk_back(peer, hops.rev(), trusted)
}

/// From the peer back along `hops` (nearest first) past trusted proxies.
fn walk_back(
    peer: IpAddr,
    hops: impl Iterator<Item = Option<IpAddr>>,
    trusted: &[IpNet],
) -> (IpAddr, bool) {
    let mut hops = hops.peekable();
    if hops.peek().is_none() {
        return (peer, false);
    }
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return (peer, true);
    }
    let mut client = peer;
    for hop in hops {
        match hop {
            Some(ip) => {
                client = canonical(ip);
                if !is_trusted(&client) {
                    break;
                }
            }
            // A hop the proxy could not name (`unknown`, garbage): stop at the last address
            // we trust.
            None => break,
        }
    }
    (client, false)
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// One element of `Forwarded`: the address of its `for=` (`None` inside when it does not
/// parse); `None` when it has no `for=`.
fn forwarded_for(element: &str) -> Option<Option<IpAddr>> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("for")
            .then(|| node_address(v))
    })
}

/// `192.0.2.1`, `192.0.2.1:80`, `"[2001:db8::1]:4711"`, `2001:db8::1`.
fn node_address(raw: &str) -> Option<IpAddr> {
    let s = raw.trim().trim_matches('"');
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split_once(']').and_then(|(ip, _)| ip.parse().ok());
    }
    s.rsplit_once(':').and_then(|(ip, _)| ip.parse().ok())
}

#[derive(Deserialize)]
struct NavWire<'a> {
    #[serde(default, borrow)]
    id: Option<Text<'a>>,
    #[serde(default)]
    at: Option<ClientTime>,
    #[serde(default, borrow)]
    path: Cow<'a, str>,
    ttfb: f64,
    #[serde(borrow)]
    provider: Cow<'a, str>,
    #[serde(default, borrow)]
    pop: Cow<'a, str>,
    #[serde(default, borrow)]
    cache: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ProbeWire<'a> {
    #[serde(default, borrow)]
    id: Option<Text<'a>>,
    #[serde(default)]
    at: Option<ClientTime>,
    #[serde(borrow)]
    times: Times<'a>,
    #[serde(default, borrow)]
    best: Text<'a>,
}

/// A string borrowed from the body unless it has escapes (serde borrows a bare `Cow<str>`
/// field, but not one inside an `Option` or a map key).
#[derive(Default, Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// The probe's times as sent: by provider (`{"fastly": 120.5, "cloudflare": null}`, the last
/// of a repeated name counting, as in a map) or in the configured order (`[120.5, null]`).
/// Read in one pass: serde's untagged `ProbeTimes` buffers the value to try each form.
enum Times<'a> {
    ByProvider(Vec<(Cow<'a, str>, Option<f64>)>),
    InOrder(Vec<Option<f64>>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Times<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<Times<'a>>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Times<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("times by provider or in order")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Times<'a>, A::Error> {
                let mut times: Vec<(Cow<'a, str>, Option<f64>)> = Vec::new();
                while let Some((Text(p), t)) = map.next_entry::<Text<'a>, Option<f64>>()? {
                    match times.iter_mut().find(|(q, _)| *q == p) {
                        Some(slot) => slot.1 = t,
                        None => times.push((p, t)),
                    }
                }
                Ok(Times::ByProvider(times))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Times<'a>, A::Error> {
                let mut times = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
                while let Some(t) = seq.next_element::<Option<f64>>()? {
                    times.push(t);
                }
                Ok(Times::InOrder(times))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// The client's own time, when it sent one it can be read from: milliseconds since the
/// epoch or RFC 3339 (anything else is ignored).
struct ClientTime(Option<Timestamp>);

impl<'de> Deserialize<'de> for ClientTime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ClientTime;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a time")
            }
            fn visit_f64<E: de::Error>(self, ms: f64) -> Result<ClientTime, E> {
                Ok(ClientTime(
                    (0.0..1e15)
                        .contains(&ms)
                        .then(|| Timestamp::from_millis(ms as u64)),
                ))
            }
            fn visit_u64<E: de::Error>(self, ms: u64) -> Result<ClientTime, E> {
                self.visit_f64(ms as f64)
            }
            fn visit_i64<E: de::Error>(self, ms: i64) -> Result<ClientTime, E> {
                self.visit_f64(ms as f64)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ClientTime, E> {
                Ok(ClientTime(Timestamp::parse_rfc3339(s).ok()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<ClientTime, E> {
                Ok(ClientTime(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<ClientTime, E> {
                Ok(ClientTime(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ClientTime, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ClientTime(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ClientTime, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(ClientTime(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// The body as JSON: not UTF-8 or not JSON is `Malformed`, JSON of the wrong shape
/// `NotABeacon`. The UTF-8 is checked once for the whole body (serde_json checks each string
/// of a byte slice again).
fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Reject> {
    let body = std::str::from_utf8(body).map_err(|_| Reject::Malformed)?;
    serde_json::from_str(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => Reject::NotABeacon,
        _ => Reject::Malformed,
    })
}

/// Reads one beacon body and builds what the scoreboard records, with the beacon's id (its
/// first 64 characters) when it has one.
pub(crate) fn read_beacon<'a>(
    service: &Service,
    kind: Kind,
    body: &'a [u8],
    now: Timestamp,
    network: ClientNetwork,
) -> Result<(Received, Option<Cow<'a, str>>), Reject> {
    let known = service.providers();
    let (beacon, id, at) = match kind {
        Kind::Nav => {
            let w: NavWire<'_> = parse(body)?;
            if !(w.ttfb.is_finite() && w.ttfb > 0.0) {
                return Err(Reject::Implausible);
            }
            if !known.iter().any(|p| p.as_str() == w.provider.as_ref()) {
                return Err(Reject::UnknownProvider);
            }
            let nav = NavigationBeacon::new(&w.path, w.ttfb, &w.provider, &w.pop, &w.cache);
            (Beacon::Navigation(nav), w.id, w.at)
        }
        Kind::Probe => {
            let w: ProbeWire<'_> = parse(body)?;
            let times = match w.times {
                Times::ByProvider(times) => times,
                Times::InOrder(list) => {
                    if list.len() != known.len() {
                        return Err(Reject::NotABeacon);
                    }
                    known
                        .iter()
                        .map(|p| Cow::Borrowed(p.as_str()))
                        .zip(list)
                        .collect()
                }
            };
            if times.is_empty() {
                return Err(Reject::NotABeacon);
            }
            if times
                .iter()
                .any(|(p, _)| !known.iter().any(|k| k.as_str() == p))
            {
                return Err(Reject::UnknownProvider);
            }
            if times
                .iter()
                .any(|(_, t)| t.is_some_and(|t| !(t.is_finite() && t > 0.0)))
            {
                return Err(Reject::Implausible);
            }
            let times = times.into_iter().map(|(p, t)| (p.into_owned(), t));
            let probe = ProbeBeacon::new(times, &w.best.0);
            (Beacon::Probe(probe), w.id, w.at)
        }
    };
    if let Some(ClientTime(Some(client))) = at
        && client.since(now) > service.inner.config.skew
    {
        return Err(Reject::ClockSkew);
    }
    let id = id.map(|Text(id)| id).filter(|id| !id.is_empty()).map(|id| {
        match id.char_indices().nth(64) {
            Some((end, _)) => match id {
                Cow::Borrowed(id) => Cow::Borrowed(&id[..end]),
                Cow::Owned(mut id) => {
                    id.truncate(end);
                    Cow::Owned(id)
                }
            },
            None => id,
        }
    });
    Ok((
        Received {
            at: now,
            network,
            beacon,
        },
        id,
    ))
}

fn content_type_ok(headers: &HeaderMap) -> bool {
    let Some(v) = headers.get(header::CONTENT_TYPE) else {
        return true;
    };
    let Ok(v) = v.to_str() else {
        return false;
    };
    let essence = v
        .bytes()
        .position(|b| b == b';')
        .map_or(v, |end| &v[..end])
        .trim();
    essence.eq_ignore_ascii_case("text/plain") || essence.eq_ignore_ascii_case("application/json")
}

/// Reads the body up to `cap` bytes within `limit` of its first wait. A body already in hand
/// (a beacon sent in one packet) arms no timer and is not copied.
async fn read_body<B>(body: B, cap: usize, limit: Duration) -> Result<Bytes, Reject>
where
    B: HttpBody<Data = Bytes>,
{
    let mut body = pin!(body);
    let mut timer = pin!(None::<tokio::time::Sleep>);
    let mut first: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    let mut len = 0;
    loop {
        let frame = std::future::poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(Ok(frame)),
            Poll::Pending => {
                if timer.is_none() {
                    timer.set(Some(tokio::time::sleep(limit)));
                }
                match timer.as_mut().as_pin_mut().map(|t| t.poll(cx)) {
                    Some(Poll::Ready(())) => Poll::Ready(Err(Reject::Timeout)),
                    _ => Poll::Pending,
                }
            }
        })
        .await?;
        let Some(frame) = frame else { break };
        // A body that fails to arrive whole counts as one over the cap, as before.
        let Ok(data) = frame.map_err(|_| Reject::TooLarge)?.into_data() else {
            continue;
        };
        len += data.len();
        if len > cap {
            return Err(Reject::TooLarge);
        }
        if first.is_none() && more.is_empty() {
            first = Some(data);
        } else {
            if let Some(head) = first.take() {
                more.extend_from_slice(&head);
            }
            more.extend_from_slice(&data);
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(more)))
}

/// Takes one beacon: every check, then the scoreboard.
pub(crate) async fn receive<B>(
    service: &Service,
    kind: Kind,
    peer: IpAddr,
    headers: &HeaderMap,
    body: B,
) -> Result<(), Reject>
where
    B: HttpBody<Data = Bytes>,
{
    let cfg = &service.inner.config;
    if let Some(origin) = headers.get(header::ORIGIN)
        && !cfg.allows_origin(origin.as_bytes())
    {
        return Err(Reject::Origin);
    }
    if !content_type_ok(headers) {
        return Err(Reject::ContentType);
    }
    // A body known to be over the cap (its `Content-Length`) is refused unread.
    if body.size_hint().lower() > cfg.body_limit as u64 {
        return Err(Reject::TooLarge);
    }
    let (client, forged) = client_address(peer, headers, &cfg.trusted_proxies);
    if forged {
        service.inner.metrics.forwarded_ignored();
    }
    if !service.inner.receiver.allow(client) {
        return Err(Reject::RateLimited);
    }
    let body = read_body(body, cfg.body_limit, cfg.body_timeout).await?;
    let network = service.inner.controller.resolve(client);
    let now = service.inner.controller.clock().now();
    let (received, id) = read_beacon(service, kind, &body, now, network)?;
    if let Some(id) = &id
        && !service.inner.receiver.first_time(kind, id)
    {
        return Err(Reject::Duplicate);
    }
    match service.inner.controller.record(&received) {
        Recorded::Stored | Recorded::Clamped => {}
        Recorded::UnknownProvider => return Err(Reject::UnknownProvider),
        Recorded::Implausible | Recorded::TooOld | Recorded::OutOfRange => {
            return Err(Reject::Implausible);
        }
    }
    if network.is_unknown() {
        service.inner.metrics.unresolved();
    }
    #[cfg(feature = "nats")]
    if let Some(publisher) = &cfg.publisher
        && !publisher.offer(&received)
    {
        service.inner.metrics.publish_dropped();
    }
    Ok(())
}

/// The beacon route `path` names, if any (what the router matches: the path exactly).
pub(crate) fn route_kind(path: &str) -> Option<Kind> {
    match path {
        "/rum/nav" => Some(Kind::Nav),
        "/rum/cdn" => Some(Kind::Probe),
        _ => None,
    }
}

/// Answers one request to a beacon route: a beacon (`POST`), the CORS preflight (`OPTIONS`),
/// or `405`. The router's handlers and [`super::serve`]'s direct path both come here.
pub(crate) async fn route<B>(
    service: Service,
    kind: Kind,
    peer: IpAddr,
    req: Request<B>,
) -> Response
where
    B: HttpBody<Data = Bytes>,
{
    let (parts, body) = req.into_parts();
    let cors = &service.inner.cors;
    let origin = parts.headers.get(header::ORIGIN);
    let mut response = match parts.method {
        Method::POST => match receive(&service, kind, peer, &parts.headers, body).await {
            Ok(()) => {
                service.inner.metrics.accepted(kind);
                StatusCode::NO_CONTENT.into_response()
            }
            Err(reason) => {
                service.inner.metrics.rejected(kind, reason);
                reason.into_response()
            }
        },
        Method::OPTIONS => return cors.preflight(origin),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, HeaderValue::from_static("POST"))],
        )
            .into_response(),
    };
    cors.apply(origin, response.headers_mut());
    response
}

async fn handle(service: Service, kind: Kind, req: Request<Body>) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let Some(peer) = peer else {
        tracing::error!(
            "the beacon routes need ConnectInfo<SocketAddr>: serve them with service::serve or into_make_service_with_connect_info"
        );
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    route(service, kind, peer, req).await
}

pub(crate) async fn nav(State(service): State<Service>, req: Request<Body>) -> Response {
    handle(service, Kind::Nav, req).await
}

pub(crate) async fn cdn(State(service): State<Service>, req: Request<Body>) -> Response {
    handle(service, Kind::Probe, req).await
}

/// The CORS answers of the beacon routes, as tower-http's `CorsLayer` gave them (allow
/// `POST` with `Content-Type` from the site's origins, credentials unless any origin may
/// send, a day's preflight cache), with every header value built once: the layer cloned
/// itself and rebuilt its `Vary` value on every request.
#[derive(Debug)]
pub(crate) struct Cors {
    /// `*`: any origin, without credentials.
    any: bool,
    origins: Vec<HeaderValue>,
}

impl Cors {
    const VARY: HeaderValue = HeaderValue::from_static(
        "origin, access-control-request-method, access-control-request-headers",
    );

    pub(crate) fn new(origins: &[String]) -> Cors {
        Cors {
            any: origins.iter().any(|o| o == "*"),
            origins: origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok())
                .collect(),
        }
    }

    /// The headers every answer carries.
    fn apply(&self, origin: Option<&HeaderValue>, headers: &mut HeaderMap) {
        headers.append(header::VARY, Cors::VARY);
        if self.any {
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
            return;
        }
        // sendBeacon sends cookies (credentials mode "include"): a preflighted JSON send
        // needs Allow-Credentials with the exact origin.
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
        if let Some(o) = origin.filter(|o| self.origins.contains(o)) {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o.clone());
        }
    }

    fn preflight(&self, origin: Option<&HeaderValue>) -> Response {
        let mut response = Response::new(Body::empty());
        let headers = response.headers_mut();
        self.apply(origin, headers);
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("POST"),
        );
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("content-type"),
        );
        headers.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("86400"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn forwarding_headers_are_believed_only_from_trusted_proxies() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let h = headers(&[("x-forwarded-for", "203.0.113.9, 10.1.1.1")]);
        // From the load balancer: the client is the first untrusted hop from the right.
        assert_eq!(
            client_address("10.0.0.5".parse().unwrap(), &h, &trusted),
            ("203.0.113.9".parse().unwrap(), false)
        );
        // From anyone else: the header is forged or foreign; the socket is the client.
        assert_eq!(
            client_address("198.51.100.7".parse().unwrap(), &h, &trusted),
            ("198.51.100.7".parse().unwrap(), true)
        );
        // A client that prepends its own "forwarded" address cannot choose its network.
        let h = headers(&[("x-forwarded-for", "8.8.8.8, 203.0.113.9")]);
        assert_eq!(
            client_address("10.0.0.5".parse().unwrap(), &h, &trusted).0,
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        let h = headers(&[(
            "forwarded",
            "for=\"[2001:db8::1]:4711\";proto=https, for=10.2.2.2",
        )]);
        assert_eq!(
            client_address("10.0.0.5".parse().unwrap(), &h, &trusted).0,
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
        let h = headers(&[("forwarded", "for=unknown")]);
        assert_eq!(
            client_address("10.0.0.5".parse().unwrap(), &h, &trusted).0,
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn the_hand_rolled_cors_answers_as_tower_http_did() {
        use tower::{Layer, ServiceExt};
        use tower_http::cors::{AllowOrigin, CorsLayer};

        // The layer the beacon routes had before their CORS was hand-rolled.
        let layer = |origins: &[String]| {
            let layer = CorsLayer::new()
                .allow_methods([Method::POST])
                .allow_headers([header::CONTENT_TYPE])
                .max_age(Duration::from_secs(86_400));
            if origins.iter().any(|o| o == "*") {
                layer.allow_origin(AllowOrigin::any())
            } else {
                let list: Vec<HeaderValue> = origins
                    .iter()
                    .filter_map(|o| HeaderValue::from_str(o).ok())
                    .collect();
                layer
                    .allow_origin(AllowOrigin::list(list))
                    .allow_credentials(true)
            }
        };
        let sorted = |h: &HeaderMap| {
            let mut v: Vec<(String, Vec<u8>)> = h
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect();
            v.sort();
            v
        };
        for origins in [
            vec!["https://www.example.com".to_owned()],
            vec![
                "https://a.example".to_owned(),
                "https://b.example".to_owned(),
            ],
            vec!["*".to_owned()],
        ] {
            let cors = Cors::new(&origins);
            for method in [Method::OPTIONS, Method::POST] {
                for origin in [
                    None,
                    Some("https://www.example.com"),
                    Some("https://b.example"),
                    Some("https://evil.example"),
                ] {
                    let mut req = axum::http::Request::builder()
                        .method(method.clone())
                        .uri("/rum/nav")
                        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
                        .header(header::ACCESS_CONTROL_REQUEST_HEADERS, "content-type");
                    if let Some(o) = origin {
                        req = req.header(header::ORIGIN, o);
                    }
                    let req = req.body(Body::empty()).unwrap();
                    let inner = tower::service_fn(|_req: axum::http::Request<Body>| async {
                        Ok::<_, std::convert::Infallible>(StatusCode::NO_CONTENT.into_response())
                    });
                    let theirs =
                        futures::executor::block_on(layer(&origins).layer(inner).oneshot(req))
                            .unwrap();
                    let origin = origin.map(HeaderValue::from_static);
                    let ours = if method == Method::OPTIONS {
                        cors.preflight(origin.as_ref())
                    } else {
                        let mut r = StatusCode::NO_CONTENT.into_response();
                        cors.apply(origin.as_ref(), r.headers_mut());
                        r
                    };
                    let case = format!("{origins:?} {method} {origin:?}");
                    assert_eq!(ours.status(), theirs.status(), "{case}");
                    assert_eq!(sorted(ours.headers()), sorted(theirs.headers()), "{case}");
                }
            }
        }
    }

    #[test]
    fn the_wire_forms_read_as_serde_json_values_read_them() {
        let w: ProbeWire<'_> = parse(
            br#"{"id":"a\u0062c","at":"2026-01-01T00:00:00Z","times":{"f\u0061stly":1,"b":null,"fastly":2.5},"best":"b"}"#,
        )
        .unwrap();
        assert_eq!(w.id.unwrap().0, "abc");
        assert_eq!(
            w.at.unwrap().0,
            Some(Timestamp::parse_rfc3339("2026-01-01T00:00:00Z").unwrap())
        );
        // A repeated provider: the last time counts, as in a map.
        let Times::ByProvider(t) = w.times else {
            panic!("by provider")
        };
        assert_eq!(
            t,
            vec![
                (Cow::Borrowed("fastly"), Some(2.5)),
                (Cow::Borrowed("b"), None)
            ]
        );
        let w: ProbeWire<'_> = parse(br#"{"times":[1,null,3.5],"at":1700000000000}"#).unwrap();
        assert!(matches!(w.times, Times::InOrder(ref t) if t == &[Some(1.0), None, Some(3.5)]));
        assert_eq!(
            w.at.unwrap().0,
            Some(Timestamp::from_millis(1_700_000_000_000))
        );
        // Times that cannot be read are ignored, whatever their JSON type.
        for at in [
            "-5",
            "1e16",
            "true",
            "[1,{}]",
            "{\"a\":[1]}",
            "\"yesterday\"",
        ] {
            let body = format!(r#"{{"at":{at},"ttfb":5,"provider":"p"}}"#);
            let w: NavWire<'_> = parse(body.as_bytes()).unwrap();
            assert!(w.at.unwrap().0.is_none(), "{at}");
        }
        let w: NavWire<'_> = parse(br#"{"id":"x","at":null,"ttfb":5,"provider":"p"}"#).unwrap();
        assert!(w.at.is_none());
        assert!(matches!(w.id.unwrap().0, Cow::Borrowed("x")), "not copied");
        assert_eq!(
            parse::<ProbeWire<'_>>(br#"{"times":"fast"}"#).err(),
            Some(Reject::NotABeacon)
        );
        assert_eq!(
            parse::<ProbeWire<'_>>(br#"{"times":{"a":"x"}}"#).err(),
            Some(Reject::NotABeacon)
        );
        assert_eq!(
            parse::<ProbeWire<'_>>(br#"{"times":{"a":1}"#).err(),
            Some(Reject::Malformed)
        );
    }

    #[test]
    fn every_reason_is_listed_once_in_declaration_order() {
        // The metrics index their counters by `reason as usize`.
        for (i, r) in Reject::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?}");
        }
    }

    #[test]
    fn the_id_memory_is_bounded_and_forgets_the_oldest() {
        let r = Receiver::new(ClientLimit::default(), 2);
        assert!(r.first_time(Kind::Nav, "a"));
        assert!(!r.first_time(Kind::Nav, "a"));
        assert!(r.first_time(Kind::Probe, "a"));
        assert!(r.first_time(Kind::Nav, "b"));
        assert!(r.first_time(Kind::Nav, "a"), "the oldest id was forgotten");
    }
}
