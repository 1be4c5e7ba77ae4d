//! Ingestion throughput: NDJSON lines parsed, resolved and inserted; and already-parsed
//! samples inserted.
//!
//! `cargo bench -p multicdn-steering --bench ingest -- --warm-up-time 1 --measurement-time 3`

// Setup code: a malformed fixture should stop the bench loudly.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use multicdn_core::{Country, ProviderId, Timestamp};
use multicdn_steering::beacon::ClientNetwork;
use multicdn_steering::ingest::Ingestor;
use multicdn_steering::resolve::{NetworkResolver, PrefixTable};
use multicdn_steering::scoreboard::{Metric, Sample, Scoreboard, ScoreboardConfig};

const LINES: usize = 100_000;
const PREFIXES: u32 = 20_000;
const COUNTRIES: [&str; 12] = [
    "US", "DE", "GB", "FR", "BR", "JP", "IN", "AU", "CA", "NL", "ES", "IT",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

/// 20,000 /24 prefixes over 5,000 ASNs, as a routing table would give.
fn table() -> (PrefixTable, Vec<u32>) {
    let mut rng = Rng(7);
    let mut b = PrefixTable::builder();
    let mut bases = Vec::new();
    for i in 0..PREFIXES {
        let base = (rng.next() as u32 % 0xDF00_0000 + 0x0100_0000) & 0xFFFF_FF00;
        let asn = 1000 + (i % 5000);
        let country = Country::new(COUNTRIES[(asn % 12) as usize]).ok();
        b.insert(
            &format!("{}/24", Ipv4Addr::from(base)),
            ClientNetwork::new(Some(asn), country),
        )
        .unwrap();
        bases.push(base);
    }
    (b.build(), bases)
}

fn lines(bases: &[u32], now: Timestamp) -> Vec<u8> {
    let mut rng = Rng(11);
    let mut out = Vec::with_capacity(LINES * 150);
    for i in 0..LINES {
        // Traffic is heavy-tailed: a few networks carry most of it.
        let pick = ((rng.unit().powi(3)) * bases.len() as f64) as usize;
        let ip = Ipv4Addr::from(bases[pick] | (rng.next() as u32 & 0xFF));
        let provider = if rng.next().is_multiple_of(2) {
            "fastly"
        } else {
            "cloudflare"
        };
        let z = (-2.0 * rng.unit().ln()).sqrt() * (2.0 * std::f64::consts::PI * rng.unit()).cos();
        let ttfb = (120.0 * (0.6 * z).exp()).round();
        let at = now.as_millis() - (i as u64 % 3_000_000);
        out.extend_from_slice(
            format!(
                "{{\"at\":{at},\"ip\":\"{ip}\",\"path\":\"/products/{}\",\"ttfb\":{ttfb},\"provider\":\"{provider}\",\"pop\":\"LHR\",\"cache\":\"HIT\"}}\n",
                i % 997
            )
            .as_bytes(),
        );
    }
    out
}

fn providers() -> Vec<ProviderId> {
    vec![
        ProviderId::new("fastly").unwrap(),
        ProviderId::new("cloudflare").unwrap(),
    ]
}

fn ingest(c: &mut Criterion) {
    let now = Timestamp::from_secs(1_800_000_000);
    let (table, bases) = table();
    let text = lines(&bases, now);
    let mut group = c.benchmark_group("ingest");
    group.throughput(Throughput::Elements(LINES as u64));
    eprintln!(
        "ingest: {LINES} lines, {:.0} bytes a line, {} prefix ranges",
        text.len() as f64 / LINES as f64,
        table.ranges()
    );

    let mut board = Scoreboard::new(ScoreboardConfig::default(), &providers()).unwrap();
    let mut ingestor = Ingestor::new(&table).received_at(now);
    group.bench_function("ndjson_parse_resolve_insert", |b| {
        b.iter(|| {
            ingestor.ingest_bytes(black_box(&text), &mut board);
        })
    });
    assert_eq!(
        ingestor.report().bad_total(),
        0,
        "{:?}",
        ingestor.report().bad_lines()
    );

    // The same beacons, already parsed and resolved.
    let mut parsed_board = Scoreboard::new(ScoreboardConfig::default(), &providers()).unwrap();
    let mut rng = Rng(13);
    let samples: Vec<Sample> = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(l).unwrap();
            let ip = v["ip"].as_str().unwrap().parse().unwrap();
            Sample {
                at: Timestamp::from_millis(v["at"].as_u64().unwrap()),
                metric: Metric::Ttfb,
                provider: parsed_board
                    .provider_slot(v["provider"].as_str().unwrap())
                    .unwrap(),
                network: table.resolve(ip),
                value: Some(v["ttfb"].as_f64().unwrap() + (rng.next() % 3) as f64),
            }
        })
        .collect();
    group.bench_function("insert_parsed", |b| {
        b.iter(|| {
            for s in &samples {
                parsed_board.insert(black_box(s));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, ingest);
criterion_main!(benches);
