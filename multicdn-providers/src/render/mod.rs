//! One cache policy, two CDNs: pure renderers from the policy's `cache` section to Fastly VCL
//! snippets and Cloudflare rulesets (seed 000, sections 13, 14 and 18).
//!
//! The renderers take values and return values: no I/O, no clock, and the same policy always
//! gives the same bytes, so renderings can be reviewed in version control
//! (`tests/golden/policy.fastly.vcl`, `tests/golden/policy.cloudflare.json`). Deploying them is
//! the job of `fastly::deploy` and `cloudflare::deploy`, which plan (diff against what is
//! deployed) before they write anything.
//!
//! ```
//! use multicdn_core::Policy;
//! use multicdn_providers::render::RenderMode;
//! use multicdn_providers::render::cloudflare_rules::{CloudflareTarget, render_cloudflare};
//! use multicdn_providers::render::fastly_vcl::render_fastly;
//!
//! let policy = Policy::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/policy.yaml"))?;
//! let fastly = render_fastly(&policy.site, &policy.cache, RenderMode::Strict)?;
//! let deliver = fastly.snippet("multicdn-deliver-headers").ok_or("no deliver snippet")?;
//! assert!(deliver.content.contains("Server-Timing"));
//! assert!(deliver.content.contains("Timing-Allow-Origin = \"https://www.example.com\""));
//!
//! // Cloudflare cannot take surrogate keys from the origin: strict mode refuses, lenient
//! // mode renders the rest and names what it could not express.
//! let target = CloudflareTarget::default();
//! assert!(render_cloudflare(&policy.site, &policy.cache, target, RenderMode::Strict).is_err());
//! let cloudflare = render_cloudflare(&policy.site, &policy.cache, target, RenderMode::Lenient)?;
//! assert!(cloudflare.warnings.iter().any(|w| w.feature == "cache.routes[2].surrogate_keys_from_origin"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Deploying: plan, show the plan, apply only when asked to.
//!
//! ```no_run
//! # async fn deploy() -> Result<(), Box<dyn std::error::Error>> {
//! use multicdn_core::{Policy, ProviderId, Secret};
//! use multicdn_providers::fastly::deploy::FastlyDeployer;
//! use multicdn_providers::http::HttpSettings;
//! use multicdn_providers::render::RenderMode;
//! use multicdn_providers::render::fastly_vcl::render_fastly;
//!
//! let policy = Policy::load("policy.yaml")?;
//! let id = ProviderId::new("fastly")?;
//! let token = Secret::from_env("FASTLY_API_TOKEN").ok_or("FASTLY_API_TOKEN is not set")?;
//! let deployer =
//!     FastlyDeployer::from_spec(id.clone(), &policy.providers[&id], token, None, HttpSettings::default())?;
//! let plan = deployer.plan(&render_fastly(&policy.site, &policy.cache, RenderMode::Strict)?).await?;
//! println!("{plan}");
//! if std::env::args().any(|a| a == "--apply") {
//!     println!("{:?}", deployer.apply(&plan, true).await?);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ## What both renderings guarantee
//! - **Routes, first match wins.** Every route is rendered with the exclusions of the earlier
//!   routes it could overlap, so exactly one route's settings apply to a path, on both CDNs.
//!   Routes that provably cannot overlap (`^/checkout` and `^/cart`) need no exclusion.
//! - **Never-cached routes are never dropped.** A `cache: never` route that a provider cannot
//!   express is an error even in [`RenderMode::Lenient`]: caching a private page is worse than
//!   not deploying.
//! - **The identity header.** Every response carries
//!   `Server-Timing: cdn;desc="<vendor>", pop;desc="<PoP>", cache;desc="<HIT|MISS|...>"`,
//!   added (not replacing the origin's own `Server-Timing` entries) at the edge, with
//!   `Timing-Allow-Origin: https://<site.host>` (set, replacing the origin's), so the site's
//!   pages can read `Server-Timing` and the Resource Timing of the probe objects on every edge
//!   hostname, cross-origin: what `multicdn`'s `rum.js` measures with.
//! - **`stale-if-error` on every cacheable response.** Cacheable means: not on a never-cached
//!   route, a status the CDNs cache by default ([`CACHEABLE_STATUSES`]) and no `Set-Cookie`.
//!   Those responses get `Cache-Control: public, max-age=<browser TTL>,
//!   stale-while-revalidate=<swr>, stale-if-error=<sie>[, immutable]`, unless the route sets
//!   `Cache-Control` itself (an explicit route header always wins).
//! - **Nothing is dropped silently.** A feature a provider cannot express is a
//!   [`RenderWarning`]: [`WarningKind::Unsupported`] when the feature is not rendered at all
//!   (an error in [`RenderMode::Strict`]), [`WarningKind::Approximated`] when it is rendered
//!   with a documented difference (reported in both modes).
//!
//! ## Empty allowlists
//! An empty `query_allowlist` or `cookie_allowlist` leaves the query string or the cookies
//! alone: a policy without a `cache_key` section must not strip every query from every URL.
//!
//! ## Surrogate keys
//! Keys (Fastly `Surrogate-Key`) are taken from the origin only on routes with
//! `surrogate_keys_from_origin: true`; elsewhere Fastly removes `Surrogate-Key` before storing,
//! so a key purge reaches exactly what the policy says it may. Cloudflare reads tags from the
//! origin's `Cache-Tag` header and no rule can copy `Surrogate-Key` into it: the flag is
//! reported as unsupported there, and the origin has to send `Cache-Tag` itself.

