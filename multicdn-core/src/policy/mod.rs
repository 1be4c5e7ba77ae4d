//! The policy file: one YAML document, the single source of truth for providers, cache policy,
//! health checking and steering.
//!
//! [`Policy::load`] parses with `deny_unknown_fields`, then validates once. Every error names
//! the file, line and column, the field's path (`steering.regions[2].weights`) and what would
//! be valid:
//!
//! ```
//! let yaml = "site: {host: www.example.com}\nproviders: {}\nhealth: {path: /h, expect: ok, regions: [a]}\nsteering: {record: w.example.com, zone: example.com, regions: []}\nsurprise: 1\n";
//! let err = multicdn_core::policy::Policy::from_yaml(yaml, "policy.yaml").unwrap_err();
//! assert!(err.to_string().starts_with("policy.yaml:5:1: surprise:"), "{err}");
//! ```
//!
//! Durations are written `90s` or `10m` (or a number of seconds); shares `10%` or `12.5%`
//! (or a number of percent). `examples/policy.yaml` is a complete file.

mod location;
mod tree;
pub mod units;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::id::{CohortId, ProviderId, RegionId};
use crate::network::NetworkKey;
use crate::traits::{CohortPlan, ProviderKind, SteeringPlan};
use crate::weights::Weights;

use location::LocationIndex;
pub use location::Position;
pub use units::{Dur, Share};

/// The whole policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Policy {
    /// The site every provider fronts (required: nothing guesses a hostname).
    pub site: Site,
    /// The CDNs, by id.
    pub providers: BTreeMap<ProviderId, ProviderSpec>,
    /// What to cache and for how long (rendered to every provider).
    #[serde(default)]
    pub cache: CachePolicy,
    /// How edges are probed.
    pub health: HealthPolicy,
    /// How traffic is split and moved.
    pub steering: SteeringPolicy,
    /// The origin shield between the CDNs and the origin, if there is one: its VCL is rendered
    /// from `cache`, and every purge clears it before the CDNs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shield: Option<ShieldSpec>,
}

/// The origin shield (seed 000 sections 10 and 19): one Varnish cache every CDN fetches from,
/// so a page that misses on both CDNs reaches the origin once, and a failing origin is covered
/// by the shield's stale copies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ShieldSpec {
    /// Where the shield listens for `PURGE` requests (`http://shield.internal:6081/`): the
    /// shield authenticates purgers by address, so plain HTTP on a private network is usual.
    pub url: String,
    /// The origin the shield fetches from (a name or an address).
    pub origin_host: String,
    /// The origin's port (Varnish fetches over plain HTTP).
    #[serde(default = "default_origin_port")]
    pub origin_port: u16,
    /// The addresses allowed to purge (the controller's), rendered as the VCL's ACL.
    pub purgers: Vec<std::net::IpAddr>,
}

impl ShieldSpec {
    /// The id the shield has in purge reports and events (`shield`); no provider may take
    /// this name while the policy has a shield.
    pub const ID: &'static str = "shield";
}

fn default_origin_port() -> u16 {
    80
}

/// The site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Site {
    /// The public hostname (`www.example.com`), sent as `Host` to edges.
    pub host: String,
}

/// A Cloudflare plan, which sets its purge rate limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CloudflarePlan {
    /// Free: 5 purge requests a minute.
    Free,
    /// Pro: 5 a second.
    #[default]
    Pro,
    /// Business: 10 a second.
    Business,
    /// Enterprise: 50 a second, 500 URLs a request.
    Enterprise,
}

/// The Akamai network a purge goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AkamaiNetwork {
    /// The staging network (what a property's staging version serves).
    Staging,
    /// The production network, Fast Purge's default.
    #[default]
    Production,
}

impl AkamaiNetwork {
    /// The network as Fast Purge's paths write it: `staging`, `production`.
    pub fn as_str(self) -> &'static str {
        match self {
            AkamaiNetwork::Staging => "staging",
            AkamaiNetwork::Production => "production",
        }
    }
}

