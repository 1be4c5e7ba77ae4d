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
