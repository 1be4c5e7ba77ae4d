//! Memory per scoreboard cell, measured by a counting global allocator (dhat's), not by the
//! scoreboard's own estimate: on a realistic log, and on the busiest cells (every bucket of
//! the retention full of widely spread times, the sketch's worst case).
//!
//! `cargo test -p multicdn-steering --test memory_per_cell -- --nocapture` prints the figures.

#![allow(clippy::unwrap_used)] // a test: a broken fixture should stop it loudly

use multicdn_core::{Country, ProviderId, Timestamp};
use multicdn_steering::beacon::ClientNetwork;
use multicdn_steering::ingest::Ingestor;
use multicdn_steering::resolve::PrefixTable;
use multicdn_steering::scoreboard::{Metric, Sample, Scoreboard, ScoreboardConfig};
use multicdn_steering::sim::beacons::LogSpec;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// The most a cell may hold on the heap, its share of the index included.
const MAX_PER_CELL: u64 = 2048;

fn heap() -> u64 {
    dhat::HeapStats::get().curr_bytes as u64
}

// One test: dhat counts for the whole process, so nothing may run beside it.
#[test]
fn a_cell_holds_at_most_2_kib_the_busiest_included() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let spec = LogSpec {
        lines: 300_000,
        v4_prefixes: 60_000,
        v6_prefixes: 10_000,
        asns: 8_000,
        ..LogSpec::default()
    };
    let prefixes = spec.prefixes();
    let table = PrefixTable::from_lines(&prefixes.to_text()).unwrap();
    let mut log = Vec::new();
    spec.write_lines(&prefixes, &mut log).unwrap();
    drop(prefixes);
    let providers: Vec<ProviderId> = spec
        .providers
        .iter()
        .map(|p| ProviderId::new(p.as_str()).unwrap())
        .collect();
    let end = Timestamp::from_millis(spec.start_ms + spec.span.as_millis() as u64);

    // A realistic log: six hours of Zipf traffic into the default one-hour retention.
    let before = heap();
    let mut board = Scoreboard::new(ScoreboardConfig::default(), &providers).unwrap();
    {
        let mut ingest = Ingestor::new(&table).replay_until(end);
        ingest.ingest_reader(&log[..], &mut board).unwrap();
        assert!(ingest.report().beacons > 290_000, "{:?}", ingest.report());
    }
    board.expire(end);
    let held = heap() - before;
    let cells = board.cells() as u64;
    let per_cell = held / cells;
    eprintln!(
        "realistic log: {cells} cells, {held} bytes, {per_cell} bytes a cell (the scoreboard estimates {})",
        board.heap_bytes() as u64 / cells
    );
    assert!(cells > 10_000, "{cells} cells");
    assert!(per_cell <= MAX_PER_CELL, "{per_cell} bytes a cell");
    drop(board);
    drop(log);

    // The busiest cells: 2,000 networks, each bucket of the retention filled with 4,000 times
    // spread over four orders of magnitude (1 ms to 10 s).
    let before = heap();
    let config = ScoreboardConfig::default();
    let mut board = Scoreboard::new(config.clone(), &providers).unwrap();
    let slot = board.provider_slot("fastly").unwrap();
    let start = 1_796_083_200_000u64;
    let buckets = config.retention.as_millis() as u64 / config.bucket.as_millis() as u64 + 1;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for asn in 0..2_000u32 {
        let network = ClientNetwork::new(Some(64_000 + asn), Country::new("DE").ok());
        for bucket in 0..buckets {
            for i in 0..4_000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let value = 10f64.powf((x % 40_000) as f64 / 10_000.0);
                let at = start + bucket * config.bucket.as_millis() as u64 + i * 200;
                board.insert(&Sample {
                    at: Timestamp::from_millis(at),
                    metric: Metric::Ttfb,
                    provider: slot,
                    network,
                    value: Some(value),
                });
            }
        }
    }
    let held = heap() - before;
    let cells = board.cells() as u64;
    let per_cell = held / cells;
    eprintln!(
        "busiest cells: {cells} cells, {buckets} full buckets each, {per_cell} bytes a cell (the scoreboard estimates {})",
        board.heap_bytes() as u64 / cells
    );
    assert_eq!(cells, 2_000);
    assert!(per_cell <= MAX_PER_CELL, "{per_cell} bytes a cell");
}