/// One provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ProviderSpec {
    /// The vendor.
    pub kind: ProviderKind,
    /// The edge hostname traffic is steered to (`example.map.fastly.net`).
    pub edge_host: String,
    /// Fastly: the service id.
    #[serde(default)]
    pub service_id: Option<String>,
    /// Cloudflare: the zone id.
    #[serde(default)]
    pub zone_id: Option<String>,
    /// Cloudflare: the plan, for purge limits.
    #[serde(default)]
    pub plan: Option<CloudflarePlan>,
    /// The environment variable holding the API token (never the token itself).
    #[serde(default)]
    pub token_env: Option<String>,
    /// A configured standby (seed 000 sections 18 and 21): fully configured, probed,
    /// drift-checked and warmed, but carrying no traffic. It has no measurement floor, real-user
    /// measurements never move traffic to it, and it takes traffic only when every live
    /// provider is down (the failover) or in a drill.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
    /// Akamai: the EdgeGrid API host of the API client (`akab-xxxx.luna.akamaiapis.net`).
    #[serde(default)]
    pub api_host: Option<String>,
    /// Akamai: the network purges go to (production when absent).
    #[serde(default)]
    pub network: Option<AkamaiNetwork>,
    /// Akamai: the CP codes a purge of everything purges (none: no purge of everything).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cp_codes: Vec<u64>,
    /// Akamai: the environment variable holding the EdgeGrid client token.
    #[serde(default)]
    pub client_token_env: Option<String>,
    /// Akamai: the environment variable holding the EdgeGrid client secret.
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// Akamai: the environment variable holding the EdgeGrid access token.
    #[serde(default)]
    pub access_token_env: Option<String>,
    /// The hosts this CDN serves video from, in preference order (none: `edge_host`). In
    /// manifests tagged for content steering the first is the provider's pathway; each further
    /// one is a pathway clone ([`ProviderSpec::video_pathways`]: `<id>-2`, `<id>-3`, ...) that
    /// the steering server lists right after it, so a player that cannot reach one host tries
    /// the same CDN's next before it moves to another CDN.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub video_hosts: Vec<String>,
}

impl ProviderSpec {
    /// The host its pathway points at in tagged manifests: the first of `video_hosts`, else
    /// `edge_host`.
    pub fn video_host(&self) -> &str {
        self.video_hosts.first().unwrap_or(&self.edge_host)
    }

    /// The pathway clones of provider `id`'s further video hosts, as (clone id, host):
    /// `<id>-2` for the second host, and so on.
    pub fn video_pathways(&self, id: &ProviderId) -> Vec<(String, String)> {
        self.video_hosts
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, host)| (format!("{id}-{}", i + 1), host.clone()))
            .collect()
    }
}

/// Cache defaults, cache key and routes (seed 000, section 13).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CachePolicy {
    /// Defaults for every cacheable response.
    #[serde(default)]
    pub defaults: CacheDefaults,
    /// What varies the cache key.
    #[serde(default)]
    pub cache_key: CacheKey,
    /// Per-path rules, first match wins.
    #[serde(default)]
    pub routes: Vec<Route>,
}

/// Cache defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CacheDefaults {
    /// Edge TTL.
    #[serde(default = "default_ttl_edge")]
    pub ttl_edge: Dur,
    /// Browser TTL.
    #[serde(default = "default_ttl_browser")]
    pub ttl_browser: Dur,
    /// `stale-while-revalidate`.
    #[serde(default = "default_swr")]
    pub stale_while_revalidate: Dur,
    /// `stale-if-error`, set on every cacheable response.
    #[serde(default = "default_sie")]
    pub stale_if_error: Dur,
}

fn default_ttl_edge() -> Dur {
    Dur::secs(3600)
}
fn default_ttl_browser() -> Dur {
    Dur::secs(60)
}
fn default_swr() -> Dur {
    Dur::secs(86_400)
}
fn default_sie() -> Dur {
    Dur::secs(604_800)
}

impl Default for CacheDefaults {
    fn default() -> CacheDefaults {
        CacheDefaults {
            ttl_edge: default_ttl_edge(),
            ttl_browser: default_ttl_browser(),
            stale_while_revalidate: default_swr(),
            stale_if_error: default_sie(),
        }
    }
}

