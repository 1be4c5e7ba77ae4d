//! What the evidence tests share: a two-provider estate (europe leaning on fastly, the rest
//! even) with the RUM rules each test names, a deterministic noise source, and short names.

#![allow(dead_code)] // each test file uses its part

use multicdn_core::{CohortId, Policy, ProviderId, Weights};
use multicdn_steering::scoreboard::{Scoreboard, ScoreboardConfig};

/// The estate, with `rum` as the policy's `steering.rum` (a YAML flow mapping).
pub(crate) fn policy(rum: &str) -> Policy {
    let yaml = format!(
        r#"
site: {{host: www.example.com}}
providers:
  fastly: {{kind: fastly, edge_host: f.example.net, service_id: svc}}
  cloudflare: {{kind: cloudflare, edge_host: c.example.net, zone_id: zone}}
health: {{path: /h, expect: ok, regions: [a, b, c]}}
steering:
  record: www.example.com
  zone: example.com
  regions:
    - name: europe
      match: [DE, FR]
      weights: {{fastly: 90%, cloudflare: 10%}}
    - name: default
      match: ["*"]
      weights: {{fastly: 50%, cloudflare: 50%}}
  floors: {{measurement: 10%}}
  failover: {{steps: [50%, 100%], interval: 1m}}
  rum: {rum}
  guardrails: {{max_moved_per_hour: 100%, max_change_per_cohort: 100%, stale_after: 15m}}
"#
    );
    Policy::from_yaml(&yaml, "policy.yaml").unwrap()
}

pub(crate) fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

pub(crate) fn c(s: &str) -> CohortId {
    CohortId::new(s).unwrap()
}

/// Fastly's share in basis points, cloudflare the rest.
pub(crate) fn w(fastly: u32) -> Weights {
    Weights::new([(p("fastly"), fastly), (p("cloudflare"), 10_000 - fastly)]).unwrap()
}

/// A scoreboard configured from the policy's RUM rules.
pub(crate) fn board(policy: &Policy) -> Scoreboard {
    Scoreboard::new(
        ScoreboardConfig::from_policy(&policy.steering.rum),
        &policy.provider_ids(),
    )
    .unwrap()
}

/// A small deterministic generator (xorshift) for the beacons' noise.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub(crate) fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        let z = (-2.0 * self.next().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.next()).cos();
        median * (sigma * z).exp()
    }
}
