//! The checks that run once after parsing. Each returns the field's path and a message that
//! says what would be valid.

use std::collections::BTreeMap;

use regex::Regex;

use super::{Dur, Fallback, Policy, ProviderSpec, Share, ShieldSpec};
use crate::id::CohortId;
use crate::id::ProviderId;
use crate::network::NetworkKey;
use crate::traits::ProviderKind;
use crate::weights::TOTAL_BP;

type Problems = Vec<(String, String)>;

pub(super) fn validate(policy: &Policy) -> Problems {
    let mut problems = Vec::new();
    site(policy, &mut problems);
    providers(policy, &mut problems);
    cache(policy, &mut problems);
    health(policy, &mut problems);
    steering(policy, &mut problems);
    shield(policy, &mut problems);
    durations(policy, &mut problems);
    problems
}

/// The longest cache TTL: Cloudflare's edge and browser TTLs go up to a year (and Fastly's
/// `beresp.ttl` and `max-age` take anything that long).
pub(crate) const MAX_CACHE_TTL_SECS: u64 = 31_536_000;
/// The longest DNS TTL Route 53 and NS1 accept (RFC 2181: 2^31 - 1 seconds).
pub(crate) const MAX_DNS_TTL_SECS: u64 = 2_147_483_647;
/// The longest of the controller's own periods (health rounds, failover steps, RUM windows):
/// thirty days.
pub(crate) const MAX_PERIOD_SECS: u64 = 30 * 86_400;
/// The longest probe deadline: a minute.
pub(crate) const MAX_TIMEOUT_SECS: u64 = 60;

fn at_most(out: &mut Problems, at: String, d: Dur, max_secs: u64, why: &str) {
    if d.get() > std::time::Duration::from_secs(max_secs) {
        out.push((
            at,
            format!(
                "{} s is above {max_secs} s, the most {why}",
                d.get().as_secs()
            ),
        ));
    }
}

/// Every duration, bounded by what the vendors (or the controller) accept.
fn durations(policy: &Policy, out: &mut Problems) {
    let cache_ttl = "a cache TTL may be (a year: Cloudflare's longest edge and browser TTL)";
    let d = &policy.cache.defaults;
    for (field, v) in [
        ("ttl_edge", d.ttl_edge),
        ("ttl_browser", d.ttl_browser),
        ("stale_while_revalidate", d.stale_while_revalidate),
        ("stale_if_error", d.stale_if_error),
    ] {
        at_most(
            out,
            format!("cache.defaults.{field}"),
            v,
            MAX_CACHE_TTL_SECS,
            cache_ttl,
        );
    }
    for (i, r) in policy.cache.routes.iter().enumerate() {
        for (field, v) in [("ttl_edge", r.ttl_edge), ("ttl_browser", r.ttl_browser)] {
            if let Some(v) = v {
                at_most(
                    out,
                    format!("cache.routes[{i}].{field}"),
                    v,
                    MAX_CACHE_TTL_SECS,
                    cache_ttl,
                );
            }
        }
    }
    let h = &policy.health;
    let period = "the controller takes (30 days)";
    at_most(
        out,
        "health.interval".into(),
        h.interval,
        MAX_PERIOD_SECS,
        period,
    );
    at_most(
        out,
        "health.timeout".into(),
        h.timeout,
        MAX_TIMEOUT_SECS,
        "a probe may wait (a minute)",
    );
    if let Some(f) = h.fresh_for {
        at_most(out, "health.fresh_for".into(), f, MAX_PERIOD_SECS, period);
    }
    let s = &policy.steering;
    at_most(
        out,
        "steering.ttl".into(),
        s.ttl,
        MAX_DNS_TTL_SECS,
        "a DNS TTL may be (Route 53's and NS1's limit, RFC 2181)",
    );
    at_most(
        out,
        "steering.failover.interval".into(),
        s.failover.interval,
        MAX_PERIOD_SECS,
        period,
    );
    for (field, v) in [
        ("window", s.rum.window),
        ("absolute_gap", s.rum.absolute_gap),
        ("settle", s.rum.settle),
    ] {
        at_most(
            out,
            format!("steering.rum.{field}"),
            v,
            MAX_PERIOD_SECS,
            period,
        );
    }
    if let Some(max) = s.rum.max_window {
        at_most(
            out,
            "steering.rum.max_window".into(),
            max,
            MAX_PERIOD_SECS,
            period,
        );
    }
    at_most(
        out,
        "steering.guardrails.stale_after".into(),
        s.guardrails.stale_after,
        MAX_PERIOD_SECS,
        period,
    );
}