pub mod path;
pub mod plan;

#[cfg(feature = "cloudflare")]
pub mod cloudflare_rules;
#[cfg(feature = "fastly")]
pub mod fastly_vcl;
pub mod shield_vcl;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use multicdn_core::policy::{CacheMode, CachePolicy, Site};
use serde::Serialize;

pub use path::{PathMatch, analyse};

/// Statuses both CDNs cache by default; policy TTLs and the browser `Cache-Control` apply to
/// these only.
pub const CACHEABLE_STATUSES: [u16; 7] = [200, 203, 300, 301, 302, 404, 410];

/// What a renderer does with a feature its provider cannot express.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RenderMode {
    /// Refuse: any [`WarningKind::Unsupported`] feature is an error.
    Strict,
    /// Render what can be rendered and report the rest as warnings.
    #[default]
    Lenient,
}

/// How far a rendering falls short of the policy on one feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WarningKind {
    /// Not rendered at all; an error in [`RenderMode::Strict`].
    Unsupported,
    /// Rendered with a documented difference; reported in every mode.
    Approximated,
}

impl fmt::Display for WarningKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WarningKind::Unsupported => "unsupported",
            WarningKind::Approximated => "approximated",
        })
    }
}

/// One policy feature a provider cannot express as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RenderWarning {
    /// The feature, as a policy path (`cache.routes[2].surrogate_keys_from_origin`) or a
    /// rendering feature (`identity.pop`).
    pub feature: String,
    /// Dropped, or rendered differently.
    pub kind: WarningKind,
    /// Why, and what the provider does instead.
    pub why: String,
}

impl fmt::Display for RenderWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.feature, self.kind, self.why)
    }
}

/// Why a policy could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// Strict mode, and some features cannot be expressed on the provider.
    #[error("{provider}: strict rendering refused, {} feature(s) cannot be expressed: {}", .unsupported.len(), .unsupported.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Strict {
        /// `fastly` or `cloudflare`.
        provider: &'static str,
        /// Every unsupported feature.
        unsupported: Vec<RenderWarning>,
    },
    /// A feature that must never be dropped cannot be expressed, in any mode.
    #[error("{provider}: {feature}: {why}")]
    Unrepresentable {
        /// `fastly` or `cloudflare`.
        provider: &'static str,
        /// The policy path.
        feature: String,
        /// Why, and what would be valid.
        why: String,
    },
}

/// Collects warnings, and turns them into the result the mode asks for.
#[derive(Debug)]
pub(crate) struct Findings {
    provider: &'static str,
    warnings: Vec<RenderWarning>,
}

impl Findings {
    pub(crate) fn new(provider: &'static str) -> Findings {
        Findings {
            provider,
            warnings: Vec::new(),
        }
    }

    pub(crate) fn unsupported(&mut self, feature: impl Into<String>, why: impl Into<String>) {
        self.push(feature.into(), WarningKind::Unsupported, why.into());
    }

    pub(crate) fn approximated(&mut self, feature: impl Into<String>, why: impl Into<String>) {
        self.push(feature.into(), WarningKind::Approximated, why.into());
    }

