//! A compact, mergeable quantile sketch with a 1% relative-error bound.
//!
//! Values (milliseconds) fall into logarithmic bins, 40 to an octave: bin `j` holds
//! `[m·γ^j, m·γ^(j+1))` with `γ = 2^(1/40)` and `m = 0.05 ms`, and reads back as
//! `2·m·γ^(j+1)/(γ+1)`, which is within `α = (γ−1)/(γ+1) ≈ 0.87%` of every value in the bin. The
//! bin is found from the value's binary exponent and a 4096-entry table over its mantissa (no
//! logarithm on the hot path); a value within one table cell (0.025%) of a bin edge may land in
//! the lower bin, which keeps the bound under 0.9%. So any quantile read from a [`Sketch`] is
//! within 1% (relative) of the true value at that rank, whatever the distribution and however
//! sketches are merged: merging adds bin counts, which is exact.
//!
//! Bins are stored sparsely: one `u32` per non-empty bin (an 11-bit bin number and a 21-bit
//! count; a bin past two million samples continues in a second entry). A cell of a few hundred
//! samples costs a few hundred bytes; a busy cell costs four bytes per distinct 1.8%-wide
//! band its values touch, whatever its count. Values at or under 0.05 ms read back as 0.05 ms.
//!
//! ```
//! use multicdn_steering::sketch::Sketch;
//!
//! let mut a = Sketch::new();
//! let mut b = Sketch::new();
//! for v in 1..=500 { a.insert(f64::from(v)); }
//! for v in 501..=1000 { b.insert(f64::from(v)); }
//! a.merge(&b);
//! let p75 = a.quantile(0.75).unwrap();
//! assert!((p75 - 750.0).abs() / 750.0 <= 0.01);
//! ```

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bins per doubling of the value.
pub const BINS_PER_OCTAVE: u32 = 40;
/// Values at or under this (milliseconds) share the lowest bin.
pub const MIN_VALUE: f64 = 0.05;

const KEY_BITS: u32 = 11;
const COUNT_BITS: u32 = 32 - KEY_BITS;
const MAX_KEY: u32 = (1 << KEY_BITS) - 1;
const MAX_COUNT: u32 = (1 << COUNT_BITS) - 1;
/// How many bins a sketch can address.
pub const BINS: usize = 1 << KEY_BITS;
const TABLE_BITS: u32 = 12;

fn gamma() -> f64 {
    2f64.powf(1.0 / f64::from(BINS_PER_OCTAVE))
}

/// The relative accuracy: every quantile is within this fraction of the true value.
pub fn relative_accuracy() -> f64 {
    let g = gamma();
    (g - 1.0) / (g + 1.0) + 1.0 / f64::from(1u32 << TABLE_BITS)
}

/// `floor(40·log2(1 + i/4096))` for each mantissa cell `i`.
fn mantissa_table() -> &'static [u8; 1 << TABLE_BITS] {
    static TABLE: std::sync::OnceLock<[u8; 1 << TABLE_BITS]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0u8; 1 << TABLE_BITS];
        for (i, slot) in t.iter_mut().enumerate() {
            let f = 1.0 + i as f64 / f64::from(1u32 << TABLE_BITS);
            *slot = (f64::from(BINS_PER_OCTAVE) * f.log2())
                .floor()
                .min(f64::from(BINS_PER_OCTAVE - 1)) as u8;
        }
        t
    })
}

/// The bin of a value (finite, non-negative): 0 for values at or under [`MIN_VALUE`], else
/// `1 + 40·exponent + table[mantissa]` of `value / MIN_VALUE`.
#[inline]
fn key_of(v: f64, table: &[u8; 1 << TABLE_BITS]) -> u32 {
    let x = v * (1.0 / MIN_VALUE);
    if x <= 1.0 {
        return 0;
    }
    let bits = x.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let cell = ((bits >> (52 - TABLE_BITS)) & ((1 << TABLE_BITS) - 1)) as usize;
    let k = 1 + exponent * i64::from(BINS_PER_OCTAVE) + i64::from(table[cell]);
    k.clamp(1, i64::from(MAX_KEY)) as u32
}

/// The value a bin reads back as.
#[inline]
fn value_of(key: u32) -> f64 {
    if key == 0 {
        return MIN_VALUE;
    }
    let g = gamma();
    MIN_VALUE * 2.0 * g.powi(key as i32) / (g + 1.0)
}

