//! # multicdn
//!
//! Several CDNs as one delivery layer, as one dependency. This crate is the roof over the four
//! `multicdn-*` crates: a [`prelude`], the vendor adapters (behind the features `fastly`,
//! `cloudflare`, `route53`, `ns1`), the [`HealthLedger`] that says every reason a provider is
//! out, and the [`Controller`] that runs the loop: beacons and health in, rounds of decide ->
//! apply on every actuator -> journal, its state in a [`StateStore`] so a restart continues
//! where it stopped. [`Controller::operate`] takes the operator's switches (static mode, pins,
//! drains, dry run) with who and why. With the `service` feature, `service` puts it all behind
//! HTTP: the beacon receiver, the browser script, the dashboard, `/metrics` and the admin
//! switches.
//!
//! A complete service in one page: a policy, a controller with one actuator, beacons in, and
//! the loop running until shutdown. Here the actuator is the in-memory steerer and time is
//! simulated; in production it is Route 53 or NS1 ([`route53::Route53Steerer`],
//! [`ns1::Ns1Steerer`]) on the [`SystemClock`](multicdn_core::SystemClock), with a
//! [`FileStore`].
//!
//! ```
//! use std::time::Duration;
//! use multicdn::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/policy.yaml"))?;
//! let start = Timestamp::parse_rfc3339("2026-12-01T09:00:00Z")?;
//! let clock = ManualClock::new(start);
//! let dns = MemorySteerer::new(); // clones share one table: this is what users are answered
//! let controller = Controller::builder(policy)
//!     .actuator("memory", dns.clone())
//!     .clock(clock.clone())
//!     .store(MemoryStore::new()) // FileStore::new("/var/lib/multicdn") keeps it on disk
//!     .build()?;
//!
//! // Beacons in (the receiver's NDJSON lines; a `Stream` of them goes to `consume`).
//! let line = |t: Timestamp, cdn: &str| format!(
//!     r#"{{"at":{},"asn":3320,"country":"DE","ttfb":40,"provider":"{cdn}"}}"#, t.as_millis()
//! );
//! let beacons: String = (0..40).map(|_| line(start, "fastly") + "\n" + &line(start, "cloudflare") + "\n").collect();
//! controller.ingest_bytes(beacons.as_bytes());
//!
//! // Fastly fails: the quorum's verdict (here reported by hand; a `Monitor` reports its own).
//! let fastly = ProviderId::new("fastly")?;
//! controller.report(Event::QuorumDown { provider: fastly.clone(), failing: vec![], voting: 5, at: start });
//!
//! // Rounds on simulated time; `run` calls `round` every interval by its clock.
//! let europe = "europe".parse::<CohortId>()?;
//! let mut shares = Vec::new();
//! for _ in 0..3 {
//!     let report = controller.round(clock.now()).await;
//!     assert!(!report.partial()); // every actuator holds the plan
//!     shares.push(report.plan.cohort(&europe).map(|c| c.weights.get(&fastly)));
//!     clock.advance(Duration::from_secs(90));
//! }
//! // Fastly (90% of Europe) leaves in the policy's steps: half at once, the rest 90 s later.
//! assert_eq!(shares, [Some(4_500), Some(0), Some(0)]);
//! let de: Vec<NetworkKey> = vec!["DE".parse()?, NetworkKey::Global];
//! assert_eq!(dns.resolve(&de)?, ProviderId::new("cloudflare")?);
//! assert_eq!(controller.rounds().await.len(), 3); // each round journaled: decided, applied
//!
//! // In a service: `tokio::spawn(async move { controller.run(SystemClock, ctrl_c).await })`.
//! // A shutdown that has already happened ends the loop before its first round.
//! controller.run(SystemClock, async {}).await;
//! assert_eq!(controller.last_round().await, 3);
//! # Ok(())
//! # }
//! ```
//!
//! ## Where to go next
//! - [`controller`]: the round, the actuators and how failures are retried and journaled;
//! - [`ledger`]: how health, purges, drains and holds add up;
//! - [`store`]: what survives a restart, and how the file store writes it;
//! - the crates underneath, re-exported whole: [`core`], [`health`], [`steering`],
//!   [`providers`].

#![forbid(unsafe_code)]

pub mod controller;
#[cfg(feature = "nats")]
pub mod leader;
#[cfg(feature = "nats")]
pub mod lease;
pub mod ledger;
pub mod operator;
pub mod record;
#[cfg(feature = "service")]
pub mod service;
/// Sharded beacon ingest over NATS JetStream: batched publishers, one worker per shard, the merge.
#[cfg(feature = "nats")]
pub mod shards;
pub mod store;

pub use controller::{
    BeaconInput, Controller, ControllerBuilder, ControllerError, Deposed, Retry, RoundGate,
    RoundReport,
};
pub use ledger::{HealthLedger, LedgerEntry, OutReason};
pub use operator::{Command, Operator, OperatorError, OperatorRecord, Overrides};
pub use record::{ApplyOutcome, ApplyRecord, ErrorRecord, Intent, RoundRecord, Takeover};
pub use store::{ControllerState, FileStore, MemoryStore, Saved, StateStore, StoreError};

pub use multicdn_core as core;
pub use multicdn_health as health;
pub use multicdn_providers as providers;
pub use multicdn_steering as steering;

#[cfg(feature = "cloudflare")]
pub use multicdn_providers::cloudflare;
#[cfg(feature = "fastly")]
pub use multicdn_providers::fastly;
#[cfg(feature = "ns1")]
pub use multicdn_providers::ns1;
#[cfg(feature = "route53")]
pub use multicdn_providers::route53;
pub use multicdn_providers::{fanout, memory};

/// What a service needs in one `use`.
pub mod prelude {
    pub use crate::{
        ApplyOutcome, Command, Controller, ControllerBuilder, FileStore, HealthLedger, MemoryStore,
        Operator, OutReason, Retry, RoundRecord, StateStore,
    };
    pub use multicdn_core::{
        ApplyOptions, Clock, CohortId, Country, Event, HealthState, ManualClock, NetworkKey,
        Policy, ProviderHealth, ProviderId, PurgeRequest, Purger, Secret, Steerer, SteeringPlan,
        SystemClock, Timestamp, Weights,
    };
    pub use multicdn_health::{HealthConfig, HttpProbe, Monitor, targets_from_policy};
    pub use multicdn_providers::fanout::{FanoutMember, PurgeFanout};
    pub use multicdn_providers::http::HttpSettings;
    pub use multicdn_providers::memory::MemorySteerer;
    pub use multicdn_steering::video::{ContentSteering, ContentSteeringSteerer, SharedPlan};

    #[cfg(feature = "cloudflare")]
    pub use multicdn_providers::cloudflare::CloudflarePurger;
    #[cfg(feature = "fastly")]
    pub use multicdn_providers::fastly::FastlyPurger;
    #[cfg(feature = "ns1")]
    pub use multicdn_providers::ns1::Ns1Steerer;
    #[cfg(feature = "route53")]
    pub use multicdn_providers::route53::Route53Steerer;
}
