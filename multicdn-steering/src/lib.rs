//! # multicdn-steering
//!
//! Deciding where traffic goes: the RUM scoreboard (metric × network × provider × window), the
//! scorers, the pure decision engine with its guardrails and journal, content-steering
//! manifests for video players, and capacity-aware failover with quality caps.
//!
//! The loop, as this crate closes it:
//!
//! 1. **Beacons in** ([`beacon`], [`ingest`], [`resolve`]): navigation beacons (path, TTFB,
//!    provider, PoP, cache status) and probe beacons (times per provider) arrive as NDJSON; the
//!    receiver's address becomes an ASN and a country through a [`resolve::NetworkResolver`]
//!    (an in-memory prefix table, or MaxMind databases with the `maxmind` feature). A bad line is
//!    counted under its reason and skipped; it never stops the stream.
//! 2. **Scoreboard** ([`scoreboard`], [`sketch`]): samples land in short buckets per metric,
//!    provider and `(ASN, country)`; a snapshot rolls a window up into every cut (ASN, country,
//!    continent, `*`), each cell with a mergeable 1%-accurate quantile sketch, its sample count
//!    and age, marked steerable or insufficient-data, falling back ASN → country → continent →
//!    global when thin. Scoreboards serialise and merge, so shards on several machines combine.
//! 3. **Scorers** ([`scorer`]): p75 TTFB; availability first, then latency; cost-aware. The
//!    paired client probe decides wherever it runs (same user, same moment, every provider:
//!    no cache-share bias); navigation TTFB only where no probe runs
//!    ([`engine::cohorts`] says why). Each score carries its standard error.
//! 4. **Decision** ([`engine`]): `decide(now, inputs) -> Decision`, pure and deterministic. Health
//!    failover in steps, pins, significance, hysteresis, damping, floors, then the guardrails:
//!    hourly movement cap weighted by traffic, per-cohort cap, the deadman (stale inputs →
//!    static weights, never zero) and the big red switch. The engine's memory is explicit state,
//!    passed in and returned.
//! 5. **Journal** ([`journal`]): every change with its rule and evidence, in memory and as JSON
//!    Lines; queries by cohort, network and time; the loop's own health (moves per day,
//!    oscillation counted on RUM reversals only, realized improvement scoring both splits on
//!    one later measurement).
//! 6. **Simulator** ([`sim`]): a day with ground truth, the loop against static weights, each
//!    CDN alone and an oracle (the `simulate` example).
//!
//! `Inputs::data_as_of` should be [`scoreboard::Snapshot::newest_sample`]: the deadman then
//! fires when beacons stop, whatever the caller does.
//!
//! **Cohorts.** The policy's regions are cohorts with static weights. An ASN whose own cells
//! are steerable for every provider becomes its own cohort (when they go thin it holds, or
//! rejoins its region; it never moves on its country's cut), carved out of its region and starting
//! from the region's weights; a pinned network too. A region is scored on the traffic it serves
//! without its carved-out ASNs, and a cohort's share of all samples weights the hourly cap.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::time::Duration;
//! use multicdn_core::{Policy, Timestamp};
//! use multicdn_steering::engine::{EngineState, Inputs, Mode, cohorts::cohort_inputs, decide};
//! use multicdn_steering::ingest::Ingestor;
//! use multicdn_steering::resolve::PrefixTable;
//! use multicdn_steering::scoreboard::{Metric, Scoreboard, ScoreboardConfig};
//! use multicdn_steering::scorer::AvailabilityThenLatency;
//!
//! let policy = Policy::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/policy.yaml"))?;
//! let rum = &policy.steering.rum;
//! let mut board = Scoreboard::new(ScoreboardConfig::from_policy(rum), &policy.provider_ids())?;
//! let now = Timestamp::parse_rfc3339("2026-12-01T09:00:00Z")?;
//! let mut ingest =
//!     Ingestor::new(PrefixTable::from_lines("198.51.100.0/24 AS7922 US")?).received_at(now);
//! let mut lines = String::new();
//! for i in 0..400u64 {
//!     let (provider, ttfb) = if i % 2 == 0 { ("fastly", 240) } else { ("cloudflare", 90) };
//!     lines.push_str(&format!(
//!         "{{\"at\":{},\"ip\":\"198.51.100.7\",\"ttfb\":{ttfb},\"provider\":\"{provider}\"}}\n",
//!         now.as_millis() - i * 1000
//!     ));
//! }
//! ingest.ingest_bytes(lines.as_bytes(), &mut board);
//!
//! let snapshot = board.snapshot(now, rum.window.get());
//! let scorer = AvailabilityThenLatency::from_policy(rum);
//! let plan = policy.static_plan();
//! let cohorts = cohort_inputs(&policy, &snapshot, Metric::Ttfb, &scorer, &plan);
//! let decision = decide(now, &Inputs {
//!     policy: &policy,
//!     current: &plan,
//!     cohorts: &cohorts,
//!     health: &BTreeMap::new(),
//!     data_as_of: snapshot.newest_sample(),
//!     state: &EngineState::new(),
//! });
//! assert_eq!(decision.mode, Mode::Steering);
//! // AS7922 is pinned to 50/50 by the example policy (until 2026-12-24). Carved out of
//! // north-america (85/15), it heads for the pin within the guardrails: it carries all the
//! // traffic here, so the hourly cap (30%) holds the first move to 30 points.
//! let as7922 = decision.plan.cohort(&"as7922".parse()?).unwrap();
//! assert_eq!(as7922.weights.to_string(), "cloudflare 45%, fastly 55%");
//! let why = decision.journal.iter().find(|e| e.cohort.as_str() == "as7922").unwrap();
//! assert!(why.evidence.note.contains("peering maintenance"));
//! assert!(why.to_string().contains("capped by HourlyCap"), "{why}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Features
//! - `maxmind`: `resolve::MaxMindResolver`, reading MaxMind's ASN and country databases
//!   (`maxminddb`).

#![forbid(unsafe_code)]

pub mod beacon;
pub mod case;
pub mod engine;
pub mod error;
pub mod ingest;
pub mod journal;
pub mod resolve;
pub mod scoreboard;
pub mod scorer;
pub mod shared;
pub mod sim;
pub mod sketch;
pub mod video;
