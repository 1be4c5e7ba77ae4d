//! # multicdn-health
//!
//! Observing CDN edges the way that catches real outages. A health verdict from this crate goes
//! red when edges answer 503, or 200 with an error page, and stays green when one probe location
//! has a bad minute (seed 000, sections 9 and 19).
//!
//! - **Probe** ([`HttpProbe`]): fetches a real object through one CDN's edge with the site's
//!   `Host` and `Cache-Control: no-cache`, within a deadline, and passes only when the status is
//!   expected *and* the first 64 KiB of the body contain the expected string. A failure says
//!   why: timeout, connect, TLS, status, content mismatch.
//! - **Quorum** ([`Quorum`]): a provider is down only when K runners with fresh observations
//!   say so (3 of 5 by default). Stale observations do not vote; too few fresh runners give no
//!   verdict, and the last one stands, so an isolated runner can never mark a CDN down.
//! - **Hysteresis** ([`Hysteresis`]): down after 2 consecutive down rounds, up after 10 up
//!   rounds. An operator's drain flag is kept apart from health ([`HealthTracker`]).
//! - **Events** (core's [`Event`](multicdn_core::Event)): `ProbeUnhappy` (one runner failed:
//!   log it) is a different event from `QuorumDown` and `Recovered` (page, steer).
//! - **Monitor** ([`Monitor`]): a future the embedder drives with a shutdown signal, probing
//!   every provider from every in-process runner each interval with bounded concurrency;
//!   observations from runners elsewhere (they serialise) join the same quorum through
//!   [`Monitor::ingest`]; verdicts are readable at any time.
//! - **Drift** ([`DriftChecker`]): the same paths through every edge, statuses and headers
//!   compared outside an ignore set and an allowlist.
//! - **Warmer** ([`Warmer`]): the top URLs through each edge in turn, bounded and rate limited,
//!   refusing a provider that health says is down, with progress for a progress bar.
//!
//! Two bad rounds from three of five runners take a provider down; a runner here stands in for
//! an [`HttpProbe`] so the example needs no network:
//!
//! ```
//! use std::time::Duration;
//! use async_trait::async_trait;
//! use multicdn_core::{Clock, Error, Event, FailReason, HealthCheck, HealthState, ManualClock,
//!     Observation, Outcome, ProviderId, RegionId, Target, Timestamp};
//! use multicdn_health::{HealthConfig, Monitor};
//!
//! /// A runner that sees fastly's edges answering 503.
//! #[derive(Debug)]
//! struct Runner { region: RegionId, clock: ManualClock }
//!
//! #[async_trait]
//! impl HealthCheck for Runner {
//!     async fn check(&self, target: &Target) -> Result<Observation, Error> {
//!         let outcome = if target.provider.as_str() == "fastly" {
//!             Outcome::Fail { reason: FailReason::Status { got: 503 } }
//!         } else {
//!             Outcome::Pass
//!         };
//!         let at = self.clock.now();
//!         Ok(Observation::new(target.provider.clone(), self.region.clone(), at, outcome, Duration::from_millis(20)))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (fastly, cloudflare) = (ProviderId::new("fastly")?, ProviderId::new("cloudflare")?);
//! let clock = ManualClock::new(Timestamp::from_secs(1_800_000_000));
//! let mut builder = Monitor::builder(HealthConfig::default())
//!     .clock(clock.clone())
//!     .concurrency(8)
//!     .target(Target::new(fastly.clone(), "https://example.map.fastly.net/_health/v3.txt", "healthy-v3"))
//!     .target(Target::new(cloudflare.clone(), "https://example.cdn.cloudflare.net/_health/v3.txt", "healthy-v3"));
//! for region in ["eu-west", "us-east", "us-west", "ap-southeast", "sa-east"] {
//!     builder = builder.runner(Runner { region: RegionId::new(region)?, clock: clock.clone() });
//! }
//! let monitor = builder.build()?;
//!
//! let first = monitor.round_once().await;
//! assert_eq!(first.failed, 5); // five unhappy probes: logged, not paged
//! assert_eq!(monitor.snapshot().state(&fastly), Some(HealthState::Up));
//!
//! clock.advance(Duration::from_secs(30));
//! let second = monitor.round_once().await;
//! assert!(second.events.iter().any(|e| matches!(e, Event::QuorumDown { provider, .. } if *provider == fastly)));
//! assert!(monitor.snapshot().is_down(&fastly));
//! assert!(monitor.snapshot().in_service(&cloudflare));
//! // In a service: tokio::spawn(async move { monitor.run(shutdown_signal).await });
//! # Ok(()) }
//! ```
//!
//! ## Features
//! No cargo features: everything above is always built. Time is a parameter throughout: the
//! monitor takes a [`Clock`](multicdn_core::Clock) for its stamps and paces rounds with
//! `tokio::time`, so tests run on paused time and a `ManualClock`.

#![forbid(unsafe_code)]

pub mod config;
pub mod drift;
pub mod edges;
pub mod error;
mod http;
pub mod hysteresis;
pub mod monitor;
pub mod probe;
pub mod quorum;
pub mod tracker;
pub mod warm;

pub use config::HealthConfig;
pub use drift::{
    AllowedDifference, DEFAULT_IGNORED_HEADERS, Difference, DriftChecker, DriftCheckerBuilder,
    DriftKind, DriftReport, FetchFailure,
};
pub use edges::{Edge, edges_from_policy, targets_from_policy};
pub use error::HealthError;
pub use hysteresis::{Hysteresis, Streak, Vote};
pub use monitor::{Monitor, MonitorBuilder, RoundReport};
pub use probe::{DEFAULT_MAX_BODY, DEFAULT_TIMEOUT, HttpProbe, HttpProbeBuilder};
pub use quorum::{Quorum, RoundVerdict};
pub use tracker::{HealthSnapshot, HealthTracker, TrackedHealth};
pub use warm::{
    ProviderWarm, WarmOutcome, WarmProgress, WarmReport, WarmStats, Warmer, WarmerBuilder,
};
