//! The RUM scoreboard: cells of metric × network × provider × window, each with a quantile
//! sketch, a sample count and an age, marked steerable or insufficient-data.
//!
//! **Writing.** A [`Sample`] lands in one *base cell*, keyed by metric, provider and the
//! client's `(ASN, country)` pair, and inside it in one short *bucket* (`bucket`, 15 minutes by
//! default). Buckets older than `retention` are dropped. Writing touches one cell, which is what
//! keeps ingestion fast: the cell sits in the key table itself, its packed `u64` key inside it
//! and in the same cache line as what a write reads (one lookup, one line), and its newest
//! bucket is open: its first few values kept in the cell itself, then a
//! counter a bin written in place. When a newer bucket opens, the old one is packed (a thin
//! one kept as its few raw bins; see [`crate::sketch`]); a late sample still reaches its
//! closed bucket while that bucket is kept. A busy cell fits in under 2 KB.
//!
//! **Reading.** [`Scoreboard::snapshot`] rolls the buckets of a window up into every cut at
//! once: each ASN, country, continent and `*`. A cut's cell is steerable when it holds at least
//! `min_samples` samples and its newest sample is younger than `fresh_for`; otherwise it is
//! insufficient-data and says why. [`Snapshot::cut_for`] walks ASN → country → continent →
//! global to the finest cut where every compared provider is steerable.
//!
//! **Hygiene.** Values that cannot be a time (negative, not a number, zero) are dropped; values
//! above `plausible_max` are clamped to it (or dropped, by configuration); samples older than
//! the retention are dropped as too old. Each is counted in [`Quality`].
//!
//! **Growing past one machine.** Scoreboards serialise (serde) and [`Scoreboard::merge`]
//! combines shards: buckets are aligned on absolute time and sketches merge exactly.

use std::fmt;
use std::hash::Hasher;
use std::time::Duration;

use hashbrown::{HashTable, hash_table};
use multicdn_core::policy::RumPolicy;
use multicdn_core::{CacheStatus, CellStats, Country, NetworkKey, ProviderId, Timestamp};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::beacon::{ClientNetwork, NavigationBeacon, ProbeBeacon};
use crate::error::SteeringError;
use crate::sketch::{self, Accumulator, OpenBins, PackedBins, Sketch};

/// What a cell measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Time to first byte from navigation beacons.
    Ttfb,
    /// The client-side probe's fetch time; failed fetches count against availability.
    Probe,
    /// One probe load's times of two providers as a ratio, the lower slot's over the higher's
    /// (same user, same moment): the paired comparison, whose spread against the two
    /// providers' own says how much of their difference is the users' and how much theirs.
    /// Its cells are keyed by the pair ([`Snapshot::pairing`]), not by one provider.
    Pair,
    /// Time to first byte of the navigations the edge served from its cache (`Server-Timing`
    /// `cache=HIT`), also counted in [`Metric::Ttfb`]: free of the origin fetch a colder cache
    /// adds, so a provider at its measurement floor is not judged by its cache's warmth.
    TtfbHit,
}

impl Metric {
    fn bits(self) -> u64 {
        match self {
            Metric::Ttfb => 0,
            Metric::Probe => 1,
            Metric::Pair => 2,
            Metric::TtfbHit => 3,
        }
    }
}

/// The slot code of the pair `(a, b)`, `a < b`, both below [`PAIR_SLOTS`].
fn pair_code(a: u16, b: u16) -> u16 {
    a * PAIR_SLOTS + b
}

/// The two slots of a pair code.
fn pair_slots(code: u16) -> (u16, u16) {
    (code / PAIR_SLOTS, code % PAIR_SLOTS)
}

/// Providers whose slot is below this are paired in probe loads (a pair's code is one `u16`).
pub const PAIR_SLOTS: u16 = 256;

/// What to do with a value above the plausible maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AboveMax {
    /// Record it as the maximum (it still counts as slow).
    #[default]
    Clamp,
    /// Do not record it.
    Drop,
}

/// How the scoreboard buckets, ages and filters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ScoreboardConfig {
    /// The short bucket samples are written to.
    #[serde(with = "multicdn_core::policy::units::duration_ms")]
    pub bucket: Duration,
    /// How long buckets are kept: the longest window a snapshot can read.
    #[serde(with = "multicdn_core::policy::units::duration_ms")]
    pub retention: Duration,
    /// Samples a cell needs to be steerable.
    pub min_samples: u64,
    /// A cell whose newest sample is older than this is not steerable.
    #[serde(with = "multicdn_core::policy::units::duration_ms")]
    pub fresh_for: Duration,
    /// The largest plausible value, in milliseconds.
    pub plausible_max_ms: f64,
    /// What to do above it.
    pub above_max: AboveMax,
}

impl Default for ScoreboardConfig {
    fn default() -> Self {
        ScoreboardConfig {
            bucket: Duration::from_secs(900),
            retention: Duration::from_secs(3600),
            min_samples: 200,
            fresh_for: Duration::from_secs(900),
            plausible_max_ms: 60_000.0,
            above_max: AboveMax::Clamp,
        }
    }
}

impl ScoreboardConfig {
    /// The policy's minimum samples, a bucket of a quarter of its window, a freshness of one
    /// bucket, and a retention of its longest window ([`RumPolicy::max_window`]).
    pub fn from_policy(rum: &RumPolicy) -> ScoreboardConfig {
        let window = rum.window.get().max(Duration::from_secs(60));
        let bucket = Duration::from_millis((window.as_millis() as u64 / 4).max(1000));
        ScoreboardConfig {
            bucket,
            retention: rum.max_window().max(window),
            min_samples: rum.min_samples,
            fresh_for: bucket,
            ..ScoreboardConfig::default()
        }
    }

    /// Sets the bucket length.
    pub fn bucket(mut self, d: Duration) -> Self {
        self.bucket = d;
        self
    }

    /// Sets the retention.
    pub fn retention(mut self, d: Duration) -> Self {
        self.retention = d;
        self
    }

    /// Sets the minimum samples.
    pub fn min_samples(mut self, n: u64) -> Self {
        self.min_samples = n;
        self
    }

    /// Sets the freshness limit.
    pub fn fresh_for(mut self, d: Duration) -> Self {
        self.fresh_for = d;
        self
    }

    /// Sets the plausible maximum and what to do above it.
    pub fn plausible_max(mut self, ms: f64, above: AboveMax) -> Self {
        self.plausible_max_ms = ms;
        self.above_max = above;
        self
    }

    fn check(&self) -> Result<(), SteeringError> {
        if self.bucket.as_millis() < 1000 {
            return Err(SteeringError::Config {
                field: "bucket",
                why: format!("{:?} is under one second; use a few minutes", self.bucket),
            });
        }
        if self.bucket > Duration::from_secs(MAX_BUCKET_SECS) {
            return Err(SteeringError::Config {
                field: "bucket",
                why: format!(
                    "{:?} is over a year ({MAX_BUCKET_SECS} s), the longest bucket",
                    self.bucket
                ),
            });
        }
        if self.retention.as_millis() / self.bucket.as_millis() > u128::from(MAX_BUCKETS) {
            return Err(SteeringError::Config {
                field: "retention",
                why: format!(
                    "{:?} is over {MAX_BUCKETS} buckets of {:?}; use longer buckets",
                    self.retention, self.bucket
                ),
            });
        }
        if self.retention < self.bucket {
            return Err(SteeringError::Config {
                field: "retention",
                why: format!(
                    "{:?} is shorter than the bucket {:?}",
                    self.retention, self.bucket
                ),
            });
        }
        if !(self.plausible_max_ms.is_finite() && self.plausible_max_ms > 0.0) {
            return Err(SteeringError::Config {
                field: "plausible_max_ms",
                why: format!(
                    "{} must be a positive number of milliseconds",
                    self.plausible_max_ms
                ),
            });
        }
        Ok(())
    }

    /// The bucket length, milliseconds (scoreboards merge only with the same).
    pub fn bucket_ms(&self) -> u64 {
        // Checked: at least a second, at most a year.
        u64::try_from(self.bucket.as_millis()).unwrap_or(u64::MAX)
    }

    fn retention_buckets(&self) -> u32 {
        let ms = u64::try_from(self.retention.as_millis()).unwrap_or(u64::MAX);
        // Checked: at most MAX_BUCKETS.
        u32::try_from(ms.div_ceil(self.bucket_ms()))
            .unwrap_or(MAX_BUCKETS)
            .max(1)
    }
}

/// The longest bucket, in seconds (a year).
const MAX_BUCKET_SECS: u64 = 366 * 86_400;
/// The most buckets a retention may span.
const MAX_BUCKETS: u32 = 100_000;

/// A provider's position in the scoreboard's provider list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ProviderSlot(u16);

impl ProviderSlot {
    /// The index.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// One parsed, resolved measurement: what the scoreboard stores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When it was received.
    pub at: Timestamp,
    /// What it measures.
    pub metric: Metric,
    /// Which provider.
    pub provider: ProviderSlot,
    /// The client's network.
    pub network: ClientNetwork,
    /// Milliseconds; `None` for a failed fetch (probe only).
    pub value: Option<f64>,
}

/// What happened to one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Stored as given.
    Stored,
    /// Stored as the plausible maximum.
    Clamped,
    /// Not a plausible time: dropped.
    Implausible,
    /// Older than the retention: dropped.
    TooOld,
    /// A provider the scoreboard does not know: dropped.
    UnknownProvider,
    /// A time so far ahead that its bucket cannot be numbered: dropped, never stored under a
    /// wrapped-around bucket.
    OutOfRange,
}

/// Counts of what the scoreboard kept and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Quality {
    /// Samples stored (including clamped ones and failures).
    pub stored: u64,
    /// Failed fetches stored (probe).
    pub failures: u64,
    /// Values above the plausible maximum, stored as the maximum.
    pub clamped: u64,
    /// Values dropped as implausible (negative, zero, not a number, or above the maximum when
    /// configured to drop).
    pub implausible: u64,
    /// Samples older than the retention.
    pub too_old: u64,
    /// Samples naming a provider the scoreboard does not know.
    pub unknown_provider: u64,
    /// Samples dated too far ahead for a bucket number.
    #[serde(default)]
    pub out_of_range: u64,
}

impl Quality {
    pub(crate) fn add(&mut self, o: &Quality) {
        self.stored += o.stored;
        self.failures += o.failures;
        self.clamped += o.clamped;
        self.implausible += o.implausible;
        self.too_old += o.too_old;
        self.unknown_provider += o.unknown_provider;
        self.out_of_range += o.out_of_range;
    }
}

/// A bucket as serialised: its number, failures, newest sample and sketch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BucketWire {
    /// Bucket number: time / bucket length.
    index: u32,
    /// Failed fetches.
    failures: u32,
    /// The newest sample, milliseconds since the epoch.
    newest: u64,
    sketch: Sketch,
}

/// The bucket being written: its first few values inline, then one counter a bin. Laid out
/// in this order (`repr(C)`), so what a write reads sits beside the cell's key.
#[derive(Debug, Clone)]
#[repr(C)]
struct OpenBucket {
    index: u32,
    failures: u32,
    /// The newest sample, milliseconds since the epoch.
    newest: u64,
    bins: OpenBins,
}

/// An older bucket: its bins packed.
#[derive(Debug, Clone)]
struct ClosedBucket {
    index: u32,
    failures: u32,
    newest: u64,
    bins: PackedBins,
}

/// One base cell: its newest bucket open (written to), the older ones closed and packed.
///
/// A cell is two cache lines, aligned to them (`repr(C, align(64))`): its key, then the open
/// bucket, whose index, newest sample and first values fill the rest of the first line. A
/// write that finds its cell by key reads one line (the key compared, the bucket written).
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct Cell {
    /// The packed [`BaseKey`]; the [`CellMap`] sets it.
    key: u64,
    open: OpenBucket,
    /// Sorted by index, oldest first; all older than `open`.
    closed: Vec<ClosedBucket>,
}

impl Cell {
    fn new(index: u32) -> Cell {
        Cell {
            key: 0,
            open: OpenBucket {
                index,
                failures: 0,
                newest: 0,
                bins: OpenBins::default(),
            },
            closed: Vec::new(),
        }
    }

    /// Records a value's bin (`None`: a failure) received at `at` in bucket `index`; `false`
    /// when that bucket is older than the retention (`keep` buckets back from the newest).
    #[inline]
    fn record(&mut self, index: u32, keep: u32, at: u64, bin: Option<u32>) -> bool {
        if self.open.index != index {
            return self.record_elsewhere(index, keep, at, bin);
        }
        let open = &mut self.open;
        open.newest = open.newest.max(at);
        match bin {
            Some(k) => open.bins.insert(k),
            None => open.failures = open.failures.saturating_add(1),
        }
        true
    }

    #[cold]
    fn record_elsewhere(&mut self, index: u32, keep: u32, at: u64, bin: Option<u32>) -> bool {
        if index > self.open.index {
            self.open_new(index, Some(keep));
            return self.record(index, keep, at, bin);
        }
        // A late sample: an older bucket, if still kept.
        if u64::from(index) + u64::from(keep) <= u64::from(self.open.index) {
            return false;
        }
        let b = self.closed_at(index);
        b.newest = b.newest.max(at);
        match bin {
            Some(k) => b.bins.insert_late(k),
            None => b.failures = b.failures.saturating_add(1),
        }
        true
    }

    /// The closed bucket `index` (older than the open one), created empty when missing.
    fn closed_at(&mut self, index: u32) -> &mut ClosedBucket {
        let pos = self.closed.partition_point(|b| b.index < index);
        if self.closed.get(pos).map(|b| b.index) != Some(index) {
            self.closed.reserve_exact(1);
            self.closed.insert(
                pos,
                ClosedBucket {
                    index,
                    failures: 0,
                    newest: 0,
                    bins: PackedBins::default(),
                },
            );
        }
        &mut self.closed[pos]
    }

    /// Closes the open bucket (packing its bins) and opens `index`, newer; with `keep`, drops
    /// the buckets that fall out of the retention.
    fn open_new(&mut self, index: u32, keep: Option<u32>) {
        let open = &mut self.open;
        let closed = ClosedBucket {
            index: open.index,
            failures: open.failures,
            newest: open.newest,
            bins: PackedBins::from_open(&open.bins),
        };
        // The counters are reused: the next bucket's values likely span the same bins.
        open.bins.clear();
        open.index = index;
        open.failures = 0;
        open.newest = 0;
        if let Some(keep) = keep {
            let oldest_kept = index.saturating_sub(keep - 1);
            self.closed.retain(|b| b.index >= oldest_kept);
            if closed.index < oldest_kept {
                return;
            }
        }
        self.closed.reserve_exact(1);
        self.closed.push(closed);
    }

    /// Adds a bucket's failures, newest sample and `(bin, count)` pairs (sorted by bin).
    fn merge_bucket(&mut self, index: u32, failures: u32, newest: u64, bins: &[(u32, u64)]) {
        if index > self.open.index {
            self.open_new(index, None);
        }
        if index == self.open.index {
            let open = &mut self.open;
            open.failures = open.failures.saturating_add(failures);
            open.newest = open.newest.max(newest);
            for &(k, c) in bins {
                open.bins.add(k, c);
            }
        } else {
            let mine = self.closed_at(index);
            mine.failures = mine.failures.saturating_add(failures);
            mine.newest = mine.newest.max(newest);
            mine.bins.merge(bins);
        }
    }

    /// Adds every bucket of `other` (the same cell of a shard).
    fn merge(&mut self, other: &Cell) {
        for b in &other.closed {
            self.merge_bucket(b.index, b.failures, b.newest, &b.bins.bins());
        }
        let o = &other.open;
        self.merge_bucket(o.index, o.failures, o.newest, &o.bins.bins());
    }