/// What goes into the cache key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CacheKey {
    /// Query parameters kept in the key; all others are dropped.
    #[serde(default)]
    pub query_allowlist: Vec<String>,
    /// Cookies kept in the key.
    #[serde(default)]
    pub cookie_allowlist: Vec<String>,
    /// Normalise `Accept-Encoding` to `br`, `gzip` or nothing.
    #[serde(default = "yes")]
    pub normalise_accept_encoding: bool,
}

fn yes() -> bool {
    true
}

impl Default for CacheKey {
    fn default() -> CacheKey {
        CacheKey {
            query_allowlist: Vec::new(),
            cookie_allowlist: Vec::new(),
            normalise_accept_encoding: true,
        }
    }
}

/// Whether a route is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Cached with the route's or the default TTLs.
    #[default]
    Default,
    /// Never cached (private, per-user).
    Never,
}

/// One path rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Route {
    /// A regular expression over the path (`^/products/`).
    #[serde(rename = "match")]
    pub pattern: String,
    /// `never` for private paths.
    #[serde(default)]
    pub cache: CacheMode,
    /// Edge TTL for this route.
    #[serde(default)]
    pub ttl_edge: Option<Dur>,
    /// Browser TTL for this route.
    #[serde(default)]
    pub ttl_browser: Option<Dur>,
    /// Response headers to set.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Take surrogate keys (tags) from the origin's `Surrogate-Key` header.
    #[serde(default)]
    pub surrogate_keys_from_origin: bool,
    /// Versioned assets: `Cache-Control: immutable`.
    #[serde(default)]
    pub immutable: bool,
}

/// How edges are probed (seed 000, section 9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct HealthPolicy {
    /// The object fetched through every edge (`/_health/v3.txt`).
    pub path: String,
    /// A string its body must contain.
    pub expect: String,
    /// Statuses that pass.
    #[serde(default = "default_expect_status")]
    pub expect_status: Vec<u16>,
    /// The probe runners' regions.
    pub regions: Vec<RegionId>,
    /// How many fresh runners must agree that a provider is down.
    #[serde(default = "default_quorum")]
    pub quorum: usize,
    /// Consecutive bad rounds before down.
    #[serde(default = "default_down_after")]
    pub down_after: u32,
    /// Consecutive good rounds before up.
    #[serde(default = "default_up_after")]
    pub up_after: u32,
    /// Time between rounds.
    #[serde(default = "default_interval")]
    pub interval: Dur,
    /// Each probe's deadline.
    #[serde(default = "default_timeout")]
    pub timeout: Dur,
    /// Observations older than this do not vote (default: three intervals).
    #[serde(default)]
    pub fresh_for: Option<Dur>,
}

fn default_expect_status() -> Vec<u16> {
    vec![200]
}
fn default_quorum() -> usize {
    3
}
fn default_down_after() -> u32 {
    2
}
fn default_up_after() -> u32 {
    10
}
fn default_interval() -> Dur {
    Dur::secs(30)
}
fn default_timeout() -> Dur {
    Dur::secs(3)
}

impl HealthPolicy {
    /// How long an observation keeps its vote.
    pub fn fresh_for(&self) -> Dur {
        self.fresh_for
            .unwrap_or(Dur(self.interval.0.saturating_mul(3)))
    }
}

/// How traffic is split and moved (seed 000 section 15, seed 002).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SteeringPolicy {
    /// The steered name (`www.example.com`).
    pub record: String,
    /// The DNS zone holding it (`example.com`).
    pub zone: String,
    /// The answers' TTL.
    #[serde(default = "default_ttl")]
    pub ttl: Dur,
    /// Static weights per region, in match order; exactly one matches `*`.
    pub regions: Vec<RegionSpec>,
    /// Shares no provider may drop under while healthy.
    #[serde(default)]
    pub floors: Floors,
    /// How a demoted provider's traffic moves away.
    #[serde(default)]
    pub failover: Failover,
    /// When real-user measurements may move traffic.
    #[serde(default)]
    pub rum: RumPolicy,
    /// Limits that apply after every other rule.
    #[serde(default)]
    pub guardrails: Guardrails,
    /// Manual pins for networks under known events.
    #[serde(default)]
    pub pins: Vec<Pin>,
    /// The last resort when every provider is down: a host serving a static catalogue,
    /// answered instead of the static weights, and left as soon as one provider is healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
    /// Announced drills: shifts of traffic to a standby or secondary for a set time, watched
    /// against the pre-drill baseline and aborted on a regression.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drills: Vec<DrillSpec>,
}

