//! # multicdn-providers
//!
//! Talking to vendors: Fastly and Cloudflare (purge, configuration), Route 53 and NS1 (steering
//! answers, vendor health checks), an in-memory steerer (the embedded default), and the purge
//! fan-out. One cargo feature per vendor.
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

#![forbid(unsafe_code)]

#[cfg(feature = "cloudflare")]
pub mod cloudflare;
pub mod fanout;
#[cfg(feature = "fastly")]
pub mod fastly;
pub mod http;
pub mod memory;
#[cfg(feature = "ns1")]
pub mod ns1;
pub mod render;
#[cfg(feature = "route53")]
pub mod route53;