    /// Adds the buckets of `cells` (one key's cells, in one scoreboard or several) up to
    /// `last` and pushes one aggregate a window: `firsts` are the windows' first buckets,
    /// newest first, and `out` receives one aggregate per entry, in that order, each holding
    /// every bucket from its first to `last`. A cell holds a few buckets, so each window's
    /// stretch is found by looking at them all.
    fn add_windows(
        cells: &[&Cell],
        firsts: &[u32],
        last: u32,
        acc: &mut Accumulator,
        out: &mut Vec<Agg>,
    ) {
        let (mut failures, mut newest) = (0u64, 0u64);
        // The newest bucket not yet added; `None` once bucket 0 is in.
        let mut upper = Some(last);
        for &first in firsts {
            if let Some(hi) = upper.filter(|hi| first <= *hi) {
                for cell in cells {
                    let open = &cell.open;
                    if (first..=hi).contains(&open.index) {
                        open.bins.add_to(acc);
                        failures += u64::from(open.failures);
                        newest = newest.max(open.newest);
                    }
                    for b in cell.closed.iter().rev() {
                        if b.index < first {
                            break;
                        }
                        if b.index <= hi {
                            b.bins.add_to(acc);
                            failures += u64::from(b.failures);
                            newest = newest.max(b.newest);
                        }
                    }
                }
                upper = first.checked_sub(1);
            }
            out.push(Agg {
                sketch: acc.to_sketch(),
                failures,
                newest,
            });
        }
    }

    /// Reads what [`Cell::add_windows`] reads first past the cell's first line: the list of
    /// closed buckets, the newest of them and its packed bins (on the heap in a busy cell). A
    /// walk over many cells reads these for a chunk of cells ahead ([`touch_ahead`]), so their
    /// misses are in flight together rather than one after another.
    #[inline]
    fn touch(&self) -> u32 {
        self.closed
            .last()
            .map_or(0, |b| b.index ^ u32::from(b.bins.first_byte()))
    }

    /// The buckets as serialised, oldest first.
    fn to_wire(&self) -> Vec<BucketWire> {
        let mut out: Vec<BucketWire> = self
            .closed
            .iter()
            .map(|b| BucketWire {
                index: b.index,
                failures: b.failures,
                newest: b.newest,
                sketch: Sketch::from_bins(&b.bins.bins()),
            })
            .collect();
        out.push(BucketWire {
            index: self.open.index,
            failures: self.open.failures,
            newest: self.open.newest,
            sketch: Sketch::from_bins(&self.open.bins.bins()),
        });
        out
    }

    /// A cell from serialised buckets; `None` when there are none.
    fn from_wire(mut buckets: Vec<BucketWire>) -> Option<Cell> {
        buckets.sort_by_key(|b| b.index);
        let newest = buckets.last()?.index;
        let mut cell = Cell::new(newest);
        for b in &buckets {
            cell.merge_bucket(b.index, b.failures, b.newest, &b.sketch.to_bins());
        }
        Some(cell)
    }

    fn heap_bytes(&self) -> usize {
        self.open.bins.heap_bytes()
            + self.closed.capacity() * std::mem::size_of::<ClosedBucket>()
            + self
                .closed
                .iter()
                .map(|b| b.bins.heap_bytes())
                .sum::<usize>()
    }
}

/// The base cell's key: metric, provider, ASN, country.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct BaseKey {
    metric: Metric,
    provider: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    asn: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    country: Option<Country>,
}

impl BaseKey {
    /// The key of `provider`'s `metric` cell (for a [`Metric::Pair`], `provider` is the
    /// pair's code) for `network`.
    #[inline]
    fn of(metric: Metric, provider: u16, network: ClientNetwork) -> BaseKey {
        BaseKey {
            metric,
            provider,
            asn: network.asn,
            country: network.country,
        }
    }

    #[inline]
    fn pack(&self) -> u64 {
        let country = self.country.map_or(0u64, |c| {
            let [b0, b1] = c.as_bytes();
            u64::from(b0.wrapping_sub(b'A')) * 26 + u64::from(b1.wrapping_sub(b'A')) + 1
        });
        let asn = BaseKey::asn_bits(self.asn);
        self.metric.bits() | (u64::from(self.provider) << 2) | (country << 18) | (asn << 28)
    }

    /// A packed key's ASN bits (`packed >> 28`): the ASN plus one, 0 for none.
    fn asn_bits(asn: Option<u32>) -> u64 {
        asn.map_or(0, |a| u64::from(a) + 1)
    }

    /// The key [`BaseKey::pack`] packed.
    fn unpack(packed: u64) -> BaseKey {
        let metric = match packed & 3 {
            0 => Metric::Ttfb,
            1 => Metric::Probe,
            2 => Metric::Pair,
            _ => Metric::TtfbHit,
        };
        let country = match (packed >> 18) & 0x3ff {
            0 => None,
            c => {
                let letters = [b'A' + ((c - 1) / 26) as u8, b'A' + ((c - 1) % 26) as u8];
                std::str::from_utf8(&letters)
                    .ok()
                    .and_then(|l| Country::new(l).ok())
            }
        };
        BaseKey {
            metric,
            provider: (packed >> 2) as u16,
            asn: (packed >> 28).checked_sub(1).map(|a| a as u32),
            country,
        }
    }

    /// The key with its provider slot (both, for a pair) renumbered by `map`; `None` for a
    /// pair whose slots are no longer both pairable.
    fn renumbered(&self, map: impl Fn(u16) -> u16) -> Option<BaseKey> {
        let provider = if self.metric == Metric::Pair {
            let (a, b) = pair_slots(self.provider);
            let (a, b) = (map(a), map(b));
            if a >= b || b >= PAIR_SLOTS {
                return None;
            }
            pair_code(a, b)
        } else {
            map(self.provider)
        };
        Some(BaseKey { provider, ..*self })
    }
}

/// A multiply-shift hasher for the packed cell keys (the keys are our own integers).
#[derive(Debug, Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        let x = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 29);
    }
}

impl KeyHasher {
    /// The hash of one packed key.
    fn hashed(mut self, packed: u64) -> u64 {
        self.write_u64(packed);
        self.finish()
    }

    /// The hash a key is kept under in a [`CellMap`]: the key's provider, ASN and country
    /// hashed, its metric (the low two bits) added to the low bits (the table slot) and to
    /// the top ones (the slot's tag). So a network's cells of one provider, the TTFB and hit
    /// cells a cache hit writes together among them, sit a few slots apart: the second
    /// write finds its slot's control bytes and page in the cache, where a hash of the
    /// whole key would send it to another part of a table much larger than the cache.
    /// (`scoreboard` on the 2 M-line log: 9-11% faster, the median of 12 rounds.)
    fn table_hash(self, packed: u64) -> u64 {
        let metric = packed & 3;
        self.hashed(packed & !3) ^ metric ^ (metric << 57)
    }
}

/// The cells by packed key, each held in the table (its key inside): a lookup compares the
/// key and writes the bucket in the same cache line.
#[derive(Clone, Default)]
struct CellMap {
    table: HashTable<Cell>,
}

impl fmt::Debug for CellMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

fn hash_key(cell: &Cell) -> u64 {
    KeyHasher::default().table_hash(cell.key)
}

/// A cell of a [`CellMap`], or where it goes.
type CellEntry<'a> = hash_table::Entry<'a, Cell>;

impl CellMap {
    fn with_capacity(n: usize) -> CellMap {
        CellMap {
            table: HashTable::with_capacity(n),
        }
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn capacity(&self) -> usize {
        self.table.capacity()
    }

    fn reserve(&mut self, n: usize) {
        self.table.reserve(n, hash_key);
    }

    fn get(&self, key: u64) -> Option<&Cell> {
        self.table
            .find(KeyHasher::default().table_hash(key), |c| c.key == key)
    }

    fn contains_key(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// The cell `key`, or its place. A cell put in a vacant place must carry `key`.
    #[inline]
    fn entry(&mut self, key: u64) -> CellEntry<'_> {
        let hash = KeyHasher::default().table_hash(key);
        self.table.entry(hash, |c| c.key == key, hash_key)
    }

    /// The cell `key`, made by `new` when missing.
    #[inline]
    fn get_or_insert_with(&mut self, key: u64, new: impl FnOnce() -> Cell) -> &mut Cell {
        match self.entry(key) {
            CellEntry::Occupied(o) => o.into_mut(),
            CellEntry::Vacant(v) => v.insert(Cell { key, ..new() }).into_mut(),
        }
    }

    /// Puts `cell` under `key`, returning the cell it replaces.
    fn insert(&mut self, key: u64, cell: Cell) -> Option<Cell> {
        let cell = Cell { key, ..cell };
        match self.entry(key) {
            CellEntry::Occupied(mut o) => Some(std::mem::replace(o.get_mut(), cell)),
            CellEntry::Vacant(v) => {
                v.insert(cell);
                None
            }
        }
    }

    /// Adds `cell` to the cell `key` ([`Cell::merge`]), or puts it there.
    fn merge_in(&mut self, key: u64, cell: Cell) {
        match self.entry(key) {
            CellEntry::Occupied(o) => o.into_mut().merge(&cell),
            CellEntry::Vacant(v) => {
                v.insert(Cell { key, ..cell });
            }
        }
    }

    fn retain(&mut self, keep: impl FnMut(&mut Cell) -> bool) {
        self.table.retain(keep);
    }

    fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.table.iter().map(|c| c.key)
    }

    fn values(&self) -> impl Iterator<Item = &Cell> {
        self.table.iter()
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Cell)> {
        self.table.iter().map(|c| (c.key, c))
    }

    /// Moves in every cell of `other`, whose keys this map does not hold.
    fn extend(&mut self, other: CellMap) {
        for (key, cell) in other {
            self.insert(key, cell);
        }
    }
}

impl IntoIterator for CellMap {
    type Item = (u64, Cell);
    type IntoIter = std::iter::Map<hash_table::IntoIter<Cell>, fn(Cell) -> (u64, Cell)>;

    fn into_iter(self) -> Self::IntoIter {
        self.table.into_iter().map(|c| (c.key, c))
    }
}

/// A sample [`Scoreboard::admit`]s: its cell, bucket, time and bin (`None`: a failure), and
/// what it comes to once written (stored or clamped).
struct Admitted {
    key: u64,
    index: u32,
    at: u64,
    bin: Option<u32>,
    outcome: Recorded,
}

/// A failed fetch's place for a bin in a [`StagedSample`] (no bin is this high).
const FAILED: u32 = u32::MAX;

/// A sample held back in [`Staged`]: its cell, bucket, time and bin ([`FAILED`]: a failure).
#[derive(Debug, Clone, Copy)]
struct StagedSample {
    key: u64,
    at: u64,
    index: u32,
    bin: u32,
}

/// Samples held back to be written later, a part of the cell table at a time
/// ([`Scoreboard::write_staged`]), rather than each into a cell somewhere in a table much
/// larger than the cache as it arrives.
///
/// A sample is put in the part of the table its cell's slot is in (2,048 slots, 256 KiB of
/// cells), so writing a part reads cells that sit together: within the core's cache, on few
/// pages. The samples of one cell are in one part in the order they came, so each cell is
/// written as it would have been sample by sample. Only a sample that no cell can find too
/// old is held back (see [`Scoreboard::write`]): what a sample comes to is known when it
/// comes, and counted then.
#[derive(Default)]
pub(crate) struct Staged {
    parts: Vec<Vec<StagedSample>>,
    /// The parts holding samples, each once: a write visits these alone, so writing a few
    /// samples (a line at a time) costs nothing for the parts left empty.
    touched: Vec<u32>,
    /// The table's slots less one, when the parts were laid out.
    mask: u64,
    len: usize,
    /// How many samples to hold before they are written: see [`Staged::full`].
    cap: usize,
}

impl fmt::Debug for Staged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staged")
            .field("samples", &self.len)
            .field("parts", &self.parts.len())
            .finish()
    }
}

/// The slots of a part of the cell table that [`Staged`] writes at once, as a shift.
const STAGE_PART_SHIFT: u32 = 11;

/// The samples [`Staged`] holds before they are written: eight a slot of the cell table,
/// from 2^17 (3 MiB) to 2^20 (24 MiB). The more are held, the more of a cell's samples are
/// written together while its cell is in the cache; sized by the table, what they take
/// grows with the scoreboard, not with the input.
///
/// On the 2 M-line log of `scripts/ingest-vs-duckdb` (208,355 cells in 262,144 slots at its
/// end, some 4.3 M writes), the tool's time on one core against 2^17 held whatever the
/// table, by the medians of 10 interleaved rounds: four a slot 0.972-0.975×, eight 0.963×,
/// sixteen 0.955×; 2^20 whatever the table 0.926-0.948× (three series), 2^21 no faster. The
/// cap by the table keeps a small scoreboard's tool small: with 2^20 whatever the table,
/// its peak memory on a log of 27,000 cells was 80 MiB for 2.4 GB piped in against 36 MiB
/// for 24 MB. (A pass sorting each part's samples by slot before they are written, so a
/// cell's are written one after another, was slower: 0.966× against 0.948×.)
const STAGE_PER_SLOT: usize = 8;
const STAGE_MIN: usize = 1 << 17;
const STAGE_MAX: usize = 1 << 20;

impl Staged {
    /// Samples held back.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether as many samples are held as should be before they are written (see
    /// [`STAGE_PER_SLOT`]).
    pub(crate) fn full(&self) -> bool {
        self.len >= self.cap.max(STAGE_MIN)
    }

    #[inline]
    fn push(&mut self, s: StagedSample) {
        let hash = KeyHasher::default().table_hash(s.key);
        let part = ((hash & self.mask) >> STAGE_PART_SHIFT) as usize;
        if self.parts.is_empty() {
            self.parts.push(Vec::new());
        }
        // The parts were laid out for the table as it was; it has not grown since, as it
        // only grows as they are written. (Were it otherwise, the part would only be less
        // well chosen.)
        let part = part.min(self.parts.len() - 1);
        if let Some(p) = self.parts.get_mut(part) {
            if p.is_empty() {
                self.touched.push(part as u32);
            }
            p.push(s);
            self.len += 1;
        }
    }
}

/// The scoreboard (see the module documentation).
#[derive(Debug, Clone)]
pub struct Scoreboard {
    config: ScoreboardConfig,
    providers: Vec<ProviderId>,
    cells: CellMap,
    quality: Quality,
    bucket_ms: u64,
    keep: u32,
    /// No cell's open bucket is newer than this one (it may be older): a sample of a bucket
    /// fewer than `keep` before it is kept by every cell.
    newest: u32,
}