/// RFC 9110 `token`: what a header (field) name is.
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A field value RFC 9110 allows: visible characters, spaces and tabs, no CR, LF or other
/// control character.
pub(crate) fn is_field_value(s: &str) -> bool {
    !s.chars().any(|c| c.is_control() && c != '\t')
}

/// A DNS hostname: dot-separated labels of letters, digits and `-` (and `_`, used by service
/// labels), each 1 to 63 long, 253 in all, an optional final dot.
pub(crate) fn is_hostname(s: &str) -> bool {
    let name = s.strip_suffix('.').unwrap_or(s);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            (1..=63).contains(&l.len())
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// A policy string every renderer may quote: no control character at all.
fn printable(out: &mut Problems, at: String, s: &str) {
    if s.chars().any(char::is_control) {
        out.push((
            at,
            format!("{s:?} contains a control character (a line break, a tab, ...); remove it"),
        ));
    }
}

fn site(policy: &Policy, out: &mut Problems) {
    if !is_hostname(&policy.site.host) {
        out.push((
            "site.host".into(),
            format!(
                "{:?} is not a hostname: write the public name, like www.example.com",
                policy.site.host
            ),
        ));
    }
}

fn known_list(policy: &Policy) -> String {
    policy
        .providers
        .keys()
        .map(ProviderId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A provider's video hosts: hostnames, each once, and clone ids (`<id>-2`, ...) that are valid
/// pathway ids and name no other provider.
fn video_hosts(
    policy: &Policy,
    id: &ProviderId,
    spec: &ProviderSpec,
    at: &str,
    out: &mut Problems,
) {
    let mut seen = std::collections::BTreeSet::new();
    for (i, host) in spec.video_hosts.iter().enumerate() {
        let field = format!("{at}.video_hosts[{i}]");
        if !is_hostname(host) {
            out.push((
                field,
                format!("{host:?} is not a hostname: write the host players fetch video from, like video.example.com.global.prod.fastly.net"),
            ));
        } else if !seen.insert(host.to_ascii_lowercase()) {
            out.push((field, format!("{host:?} is listed twice")));
        }
    }
    for (i, (clone, _)) in spec.video_pathways(id).iter().enumerate() {
        let field = format!("{at}.video_hosts[{}]", i + 1);
        if clone.len() > 64 {
            out.push((
                field,
                format!(
                    "its pathway id {clone:?} is longer than 64 characters: shorten the provider id"
                ),
            ));
        } else if policy.providers.keys().any(|p| p.as_str() == clone) {
            out.push((
                field,
                format!("its pathway id {clone:?} is also a provider's id: rename that provider"),
            ));
        }
    }
}

fn providers(policy: &Policy, out: &mut Problems) {
    if policy.providers.is_empty() {
        out.push((
            "providers".into(),
            "no provider is defined: name at least one, like `fastly: {kind: fastly, edge_host: ..., service_id: ...}`".into(),
        ));
    }
    for (id, spec) in &policy.providers {
        let at = format!("providers.{id}");
        if !is_hostname(&spec.edge_host) {
            out.push((
                format!("{at}.edge_host"),
                format!(
                    "{:?} is not a hostname: write the edge's name, like example.map.fastly.net",
                    spec.edge_host
                ),
            ));
        }
        video_hosts(policy, id, spec, &at, out);
        match spec.kind {
            ProviderKind::Fastly if spec.service_id.as_deref().is_none_or(str::is_empty) => out.push((
                at.clone(),
                "a fastly provider needs `service_id` (the service the purges and configuration go to)".into(),
            )),
            ProviderKind::Cloudflare if spec.zone_id.as_deref().is_none_or(str::is_empty) => out.push((
                at.clone(),
                "a cloudflare provider needs `zone_id` (the zone the purges and rules go to)".into(),
            )),
            ProviderKind::Akamai => akamai(&at, spec, out),
            _ => {}
        }
        for (field, v) in [
            ("service_id", &spec.service_id),
            ("zone_id", &spec.zone_id),
            ("token_env", &spec.token_env),
            ("client_token_env", &spec.client_token_env),
            ("client_secret_env", &spec.client_secret_env),
            ("access_token_env", &spec.access_token_env),
        ] {
            if let Some(v) = v
                && !v
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                out.push((
                    format!("{at}.{field}"),
                    format!("{v:?} may hold letters, digits, _ and - only"),
                ));
            }
        }
        if spec.plan.is_some() && spec.kind != ProviderKind::Cloudflare {
            out.push((
                format!("{at}.plan"),
                "`plan` applies to cloudflare providers only".into(),
            ));
        }
        if spec.kind != ProviderKind::Akamai {
            let akamai_only = [
                ("api_host", spec.api_host.is_some()),
                ("network", spec.network.is_some()),
                ("cp_codes", !spec.cp_codes.is_empty()),
                ("client_token_env", spec.client_token_env.is_some()),
                ("client_secret_env", spec.client_secret_env.is_some()),
                ("access_token_env", spec.access_token_env.is_some()),
            ];
            for (field, _) in akamai_only.into_iter().filter(|(_, set)| *set) {
                out.push((
                    format!("{at}.{field}"),
                    format!("`{field}` applies to akamai providers only"),
                ));
            }
        }
    }
}

/// An Akamai provider's own fields: the EdgeGrid API host, the three credential variables
/// (EdgeGrid signs with a client token, a client secret and an access token, never one API
/// token), and CP codes that are CP codes.
fn akamai(at: &str, spec: &ProviderSpec, out: &mut Problems) {
    match spec.api_host.as_deref() {
        None | Some("") => out.push((
            at.to_owned(),
            "an akamai provider needs `api_host`, the EdgeGrid API host of its API client (like akab-xxxxxxxxxxxxxxxx-xxxxxxxxxxxxxxxx.luna.akamaiapis.net)".into(),
        )),
        Some(h) if !is_hostname(h) || !h.to_ascii_lowercase().ends_with(".akamaiapis.net") => out.push((
            format!("{at}.api_host"),
            format!("{h:?} is not an EdgeGrid API host: write the `host` of the API client's credentials, like akab-xxxxxxxxxxxxxxxx-xxxxxxxxxxxxxxxx.luna.akamaiapis.net (no scheme, no path)"),
        )),
        Some(_) => {}
    }
    for (field, v) in [
        ("client_token_env", &spec.client_token_env),
        ("client_secret_env", &spec.client_secret_env),
        ("access_token_env", &spec.access_token_env),
    ] {
        if v.as_deref().is_none_or(str::is_empty) {
            out.push((
                at.to_owned(),
                format!("an akamai provider needs `{field}`, the environment variable holding the EdgeGrid {}", field.trim_end_matches("_env").replace('_', " ")),
            ));
        }
    }
    if spec.token_env.is_some() {
        out.push((
            format!("{at}.token_env"),
            "an akamai provider signs with EdgeGrid credentials: name them in `client_token_env`, `client_secret_env` and `access_token_env`, not `token_env`".into(),
        ));
    }
    for (i, code) in spec.cp_codes.iter().enumerate() {
        if *code == 0 {
            out.push((
                format!("{at}.cp_codes[{i}]"),
                "0 is not a CP code (CP codes are positive numbers, like 12345)".into(),
            ));
        }
    }
}

fn cache(policy: &Policy, out: &mut Problems) {
    let key = &policy.cache.cache_key;
    for (i, q) in key.query_allowlist.iter().enumerate() {
        if q.is_empty() || q.chars().any(|c| c.is_control() || "&=#".contains(c)) {
            out.push((
                format!("cache.cache_key.query_allowlist[{i}]"),
                format!("{q:?} is not a query parameter name (no &, =, # or control characters)"),
            ));
        }
    }
    for (i, c) in key.cookie_allowlist.iter().enumerate() {
        if !is_token(c) {
            out.push((
                format!("cache.cache_key.cookie_allowlist[{i}]"),
                format!("{c:?} is not a cookie name (an RFC 6265 token: letters, digits and !#$%&'*+-.^_`|~)"),
            ));
        }
    }
    for (i, route) in policy.cache.routes.iter().enumerate() {
        printable(out, format!("cache.routes[{i}].match"), &route.pattern);
        for (name, value) in &route.headers {
            if !is_token(name) {
                out.push((
                    format!("cache.routes[{i}].headers"),
                    format!("{name:?} is not a header name (an RFC 9110 token: letters, digits and !#$%&'*+-.^_`|~)"),
                ));
            } else if !is_field_value(value) {
                out.push((
                    format!("cache.routes[{i}].headers.{name}"),
                    format!("{value:?} is not a header value: it contains a line break or another control character"),
                ));
            }
        }
        if let Err(e) = Regex::new(&route.pattern) {
            let first = e
                .to_string()
                .lines()
                .last()
                .unwrap_or_default()
                .trim()
                .to_owned();
            out.push((
                format!("cache.routes[{i}].match"),
                format!(
                    "{:?} is not a valid regular expression ({first})",
                    route.pattern
                ),
            ));
        }
        if route.cache == super::CacheMode::Never
            && (route.ttl_edge.is_some() || route.immutable || route.surrogate_keys_from_origin)
        {
            out.push((
                format!("cache.routes[{i}]"),
                "a `cache: never` route cannot also set ttl_edge, immutable or surrogate_keys_from_origin".into(),
            ));
        }
    }
}

fn health(policy: &Policy, out: &mut Problems) {
    let h = &policy.health;
    printable(out, "health.expect".into(), &h.expect);
    if !h.path.starts_with('/') || h.path.chars().any(|c| c.is_control() || c == ' ') {
        out.push((
            "health.path".into(),
            format!(
                "{:?} must be a path starting with /, without spaces or control characters",
                h.path
            ),
        ));
    }
    if h.expect.is_empty() {
        out.push((
            "health.expect".into(),
            "the expected content is empty: name a string only the real object contains, like healthy-v3".into(),
        ));
    }
    if h.expect_status.is_empty() || h.expect_status.iter().any(|s| !(100..=599).contains(s)) {
        out.push((
            "health.expect_status".into(),
            "list the HTTP statuses that pass, each 100 to 599, like [200]".into(),
        ));
    }
    let n = h.regions.len();
    if n == 0 {
        out.push((
            "health.regions".into(),
            "list at least one probe region".into(),
        ));
    }
    let mut seen = h.regions.clone();
    seen.sort();
    if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
        out.push((
            "health.regions".into(),
            format!("region {} is listed twice", w[0]),
        ));
    }
    if h.quorum == 0 || h.quorum > n.max(1) {
        out.push((
            "health.quorum".into(),
            format!(
                "quorum {} must be between 1 and the number of regions ({n})",
                h.quorum
            ),
        ));
    }
    if h.down_after == 0 {
        out.push((
            "health.down_after".into(),
            "must be at least 1 round".into(),
        ));
    }
    if h.up_after == 0 {
        out.push(("health.up_after".into(), "must be at least 1 round".into()));
    }
    if h.interval.get().is_zero() {
        out.push((
            "health.interval".into(),
            "must be longer than zero, like 30s".into(),
        ));
    }
    if h.timeout.get().is_zero() || h.timeout >= h.interval {
        out.push((
            "health.timeout".into(),
            format!(
                "must be above zero and shorter than the interval ({})",
                h.interval
            ),
        ));
    }
    if let Some(f) = h.fresh_for
        && f < h.interval
    {
        out.push((
            "health.fresh_for".into(),
            format!(
                "must be at least one interval ({}), or no observation would ever vote",
                h.interval
            ),
        ));
    }
}

fn weights_map(
    policy: &Policy,
    at: &str,
    weights: &BTreeMap<ProviderId, Share>,
    out: &mut Problems,
) {
    let sum: u64 = weights.values().map(|s| u64::from(s.bp())).sum();
    if sum != u64::from(TOTAL_BP) {
        out.push((
            at.to_owned(),
            format!(
                "weights sum to {}, they must sum to exactly 100% ({})",
                Share(sum.min(u64::from(u32::MAX)) as u32),
                weights
                    .iter()
                    .map(|(p, s)| format!("{p} {s}"))
                    .collect::<Vec<_>>()
                    .join(" + ")
            ),
        ));
    }
    unknown_providers(policy, at, weights.keys(), out);
    for (id, share) in weights {
        if share.bp() > 0 && policy.is_standby(id) {
            out.push((
                format!("{at}.{id}"),
                format!(
                    "{id} is a standby (providers.{id}.standby: true) and carries no traffic: give it 0% here, or drill it (steering.drills), or make it live"
                ),
            ));
        }
    }
}

fn unknown_providers<'a>(
    policy: &Policy,
    at: &str,
    ids: impl Iterator<Item = &'a ProviderId>,
    out: &mut Problems,
) {
    for id in ids {
        if !policy.providers.contains_key(id) {
            out.push((
                format!("{at}.{id}"),
                format!(
                    "provider {id} is not defined under `providers` (defined: {})",
                    known_list(policy)
                ),
            ));
        }
    }
}

