//! Human-readable summaries of a policy and of a scoreboard.

use std::fmt::Write as _;
use std::path::Path;

use multicdn_core::policy::Policy;
use multicdn_core::{Country, NetworkKey, ProviderId};
use multicdn_steering::scoreboard::{Metric, Snapshot};

/// The summary `policy check` prints for a valid file: providers, regions with their weights,
/// health settings.
pub fn policy_summary(policy: &Policy, path: &Path) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}: valid", path.display());
    let _ = writeln!(out, "site: {}", policy.site.host);
    let _ = writeln!(out, "providers:");
    for (id, spec) in &policy.providers {
        let role = if spec.standby {
            " (standby: 0% until a failover or a drill)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {id:<12} {:<10} edge {}{role}",
            spec.kind, spec.edge_host
        );
    }
    let s = &policy.steering;
    let _ = writeln!(
        out,
        "steering: {} (zone {}, ttl {})",
        s.record, s.zone, s.ttl
    );
    for (i, region) in s.regions.iter().enumerate() {
        let networks: Vec<String> = region.networks.iter().map(ToString::to_string).collect();
        let weights = region
            .weights()
            .map(|w| w.to_string())
            .unwrap_or_else(|e| e.to_string());
        let _ = writeln!(
            out,
            "  {:<14} [{}] -> {weights}",
            region.cohort_id(i),
            networks.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "  failover steps [{}] every {}; measurement floor {}",
        s.failover
            .steps
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        s.failover.interval,
        s.floors.measurement
    );
    if !s.pins.is_empty() {
        let _ = writeln!(out, "  pins: {}", s.pins.len());
    }
    if let Some(f) = &s.fallback {
        let _ = writeln!(out, "  fallback when every provider is down: {}", f.host);
    }
    for d in &s.drills {
        let _ = writeln!(
            out,
            "  drill {}: {} to {} at {}, held {}; aborted on p90 +{} or errors +{}",
            d.name, d.share, d.to, d.at, d.hold, d.abort.p90_rise, d.abort.error_rise
        );
    }
    if let Some(sh) = &policy.shield {
        let _ = writeln!(
            out,
            "shield: Varnish in front of the origin {}:{}, purged first at {} from {}",
            sh.origin_host,
            sh.origin_port,
            sh.url,
            sh.purgers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let h = &policy.health;
    let _ = writeln!(
        out,
        "health: GET {} expecting {:?} from {} regions ({}), quorum {}, down after {} bad rounds, up after {} good, every {}, timeout {}",
        h.path,
        h.expect,
        h.regions.len(),
        h.regions
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        h.quorum,
        h.down_after,
        h.up_after,
        h.interval,
        h.timeout
    );
    let _ = writeln!(out, "cache: {} routes", policy.cache.routes.len());
    out
}

/// Every country with samples for `metric` (any two letters a `Country` accepts), sorted.
fn countries(snapshot: &Snapshot, metric: Metric) -> Vec<Country> {
    let mut out = Vec::new();
    for a in b'A'..=b'Z' {
        for b in b'A'..=b'Z' {
            let code = [a, b];
            let Ok(code) = std::str::from_utf8(&code) else {
                continue;
            };
            if let Ok(c) = Country::new(code)
                && snapshot.samples(metric, NetworkKey::Country(c)) > 0
            {
                out.push(c);
            }
        }
    }
    out
}

/// The seed's one dashboard: p75 by provider by country (and all countries), with each
/// provider's share of the requests (availability, for probe beacons); `*` marks a cell with
/// too few samples to steer on.
pub fn dashboard(snapshot: &Snapshot, metric: Metric, providers: &[ProviderId]) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<8}", "country");
    for p in providers {
        let _ = write!(
            out,
            " {:>26}",
            format!(
                "{p} p75 ({})",
                if metric == Metric::Probe {
                    "avail"
                } else {
                    "share"
                }
            )
        );
    }
    out.push('\n');
    let mut rows: Vec<(String, NetworkKey)> = countries(snapshot, metric)
        .into_iter()
        .map(|c| (c.to_string(), NetworkKey::Country(c)))
        .collect();
    rows.push(("all".to_owned(), NetworkKey::Global));
    for (label, key) in rows {
        let cells: Vec<_> = providers
            .iter()
            .map(|p| snapshot.cell(metric, key, p))
            .collect();
        let total: u64 = cells.iter().map(|v| v.stats.samples).sum::<u64>().max(1);
        let _ = write!(out, "{label:<8}");
        for v in &cells {
            let p75 = v
                .stats
                .p75
                .map_or_else(|| "-".to_owned(), |p| format!("{p:.0} ms"));
            let mark = if v.status.is_steerable() { "" } else { "*" };
            let second = match (metric, v.stats.availability) {
                (Metric::Probe, Some(a)) => format!("{:.1}%", a * 100.0),
                _ => format!("{:.0}%", 100.0 * v.stats.samples as f64 / total as f64),
            };
            let _ = write!(out, " {:>26}", format!("{p75}{mark} ({second})"));
        }
        out.push('\n');
    }
    out
}