    fn push(&mut self, feature: String, kind: WarningKind, why: String) {
        let w = RenderWarning { feature, kind, why };
        if !self.warnings.contains(&w) {
            self.warnings.push(w);
        }
    }

    pub(crate) fn unrepresentable(
        &self,
        feature: impl Into<String>,
        why: impl Into<String>,
    ) -> RenderError {
        RenderError::Unrepresentable {
            provider: self.provider,
            feature: feature.into(),
            why: why.into(),
        }
    }

    /// The warnings, or the strict-mode error.
    pub(crate) fn finish(self, mode: RenderMode) -> Result<Vec<RenderWarning>, RenderError> {
        let unsupported: Vec<_> = self
            .warnings
            .iter()
            .filter(|w| w.kind == WarningKind::Unsupported)
            .cloned()
            .collect();
        if mode == RenderMode::Strict && !unsupported.is_empty() {
            return Err(RenderError::Strict {
                provider: self.provider,
                unsupported,
            });
        }
        Ok(self.warnings)
    }
}

/// The web origin of the site's pages, `https://<site.host>`: the `Timing-Allow-Origin` every
/// edge sends. A host that is not a DNS name (the policy loader refuses those; a policy built
/// another way may not) cannot be rendered, on any provider.
pub(crate) fn site_origin(site: &Site, findings: &Findings) -> Result<String, RenderError> {
    let host = site.host.as_str();
    let valid = !host.is_empty()
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if !valid {
        return Err(findings.unrepresentable(
            "site.host",
            format!(
                "{host:?} is not a hostname, so the pages' origin (https://<host>) cannot be sent as Timing-Allow-Origin: write the public name, like www.example.com"
            ),
        ));
    }
    Ok(format!("https://{}", host.to_ascii_lowercase()))
}

/// A route with the defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResolvedRoute {
    /// Position in `cache.routes`.
    pub(crate) index: usize,
    /// The pattern as written.
    pub(crate) pattern: String,
    /// The pattern analysed.
    pub(crate) path: PathMatch,
    /// `cache: never`.
    pub(crate) never: bool,
    /// Edge TTL, whole seconds.
    pub(crate) ttl_edge: u64,
    /// Browser TTL, whole seconds.
    pub(crate) ttl_browser: u64,
    /// Headers to set, by name as written.
    pub(crate) headers: BTreeMap<String, String>,
    /// Take `Surrogate-Key` from the origin.
    pub(crate) surrogate_keys_from_origin: bool,
    /// `immutable`.
    pub(crate) immutable: bool,
}

impl ResolvedRoute {
    /// The policy path of this route (`cache.routes[2]`).
    pub(crate) fn at(&self) -> String {
        format!("cache.routes[{}]", self.index)
    }

    /// Whether the route sets `Cache-Control` itself.
    pub(crate) fn sets_cache_control(&self) -> bool {
        self.headers
            .keys()
            .any(|k| k.eq_ignore_ascii_case("cache-control"))
    }
}

/// The policy's numbers in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Defaults {
    pub(crate) ttl_edge: u64,
    pub(crate) ttl_browser: u64,
    pub(crate) swr: u64,
    pub(crate) sie: u64,
}

/// Whole seconds of `d`; a fraction is rounded down and reported.
pub(crate) fn whole_seconds(d: Duration, feature: &str, findings: &mut Findings) -> u64 {
    if d.subsec_nanos() != 0 {
        findings.approximated(
            feature,
            format!(
                "{d:?} is rounded down to {}s: both CDNs take TTLs in whole seconds",
                d.as_secs()
            ),
        );
    }
    d.as_secs()
}

pub(crate) fn resolve(
    cache: &CachePolicy,
    findings: &mut Findings,
) -> (Defaults, Vec<ResolvedRoute>) {
    let d = &cache.defaults;
    let defaults = Defaults {
        ttl_edge: whole_seconds(d.ttl_edge.get(), "cache.defaults.ttl_edge", findings),
        ttl_browser: whole_seconds(d.ttl_browser.get(), "cache.defaults.ttl_browser", findings),
        swr: whole_seconds(
            d.stale_while_revalidate.get(),
            "cache.defaults.stale_while_revalidate",
            findings,
        ),
        sie: whole_seconds(
            d.stale_if_error.get(),
            "cache.defaults.stale_if_error",
            findings,
        ),
    };
    let routes = cache
        .routes
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let at = format!("cache.routes[{index}]");
            ResolvedRoute {
                index,
                pattern: r.pattern.clone(),
                path: analyse(&r.pattern),
                never: r.cache == CacheMode::Never,
                ttl_edge: r.ttl_edge.map_or(defaults.ttl_edge, |t| {
                    whole_seconds(t.get(), &format!("{at}.ttl_edge"), findings)
                }),
                ttl_browser: r.ttl_browser.map_or(defaults.ttl_browser, |t| {
                    whole_seconds(t.get(), &format!("{at}.ttl_browser"), findings)
                }),
                headers: r.headers.clone(),
                surrogate_keys_from_origin: r.surrogate_keys_from_origin,
                immutable: r.immutable,
            }
        })
        .collect();
    (defaults, routes)
}

