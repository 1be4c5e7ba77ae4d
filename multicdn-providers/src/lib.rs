//! # multicdn-providers
//!
//! Talking to vendors: Fastly and Cloudflare (purge, configuration), Akamai (Fast Purge v3,
//! signed with EdgeGrid), Route 53 and NS1 (steering
//! answers, vendor health checks), an in-memory steerer (the embedded default), and the purge
//! fan-out. Every adapter speaks through one HTTP layer ([`http`]): a rustls client with
//! connect and request timeouts, client-side pacing at each vendor's documented limits, and
//! retries with backoff and jitter for what can be retried (429, 5xx, connection errors,
//! timeouts), never for 400/401/403. Every failure is a [`multicdn_core::Error`] naming the
//! provider, the request, the vendor's code and message, and whether it may have applied.
//!
//! ## Purge
//!
//! [`fastly::FastlyPurger`] and [`cloudflare::CloudflarePurger`] implement
//! [`Purger`](multicdn_core::Purger): URLs, tags (Fastly surrogate keys and Cloudflare cache
//! tags are one concept), hosts and prefixes where the vendor has them, everything; batched to
//! the vendor's per-request limit and paced to its rate limits. [`fanout::PurgeFanout`] purges
//! every provider in parallel and reports the worst time to acknowledge; a provider that still
//! fails after its retries makes the whole call an error naming it and the items it missed,
//! and emits [`Event::PurgeMissed`](multicdn_core::Event::PurgeMissed), which demotes it.
//! The fan-out remembers what each provider missed; [`fanout::PurgeFanout::retry_missed`]
//! re-sends exactly that, and a provider purged of all it missed emits
//! [`Event::PurgeRecovered`](multicdn_core::Event::PurgeRecovered), which lifts the demotion.
//!
//! ## Configuration
//!
//! [`render`] turns the policy's cache section into Fastly VCL snippets and Cloudflare
//! rulesets (deterministic bytes, warnings or errors for what a provider cannot express), and
//! the vendors' `deploy` modules plan, apply and check drift of what is deployed.
//!
//! ## Steering actuators
//!
//! Three [`Steerer`](multicdn_core::Steerer)s read the answers in force, show a dry run and
//! apply a [`SteeringPlan`](multicdn_core::SteeringPlan); each refuses an invalid plan before
//! sending anything:
//!
//! - [`memory::MemorySteerer`], the embedded default: resolves a client's networks to a
//!   provider by seeded weighted choice and counts the answers, so traffic can be watched
//!   moving;
//! - [`route53::Route53Steerer`] (feature `route53`): geolocation answers at the record name
//!   pointing at per-cohort pools of weighted, health-checked CNAMEs (the layout is documented
//!   in [`route53`]), plus `HTTPS_STR_MATCH` health checks read back as observations;
//! - [`ns1::Ns1Steerer`] (feature `ns1`): one filter-chain record with a region group per
//!   cohort and an always-up last-resort tier, with up/down pushed through data feeds.
//!
//! The policy's static weights, applied to the embedded steerer:
//!
//! ```
//! use multicdn_core::{ApplyOptions, NetworkKey, Policy, Steerer};
//! use multicdn_providers::memory::MemorySteerer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/policy.yaml"))?;
//! let steerer = MemorySteerer::with_seed(1);
//! let diff = steerer.apply(&policy.static_plan(), &ApplyOptions::default()).await?;
//! assert_eq!(diff.changes.len(), 4); // four cohorts created
//!
//! let germany = ["AS3320".parse::<NetworkKey>()?, "DE".parse()?, "EU".parse()?, "*".parse()?];
//! for _ in 0..1_000 {
//!     steerer.resolve(&germany)?;
//! }
//! // Europe is 90% fastly, 10% cloudflare.
//! let fastly = steerer.served_total(&"fastly".parse()?);
//! assert!((850..=950).contains(&fastly), "{fastly}");
//! # Ok(()) }
//! ```
//!
//! ## Features
//! `fastly`, `cloudflare`, `akamai`, `route53`, `ns1`: one per vendor, all on by default. The in-memory
//! steerer, the HTTP layer, the renderers and the fan-out are always built.

#![forbid(unsafe_code)]

#[cfg(feature = "akamai")]
pub mod akamai;
#[cfg(feature = "cloudflare")]
pub mod cloudflare;
pub mod dns;
pub mod fanout;
#[cfg(feature = "fastly")]
pub mod fastly;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod memory;
#[cfg(feature = "ns1")]
pub mod ns1;
pub mod render;
#[cfg(feature = "route53")]
pub mod route53;
pub mod shield;
mod spec;