/// The static fallback (seed 000 section 20): a static export of the top pages, hosted
/// somewhere independent of every CDN. Browsing is degraded and orders cannot be taken, but
/// a dead site becomes a slow catalogue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Fallback {
    /// The host DNS answers with (`catalogue.example-static.net`).
    pub host: String,
}

impl Fallback {
    /// The provider id the fallback host is steered under in plans (`fallback`); no provider
    /// may take this name.
    pub const ID: &'static str = "fallback";

    /// [`Fallback::ID`] as a provider id.
    pub fn id() -> ProviderId {
        ProviderId::trusted(Fallback::ID)
    }
}

/// One announced drill (seed 000 sections 18, 20, 21): at `at`, shift `share` of the traffic
/// of the cohorts it names (all, when none) from every other provider to `to`, in the
/// failover's steps, hold it for `hold`, then return in the same steps. The Controller watches
/// real-user p90 TTFB and the error rate against the baseline measured before the drill and
/// aborts, stepwise, on a regression beyond `abort`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DrillSpec {
    /// The drill's name, in the journal and its report (`q4-standby`).
    pub name: CohortId,
    /// When the shift starts.
    pub at: Timestamp,
    /// The provider the traffic moves to (usually the standby).
    pub to: ProviderId,
    /// How much of each cohort's traffic ends on `to` (up to 100%).
    #[serde(default = "full_share")]
    pub share: Share,
    /// How long the full shift is held before the return.
    pub hold: Dur,
    /// The cohorts drilled; empty: every region.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cohorts: Vec<CohortId>,
    /// What aborts it.
    #[serde(default)]
    pub abort: DrillAbort,
}

fn full_share() -> Share {
    Share::percent(100)
}

/// A drill's abort thresholds, against the baseline measured before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DrillAbort {
    /// p90 TTFB may rise by at most this much over the baseline (seed 000: watch p90, not the
    /// median, which hides fragmentation).
    #[serde(default = "default_p90_rise")]
    pub p90_rise: Dur,
    /// The error rate may rise by at most this many percentage points.
    #[serde(default = "default_error_rise")]
    pub error_rise: Share,
    /// Samples a region needs during the drill before its figures can abort it.
    #[serde(default = "default_drill_samples")]
    pub min_samples: u64,
}

fn default_p90_rise() -> Dur {
    Dur::millis(150)
}
fn default_error_rise() -> Share {
    Share::percent(1)
}
fn default_drill_samples() -> u64 {
    200
}

impl Default for DrillAbort {
    fn default() -> DrillAbort {
        DrillAbort {
            p90_rise: default_p90_rise(),
            error_rise: default_error_rise(),
            min_samples: default_drill_samples(),
        }
    }
}

fn default_ttl() -> Dur {
    Dur::secs(30)
}

/// One region's static weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RegionSpec {
    /// The cohort's name; defaults to `default` for `*` and `region-N` otherwise.
    #[serde(default)]
    pub name: Option<CohortId>,
    /// Countries, continents, ASNs; `*` for everything else.
    #[serde(rename = "match")]
    pub networks: Vec<NetworkKey>,
    /// The split; must sum to 100%.
    pub weights: BTreeMap<ProviderId, Share>,
}

impl RegionSpec {
    /// The cohort name this region steers under.
    pub fn cohort_id(&self, index: usize) -> CohortId {
        if let Some(name) = &self.name {
            return name.clone();
        }
        let fallback = if self.networks.contains(&NetworkKey::Global) {
            "default".to_owned()
        } else {
            format!("region-{index}")
        };
        // Both fallbacks satisfy the id rules.
        CohortId::trusted(&fallback)
    }

    /// The split as [`Weights`] (valid once the policy has been validated).
    pub fn weights(&self) -> Result<Weights, crate::weights::WeightsError> {
        Weights::new(self.weights.iter().map(|(p, s)| (p.clone(), s.bp())))
    }
}

/// Floors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Floors {
    /// Every healthy provider keeps at least this share, so it stays measured and warm.
    #[serde(default = "default_measurement_floor")]
    pub measurement: Share,
    /// Commercial commits: a provider's minimum share.
    #[serde(default)]
    pub commits: BTreeMap<ProviderId, Share>,
}

