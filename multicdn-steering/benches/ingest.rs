//! Ingestion throughput on a realistic log (`multicdn_steering::sim::beacons`): Zipf traffic
//! over 20,000 ASNs, addresses resolved through a routing-table-like table of 300,000 nested
//! IPv4 and IPv6 prefixes, navigation and probe beacons in any field order with extra fields
//! and escaped strings, a few bad lines, and six hours of timestamps so buckets roll and pack
//! while the log is read. Each iteration reads a different log (three seeds) into a fresh
//! scoreboard, as the `scoreboard` tool does; the `_and_window_` runs then read the last hour's
//! window too, on two threads from two shards read apart, as the tool's `--threads 2` does.
//!
//! `cargo bench -p multicdn-steering --bench ingest -- --warm-up-time 2 --measurement-time 10`

// Setup code: a malformed fixture should stop the bench loudly.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use multicdn_core::{Country, ProviderId, Timestamp};
use multicdn_steering::beacon::ClientNetwork;
use multicdn_steering::ingest::Ingestor;
use multicdn_steering::resolve::{NetworkResolver, PrefixTable};
use multicdn_steering::scoreboard::{
    Metric, Sample, Scoreboard, ScoreboardConfig, ScoreboardShards,
};
use multicdn_steering::sim::beacons::LogSpec;

/// Lines a log: about 55 MB, a few minutes of a busy site's beacons.
const LINES: usize = 400_000;

fn ingest(c: &mut Criterion) {
    let base = LogSpec {
        lines: LINES,
        ..LogSpec::default()
    };
    let prefixes = base.prefixes();
    let table = PrefixTable::from_lines(&prefixes.to_text()).unwrap();
    let logs: Vec<Vec<u8>> = (1..=3)
        .map(|seed| {
            let mut out = Vec::new();
            LogSpec {
                seed,
                ..base.clone()
            }
            .write_lines(&prefixes, &mut out)
            .unwrap();
            out
        })
        .collect();
    let providers: Vec<ProviderId> = base
        .providers
        .iter()
        .map(|p| ProviderId::new(p.as_str()).unwrap())
        .collect();
    let end = Timestamp::from_millis(base.start_ms + base.span.as_millis() as u64);
    let config = ScoreboardConfig::default();
    eprintln!(
        "ingest: {LINES} lines a log, {:.0} bytes a line, {} prefixes in {} ranges",
        logs[0].len() as f64 / LINES as f64,
        prefixes.len(),
        table.ranges()
    );

    let mut group = c.benchmark_group("ingest");
    group.throughput(Throughput::Elements(LINES as u64));
    group.sample_size(20);
    for threads in [1usize, 2] {
        let mut next = 0;
        let mut lines = 0u64;
        let mut bad = 0u64;
        group.bench_function(format!("realistic_log_{threads}_thread"), |b| {
            b.iter_batched_ref(
                || {
                    next += 1;
                    (
                        Scoreboard::new(config.clone(), &providers).unwrap(),
                        &logs[next % logs.len()],
                    )
                },
                |(board, log)| {
                    let mut ingest = Ingestor::new(&table).replay_until(end);
                    ingest
                        .ingest_reader_parallel(black_box(&log[..]), board, threads)
                        .unwrap();
                    lines += ingest.report().lines;
                    bad += ingest.report().bad_total();
                },
                BatchSize::PerIteration,
            )
        });
        // The log is as described: every line read, about 0.2% of them bad.
        let share = bad as f64 / lines.max(1) as f64;
        assert!(
            lines > 0 && (0.001..0.004).contains(&share),
            "{bad} bad of {lines}"
        );
    }

    // Read and then the window read, as the `scoreboard` tool does: one thread, or two
    // shards read apart (not merged) and the window read on both threads.
    let window = std::time::Duration::from_secs(3600);
    for threads in [1usize, 2] {
        let mut next = 0;
        group.bench_function(format!("realistic_log_and_window_{threads}_thread"), |b| {
            b.iter_batched(
                || {
                    next += 1;
                    let boards = (0..threads)
                        .map(|_| Scoreboard::new(config.clone(), &providers).unwrap())
                        .collect();
                    (
                        ScoreboardShards::new(boards).unwrap(),
                        &logs[next % logs.len()],
                    )
                },
                |(mut shards, log)| {
                    let mut ingest = Ingestor::new(&table).replay_until(end);
                    ingest
                        .ingest_reader_shards(black_box(&log[..]), &mut shards)
                        .unwrap();
                    let snapshot = shards.snapshot_on(end, window, threads);
                    assert!(snapshot.newest_sample().is_some());
                    (shards, snapshot)
                },
                BatchSize::PerIteration,
            )
        });
    }

    // The same beacons, already parsed and resolved: the scoreboard's own cost.
    let mut probe = Ingestor::new(&table).replay_until(end);
    let mut board = Scoreboard::new(config.clone(), &providers).unwrap();
    probe.ingest_reader(&logs[0][..], &mut board).unwrap();
    let samples: Vec<Sample> = logs[0]
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let network = match v["ip"].as_str() {
                Some(ip) => table.resolve(ip.parse().ok()?),
                None => ClientNetwork::new(
                    v["asn"].as_u64().and_then(|a| u32::try_from(a).ok()),
                    v["country"].as_str().and_then(|c| Country::new(c).ok()),
                ),
            };
            Some(Sample {
                at: Timestamp::from_millis(v["at"].as_u64()?),
                metric: Metric::Ttfb,
                provider: board.provider_slot(v["provider"].as_str()?)?,
                network,
                value: v["ttfb"].as_f64(),
            })
        })
        .collect();
    group.throughput(Throughput::Elements(samples.len() as u64));
    group.bench_function("insert_parsed", |b| {
        b.iter_batched_ref(
            || Scoreboard::new(config.clone(), &providers).unwrap(),
            |board| {
                for s in &samples {
                    board.insert(black_box(s));
                }
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, ingest);
criterion_main!(benches);
