//! Route 53: weighted and geolocation record sets, health checks, read back and dry run.
//!
//! Requests are signed with `aws-sigv4` (service `route53`, region `us-east-1`) at the time a
//! [`Clock`](multicdn_core::Clock) gives; credentials come from [`AwsCredentials::new`] or the
//! standard `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN` variables
//! ([`AwsCredentials::from_env`]); the endpoint is configurable (an emulator on loopback).
//!
//! # The record layout
//!
//! A plan for `www.example.com` becomes, for each cohort (say `europe`, matching `DE` and
//! `continent:AS`, split fastly 90% / cloudflare 10%):
//!
//! ```text
//! europe._steer.www.example.com  CNAME  weighted  [europe-cloudflare] weight  26  -> example.cdn.cloudflare.net  (cloudflare's check)
//! europe._steer.www.example.com  CNAME  weighted  [europe-fastly]     weight 229  -> example.map.fastly.net      (fastly's check)
//! www.example.com                CNAME  geo DE    [geo-DE]            alias -> europe._steer.www.example.com (evaluate target health)
//! www.example.com                CNAME  geo AS    [geo-continent-AS]  alias -> europe._steer.www.example.com (evaluate target health)
//! www.example.com                CNAME  geo *     [geo-default]       alias -> default._steer.www.example.com (evaluate target health)
//! ```
//!
//! Geolocation **alias** records at the record name pick a cohort's **pool** (`AliasTarget`:
//! this hosted zone, the pool's name, `EvaluateTargetHealth`); the pool's weighted,
//! health-checked sets pick a provider (the layout octoDNS uses). An alias to a CNAME set must
//! itself be of type CNAME, so the record cannot be the zone apex (refused before anything is
//! sent). Route 53 answers from the weighted sets whose checks pass, so a failed provider
//! leaves DNS even while the controller is down. Weights are the
//! plan's basis points on Route 53's 0–255 scale by largest remainder, so they sum to 255 and
//! a whole-percent split reads back exactly. A provider a cohort gives 0% keeps a weight-0
//! set, which Route 53 serves only when every other set in the pool is unhealthy; and when
//! every set is unhealthy Route 53 answers with all of them (it fails open).
//!
//! An older deployment whose geolocation sets were plain CNAMEs to the pools (a CNAME chain)
//! reads back as the same state; applying replaces each with its alias (a `DELETE` beside a
//! `CREATE` in one batch).
//!
//! Changes are ordered so a target exists before what points at it (pools, then the
//! geolocation sets, then deletions of geolocation sets, then of pools), a `DELETE` repeats
//! the set exactly as read, and they are sent as one atomic batch unless they exceed 1,000
//! records, when they are split in that order. [`ApplyOptions::wait_for_sync`](multicdn_core::ApplyOptions)
//! polls each batch until `INSYNC`.
//!
//! Before anything is sent, a plan is refused if it names a provider without an edge host, steers
//! a name outside the hosted zone, matches an ASN (Route 53 cannot), gives a provider a share
//! that rounds to weight 0 (under about 0.2%), or lists a network twice.
//!
//! # Health checks
//!
//! [`Route53Steerer::provision_health_checks`] makes one `HTTPS_STR_MATCH` check per provider
//! from the policy's health section (see [`health`]), idempotently (found by a caller reference
//! derived from the configuration; a check edited by hand is put back), and attaches them to
//! the weighted sets; [`Route53Steerer::find_health_checks`] does the lookup alone, for a dry
//! run; and
//! [`Route53Client::health_observations`] reads each checker's report back as
//! [`Observation`](multicdn_core::Observation)s for the health quorum.
//!
//! # Errors
//!
//! `Throttling` and `PriorRequestNotComplete` (HTTP 400) are retried with backoff;
//! `InvalidChangeBatch` and every other Route 53 error surface as
//! [`Error::Vendor`](multicdn_core::Error) with Route 53's code and all of its messages.

pub mod changes;
mod client;
pub mod health;
pub mod layout;
mod steerer;
pub mod xml;

pub use changes::{Action, Change, RecordSetDiff};
pub use client::{
    AwsCredentials, DEFAULT_ENDPOINT, ExistingHealthCheck, HealthCheckLookup, Route53Client,
    bare_zone_id, provider_id,
};
pub use health::{CheckType, HealthCheckSpec};
pub use layout::{AliasTarget, GeoLocation, RecordSet};
pub use steerer::Route53Steerer;
pub use xml::ChangeInfo;
