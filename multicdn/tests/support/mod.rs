//! What the controller tests share: ids, the start of simulated time, beacons that keep the
//! deadman quiet, the quorum's verdict, and a cohort's share.

#![allow(clippy::unwrap_used, dead_code)]

pub(crate) mod browser;

use multicdn::RoundReport;
use multicdn::prelude::*;

/// The example policy.
pub(crate) const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/policy.yaml");

pub(crate) fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

pub(crate) fn start() -> Timestamp {
    Timestamp::parse_rfc3339("2026-12-01T09:00:00Z").unwrap()
}

/// Fresh beacons for Europe (both providers equal), so the deadman never fires.
pub(crate) fn feed(c: &Controller, now: Timestamp) {
    let mut text = String::new();
    for cdn in ["fastly", "cloudflare"] {
        for _ in 0..30 {
            text.push_str(&format!(
                "{{\"at\":{},\"asn\":3320,\"country\":\"DE\",\"ttfb\":40,\"provider\":\"{cdn}\"}}\n",
                now.as_millis()
            ));
        }
    }
    c.ingest_bytes(text.as_bytes());
}

/// `provider`'s share of Europe in the round's plan, in basis points.
pub(crate) fn europe(r: &RoundReport, provider: &str) -> u32 {
    r.plan
        .cohort(&"europe".parse().unwrap())
        .unwrap()
        .weights
        .get(&p(provider))
}

/// The quorum says `provider` is down.
pub(crate) fn quorum_down(provider: &str, at: Timestamp) -> Event {
    Event::QuorumDown {
        provider: p(provider),
        failing: vec![],
        voting: 5,
        at,
    }
}