impl Scoreboard {
    /// An empty scoreboard for these providers.
    pub fn new(
        config: ScoreboardConfig,
        providers: &[ProviderId],
    ) -> Result<Scoreboard, SteeringError> {
        config.check()?;
        if providers.len() > 4096 {
            return Err(SteeringError::Config {
                field: "providers",
                why: format!("{} providers; at most 4096", providers.len()),
            });
        }
        let mut providers = providers.to_vec();
        providers.sort();
        providers.dedup();
        Ok(Scoreboard {
            bucket_ms: config.bucket_ms(),
            keep: config.retention_buckets(),
            config,
            providers,
            cells: CellMap::default(),
            quality: Quality::default(),
            newest: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ScoreboardConfig {
        &self.config
    }

    /// The providers, sorted; a [`ProviderSlot`] indexes this list.
    pub fn providers(&self) -> &[ProviderId] {
        &self.providers
    }

    /// The slot of a provider named `name`.
    #[inline]
    pub fn provider_slot(&self, name: &str) -> Option<ProviderSlot> {
        let name = name.as_bytes();
        self.providers
            .iter()
            .position(|p| {
                // The first byte tells most names apart without a call to compare them.
                let p = p.as_str().as_bytes();
                p.len() == name.len() && p.first() == name.first() && p == name
            })
            .map(|i| ProviderSlot(i as u16))
    }

    /// Adds a provider (for a reader that learns the providers from the beacons themselves) and
    /// returns its slot; a provider already known keeps its slot. The providers stay sorted, so
    /// the slots of those after it move up by one: slots taken before this call are stale.
    /// Costs one pass over the cells.
    pub fn add_provider(&mut self, provider: ProviderId) -> Result<ProviderSlot, SteeringError> {
        let at = match self.providers.binary_search(&provider) {
            Ok(i) => return Ok(ProviderSlot(i as u16)),
            Err(i) => i,
        };
        if self.providers.len() >= 4096 {
            return Err(SteeringError::Config {
                field: "providers",
                why: format!("adding {provider}: at most 4096 providers"),
            });
        }
        self.providers.insert(at, provider);
        let at = at as u16;
        let shift = |slot: u16| if slot >= at { slot + 1 } else { slot };
        if self.cells.keys().any(|k| {
            let key = BaseKey::unpack(k);
            key.renumbered(shift) != Some(key)
        }) {
            let cells = std::mem::take(&mut self.cells);
            self.cells.reserve(cells.len());
            for (packed, cell) in cells {
                // A pair whose higher slot moved past the pairable ones is no longer kept.
                if let Some(key) = BaseKey::unpack(packed).renumbered(shift) {
                    self.cells.insert(key.pack(), cell);
                }
            }
        }
        Ok(ProviderSlot(at))
    }

    /// What was kept and dropped so far.
    pub fn quality(&self) -> Quality {
        self.quality
    }

    /// Counts a sample naming a provider this scoreboard does not know.
    pub fn count_unknown_provider(&mut self) {
        self.quality.unknown_provider += 1;
    }

    /// How many base cells hold data.
    pub fn cells(&self) -> usize {
        self.cells.len()
    }

    /// Bytes held on the heap by the cells, their index and keys (not counting the allocator's
    /// own bookkeeping).
    pub fn heap_bytes(&self) -> usize {
        self.table_bytes() + self.cells.values().map(Cell::heap_bytes).sum::<usize>()
    }

    /// The heap bytes of the cell table itself: an entry and a control byte a slot, at most
    /// 7/8 of its slots used.
    fn table_bytes(&self) -> usize {
        let slots = (self.cells.capacity() * 8).div_ceil(7);
        slots * (std::mem::size_of::<Cell>() + 1)
    }

    /// The bucket holding `now`; a time past the last numbered bucket reads as the last.
    fn bucket_at(&self, now: Timestamp) -> u32 {
        u32::try_from(now.as_millis() / self.bucket_ms).unwrap_or(u32::MAX)
    }

    /// Stores one sample. A [`Metric::Pair`] sample names no one provider and is refused as
    /// [`Recorded::UnknownProvider`]: pairs go in through [`Scoreboard::insert_pairs`]. A
    /// [`Metric::TtfbHit`] sample is stored as one (most callers want
    /// [`Scoreboard::insert_navigation`], which stores a hit under both metrics).
    #[inline]
    pub fn insert(&mut self, s: &Sample) -> Recorded {
        self.insert_staged(None, s)
    }

    /// [`Scoreboard::insert`], its write held back in `staged`, when given, if it can be (see
    /// [`Scoreboard::write`]).
    #[inline]
    pub(crate) fn insert_staged(&mut self, staged: Option<&mut Staged>, s: &Sample) -> Recorded {
        let a = match self.admit(s) {
            Ok(a) => a,
            Err(dropped) => return dropped,
        };
        if !self.write(staged, a.key, a.index, a.at, a.bin) {
            self.quality.too_old += 1;
            return Recorded::TooOld;
        }
        self.quality.stored += 1;
        if a.bin.is_none() {
            self.quality.failures += 1;
        }
        if a.outcome == Recorded::Clamped {
            self.quality.clamped += 1;
        }
        a.outcome
    }

    /// What a sample comes to before it is written: where it goes and what it holds, or
    /// (counted) why it is dropped.
    #[inline]
    fn admit(&mut self, s: &Sample) -> Result<Admitted, Recorded> {
        let (value, outcome) = match s.value {
            None => (None, Recorded::Stored),
            Some(v) if !(v > 0.0 && v.is_finite()) => {
                self.quality.implausible += 1;
                return Err(Recorded::Implausible);
            }
            Some(v) if v > self.config.plausible_max_ms => match self.config.above_max {
                AboveMax::Clamp => (Some(self.config.plausible_max_ms), Recorded::Clamped),
                AboveMax::Drop => {
                    self.quality.implausible += 1;
                    return Err(Recorded::Implausible);
                }
            },
            Some(v) => (Some(v), Recorded::Stored),
        };
        // A pair names two providers, not one: pairs go in through `insert_pairs`.
        if s.provider.index() >= self.providers.len() || s.metric == Metric::Pair {
            self.quality.unknown_provider += 1;
            return Err(Recorded::UnknownProvider);
        }
        let at = s.at.as_millis();
        let Ok(index) = u32::try_from(at / self.bucket_ms) else {
            self.quality.out_of_range += 1;
            return Err(Recorded::OutOfRange);
        };
        Ok(Admitted {
            key: BaseKey::of(s.metric, s.provider.0, s.network).pack(),
            index,
            at,
            bin: value.map(sketch::bin_of_positive),
            outcome,
        })
    }

    /// Writes a bin (`None`: a failure) into the cell `key`; `false` when its bucket is older
    /// than the cell's retention. With `staged`, a bin is held back there rather than written
    /// when no cell can find it too old: its bucket is no more than `keep` older than any
    /// cell's open bucket can be when it is written (the newest bucket written or held back
    /// so far, the scoreboard's `newest`), so it comes to what it would now. A bin that may be
    /// too old is written now, after every sample held back before it.
    #[inline]
    fn write(
        &mut self,
        staged: Option<&mut Staged>,
        key: u64,
        index: u32,
        at: u64,
        bin: Option<u32>,
    ) -> bool {
        if let Some(staged) = staged {
            if u64::from(index) + u64::from(self.keep) > u64::from(self.newest) {
                self.newest = self.newest.max(index);
                staged.push(StagedSample {
                    key,
                    at,
                    index,
                    bin: bin.unwrap_or(FAILED),
                });
                return true;
            }
            if staged.len() > 0 {
                self.write_staged(staged);
            }
        }
        self.record(key, index, at, bin)
    }

    /// Lays `staged` out for the cell table as it is: a part for every 2,048 slots.
    pub(crate) fn stage(&self, staged: &mut Staged) {
        let slots = ((self.cells.capacity() * 8) / 7).max(1).next_power_of_two();
        staged.mask = slots as u64 - 1;
        staged.cap = slots
            .saturating_mul(STAGE_PER_SLOT)
            .clamp(STAGE_MIN, STAGE_MAX);
        staged
            .parts
            .resize_with((slots >> STAGE_PART_SHIFT).max(1), Vec::new);
    }

    /// Writes the samples held back in `staged`, a part of the table after another in table
    /// order, each part's in the order they came, and lays `staged` out again for the table as
    /// it now is.
    pub(crate) fn write_staged(&mut self, staged: &mut Staged) {
        let mut parts = std::mem::take(&mut staged.parts);
        let mut touched = std::mem::take(&mut staged.touched);
        touched.sort_unstable();
        for &i in &touched {
            let Some(part) = parts.get_mut(i as usize) else {
                continue;
            };
            for s in part.iter() {
                // Held back only when no cell could find it too old (see `write`): this
                // never fails, and if it did, the count would say so.
                let bin = (s.bin != FAILED).then_some(s.bin);
                if !self.record(s.key, s.index, s.at, bin) {
                    debug_assert!(false, "a sample held back was too old for its cell");
                    self.quality.stored = self.quality.stored.saturating_sub(1);
                    self.quality.too_old += 1;
                }
            }
            part.clear();
        }
        touched.clear();
        staged.parts = parts;
        staged.touched = touched;
        staged.len = 0;
        self.stage(staged);
    }

    /// Writes a bin (`None`: a failure) into the base cell `key` (packed); `false` when its
    /// bucket is older than the retention.
    #[inline]
    fn record(&mut self, key: u64, index: u32, at: u64, bin: Option<u32>) -> bool {
        self.newest = self.newest.max(index);
        let cell = self.cells.get_or_insert_with(key, || Cell::new(index));
        cell.record(index, self.keep, at, bin)
    }

    /// Stores the pairs of one probe load: for every two providers it timed successfully (with
    /// plausible times, both slots below [`PAIR_SLOTS`]), the ratio of the lower slot's time to
    /// the higher's, in a [`Metric::Pair`] cell of the network. Call it beside the probe's
    /// [`Scoreboard::insert`]s ([`Scoreboard::record_probe`] does both); the pairs are not
    /// counted in [`Quality`], which counts the samples.
    pub fn insert_pairs(
        &mut self,
        at: Timestamp,
        network: ClientNetwork,
        times: &[(ProviderSlot, Option<f64>)],
    ) {
        self.insert_pairs_staged(None, at, network, times);
    }

    /// [`Scoreboard::insert_pairs`], its writes held back in `staged`, when given, where they
    /// can be (see [`Scoreboard::write`]).
    pub(crate) fn insert_pairs_staged(
        &mut self,
        mut staged: Option<&mut Staged>,
        at: Timestamp,
        network: ClientNetwork,
        times: &[(ProviderSlot, Option<f64>)],
    ) {
        let at_ms = at.as_millis();
        let Ok(index) = u32::try_from(at_ms / self.bucket_ms) else {
            return;
        };
        let max = self.config.plausible_max_ms;
        let ok = |slot: ProviderSlot, v: Option<f64>| {
            v.filter(|v| *v > 0.0 && *v <= max && slot.0 < PAIR_SLOTS)
        };
        for (i, &(a, va)) in times.iter().enumerate() {
            let Some(va) = ok(a, va) else { continue };
            for &(b, vb) in &times[i + 1..] {
                let Some(vb) = ok(b, vb) else { continue };
                let (lo, hi, ratio) = match a.0.cmp(&b.0) {
                    std::cmp::Ordering::Less => (a.0, b.0, va / vb),
                    std::cmp::Ordering::Greater => (b.0, a.0, vb / va),
                    std::cmp::Ordering::Equal => continue,
                };
                if usize::from(hi) >= self.providers.len() {
                    continue;
                }
                let key = BaseKey::of(Metric::Pair, pair_code(lo, hi), network).pack();
                let bin = sketch::bin_of_positive(ratio);
                self.write(staged.as_deref_mut(), key, index, at_ms, Some(bin));
            }
        }
    }

    /// Stores a navigation's TTFB under [`Metric::Ttfb`] and, when the edge served it from its
    /// cache (`hit`), under [`Metric::TtfbHit`] too (counted once in [`Quality`]).
    #[inline]
    pub fn insert_navigation(
        &mut self,
        at: Timestamp,
        provider: ProviderSlot,
        network: ClientNetwork,
        ttfb: f64,
        hit: bool,
    ) -> Recorded {
        self.insert_navigation_staged(None, at, provider, network, ttfb, hit)
    }

    /// [`Scoreboard::insert_navigation`], its writes held back in `staged`, when given, where
    /// they can be (see [`Staged`]); written by [`Scoreboard::write_staged`].
    #[inline]
    pub(crate) fn insert_navigation_staged(
        &mut self,
        mut staged: Option<&mut Staged>,
        at: Timestamp,
        provider: ProviderSlot,
        network: ClientNetwork,
        ttfb: f64,
        hit: bool,
    ) -> Recorded {
        let recorded = self.insert_staged(
            staged.as_deref_mut(),
            &Sample {
                at,
                metric: Metric::Ttfb,
                provider,
                network,
                value: Some(ttfb),
            },
        );
        let at_ms = at.as_millis();
        // Stored (or clamped) above: its bucket is numbered and kept.
        if hit
            && matches!(recorded, Recorded::Stored | Recorded::Clamped)
            && let Ok(index) = u32::try_from(at_ms / self.bucket_ms)
        {
            let value = ttfb.min(self.config.plausible_max_ms);
            self.write(
                staged,
                BaseKey::of(Metric::TtfbHit, provider.0, network).pack(),
                index,
                at_ms,
                Some(sketch::bin_of_positive(value)),
            );
        }
        recorded
    }

    /// Stores a navigation beacon's TTFB (and, served from cache, its hit; see
    /// [`Scoreboard::insert_navigation`]).
    pub fn record_navigation(
        &mut self,
        at: Timestamp,
        network: ClientNetwork,
        beacon: &NavigationBeacon,
    ) -> Recorded {
        let Some(provider) = self.provider_slot(&beacon.provider) else {
            self.quality.unknown_provider += 1;
            return Recorded::UnknownProvider;
        };
        let hit = beacon.cache_status() == Some(CacheStatus::Hit);
        self.insert_navigation(at, provider, network, beacon.ttfb, hit)
    }

    /// Stores a probe beacon's times, one sample per provider; `order` names the providers of
    /// the array form. Returns what happened to each.
    pub fn record_probe(
        &mut self,
        at: Timestamp,
        network: ClientNetwork,
        beacon: &ProbeBeacon,
        order: &[String],
    ) -> Vec<Recorded> {
        let mut paired = Vec::new();
        let recorded = beacon
            .pairs(order)
            .into_iter()
            .map(|(name, value)| match self.provider_slot(name) {
                Some(provider) => {
                    let r = self.insert(&Sample {
                        at,
                        metric: Metric::Probe,
                        provider,
                        network,
                        value,
                    });
                    if r == Recorded::Stored {
                        paired.push((provider, value));
                    }
                    r
                }
                None => {
                    self.quality.unknown_provider += 1;
                    Recorded::UnknownProvider
                }
            })
            .collect();
        self.insert_pairs(at, network, &paired);
        recorded
    }

    /// Drops buckets older than the retention as of `now`, and cells left empty.
    pub fn expire(&mut self, now: Timestamp) {
        let current = self.bucket_at(now);
        let oldest_kept = current.saturating_sub(self.keep - 1);
        self.cells.retain(|cell| {
            // The open bucket is the newest: when it is out, all are.
            if cell.open.index < oldest_kept {
                return false;
            }
            cell.closed.retain(|b| b.index >= oldest_kept);
            true
        });
    }

    /// Adds every sample of `other` (a shard) to this scoreboard. Both must use the same
    /// bucket length; providers are matched by name.
    pub fn merge(&mut self, other: &Scoreboard) -> Result<(), SteeringError> {
        if other.bucket_ms != self.bucket_ms {
            return Err(SteeringError::Merge(format!(
                "bucket lengths differ ({} ms here, {} ms in the other); shards must share one bucket length",
                self.bucket_ms, other.bucket_ms
            )));
        }
        let mut map = Vec::with_capacity(other.providers.len());
        for p in &other.providers {
            let slot = match self.providers.iter().position(|q| q == p) {
                Some(i) => i,
                None => {
                    return Err(SteeringError::Merge(format!(
                        "the other scoreboard has provider {p}, which this one does not know (known: {})",
                        self.providers
                            .iter()
                            .map(ProviderId::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            };
            map.push(slot as u16);
        }
        for (packed, cell) in other.cells.iter() {
            let Some(key) = BaseKey::unpack(packed)
                .renumbered(|slot| map.get(usize::from(slot)).copied().unwrap_or(u16::MAX))
            else {
                continue;
            };
            let key = key.pack();
            match self.cells.entry(key) {
                CellEntry::Occupied(o) => o.into_mut().merge(cell),
                CellEntry::Vacant(v) => {
                    v.insert(Cell {
                        key,
                        ..cell.clone()
                    });
                }
            }
        }
        self.quality.add(&other.quality);
        self.newest = self.newest.max(other.newest);
        Ok(())
    }

    /// [`Scoreboard::merge`] of shards given up (a parallel ingest's), on one thread a shard,
    /// cells moved, not copied. Each shard's cells (and this scoreboard's) are first split, on
    /// a thread of their own, into one share of the keys a thread; each share is then merged on
    /// its thread (every cell merges on its own, so the cells are those of
    /// [`Scoreboard::merge`]); the shares, disjoint, are joined last. A shard naming other
    /// providers, or another bucket length, than this scoreboard is merged by
    /// [`Scoreboard::merge`] first, on the calling thread.
    pub(crate) fn merge_shards(&mut self, shards: Vec<Scoreboard>) -> Result<(), SteeringError> {
        let mut sources: Vec<CellMap> = Vec::with_capacity(shards.len() + 1);
        for shard in shards {
            if shard.providers != self.providers || shard.bucket_ms != self.bucket_ms {
                self.merge(&shard)?;
                continue;
            }
            self.quality.add(&shard.quality);
            self.newest = self.newest.max(shard.newest);
            if !shard.cells.is_empty() {
                sources.push(shard.cells);
            }
        }
        if !self.cells.is_empty() {
            sources.push(std::mem::take(&mut self.cells));
        }
        let n = sources.len();
        if n <= 1 {
            self.cells = sources.pop().unwrap_or_default();
            return Ok(());
        }
        let share = |packed: u64| (KeyHasher::default().hashed(packed) % n as u64) as usize;
        // Split: `split[source][share]`.
        let mut split: Vec<Vec<CellMap>> = (0..n).map(|_| Vec::new()).collect();
        std::thread::scope(|scope| {
            for (cells, out) in sources.into_iter().zip(split.iter_mut()) {
                scope.spawn(move || {
                    let each = cells.len() / n + 16;
                    let mut parts: Vec<CellMap> =
                        (0..n).map(|_| CellMap::with_capacity(each)).collect();
                    for (packed, cell) in cells {
                        if let Some(part) = parts.get_mut(share(packed)) {
                            part.insert(packed, cell);
                        }
                    }
                    *out = parts;
                });
            }
        });
        // Transposed: `shares[share]` holds that share of every source.
        let mut shares: Vec<Vec<CellMap>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
        for parts in split {
            for (i, part) in parts.into_iter().enumerate() {
                if let Some(to) = shares.get_mut(i) {
                    to.push(part);
                }
            }
        }
        let mut merged: Vec<CellMap> = (0..n).map(|_| CellMap::default()).collect();
        std::thread::scope(|scope| {
            for (mut parts, out) in shares.into_iter().zip(merged.iter_mut()) {
                scope.spawn(move || {
                    // The largest part takes in the others.
                    parts.sort_by_key(|p| std::cmp::Reverse(p.len()));
                    let mut parts = parts.into_iter();
                    let mut base = parts.next().unwrap_or_default();
                    for part in parts {
                        for (packed, cell) in part {
                            base.merge_in(packed, cell);
                        }
                    }
                    *out = base;
                });
            }
        });
        let mut merged = merged.into_iter();
        self.cells = merged.next().unwrap_or_default();
        self.cells
            .reserve(merged.as_slice().iter().map(CellMap::len).sum());
        for part in merged {
            self.cells.extend(part);
        }
        Ok(())
    }

    /// The shard, of `shards`, that holds a network's cells when a scoreboard is split
    /// ([`Scoreboard::split`], [`crate::shared::SharedScoreboard`]): every cell of one network,
    /// under every metric and provider (pairs included), lands in the same shard.
    pub fn shard_of(network: ClientNetwork, shards: usize) -> usize {
        shard_of_packed(BaseKey::of(Metric::Ttfb, 0, network).pack(), shards)
    }

    /// Splits the scoreboard into `shards` (at least one), the cells of each network going to
    /// its [`Scoreboard::shard_of`]; the counters ([`Quality`]) go to the first. Joining the
    /// parts again with [`Scoreboard::absorb`] gives back this scoreboard.
    pub fn split(mut self, shards: usize) -> Vec<Scoreboard> {
        let shards = shards.max(1);
        let mut parts: Vec<Scoreboard> = (0..shards).map(|_| self.empty_like()).collect();
        for (packed, cell) in std::mem::take(&mut self.cells) {
            if let Some(part) = parts.get_mut(shard_of_packed(packed, shards)) {
                part.cells.insert(packed, cell);
            }
        }
        if let Some(first) = parts.first_mut() {
            first.quality = self.quality;
        }
        parts
    }

    /// [`Scoreboard::split`] into the shards that receive anything (the counters go to the
    /// first of them), each with its index: a small batch makes few parts.
    pub(crate) fn split_sparse(mut self, shards: usize) -> Vec<(usize, Scoreboard)> {
        let shards = shards.max(1);
        let mut parts: Vec<(usize, Scoreboard)> = Vec::new();
        for (packed, cell) in std::mem::take(&mut self.cells) {
            let i = shard_of_packed(packed, shards);
            let at = match parts.iter().position(|(j, _)| *j == i) {
                Some(at) => at,
                None => {
                    parts.push((i, self.empty_like()));
                    parts.len() - 1
                }
            };
            if let Some((_, part)) = parts.get_mut(at) {
                part.cells.insert(packed, cell);
            }
        }
        if parts.is_empty() && self.quality != Quality::default() {
            parts.push((0, self.empty_like()));
        }
        if let Some((_, first)) = parts.first_mut() {
            first.quality = self.quality;
        }
        parts
    }

    /// A scoreboard with this one's configuration and providers, and nothing in it.
    fn empty_like(&self) -> Scoreboard {
        Scoreboard {
            config: self.config.clone(),
            providers: self.providers.clone(),
            cells: CellMap::default(),
            quality: Quality::default(),
            bucket_ms: self.bucket_ms,
            keep: self.keep,
            newest: self.newest,
        }
    }

    /// [`Scoreboard::merge`] of a scoreboard given up: when the two name the same providers
    /// with the same bucket length (the shards of one [`Scoreboard::split`], a batch ingested
    /// beside the board), its cells move here rather than being copied, and a cell both hold
    /// is merged; otherwise it is [`Scoreboard::merge`].
    pub fn absorb(&mut self, other: Scoreboard) -> Result<(), SteeringError> {
        if self.providers != other.providers || self.bucket_ms != other.bucket_ms {
            return self.merge(&other);
        }
        self.absorb_cells(other);
        Ok(())
    }

    /// [`Scoreboard::absorb`] of a scoreboard known to name the same providers with the same
    /// bucket length.
    pub(crate) fn absorb_cells(&mut self, other: Scoreboard) {
        self.quality.add(&other.quality);
        self.newest = self.newest.max(other.newest);
        if self.cells.is_empty() {
            self.cells = other.cells;
            return;
        }
        self.cells.reserve(other.cells.len());
        for (packed, cell) in other.cells {
            self.cells.merge_in(packed, cell);
        }
    }

    /// One [`Snapshot`] per window, in the order given (the policy's
    /// [`RumPolicy::read_windows`], shortest first, for
    /// [`cohort_inputs_over`](crate::engine::cohorts::cohort_inputs_over)).
    ///
    /// The windows all end at `now`, so one pass over each cell's buckets, newest first,
    /// serves them all: a window's aggregate is what the pass has added when it reaches the
    /// window's first bucket.
    pub fn snapshots(&self, now: Timestamp, windows: &[Duration]) -> Vec<Snapshot> {
        self.snapshots_on(now, windows, 1)
    }

    /// [`Scoreboard::snapshots`] on up to `threads` threads (a board of at least 65,536 cells;
    /// a smaller one is read on one): each thread reads the cells of its own ASNs, so the
    /// ASNs' cuts are built on one thread each and only the countries' and `*` are merged
    /// after. The snapshots are those of [`Scoreboard::snapshots`].
    pub fn snapshots_on(
        &self,
        now: Timestamp,
        windows: &[Duration],
        threads: usize,
    ) -> Vec<Snapshot> {
        read_snapshots(&[self], now, windows, threads, false).0
    }

    /// [`Scoreboard::snapshot`] on up to `threads` threads (see [`Scoreboard::snapshots_on`]).
    pub fn snapshot_on(&self, now: Timestamp, window: Duration, threads: usize) -> Snapshot {
        self.snapshots_on(now, &[window], threads)
            .pop()
            .unwrap_or_else(|| ReadPart::empty(self, now, window))
    }

    /// Rolls the buckets of the `window` ending at `now` up into every cut.
    pub fn snapshot(&self, now: Timestamp, window: Duration) -> Snapshot {
        self.snapshots(now, &[window])
            .pop()
            .unwrap_or_else(|| ReadPart::empty(self, now, window))
    }
}

/// How large scoreboards are: what [`ScoreboardShards::cells`] and
/// [`ScoreboardShards::heap_bytes`] answer, counted by a read of the window as it walks the
/// cells ([`ScoreboardShards::snapshots_sized_on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScoreboardSize {
    /// Base cells holding data (a key several shards hold counts once).
    pub cells: usize,
    /// Bytes the cells, their table and keys hold on the heap.
    pub heap_bytes: usize,
}

impl ScoreboardSize {
    fn add(&mut self, other: ScoreboardSize) {
        self.cells += other.cells;
        self.heap_bytes += other.heap_bytes;
    }
}

/// Scoreboards that each hold part of one stream (the shards of a parallel ingest,
/// [`crate::ingest::Ingestor::ingest_reader_shards`], which reads on one thread a shard), read
/// as one without merging them: a key
/// several shards hold is read once, its cells' buckets added together, so a snapshot is that
/// of the shards merged, at the cost of reading them rather than of re-packing every bucket
/// two shards share. [`ScoreboardShards::merged`] makes them one scoreboard, for a caller that
/// goes on writing. As with [`Scoreboard::merge`], a window longer than the retention may hold
/// buckets one scoreboard fed everything would have dropped (a shard drops a cell's old buckets
/// only when a newer one opens in that shard).
#[derive(Debug, Clone)]
pub struct ScoreboardShards {
    /// Never empty.
    boards: Vec<Scoreboard>,
    /// The first shard's settings and providers, for the snapshots.
    like: Scoreboard,
}

impl ScoreboardShards {
    /// The shards, read as one. They must share a bucket length; they may know different
    /// providers (each learnt its own from the beacons): each then learns the others', so
    /// they name the same.
    pub fn new(boards: Vec<Scoreboard>) -> Result<ScoreboardShards, SteeringError> {
        let Some(first) = boards.first() else {
            return Err(SteeringError::Merge("no scoreboard to read".into()));
        };
        let bucket_ms = first.bucket_ms;
        let first_like = first.empty_like();
        if let Some(other) = boards.iter().find(|b| b.bucket_ms != bucket_ms) {
            return Err(SteeringError::Merge(format!(
                "bucket lengths differ ({bucket_ms} ms in the first, {} ms in another); shards must share one bucket length",
                other.bucket_ms
            )));
        }
        let mut shards = ScoreboardShards {
            boards,
            like: first_like,
        };
        shards.align_providers()?;
        Ok(shards)
    }

    /// Every shard made to name every provider any of them names.
    pub(crate) fn align_providers(&mut self) -> Result<(), SteeringError> {
        let mut all: Vec<ProviderId> = self
            .boards
            .iter()
            .flat_map(|b| b.providers.iter().cloned())
            .collect();
        all.sort();
        all.dedup();
        for board in &mut self.boards {
            if board.providers != all {
                for p in &all {
                    board.add_provider(p.clone())?;
                }
            }
        }
        if let Some(first) = self.boards.first() {
            self.like = first.empty_like();
        }
        Ok(())
    }

    /// The shards, to be written (by [`crate::ingest::Ingestor::ingest_reader_shards`]).
    pub(crate) fn boards_mut(&mut self) -> &mut [Scoreboard] {
        &mut self.boards
    }

    /// How many shards.
    pub fn shards(&self) -> usize {
        self.boards.len()
    }

    /// The providers, sorted (every shard names these).
    pub fn providers(&self) -> &[ProviderId] {
        self.like.providers()
    }

    /// What the shards kept and dropped, added up.
    pub fn quality(&self) -> Quality {
        let mut q = Quality::default();
        for b in &self.boards {
            q.add(&b.quality);
        }
        q
    }

    /// How many base cells hold data (a key several shards hold counts once).
    pub fn cells(&self) -> usize {
        self.per_shard(|i, b| {
            let earlier = self.boards.get(..i).unwrap_or_default();
            b.cells
                .keys()
                .filter(|k| !earlier.iter().any(|e| e.cells.contains_key(*k)))
                .count()
        })
        .into_iter()
        .sum()
    }

    /// Bytes the shards hold on the heap ([`Scoreboard::heap_bytes`] of each, added up).
    pub fn heap_bytes(&self) -> usize {
        self.per_shard(|_, b| b.heap_bytes()).into_iter().sum()
    }

    /// `f` of each shard (its place and itself), on a thread a shard when they are large
    /// enough for threads to pay (as a read is, [`read_snapshots`]).
    fn per_shard<T: Send>(&self, f: impl Fn(usize, &Scoreboard) -> T + Sync) -> Vec<T> {
        let cells: usize = self.boards.iter().map(|b| b.cells.len()).sum();
        if self.boards.len() == 1 || cells < PARALLEL_CELLS {
            return self
                .boards
                .iter()
                .enumerate()
                .map(|(i, b)| f(i, b))
                .collect();
        }
        let f = &f;
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .boards
                .iter()
                .enumerate()
                .map(|(i, b)| scope.spawn(move || f(i, b)))
                .collect();
            handles.into_iter().map(joined).collect()
        })
    }

    /// [`Scoreboard::snapshots_on`] of the shards read as one: the snapshots of the shards
    /// merged. With as many threads as shards, each thread walks one shard (where otherwise
    /// each walks them all for its ASNs' keys): the read of two shards of a 2 M-line log on two
    /// threads takes 77 ms where it took 84, by the medians of six runs each (the whole log in
    /// one scoreboard, read on one thread: 100 ms).
    pub fn snapshots_on(
        &self,
        now: Timestamp,
        windows: &[Duration],
        threads: usize,
    ) -> Vec<Snapshot> {
        self.read(now, windows, threads, false).0
    }

    /// [`ScoreboardShards::snapshots_on`], and the shards' size counted as the read walks
    /// their cells: [`ScoreboardShards::cells`] and [`ScoreboardShards::heap_bytes`] without
    /// a walk of their own (on the two shards of a 2 M-line log, those take 8-12 and 7-9 ms).
    pub fn snapshots_sized_on(
        &self,
        now: Timestamp,
        windows: &[Duration],
        threads: usize,
    ) -> (Vec<Snapshot>, ScoreboardSize) {
        self.read(now, windows, threads, true)
    }

    /// [`read_snapshots`] of the shards; `sized`: their heap bytes counted too.
    fn read(
        &self,
        now: Timestamp,
        windows: &[Duration],
        threads: usize,
        sized: bool,
    ) -> (Vec<Snapshot>, ScoreboardSize) {
        let boards: Vec<&Scoreboard> = self.boards.iter().collect();
        read_snapshots(&boards, now, windows, threads, sized)
    }

    /// [`ScoreboardShards::snapshots_on`] of one window.
    pub fn snapshot_on(&self, now: Timestamp, window: Duration, threads: usize) -> Snapshot {
        self.snapshots_on(now, &[window], threads)
            .pop()
            .unwrap_or_else(|| ReadPart::empty(&self.like, now, window))
    }

    /// [`ScoreboardShards::snapshots_sized_on`] of one window.
    pub fn snapshot_sized_on(
        &self,
        now: Timestamp,
        window: Duration,
        threads: usize,
    ) -> (Snapshot, ScoreboardSize) {
        let (mut snapshots, size) = self.snapshots_sized_on(now, &[window], threads);
        let snapshot = snapshots
            .pop()
            .unwrap_or_else(|| ReadPart::empty(&self.like, now, window));
        (snapshot, size)
    }

    /// The shards merged into one scoreboard (on one thread a shard; see
    /// [`Scoreboard::merge`]).
    pub fn merged(self) -> Scoreboard {
        let mut board = self.like;
        // Same providers and bucket length as `like`: no merge can fail.
        let _ = board.merge_shards(self.boards);
        board
    }
}

/// [`Scoreboard::snapshots_on`] of `boards` read as one (they name the same providers, with
/// the same bucket length, as [`ScoreboardShards`] makes them): a key held by several boards
/// is read once, its cells' buckets added together, so the snapshots are those of the boards
/// merged. With them, the boards' size, counted as they are walked: their cells, and with
/// `sized` their heap bytes (a read for a decision round wants neither, and the bytes cost a
/// look at every cell's closed buckets).
fn read_snapshots(
    boards: &[&Scoreboard],
    now: Timestamp,
    windows: &[Duration],
    threads: usize,
    sized: bool,
) -> (Vec<Snapshot>, ScoreboardSize) {
    let Some(first_board) = boards.first() else {
        return (Vec::new(), ScoreboardSize::default());
    };
    let current = first_board.bucket_at(now);
    let firsts: Vec<u32> = windows
        .iter()
        .map(|window| {
            let span = u32::try_from(
                u64::try_from(window.as_millis())
                    .unwrap_or(u64::MAX)
                    .div_ceil(first_board.bucket_ms),
            )
            .unwrap_or(u32::MAX)
            .max(1);
            current.saturating_sub(span - 1)
        })
        .collect();
    // The pass visits windows from the newest first bucket to the oldest.
    let mut order: Vec<usize> = (0..windows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(firsts[i]));
    let ordered_firsts: Vec<u32> = order.iter().map(|&i| firsts[i]).collect();
    let windows_read = WindowsRead {
        firsts: &ordered_firsts,
        order: &order,
        current,
        sized,
    };
    // Reads the cells `take` picks (by packed key) of every board.
    let read = |take: &dyn Fn(u64) -> bool| -> (Vec<ReadPart>, ScoreboardSize) {
        let mut reader = windows_read.reader();
        let mut group: Vec<&Cell> = Vec::with_capacity(boards.len());
        let mut chunk: Vec<(u64, &Cell)> = Vec::with_capacity(READ_AHEAD);
        for (i, board) in boards.iter().enumerate() {
            let mut walk = board.cells.iter();
            while next_chunk(&mut walk, &mut chunk) {
                touch_ahead(chunk.iter().filter(|(k, _)| take(*k)).map(|(_, c)| *c));
                for &(packed, cell) in &chunk {
                    if !take(packed) {
                        continue;
                    }
                    // Each board's cells of the keys taken here are walked here alone.
                    reader.walked(cell);
                    // A key an earlier board holds was read with it.
                    if boards
                        .get(..i)
                        .is_some_and(|earlier| earlier.iter().any(|b| b.cells.contains_key(packed)))
                    {
                        continue;
                    }
                    group.clear();
                    group.push(cell);
                    if let Some(later) = boards.get(i + 1..) {
                        group.extend(later.iter().filter_map(|b| b.cells.get(packed)));
                    }
                    reader.add(packed, &group);
                }
            }
        }
        reader.finish()
    };
    let threads = threads.clamp(1, 16);
    let cells: usize = boards.iter().map(|b| b.cells.len()).sum();
    // An ASN's cells (in every country) go to one thread: its cuts are whole there.
    let owner = |packed: u64| asn_share(packed >> 28, threads);
    let read_by: Vec<(Vec<ReadPart>, ScoreboardSize)> = if threads == 1 || cells < PARALLEL_CELLS {
        vec![read(&|_| true)]
    } else if threads == boards.len() {
        read_shard_by_shard(boards, &windows_read, &owner)
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let read = &read;
                    scope.spawn(move || read(&|packed| owner(packed) == i))
                })
                .collect();
            handles.into_iter().map(joined).collect()
        })
    };
    // Each window's parts, in thread order.
    let mut by_window: Vec<Vec<ReadPart>> = windows
        .iter()
        .map(|_| Vec::with_capacity(read_by.len()))
        .collect();
    let mut size = ScoreboardSize::default();
    for (parts, thread_size) in read_by {
        size.add(thread_size);
        for (list, part) in by_window.iter_mut().zip(parts) {
            list.push(part);
        }
    }
    if sized {
        size.heap_bytes += boards.iter().map(|b| b.table_bytes()).sum::<usize>();
    }
    let snapshots = by_window
        .into_iter()
        .zip(windows)
        .map(|(parts, &window)| ReadPart::into_snapshot(parts, first_board, now, window))
        .collect();
    (snapshots, size)
}

/// The thread of `threads` that reads a key's cells, by its ASN bits (`packed >> 28`: the ASN
/// plus one, 0 for none): every cell of an ASN, in every country, is read on one thread, so
/// the ASN's cuts are whole there, and a snapshot finds them in that thread's [`AsnPart`].
fn asn_share(asn_bits: u64, threads: usize) -> usize {
    (KeyHasher::default().hashed(asn_bits) % threads.max(1) as u64) as usize
}

/// The fewest cells (over every board read) worth reading on several threads.
const PARALLEL_CELLS: usize = 65_536;

/// How many cells a walk over a board reads ahead ([`Cell::touch`]).
const READ_AHEAD: usize = 32;

/// The next [`READ_AHEAD`] cells of `walk` into `chunk`; `false` when none are left.
#[inline]
fn next_chunk<'a>(
    walk: &mut impl Iterator<Item = (u64, &'a Cell)>,
    chunk: &mut Vec<(u64, &'a Cell)>,
) -> bool {
    chunk.clear();
    chunk.extend(walk.by_ref().take(READ_AHEAD));
    !chunk.is_empty()
}

/// [`Cell::touch`] of each of `cells`, in one tight loop (their misses overlap).
#[inline]
fn touch_ahead<'a>(cells: impl Iterator<Item = &'a Cell>) {
    // Kept, so the reads are made.
    std::hint::black_box(cells.fold(0u32, |x, c| x ^ c.touch()));
}

/// What a scoped thread returned, its panic raised again.
pub(crate) fn joined<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The windows a read adds cells up over (see [`Cell::add_windows`]): their first buckets,
/// newest first, which window each is, and the bucket they end with.
struct WindowsRead<'a> {
    firsts: &'a [u32],
    order: &'a [usize],
    current: u32,
    /// The readers count the heap bytes of the cells they walk.
    sized: bool,
}