#[inline]
fn key(entry: u32) -> u32 {
    entry >> COUNT_BITS
}

#[inline]
fn count(entry: u32) -> u32 {
    entry & MAX_COUNT
}

#[inline]
fn entry(key: u32, count: u32) -> u32 {
    (key << COUNT_BITS) | count
}

/// A mergeable quantile sketch of millisecond values (see the module documentation).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Sketch {
    /// Packed `(bin, count)` entries, sorted by bin.
    entries: Vec<u32>,
    count: u64,
}

impl Sketch {
    /// An empty sketch.
    pub fn new() -> Sketch {
        Sketch::default()
    }

    /// Adds one value. Values that are not finite or are negative are refused (`false`).
    #[inline]
    pub fn insert(&mut self, value: f64) -> bool {
        if !value.is_finite() || value < 0.0 {
            return false;
        }
        self.insert_key(key_of(value, mantissa_table()));
        true
    }

    #[inline]
    fn insert_key(&mut self, k: u32) {
        let pos = self.entries.partition_point(|e| key(*e) <= k);
        if pos > 0 {
            let last = &mut self.entries[pos - 1];
            if key(*last) == k && count(*last) < MAX_COUNT {
                *last += 1;
                self.count += 1;
                return;
            }
        }
        self.entries.insert(pos, entry(k, 1));
        self.count += 1;
    }

    /// How many values it holds.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// True when it holds no value.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The value at quantile `q` (0.0 to 1.0), within 1%; `None` when empty or `q` is out of range.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.quantiles(&[q])[0]
    }

    /// Several quantiles in one pass; each `q` must be 0.0 to 1.0 (`None` otherwise, or when empty).
    pub fn quantiles<const N: usize>(&self, qs: &[f64; N]) -> [Option<f64>; N] {
        let mut out = [None; N];
        if self.count == 0 {
            return out;
        }
        let ranks = ranks(qs, self.count);
        let mut cumulative = 0u64;
        let mut next = 0usize;
        let order = order_of(&ranks);
        for e in &self.entries {
            cumulative += u64::from(count(*e));
            while next < N {
                let i = order[next];
                match ranks[i] {
                    Some(r) if cumulative > r => {
                        out[i] = Some(value_of(key(*e)));
                        next += 1;
                    }
                    Some(_) => break,
                    None => next += 1,
                }
            }
            if next == N {
                break;
            }
        }
        out
    }

    /// Adds every value of `other` (exact: bin counts add).
    pub fn merge(&mut self, other: &Sketch) {
        if other.entries.is_empty() {
            return;
        }
        if self.entries.is_empty() {
            self.entries.clone_from(&other.entries);
            self.count = other.count;
            return;
        }
        let mut out = Vec::with_capacity(self.entries.len() + other.entries.len());
        let (mut i, mut j) = (0, 0);
        let (a, b) = (&self.entries, &other.entries);
        while i < a.len() || j < b.len() {
            let take_a = j >= b.len() || (i < a.len() && key(a[i]) <= key(b[j]));
            let e = if take_a {
                i += 1;
                a[i - 1]
            } else {
                j += 1;
                b[j - 1]
            };
            push_merged(&mut out, e);
        }
        out.shrink_to_fit();
        self.entries = out;
        self.count += other.count;
    }

    /// Drops spare capacity (for sketches that will not grow again).
    pub fn shrink(&mut self) {
        self.entries.shrink_to_fit();
    }

    /// Bytes this sketch holds on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<u32>()
    }

    /// The non-empty bins as `(representative value, count)`, lowest first.
    pub fn bins(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.entries
            .iter()
            .map(|e| (value_of(key(*e)), u64::from(count(*e))))
    }
}

fn push_merged(out: &mut Vec<u32>, e: u32) {
    if let Some(last) = out.last_mut()
        && key(*last) == key(e)
    {
        let room = MAX_COUNT - count(*last);
        let add = count(e).min(room);
        *last += add;
        if add < count(e) {
            out.push(entry(key(e), count(e) - add));
        }
        return;
    }
    out.push(e);
}

/// The 0-based rank each quantile reads: `floor(q·(n−1))`.
fn ranks<const N: usize>(qs: &[f64; N], n: u64) -> [Option<u64>; N] {
    let mut out = [None; N];
    for (o, q) in out.iter_mut().zip(qs) {
        if (0.0..=1.0).contains(q) {
            *o = Some((q * (n - 1) as f64).floor() as u64);
        }
    }
    out
}

