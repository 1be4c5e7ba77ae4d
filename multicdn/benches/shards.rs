//! The controller's merge of the shards' snapshots: 100,000 cells (50,000 ASNs in 8
//! countries, two metrics) x 3 providers spread over 4 shards by [`shard_of`], every cell
//! with samples in each of the hour's four 15-minute buckets (300,000 base cells, about
//! 75,000 a shard).
//!
//! ```text
//! cargo bench -p multicdn --features nats --bench shards
//! ```
//!
//! `merge` adds the four shard scoreboards into the controller's empty one (what
//! `ShardSet::read` does once the snapshots are read); `decode+merge` starts from the
//! snapshots' JSON as the key-value bucket holds it. Throughput is in base cells.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use criterion::{Criterion, Throughput};
use multicdn::core::{Country, ProviderId, Timestamp};
use multicdn::shards::shard_of;
use multicdn::steering::beacon::ClientNetwork;
use multicdn::steering::scoreboard::{Metric, Sample, Scoreboard, ScoreboardConfig};

const ASNS: u32 = 50_000;
const SHARDS: u16 = 4;
const COUNTRIES: [&str; 8] = ["DE", "FR", "GB", "US", "BR", "JP", "IN", "ZA"];

fn base() -> Scoreboard {
    let providers: Vec<ProviderId> = ["akamai", "cloudflare", "fastly"]
        .iter()
        .map(|p| ProviderId::new(p).unwrap())
        .collect();
    Scoreboard::new(ScoreboardConfig::default(), &providers).unwrap()
}

fn shard_boards() -> Vec<Scoreboard> {
    let start = Timestamp::parse_rfc3339("2026-12-01T09:00:00Z").unwrap();
    let mut boards: Vec<Scoreboard> = (0..SHARDS).map(|_| base()).collect();
    let countries: Vec<Country> = COUNTRIES.iter().map(|c| Country::new(c).unwrap()).collect();
    let slots: Vec<_> = {
        let b = base();
        ["akamai", "cloudflare", "fastly"]
            .iter()
            .map(|p| b.provider_slot(p).unwrap())
            .collect()
    };
    for asn in 0..ASNS {
        let network = ClientNetwork::new(Some(10_000 + asn), Some(countries[asn as usize % 8]));
        let board = &mut boards[usize::from(shard_of(&network, SHARDS))];
        for (m, metric) in [Metric::Ttfb, Metric::Probe].into_iter().enumerate() {
            for (p, provider) in slots.iter().enumerate() {
                // Four buckets, three samples each, varied values.
                for k in 0..12u64 {
                    let at = start.plus(Duration::from_secs(k * 290 + u64::from(asn % 60)));
                    let value = 20.0
                        + f64::from((asn * 7 + k as u32 * 13 + m as u32 * 5 + p as u32 * 3) % 900)
                            * 1.37;
                    board.insert(&Sample {
                        at,
                        metric,
                        provider: *provider,
                        network,
                        value: Some(value),
                    });
                }
            }
        }
    }
    boards
}

fn main() {
    let boards = shard_boards();
    let cells: usize = boards.iter().map(Scoreboard::cells).sum();
    assert_eq!(cells, 300_000);
    let json: Vec<Vec<u8>> = boards
        .iter()
        .map(|b| serde_json::to_vec(b).unwrap())
        .collect();
    let empty = base();
    let mut c = Criterion::default().configure_from_args().sample_size(10);
    let mut g = c.benchmark_group("shards");
    g.throughput(Throughput::Elements(cells as u64));
    g.bench_function("merge", |b| {
        b.iter(|| {
            let mut merged = empty.clone();
            for s in &boards {
                merged.merge(s).unwrap();
            }
            merged.cells()
        })
    });
    g.bench_function("decode+merge", |b| {
        b.iter(|| {
            let mut merged = empty.clone();
            for bytes in &json {
                let s: Scoreboard = serde_json::from_slice(bytes).unwrap();
                merged.merge(&s).unwrap();
            }
            merged.cells()
        })
    });
    g.finish();
    let bytes: usize = json.iter().map(Vec::len).sum();
    println!(
        "snapshots: {} cells, {:.1} MB of JSON over {SHARDS} shards ({:.0} bytes a cell)",
        cells,
        bytes as f64 / 1e6,
        bytes as f64 / cells as f64
    );
    c.final_summary();
}
