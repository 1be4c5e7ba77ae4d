//! Memory per active scoreboard cell, counted from the structures' sizes (cells, their bucket
//! lists, the sketches' bins, the index). Run with `--nocapture` to see the figures.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests and their helpers fail loudly

use multicdn_core::{Country, ProviderId, Timestamp};
use multicdn_steering::beacon::ClientNetwork;
use multicdn_steering::scoreboard::{Metric, Sample, Scoreboard, ScoreboardConfig};

struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        let z = (-2.0 * self.unit().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.unit()).cos();
        median * (sigma * z).exp()
    }
}

fn board() -> Scoreboard {
    let providers = [
        ProviderId::new("fastly").unwrap(),
        ProviderId::new("cloudflare").unwrap(),
    ];
    Scoreboard::new(ScoreboardConfig::default(), &providers).unwrap()
}

fn fill(board: &mut Scoreboard, rng: &mut Rng, beacons: u64, networks: u32, sigma: f64) {
    let start = Timestamp::from_secs(1_800_000_000);
    for i in 0..beacons {
        // Heavy-tailed: a few networks carry most of the traffic.
        let asn = 1 + (rng.unit().powi(3) * f64::from(networks)) as u32;
        let country = Country::new(["US", "DE", "GB", "FR", "BR", "JP"][(asn % 6) as usize]).ok();
        board.insert(&Sample {
            at: Timestamp::from_millis(start.as_millis() + i * 3_600_000 / beacons),
            metric: Metric::Ttfb,
            provider: board
                .provider_slot(if rng.unit() < 0.5 {
                    "fastly"
                } else {
                    "cloudflare"
                })
                .unwrap(),
            network: ClientNetwork::new(Some(asn), country),
            value: Some(rng.lognormal(120.0, sigma).round().max(1.0)),
        });
    }
}

/// The bound every active cell must fit: two kilobytes.
const BUDGET: f64 = 2048.0;

#[test]
fn an_hour_of_heavy_tailed_traffic_costs_under_two_kilobytes_a_cell() {
    let mut b = board();
    let mut rng = Rng(42);
    fill(&mut b, &mut rng, 2_000_000, 20_000, 0.6);
    let per_cell = b.heap_bytes() as f64 / b.cells() as f64;
    eprintln!(
        "2,000,000 beacons over 20,000 ASNs x 2 providers in an hour: {} active cells, {:.0} bytes a cell",
        b.cells(),
        per_cell
    );
    assert!(per_cell <= BUDGET, "{per_cell:.0} bytes a cell");
}

#[test]
fn the_busiest_most_spread_cells_fit_two_kilobytes_too() {
    // One network, 100,000 samples a provider in the hour (four 15-minute buckets of 25,000),
    // log-normal around 120 ms: sigma 0.3 is a tight network, 1.0 one whose samples span
    // 2 ms to 7 s (the tails of about 300 bins of a 1% sketch).
    for sigma in [0.3, 0.6, 1.0] {
        let mut b = board();
        let mut rng = Rng(7);
        fill(&mut b, &mut rng, 200_000, 1, sigma);
        assert_eq!(b.cells(), 2);
        let per_cell = b.heap_bytes() as f64 / b.cells() as f64;
        eprintln!(
            "one network, 100,000 samples a provider an hour, log-normal sigma {sigma}: {per_cell:.0} bytes a cell"
        );
        assert!(
            per_cell <= BUDGET,
            "sigma {sigma}: {per_cell:.0} bytes a cell"
        );
    }
}