/// Indexes of `ranks` sorted by rank (`None` first).
fn order_of<const N: usize>(ranks: &[Option<u64>; N]) -> [usize; N] {
    let mut order = [0usize; N];
    for (i, o) in order.iter_mut().enumerate() {
        *o = i;
    }
    order.sort_by_key(|i| ranks[*i]);
    order
}

impl fmt::Debug for Sketch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [p50, p99] = self.quantiles(&[0.5, 0.99]);
        f.debug_struct("Sketch")
            .field("count", &self.count)
            .field("bins", &self.entries.len())
            .field("p50", &p50)
            .field("p99", &p99)
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
struct SketchWire {
    /// Checked on reading, so sketches of another resolution are never merged.
    bins_per_octave: u32,
    min: f64,
    /// `[bin, count]` pairs.
    bins: Vec<(u32, u64)>,
}

impl Serialize for Sketch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut bins: Vec<(u32, u64)> = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            match bins.last_mut() {
                Some(last) if last.0 == key(*e) => last.1 += u64::from(count(*e)),
                _ => bins.push((key(*e), u64::from(count(*e)))),
            }
        }
        SketchWire {
            bins_per_octave: BINS_PER_OCTAVE,
            min: MIN_VALUE,
            bins,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Sketch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = SketchWire::deserialize(d)?;
        if wire.bins_per_octave != BINS_PER_OCTAVE || wire.min != MIN_VALUE {
            return Err(D::Error::custom(format!(
                "sketch has {} bins an octave from {} ms; this build reads only {BINS_PER_OCTAVE} bins an octave from {MIN_VALUE} ms",
                wire.bins_per_octave, wire.min
            )));
        }
        let mut acc = Accumulator::new();
        for (k, c) in wire.bins {
            if k > MAX_KEY {
                return Err(D::Error::custom(format!(
                    "bin {k} is above the largest bin {MAX_KEY}"
                )));
            }
            acc.add_bin(k, c);
        }
        Ok(acc.to_sketch())
    }
}

/// A dense accumulator for merging many sketches at once (scoreboard roll-ups): one `u64` per
/// bin, 16 KiB, reused between merges.
#[derive(Clone)]
pub struct Accumulator {
    counts: Vec<u64>,
    count: u64,
    low: usize,
    high: usize,
}

impl fmt::Debug for Accumulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Accumulator")
            .field("count", &self.count)
            .finish()
    }
}

impl Default for Accumulator {
    fn default() -> Self {
        Accumulator::new()
    }
}

impl Accumulator {
    /// An empty accumulator.
    pub fn new() -> Accumulator {
        Accumulator {
            counts: vec![0; BINS],
            count: 0,
            low: BINS,
            high: 0,
        }
    }

    fn add_bin(&mut self, k: u32, c: u64) {
        let k = k as usize;
        self.counts[k] += c;
        self.count += c;
        self.low = self.low.min(k);
        self.high = self.high.max(k + 1);
    }

    /// Adds every value of a sketch.
    pub fn add(&mut self, sketch: &Sketch) {
        for e in &sketch.entries {
            self.add_bin(key(*e), u64::from(count(*e)));
        }
    }

    /// How many values it holds.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Several quantiles in one pass, as [`Sketch::quantiles`].
    pub fn quantiles<const N: usize>(&self, qs: &[f64; N]) -> [Option<f64>; N] {
        let mut out = [None; N];
        if self.count == 0 {
            return out;
        }
        let ranks = ranks(qs, self.count);
        let order = order_of(&ranks);
        let mut cumulative = 0u64;
        let mut next = 0usize;
        for k in self.low..self.high {
            cumulative += self.counts[k];
            while next < N {
                let i = order[next];
                match ranks[i] {
                    Some(r) if cumulative > r => {
                        out[i] = Some(value_of(k as u32));
                        next += 1;
                    }
                    Some(_) => break,
                    None => next += 1,
                }
            }
            if next == N {
                break;
            }
        }
        out
    }

    /// The sum as a compact sketch.
    pub fn to_sketch(&self) -> Sketch {
        let mut entries = Vec::new();
        for k in self.low..self.high {
            let mut c = self.counts[k];
            while c > 0 {
                let part = c.min(u64::from(MAX_COUNT));
                entries.push(entry(k as u32, part as u32));
                c -= part;
            }
        }
        Sketch {
            entries,
            count: self.count,
        }
    }

