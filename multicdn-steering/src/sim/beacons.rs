//! A realistic beacon log and the prefix table that resolves it: the input the ingest benches,
//! the `beacongen` tool and the DuckDB comparison (`scripts/ingest-vs-duckdb`) read.
//!
//! Nothing here is shaped to be easy for our parser. Every default is what a receiver's log
//! looks like, with its source:
//!
//! - **Networks**: `asns` ASNs (20,000, about the number of access networks that carry
//!   noticeable web traffic) with Zipf traffic (exponent 1.0); each ASN has a home country
//!   from a 40-country mix.
//! - **Prefixes**: a routing-table-like mix (`v4_prefixes` 250,000, `v6_prefixes` 50,000): IPv4
//!   lengths /8 to /24 with the public table's shape (about 60% /24, 25% /19-/23, 13% /16-/18,
//!   2% shorter), IPv6 /29 to /48; 30% of the longer prefixes are more-specifics announced
//!   inside a shorter one by another ASN, so resolution must take the longest match. Every ASN
//!   has at least one prefix of each family.
//! - **Lines**: navigation beacons (`ttfb`, `provider`, `pop`, `cache`, a `path` with escapes,
//!   a user agent, a session id), probe beacons (`times` per provider in any order, `null` for
//!   a failed fetch, `best`) on `probe_share` of lines, the client's `ip` (a quarter IPv6) or,
//!   on `resolved_share` of lines, an `asn` and `country` the receiver resolved. The fields come
//!   in any order, with the spacing of different JSON writers. A `bad_share` of lines is bad
//!   the ways real logs are: truncated, not JSON, an unknown provider, a negative time, no time.
//! - **Time**: `span` (6 hours) from `start`, receivers' batches arriving out of order by up
//!   to a few seconds, so buckets roll and pack while a file is read.
//! - **TTFB**: log-normal around a per-network, per-provider base (σ 0.5), 1% outliers at
//!   3-10×, written with and without decimals.
//!
//! ```
//! use multicdn_steering::sim::beacons::LogSpec;
//!
//! let spec = LogSpec { lines: 1_000, v4_prefixes: 2_000, v6_prefixes: 500, asns: 300, ..LogSpec::default() };
//! let prefixes = spec.prefixes();
//! let mut out = Vec::new();
//! spec.write_lines(&prefixes, &mut out)?;
//! assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1_000);
//! let table = multicdn_steering::resolve::PrefixTable::from_lines(&prefixes.to_text())?;
//! assert!(table.ranges() >= 2_500);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// What the log holds (see the module documentation for each default's source).
#[derive(Debug, Clone, PartialEq)]
pub struct LogSpec {
    /// Lines to write.
    pub lines: usize,
    /// ASNs, Zipf-weighted.
    pub asns: u32,
    /// Provider names (the first is the busiest).
    pub providers: Vec<String>,
    /// The first beacon's time, milliseconds since the epoch.
    pub start_ms: u64,
    /// The time the lines cover.
    pub span: Duration,
    /// IPv4 prefixes in the table.
    pub v4_prefixes: usize,
    /// IPv6 prefixes in the table.
    pub v6_prefixes: usize,
    /// Share of probe beacons.
    pub probe_share: f64,
    /// Share of lines carrying `asn` and `country` instead of `ip`.
    pub resolved_share: f64,
    /// Share of bad lines.
    pub bad_share: f64,
    /// The random seed (the same spec writes the same bytes).
    pub seed: u64,
}

impl Default for LogSpec {
    fn default() -> Self {
        LogSpec {
            lines: 2_000_000,
            asns: 20_000,
            providers: vec!["fastly".into(), "cloudflare".into(), "akamai".into()],
            // 2026-12-01T00:00:00Z
            start_ms: 1_796_083_200_000,
            span: Duration::from_secs(6 * 3600),
            v4_prefixes: 250_000,
            v6_prefixes: 50_000,
            probe_share: 0.08,
            resolved_share: 0.25,
            bad_share: 0.002,
            seed: 1,
        }
    }
}