impl WindowsRead<'_> {
    /// A reader starting empty.
    fn reader(&self) -> WindowsReader<'_> {
        self.reader_into(
            self.order.iter().map(|_| Parts::default()).collect(),
            ScoreboardSize::default(),
        )
    }

    /// A reader adding to `parts` (one a window, as [`WindowsReader::parts`]) and `size`.
    fn reader_into(&self, parts: Vec<Parts>, size: ScoreboardSize) -> WindowsReader<'_> {
        WindowsReader {
            windows: self,
            parts,
            size,
            acc: Accumulator::new(),
            aggs: Vec::with_capacity(self.order.len()),
        }
    }
}

/// One thread's read of cells into the windows' [`Parts`].
struct WindowsReader<'a> {
    windows: &'a WindowsRead<'a>,
    /// One a window, in the order the windows were asked for.
    parts: Vec<Parts>,
    /// The keys read (each once, whatever boards hold it) and, in a sized read, the heap bytes
    /// of the cells the thread walked ([`WindowsReader::walked`]).
    size: ScoreboardSize,
    acc: Accumulator,
    aggs: Vec<Agg>,
}

impl WindowsReader<'_> {
    /// The thread's parts, one a window in the order asked for, finished
    /// ([`Parts::finish`]), and what it counted.
    fn finish(self) -> (Vec<ReadPart>, ScoreboardSize) {
        (
            self.parts.into_iter().map(Parts::finish).collect(),
            self.size,
        )
    }

    /// Counts the heap bytes of a cell this thread walks (each cell of each board is walked by
    /// one thread), when the read is sized.
    #[inline]
    fn walked(&mut self, cell: &Cell) {
        if self.windows.sized {
            self.size.heap_bytes += cell.heap_bytes();
        }
    }

    /// Adds the cells one key has in the boards read (one a board at most) to every window.
    #[inline]
    fn add(&mut self, packed: u64, group: &[&Cell]) {
        self.size.cells += 1;
        let w = self.windows;
        self.acc.clear();
        self.aggs.clear();
        Cell::add_windows(group, w.firsts, w.current, &mut self.acc, &mut self.aggs);
        let key = BaseKey::unpack(packed);
        for (agg, &i) in self.aggs.drain(..).zip(w.order) {
            if let Some(p) = self.parts.get_mut(i) {
                p.add(key, agg);
            }
        }
    }
}