fn default_measurement_floor() -> Share {
    Share::percent(10)
}

impl Default for Floors {
    fn default() -> Floors {
        Floors {
            measurement: default_measurement_floor(),
            commits: BTreeMap::new(),
        }
    }
}

impl Floors {
    /// The floor that applies to `provider`: the larger of the measurement floor and its commit.
    pub fn for_provider(&self, provider: &ProviderId) -> Share {
        self.measurement
            .max(self.commits.get(provider).copied().unwrap_or_default())
    }
}

/// Failover in steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Failover {
    /// Cumulative share of a demoted provider's traffic moved at each step; ends at 100%.
    #[serde(default = "default_steps")]
    pub steps: Vec<Share>,
    /// Time between steps.
    #[serde(default = "default_step_interval")]
    pub interval: Dur,
}

fn default_steps() -> Vec<Share> {
    vec![Share::percent(50), Share::percent(100)]
}
fn default_step_interval() -> Dur {
    Dur::secs(90)
}

impl Default for Failover {
    fn default() -> Failover {
        Failover {
            steps: default_steps(),
            interval: default_step_interval(),
        }
    }
}

/// When real-user measurements may move traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RumPolicy {
    /// Steer on RUM at all.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The percentile compared (75 for p75).
    #[serde(default = "default_percentile")]
    pub percentile: u8,
    /// Samples a cell needs before it may steer.
    #[serde(default = "default_min_samples")]
    pub min_samples: u64,
    /// Probe loads that timed two providers at once (pairs) a cohort needs before that paired
    /// comparison may steer it with fewer than `min_samples` samples. Both times of a pair
    /// come from one user at one moment, so the user's own speed (device, last mile) cancels
    /// from their difference. The default is the default `min_samples` carried over: where
    /// the user makes most of a load's spread (a correlation of 0.8 between a load's two
    /// times, 0.59 between two p75 estimates by Sheppard's formula), the difference of two
    /// p75s over 80 pairs is as certain as over 200 independent samples of each. Either way
    /// the significance test, from the cohort's own spread and correlation, decides whether a
    /// gap moves traffic.
    #[serde(default = "default_min_pairs")]
    pub min_pairs: u64,
    /// The measurement window: the latest evidence, what a busy network is judged on.
    #[serde(default = "default_window")]
    pub window: Dur,
    /// The longest window a sparse network is judged on: a network too thin in `window` is
    /// judged on twice, four times... the window, up to this (samples older than it age
    /// out). A provider whose latest `window` differs from the longer one beyond the noise,
    /// and by a material amount, is judged on its latest `window`, so that a long window never
    /// hides a change. Unset: four times `window` ([`RumPolicy::max_window`]). The scoreboard
    /// keeps this much, so a busy cell's memory grows with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_window: Option<Dur>,
    /// A gap must exceed this share of the slower provider's value...
    #[serde(default = "default_relative_gap")]
    pub relative_gap: Share,
    /// ...and this many milliseconds.
    #[serde(default = "default_absolute_gap")]
    pub absolute_gap: Dur,
    /// Switching back needs the gap times this factor (hysteresis), at least 1.
    #[serde(default = "default_switch_back")]
    pub switch_back_factor: f64,
    /// The most one move shifts a cohort (damping).
    #[serde(default = "default_step")]
    pub step: Share,
    /// After a move, a cohort waits this long to re-measure.
    #[serde(default = "default_settle")]
    pub settle: Dur,
    /// Providers under this availability are not scored at all.
    #[serde(default = "default_availability")]
    pub availability_threshold: Share,
    /// The client-side probe the shipped browser script runs (seed 000 section 8).
    #[serde(default)]
    pub probe: ProbePolicy,
}

/// The sampled client-side probe: on a share of page loads the browser fetches the same small
/// object through every provider and reports each time, the paired comparison the scoreboard's
/// probe cells hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ProbePolicy {
    /// The share of page loads that run the probe (`2%`).
    #[serde(default = "default_probe_sample")]
    pub sample: Share,
    /// The probe object's absolute URL through each provider
    /// (`fastly: https://a.cdn.example.com/_multicdn/probe.gif`); none: the script only sends
    /// navigation beacons.
    #[serde(default)]
    pub objects: BTreeMap<ProviderId, String>,
}

