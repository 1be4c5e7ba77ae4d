//! The checks that run once after parsing. Each returns the field's path and a message that
//! says what would be valid.

use std::collections::BTreeMap;

use regex::Regex;

use super::{Policy, Share};
use crate::id::ProviderId;
use crate::network::NetworkKey;
use crate::traits::ProviderKind;
use crate::weights::TOTAL_BP;

type Problems = Vec<(String, String)>;

pub(super) fn validate(policy: &Policy) -> Problems {
    let mut problems = Vec::new();
    providers(policy, &mut problems);
    cache(policy, &mut problems);
    health(policy, &mut problems);
    steering(policy, &mut problems);
    problems
}

fn known_list(policy: &Policy) -> String {
    policy
        .providers
        .keys()
        .map(ProviderId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
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
        if spec.edge_host.trim().is_empty() || spec.edge_host.contains(['/', ' ']) {
            out.push((
                format!("{at}.edge_host"),
                format!(
                    "{:?} is not a hostname: write the edge's name, like example.map.fastly.net",
                    spec.edge_host
                ),
            ));
        }
        match spec.kind {
            ProviderKind::Fastly if spec.service_id.as_deref().is_none_or(str::is_empty) => out.push((
                at.clone(),
                "a fastly provider needs `service_id` (the service the purges and configuration go to)".into(),
            )),
            ProviderKind::Cloudflare if spec.zone_id.as_deref().is_none_or(str::is_empty) => out.push((
                at.clone(),
                "a cloudflare provider needs `zone_id` (the zone the purges and rules go to)".into(),
            )),
            _ => {}
        }
        if spec.plan.is_some() && spec.kind != ProviderKind::Cloudflare {
            out.push((
                format!("{at}.plan"),
                "`plan` applies to cloudflare providers only".into(),
            ));
        }
    }
}

fn cache(policy: &Policy, out: &mut Problems) {
    for (i, route) in policy.cache.routes.iter().enumerate() {
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
    if !h.path.starts_with('/') {
        out.push((
            "health.path".into(),
            format!("{:?} must be a path starting with /", h.path),
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
    let n = policy.providers.len() as u64;
    let needed: u64 = policy
        .providers
        .keys()
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
    let g = &s.guardrails;
    for (field, share) in [
        ("max_moved_per_hour", g.max_moved_per_hour),
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
        if pin.reason.trim().is_empty() {
            out.push((
                format!("{at}.reason"),
                "say why the network is pinned; the journal records it".into(),
            ));
        }
    }
}
