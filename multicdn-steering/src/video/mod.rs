//! Video delivery: content steering for HLS and DASH players, capacity-aware failover, quality
//! caps as load shedding, gradual drain, and a simulator of node failure and cascade.
//!
//! - [`manifest`]: the steering manifest (`VERSION`, `TTL`, `RELOAD-URI`, `PATHWAY-PRIORITY`,
//!   `PATHWAY-CLONES`).
//! - [`actuator`]: [`ContentSteeringSteerer`], the [`Steerer`](multicdn_core::Steerer) that turns
//!   the engine's plan into per-cohort, per-session pathway orders.
//! - [`server`]: [`ContentSteering`], the framework-free handler: request in, status, headers
//!   and JSON body out; players' `_HLS_`/`_DASH_` reports out as [`PathwayMeasurement`]s; a
//!   shorter TTL during incidents, failovers and plan changes; per-client limits, answered
//!   without ending an HLS session (a 200 with a longer TTL) and with `429` and `Retry-After`
//!   for DASH.
//! - [`sessions`]: what the handler remembers per session and client, bounded, and the
//!   collapse rule ([`RerouteRule`]) that offers a session whose throughput collapsed the
//!   alternative first.
//! - [`topology`]: nodes, client populations and the failover rule that spreads clients over
//!   the nearest nodes with room.
//! - [`shedding`]: the bitrate ladder and [`QualityGovernor`], which caps quality above a
//!   utilisation threshold and says so in `CMSD-Dynamic` and `X-CDN-Quality-Cap`.
//! - [`drain`]: sessions moving back to a recovered node at a bounded rate.
//! - [`tagging`]: [`tag_hls`] and [`tag_dash`] rewrite an origin's multivariant playlist or MPD
//!   so players steer: the steering server, and every variant, rendition group or `BaseURL`
//!   once per pathway.
//! - [`sim`]: the pure, time-stepped simulator; [`svg`]: a chart of its timeline.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use multicdn_core::{ApplyOptions, CohortId, CohortPlan, NetworkKey, ProviderId, Steerer,
//!     SteeringPlan, Timestamp, Weights};
//! use multicdn_steering::video::{ContentSteering, ContentSteeringSteerer, Protocol, SharedPlan,
//!     SteeringConfig, SteeringRequest};
//!
//! let plan = SharedPlan::new();
//! let steerer = ContentSteeringSteerer::new(ProviderId::new("content-steering")?, plan.clone());
//! let handler = ContentSteering::new(SteeringConfig::default(), plan);
//! let weights = Weights::single(ProviderId::new("cdn-b")?);
//! let engine_plan = SteeringPlan {
//!     record: "video".into(),
//!     ttl: Duration::from_secs(300),
//!     cohorts: vec![CohortPlan {
//!         cohort: CohortId::new("default")?,
//!         networks: NetworkKey::Global.into(),
//!         weights,
//!     }],
//! };
//! # tokio_test_block_on(async {
//! steerer.apply(&engine_plan, &ApplyOptions::default()).await?;
//! # Ok::<(), multicdn_core::Error>(()) })?;
//! let request = SteeringRequest::from_query_string(
//!     Protocol::Hls,
//!     "_HLS_pathway=cdn-a&_HLS_throughput=4500000",
//!     vec!["AS7922".parse()?],
//! );
//! let response = handler.handle(&request, Timestamp::from_secs(1_800_000_000));
//! assert_eq!(response.status, 200);
//! assert_eq!(response.manifest.unwrap().pathway_priority, vec!["cdn-b"]);
//! assert_eq!(response.measurements[0].throughput_bps, 4_500_000);
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod actuator;
pub mod drain;
pub mod manifest;
pub mod server;
pub mod sessions;
pub mod shedding;
pub mod sim;
pub mod svg;
pub mod tagging;
pub mod topology;

pub use actuator::{ContentSteeringSteerer, PlanInForce, SharedPlan, pathway_priority};
pub use drain::{Drain, DrainConfig};
pub use manifest::{PathwayClone, SteeringManifest, UriReplacement};
pub use server::{
    ContentSteering, MeasurementError, PathwayMeasurement, Protocol, RateLimit, Reports,
    SteeringConfig, SteeringRequest, SteeringResponse,
};
pub use sessions::RerouteRule;
pub use shedding::{
    BitrateLadder, QualityGovernor, Rung, SheddingConfig, cmsd_dynamic, cmsd_dynamic_lifted,
};
pub use sim::{Scenario, SimEvent, Timeline, simulate};
pub use tagging::{Pathway, TagError, TagOptions, tag_dash, tag_hls};
pub use topology::{Node, NodeHealth, Population, Topology};