fn default_probe_sample() -> Share {
    Share::percent(2)
}

impl Default for ProbePolicy {
    fn default() -> ProbePolicy {
        ProbePolicy {
            sample: default_probe_sample(),
            objects: BTreeMap::new(),
        }
    }
}

impl RumPolicy {
    /// The longest window (`max_window`, else four times `window`).
    pub fn max_window(&self) -> Duration {
        self.max_window
            .map_or_else(|| self.window.get().saturating_mul(4), |d| d.get())
            .max(self.window.get())
    }

    /// The latest part of `window`, half of it: read only to see a change within a longer
    /// window (a degradation shows here minutes before it moves a whole window's percentile).
    pub fn latest_window(&self) -> Duration {
        self.window.get() / 2
    }

    /// Every window a round reads, shortest first: [`RumPolicy::latest_window`], then
    /// [`RumPolicy::windows`].
    pub fn read_windows(&self) -> Vec<Duration> {
        let mut out = vec![self.latest_window()];
        out.extend(self.windows());
        out
    }

    /// The windows a network is judged on, shortest first: `window`, doubled while shorter
    /// than `max_window`, then `max_window`.
    pub fn windows(&self) -> Vec<Duration> {
        let (first, last) = (self.window.get(), self.max_window());
        let mut out = vec![first];
        let mut w = first.saturating_mul(2);
        while w < last && !first.is_zero() {
            out.push(w);
            w = w.saturating_mul(2);
        }
        if last > first {
            out.push(last);
        }
        out
    }
}

fn default_percentile() -> u8 {
    75
}
fn default_min_samples() -> u64 {
    200
}
fn default_min_pairs() -> u64 {
    80
}
fn default_window() -> Dur {
    Dur::secs(3600)
}
fn default_relative_gap() -> Share {
    Share::percent(10)
}
fn default_absolute_gap() -> Dur {
    Dur::millis(20)
}
fn default_switch_back() -> f64 {
    1.5
}
fn default_step() -> Share {
    Share::percent(20)
}
fn default_settle() -> Dur {
    Dur::secs(600)
}
fn default_availability() -> Share {
    Share(9900)
}

impl Default for RumPolicy {
    fn default() -> RumPolicy {
        RumPolicy {
            enabled: true,
            percentile: default_percentile(),
            min_samples: default_min_samples(),
            min_pairs: default_min_pairs(),
            window: default_window(),
            max_window: None,
            relative_gap: default_relative_gap(),
            absolute_gap: default_absolute_gap(),
            switch_back_factor: default_switch_back(),
            step: default_step(),
            settle: default_settle(),
            availability_threshold: default_availability(),
            probe: ProbePolicy::default(),
        }
    }
}

/// Limits applied last, after every other rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Guardrails {
    /// Total traffic moved in any hour (weighted by each cohort's share of traffic) by the
    /// optimizing rules (RUM, pins).
    #[serde(default = "default_max_moved")]
    pub max_moved_per_hour: Share,
    /// Total traffic returned in any hour to providers that recovered from a failover, on a
    /// budget of its own: a global outage's failover is not capped (it is safety), and its
    /// return, paced by the steps and the settle time, need not wait hours for the
    /// optimization's budget. 100% by default.
    #[serde(default = "default_max_recovered")]
    pub max_recovered_per_hour: Share,
    /// The most one cohort's split changes in any hour.
    #[serde(default = "default_max_cohort")]
    pub max_change_per_cohort: Share,
    /// Inputs older than this: fall back to the static weights (never to zero).
    #[serde(default = "default_stale_after")]
    pub stale_after: Dur,
    /// The big red switch: serve the static weights and ignore everything else.
    #[serde(default, rename = "static")]
    pub static_mode: bool,
    /// Refuse to apply a plan touching more than this share of a record's sets, unless forced.
    #[serde(default = "default_max_touched")]
    pub max_touched_per_apply: Share,
}