/// Keys a thread found in its board that another thread reads (it owns their ASN) though that
/// thread's board does not hold them, with their cells in the boards from this one on.
#[derive(Default)]
struct Handed<'a> {
    keys: Vec<(u64, usize, usize)>,
    cells: Vec<&'a Cell>,
}

/// [`read_snapshots`] on one thread a board, each walking its own board only: thread `t` reads
/// a key of its board whose ASN it owns (`owner`) with that key's cells in the other boards;
/// a key whose owner's board holds it is left to the owner; any other key (in no board of its
/// owner) is handed to the owner by the first board holding it, and read there once every
/// board is walked. Every key is read once, every ASN's keys on one thread, as in the read
/// where each thread walks every board and keeps its own ASNs; each cell is walked once
/// rather than once a thread.
fn read_shard_by_shard(
    boards: &[&Scoreboard],
    windows: &WindowsRead<'_>,
    owner: &(dyn Fn(u64) -> usize + Sync),
) -> Vec<(Vec<ReadPart>, ScoreboardSize)> {
    let n = boards.len();
    // Each thread's parts and size so far and what it hands each owner.
    type Walked<'a> = (Vec<Parts>, ScoreboardSize, Vec<Handed<'a>>);
    let walked: Vec<Walked<'_>> = std::thread::scope(|scope| {
        let handles: Vec<_> = boards
            .iter()
            .enumerate()
            .map(|(t, board)| {
                scope.spawn(move || {
                    let mut reader = windows.reader();
                    let mut handed: Vec<Handed<'_>> = (0..n).map(|_| Handed::default()).collect();
                    let mut group: Vec<&Cell> = Vec::with_capacity(n);
                    let mut chunk: Vec<(u64, &Cell)> = Vec::with_capacity(READ_AHEAD);
                    // Each key's cell in every board (`None` in this one), a chunk of keys at
                    // a time: the lookups and their cells' reads overlap.
                    let mut found: Vec<Option<&Cell>> = Vec::with_capacity(READ_AHEAD * n);
                    let mut walk = board.cells.iter();
                    while next_chunk(&mut walk, &mut chunk) {
                        found.clear();
                        for &(packed, _) in &chunk {
                            found.extend(
                                boards
                                    .iter()
                                    .enumerate()
                                    .map(|(s, b)| if s == t { None } else { b.cells.get(packed) }),
                            );
                        }
                        touch_ahead(
                            chunk
                                .iter()
                                .map(|(_, c)| *c)
                                .chain(found.iter().flatten().copied()),
                        );
                        // This thread walks every cell of its board.
                        for &(_, cell) in &chunk {
                            reader.walked(cell);
                        }
                        for (&(packed, cell), others) in chunk.iter().zip(found.chunks(n)) {
                            let o = owner(packed);
                            group.clear();
                            group.push(cell);
                            if o == t {
                                group.extend(others.iter().flatten());
                                reader.add(packed, &group);
                                continue;
                            }
                            let held_by = |s: usize| others.get(s).is_some_and(Option::is_some);
                            // The owner reads it from its own board, or an earlier board hands
                            // it.
                            if held_by(o) || (0..t).any(|s| s != o && held_by(s)) {
                                continue;
                            }
                            group.extend(
                                others
                                    .iter()
                                    .enumerate()
                                    .skip(t + 1)
                                    .filter(|(s, _)| *s != o)
                                    .filter_map(|(_, c)| *c),
                            );
                            if let Some(h) = handed.get_mut(o) {
                                h.keys.push((packed, h.cells.len(), group.len()));
                                h.cells.extend_from_slice(&group);
                            }
                        }
                    }
                    (reader.parts, reader.size, handed)
                })
            })
            .collect();
        handles.into_iter().map(joined).collect()
    });
    // Each owner reads what was handed to it, into its own parts.
    let mut parts = Vec::with_capacity(n);
    let mut to: Vec<Vec<Handed<'_>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
    for (read, size, from) in walked {
        parts.push((read, size));
        for (list, h) in to.iter_mut().zip(from) {
            list.push(h);
        }
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .into_iter()
            .zip(to)
            .map(|((parts, size), handed)| {
                scope.spawn(move || {
                    let mut reader = windows.reader_into(parts, size);
                    for h in &handed {
                        for &(packed, at, len) in &h.keys {
                            if let Some(group) = h.cells.get(at..at + len) {
                                reader.add(packed, group);
                            }
                        }
                    }
                    reader.finish()
                })
            })
            .collect();
        handles.into_iter().map(joined).collect()
    })
}

/// The shard of `shards` a packed key's network (the bits above metric and provider) is in.
fn shard_of_packed(packed: u64, shards: usize) -> usize {
    let shards = shards.max(1) as u64;
    (KeyHasher::default().hashed(packed >> 18) % shards) as usize
}

/// A snapshot under construction by one thread of a read: the cuts, the base cells and each
/// ASN's countries.
///
/// A base cell is added to its ASN's cut and listed under its country's (or, with no country,
/// `*`); once every cell is in, each country's cut is its cells added up at once, and the
/// continents and `*` are their countries' ([`Parts::finish`]).
#[derive(Default)]
struct Parts {
    /// Each country's cut, and `*`'s for the networks with no country: its base cells, by
    /// their place in `base`.
    direct: FxHashMap<CutKey, Vec<u32>>,
    /// The ASNs' cuts.
    asn_cuts: FxHashMap<CutKey, Agg>,
    base: Vec<(BaseKey, Agg)>,
    asn_countries: FxHashMap<u32, Vec<(Country, u64)>>,
}

impl Parts {
    fn add(&mut self, key: BaseKey, agg: Agg) {
        if agg.samples() == 0 {
            return;
        }
        if let (Some(a), Some(c)) = (key.asn, key.country) {
            let list = self.asn_countries.entry(a).or_default();
            match list.iter_mut().find(|(cc, _)| *cc == c) {
                Some(e) => e.1 += agg.samples(),
                None => list.push((c, agg.samples())),
            }
        }
        let cut = |network| CutKey {
            metric: key.metric,
            network,
            provider: key.provider,
        };
        if let Some(a) = key.asn {
            self.asn_cuts
                .entry(cut(NetworkKey::Asn(a)))
                .or_default()
                .merge(&agg);
        }
        // The country's cut, added up at the end and rolled up into its continent and `*`; a
        // network with no country counts in `*` alone.
        let direct = match key.country {
            Some(c) => NetworkKey::Country(c),
            None => NetworkKey::Global,
        };
        // Fewer than 2^32 cells: a place in `base` fits.
        self.direct
            .entry(cut(direct))
            .or_default()
            .push(self.base.len() as u32);
        self.base.push((key, agg));
    }

    /// The countries', continents' and `*` cuts: each country's base cells added up in one
    /// pass through a dense [`Accumulator`], then each continent's countries and `*`'s (its
    /// own networks and every country). Merged one cell at a time into the country's sparse
    /// sketch instead, each cell cost a search per bin: 17 of the 75 ms of a one-thread read
    /// of the 2 M-line log.
    fn regions(&self) -> FxHashMap<CutKey, Agg> {
        let mut acc = Accumulator::new();
        let mut sum = |aggs: &mut dyn Iterator<Item = &Agg>| {
            acc.clear();
            let (mut failures, mut newest) = (0u64, 0u64);
            for a in aggs {
                acc.add(&a.sketch);
                failures += a.failures;
                newest = newest.max(a.newest);
            }
            Agg {
                sketch: acc.to_sketch(),
                failures,
                newest,
            }
        };
        let mut cuts = FxHashMap::default();
        cuts.reserve(self.direct.len() * 2);
        let mut up: FxHashMap<CutKey, Vec<CutKey>> = FxHashMap::default();
        for (&key, members) in &self.direct {
            let mut cells = members
                .iter()
                .filter_map(|&i| self.base.get(i as usize))
                .map(|(_, agg)| agg);
            cuts.insert(key, sum(&mut cells));
            if let NetworkKey::Country(country) = key.network {
                let to = |network| CutKey { network, ..key };
                if let Some(k) = multicdn_core::geo::continent_of(country) {
                    up.entry(to(NetworkKey::Continent(k)))
                        .or_default()
                        .push(key);
                }
                up.entry(to(NetworkKey::Global)).or_default().push(key);
            }
        }
        for (key, countries) in up {
            // `*` also holds the networks with no country, listed under it directly.
            let own = cuts.get(&key);
            let mut parts = own
                .into_iter()
                .chain(countries.iter().filter_map(|c| cuts.get(c)));
            let agg = sum(&mut parts);
            cuts.insert(key, agg);
        }
        cuts
    }

