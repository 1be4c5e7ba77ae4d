//! NS1: one filter-chain record per steered name, data feeds for up/down, read back and
//! dry run.
//!
//! # The record
//!
//! A plan becomes one `CNAME` record whose **region groups** are the plan's cohorts, most
//! specific first (ASN groups, then country groups, then continent groups, then the
//! catch-all): a group carries `asn` metadata (a list of numbers), or `country` metadata
//! (continents expanded to their countries, since NS1 has no continent selector), or none
//! (the catch-all). Each group holds three tiers of answers, one answer per provider and
//! tier, the value being the provider's edge host:
//!
//! | tier | `priority` | `weight` | `up` |
//! |---|---|---|---|
//! | primary: providers the cohort gives a share | 1 | the share in basis points (NS1 normalises) | the provider's data feed (or `true` without one) |
//! | standby: providers the cohort gives 0% | 2 | 1 | the provider's data feed |
//! | last resort: the primary split again | 3 | the share in basis points | always `true` |
//!
//! The filter chain is `up`, `netfence_asn` (only when there are ASN groups),
//! `geofence_country`, `select_first_region`, `priority`,
//! `weighted_shuffle`, `select_first_n`: the client's group is chosen, down answers are
//! dropped, the best remaining tier answers by weight, and because the last-resort tier is
//! always up the chain can never answer empty.
//!
//! Before anything is sent, a plan is refused if it names a provider without an edge host,
//! steers a name outside the zone, or has a cohort mixing ASNs, places and the catch-all
//! (each is its own kind of region group).
//!
//! # Data feeds
//!
//! [`Ns1Steerer::provision_feeds`] makes one data source and one feed per provider (labelled
//! with the provider id); [`Ns1Steerer::set_up`] publishes `{"fastly":{"up":false}}` to move
//! answers without rewriting the record.
//!
//! # Monitors
//!
//! [`Ns1Steerer::provision_monitors`] makes one `http` monitoring job per provider from the
//! policy's health section and feeds each provider's live answers' `up` from its job (see
//! [`monitor`]), so NS1 drops a provider whose monitor fails even while the controller is
//! down; the `up` filter is first in the chain.
//!
//! # Rate limits
//!
//! A `429` is retried after its `Retry-After`, or when there is none, after the time one
//! token takes to refill (`X-RateLimit-Period` / `X-RateLimit-Limit`).

mod client;
pub mod monitor;
pub mod record;
mod steerer;

pub use client::{DEFAULT_BASE, Ns1Client, provider_id, rate_limit_wait};
pub use monitor::MonitorSpec;
pub use record::{Ns1Answer, Ns1Filter, Ns1Record, Ns1Region};
pub use steerer::{Ns1Diff, Ns1Steerer};
