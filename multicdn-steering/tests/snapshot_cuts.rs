//! Every cut of a snapshot holds exactly the samples of the networks it covers: an ASN's
//! across its countries, a country's across its ASNs (and the networks with no ASN), a
//! continent's across its countries, `*` across everything, the networks with no country
//! or no ASN included. Checked against sketches built straight from the samples.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use multicdn_core::{Country, NetworkKey, ProviderId, Timestamp};
use multicdn_steering::beacon::ClientNetwork;
use multicdn_steering::scoreboard::{
    Metric, Sample, Scoreboard, ScoreboardConfig, ScoreboardShards, ScoreboardSize, Snapshot,
};
use multicdn_steering::sketch::Sketch;

const T0: u64 = 1_700_000_000_000;

#[test]
fn every_cut_holds_the_samples_of_the_networks_it_covers() {
    let providers = [
        ProviderId::new("akamai").unwrap(),
        ProviderId::new("fastly").unwrap(),
    ];
    let mut board = Scoreboard::new(ScoreboardConfig::default(), &providers).unwrap();
    // Countries on three continents, one ASN in two countries, networks with no ASN, with
    // no country, with neither.
    let countries = ["US", "CA", "GB", "DE", "JP"];
    let mut want: BTreeMap<(NetworkKey, usize), (Sketch, u64)> = BTreeMap::new();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in 0..40_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let asn = match x % 50 {
            0..=4 => None,
            n => Some(64_500 + (n % 23) as u32),
        };
        let country = match (x >> 8) % 11 {
            0 => None,
            n => Some(Country::new(countries[(n % 5) as usize]).unwrap()),
        };
        let network = ClientNetwork::new(asn, country);
        let provider = ((x >> 16) % 2) as usize;
        // One failure in twenty: counted as a sample, not a time.
        let value = (!(x >> 20).is_multiple_of(20)).then_some(10.0 + ((x >> 24) % 900) as f64);
        let at = Timestamp::from_millis(T0 + i * 60);
        let sample = Sample {
            at,
            metric: Metric::Probe,
            provider: board.provider_slot(providers[provider].as_str()).unwrap(),
            network,
            value,
        };
        board.insert(&sample);
        let mut cuts = network.cuts();
        if cuts.is_empty() {
            cuts.push(NetworkKey::Global);
        }
        for cut in cuts {
            let e = want.entry((cut, provider)).or_insert((Sketch::new(), 0));
            e.1 += 1;
            if let Some(v) = value {
                e.0.insert(v);
            }
        }
    }
    let now = Timestamp::from_millis(T0 + 40_000 * 60);
    let snap = board.snapshot(now, Duration::from_secs(3 * 3600));
    let mut seen = 0;
    for ((cut, provider), (sketch, samples)) in &want {
        let view = snap.cell(Metric::Probe, *cut, &providers[*provider]);
        assert_eq!(
            view.stats.samples, *samples,
            "{cut} {}",
            providers[*provider]
        );
        assert_eq!(view.stats.p75, sketch.quantile(0.75), "{cut}");
        assert_eq!(view.stats.p99, sketch.quantile(0.99), "{cut}");
        seen += 1;
    }
    // ASNs, countries, continents and `*`, for both providers.
    assert_eq!(seen, 2 * (23 + 5 + 3 + 1));
    assert!(
        want.keys()
            .any(|(k, _)| matches!(k, NetworkKey::Continent(_)))
    );
    // And nothing else: every cut the snapshot lists is one the samples made.
    for network in snap.networks(Metric::Probe) {
        assert!(
            want.contains_key(&(network, 0)) || want.contains_key(&(network, 1)),
            "{network}"
        );
    }
}

/// The providers of [`fill`].
fn three_providers() -> [ProviderId; 3] {
    [
        ProviderId::new("akamai").unwrap(),
        ProviderId::new("cloudfront").unwrap(),
        ProviderId::new("fastly").unwrap(),
    ]
}

/// Enough networks for the threads to be used (65,536 cells or more): 25,000 ASNs, some in
/// two countries, with probe times (and pairs), navigations and hits, over 3 hours; the
/// `i`-th load goes into `boards[pick(i)]`.
fn fill(boards: &mut [Scoreboard], pick: impl Fn(u64) -> usize) {
    let providers = three_providers();
    let countries = ["US", "CA", "GB", "DE", "JP", "BR", "IN"];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..400_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let asn = (x % 25_000) as u32;
        let country = countries[((asn as u64 + (x >> 40) % 2) % 7) as usize];
        let network = ClientNetwork::new(
            (!asn.is_multiple_of(31)).then_some(10_000 + asn),
            (!asn.is_multiple_of(29)).then(|| Country::new(country).unwrap()),
        );
        let at = Timestamp::from_millis(T0 + i * 27);
        let ms = 15.0 + ((x >> 20) % 700) as f64;
        let board = &mut boards[pick(i)];
        let slots: Vec<_> = providers
            .iter()
            .map(|p| board.provider_slot(p.as_str()).unwrap())
            .collect();
        let slot = slots[((x >> 12) % 3) as usize];
        if i.is_multiple_of(4) {
            let times: Vec<_> = slots
                .iter()
                .enumerate()
                .map(|(n, s)| (*s, Some(ms * (1.0 + n as f64 / 10.0))))
                .collect();
            for (s, v) in &times {
                board.insert(&Sample {
                    at,
                    metric: Metric::Probe,
                    provider: *s,
                    network,
                    value: *v,
                });
            }
            board.insert_pairs(at, network, &times);
        } else {
            board.insert_navigation(at, slot, network, ms, i.is_multiple_of(3));
        }
    }
}