fn default_max_moved() -> Share {
    Share::percent(30)
}
fn default_max_recovered() -> Share {
    Share::percent(100)
}
fn default_max_cohort() -> Share {
    Share::percent(40)
}
fn default_stale_after() -> Dur {
    Dur::secs(900)
}
fn default_max_touched() -> Share {
    Share::percent(30)
}

impl Default for Guardrails {
    fn default() -> Guardrails {
        Guardrails {
            max_moved_per_hour: default_max_moved(),
            max_recovered_per_hour: default_max_recovered(),
            max_change_per_cohort: default_max_cohort(),
            stale_after: default_stale_after(),
            static_mode: false,
            max_touched_per_apply: default_max_touched(),
        }
    }
}

/// A manual pin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Pin {
    /// The network pinned (`AS7922`, `DE`).
    pub network: NetworkKey,
    /// The split it gets while pinned; must sum to 100%.
    pub weights: BTreeMap<ProviderId, Share>,
    /// When the pin lapses (RFC 3339).
    pub until: Timestamp,
    /// Why, for the journal.
    pub reason: String,
}

impl Pin {
    /// A pin of `network` to `weights` until `until`, for `reason` (checked by
    /// [`Pin::weights`] and, in a policy file, by validation).
    pub fn new(
        network: NetworkKey,
        weights: BTreeMap<ProviderId, Share>,
        until: Timestamp,
        reason: impl Into<String>,
    ) -> Pin {
        Pin {
            network,
            weights,
            until,
            reason: reason.into(),
        }
    }

    /// The split as [`Weights`].
    pub fn weights(&self) -> Result<Weights, crate::weights::WeightsError> {
        Weights::new(self.weights.iter().map(|(p, s)| (p.clone(), s.bp())))
    }
}

/// One problem in a policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file, as given.
    pub file: String,
    /// Where.
    pub position: Position,
    /// The field's path (`steering.regions[2].weights`).
    pub path: String,
    /// What is wrong, and what would be valid.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file,
            self.position.line,
            self.position.column,
            if self.path.is_empty() {
                "(document)"
            } else {
                &self.path
            },
            self.message
        )
    }
}

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file was read but is not a valid policy: every problem found.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Diagnostic>),
}

impl PolicyError {
    /// The problems, for an invalid file.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            PolicyError::Invalid(d) => d,
            PolicyError::Read { .. } => &[],
        }
    }
}

