//! Human-readable summaries of a policy.

use std::fmt::Write as _;
use std::path::Path;

use multicdn_core::policy::Policy;

/// The summary `policy check` prints for a valid file: providers, regions with their weights,
/// health settings.
pub fn policy_summary(policy: &Policy, path: &Path) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}: valid", path.display());
    let _ = writeln!(out, "site: {}", policy.site.host);
    let _ = writeln!(out, "providers:");
    for (id, spec) in &policy.providers {
        let _ = writeln!(out, "  {id:<12} {:<10} edge {}", spec.kind, spec.edge_host);
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