    /// Done with the thread's cells: its countries' cuts added up and rolled up into their
    /// continents and `*`, and each of its ASNs' dominant country picked, on the thread that
    /// read them.
    fn finish(self) -> ReadPart {
        let cuts = self.regions();
        let dominant_country = self
            .asn_countries
            .into_iter()
            .filter_map(|(a, list)| {
                list.into_iter()
                    .max_by(|x, y| x.1.cmp(&y.1).then(y.0.cmp(&x.0)))
                    .map(|(c, _)| (a, c))
            })
            .collect();
        ReadPart {
            cuts,
            asns: AsnPart {
                cuts: self.asn_cuts,
                base: self.base,
                dominant_country,
            },
        }
    }
}

/// What one thread of a read made of its cells, finished ([`Parts::finish`]): the countries',
/// continents' and `*` cuts, which every thread has some of, and the part that is its alone.
struct ReadPart {
    cuts: FxHashMap<CutKey, Agg>,
    asns: AsnPart,
}

/// What one thread of a read made of its ASNs (an ASN's cells are all read on one thread,
/// [`asn_share`]): their cuts, the base cells it read and each ASN's dominant country. A
/// snapshot keeps these apart, one a thread, rather than merging them into one map after the
/// read: on a 2 M-line log that merge moved some 48,000 cuts at about 130 ns each, a serial
/// 9 ms of a two-thread read of 70.
#[derive(Debug, Clone, Default)]
struct AsnPart {
    cuts: FxHashMap<CutKey, Agg>,
    base: Vec<(BaseKey, Agg)>,
    dominant_country: FxHashMap<u32, Country>,
}

impl ReadPart {
    /// The snapshot of the parts every thread of a read made of one window, in thread order
    /// (the thread of [`asn_share`] `i` at `i`): the countries', continents' and `*` cuts
    /// merged, the ASN parts kept.
    fn into_snapshot(
        parts: Vec<ReadPart>,
        board: &Scoreboard,
        now: Timestamp,
        window: Duration,
    ) -> Snapshot {
        let mut cuts = FxHashMap::default();
        let mut asns = Vec::with_capacity(parts.len());
        for part in parts {
            if cuts.is_empty() {
                cuts = part.cuts;
            } else {
                for (key, agg) in part.cuts {
                    match cuts.entry(key) {
                        std::collections::hash_map::Entry::Occupied(o) => o.into_mut().merge(&agg),
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(agg);
                        }
                    }
                }
            }
            asns.push(part.asns);
        }
        Snapshot {
            at: now,
            window,
            min_samples: board.config.min_samples,
            fresh_for: board.config.fresh_for,
            providers: board.providers.clone(),
            cuts,
            asns,
        }
    }

    /// The snapshot of a window with no data.
    fn empty(board: &Scoreboard, now: Timestamp, window: Duration) -> Snapshot {
        ReadPart::into_snapshot(Vec::new(), board, now, window)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CutKey {
    metric: Metric,
    network: NetworkKey,
    provider: u16,
}

/// A cut's data within a window.
#[derive(Debug, Clone, Default, PartialEq)]
struct Agg {
    sketch: Sketch,
    failures: u64,
    newest: u64,
}

impl Agg {
    fn merge(&mut self, o: &Agg) {
        self.sketch.merge(&o.sketch);
        self.failures += o.failures;
        self.newest = self.newest.max(o.newest);
    }

    fn samples(&self) -> u64 {
        self.sketch.count() + self.failures
    }
}

/// Two providers compared on the same probe loads (same user, same moment): how many loads
/// timed both, the typical ratio, and how much of the two providers' spread the users share.
///
/// The spreads are read robustly, as the interquartile range of the log times over 1.349
/// (a log-normal's σ; one pathological fetch moves it no more than any other slow one). With
/// `σa`, `σb` the two providers' own and `σd` their ratio's, the correlation of one load's two
/// log times is `(σa² + σb² - σd²) / (2 σa σb)`: near 1 when the users' own speed (device,
/// last mile) makes most of the spread, near 0 when every fetch is a fresh draw. The variance
/// of the difference of the two providers' estimates shrinks by that correlation, which is
/// what lets a paired cohort be judged on fewer loads than independent samples need.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pairing {
    /// Probe loads that timed both providers successfully.
    pub pairs: u64,
    /// The median, over those loads, of the first provider's time over the second's.
    pub median_ratio: f64,
    /// The correlation of one load's two log times, -1 to 1.
    pub correlation: f64,
}

impl Pairing {
    /// From the two providers' probe cells and their pair cell; `swap` when the pair cell's
    /// ratio is the second provider's over the first's.
    fn of(a: &Agg, b: &Agg, ratio: &Agg, swap: bool) -> Option<Pairing> {
        let spread = |agg: &Agg| -> Option<f64> {
            let [q25, q75] = agg.sketch.quantiles(&[0.25, 0.75]);
            let (q25, q75) = (q25?, q75?);
            (q25 > 0.0 && q75 >= q25).then(|| (q75 / q25).ln() / 1.349)
        };
        let pairs = ratio.sketch.count();
        if pairs == 0 {
            return None;
        }
        let (sa, sb, sd) = (spread(a)?, spread(b)?, spread(ratio)?);
        let median = ratio.sketch.quantile(0.5)?;
        let median_ratio = if swap { 1.0 / median } else { median };
        let correlation = if sa > 0.0 && sb > 0.0 {
            ((sa * sa + sb * sb - sd * sd) / (2.0 * sa * sb)).clamp(-1.0, 1.0)
        } else {
            0.0
        };
        (median_ratio.is_finite() && correlation.is_finite()).then_some(Pairing {
            pairs,
            median_ratio,
            correlation,
        })
    }
}

/// Whether a cell may steer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CellStatus {
    /// Enough fresh samples.
    Steerable,
    /// Fewer samples than the minimum.
    TooFewSamples {
        /// Samples held.
        samples: u64,
        /// Samples needed.
        needed: u64,
    },
    /// The newest sample is too old.
    Stale {
        /// Its age.
        #[serde(with = "multicdn_core::policy::units::duration_ms")]
        age: Duration,
        /// The limit.
        #[serde(with = "multicdn_core::policy::units::duration_ms")]
        limit: Duration,
    },
    /// No data at all.
    Empty,
}

impl CellStatus {
    /// True for [`CellStatus::Steerable`].
    pub fn is_steerable(&self) -> bool {
        matches!(self, CellStatus::Steerable)
    }
}

/// One cell as read: its statistics and whether it may steer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellView {
    /// The cut it was read at (after any fallback).
    pub network: NetworkKey,
    /// Samples, age, percentiles, availability.
    pub stats: CellStats,
    /// Steerable or why not.
    pub status: CellStatus,
}

/// Every cut of a scoreboard over one window, read at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When it was read.
    pub at: Timestamp,
    /// The window.
    pub window: Duration,
    min_samples: u64,
    fresh_for: Duration,
    providers: Vec<ProviderId>,
    /// The countries', continents' and `*` cuts.
    cuts: FxHashMap<CutKey, Agg>,
    /// The ASNs' cuts and the base cells, one part a thread of the read: an ASN is in part
    /// [`asn_share`] of the part count.
    asns: Vec<AsnPart>,
}

impl Snapshot {
    /// The part an ASN's cuts are in.
    fn asn_part(&self, asn: u32) -> Option<&AsnPart> {
        self.asns
            .get(asn_share(BaseKey::asn_bits(Some(asn)), self.asns.len()))
    }

    /// A cut's aggregate, if it has one.
    fn cut(&self, key: &CutKey) -> Option<&Agg> {
        match key.network {
            NetworkKey::Asn(a) => self.asn_part(a)?.cuts.get(key),
            _ => self.cuts.get(key),
        }
    }

    /// Every cut's key.
    fn cut_keys(&self) -> impl Iterator<Item = &CutKey> {
        self.cuts
            .keys()
            .chain(self.asns.iter().flat_map(|part| part.cuts.keys()))
    }

    /// Every base cell (a network's own, under its ASN and country) with data in the window.
    fn base(&self) -> impl Iterator<Item = &(BaseKey, Agg)> {
        self.asns.iter().flat_map(|part| &part.base)
    }

    /// The providers, in slot order.
    pub fn providers(&self) -> &[ProviderId] {
        &self.providers
    }

    fn slot(&self, p: &ProviderId) -> Option<u16> {
        self.providers.iter().position(|q| q == p).map(|i| i as u16)
    }

    fn view_of(&self, network: NetworkKey, agg: Option<&Agg>, metric: Metric) -> CellView {
        let Some(agg) = agg.filter(|a| a.samples() > 0) else {
            return CellView {
                network,
                stats: CellStats::default(),
                status: CellStatus::Empty,
            };
        };
        let [p50, p75, p90, p99] = agg.sketch.quantiles(&[0.5, 0.75, 0.9, 0.99]);
        let samples = agg.samples();
        let age = self.at.since(Timestamp::from_millis(agg.newest));
        let mut stats = CellStats::new(samples, age, p75);
        stats.p50 = p50;
        stats.p90 = p90;
        stats.p99 = p99;
        if metric == Metric::Probe {
            stats.availability = Some(agg.sketch.count() as f64 / samples as f64);
        }
        let status = if samples < self.min_samples {
            CellStatus::TooFewSamples {
                samples,
                needed: self.min_samples,
            }
        } else if age > self.fresh_for {
            CellStatus::Stale {
                age,
                limit: self.fresh_for,
            }
        } else {
            CellStatus::Steerable
        };
        CellView {
            network,
            stats,
            status,
        }
    }

    /// The cell of one cut, exactly (no fallback).
    pub fn cell(&self, metric: Metric, network: NetworkKey, provider: &ProviderId) -> CellView {
        let agg = self.slot(provider).and_then(|provider| {
            self.cut(&CutKey {
                metric,
                network,
                provider,
            })
        });
        self.view_of(network, agg, metric)
    }

    /// The samples a cell needs to be steerable.
    pub fn min_samples(&self) -> u64 {
        self.min_samples
    }

    /// How many samples one provider's cell holds: [`Snapshot::cell`]'s count, without
    /// reading its quantiles.
    pub fn cell_samples(&self, metric: Metric, network: NetworkKey, provider: &ProviderId) -> u64 {
        self.slot(provider)
            .and_then(|provider| {
                self.cut(&CutKey {
                    metric,
                    network,
                    provider,
                })
            })
            .map_or(0, Agg::samples)
    }

    /// One cell merged from several cuts (a region's countries), read as one.
    pub fn merged(
        &self,
        metric: Metric,
        networks: &[NetworkKey],
        provider: &ProviderId,
    ) -> CellView {
        let label = if networks.len() == 1 {
            networks[0]
        } else {
            NetworkKey::Global
        };
        let Some(slot) = self.slot(provider) else {
            return self.view_of(label, None, metric);
        };
        if networks.contains(&NetworkKey::Global) {
            return self.cell(metric, NetworkKey::Global, provider);
        }
        let mut agg = Agg::default();
        for n in networks {
            if let Some(a) = self.cut(&CutKey {
                metric,
                network: *n,
                provider: slot,
            }) {
                agg.merge(a);
            }
        }
        self.view_of(label, Some(&agg), metric)
    }

    /// One cell merged from every client network `include` accepts: a region's traffic
    /// without the networks carved out of it into cohorts of their own.
    pub fn merged_where(
        &self,
        metric: Metric,
        provider: &ProviderId,
        label: NetworkKey,
        include: impl Fn(&ClientNetwork) -> bool,
    ) -> CellView {
        let mut agg = Agg::default();
        if let Some(slot) = self.slot(provider) {
            for (key, a) in self.base() {
                if key.metric == metric
                    && key.provider == slot
                    && include(&ClientNetwork::new(key.asn, key.country))
                {
                    agg.merge(a);
                }
            }
        }
        self.view_of(label, Some(&agg), metric)
    }

    /// One cell merged from every client network `include` accepts, over every provider: what
    /// the users of a region saw, whoever served them (a drill's before and after).
    pub fn merged_all_where(
        &self,
        metric: Metric,
        label: NetworkKey,
        include: impl Fn(&ClientNetwork) -> bool,
    ) -> CellView {
        let mut agg = Agg::default();
        for (key, a) in self.base() {
            if key.metric == metric && include(&ClientNetwork::new(key.asn, key.country)) {
                agg.merge(a);
            }
        }
        self.view_of(label, Some(&agg), metric)
    }

    /// The finest cut of `chain` (finest first) where every provider's cell is steerable.
    pub fn cut_for(
        &self,
        metric: Metric,
        chain: &[NetworkKey],
        providers: &[ProviderId],
    ) -> Option<NetworkKey> {
        chain.iter().copied().find(|n| {
            providers
                .iter()
                .all(|p| self.cell(metric, *n, p).status.is_steerable())
        })
    }

    /// One provider's cell with fallback: the first steerable cut of `chain`, or the finest
    /// cut's view (insufficient) when none is.
    pub fn cell_with_fallback(
        &self,
        metric: Metric,
        chain: &[NetworkKey],
        provider: &ProviderId,
    ) -> CellView {
        let mut first = None;
        for n in chain {
            let v = self.cell(metric, *n, provider);
            if v.status.is_steerable() {
                return v;
            }
            first.get_or_insert(v);
        }
        first.unwrap_or_else(|| self.view_of(NetworkKey::Global, None, metric))
    }

    /// The paired comparison of providers `a` and `b` at one cut, from the probe loads that
    /// timed both; `None` without such loads, or when either provider cannot be paired.
    pub fn pairing(&self, network: NetworkKey, a: &ProviderId, b: &ProviderId) -> Option<Pairing> {
        let (sa, sb) = (self.slot(a)?, self.slot(b)?);
        let (lo, hi) = (sa.min(sb), sa.max(sb));
        if lo == hi || hi >= PAIR_SLOTS {
            return None;
        }
        let get = |metric, provider| {
            self.cut(&CutKey {
                metric,
                network,
                provider,
            })
        };
        Pairing::of(
            get(Metric::Probe, sa)?,
            get(Metric::Probe, sb)?,
            get(Metric::Pair, pair_code(lo, hi))?,
            sa > sb,
        )
    }

    /// [`Snapshot::pairing`] over every client network `include` accepts (a region's traffic
    /// without its carved-out networks).
    pub fn pairing_where(
        &self,
        a: &ProviderId,
        b: &ProviderId,
        include: impl Fn(&ClientNetwork) -> bool,
    ) -> Option<Pairing> {
        let (sa, sb) = (self.slot(a)?, self.slot(b)?);
        let (lo, hi) = (sa.min(sb), sa.max(sb));
        if lo == hi || hi >= PAIR_SLOTS {
            return None;
        }
        let code = pair_code(lo, hi);
        let (mut aa, mut ab, mut ratio) = (Agg::default(), Agg::default(), Agg::default());
        for (key, agg) in self.base() {
            let into = match (key.metric, key.provider) {
                (Metric::Probe, p) if p == sa => &mut aa,
                (Metric::Probe, p) if p == sb => &mut ab,
                (Metric::Pair, p) if p == code => &mut ratio,
                _ => continue,
            };
            if include(&ClientNetwork::new(key.asn, key.country)) {
                into.merge(agg);
            }
        }
        Pairing::of(&aa, &ab, &ratio, sa > sb)
    }

    /// When the newest sample in the window arrived (any metric, any provider), `None` when the
    /// window holds none. This is the engine's `data_as_of`: read from the data itself, so
    /// the deadman fires when beacons stop whatever the caller does.
    pub fn newest_sample(&self) -> Option<Timestamp> {
        // `*` is among the countries', continents' and `*` cuts.
        self.cuts
            .iter()
            .filter(|(k, a)| k.network == NetworkKey::Global && a.samples() > 0)
            .map(|(_, a)| a.newest)
            .max()
            .map(Timestamp::from_millis)
    }

