//! Reading the scoreboard for a round, as the Controller does after copying it: the
//! snapshots of every window of the policy's ladder in one pass
//! ([`Scoreboard::snapshots`]), then the cohort inputs over them
//! ([`cohort_inputs_over`]: every ASN judged on its own evidence, paired probes first, each
//! region on the networks it matches).
//!
//! The board is what a busy site's receivers hold: a realistic log
//! (`multicdn_steering::sim::beacons`, Zipf traffic over 20,000 ASNs, resolved through
//! 300,000 nested prefixes, navigation and probe beacons, six hours) of 1,000,000 beacons,
//! read at the log's end, so the windows from 15 minutes to the retention all hold data and
//! buckets of every age are summed.
//!
//! `cargo bench -p multicdn-steering --bench read -- --warm-up-time 1 --measurement-time 5`

// Setup code: a malformed fixture should stop the bench loudly.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use multicdn_core::{Policy, ProviderId, Timestamp};
use multicdn_steering::engine::cohorts::cohort_inputs_over;
use multicdn_steering::ingest::Ingestor;
use multicdn_steering::resolve::PrefixTable;
use multicdn_steering::scoreboard::{Metric, Scoreboard, ScoreboardConfig};
use multicdn_steering::scorer::P75Ttfb;
use multicdn_steering::sim::beacons::LogSpec;

const LINES: usize = 1_000_000;

const POLICY: &str = r#"
site: {host: www.example.com}
providers:
  fastly: {kind: fastly, edge_host: f.example.net, service_id: svc}
  cloudflare: {kind: cloudflare, edge_host: c.example.net, zone_id: zone}
  akamai: {kind: generic, edge_host: a.example.net}
health: {path: /h, expect: ok, regions: [a, b, c]}
steering:
  record: www.example.com
  zone: example.com
  regions:
    - name: europe
      match: [GB, IE, DE, FR, NL, ES, IT]
      weights: {fastly: 60%, cloudflare: 30%, akamai: 10%}
    - name: asia
      match: [JP, SG, IN, KR]
      weights: {fastly: 30%, cloudflare: 30%, akamai: 40%}
    - name: default
      match: ["*"]
      weights: {fastly: 40%, cloudflare: 40%, akamai: 20%}
  rum: {min_samples: 200, window: 15m}
"#;

fn read(c: &mut Criterion) {
    let spec = LogSpec {
        lines: LINES,
        ..LogSpec::default()
    };
    let prefixes = spec.prefixes();
    let table = PrefixTable::from_lines(&prefixes.to_text()).unwrap();
    let mut log = Vec::new();
    spec.write_lines(&prefixes, &mut log).unwrap();
    let policy = Policy::from_yaml(POLICY, "read.yaml").unwrap();
    let providers: Vec<ProviderId> = policy.provider_ids();
    let end = Timestamp::from_millis(spec.start_ms + spec.span.as_millis() as u64);
    let mut board = Scoreboard::new(
        ScoreboardConfig::from_policy(&policy.steering.rum),
        &providers,
    )
    .unwrap();
    Ingestor::new(&table)
        .replay_until(end)
        .ingest_reader(&log[..], &mut board)
        .unwrap();
    drop(log);
    let windows = policy.steering.rum.read_windows();
    let ladder = board.snapshots(end, &windows);
    let plan = policy.static_plan();
    let scorer = P75Ttfb::new(policy.steering.rum.min_samples);
    let cohorts = cohort_inputs_over(&policy, &ladder, Metric::Ttfb, &scorer, &plan);
    eprintln!(
        "read: {} cells, {} windows ({:?} .. {:?}), {} ASNs in the longest, {} cohorts",
        board.cells(),
        windows.len(),
        windows.first().unwrap(),
        windows.last().unwrap(),
        ladder.last().unwrap().asns(Metric::Ttfb).len(),
        cohorts.len()
    );
    // The board is as described: thousands of networks, the busiest judged on their own.
    assert!(board.cells() > 50_000, "{} cells", board.cells());
    assert!(cohorts.len() > 10, "{} cohorts", cohorts.len());

    let mut group = c.benchmark_group("read");
    group.throughput(Throughput::Elements(board.cells() as u64));
    group.sample_size(10);
    group.bench_function("snapshots_of_every_window", |b| {
        b.iter(|| board.snapshots(black_box(end), &windows));
    });
    group.bench_function("cohort_inputs", |b| {
        b.iter(|| cohort_inputs_over(&policy, black_box(&ladder), Metric::Ttfb, &scorer, &plan));
    });
    group.finish();
}

criterion_group!(benches, read);
criterion_main!(benches);
