//! # multicdn-steering
//!
//! Deciding where traffic goes: the RUM scoreboard (metric × network × provider × window), the
//! scorers, the pure decision engine with its guardrails and journal, content-steering
//! manifests for video players, and capacity-aware failover with quality caps.

#![forbid(unsafe_code)]

pub mod beacon;
pub mod engine;
pub mod error;
pub mod ingest;
pub mod journal;
pub mod resolve;
pub mod scoreboard;
pub mod scorer;
pub mod sketch;
pub mod video;
