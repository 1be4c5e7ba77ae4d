//! # multicdn-core
//!
//! The vocabulary every other `multicdn` crate speaks, with no HTTP client and no runtime:
//!
//! - **identifiers**: [`ProviderId`], [`RegionId`] (a probe runner's location) and [`CohortId`];
//! - **networks**: [`NetworkKey`], an ASN, a country, a continent or everywhere, written
//!   `AS7922`, `DE`, `EU`, `*`;
//! - **weights**: [`Weights`], integer shares that always sum to exactly 10,000 basis points,
//!   converted to vendor scales (Route 53's 0–255) by largest remainder;
//! - **the five traits**: [`Provider`], [`Purger`], [`HealthCheck`], [`Steerer`] and [`Scorer`],
//!   with the values they exchange and one classifying [`Error`];
//! - **events** that cross crates ([`Event`]): a quorum verdict, a missed purge;
//! - **time** as a parameter ([`Clock`], [`ManualClock`], [`Timestamp`]);
//! - **secrets** that print `[redacted]` ([`Secret`]);
//! - **who served a response** ([`served_by()`]), from `Server-Timing` or vendor headers;
//! - **the policy file** ([`Policy`]), parsed and validated once, with errors that name the
//!   file, line, column and field.
//!
//! ```
//! use multicdn_core::{Policy, Weights, ProviderId};
//!
//! let policy = Policy::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/policy.yaml"))?;
//! let plan = policy.static_plan();
//! let europe = &plan.cohorts[0];
//! assert_eq!(europe.weights.get(&ProviderId::new("fastly")?), 9_000);
//! // Route 53 weights are 0-255; the split survives the round trip.
//! let r53 = europe.weights.to_scale(255);
//! assert_eq!(Weights::from_scale(r53, 100)?, europe.weights);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Features
//! - `mock`: `mockall` mocks of the five traits (`MockPurger`, `MockSteerer`, ...), so teams can
//!   mock them in their own tests.

#![forbid(unsafe_code)]

pub mod clock;
pub mod error;
pub mod event;
pub mod geo;
pub mod health;
pub mod id;
pub mod network;
pub mod policy;
pub mod secret;
pub mod served_by;
pub mod traits;
pub mod weights;

pub use clock::{Clock, ManualClock, Stopwatch, SystemClock, Timestamp};
pub use error::Error;
pub use event::{Event, HealthState, Severity};
pub use health::ProviderHealth;
pub use id::{CohortId, IdError, ProviderId, RegionId};
pub use network::{Continent, Country, NetworkKey, Networks};
pub use policy::{Policy, PolicyError};
pub use secret::Secret;
pub use served_by::{CacheStatus, HeaderLookup, ServedBy, served_by};
pub use traits::*;
pub use weights::{TOTAL_BP, Weights, WeightsError};
