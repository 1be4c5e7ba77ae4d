//! Varied, realistic, reproducible beacons for the sharded-ingest tests and bench: many ASNs
//! in several countries (some beacons with a country only, a few with no network), three
//! providers, navigation and probe beacons, spread over the scoreboard's hour of buckets.

#![allow(dead_code)]

use std::time::Duration;

use multicdn::core::{Country, ProviderId, Timestamp};
use multicdn::steering::beacon::{Beacon, ClientNetwork, NavigationBeacon, ProbeBeacon, Received};
use multicdn::steering::scoreboard::{Scoreboard, ScoreboardConfig};

pub(crate) const PROVIDERS: [&str; 3] = ["akamai", "cloudflare", "fastly"];
const COUNTRIES: [&str; 8] = ["DE", "FR", "GB", "US", "BR", "JP", "IN", "ZA"];
const POPS: [&str; 4] = ["FRA", "LHR", "IAD", "NRT"];

/// splitmix64: a fixed sequence from a seed.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A latency in ms, log-normal-ish, with sub-millisecond digits.
    pub(crate) fn ms(&mut self, base: f64) -> f64 {
        let u = (self.below(1_000_000) as f64 + 1.0) / 1_000_001.0;
        base * (1.0 + 3.0 * u * u) + (self.below(1000) as f64) / 997.0
    }
}

pub(crate) fn providers() -> Vec<ProviderId> {
    PROVIDERS
        .iter()
        .map(|p| ProviderId::new(p).unwrap())
        .collect()
}

/// The empty scoreboard every shard, the merge and the reference use.
pub(crate) fn base() -> Scoreboard {
    Scoreboard::new(ScoreboardConfig::default(), &providers()).unwrap()
}

/// The tests' beacons begin 40 minutes before the first call (the workers run on the system
/// clock and keep only the last three 15-minute buckets and the open one, so the beacons must
/// be recent), the same instant for every call in a test binary.
pub(crate) fn start() -> Timestamp {
    static START: std::sync::OnceLock<Timestamp> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        use multicdn::core::Clock as _;
        let now = multicdn::core::SystemClock.now();
        Timestamp::from_millis(now.as_millis().saturating_sub(40 * 60 * 1000))
    })
}

/// `n` beacons from `asns` networks over `span` from `from`.
pub(crate) fn beacons(
    seed: u64,
    n: usize,
    asns: u32,
    from: Timestamp,
    span: Duration,
) -> Vec<Received> {
    let mut rng = Rng::new(seed);
    let span_ms = span.as_millis().max(1) as u64;
    (0..n)
        .map(|i| {
            let at = from.plus(Duration::from_millis((i as u64 * span_ms) / n as u64));
            let asn = 1000 + rng.below(u64::from(asns)) as u32;
            let country = Country::new(COUNTRIES[(asn as usize) % COUNTRIES.len()]).unwrap();
            let network = match rng.below(20) {
                0 => ClientNetwork::new(None, None),
                1..=3 => ClientNetwork::new(None, Some(country)),
                _ => ClientNetwork::new(Some(asn), Some(country)),
            };
            let base = 20.0 + f64::from(asn % 97);
            let beacon = if rng.below(3) == 0 {
                let times = PROVIDERS.iter().map(|p| {
                    let t = (rng.below(25) != 0).then(|| rng.ms(base));
                    ((*p).to_owned(), t)
                });
                let times: Vec<_> = times.collect();
                Beacon::Probe(ProbeBeacon::new(times, PROVIDERS[rng.below(3) as usize]))
            } else {
                let provider = PROVIDERS[rng.below(3) as usize];
                let cache = if rng.below(5) == 0 { "MISS" } else { "HIT" };
                Beacon::Navigation(NavigationBeacon::new(
                    "/p/1",
                    rng.ms(base * 2.0),
                    provider,
                    POPS[rng.below(4) as usize],
                    cache,
                ))
            };
            Received {
                at,
                network,
                beacon,
            }
        })
        .collect()
}

/// What one process makes of `beacons`, the way the ingest workers apply them.
pub(crate) fn reference<'a>(beacons: impl IntoIterator<Item = &'a Received>) -> Scoreboard {
    let mut board = base();
    for r in beacons {
        match &r.beacon {
            Beacon::Navigation(nav) => {
                board.record_navigation(r.at, r.network, nav);
            }
            Beacon::Probe(p) => {
                board.record_probe(r.at, r.network, p, &[]);
            }
        }
    }
    board
}