fn steering(policy: &Policy, out: &mut Problems) {
    let s = &policy.steering;
    for (field, name) in [("record", &s.record), ("zone", &s.zone)] {
        if !is_hostname(name) {
            out.push((
                format!("steering.{field}"),
                format!("{name:?} is not a DNS name, like www.example.com"),
            ));
        }
    }
    if !s
        .record
        .trim_end_matches('.')
        .ends_with(s.zone.trim_end_matches('.'))
    {
        out.push((
            "steering.record".into(),
            format!("{:?} is not inside zone {:?}", s.record, s.zone),
        ));
    }
    if s.record
        .trim_end_matches('.')
        .eq_ignore_ascii_case(s.zone.trim_end_matches('.'))
    {
        out.push((
            "steering.record".into(),
            format!(
                "{:?} is the zone apex: the steered CNAME cannot stand beside the apex's SOA and NS records; steer a name below it, like www.{}",
                s.record,
                s.zone.trim_end_matches('.')
            ),
        ));
    }
    if s.ttl.get().is_zero() {
        out.push(("steering.ttl".into(), "must be above zero, like 30s".into()));
    }
    let defaults: Vec<usize> = s
        .regions
        .iter()
        .enumerate()
        .filter(|(_, r)| r.networks.contains(&NetworkKey::Global))
        .map(|(i, _)| i)
        .collect();
    if defaults.len() != 1 {
        out.push((
            "steering.regions".into(),
            format!(
                "exactly one region must match \"*\" (the default for everyone else); found {}",
                defaults.len()
            ),
        ));
    }
    let mut names = Vec::new();
    for (i, region) in s.regions.iter().enumerate() {
        let at = format!("steering.regions[{i}]");
        if region.networks.is_empty() {
            out.push((
                format!("{at}.match"),
                "list the networks this region covers, or \"*\"".into(),
            ));
        }
        weights_map(policy, &format!("{at}.weights"), &region.weights, out);
        let name = region.cohort_id(i);
        if names.contains(&name) {
            out.push((
                format!("{at}.name"),
                format!("cohort name {name} is used twice"),
            ));
        }
        names.push(name);
    }
    // Floors and commits must leave room for each other.
    let floors = &s.floors;
    unknown_providers(
        policy,
        "steering.floors.commits",
        floors.commits.keys(),
        out,
    );
    for id in floors.commits.keys().filter(|p| policy.is_standby(p)) {
        out.push((
            format!("steering.floors.commits.{id}"),
            format!("{id} is a standby and carries no traffic: a commit cannot apply to it"),
        ));
    }
    let live: Vec<&ProviderId> = policy
        .providers
        .keys()
        .filter(|p| !policy.is_standby(p))
        .collect();
    if live.is_empty() && !policy.providers.is_empty() {
        out.push((
            "providers".into(),
            "every provider is a standby: at least one must be live (standby: false) to carry the traffic".into(),
        ));
    }
    let n = live.len() as u64;
    let needed: u64 = live
        .iter()
        .map(|p| u64::from(floors.for_provider(p).bp()))
        .sum();
    if needed > u64::from(TOTAL_BP) {
        out.push((
            "steering.floors".into(),
            format!(
                "the floors need {} together ({} providers × measurement floor {}, raised by commits), more than 100%: lower the measurement floor or the commits",
                Share(needed.min(u64::from(u32::MAX)) as u32),
                n,
                floors.measurement
            ),
        ));
    }
    // Failover steps rise to 100%.
    let steps = &s.failover.steps;
    if steps.is_empty()
        || steps.windows(2).any(|w| w[0] >= w[1])
        || steps.last().map(|l| l.bp()) != Some(TOTAL_BP)
        || steps.first().is_some_and(|f| f.bp() == 0)
    {
        out.push((
            "steering.failover.steps".into(),
            format!(
                "steps must rise strictly and end at 100%, like [50%, 100%]; got [{}]",
                steps
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let rum = &s.rum;
    if !(1..=99).contains(&rum.percentile) {
        out.push((
            "steering.rum.percentile".into(),
            "must be 1 to 99 (75 for p75)".into(),
        ));
    }
    if rum.min_samples == 0 {
        out.push((
            "steering.rum.min_samples".into(),
            "must be at least 1; a few hundred is usual".into(),
        ));
    }
    if rum.min_pairs < 20 {
        out.push((
            "steering.rum.min_pairs".into(),
            "must be at least 20: the spread and correlation the paired test reads come from the pairs themselves".into(),
        ));
    }
    if rum.relative_gap.bp() > TOTAL_BP {
        out.push((
            "steering.rum.relative_gap".into(),
            "must be 0% to 100%".into(),
        ));
    }
    if !(rum.switch_back_factor.is_finite()
        && rum.switch_back_factor >= 1.0
        && rum.switch_back_factor <= 10.0)
    {
        out.push((
            "steering.rum.switch_back_factor".into(),
            format!(
                "{} must be 1 to 10: switching back needs at least the gap that switched",
                rum.switch_back_factor
            ),
        ));
    }
    if rum.step.bp() == 0 || rum.step.bp() > TOTAL_BP {
        out.push((
            "steering.rum.step".into(),
            "must be above 0% and at most 100%, like 20%".into(),
        ));
    }
    if rum.availability_threshold.bp() > TOTAL_BP {
        out.push((
            "steering.rum.availability_threshold".into(),
            "must be 0% to 100%".into(),
        ));
    }
    if rum.window.get().is_zero() {
        out.push((
            "steering.rum.window".into(),
            "must be above zero, like 1h".into(),
        ));
    }
    if let Some(max) = rum.max_window {
        if max.get() < rum.window.get() {
            out.push((
                "steering.rum.max_window".into(),
                format!(
                    "{max} is shorter than window {}: at least the window, like 4h",
                    rum.window
                ),
            ));
        } else if max.get() > rum.window.get().saturating_mul(64) {
            out.push((
                "steering.rum.max_window".into(),
                format!(
                    "{max} is over 64 windows of {}: the scoreboard keeps this much of every \
                     cell; a few hours is usual",
                    rum.window
                ),
            ));
        }
    }
    if rum.probe.sample.bp() > TOTAL_BP {
        out.push((
            "steering.rum.probe.sample".into(),
            format!("{} must be at most 100%", rum.probe.sample),
        ));
    }
    for (provider, url) in &rum.probe.objects {
        let field = format!("steering.rum.probe.objects.{provider}");
        if !policy.providers.contains_key(provider) {
            out.push((
                field,
                format!("{provider} is not one of the policy's providers"),
            ));
        } else if !(url.starts_with("https://") || url.starts_with("http://"))
            || url.len() > 2048
            || url.chars().any(|c| c.is_control() || c.is_whitespace())
        {
            out.push((
                field,
                format!(
                    "{:?} must be an absolute http(s) URL, like https://a.cdn.example.com/_multicdn/probe.gif",
                    url.chars().take(64).collect::<String>()
                ),
            ));
        }
    }
    let g = &s.guardrails;
    for (field, share) in [
        ("max_moved_per_hour", g.max_moved_per_hour),
        ("max_recovered_per_hour", g.max_recovered_per_hour),
        ("max_change_per_cohort", g.max_change_per_cohort),
        ("max_touched_per_apply", g.max_touched_per_apply),
    ] {
        if share.bp() == 0 || share.bp() > TOTAL_BP {
            out.push((
                format!("steering.guardrails.{field}"),
                format!("{share} must be above 0% and at most 100%"),
            ));
        }
    }
    if g.stale_after.get().is_zero() {
        out.push((
            "steering.guardrails.stale_after".into(),
            "must be above zero, like 15m".into(),
        ));
    }
    for (i, pin) in s.pins.iter().enumerate() {
        let at = format!("steering.pins[{i}]");
        weights_map(policy, &format!("{at}.weights"), &pin.weights, out);
        printable(out, format!("{at}.reason"), &pin.reason);
        if pin.reason.trim().is_empty() {
            out.push((
                format!("{at}.reason"),
                "say why the network is pinned; the journal records it".into(),
            ));
        }
    }
    fallback(policy, out);
    drills(policy, &names, out);
}

/// The static fallback: a hostname of its own, under a reserved id.
fn fallback(policy: &Policy, out: &mut Problems) {
    let Some(f) = &policy.steering.fallback else {
        return;
    };
    if !is_hostname(&f.host) {
        out.push((
            "steering.fallback.host".into(),
            format!(
                "{:?} is not a hostname: name the host serving the static catalogue, like catalogue.example-static.net",
                f.host
            ),
        ));
    }
    let host = f.host.trim_end_matches('.');
    for (id, spec) in &policy.providers {
        if spec
            .edge_host
            .trim_end_matches('.')
            .eq_ignore_ascii_case(host)
        {
            out.push((
                "steering.fallback.host".into(),
                format!(
                    "{host} is provider {id}'s edge: the fallback must be hosted independently of every CDN"
                ),
            ));
        }
    }
    if policy.providers.keys().any(|p| p.as_str() == Fallback::ID) {
        out.push((
            format!("providers.{}", Fallback::ID),
            format!(
                "`{}` names the static fallback in plans when steering.fallback is set: rename this provider",
                Fallback::ID
            ),
        ));
    }
}

/// The shield: a URL to purge it at, an origin to fetch from, purgers for its ACL.
fn shield(policy: &Policy, out: &mut Problems) {
    let Some(sh) = &policy.shield else {
        return;
    };
    let url_ok = sh.url.parse::<http::Uri>().is_ok_and(|u| {
        matches!(u.scheme_str(), Some("http" | "https"))
            && u.host().is_some_and(|h| {
                is_hostname(h)
                    || h.trim_matches(['[', ']'])
                        .parse::<std::net::IpAddr>()
                        .is_ok()
            })
    });
    if !url_ok {
        out.push((
            "shield.url".into(),
            format!(
                "{:?} is not where the shield listens: give an http:// or https:// URL with a host, like http://shield.internal:6081/",
                sh.url
            ),
        ));
    }
    let origin = sh.origin_host.trim_end_matches('.');
    if !is_hostname(origin) && origin.parse::<std::net::IpAddr>().is_err() {
        out.push((
            "shield.origin_host".into(),
            format!(
                "{:?} is not a hostname or an address: name the origin the shield fetches from",
                sh.origin_host
            ),
        ));
    }
    if sh.origin_port == 0 {
        out.push((
            "shield.origin_port".into(),
            "port 0 is not a port the origin can listen on".into(),
        ));
    }
    for (id, spec) in &policy.providers {
        if spec
            .edge_host
            .trim_end_matches('.')
            .eq_ignore_ascii_case(origin)
        {
            out.push((
                "shield.origin_host".into(),
                format!(
                    "{origin} is provider {id}'s edge: the shield fetches from the origin, never from a CDN"
                ),
            ));
        }
    }
    if policy
        .providers
        .keys()
        .any(|p| p.as_str() == ShieldSpec::ID)
    {
        out.push((
            format!("providers.{}", ShieldSpec::ID),
            format!(
                "`{}` names the origin shield in purge reports when the shield section is set: rename this provider",
                ShieldSpec::ID
            ),
        ));
    }
    if sh.purgers.is_empty() {
        out.push((
            "shield.purgers".into(),
            "name at least one address allowed to purge (the controller's): with none, no purge reaches the shield and every purge is missed".into(),
        ));
    }
}

/// Drills: a known provider to shift to, a share and a hold that make sense, known cohorts.
fn drills(policy: &Policy, cohorts: &[CohortId], out: &mut Problems) {
    let mut names: Vec<&CohortId> = Vec::new();
    for (i, d) in policy.steering.drills.iter().enumerate() {
        let at = format!("steering.drills[{i}]");
        if names.contains(&&d.name) {
            out.push((
                format!("{at}.name"),
                format!("drill name {} is used twice", d.name),
            ));
        }
        names.push(&d.name);
        if !policy.providers.contains_key(&d.to) {
            out.push((
                format!("{at}.to"),
                format!(
                    "provider {} is not defined under `providers` (defined: {})",
                    d.to,
                    known_list(policy)
                ),
            ));
        }
        if d.share.bp() == 0 || d.share.bp() > TOTAL_BP {
            out.push((
                format!("{at}.share"),
                format!("{} must be above 0% and at most 100%", d.share),
            ));
        }
        if d.hold.get().is_zero() {
            out.push((format!("{at}.hold"), "must be above zero, like 1h".into()));
        }
        at_most(
            out,
            format!("{at}.hold"),
            d.hold,
            MAX_PERIOD_SECS,
            "the controller takes (30 days)",
        );
        for (j, c) in d.cohorts.iter().enumerate() {
            if !cohorts.contains(c) {
                out.push((
                    format!("{at}.cohorts[{j}]"),
                    format!(
                        "{c} is not one of the regions (steering.regions names: {})",
                        cohorts
                            .iter()
                            .map(CohortId::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        if d.abort.p90_rise.get().is_zero() {
            out.push((
                format!("{at}.abort.p90_rise"),
                "must be above zero, like 150ms".into(),
            ));
        }
        if d.abort.error_rise.bp() > TOTAL_BP {
            out.push((
                format!("{at}.abort.error_rise"),
                "must be 0% to 100%".into(),
            ));
        }
    }
}
