//! Cloudflare: the cache policy as two zone entry-point rulesets.
//!
//! - `http_request_cache_settings` (action `set_cache_settings`): first
//!   `multicdn-cache-defaults` on every request (`true`: eligible for cache, edge and browser
//!   TTL overriding the origin, serve stale while updating, the custom cache key on Enterprise),
//!   then one `multicdn-cache-route-N` per route, with the exclusions that make the first
//!   matching route win (Cloudflare merges every matching rule, later ones overriding), and
//!   below Enterprise `multicdn-cache-cookie-bypass` last.
//! - `http_response_headers_transform` (action `rewrite`): `multicdn-identity` adds the
//!   `Server-Timing` identity entry and sets `Timing-Allow-Origin: https://<site.host>`; `multicdn-cache-control-route-N` and
//!   `multicdn-cache-control-defaults` set the browser `Cache-Control` (with `stale-if-error`) on
//!   cacheable responses; `multicdn-headers-route-N` sets each route's own headers.
//!
//! Route patterns are translated to `starts_with`, `ends_with`, `eq` and `contains` where that
//! is exact ([`super::path`]); any other pattern needs `matches`, which Cloudflare offers on the
//! Business and Enterprise plans only. On Free and Pro such a route is unsupported (left out, or
//! an error in strict mode), and a never-cached one is an error in every mode.
//!
//! Plans (Cloudflare's plan table): custom cache keys — a query-string list, cookies — are
//! Enterprise-only. Below Enterprise, the query allowlist is unsupported (the whole query string
//! stays in the key: more misses, never wrong content) and the cookie allowlist is rendered as
//! `multicdn-cache-cookie-bypass`, the last cache rule: a request carrying one of the cookies is
//! not cached, so a page rendered for one visitor's cookies never reaches another. The number of
//! cache rules is checked against the plan's allowance.
//!
//! An edge TTL under the plan's minimum ([`CloudflareTarget::min_edge_ttl`]) is rendered as
//! written and reported. A browser TTL under the plan's minimum
//! ([`CloudflareTarget::min_browser_ttl`]: a cache rule with a shorter `browser_ttl` override
//! is refused or clamped) is adjusted: the cache rule leaves the browser TTL to the origin
//! (`respect_origin`) and the browser `Cache-Control` response-header rule sets the policy's
//! `max-age`; the adjustment is reported.
//!
//! Field names used: `http.request.uri.path`, `http.response.code`,
//! `http.response.headers`, `http.response.headers.names` (documented response fields).
//! Reading `cf-cache-status` through `http.response.headers["cf-cache-status"][0]` in the
//! response-header phase is the vendor-community technique and is *unverified* against
//! Cloudflare's reference; the rules language exposes no PoP (colo) field, so the identity entry
//! carries no `pop` on Cloudflare (reported as `identity.pop`; the PoP stays readable from
//! `cf-ray`).

use multicdn_core::policy::{CachePolicy, CloudflarePlan, ProviderSpec, Site};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::plan::PlanItem;
use super::{
    CACHEABLE_STATUSES, Findings, PathMatch, RenderError, RenderMode, RenderWarning, ResolvedRoute,
    cache_control, exclusions, is_token, resolve, site_origin,
};

/// The cache settings phase.
pub const CACHE_PHASE: &str = "http_request_cache_settings";
/// The response header transform phase.
pub const HEADERS_PHASE: &str = "http_response_headers_transform";
/// Every rule the renderer owns has a `ref` starting with this.
pub const RULE_PREFIX: &str = "multicdn-";

/// One rule of an entry-point ruleset, in the API's shape (without the ids Cloudflare assigns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// A stable reference, unique in the ruleset (`multicdn-cache-route-0`).
    #[serde(rename = "ref")]
    pub reference: String,
    /// What the rule is for, naming the policy field.
    pub description: String,
    /// The filter expression.
    pub expression: String,
    /// `set_cache_settings` or `rewrite`.
    pub action: String,
    /// The action's parameters.
    pub action_parameters: Value,
    /// Whether the rule is on.
    pub enabled: bool,
}