impl Policy {
    /// Reads and validates the policy at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Policy, PolicyError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let src = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            file: file.clone(),
            source,
        })?;
        Policy::from_yaml(&src, &file)
    }

    /// Parses and validates a policy; `file` names it in errors. Every problem is reported,
    /// each under its own path: a missing key under its parent
    /// (`providers.fastly.edge_host`), an unknown key as itself.
    pub fn from_yaml(src: &str, file: &str) -> Result<Policy, PolicyError> {
        let index = LocationIndex::build(src);
        let diagnostic = |path: String, message: String| Diagnostic {
            file: file.to_owned(),
            position: index
                .position_of(&path)
                .unwrap_or(Position { line: 1, column: 1 }),
            path: escape_control(&path),
            // A message may quote a value from the file, line breaks and all: a diagnostic
            // is one line.
            message: escape_control(&message),
        };
        let policy: Policy = match serde_saphyr::from_str(src) {
            Ok(policy) => policy,
            Err(e) => {
                let position = e
                    .location()
                    .map(|l| Position {
                        line: l.line() as usize,
                        column: l.column() as usize,
                    })
                    .unwrap_or(Position { line: 1, column: 1 });
                let first = Diagnostic {
                    file: file.to_owned(),
                    position,
                    path: escape_control(index.path_at(position).unwrap_or_default()),
                    message: escape_control(&plain_message(&e)),
                };
                let Some(found) = tree::every_problem::<Policy>(src, REQUIRED_SECTIONS)
                    .filter(|f| !f.problems.is_empty())
                else {
                    return Err(PolicyError::Invalid(vec![first]));
                };
                let mut all: Vec<Diagnostic> = found
                    .problems
                    .into_iter()
                    .map(|(path, message)| diagnostic(path, message))
                    .collect();
                // What else is wrong in the parts that read, unless it only repeats a problem
                // already reported (a check over a list missing the entry set aside).
                if let Some((rest, set_aside)) = found.rest {
                    // A provider set aside is still defined: its name is no unknown provider.
                    let providers_aside: Vec<&str> = set_aside
                        .iter()
                        .filter_map(|p| p.strip_prefix("providers."))
                        .map(|p| p.split(['.', '[']).next().unwrap_or(p))
                        .collect();
                    let overlaps = |p: &str| {
                        set_aside.iter().any(|s| within(p, s) || within(s, p))
                            || p.rsplit('.')
                                .next()
                                .is_some_and(|last| providers_aside.contains(&last))
                    };
                    all.extend(
                        validate::validate(&rest)
                            .into_iter()
                            .filter(|(p, _)| !overlaps(p))
                            .map(|(path, message)| diagnostic(path, message)),
                    );
                }
                return Err(PolicyError::Invalid(all));
            }
        };
        let problems = validate::validate(&policy);
        if problems.is_empty() {
            return Ok(policy);
        }
        Err(PolicyError::Invalid(
            problems
                .into_iter()
                .map(|(path, message)| diagnostic(path, message))
                .collect(),
        ))
    }

    /// The static plan: every region's weights from the file, as the steering plan every
    /// actuator understands. This is what the deadman and the big red switch fall back to.
    pub fn static_plan(&self) -> SteeringPlan {
        SteeringPlan {
            record: self.steering.record.clone(),
            ttl: self.steering.ttl.get(),
            cohorts: self
                .steering
                .regions
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    Some(CohortPlan {
                        cohort: r.cohort_id(i),
                        networks: r.networks.as_slice().into(),
                        weights: r.weights().ok()?,
                    })
                })
                .collect(),
        }
    }

    /// The provider ids, sorted.
    pub fn provider_ids(&self) -> Vec<ProviderId> {
        self.providers.keys().cloned().collect()
    }

    /// Whether `provider` is a configured standby (`providers.<id>.standby: true`).
    pub fn is_standby(&self, provider: &ProviderId) -> bool {
        self.providers.get(provider).is_some_and(|s| s.standby)
    }

    /// The floor `provider` keeps while healthy: the larger of the measurement floor and its
    /// commit, and none for a standby (it carries nothing unless failed over to or drilled).
    pub fn floor_of(&self, provider: &ProviderId) -> Share {
        if self.is_standby(provider) {
            return Share::default();
        }
        self.steering.floors.for_provider(provider)
    }

    /// What DNS answers point at, by provider id: every provider's edge host, and the static
    /// fallback's host under [`Fallback::ID`] when the policy has one.
    pub fn answer_targets(&self) -> BTreeMap<ProviderId, String> {
        let mut targets: BTreeMap<ProviderId, String> = self
            .providers
            .iter()
            .map(|(id, spec)| (id.clone(), spec.edge_host.clone()))
            .collect();
        if let Some(f) = &self.steering.fallback {
            targets.insert(Fallback::id(), f.host.clone());
        }
        targets
    }

    /// The plan that answers every cohort with the static fallback host, when the policy has
    /// one: what DNS says when every provider is down.
    pub fn fallback_plan(&self) -> Option<SteeringPlan> {
        self.steering.fallback.as_ref()?;
        let mut plan = self.static_plan();
        for c in &mut plan.cohorts {
            c.weights = Weights::single(Fallback::id());
        }
        Some(plan)
    }
}

/// The top-level sections a policy must have.
const REQUIRED_SECTIONS: &[&str] = &["site", "providers", "health", "steering"];

/// Whether `path` is `parent` or lies under it.
fn within(path: &str, parent: &str) -> bool {
    path.strip_prefix(parent)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        || parent.is_empty()
}

/// `text` on one line: every control character (a line break above all) written as its Rust
/// escape (`\n`, `\u{1b}`), everything else as it is. For policy text quoted where a line break
/// would change the meaning: a diagnostic's path, a comment in rendered configuration.
pub fn escape_control(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The deserializer's message without its own location suffix or source snippet.
fn plain_message(e: &serde_saphyr::Error) -> String {
    let full = e.to_string();
    let first = full.lines().next().unwrap_or_default();
    let trimmed = match first.find(" at line ") {
        Some(i) => &first[..i],
        None => first,
    };
    trimmed.trim().to_owned()
}

#[cfg(test)]
mod tests;