/// The earlier routes that could also match what route `i` matches: route `i` applies only
/// where none of them does.
pub(crate) fn exclusions(routes: &[ResolvedRoute], i: usize) -> Vec<&ResolvedRoute> {
    let Some(me) = routes.get(i) else {
        return Vec::new();
    };
    routes[..i]
        .iter()
        .filter(|earlier| !earlier.path.disjoint(&me.path))
        .collect()
}

/// The browser `Cache-Control` of a cacheable response.
pub(crate) fn cache_control(ttl_browser: u64, defaults: &Defaults, immutable: bool) -> String {
    let mut v = format!("public, max-age={ttl_browser}");
    if defaults.swr > 0 {
        v.push_str(&format!(", stale-while-revalidate={}", defaults.swr));
    }
    if defaults.sie > 0 {
        v.push_str(&format!(", stale-if-error={}", defaults.sie));
    }
    if immutable {
        v.push_str(", immutable");
    }
    v
}

/// An HTTP token (RFC 9110): header and cookie names.
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Letters, digits, `-` and `_`: a name VCL can address and a regex can hold unescaped.
pub(crate) fn is_vcl_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `s` as a VCL string literal: a short string when it has no `"` or `%`, a long string
/// (`{"..."}`) otherwise; `None` when neither can hold it.
pub fn vcl_string(s: &str) -> Option<String> {
    if s.chars().any(char::is_control) {
        return None;
    }
    if !s.contains(['"', '%']) {
        return Some(format!("\"{s}\""));
    }
    if s.contains("\"}") {
        return None;
    }
    Some(format!("{{\"{s}\"}}"))
}

/// Every route's pattern as a VCL string literal. Every pattern must be writable: a route
/// cannot be left out (first match wins, and a never-cached route must never be dropped).
pub(crate) fn route_patterns(
    routes: &[ResolvedRoute],
    findings: &Findings,
) -> Result<Vec<String>, RenderError> {
    routes
        .iter()
        .map(|r| {
            vcl_string(&r.pattern).ok_or_else(|| {
                findings.unrepresentable(
                    format!("{}.match", r.at()),
                    format!(
                        "{:?} cannot be written as a VCL string (it contains `\"}}` or a control character)",
                        r.pattern
                    ),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_control_carries_stale_if_error_and_immutable() {
        let d = Defaults {
            ttl_edge: 3600,
            ttl_browser: 60,
            swr: 86_400,
            sie: 604_800,
        };
        assert_eq!(
            cache_control(60, &d, false),
            "public, max-age=60, stale-while-revalidate=86400, stale-if-error=604800"
        );
        assert!(cache_control(31_536_000, &d, true).ends_with("stale-if-error=604800, immutable"));
    }

    #[test]
    fn strict_mode_refuses_unsupported_but_keeps_approximations() {
        let mut f = Findings::new("cloudflare");
        f.approximated("identity.pop", "no field");
        let strict = Findings {
            provider: "cloudflare",
            warnings: f.warnings.clone(),
        };
        assert_eq!(strict.finish(RenderMode::Strict).unwrap().len(), 1);
        f.unsupported("cache.routes[2].surrogate_keys_from_origin", "Cache-Tag");
        let err = f.finish(RenderMode::Strict).unwrap_err();
        assert!(
            err.to_string()
                .contains("cache.routes[2].surrogate_keys_from_origin"),
            "{err}"
        );
    }

    #[test]
    fn fractional_ttls_are_rounded_down_and_reported() {
        let mut f = Findings::new("fastly");
        assert_eq!(whole_seconds(Duration::from_millis(1500), "x", &mut f), 1);
        assert_eq!(f.warnings.len(), 1);
    }
}