const COUNTRIES: [&str; 40] = [
    "US", "US", "US", "DE", "GB", "FR", "BR", "JP", "IN", "IN", "AU", "CA", "NL", "ES", "IT", "MX",
    "KR", "ID", "TR", "PL", "SE", "CH", "BE", "AR", "ZA", "NG", "EG", "VN", "TH", "PH", "SG", "MY",
    "RU", "UA", "CO", "CL", "AT", "NO", "DK", "IE",
];

const POPS: [&str; 16] = [
    "LHR", "FRA", "AMS", "CDG", "IAD", "ORD", "DFW", "SJC", "LAX", "GRU", "NRT", "SIN", "SYD",
    "BOM", "JNB", "MAD",
];

const AGENTS: [&str; 4] = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Mobile Safari/537.36",
];

/// The lowest ASN of the log's networks.
const FIRST_ASN: u32 = 1_000;

/// One announced prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prefix {
    base: u128,
    len: u8,
    v6: bool,
    asn: u32,
}

/// The prefix table a log's addresses resolve through, and where each ASN's clients are.
#[derive(Debug, Clone)]
pub struct Prefixes {
    prefixes: Vec<Prefix>,
    /// Per ASN index: its IPv4 and its IPv6 prefixes (indices into `prefixes`).
    owned: Vec<(Vec<u32>, Vec<u32>)>,
    countries: Vec<&'static str>,
}

impl Prefixes {
    /// How many prefixes the table has.
    pub fn len(&self) -> usize {
        self.prefixes.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    /// The table as [`PrefixTable::from_lines`](crate::resolve::PrefixTable::from_lines) reads
    /// it: `prefix ASN country` a line.
    pub fn to_text(&self) -> String {
        let mut out = String::with_capacity(self.prefixes.len() * 32);
        for p in &self.prefixes {
            let country = self.countries[(p.asn - FIRST_ASN) as usize];
            if p.v6 {
                let _ = writeln!(
                    out,
                    "{}/{} AS{} {country}",
                    Ipv6Addr::from(p.base),
                    p.len,
                    p.asn
                );
            } else {
                let _ = writeln!(
                    out,
                    "{}/{} AS{} {country}",
                    Ipv4Addr::from(p.base as u32),
                    p.len,
                    p.asn
                );
            }
        }
        out
    }
}

fn v4_len(rng: &mut SmallRng) -> u8 {
    let u: f64 = rng.random();
    match u {
        u if u < 0.60 => 24,
        u if u < 0.85 => rng.random_range(19..=23),
        u if u < 0.98 => rng.random_range(16..=18),
        _ => rng.random_range(8..=15),
    }
}

fn v6_len(rng: &mut SmallRng) -> u8 {
    let u: f64 = rng.random();
    match u {
        u if u < 0.50 => 48,
        u if u < 0.80 => rng.random_range(36..=44),
        _ => rng.random_range(29..=35),
    }
}

fn mask(len: u8, bits: u8) -> u128 {
    let all = if bits == 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    };
    let host = if len >= bits {
        0
    } else {
        (1u128 << (bits - len)) - 1
    };
    all & !host
}