/// Every cut, dominant country and pairing of `b` is `a`'s.
fn same_snapshots(a: &[Snapshot], b: &[Snapshot]) {
    let providers = three_providers();
    assert_eq!(a.len(), b.len());
    for (a, b) in a.iter().zip(b) {
        for metric in [Metric::Ttfb, Metric::TtfbHit, Metric::Probe] {
            let networks = a.networks(metric);
            assert!(networks.len() > 1_000, "{metric:?}: {}", networks.len());
            assert_eq!(networks, b.networks(metric));
            for n in &networks {
                for p in &providers {
                    assert_eq!(a.cell(metric, *n, p), b.cell(metric, *n, p), "{n} {p}");
                }
            }
        }
        for asn in a.asns(Metric::Ttfb) {
            assert_eq!(a.country_of_asn(asn), b.country_of_asn(asn), "AS{asn}");
            let cut = NetworkKey::Asn(asn);
            assert_eq!(
                a.pairing(cut, &providers[0], &providers[2]),
                b.pairing(cut, &providers[0], &providers[2]),
            );
        }
    }
}

const NOW: u64 = T0 + 400_000 * 27;
const WINDOWS: [Duration; 2] = [Duration::from_secs(1_800), Duration::from_secs(3 * 3_600)];

#[test]
fn a_snapshot_read_on_several_threads_is_the_one_read_on_one() {
    let mut board = Scoreboard::new(ScoreboardConfig::default(), &three_providers()).unwrap();
    fill(std::slice::from_mut(&mut board), |_| 0);
    assert!(board.cells() >= 65_536, "{} cells", board.cells());
    let now = Timestamp::from_millis(NOW);
    let one = board.snapshots_on(now, &WINDOWS, 1);
    assert_eq!(one.len(), 2);
    same_snapshots(&one, &board.snapshots_on(now, &WINDOWS, 3));
}

/// The settings shards are made with, the whole stream in one scoreboard, and its snapshots.
fn whole_stream() -> (ScoreboardConfig, Scoreboard, Vec<Snapshot>) {
    // Kept as long as the longest window: a scoreboard drops a cell's buckets past the
    // retention as its newer ones open, which a shard holding only the older ones cannot.
    let config = ScoreboardConfig::default().retention(WINDOWS[1]);
    let mut whole = Scoreboard::new(config.clone(), &three_providers()).unwrap();
    fill(std::slice::from_mut(&mut whole), |_| 0);
    let want = whole.snapshots_on(Timestamp::from_millis(NOW), &WINDOWS, 1);
    (config, whole, want)
}

/// Two shards fed block by block, as the parallel ingest feeds them, read on a thread each:
/// the keys both hold, those only one holds, whichever thread's ASNs they are, read once.
#[test]
fn two_shards_read_on_a_thread_each_read_as_one_scoreboard() {
    let (config, whole, want) = whole_stream();
    let (providers, now) = (three_providers(), Timestamp::from_millis(NOW));
    let mut shards: Vec<Scoreboard> = (0..2)
        .map(|_| Scoreboard::new(config.clone(), &providers).unwrap())
        .collect();
    fill(&mut shards, |i| ((i / 5_000) % 2) as usize);
    let shared = shards[0].cells() + shards[1].cells() - whole.cells();
    assert!(
        shared > 10_000 && shared < whole.cells() - 10_000,
        "{shared} shared"
    );
    let shards = ScoreboardShards::new(shards).unwrap();
    assert_eq!(shards.cells(), whole.cells());
    same_snapshots(&want, &same_size(&shards, now, 2));
}

/// The shards' snapshots on `threads` threads, whose size counted in the read is the one
/// [`ScoreboardShards::cells`] and [`ScoreboardShards::heap_bytes`] count.
fn same_size(shards: &ScoreboardShards, now: Timestamp, threads: usize) -> Vec<Snapshot> {
    let (snapshots, size) = shards.snapshots_sized_on(now, &WINDOWS, threads);
    assert_eq!(
        size,
        ScoreboardSize {
            cells: shards.cells(),
            heap_bytes: shards.heap_bytes()
        },
        "{threads} threads"
    );
    snapshots
}

/// Shards of one stream, read as one without merging them, read as the whole stream in one
/// scoreboard does: on one thread and on several, whether the shards started out naming the
/// same providers or not, and once merged.
#[test]
fn shards_read_as_one_read_as_one_scoreboard() {
    let (config, whole, want) = whole_stream();
    let (providers, now) = (three_providers(), Timestamp::from_millis(NOW));

    // Four shards, one of them naming a provider more, which sorts between the others (so
    // the other shards renumber their cells when the four are read together); loads dealt
    // out in runs, so a network's cells are in every shard, with buckets several hold.
    let mut shards: Vec<Scoreboard> = (0..3)
        .map(|_| Scoreboard::new(config.clone(), &providers).unwrap())
        .collect();
    let mut more = providers.to_vec();
    more.push(ProviderId::new("bunny").unwrap());
    shards.push(Scoreboard::new(config.clone(), &more).unwrap());
    fill(&mut shards, |i| ((i / 7) % 4) as usize);
    let shards = ScoreboardShards::new(shards).unwrap();
    more.sort();
    assert_eq!(shards.providers(), &more[..]);
    assert_eq!(shards.cells(), whole.cells());
    assert_eq!(shards.quality(), whole.quality());
    same_snapshots(&want, &same_size(&shards, now, 1));
    same_snapshots(&want, &same_size(&shards, now, 3));
    // A thread a shard, each walking its own (keys some shards lack handed to their owner).
    same_snapshots(&want, &same_size(&shards, now, 4));
    let merged = shards.merged();
    assert_eq!(merged.cells(), whole.cells());
    same_snapshots(&want, &merged.snapshots_on(now, &WINDOWS, 2));
}