/// An entry-point ruleset: its phase and its rules in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ruleset {
    /// The phase (`http_request_cache_settings`).
    pub phase: String,
    /// The rules, in evaluation order.
    pub rules: Vec<Rule>,
}

impl Ruleset {
    /// The rule with `reference`.
    pub fn rule(&self, reference: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.reference == reference)
    }
}

/// What the renderer needs to know about the zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CloudflareTarget {
    /// The zone's plan: regular expressions (`matches`) need Business or Enterprise.
    pub plan: CloudflarePlan,
}

impl CloudflareTarget {
    /// A target on `plan`.
    pub fn new(plan: CloudflarePlan) -> CloudflareTarget {
        CloudflareTarget { plan }
    }

    /// The target a policy's provider entry describes (Pro when no plan is given).
    pub fn from_spec(spec: &ProviderSpec) -> CloudflareTarget {
        CloudflareTarget {
            plan: spec.plan.unwrap_or_default(),
        }
    }

    /// The shortest edge TTL the plan allows, in seconds (Free 2 h, Pro 1 h, Business and
    /// Enterprise 1 s, from Cloudflare's plan table). A shorter TTL is rendered as written and
    /// reported, so Cloudflare's own answer decides, never a silent change.
    pub fn min_edge_ttl(&self) -> u64 {
        match self.plan {
            CloudflarePlan::Free => 7200,
            CloudflarePlan::Pro => 3600,
            CloudflarePlan::Business | CloudflarePlan::Enterprise => 1,
        }
    }

    /// The shortest browser TTL a cache rule may set on the plan, in seconds (Free 2 h, Pro
    /// 1 h, Business and Enterprise 1 s, from Cloudflare's cache-rules settings). A shorter
    /// `browser_ttl` override is refused or clamped, so the rendering leaves the browser TTL to
    /// the `Cache-Control` response-header rule instead and reports it.
    pub fn min_browser_ttl(&self) -> u64 {
        match self.plan {
            CloudflarePlan::Free => 7200,
            CloudflarePlan::Pro => 3600,
            CloudflarePlan::Business | CloudflarePlan::Enterprise => 1,
        }
    }

    /// How many cache rules the plan allows (Free 10, Pro 25, Business 50, Enterprise 300).
    pub fn max_cache_rules(&self) -> usize {
        match self.plan {
            CloudflarePlan::Free => 10,
            CloudflarePlan::Pro => 25,
            CloudflarePlan::Business => 50,
            CloudflarePlan::Enterprise => 300,
        }
    }

    /// Custom cache keys (query-string lists, cookies, headers) are Enterprise-only.
    pub fn has_custom_cache_key(&self) -> bool {
        self.plan == CloudflarePlan::Enterprise
    }

    fn has_regex(&self) -> bool {
        matches!(
            self.plan,
            CloudflarePlan::Business | CloudflarePlan::Enterprise
        )
    }
}

/// The policy rendered for Cloudflare.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudflareRendering {
    /// The `http_request_cache_settings` entry-point rules.
    pub cache_rules: Ruleset,
    /// The `http_response_headers_transform` entry-point rules.
    pub header_rules: Ruleset,
    /// What could not be expressed as written.
    pub warnings: Vec<RenderWarning>,
}

impl CloudflareRendering {
    /// Both rulesets and the warnings as pretty JSON with a stable key order (the golden
    /// file's format), ending in a newline.
    pub fn to_json_file(&self) -> String {
        let doc = json!({
            "cache_rules": self.cache_rules,
            "header_rules": self.header_rules,
            "warnings": self.warnings,
        });
        let mut s = serde_json::to_string_pretty(&sorted(doc)).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The two rulesets.
    pub fn rulesets(&self) -> [&Ruleset; 2] {
        [&self.cache_rules, &self.header_rules]
    }
}

impl PlanItem for Rule {
    fn summary(&self) -> String {
        format!(
            "{}: {} when {}",
            self.action, self.description, self.expression
        )
    }