fn normal(rng: &mut SmallRng) -> f64 {
    let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let v: f64 = rng.random();
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

impl LogSpec {
    /// The prefix table (deterministic for the spec's seed).
    pub fn prefixes(&self) -> Prefixes {
        let mut rng = SmallRng::seed_from_u64(self.seed ^ 0x5052_4546);
        let asns = self.asns.max(1);
        let first = FIRST_ASN;
        let countries: Vec<&'static str> = (0..asns)
            .map(|_| COUNTRIES[rng.random_range(0..COUNTRIES.len())])
            .collect();
        let mut prefixes: Vec<Prefix> = Vec::with_capacity(self.v4_prefixes + self.v6_prefixes);
        let mut seen: HashSet<(u128, u8, bool)> = HashSet::new();
        let mut owned = vec![(Vec::new(), Vec::new()); asns as usize];
        for (v6, count) in [(false, self.v4_prefixes), (true, self.v6_prefixes)] {
            let bits = if v6 { 128 } else { 32 };
            let start = prefixes.len();
            let mut made = 0;
            while made < count {
                let len = if v6 {
                    v6_len(&mut rng)
                } else {
                    v4_len(&mut rng)
                };
                // The first prefixes go one per ASN, so every ASN has one of each family.
                let asn_index = if made < asns as usize {
                    made as u32
                } else {
                    let u: f64 = rng.random();
                    ((u * u) * f64::from(asns)) as u32 % asns
                };
                let nested = len >= if v6 { 36 } else { 17 }
                    && prefixes.len() > start
                    && rng.random::<f64>() < 0.3;
                let base = if nested {
                    let outer = prefixes[rng.random_range(start..prefixes.len())];
                    if outer.len >= len {
                        continue;
                    }
                    let span = bits - outer.len;
                    let offset = rng.random::<u128>() & ((1u128 << span) - 1);
                    (outer.base | offset) & mask(len, bits)
                } else if v6 {
                    // Global unicast, 2001::/16 to 2c0f::/16.
                    let top = rng.random_range(0x2001u128..=0x2c0f) << 112;
                    (top | (rng.random::<u128>() >> 16)) & mask(len, bits)
                } else {
                    // 1.0.0.0 to 223.255.255.255.
                    let a = rng.random_range(0x0100_0000u32..0xE000_0000);
                    u128::from(a) & mask(len, bits)
                };
                if !seen.insert((base, len, v6)) {
                    continue;
                }
                let index = prefixes.len() as u32;
                prefixes.push(Prefix {
                    base,
                    len,
                    v6,
                    asn: first + asn_index,
                });
                let own = &mut owned[asn_index as usize];
                if v6 {
                    own.1.push(index);
                } else {
                    own.0.push(index);
                }
                made += 1;
            }
        }
        Prefixes {
            prefixes,
            owned,
            countries,
        }
    }

    /// Writes the lines, one beacon (or bad line) each, to `out`.
    pub fn write_lines(&self, prefixes: &Prefixes, out: &mut impl Write) -> io::Result<()> {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let asns = prefixes.owned.len().max(1);
        // Zipf(1.0) over the ASNs: the cumulative weights, searched per line.
        let mut cdf = Vec::with_capacity(asns);
        let mut total = 0.0;
        for k in 1..=asns {
            total += 1.0 / k as f64;
            cdf.push(total);
        }
        // Which ASN is the k-th busiest: a shuffle, so traffic does not follow ASN numbers.
        let mut rank: Vec<u32> = (0..asns as u32).collect();
        for i in (1..rank.len()).rev() {
            rank.swap(i, rng.random_range(0..=i));
        }
        // Per network: a base RTT, and a factor per provider.
        let providers = &self.providers;
        let base: Vec<f64> = (0..asns)
            .map(|_| 35.0 * (0.4 * normal(&mut rng)).exp())
            .collect();
        let factor: Vec<f64> = (0..asns * providers.len().max(1))
            .map(|_| (0.25 * normal(&mut rng)).exp())
            .collect();
        let share = [0.55, 0.35, 0.10];
        let span_ms = self.span.as_millis().max(1) as f64;
        let mut line = String::with_capacity(512);
        let mut fields: Vec<(&'static str, String)> = Vec::with_capacity(10);
        let mut buf = io::BufWriter::with_capacity(1 << 20, out);
        for i in 0..self.lines {
            line.clear();
            fields.clear();
            // Receivers flush in batches: a line is up to a few seconds out of order.
            let at = self.start_ms as f64
                + i as f64 / self.lines.max(1) as f64 * span_ms
                + rng.random_range(-3_000.0..3_000.0);
            let at = at.max(self.start_ms as f64) as u64;
            let u: f64 = rng.random::<f64>() * total;
            let k = cdf.partition_point(|c| *c < u).min(asns - 1);
            let net = rank[k] as usize;
            let asn = FIRST_ASN + net as u32;
            let country = prefixes.countries[net];
            fields.push(("at", at.to_string()));
            if rng.random::<f64>() < self.resolved_share {
                fields.push(("asn", asn.to_string()));
                fields.push(("country", format!("\"{country}\"")));
            } else {
                let (v4, v6) = &prefixes.owned[net];
                let want_v6 = rng.random::<f64>() < 0.25 && !v6.is_empty();
                let list = if want_v6 || v4.is_empty() { v6 } else { v4 };
                let ip = match list.get(rng.random_range(0..list.len().max(1))) {
                    Some(&p) => {
                        let p = prefixes.prefixes[p as usize];
                        let bits = if p.v6 { 128 } else { 32 };
                        let host = !mask(p.len, bits) & mask(bits, bits);
                        let addr = p.base | (rng.random::<u128>() & host);
                        if p.v6 {
                            Ipv6Addr::from(addr).to_string()
                        } else {
                            Ipv4Addr::from(addr as u32).to_string()
                        }
                    }
                    None => "192.0.2.1".to_owned(),
                };
                fields.push(("ip", format!("\"{ip}\"")));
            }
            let ttfb = |rng: &mut SmallRng, p: usize| {
                let mut t = base[net] * factor[net * providers.len() + p] + 8.0;
                t *= (0.5 * normal(rng)).exp();
                if rng.random::<f64>() < 0.01 {
                    t *= rng.random_range(3.0..10.0);
                }
                t
            };
            let number = |rng: &mut SmallRng, t: f64| {
                if rng.random::<bool>() {
                    format!("{:.1}", t)
                } else {
                    format!("{}", t.round().max(1.0))
                }
            };
            let bad = rng.random::<f64>() < self.bad_share;
            if !providers.is_empty() && rng.random::<f64>() < self.probe_share {
                let mut order: Vec<usize> = (0..providers.len()).collect();
                for j in (1..order.len()).rev() {
                    order.swap(j, rng.random_range(0..=j));
                }
                let mut times = String::from("{");
                let mut best: Option<(f64, usize)> = None;
                for (n, &p) in order.iter().enumerate() {
                    if n > 0 {
                        times.push(',');
                    }
                    if rng.random::<f64>() < 0.01 {
                        let _ = write!(times, "\"{}\":null", providers[p]);
                    } else {
                        let t = ttfb(&mut rng, p) * 0.8;
                        let _ = write!(times, "\"{}\":{}", providers[p], number(&mut rng, t));
                        if best.is_none_or(|b| t < b.0) {
                            best = Some((t, p));
                        }
                    }
                }
                times.push('}');
                fields.push(("times", times));
                if let Some((_, p)) = best {
                    fields.push(("best", format!("\"{}\"", providers[p])));
                }
            } else if !providers.is_empty() {
                let u: f64 = rng.random();
                let mut p = providers.len() - 1;
                let mut acc = 0.0;
                for (j, s) in share.iter().enumerate().take(providers.len()) {
                    acc += s;
                    if u < acc {
                        p = j;
                        break;
                    }
                }
                let t = ttfb(&mut rng, p);
                fields.push(("ttfb", number(&mut rng, t)));
                fields.push(("provider", format!("\"{}\"", providers[p])));
                fields.push((
                    "pop",
                    format!("\"{}\"", POPS[rng.random_range(0..POPS.len())]),
                ));
                let cache = match rng.random_range(0..20) {
                    0..=15 => "HIT",
                    16..=18 => "MISS",
                    _ => "STALE",
                };
                fields.push(("cache", format!("\"{cache}\"")));
                let path = match rng.random_range(0..4) {
                    0 => format!("\"\\/products\\/{}?ref=home\"", rng.random_range(1..5000)),
                    1 => format!("\"/search?q=caf\\u00e9+{}\"", rng.random_range(1..900)),
                    2 => format!("\"/p/{}/\\\"gift\\\"\"", rng.random_range(1..100_000)),
                    _ => format!("\"/c/{}\"", rng.random_range(1..300)),
                };
                fields.push(("path", path));
            }
            if rng.random::<f64>() < 0.15 {
                fields.push((
                    "ua",
                    format!("\"{}\"", AGENTS[rng.random_range(0..AGENTS.len())]),
                ));
            }
            if rng.random::<f64>() < 0.4 {
                fields.push(("sid", format!("\"{:016x}\"", rng.random::<u64>())));
            }
            // Field order: as the receiver wrote it, or any order another writer chose.
            if rng.random::<f64>() < 0.6 {
                for j in (1..fields.len()).rev() {
                    fields.swap(j, rng.random_range(0..=j));
                }
            }
            let spaced = rng.random::<f64>() < 0.15;
            let (colon, comma) = if spaced { (": ", ", ") } else { (":", ",") };
            line.push('{');
            for (n, (k, v)) in fields.iter().enumerate() {
                if n > 0 {
                    line.push_str(comma);
                }
                let _ = write!(line, "\"{k}\"{colon}{v}");
            }
            line.push('}');
            if bad {
                let kind = rng.random_range(0..5);
                match kind {
                    0 => {
                        let cut = line.len() / 2;
                        let cut = (0..=cut)
                            .rev()
                            .find(|c| line.is_char_boundary(*c))
                            .unwrap_or(0);
                        line.truncate(cut);
                    }
                    1 => {
                        line.clear();
                        line.push_str("<html><body>502 Bad Gateway</body></html>");
                    }
                    2 => line = line.replace("\"provider\":\"", "\"provider\":\"x-"),
                    3 => line = line.replacen("\"ttfb\":", "\"ttfb\":-", 1),
                    _ => line = line.replacen("\"at\":", "\"seen\":", 1),
                }
            }
            line.push('\n');
            buf.write_all(line.as_bytes())?;
        }
        buf.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::Ingestor;
    use crate::resolve::PrefixTable;
    use crate::scoreboard::{Scoreboard, ScoreboardConfig};
    use multicdn_core::{ProviderId, Timestamp};

    fn small() -> LogSpec {
        LogSpec {
            lines: 20_000,
            asns: 2_000,
            v4_prefixes: 20_000,
            v6_prefixes: 4_000,
            ..LogSpec::default()
        }
    }

    #[test]
    fn the_log_is_what_a_receiver_writes_and_resolves_through_its_table() {
        let spec = small();
        let prefixes = spec.prefixes();
        assert_eq!(prefixes.len(), 24_000);
        let table = PrefixTable::from_lines(&prefixes.to_text()).unwrap();
        let mut out = Vec::new();
        spec.write_lines(&prefixes, &mut out).unwrap();
        let providers: Vec<ProviderId> = spec
            .providers
            .iter()
            .map(|p| ProviderId::new(p.as_str()).unwrap())
            .collect();
        let config = ScoreboardConfig::default()
            .bucket(Duration::from_secs(60))
            .retention(Duration::from_secs(7 * 3600));
        let mut board = Scoreboard::new(config, &providers).unwrap();
        let end = Timestamp::from_millis(spec.start_ms + spec.span.as_millis() as u64);
        let mut ingest = Ingestor::new(table).received_at(end);
        ingest.ingest_bytes(&out, &mut board);
        let report = ingest.report();
        assert_eq!(report.lines, 20_000);
        // About 0.2% bad lines, every other line a beacon; nearly all resolve.
        assert!(
            report.bad_total() > 5 && report.bad_total() < 120,
            "{report:?}"
        );
        assert!(report.beacons + report.bad_total() == 20_000, "{report:?}");
        assert!(report.unresolved < 20, "{report:?}");
        // The same spec writes the same bytes.
        let mut again = Vec::new();
        spec.write_lines(&prefixes, &mut again).unwrap();
        assert_eq!(out, again);
        // Lines vary in field order: `at` does not always come first.
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().filter(|l| !l.starts_with("{\"at\"")).count() > 5_000);
    }

    #[test]
    fn longer_prefixes_nest_inside_shorter_ones() {
        let prefixes = small().prefixes();
        let v4: Vec<&Prefix> = prefixes.prefixes.iter().filter(|p| !p.v6).collect();
        let nested = v4
            .iter()
            .filter(|p| {
                v4.iter().any(|q| {
                    q.len < p.len && (p.base & mask(q.len, 32)) == q.base && q.asn != p.asn
                })
            })
            .take(50)
            .count();
        assert_eq!(nested, 50);
    }
}
