//! # multicdn-providers
//!
//! Talking to vendors: Fastly and Cloudflare (purge, configuration), Route 53 and NS1 (steering
//! answers, vendor health checks), an in-memory steerer (the embedded default), and the purge
//! fan-out. One cargo feature per vendor.

#![forbid(unsafe_code)]

#[cfg(feature = "cloudflare")]
pub mod cloudflare;
pub mod fanout;
#[cfg(feature = "fastly")]
pub mod fastly;
pub mod http;
pub mod render;
pub mod memory;
#[cfg(feature = "ns1")]
pub mod ns1;
#[cfg(feature = "route53")]
pub mod route53;