    fn differences(&self, deployed: &Rule) -> Vec<String> {
        let mut out = Vec::new();
        let mut field = |name: &str, old: String, new: String| {
            if old != new {
                out.push(format!("{name}: {old} -> {new}"));
            }
        };
        field(
            "description",
            deployed.description.clone(),
            self.description.clone(),
        );
        field(
            "expression",
            deployed.expression.clone(),
            self.expression.clone(),
        );
        field("action", deployed.action.clone(), self.action.clone());
        field(
            "action_parameters",
            deployed.action_parameters.to_string(),
            self.action_parameters.to_string(),
        );
        field(
            "enabled",
            deployed.enabled.to_string(),
            self.enabled.to_string(),
        );
        out
    }
}

/// `v` with every object's keys in sorted order, whichever map type serde_json was built with.
pub(crate) fn sorted(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

const PATH: &str = "http.request.uri.path";

/// A Rules-language string literal.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn atom_expression(atom: &PathMatch) -> String {
    match atom {
        PathMatch::Prefix(p) => format!("starts_with({PATH}, {})", quoted(p)),
        PathMatch::Suffix(s) => format!("ends_with({PATH}, {})", quoted(s)),
        PathMatch::Exact(e) => format!("{PATH} eq {}", quoted(e)),
        PathMatch::Contains(c) => format!("{PATH} contains {}", quoted(c)),
        PathMatch::Regex(r) => format!("{PATH} matches {}", quoted(r)),
        PathMatch::AnyOf(all) => all
            .iter()
            .map(atom_expression)
            .collect::<Vec<_>>()
            .join(" or "),
    }
}

/// Renders the cache policy as Cloudflare rulesets, for the site whose pages may read the
/// edge's timings (`Timing-Allow-Origin: https://<site.host>`).
pub fn render_cloudflare(
    site: &Site,
    cache: &CachePolicy,
    target: CloudflareTarget,
    mode: RenderMode,
) -> Result<CloudflareRendering, RenderError> {
    let mut findings = Findings::new("cloudflare");
    let origin = site_origin(site, &findings)?;
    let (defaults, routes) = resolve(cache, &mut findings);

    // Which routes Cloudflare can match at all.
    let mut matchable = Vec::with_capacity(routes.len());
    for r in &routes {
        let ok = !r.path.is_regex() || target.has_regex();
        if !ok {
            let why = format!(
                "{:?} needs a regular expression (`matches`), which Cloudflare offers on Business and Enterprise only, and the zone is on {:?}; rewrite it as prefixes (^/x), suffixes (\\.ext$) or exact paths, alternated with |",
                r.pattern, target.plan
            );
            if r.never {
                return Err(findings.unrepresentable(format!("{}.match", r.at()), why));
            }
            findings.unsupported(
                format!("{}.match", r.at()),
                format!("{why}; the route is left out"),
            );
        }
        matchable.push(ok);
    }
    let condition = |i: usize| -> String {
        let mut parts = vec![format!("({})", atom_expression(&routes[i].path))];
        for earlier in exclusions(&routes, i) {
            if matchable[earlier.index] {
                parts.push(format!("not ({})", atom_expression(&earlier.path)));
            }
        }
        parts.join(" and ")
    };

    let key = &cache.cache_key;
    let custom_keys = target.has_custom_cache_key();
    if !key.query_allowlist.is_empty() {
        if custom_keys {
            findings.approximated(
                "cache.cache_key.query_allowlist",
                "Cloudflare keys the cache on the allowlisted parameters but still forwards the whole query string to the origin (Fastly strips the others): the origin must not vary on other parameters",
            );
        } else {
            findings.unsupported(
                "cache.cache_key.query_allowlist",
                format!(
                    "a custom cache key with a query-string list ({}) is Enterprise-only on Cloudflare and the zone is on {:?}: the whole query string stays in the key (more misses, same content)",
                    key.query_allowlist.join(", "),
                    target.plan
                ),
            );
        }
    }
    if !key.cookie_allowlist.is_empty() && !custom_keys {
        findings.approximated(
            "cache.cache_key.cookie_allowlist",
            format!(
                "a custom cache key with cookies is Enterprise-only on Cloudflare and the zone is on {:?}: requests carrying {} are not cached (multicdn-cache-cookie-bypass), so no visitor gets a page rendered for another's cookies",
                target.plan,
                key.cookie_allowlist.join(" or ")
            ),
        );
    }
    if !key.normalise_accept_encoding {
        findings.approximated(
            "cache.cache_key.normalise_accept_encoding",
            "Cloudflare always normalises Accept-Encoding itself and cannot be told not to",
        );
    }
    if defaults.swr > 0 {
        findings.approximated(
            "cache.defaults.stale_while_revalidate",
            format!(
                "Cloudflare serves stale while updating (serve_stale) without a time limit a rule can set; the {}s window reaches browsers through Cache-Control",
                defaults.swr
            ),
        );
    }
    if defaults.sie > 0 {
        findings.approximated(
            "cache.defaults.stale_if_error",
            format!(
                "Cloudflare's edge takes stale-if-error from the origin's Cache-Control only, a rule cannot set it; stale-if-error={} is set on every cacheable response to browsers, and the origin should send it too for the edge to honour it",
                defaults.sie
            ),
        );
    }
    findings.approximated(
        "identity.pop",
        "the Cloudflare rules language exposes no PoP (colo) field, so Server-Timing carries cdn and cache only; the PoP is in cf-ray",
    );

    // Cache settings.
    let mut check_edge_ttl = |feature: String, ttl: u64| {
        if ttl < target.min_edge_ttl() {
            findings.approximated(
                feature,
                format!(
                    "{ttl}s is below the {}s edge TTL Cloudflare's {:?} plan allows; Cloudflare may refuse the rule or cache longer",
                    target.min_edge_ttl(),
                    target.plan
                ),
            );
        }
    };
    check_edge_ttl("cache.defaults.ttl_edge".into(), defaults.ttl_edge);
    for r in routes
        .iter()
        .filter(|r| !r.never && r.ttl_edge != defaults.ttl_edge)
    {
        check_edge_ttl(format!("{}.ttl_edge", r.at()), r.ttl_edge);
    }
    // A browser TTL under the plan's minimum: the cache rule respects the origin and the
    // Cache-Control response-header rule (below) carries the policy's max-age.
    let min_browser = target.min_browser_ttl();
    let mut browser_ttl = |feature: String, ttl: u64| {
        if ttl < min_browser {
            findings.approximated(
                feature,
                format!(
                    "{ttl}s is below the {min_browser}s browser TTL a cache rule may set on Cloudflare's {:?} plan; the cache rule leaves the browser TTL to the origin and the Cache-Control response rule sets max-age={ttl}",
                    target.plan
                ),
            );
            json!({"mode": "respect_origin"})
        } else {
            json!({"mode": "override_origin", "default": ttl})
        }
    };
    let defaults_browser = browser_ttl("cache.defaults.ttl_browser".into(), defaults.ttl_browser);
    let route_browser: Vec<Value> = routes
        .iter()
        .map(|r| {
            if r.never || !matchable[r.index] {
                Value::Null
            } else if r.ttl_browser == defaults.ttl_browser {
                defaults_browser.clone()
            } else {
                browser_ttl(format!("{}.ttl_browser", r.at()), r.ttl_browser)
            }
        })
        .collect();
    let mut cache_params = json!({
        "cache": true,
        "edge_ttl": {"mode": "override_origin", "default": defaults.ttl_edge},
        "browser_ttl": defaults_browser,
        "serve_stale": {"disable_stale_while_updating": defaults.swr == 0},
    });
    let mut custom_key = serde_json::Map::new();
    if !key.query_allowlist.is_empty() && custom_keys {
        custom_key.insert(
            "query_string".into(),
            json!({"include": {"list": key.query_allowlist}}),
        );
    }
    if !key.cookie_allowlist.is_empty() && custom_keys {
        custom_key.insert("cookie".into(), json!({"include": key.cookie_allowlist}));
    }
    if !custom_key.is_empty() {
        cache_params["cache_key"] = json!({"custom_key": custom_key});
    }
    let mut cache_rules = vec![Rule {
        reference: "multicdn-cache-defaults".into(),
        description: "cache.defaults and cache.cache_key: every request".into(),
        expression: "true".into(),
        action: "set_cache_settings".into(),
        action_parameters: cache_params,
        enabled: true,
    }];
    for r in routes.iter().filter(|r| matchable[r.index]) {
        if r.surrogate_keys_from_origin {
            findings.unsupported(
                format!("{}.surrogate_keys_from_origin", r.at()),
                "Cloudflare reads purge tags from the origin's Cache-Tag header, not Surrogate-Key, and no rule can copy one into the other before caching: have the origin send Cache-Tag with the same keys",
            );
        }
        let params = if r.never {
            json!({"cache": false})
        } else {
            json!({
                "cache": true,
                "edge_ttl": {"mode": "override_origin", "default": r.ttl_edge},
                "browser_ttl": route_browser.get(r.index).cloned().unwrap_or(Value::Null),
            })
        };
        cache_rules.push(Rule {
            reference: format!("multicdn-cache-route-{}", r.index),
            description: route_description(r),
            expression: condition(r.index),
            action: "set_cache_settings".into(),
            action_parameters: params,
            enabled: true,
        });
    }
    if !key.cookie_allowlist.is_empty() && !custom_keys {
        // Last, so that it overrides every route's `cache: true`.
        let any_cookie = key
            .cookie_allowlist
            .iter()
            .map(|c| format!("http.cookie contains {}", quoted(&format!("{c}="))))
            .collect::<Vec<_>>()
            .join(" or ");
        cache_rules.push(Rule {
            reference: "multicdn-cache-cookie-bypass".into(),
            description: "cache.cache_key.cookie_allowlist: requests carrying a cookie that varies the page are not cached (custom cache keys need Enterprise)".into(),
            expression: format!("({any_cookie})"),
            action: "set_cache_settings".into(),
            action_parameters: json!({"cache": false}),
            enabled: true,
        });
    }
    if cache_rules.len() > target.max_cache_rules() {
        findings.unsupported(
            "cache.routes",
            format!(
                "{} cache rules are needed and Cloudflare's {:?} plan allows {}: Cloudflare will refuse the ruleset",
                cache_rules.len(),
                target.plan,
                target.max_cache_rules()
            ),
        );
    }

    // Response headers.
    let identity = format!(
        "concat({}, http.response.headers[\"cf-cache-status\"][0], {})",
        quoted("cdn;desc=\"cloudflare\", cache;desc=\""),
        quoted("\"")
    );
    let mut header_rules = vec![Rule {
        reference: "multicdn-identity".into(),
        description: "identity: Server-Timing cdn and cache (seed 000 section 14), readable by the site's pages (Timing-Allow-Origin)".into(),
        expression: "true".into(),
        action: "rewrite".into(),
        action_parameters: json!({"headers": {
            "Server-Timing": {"operation": "add", "expression": identity},
            "Timing-Allow-Origin": {"operation": "set", "value": origin},
        }}),
        enabled: true,
    }, Rule {
        reference: "multicdn-cmsd-expose".into(),
        description: "quality caps: a CMSD-Dynamic set upstream (the shield's or the origin's CMSD layer) readable cross-origin by the players".into(),
        expression: "any(lower(http.response.headers.names[*])[*] == \"cmsd-dynamic\")".into(),
        action: "rewrite".into(),
        action_parameters: json!({"headers": {
            "Access-Control-Expose-Headers": {"operation": "add", "value": "CMSD-Dynamic"},
        }}),
        enabled: true,
    }];
    let statuses: Vec<String> = CACHEABLE_STATUSES.iter().map(u16::to_string).collect();
    let cacheable = format!(
        "http.response.code in {{{}}} and not any(lower(http.response.headers.names[*])[*] == \"set-cookie\")",
        statuses.join(" ")
    );
    for r in routes.iter().filter(|r| matchable[r.index] && !r.never) {
        if r.sets_cache_control() {
            continue;
        }
        header_rules.push(set_headers_rule(
            format!("multicdn-cache-control-route-{}", r.index),
            format!(
                "{} match {}: browser Cache-Control with stale-if-error",
                r.at(),
                r.pattern
            ),
            format!("{} and {cacheable}", condition(r.index)),
            [(
                "Cache-Control".to_owned(),
                cache_control(r.ttl_browser, &defaults, r.immutable),
            )],
        ));
    }
    let mut outside_routes: Vec<String> = routes
        .iter()
        .filter(|r| matchable[r.index])
        .map(|r| format!("not ({})", atom_expression(&r.path)))
        .collect();
    outside_routes.push(cacheable);
    header_rules.push(set_headers_rule(
        "multicdn-cache-control-defaults".into(),
        "cache.defaults: browser Cache-Control with stale-if-error outside every route".into(),
        outside_routes.join(" and "),
        [(
            "Cache-Control".to_owned(),
            cache_control(defaults.ttl_browser, &defaults, false),
        )],
    ));
    for r in routes
        .iter()
        .filter(|r| matchable[r.index] && !r.headers.is_empty())
    {
        let mut headers = Vec::new();
        for (name, value) in &r.headers {
            if is_token(name) && !value.chars().any(char::is_control) {
                headers.push((name.clone(), value.clone()));
            } else {
                findings.unsupported(
                    format!("{}.headers.{name}", r.at()),
                    "not a valid header name and value (a token, and a value without control characters)",
                );
            }
        }
        if headers.is_empty() {
            continue;
        }
        header_rules.push(set_headers_rule(
            format!("multicdn-headers-route-{}", r.index),
            format!("{}.headers, match {}", r.at(), r.pattern),
            condition(r.index),
            headers,
        ));
    }

    let warnings = findings.finish(mode)?;
    Ok(CloudflareRendering {
        cache_rules: Ruleset {
            phase: CACHE_PHASE.into(),
            rules: cache_rules,
        },
        header_rules: Ruleset {
            phase: HEADERS_PHASE.into(),
            rules: header_rules,
        },
        warnings,
    })
}

fn route_description(r: &ResolvedRoute) -> String {
    let what = if r.never { "never cached" } else { "cached" };
    format!("{} match {}: {what}", r.at(), r.pattern)
}

fn set_headers_rule(
    reference: String,
    description: String,
    expression: String,
    headers: impl IntoIterator<Item = (String, String)>,
) -> Rule {
    let headers: serde_json::Map<String, Value> = headers
        .into_iter()
        .map(|(k, v)| (k, json!({"operation": "set", "value": v})))
        .collect();
    Rule {
        reference,
        description,
        expression,
        action: "rewrite".into(),
        action_parameters: json!({ "headers": headers }),
        enabled: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_escape_quotes_and_backslashes() {
        assert_eq!(quoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn atoms_render_as_functions_and_regexes_as_matches() {
        assert_eq!(
            atom_expression(&super::super::analyse("^/customer|^/cart")),
            "starts_with(http.request.uri.path, \"/customer\") or starts_with(http.request.uri.path, \"/cart\")"
        );
        assert_eq!(
            atom_expression(&super::super::analyse("^/p/[0-9]+$")),
            "http.request.uri.path matches \"^/p/[0-9]+$\""
        );
    }
}