    /// Every cut with samples in the window for `metric` (countries, continents, ASNs,
    /// global), sorted.
    pub fn networks(&self, metric: Metric) -> Vec<NetworkKey> {
        let mut out: Vec<NetworkKey> = self
            .cut_keys()
            .filter(|k| k.metric == metric)
            .map(|k| k.network)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The ASNs seen in the window for `metric`.
    pub fn asns(&self, metric: Metric) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .asns
            .iter()
            .flat_map(|part| part.cuts.keys())
            .filter(|k| k.metric == metric)
            .filter_map(|k| match k.network {
                NetworkKey::Asn(a) => Some(a),
                _ => None,
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The country most of an ASN's samples came from.
    pub fn country_of_asn(&self, asn: u32) -> Option<Country> {
        self.asn_part(asn)?.dominant_country.get(&asn).copied()
    }

    /// Samples across all providers in one cut.
    pub fn samples(&self, metric: Metric, network: NetworkKey) -> u64 {
        (0..self.providers.len() as u16)
            .filter_map(|provider| {
                self.cut(&CutKey {
                    metric,
                    network,
                    provider,
                })
            })
            .map(Agg::samples)
            .sum()
    }
}

#[derive(Serialize, Deserialize)]
struct ScoreboardWire {
    config: ScoreboardConfig,
    providers: Vec<ProviderId>,
    quality: Quality,
    cells: Vec<(BaseKey, CellWire)>,
}

/// A cell as serialised: its buckets, oldest first.
#[derive(Serialize, Deserialize)]
struct CellWire {
    buckets: Vec<BucketWire>,
}

impl Serialize for Scoreboard {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // In key order, so one scoreboard always writes the same text.
        let mut cells: Vec<(u64, &Cell)> = self.cells.iter().collect();
        cells.sort_unstable_by_key(|(k, _)| *k);
        ScoreboardWire {
            config: self.config.clone(),
            providers: self.providers.clone(),
            quality: self.quality,
            cells: cells
                .into_iter()
                .map(|(k, c)| {
                    (
                        BaseKey::unpack(k),
                        CellWire {
                            buckets: c.to_wire(),
                        },
                    )
                })
                .collect(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Scoreboard {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let wire = ScoreboardWire::deserialize(d)?;
        let mut sb = Scoreboard::new(wire.config, &wire.providers).map_err(D::Error::custom)?;
        if sb.providers != wire.providers {
            return Err(D::Error::custom("providers must be sorted and unique"));
        }
        for (key, cell) in wire.cells {
            let slots = if key.metric == Metric::Pair {
                let (a, b) = pair_slots(key.provider);
                if a >= b {
                    return Err(D::Error::custom(format!(
                        "a pair cell names slots {a} and {b}; the lower comes first"
                    )));
                }
                b
            } else {
                key.provider
            };
            if usize::from(slots) >= sb.providers.len() {
                return Err(D::Error::custom(format!(
                    "a cell names provider slot {} of {}",
                    key.provider,
                    sb.providers.len()
                )));
            }
            // A cell without buckets holds nothing.
            let Some(cell) = Cell::from_wire(cell.buckets) else {
                continue;
            };
            sb.newest = sb.newest.max(cell.open.index);
            if sb.cells.insert(key.pack(), cell).is_some() {
                return Err(D::Error::custom("a cell appears twice"));
            }
        }
        sb.quality = wire.quality;
        Ok(sb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    fn net(asn: u32, country: &str) -> ClientNetwork {
        ClientNetwork::new(Some(asn), Some(Country::new(country).unwrap()))
    }

    fn board() -> Scoreboard {
        Scoreboard::new(
            ScoreboardConfig::default().min_samples(10),
            &[p("fastly"), p("cloudflare")],
        )
        .unwrap()
    }

    #[test]
    fn the_samples_held_back_are_sized_by_the_cell_table_within_their_bounds() {
        // Eight a slot of the table: what they take grows with the scoreboard, never with
        // the input, and never past 2^20 (24 MiB).
        let held = |cells: usize| {
            let mut sb = board();
            sb.cells.reserve(cells);
            let mut staged = Staged::default();
            sb.stage(&mut staged);
            // The slots the parts were laid out for.
            (staged.cap, staged.mask as usize + 1)
        };
        assert_eq!(held(0).0, STAGE_MIN);
        assert_eq!(held(10_000), (STAGE_MIN, 16_384));
        assert_eq!(held(20_000), (8 * 32_768, 32_768));
        assert_eq!(held(100_000), (STAGE_MAX, 131_072));
        assert_eq!(held(300_000).0, STAGE_MAX);
        // Full at the cap, not before.
        let mut sb = board();
        let mut staged = Staged::default();
        sb.stage(&mut staged);
        let slot = sb.provider_slot("fastly").unwrap();
        let at = Timestamp::from_secs(1_800_000_000);
        for i in 0..STAGE_MIN {
            assert!(!staged.full(), "full after {i} samples");
            let network = net(64_500 + (i % 1_000) as u32, "DE");
            sb.insert_navigation_staged(Some(&mut staged), at, slot, network, 40.0, false);
        }
        assert!(staged.full());
        sb.write_staged(&mut staged);
        assert!(!staged.full());
        assert_eq!(sb.quality().stored, STAGE_MIN as u64);
    }

    fn ttfb(sb: &Scoreboard, at: u64, provider: &str, network: ClientNetwork, v: f64) -> Sample {
        Sample {
            at: Timestamp::from_secs(at),
            metric: Metric::Ttfb,
            provider: sb.provider_slot(provider).unwrap(),
            network,
            value: Some(v),
        }
    }

    #[test]
    fn a_sample_counts_in_every_cut_of_its_network() {
        let mut sb = board();
        for i in 0..20 {
            let s = ttfb(&sb, 1000 + i, "fastly", net(7922, "US"), 100.0 + i as f64);
            sb.insert(&s);
        }
        let snap = sb.snapshot(Timestamp::from_secs(1100), Duration::from_secs(3600));
        for cut in net(7922, "US").cuts() {
            let v = snap.cell(Metric::Ttfb, cut, &p("fastly"));
            assert_eq!(v.stats.samples, 20, "{cut}");
            assert!(v.status.is_steerable(), "{cut} {:?}", v.status);
        }
        assert_eq!(
            snap.cell(Metric::Ttfb, NetworkKey::Global, &p("cloudflare"))
                .status,
            CellStatus::Empty
        );
        assert_eq!(snap.country_of_asn(7922), Country::new("US").ok());
    }

    #[test]
    fn a_thin_asn_falls_back_to_its_country() {
        let mut sb = board();
        for i in 0..5 {
            let s = ttfb(&sb, 1000 + i, "fastly", net(1, "DE"), 50.0);
            sb.insert(&s);
        }
        for i in 0..20 {
            let s = ttfb(&sb, 1000 + i, "fastly", net(2, "DE"), 80.0);
            sb.insert(&s);
        }
        let snap = sb.snapshot(Timestamp::from_secs(1100), Duration::from_secs(3600));
        let chain = net(1, "DE").cuts();
        let thin = snap.cell(Metric::Ttfb, chain[0], &p("fastly"));
        assert_eq!(
            thin.status,
            CellStatus::TooFewSamples {
                samples: 5,
                needed: 10
            }
        );
        let v = snap.cell_with_fallback(Metric::Ttfb, &chain, &p("fastly"));
        assert_eq!(v.network.to_string(), "DE");
        assert_eq!(v.stats.samples, 25);
        assert_eq!(
            snap.cut_for(Metric::Ttfb, &chain, &[p("fastly")]),
            Some(chain[1])
        );
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_cell_is_two_cache_lines_with_what_a_write_reads_in_the_first() {
        assert_eq!(std::mem::size_of::<Cell>(), 128);
        assert_eq!(std::mem::align_of::<Cell>(), 64);
        let open = std::mem::offset_of!(Cell, open);
        for (what, at) in [
            ("key", std::mem::offset_of!(Cell, key)),
            ("index", open + std::mem::offset_of!(OpenBucket, index)),
            ("newest", open + std::mem::offset_of!(OpenBucket, newest)),
            (
                "failures",
                open + std::mem::offset_of!(OpenBucket, failures),
            ),
            ("values", open + std::mem::offset_of!(OpenBucket, bins)),
        ] {
            assert!(at < 48, "{what} at byte {at}");
        }
    }

    #[test]
    fn old_samples_age_out_and_quiet_cells_go_stale() {
        let mut sb = board();
        for i in 0..20 {
            let s = ttfb(&sb, i, "fastly", net(1, "DE"), 50.0);
            sb.insert(&s);
        }
        let snap = sb.snapshot(Timestamp::from_secs(1200), Duration::from_secs(3600));
        assert!(matches!(
            snap.cell(Metric::Ttfb, NetworkKey::Global, &p("fastly"))
                .status,
            CellStatus::Stale { .. }
        ));
        let later = sb.snapshot(Timestamp::from_secs(4 * 3600), Duration::from_secs(3600));
        assert_eq!(
            later
                .cell(Metric::Ttfb, NetworkKey::Global, &p("fastly"))
                .status,
            CellStatus::Empty
        );
        sb.expire(Timestamp::from_secs(4 * 3600));
        assert_eq!(sb.cells(), 0);
        let s = ttfb(&sb, 4 * 3600, "fastly", net(1, "DE"), 50.0);
        sb.insert(&s);
        let late = ttfb(&sb, 10, "fastly", net(1, "DE"), 50.0);
        assert_eq!(sb.insert(&late), Recorded::TooOld);
        assert_eq!(sb.quality().too_old, 1);
    }

    #[test]
    fn implausible_values_are_dropped_or_clamped_and_counted() {
        let mut sb = board();
        for v in [-1.0, 0.0, f64::NAN] {
            let s = ttfb(&sb, 1, "fastly", net(1, "DE"), v);
            assert_eq!(sb.insert(&s), Recorded::Implausible);
        }
        let s = ttfb(&sb, 1, "fastly", net(1, "DE"), 1e9);
        assert_eq!(sb.insert(&s), Recorded::Clamped);
        let q = sb.quality();
        assert_eq!((q.implausible, q.clamped, q.stored), (3, 1, 1));
        let snap = sb.snapshot(Timestamp::from_secs(2), Duration::from_secs(3600));
        let p99 = snap
            .cell(Metric::Ttfb, NetworkKey::Global, &p("fastly"))
            .stats
            .p99
            .unwrap();
        assert!((p99 - 60_000.0).abs() / 60_000.0 < 0.01);
        let mut dropping = Scoreboard::new(
            ScoreboardConfig::default().plausible_max(10_000.0, AboveMax::Drop),
            &[p("fastly")],
        )
        .unwrap();
        let s = ttfb(&dropping, 1, "fastly", net(1, "DE"), 20_000.0);
        assert_eq!(dropping.insert(&s), Recorded::Implausible);
    }

    #[test]
    fn probe_failures_count_against_availability() {
        let mut sb = board();
        let slot = sb.provider_slot("cloudflare").unwrap();
        for i in 0..100 {
            sb.insert(&Sample {
                at: Timestamp::from_secs(10),
                metric: Metric::Probe,
                provider: slot,
                network: net(1, "DE"),
                value: (i % 10 != 0).then_some(40.0),
            });
        }
        let snap = sb.snapshot(Timestamp::from_secs(20), Duration::from_secs(3600));
        let v = snap.cell(Metric::Probe, NetworkKey::Asn(1), &p("cloudflare"));
        assert_eq!(v.stats.availability, Some(0.9));
        assert_eq!(v.stats.samples, 100);
    }

    #[test]
    fn shards_merge_into_what_one_scoreboard_would_hold() {
        let mut whole = board();
        let mut a = board();
        let mut b = board();
        for i in 0..400u64 {
            let s = ttfb(
                &whole,
                i * 5,
                if i % 3 == 0 { "fastly" } else { "cloudflare" },
                net((i % 7) as u32, "FR"),
                20.0 + (i % 97) as f64,
            );
            whole.insert(&s);
            if i % 2 == 0 {
                a.insert(&s);
            } else {
                b.insert(&s);
            }
        }
        a.merge(&b).unwrap();
        let now = Timestamp::from_secs(2000);
        let (x, y) = (
            a.snapshot(now, Duration::from_secs(3600)),
            whole.snapshot(now, Duration::from_secs(3600)),
        );
        for prov in ["fastly", "cloudflare"] {
            for asn in 0..7 {
                assert_eq!(
                    x.cell(Metric::Ttfb, NetworkKey::Asn(asn), &p(prov)),
                    y.cell(Metric::Ttfb, NetworkKey::Asn(asn), &p(prov))
                );
            }
        }
        let json = serde_json::to_string(&a).unwrap();
        let back: Scoreboard = serde_json::from_str(&json).unwrap();
        assert_eq!(
            back.snapshot(now, Duration::from_secs(3600)).cell(
                Metric::Ttfb,
                NetworkKey::Global,
                &p("fastly")
            ),
            y.cell(Metric::Ttfb, NetworkKey::Global, &p("fastly"))
        );
        let other = Scoreboard::new(
            ScoreboardConfig::default().bucket(Duration::from_secs(60)),
            &[p("fastly")],
        )
        .unwrap();
        assert!(
            a.merge(&other)
                .unwrap_err()
                .to_string()
                .contains("bucket lengths differ")
        );
    }

    /// A parallel ingest's merge: shards split and merged on threads of their own, into a
    /// scoreboard already holding cells, one shard knowing fewer providers (merged apart).
    #[test]
    fn shards_merged_on_threads_hold_what_one_scoreboard_would() {
        let mut whole = board();
        let mut base = board();
        let mut shards = [board(), board()];
        let mut fastly_only =
            Scoreboard::new(ScoreboardConfig::default().min_samples(10), &[p("fastly")]).unwrap();
        for i in 0..6_000u64 {
            let prov = if i % 3 == 0 { "fastly" } else { "cloudflare" };
            let network = net((i % 53) as u32, if i % 5 == 0 { "DE" } else { "FR" });
            let value = 20.0 + ((i * 37) % 211) as f64;
            // Four buckets, out of order within each stretch (late samples too).
            let at = (i * 3599 / 6_000) ^ (i % 4);
            whole.insert(&ttfb(&whole, at, prov, network, value));
            let into = match i % 4 {
                0 => &mut base,
                3 if prov == "fastly" => &mut fastly_only,
                k => &mut shards[(k as usize) % 2],
            };
            let s = ttfb(into, at, prov, network, value);
            into.insert(&s);
        }
        let [s1, s2] = shards;
        base.merge_shards(vec![s1, fastly_only, s2]).unwrap();
        assert_eq!(base.quality().stored, whole.quality().stored);
        let now = Timestamp::from_secs(3600);
        let (x, y) = (
            base.snapshot(now, Duration::from_secs(3600)),
            whole.snapshot(now, Duration::from_secs(3600)),
        );
        let networks = y.networks(Metric::Ttfb);
        assert_eq!(x.networks(Metric::Ttfb), networks);
        assert!(networks.len() > 50);
        for prov in ["fastly", "cloudflare"] {
            for network in &networks {
                let (a, b) = (
                    x.cell(Metric::Ttfb, *network, &p(prov)),
                    y.cell(Metric::Ttfb, *network, &p(prov)),
                );
                assert_eq!(a, b, "{network:?} {prov}");
            }
        }
    }

    /// Probe loads of `network`: each user's speed `u` shared by both providers' times
    /// (`fastly · u · f1`, `cloudflare · u · f2`, the fetch factors 0.9-1.1); returns the exact
    /// median of the loads' fastly/cloudflare ratios.
    fn probe_loads(sb: &mut Scoreboard, network: ClientNetwork, n: u64, shared: bool) -> f64 {
        let slots = [
            sb.provider_slot("fastly").unwrap(),
            sb.provider_slot("cloudflare").unwrap(),
        ];
        let mut ratios = Vec::new();
        for i in 0..n {
            let at = Timestamp::from_secs(1000 + i);
            // A user's speed spread over 0.5-2×; fetches within ±10%.
            let user = |k: u64| 0.5 * 4f64.powf(((k * 37) % 101) as f64 / 100.0);
            let fetch = |k: u64| 0.9 + 0.2 * ((k * 53) % 89) as f64 / 88.0;
            let (uf, uc) = if shared {
                (user(i), user(i))
            } else {
                // Another user, drawn independently (a multiplicative hash of the load).
                (user(i), user(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40))
            };
            let times = [
                (slots[0], Some(100.0 * uf * fetch(i))),
                (slots[1], Some(80.0 * uc * fetch(i + 11))),
            ];
            for (provider, value) in times {
                sb.insert(&Sample {
                    at,
                    metric: Metric::Probe,
                    provider,
                    network,
                    value,
                });
            }
            sb.insert_pairs(at, network, &times);
            if let [(_, Some(a)), (_, Some(b))] = times {
                ratios.push(a / b);
            }
        }
        ratios.sort_by(f64::total_cmp);
        ratios[ratios.len() / 2]
    }

    #[test]
    fn probe_loads_pair_their_providers_through_merges_serialisation_and_new_providers() {
        let now = Timestamp::from_secs(2000);
        let window = Duration::from_secs(3600);
        let (f, c) = (p("fastly"), p("cloudflare"));
        let mut sb = board();
        let truth = probe_loads(&mut sb, net(7922, "US"), 400, true);
        probe_loads(&mut sb, net(3320, "DE"), 400, false);
        let snap = sb.snapshot(now, window);
        // The users' shared speed makes most of the spread: the times correlate strongly.
        let same = snap.pairing(NetworkKey::Asn(7922), &f, &c).unwrap();
        assert_eq!(same.pairs, 400);
        assert!(same.correlation > 0.9, "{same:?}");
        // Within the sketch's 1% bins of the loads' own median ratio.
        assert!(
            (same.median_ratio / truth - 1.0).abs() < 0.02,
            "{same:?}, truth {truth}"
        );
        // Either order reads the same comparison, the ratio inverted.
        let back = snap.pairing(NetworkKey::Asn(7922), &c, &f).unwrap();
        assert!((back.median_ratio * same.median_ratio - 1.0).abs() < 1e-9);
        assert_eq!(back.correlation, same.correlation);
        // Independent draws: no correlation to speak of.
        let apart = snap.pairing(NetworkKey::Asn(3320), &f, &c).unwrap();
        assert!(apart.correlation.abs() < 0.4, "{apart:?}");
        // Coarser cuts and a region's networks add the pairs up.
        assert_eq!(snap.pairing(NetworkKey::Global, &f, &c).unwrap().pairs, 800);
        let us = snap.pairing_where(&f, &c, |n| n.asn == Some(7922)).unwrap();
        assert_eq!(us, same);
        // Pairs are not samples: the probe cells and the quality counts are as without them.
        assert_eq!(
            snap.cell(Metric::Probe, NetworkKey::Asn(7922), &f)
                .stats
                .samples,
            400
        );
        assert_eq!(sb.quality().stored, 1600);
        assert!(snap.pairing(NetworkKey::Asn(1), &f, &c).is_none());
        assert!(snap.pairing(NetworkKey::Asn(7922), &f, &f).is_none());

        // Two shards merge to the same pairing; it survives serialisation.
        let (mut a, mut b) = (board(), board());
        probe_loads(&mut a, net(7922, "US"), 200, true);
        probe_loads(&mut b, net(7922, "US"), 400, true);
        let mut whole = board();
        probe_loads(&mut whole, net(7922, "US"), 200, true);
        probe_loads(&mut whole, net(7922, "US"), 400, true);
        a.merge(&b).unwrap();
        let read = |sb: &Scoreboard| {
            sb.snapshot(now, window)
                .pairing(NetworkKey::Asn(7922), &f, &c)
                .unwrap()
        };
        assert_eq!(read(&a), read(&whole));
        let json = serde_json::to_string(&a).unwrap();
        let back: Scoreboard = serde_json::from_str(&json).unwrap();
        assert_eq!(read(&back), read(&whole));

        // A provider that sorts between the two moves cloudflare's slot; the pair follows.
        let before = read(&sb);
        sb.add_provider(p("cdn77")).unwrap();
        assert_eq!(read(&sb), before);

        // A pair cell naming its slots the wrong way round is refused.
        let bad = json.replacen(
            "\"metric\":\"pair\",\"provider\":1",
            "\"metric\":\"pair\",\"provider\":256",
            1,
        );
        assert_ne!(bad, json, "the serialised pair cell");
        let err = serde_json::from_str::<Scoreboard>(&bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("the lower comes first"), "{err}");
    }

    #[test]
    fn refuses_settings_that_cannot_work() {
        let err = Scoreboard::new(
            ScoreboardConfig::default().bucket(Duration::from_millis(10)),
            &[p("a")],
        )
        .unwrap_err();
        assert!(err.to_string().contains("bucket"), "{err}");
        assert!(
            Scoreboard::new(
                ScoreboardConfig::default().retention(Duration::from_secs(1)),
                &[p("a")]
            )
            .is_err()
        );
    }

    #[test]
    fn a_networks_metrics_of_one_provider_are_kept_side_by_side() {
        // The table keeps a cell at its hash's low bits (the slot) with its top seven (the
        // tag): the cells of one provider and network differ only there, by the metric, so
        // they share a group of slots but never a tag.
        let mut slots = std::collections::HashSet::new();
        for asn in 0..4096u32 {
            let key = |metric| BaseKey {
                metric,
                provider: (asn % 3) as u16,
                asn: Some(asn * 7 + 13),
                country: Country::new(["DE", "US", "BR"][asn as usize % 3]).ok(),
            };
            let ttfb = KeyHasher::default().table_hash(key(Metric::Ttfb).pack());
            for metric in [Metric::Probe, Metric::Pair, Metric::TtfbHit] {
                let other = KeyHasher::default().table_hash(key(metric).pack());
                let apart = ttfb ^ other;
                assert!(
                    apart != 0 && apart & !(3 | 3 << 57) == 0,
                    "{metric:?}: {apart:#x}"
                );
                assert_ne!(
                    ttfb >> 57,
                    other >> 57,
                    "{metric:?} shares the TTFB cell's tag"
                );
            }
            slots.insert(ttfb & 4095);
        }
        // Different networks still spread over the table: 4,096 keys into 4,096 slots fill
        // some 63% of them when hashed at random.
        assert!(slots.len() > 2400, "{} of 4096 slots", slots.len());
    }

    #[test]
    fn cell_keys_unpack_to_what_was_packed() {
        for metric in [Metric::Ttfb, Metric::Probe, Metric::Pair] {
            for provider in [0u16, 1, 4095, pair_code(254, 255)] {
                for asn in [None, Some(0), Some(7922), Some(u32::MAX)] {
                    for country in [
                        None,
                        Country::new("AD").ok(),
                        Country::new("de").ok(),
                        Country::new("ZW").ok(),
                    ] {
                        let key = BaseKey {
                            metric,
                            provider,
                            asn,
                            country,
                        };
                        assert_eq!(BaseKey::unpack(key.pack()), key);
                    }
                }
            }
        }
    }

    #[test]
    fn late_samples_count_in_their_own_bucket_and_leave_with_it() {
        let mut sb = board();
        let quarter = 900;
        // Bucket 0 fills and closes when bucket 1 opens; late samples still reach bucket 0.
        for i in 0..50 {
            let s = ttfb(&sb, i, "fastly", net(1, "DE"), 100.0);
            sb.insert(&s);
        }
        for i in 0..50 {
            let s = ttfb(&sb, quarter + i, "fastly", net(1, "DE"), 200.0);
            sb.insert(&s);
        }
        for i in 0..40 {
            let s = ttfb(
                &sb,
                100 + i,
                "fastly",
                net(1, "DE"),
                100.0 + f64::from(i as u32),
            );
            assert_eq!(sb.insert(&s), Recorded::Stored);
        }
        let one = |sb: &Scoreboard, now: u64| {
            sb.snapshot(Timestamp::from_secs(now), Duration::from_secs(quarter))
                .cell(Metric::Ttfb, NetworkKey::Asn(1), &p("fastly"))
        };
        let first = one(&sb, quarter - 1);
        assert_eq!(first.stats.samples, 90);
        assert_eq!(first.stats.age, Duration::from_secs(quarter - 1 - 139));
        assert!((first.stats.p99.unwrap() - 138.0).abs() / 138.0 < 0.01);
        assert_eq!(one(&sb, quarter + 60).stats.samples, 50);
        // The whole hour holds both; shards merge the closed bucket's late samples exactly.
        let hour = |sb: &Scoreboard| {
            sb.snapshot(
                Timestamp::from_secs(quarter + 60),
                Duration::from_secs(3600),
            )
            .cell(Metric::Ttfb, NetworkKey::Asn(1), &p("fastly"))
        };
        assert_eq!(hour(&sb).stats.samples, 140);
        let back: Scoreboard = serde_json::from_str(&serde_json::to_string(&sb).unwrap()).unwrap();
        assert_eq!(hour(&back), hour(&sb));
        let mut merged = board();
        merged.merge(&sb).unwrap();
        merged.merge(&back).unwrap();
        assert_eq!(hour(&merged).stats.samples, 280);
        assert_eq!(hour(&merged).stats.p50, hour(&sb).stats.p50);
        // Four buckets on, bucket 0 is out of the retention: a late sample for it is too old.
        let s = ttfb(&sb, 4 * quarter, "fastly", net(1, "DE"), 50.0);
        sb.insert(&s);
        let s = ttfb(&sb, 10, "fastly", net(1, "DE"), 50.0);
        assert_eq!(sb.insert(&s), Recorded::TooOld);
        // Bucket 0 (with its late samples) went when bucket 4 opened; bucket 1 stays.
        assert_eq!(hour(&sb).stats.samples, 50);
    }

    fn plausible() -> impl proptest::strategy::Strategy<Value = f64> {
        use proptest::prelude::*;
        prop_oneof![
            0.001f64..5.0,
            1.0f64..60_000.0,
            (0.0f64..11.0).prop_map(f64::exp),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        /// Samples held back ([`Staged`]) and written later, at any points, come to what each
        /// would have come to written at once: the same outcome a sample (a late one too old
        /// for its cell among them, over a few cells, in any order, out of range, implausible
        /// or clamped; navigations, probes with failures among them, and pairs), the same
        /// counts and the same cells, bucket by bucket.
        #[test]
        fn samples_held_back_come_to_what_they_would_written_at_once(
            samples in proptest::collection::vec(
                (
                    0u64..9_000,
                    0u8..3,
                    0u32..4,
                    proptest::prop_oneof![
                        plausible(),
                        proptest::strategy::Just(-1.0),
                        proptest::strategy::Just(1e9),
                    ],
                    proptest::bool::ANY,
                    0u8..20,
                ),
                1..400,
            ),
        ) {
            let base = 1_800_000_000u64;
            let names = ["fastly", "cloudflare"];
            let (mut now, mut later) = (board(), board());
            let mut staged = Staged::default();
            later.stage(&mut staged);
            for &(t, who, asn, v, hit, write) in &samples {
                // One sample in twenty dated too far ahead for a bucket number.
                let at = if write == 19 {
                    Timestamp::from_millis(u64::MAX / 2)
                } else {
                    Timestamp::from_secs(base + t)
                };
                let slot = now.provider_slot(names[usize::from(who % 2)]).unwrap();
                let network = net(asn, if who == 2 { "FR" } else { "DE" });
                let direct = now.insert_navigation(at, slot, network, v, hit);
                let held =
                    later.insert_navigation_staged(Some(&mut staged), at, slot, network, v, hit);
                proptest::prop_assert_eq!(held, direct, "at {} asn {}", t, asn);
                // Now and then a probe, a failure among them, and its pair.
                if write % 4 == 1 {
                    let probe = Sample {
                        at,
                        metric: Metric::Probe,
                        provider: slot,
                        network,
                        value: (!hit).then_some(v),
                    };
                    proptest::prop_assert_eq!(
                        later.insert_staged(Some(&mut staged), &probe),
                        now.insert(&probe)
                    );
                    let other = now.provider_slot(names[usize::from(who % 2 == 0)]).unwrap();
                    let times = [(slot, Some(v)), (other, Some(v * 1.5 + 1.0))];
                    now.insert_pairs(at, network, &times);
                    later.insert_pairs_staged(Some(&mut staged), at, network, &times);
                }
                // Written now and then, and at the end.
                if write == 0 {
                    later.write_staged(&mut staged);
                }
            }
            later.write_staged(&mut staged);
            proptest::prop_assert_eq!(staged.len(), 0);
            proptest::prop_assert_eq!(later.quality(), now.quality());
            proptest::prop_assert_eq!(later.cells(), now.cells());
            proptest::prop_assert_eq!(
                serde_json::to_string(&later).unwrap(),
                serde_json::to_string(&now).unwrap()
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(10_000))]

        /// Samples arrive in any order over five quarter-hours (late ones included); every
        /// window's percentiles are within 1% of the exact ones over the samples it holds, and
        /// serialising or merging shards reads the same.
        #[test]
        fn every_window_reads_within_one_percent_of_its_exact_percentiles(
            samples in proptest::collection::vec((0u64..4_500, plausible()), 1..300),
            span in 1u64..=4,
        ) {
            let quarter = 900u64;
            let base = 1_800_000_000u64;
            let mut sb = board();
            let (mut even, mut odd) = (board(), board());
            // The model: what each stored sample's bucket is, dropping what the retention drops.
            let mut stored: Vec<(u64, f64)> = Vec::new();
            let mut newest: Option<u64> = None;
            for (n, (t, v)) in samples.iter().enumerate() {
                let s = ttfb(&sb, base + t, "fastly", net(1, "DE"), *v);
                let index = (base + t) / quarter;
                let too_old = newest.is_some_and(|top| index + 4 <= top);
                let got = sb.insert(&s);
                proptest::prop_assert_eq!(got == Recorded::TooOld, too_old);
                if n % 2 == 0 { even.insert(&s); } else { odd.insert(&s); }
                if too_old {
                    continue;
                }
                if newest.is_none_or(|top| index > top) {
                    newest = Some(index);
                    stored.retain(|(i, _)| i + 4 > index);
                }
                stored.push((index, *v));
            }
            let now = base + 4_500;
            let current = now / quarter;
            let window = Duration::from_secs(span * quarter);
            let mut exact: Vec<f64> = stored
                .iter()
                .filter(|(i, _)| *i + span > current)
                .map(|(_, v)| *v)
                .collect();
            exact.sort_by(f64::total_cmp);
            let view = |sb: &Scoreboard| {
                sb.snapshot(Timestamp::from_secs(now), window)
                    .cell(Metric::Ttfb, NetworkKey::Asn(1), &p("fastly"))
            };
            let got = view(&sb);
            proptest::prop_assert_eq!(got.stats.samples, exact.len() as u64);
            if !exact.is_empty() {
                let s = &got.stats;
                for (q, estimate) in [(0.5, s.p50), (0.75, s.p75), (0.9, s.p90), (0.99, s.p99)] {
                    let truth = exact[(q * (exact.len() - 1) as f64).floor() as usize];
                    let estimate = estimate.unwrap();
                    let ok = if truth <= crate::sketch::MIN_VALUE {
                        estimate <= crate::sketch::MIN_VALUE * 1.0001
                    } else {
                        (estimate - truth).abs() / truth <= 0.01
                    };
                    proptest::prop_assert!(ok, "p{} estimate {} exact {}", q * 100.0, estimate, truth);
                }
            }
            let back: Scoreboard = serde_json::from_str(&serde_json::to_string(&sb).unwrap()).unwrap();
            proptest::prop_assert_eq!(view(&back), got.clone());
            even.merge(&odd).unwrap();
            proptest::prop_assert_eq!(view(&even), got);
        }
    }
}