    /// Empties it for reuse.
    pub fn clear(&mut self) {
        if self.low < self.high {
            self.counts[self.low..self.high].fill(0);
        }
        self.count = 0;
        self.low = BINS;
        self.high = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn exact(sorted: &[f64], q: f64) -> f64 {
        sorted[(q * (sorted.len() - 1) as f64).floor() as usize]
    }

    fn close(estimate: f64, truth: f64) -> bool {
        if truth <= MIN_VALUE {
            return estimate <= MIN_VALUE * 1.0001;
        }
        (estimate - truth).abs() / truth <= 0.01
    }

    #[test]
    fn empty_sketch_has_no_quantiles() {
        let s = Sketch::new();
        assert_eq!(s.quantile(0.5), None);
        assert_eq!(s.count(), 0);
    }

    #[test]
    fn refuses_values_that_are_not_times() {
        let mut s = Sketch::new();
        assert!(!s.insert(f64::NAN));
        assert!(!s.insert(-1.0));
        assert!(!s.insert(f64::INFINITY));
        assert!(s.is_empty());
        assert!(s.insert(0.0));
        assert_eq!(s.quantile(0.5), Some(MIN_VALUE));
    }

    #[test]
    fn a_bin_past_its_count_limit_continues_in_a_second_entry() {
        let mut s = Sketch::new();
        let k = key_of(100.0, mantissa_table());
        s.entries.push(entry(k, MAX_COUNT));
        s.count = u64::from(MAX_COUNT);
        s.insert(100.0);
        assert_eq!(s.entries.len(), 2);
        assert_eq!(s.count(), u64::from(MAX_COUNT) + 1);
        let back: Sketch = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.count(), s.count());
        assert_eq!(back.quantile(1.0), s.quantile(1.0));
    }

    #[test]
    fn refuses_a_sketch_of_another_accuracy() {
        let err = serde_json::from_str::<Sketch>(r#"{"bins_per_octave":20,"min":0.05,"bins":[]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("20 bins an octave"), "{err}");
        assert!(
            serde_json::from_str::<Sketch>(
                r#"{"bins_per_octave":40,"min":0.05,"bins":[[9999,1]]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn a_typical_busy_cell_stays_under_two_kilobytes() {
        // Log-normal TTFB around 120 ms with a long tail, 100,000 samples.
        let mut s = Sketch::new();
        let mut x: u64 = 1;
        for _ in 0..100_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u1 = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u2 = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            s.insert((120f64.ln() + 0.6 * z).exp());
        }
        s.shrink();
        assert!(s.heap_bytes() < 2048, "{} bytes", s.heap_bytes());
    }

    fn values() -> impl Strategy<Value = Vec<f64>> {
        prop::collection::vec(
            prop_oneof![
                0.0f64..5.0,
                1.0f64..100_000.0,
                (0.0f64..12.0).prop_map(f64::exp),
            ],
            1..400,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn every_quantile_is_within_one_percent_of_the_exact_one(v in values()) {
            let mut s = Sketch::new();
            for x in &v { s.insert(*x); }
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            let qs = [0.5, 0.75, 0.9, 0.99];
            let got = s.quantiles(&qs);
            for (q, g) in qs.iter().zip(got) {
                let g = g.unwrap();
                let t = exact(&sorted, *q);
                prop_assert!(close(g, t), "q{} estimate {} exact {}", q, g, t);
            }
        }

        #[test]
        fn merging_equals_sketching_everything_at_once(a in values(), b in values()) {
            let mut sa = Sketch::new();
            let mut sb = Sketch::new();
            let mut all = Sketch::new();
            for x in &a { sa.insert(*x); all.insert(*x); }
            for x in &b { sb.insert(*x); all.insert(*x); }
            let mut acc = Accumulator::new();
            acc.add(&sa);
            acc.add(&sb);
            sa.merge(&sb);
            prop_assert_eq!(&sa, &all);
            prop_assert_eq!(acc.to_sketch(), all.clone());
            prop_assert_eq!(acc.quantiles(&[0.5, 0.75, 0.99]), all.quantiles(&[0.5, 0.75, 0.99]));
            let back: Sketch = serde_json::from_str(&serde_json::to_string(&sa).unwrap()).unwrap();
            prop_assert_eq!(back, all);
        }
    }
}
