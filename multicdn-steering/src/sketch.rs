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
//! A [`Sketch`] stores its bins sparsely: one `u32` per non-empty bin (an 11-bit bin number and
//! a 21-bit count; a bin past two million samples continues in a second entry). Values at or
//! under 0.05 ms read back as 0.05 ms. The scoreboard keeps the same bins in two tighter forms
//! of its own, exact all the same: the bucket being written as `DenseBins` (a byte counter a
//! bin over the range its values reach, so adding a value is one increment), and closed
//! buckets as `PackedBins` (count differences in an adaptive Rice code, about six bits a bin
//! for a busy bucket). A cell of four 15-minute buckets holding 100,000 samples an hour costs
//! 1.0–1.8 KB, index included, from a tight network to one spread over 2 ms–7 s.
//!
//! **Why not DDSketch.** The `sketches-ddsketch` crate keeps, at 1% relative error, a dense
//! `u64` a bin between the lowest and highest value, grown 128 bins at a time: 640 bins or
//! 5,120 bytes for one sketch over 1 ms–60 s, and 9,216 bytes for the four buckets of the busy
//! log-normal cell above (σ 0.6), where this crate's cell costs 1,446 bytes. A 2 KB budget a
//! cell leaves room for neither its `u64` counters nor its contiguous range.
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

/// `ceil(4096·2^(j/40)) − 4096` for `j = 1..40`: the first mantissa cell of each bin of an
/// octave after the first (checked against `log2` in the tests).
const BIN_STARTS: [u16; BINS_PER_OCTAVE as usize - 1] = [
    72, 145, 219, 294, 371, 449, 529, 610, 692, 775, 861, 947, 1035, 1125, 1216, 1309, 1404, 1500,
    1598, 1697, 1798, 1901, 2006, 2113, 2221, 2332, 2444, 2558, 2675, 2793, 2914, 3036, 3161, 3288,
    3417, 3548, 3682, 3817, 3956,
];

/// `floor(40·log2(1 + i/4096))` for each mantissa cell `i`, built at compile time.
static MANTISSA: [u8; 1 << TABLE_BITS] = mantissa_table();

const fn mantissa_table() -> [u8; 1 << TABLE_BITS] {
    let mut t = [0u8; 1 << TABLE_BITS];
    let (mut i, mut j) = (0usize, 0usize);
    while i < t.len() {
        while j < BIN_STARTS.len() && i >= BIN_STARTS[j] as usize {
            j += 1;
        }
        t[i] = j as u8;
        i += 1;
    }
    t
}

/// The bin of a value (finite, non-negative): 0 for values at or under [`MIN_VALUE`], else
/// `1 + 40·exponent + table[mantissa]` of `value / MIN_VALUE`.
#[inline]
fn key_of(v: f64) -> u32 {
    let x = v * (1.0 / MIN_VALUE);
    if x <= 1.0 {
        return 0;
    }
    let bits = x.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let cell = ((bits >> (52 - TABLE_BITS)) & ((1 << TABLE_BITS) - 1)) as usize;
    let k = 1 + exponent * i64::from(BINS_PER_OCTAVE) + i64::from(MANTISSA[cell]);
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
        self.insert_key(key_of(value));
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
        if self
            .count
            .checked_add(other.count)
            .is_some_and(|n| n <= u64::from(MAX_COUNT))
        {
            self.merge_in_place(other);
            return;
        }
        self.merge_general(other);
    }

    /// [`Sketch::merge`] where no sum can fill an entry (both together hold at most
    /// `MAX_COUNT` values), so each bin is one entry on both sides and in the result: the
    /// bins both hold are added where they stand (a binary search each, from the last one
    /// found), and the others, if any, are merged in from the back without a new buffer. A
    /// small sketch merged into a large one (a base cell into a cut) costs its own length
    /// times a search, not the large one's length.
    fn merge_in_place(&mut self, other: &Sketch) {
        let a = &mut self.entries;
        let mut new = 0usize;
        let mut from = 0usize;
        for e in &other.entries {
            let k = key(*e);
            let pos = from
                + a.get(from..)
                    .unwrap_or_default()
                    .partition_point(|x| key(*x) < k);
            match a.get_mut(pos) {
                Some(x) if key(*x) == k => {
                    *x += count(*e);
                    from = pos + 1;
                }
                _ => {
                    new += 1;
                    from = pos;
                }
            }
        }
        if new > 0 {
            let b = &other.entries;
            let (mut i, mut j) = (a.len(), b.len());
            a.resize(i + new, 0);
            let mut w = a.len();
            // From the back: `a[..i]` unread, `a[w..]` written; the bins of `b` that `a` held
            // are added already and skipped.
            while j > 0 && w > i {
                let kb = key(b[j - 1]);
                let ka = if i > 0 { Some(key(a[i - 1])) } else { None };
                match ka {
                    Some(ka) if ka > kb => {
                        a[w - 1] = a[i - 1];
                        i -= 1;
                        w -= 1;
                    }
                    Some(ka) if ka == kb => j -= 1,
                    _ => {
                        a[w - 1] = b[j - 1];
                        j -= 1;
                        w -= 1;
                    }
                }
            }
        }
        self.count += other.count;
    }

    /// [`Sketch::merge`] in full: a merge into a new buffer that fills each entry up to
    /// `MAX_COUNT` before starting the next.
    fn merge_general(&mut self, other: &Sketch) {
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

    pub(crate) fn add_bin(&mut self, k: u32, c: u64) {
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

    /// The non-empty bins as `(bin, count)`, lowest first.
    #[cfg(test)]
    fn nonzero_bins(&self) -> Vec<(u32, u64)> {
        (self.low..self.high)
            .filter(|k| self.counts[*k] > 0)
            .map(|k| (k as u32, self.counts[k]))
            .collect()
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

/// The bin of a value the caller has checked is finite and positive.
#[inline]
pub(crate) fn bin_of_positive(value: f64) -> u32 {
    key_of(value)
}

impl Sketch {
    /// A sketch from `(bin, count)` pairs sorted by bin, each bin once.
    pub(crate) fn from_bins(bins: &[(u32, u64)]) -> Sketch {
        let mut entries = Vec::with_capacity(bins.len());
        let mut total = 0u64;
        for &(k, mut c) in bins {
            total += c;
            while c > 0 {
                let part = c.min(u64::from(MAX_COUNT));
                entries.push(entry(k, part as u32));
                c -= part;
            }
        }
        Sketch {
            entries,
            count: total,
        }
    }

    /// The `(bin, count)` pairs, sorted by bin, each bin once.
    pub(crate) fn to_bins(&self) -> Vec<(u32, u64)> {
        let mut out: Vec<(u32, u64)> = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            match out.last_mut() {
                Some(last) if last.0 == key(*e) => last.1 += u64::from(count(*e)),
                _ => out.push((key(*e), u64::from(count(*e)))),
            }
        }
        out
    }
}

/// Bits of a carry entry that count 256s; the bits above are the counter's position.
const CARRY_BITS: u32 = 21;
const MAX_CARRIES: u64 = (1 << CARRY_BITS) - 1;

/// The counters of [`DenseBins`], in the cheapest of four forms that holds them.
#[derive(Clone)]
enum Counters {
    /// A byte a bin; a bin past 255 keeps its 256s in `carries` (`position << 21 | 256s`,
    /// sorted by position).
    Bytes {
        counts: Vec<u8>,
        carries: Vec<u32>,
    },
    Narrow(Vec<u16>),
    Wide(Vec<u32>),
    Huge(Vec<u64>),
}

impl Counters {
    fn len(&self) -> usize {
        match self {
            Counters::Bytes { counts, .. } => counts.len(),
            Counters::Narrow(v) => v.len(),
            Counters::Wide(v) => v.len(),
            Counters::Huge(v) => v.len(),
        }
    }

    /// Every counter as a number.
    fn values(&self) -> Vec<u64> {
        match self {
            Counters::Bytes { counts, carries } => {
                let mut out: Vec<u64> = counts.iter().map(|c| u64::from(*c)).collect();
                for e in carries {
                    if let Some(v) = out.get_mut((e >> CARRY_BITS) as usize) {
                        *v += u64::from(e & MAX_CARRIES as u32) << 8;
                    }
                }
                out
            }
            Counters::Narrow(v) => v.iter().map(|c| u64::from(*c)).collect(),
            Counters::Wide(v) => v.iter().map(|c| u64::from(*c)).collect(),
            Counters::Huge(v) => v.clone(),
        }
    }

    /// The cheapest form holding `values`.
    fn from_values(values: &[u64]) -> Counters {
        let len = values.len();
        let max = values.iter().copied().max().unwrap_or(0);
        let over = values.iter().filter(|v| **v > 255).count();
        let bytes = if max >> 8 <= MAX_CARRIES {
            len + 4 * over
        } else {
            usize::MAX
        };
        let narrow = if max <= u64::from(u16::MAX) {
            2 * len
        } else {
            usize::MAX
        };
        let wide = if max <= u64::from(u32::MAX) {
            4 * len
        } else {
            usize::MAX
        };
        if bytes <= narrow && bytes <= wide && bytes < usize::MAX {
            let mut carries = Vec::with_capacity(over);
            for (i, v) in values.iter().enumerate() {
                if *v > 255 {
                    carries.push(((i as u32) << CARRY_BITS) | (v >> 8) as u32);
                }
            }
            Counters::Bytes {
                counts: values.iter().map(|v| *v as u8).collect(),
                carries,
            }
        } else if narrow <= wide && narrow < usize::MAX {
            Counters::Narrow(values.iter().map(|v| *v as u16).collect())
        } else if wide < usize::MAX {
            Counters::Wide(values.iter().map(|v| *v as u32).collect())
        } else {
            Counters::Huge(values.to_vec())
        }
    }

    /// Adds `n` to counter `i` if its form can hold the sum without changing.
    fn try_add(&mut self, i: usize, n: u64) -> bool {
        match self {
            Counters::Bytes { counts, carries } => {
                let len = counts.len();
                let Some(c) = counts.get_mut(i) else {
                    return false;
                };
                let sum = u64::from(*c) + n;
                let high = sum >> 8;
                if high > 0 {
                    let pos = carries.partition_point(|e| ((e >> CARRY_BITS) as usize) < i);
                    match carries.get_mut(pos) {
                        Some(e) if (*e >> CARRY_BITS) as usize == i => {
                            let total = u64::from(*e & MAX_CARRIES as u32) + high;
                            if total > MAX_CARRIES {
                                return false;
                            }
                            *e = ((i as u32) << CARRY_BITS) | total as u32;
                        }
                        _ => {
                            // A u16 counter a bin would cost less than this many carries.
                            if high > MAX_CARRIES || 4 * (carries.len() + 1) > len {
                                return false;
                            }
                            carries.reserve_exact(1);
                            carries.insert(pos, ((i as u32) << CARRY_BITS) | high as u32);
                        }
                    }
                }
                *c = sum as u8;
                true
            }
            Counters::Narrow(v) => match v.get_mut(i) {
                Some(c) => match u16::try_from(u64::from(*c) + n) {
                    Ok(sum) => {
                        *c = sum;
                        true
                    }
                    Err(_) => false,
                },
                None => false,
            },
            Counters::Wide(v) => match v.get_mut(i) {
                Some(c) => match u32::try_from(u64::from(*c) + n) {
                    Ok(sum) => {
                        *c = sum;
                        true
                    }
                    Err(_) => false,
                },
                None => false,
            },
            Counters::Huge(v) => match v.get_mut(i) {
                Some(c) => {
                    *c = c.saturating_add(n);
                    true
                }
                None => false,
            },
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Counters::Bytes { counts, carries } => counts.capacity() + 4 * carries.capacity(),
            Counters::Narrow(v) => v.capacity() * 2,
            Counters::Wide(v) => v.capacity() * 4,
            Counters::Huge(v) => v.capacity() * 8,
        }
    }
}

/// The counters of a bucket still being written, once its first few values spill out of
/// [`OpenBins`]: one counter per bin over the range of bins its
/// values have reached (widened by an eighth of its length, at least four bins, whenever a
/// value falls outside), so adding a value is one indexed increment. A counter is a byte, the
/// rare bin past 255 keeping its 256s in a short side list; when that list would cost more
/// than wider counters, all counters become 16 bits (then 32, then 64).
#[derive(Clone)]
pub(crate) struct DenseBins {
    /// The bin of the first counter.
    lo: u32,
    counters: Counters,
}

impl Default for DenseBins {
    fn default() -> Self {
        DenseBins {
            lo: 0,
            counters: Counters::Bytes {
                counts: Vec::new(),
                carries: Vec::new(),
            },
        }
    }
}

impl fmt::Debug for DenseBins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenseBins")
            .field("lo", &self.lo)
            .field("len", &self.counters.len())
            .field("count", &self.count())
            .finish()
    }
}

impl DenseBins {
    /// Adds one value in bin `k`.
    #[inline]
    pub(crate) fn insert(&mut self, k: u32) {
        let i = k.wrapping_sub(self.lo) as usize;
        match &mut self.counters {
            Counters::Bytes { counts, .. } => {
                if let Some(c) = counts.get_mut(i)
                    && *c < u8::MAX
                {
                    *c += 1;
                    return;
                }
            }
            Counters::Narrow(v) => {
                if let Some(c) = v.get_mut(i)
                    && *c < u16::MAX
                {
                    *c += 1;
                    return;
                }
            }
            _ => {}
        }
        self.add(k, 1);
    }

    /// Adds `n` values in bin `k` (any bin below [`BINS`], any count: widens the range or
    /// the counters as needed).
    #[cold]
    pub(crate) fn add(&mut self, k: u32, n: u64) {
        if n == 0 || k as usize >= BINS {
            return;
        }
        self.cover(k);
        let i = (k - self.lo) as usize;
        if !self.counters.try_add(i, n) {
            let mut values = self.counters.values();
            if let Some(v) = values.get_mut(i) {
                *v = v.saturating_add(n);
            }
            self.counters = Counters::from_values(&values);
        }
    }

    /// Widens the range to hold bin `k`.
    fn cover(&mut self, k: u32) {
        let len = self.counters.len() as u32;
        let hi = self.lo + len;
        if k >= self.lo && k < hi {
            return;
        }
        let slack = (len / 8).max(4);
        let (lo, hi) = if len == 0 {
            (k.saturating_sub(slack / 2), k + 1 + slack / 2)
        } else if k < self.lo {
            (k.saturating_sub(slack), hi)
        } else {
            (self.lo, k + 1 + slack)
        };
        let hi = hi.min(BINS as u32);
        let shift = (self.lo.max(lo) - lo) as usize;
        // Byte counters stay bytes over a longer range (their carries cost no more than
        // before, and `from_values` would choose bytes again): moved over as they are.
        if let Counters::Bytes { counts, carries } = &mut self.counters {
            let mut wider = vec![0u8; (hi - lo) as usize];
            if let Some(dst) = wider.get_mut(shift..shift + counts.len()) {
                dst.copy_from_slice(counts);
                for e in carries.iter_mut() {
                    *e += (shift as u32) << CARRY_BITS;
                }
                carries.shrink_to_fit();
                *counts = wider;
                self.lo = lo;
                return;
            }
        }
        let mut values = vec![0u64; (hi - lo) as usize];
        let old = self.counters.values();
        if let Some(dst) = values.get_mut(shift..shift + old.len()) {
            dst.copy_from_slice(&old);
        }
        self.counters = Counters::from_values(&values);
        self.lo = lo;
    }

    /// Calls `f(bin, count)` for every non-empty bin, lowest first.
    pub(crate) fn for_each(&self, mut f: impl FnMut(u32, u64)) {
        fn each<T: Copy + Into<u64>>(lo: u32, v: &[T], f: &mut impl FnMut(u32, u64)) {
            for (i, c) in v.iter().enumerate() {
                let c: u64 = (*c).into();
                if c > 0 {
                    f(lo + i as u32, c);
                }
            }
        }
        match &self.counters {
            Counters::Bytes { counts, carries } => {
                let mut next = carries.iter().peekable();
                for (i, c) in counts.iter().enumerate() {
                    let mut c = u64::from(*c);
                    if let Some(e) = next.next_if(|e| (*e >> CARRY_BITS) as usize == i) {
                        c += u64::from(e & MAX_CARRIES as u32) << 8;
                    }
                    if c > 0 {
                        f(self.lo + i as u32, c);
                    }
                }
            }
            Counters::Narrow(v) => each(self.lo, v, &mut f),
            Counters::Wide(v) => each(self.lo, v, &mut f),
            Counters::Huge(v) => each(self.lo, v, &mut f),
        }
    }

    /// The non-empty bins as `(bin, count)`, lowest first.
    pub(crate) fn bins(&self) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        self.for_each(|k, c| out.push((k, c)));
        out
    }

    /// How many values it holds.
    pub(crate) fn count(&self) -> u64 {
        let mut n = 0;
        self.for_each(|_, c| n += c);
        n
    }

    /// Empties it for the next bucket, keeping its range (the next bucket's values likely
    /// span the same bins) with byte counters.
    pub(crate) fn clear(&mut self) {
        match &mut self.counters {
            Counters::Bytes { counts, carries } => {
                counts.fill(0);
                carries.clear();
            }
            other => {
                *other = Counters::Bytes {
                    counts: vec![0; other.len()],
                    carries: Vec::new(),
                };
            }
        }
    }

    /// Bytes held on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.counters.heap_bytes()
    }
}

/// How many values a bucket being written keeps as raw bins, inline, before it takes
/// counters: at most [`LATE_LIMIT`], so a bucket closed with no more is stored as late bins.
const FEW: usize = 8;
/// [`OpenBins::n`] once its values are in the counters.
const SPILLED: u8 = u8::MAX;
const _: () = assert!(FEW <= LATE_LIMIT as usize);

/// The bins of a bucket still being written: its first few values as raw bin numbers inside
/// the bucket itself, then one counter each ([`DenseBins`]). Most buckets of a busy board are
/// thin (the long tail of networks sees a few samples a bucket): theirs are written and closed
/// without touching the heap or scanning a range of counters. The counters, once allocated,
/// are kept for the next bucket.
#[derive(Clone, Default)]
#[repr(C)]
pub(crate) struct OpenBins {
    /// (First, with `n`: a scoreboard cell keeps them in the cache line of its key.)
    few: [u16; FEW],
    /// How many of `few` hold values, or [`SPILLED`].
    n: u8,
    dense: DenseBins,
}

impl fmt::Debug for OpenBins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenBins")
            .field("few", &self.few())
            .field("dense", &self.dense)
            .finish()
    }
}

impl OpenBins {
    /// The values held inline (empty once they are in the counters).
    fn few(&self) -> &[u16] {
        self.few.get(..usize::from(self.n)).unwrap_or_default()
    }

    /// Moves the inline values into the counters.
    #[cold]
    fn spill(&mut self) {
        for i in 0..usize::from(self.n).min(FEW) {
            self.dense.insert(u32::from(self.few[i]));
        }
        self.n = SPILLED;
    }

    /// Adds one value in bin `k` (a bin at or past [`BINS`] is ignored, as the counters do).
    #[inline]
    pub(crate) fn insert(&mut self, k: u32) {
        let n = usize::from(self.n);
        if n < FEW {
            if (k as usize) < BINS {
                self.few[n] = k as u16;
                self.n += 1;
            }
            return;
        }
        if self.n != SPILLED {
            self.spill();
        }
        self.dense.insert(k);
    }

    /// Adds `n` values in bin `k`.
    pub(crate) fn add(&mut self, k: u32, n: u64) {
        if self.n != SPILLED {
            self.spill();
        }
        self.dense.add(k, n);
    }

    /// Calls `f(bin, count)` for every non-empty bin, lowest first.
    pub(crate) fn for_each(&self, mut f: impl FnMut(u32, u64)) {
        if self.n == SPILLED {
            return self.dense.for_each(f);
        }
        let mut few = self.few;
        let few = few.get_mut(..usize::from(self.n)).unwrap_or_default();
        few.sort_unstable();
        for run in few.chunk_by(|a, b| a == b) {
            f(u32::from(run[0]), run.len() as u64);
        }
    }

    /// The non-empty bins as `(bin, count)`, lowest first.
    pub(crate) fn bins(&self) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        self.for_each(|k, c| out.push((k, c)));
        out
    }

    /// Adds every value to an accumulator.
    pub(crate) fn add_to(&self, acc: &mut Accumulator) {
        self.for_each(|k, c| acc.add_bin(k, c));
    }

    /// Empties it for the next bucket (the counters keep their range, see
    /// [`DenseBins::clear`]; they are not touched when the values never reached them).
    pub(crate) fn clear(&mut self) {
        if self.n == SPILLED {
            self.dense.clear();
        }
        self.n = 0;
    }

    /// Bytes held on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.dense.heap_bytes()
    }
}

/// Samples added to a packed bucket after it closed wait as raw bin numbers (two bytes each)
/// until this many, then are folded into the packed counts.
const LATE_LIMIT: u8 = 16;
/// A quotient this long (in unary) is followed by the raw 64-bit value instead.
const ESCAPE: u32 = 24;

/// The bins of a closed bucket, packed: the range of bins from the lowest non-empty one to the
/// highest, then each bin's count as its difference from the previous bin's (zigzag), in a
/// Rice code whose parameter follows the recent differences. Neighbouring bins of a latency
/// distribution hold similar counts, so a busy bucket costs a few bits a bin and a thin one
/// about one bit an empty bin. Reading decodes it; it is written once, when its bucket closes.
#[derive(Clone, Default)]
pub(crate) struct PackedBins {
    /// Empty when it holds nothing; else the packed counts, the bins of late samples (two
    /// bytes each), and a last byte saying how many late samples there are.
    data: Bytes,
}

/// How many bytes a [`Bytes`] holds without the heap: a thin bucket's few values (at most
/// `FEW` of two bytes, and the count) fit, so the long tail of networks closes its buckets
/// with no allocation (and drops them with no free).
const INLINE: usize = 22;

/// A short byte string held inline, a longer one on the heap (24 bytes either way, as a
/// `Box<[u8]>` and its length would take).
#[derive(Clone)]
enum Bytes {
    Inline { len: u8, buf: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Default for Bytes {
    fn default() -> Bytes {
        Bytes::Inline {
            len: 0,
            buf: [0; INLINE],
        }
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Inline { len, buf } => buf.get(..usize::from(*len)).unwrap_or_default(),
            Bytes::Heap(b) => b,
        }
    }
}

impl From<&[u8]> for Bytes {
    #[inline]
    fn from(b: &[u8]) -> Bytes {
        Bytes::concat(&[b])
    }
}

impl Bytes {
    /// `parts` one after the other.
    #[inline]
    fn concat(parts: &[&[u8]]) -> Bytes {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > INLINE {
            return Bytes::Heap(parts.concat().into_boxed_slice());
        }
        let mut buf = [0; INLINE];
        let mut at = 0;
        for part in parts {
            if let Some(out) = buf.get_mut(at..at + part.len()) {
                out.copy_from_slice(part);
            }
            at += part.len();
        }
        Bytes::Inline {
            len: len as u8,
            buf,
        }
    }

    /// Bytes held on the heap.
    fn heap_bytes(&self) -> usize {
        match self {
            Bytes::Inline { .. } => 0,
            Bytes::Heap(b) => b.len(),
        }
    }
}

impl fmt::Debug for PackedBins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PackedBins")
            .field("bytes", &self.data.len())
            .field("late", &self.late())
            .finish()
    }
}

struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    bits: u32,
}

impl BitWriter {
    /// Writes the low `n` bits of `v` (`n` at most 56). The bits gather in `acc` (fewer than
    /// 64 of them), written out eight bytes at a time, lowest first.
    #[inline]
    fn put(&mut self, v: u64, n: u32) {
        let v = if n == 0 {
            0
        } else {
            v & (u64::MAX >> (64 - n))
        };
        self.acc |= v << self.bits;
        let bits = self.bits + n;
        if bits >= 64 {
            self.out.extend_from_slice(&self.acc.to_le_bytes());
            // The bits of `v` that did not fit (`self.bits` is above 0 here: `n` <= 56).
            self.acc = v >> (64 - self.bits);
            self.bits = bits - 64;
        } else {
            self.bits = bits;
        }
    }

    /// Writes `n` 0 bits (`n` at most 56): `put(0, n)`.
    #[inline]
    fn zeros(&mut self, n: u32) {
        let bits = self.bits + n;
        if bits >= 64 {
            self.out.extend_from_slice(&self.acc.to_le_bytes());
            self.acc = 0;
            self.bits = bits - 64;
        } else {
            self.bits = bits;
        }
    }

    fn finish(self) -> Vec<u8> {
        let mut out = self.out;
        let bytes = self.bits.div_ceil(8) as usize;
        out.extend_from_slice(self.acc.to_le_bytes().get(..bytes).unwrap_or_default());
        out
    }
}

struct BitReader<'a> {
    data: &'a [u8],
    pos: usize,
    acc: u64,
    bits: u32,
}

impl BitReader<'_> {
    /// Tops the buffer up to at least 57 bits (zeros past the end).
    fn refill(&mut self) {
        while self.bits <= 56 {
            let b = self.data.get(self.pos).copied().unwrap_or(0);
            self.pos += 1;
            self.acc |= u64::from(b) << self.bits;
            self.bits += 8;
        }
    }

    /// Reads `n` bits (`n` at most 56).
    fn get(&mut self, n: u32) -> u64 {
        self.refill();
        let v = if n == 0 {
            0
        } else {
            self.acc & (u64::MAX >> (64 - n))
        };
        self.acc = self.acc.checked_shr(n).unwrap_or(0);
        self.bits -= n;
        v
    }

    /// Reads ones up to a zero (consumed) or up to `ESCAPE` ones.
    fn unary(&mut self) -> u32 {
        self.refill();
        let ones = (!self.acc).trailing_zeros().min(ESCAPE);
        let used = if ones == ESCAPE { ESCAPE } else { ones + 1 };
        self.acc >>= used;
        self.bits -= used;
        ones
    }
}

/// The adaptive Rice parameter: the running mean of recent values, as a power of two.
#[derive(Clone, Copy)]
struct RiceState {
    sum: u64,
    n: u64,
}

impl RiceState {
    fn new() -> RiceState {
        RiceState { sum: 2, n: 1 }
    }

    /// The least `k` (at most 48) with `n << k >= sum`: from the two bit lengths, one
    /// comparison to settle the last bit (`n` stays below 16, `sum` grows by at most a
    /// symbol a step).
    #[inline]
    fn k(self) -> u32 {
        if self.n >= self.sum {
            return 0;
        }
        // `n << k` has the bit length of `sum` here (n >= 1, k >= 0); one more when still short.
        let k = self.n.leading_zeros() - self.sum.leading_zeros();
        let k = k + u32::from(self.n.checked_shl(k).unwrap_or(u64::MAX) < self.sum);
        k.min(48)
    }

    fn update(&mut self, z: u64) {
        self.sum = self.sum.saturating_add(z);
        self.n += 1;
        if self.n >= 16 {
            self.sum >>= 1;
            self.n >>= 1;
        }
    }
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

/// What a bin's count is written as: 0 for an empty bin, else one more than the zigzagged
/// difference from the last non-empty bin's count (wrapping to 0 only for a difference of
/// 2^63, which is then written raw).
fn symbol(c: u64, prev: u64) -> u64 {
    if c == 0 {
        0
    } else {
        zigzag(c.wrapping_sub(prev) as i64).wrapping_add(1)
    }
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Bits for the lowest bin and for the range's length.
const LO_BITS: u32 = KEY_BITS;
const LEN_BITS: u32 = KEY_BITS + 1;

impl PackedBins {
    /// The first byte held (0 when empty): reading it brings a heap-held bucket's bytes into
    /// the cache, for a walk that reads ahead.
    #[inline]
    pub(crate) fn first_byte(&self) -> u8 {
        match &self.data {
            Bytes::Inline { buf, .. } => buf[0],
            Bytes::Heap(b) => b.first().copied().unwrap_or(0),
        }
    }

    /// Packs `(bin, count)` pairs sorted by bin, each bin once (empty counts allowed).
    pub(crate) fn from_bins(bins: &[(u32, u64)]) -> PackedBins {
        let mut nonzero = bins.iter().filter(|(_, c)| *c > 0);
        let (Some(first), Some(last)) = (nonzero.next(), bins.iter().rev().find(|(_, c)| *c > 0))
        else {
            return PackedBins::default();
        };
        let (lo, hi) = (first.0, last.0 + 1);
        let mut next = bins.iter().filter(|(k, _)| *k >= lo).peekable();
        PackedBins::pack(lo, hi, bins.len(), |k| match next.peek() {
            Some(&&(bk, bc)) if bk == k => {
                next.next();
                bc
            }
            _ => 0,
        })
    }

    /// Packs an open bucket's counters as [`PackedBins::from_bins`] packs its bins: byte
    /// counters (the common form) are read where they stand, with no list of bins between.
    pub(crate) fn from_dense(dense: &DenseBins) -> PackedBins {
        let Counters::Bytes { counts, carries } = &dense.counters else {
            return PackedBins::from_bins(&dense.bins());
        };
        if !carries.is_empty() {
            return PackedBins::from_bins(&dense.bins());
        }
        let (Some(first), Some(last)) = (first_nonzero(counts), last_nonzero(counts)) else {
            return PackedBins::default();
        };
        let used = counts.get(first..=last).unwrap_or_default();
        let lo = dense.lo + first as u32;
        PackedBins::pack(lo, lo + used.len() as u32, used.len() / 2, |k| {
            used.get((k - lo) as usize).map_or(0, |c| u64::from(*c))
        })
    }

    /// Packs an open bucket: its counters as [`PackedBins::from_dense`] does, or the few values
    /// it held inline as they stand, as late bins (no counts to pack).
    pub(crate) fn from_open(open: &OpenBins) -> PackedBins {
        if open.n == SPILLED {
            return PackedBins::from_dense(&open.dense);
        }
        let few = open.few();
        if few.is_empty() {
            return PackedBins::default();
        }
        // At most `FEW` values of two bytes and their count.
        let mut data = [0u8; 2 * FEW + 1];
        for (pair, k) in data.chunks_exact_mut(2).zip(few) {
            pair.copy_from_slice(&k.to_le_bytes());
        }
        let len = 2 * few.len();
        if let Some(count) = data.get_mut(len) {
            *count = few.len() as u8;
        }
        PackedBins {
            data: Bytes::from(data.get(..=len).unwrap_or_default()),
        }
    }

    /// Packs the counts of bins `lo..hi` (the first and last non-empty), `count(k)` called
    /// once for each bin in order; `size` sizes the buffer (the bytes kept are the same).
    fn pack(lo: u32, hi: u32, size: usize, count: impl FnMut(u32) -> u64) -> PackedBins {
        // Written into this thread's scratch buffer, then copied out at its final length:
        // one allocation a bucket, none to grow or shrink it.
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut buf) => {
                buf.clear();
                buf.reserve(size + 4);
                let taken = std::mem::take(&mut *buf);
                let out = PackedBins::pack_into(taken, lo, hi, count);
                let data = Bytes::from(out.as_slice());
                *buf = out;
                PackedBins { data }
            }
            Err(_) => PackedBins {
                data: Bytes::from(
                    PackedBins::pack_into(Vec::with_capacity(size + 4), lo, hi, count).as_slice(),
                ),
            },
        })
    }

    /// [`PackedBins::pack`]'s bytes, written after the end of `out`.
    fn pack_into(out: Vec<u8>, lo: u32, hi: u32, mut count: impl FnMut(u32) -> u64) -> Vec<u8> {
        let mut w = BitWriter {
            out,
            acc: 0,
            bits: 0,
        };
        w.put(u64::from(lo), LO_BITS);
        w.put(u64::from(hi - lo), LEN_BITS);
        let mut state = RiceState::new();
        let mut prev = 0u64;
        for k in lo..hi {
            let c = count(k);
            if c == 0 {
                // An empty bin: symbol 0, a quotient of 0 (one 0 bit) and `kk` 0 bits.
                w.zeros(1 + state.k());
                state.update(0);
                continue;
            }
            let z = symbol(c, prev);
            let kk = state.k();
            match z.checked_shr(kk) {
                // (A non-empty bin whose symbol wrapped to 0 goes raw too.)
                Some(q) if q < u64::from(ESCAPE) && (z != 0 || c == 0) => {
                    w.put((1u64 << q) - 1, q as u32 + 1);
                    w.put(z, kk);
                }
                _ => {
                    // The count itself, raw.
                    w.put((1u64 << ESCAPE) - 1, ESCAPE);
                    w.put(c, 32);
                    w.put(c >> 32, 32);
                }
            }
            if c > 0 {
                prev = c;
            }
            state.update(z);
        }
        let mut data = w.finish();
        // No late samples yet.
        data.push(0);
        data
    }

    /// Calls `f(bin, count)` for every non-empty packed bin, lowest first, then once for each
    /// late sample (not in order).
    pub(crate) fn for_each(&self, mut f: impl FnMut(u32, u64)) {
        self.for_each_packed(&mut f);
        for k in self.late_bins() {
            f(k, 1);
        }
    }

    /// How many late samples wait unpacked.
    fn late(&self) -> u8 {
        self.data.last().copied().unwrap_or(0)
    }

    /// The packed counts and the late samples' bins.
    fn split(&self) -> (&[u8], &[u8]) {
        let body = self.data.split_last().map_or(&[][..], |(_, body)| body);
        body.split_at(body.len().saturating_sub(2 * usize::from(self.late())))
    }

    fn late_bins(&self) -> impl Iterator<Item = u32> + '_ {
        self.split()
            .1
            .chunks_exact(2)
            .map(|p| u32::from(u16::from_le_bytes([p[0], p[1]])))
    }

    fn for_each_packed(&self, f: &mut impl FnMut(u32, u64)) {
        let packed = self.split().0;
        if packed.is_empty() {
            return;
        }
        let mut r = BitReader {
            data: packed,
            pos: 0,
            acc: 0,
            bits: 0,
        };
        let lo = r.get(LO_BITS) as u32;
        let len = r.get(LEN_BITS) as u32;
        let mut state = RiceState::new();
        let mut prev = 0u64;
        for k in lo..lo + len {
            let kk = state.k();
            let q = r.unary();
            let (c, z) = if q == ESCAPE {
                let c = r.get(32) | (r.get(32) << 32);
                (c, symbol(c, prev))
            } else {
                let z = (u64::from(q) << kk) | r.get(kk);
                let c = match z {
                    0 => 0,
                    z => prev.wrapping_add(unzigzag(z - 1) as u64),
                };
                (c, z)
            };
            state.update(z);
            if c > 0 {
                prev = c;
                f(k, c);
            }
        }
    }

    /// The non-empty bins as `(bin, count)`, sorted by bin, each bin once.
    pub(crate) fn bins(&self) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        self.for_each_packed(&mut |k, c| out.push((k, c)));
        if self.late() == 0 {
            return out;
        }
        let mut late: Vec<(u32, u64)> = self.late_bins().map(|k| (k, 1)).collect();
        late.sort_unstable();
        merge_bins(&out, &late)
    }

    /// Adds one value in bin `k` to a closed bucket.
    pub(crate) fn insert_late(&mut self, k: u32) {
        let late = self.late();
        if late < LATE_LIMIT {
            // The bytes before the count, the new bin, the new count.
            let body = self.data.split_last().map_or(&[][..], |(_, body)| body);
            self.data = Bytes::concat(&[body, &(k as u16).to_le_bytes(), &[late + 1]]);
        } else {
            let merged = merge_bins(&self.bins(), &[(k, 1)]);
            *self = PackedBins::from_bins(&merged);
        }
    }

    /// Adds every bin of `other` (`(bin, count)` sorted by bin).
    pub(crate) fn merge(&mut self, other: &[(u32, u64)]) {
        let merged = merge_bins(&self.bins(), other);
        *self = PackedBins::from_bins(&merged);
    }

    /// Adds every value to an accumulator.
    pub(crate) fn add_to(&self, acc: &mut Accumulator) {
        self.for_each(|k, c| acc.add_bin(k, c));
    }

    /// Bytes held on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.data.heap_bytes()
    }
}

/// The first non-zero byte, eight at a time.
fn first_nonzero(b: &[u8]) -> Option<usize> {
    let mut chunks = b.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        if w != 0 {
            return Some(at + (w.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|c| *c > 0)
        .map(|p| at + p)
}

/// The last non-zero byte, eight at a time.
fn last_nonzero(b: &[u8]) -> Option<usize> {
    let mut chunks = b.rchunks_exact(8);
    let mut end = b.len();
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        end -= 8;
        if w != 0 {
            return Some(end + 7 - (w.leading_zeros() / 8) as usize);
        }
    }
    chunks.remainder().iter().rposition(|c| *c > 0)
}

/// Two sorted `(bin, count)` lists added into one.
pub(crate) fn merge_bins(a: &[(u32, u64)], b: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let mut out: Vec<(u32, u64)> = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let take_a = j >= b.len() || (i < a.len() && a[i].0 <= b[j].0);
        let (k, c) = if take_a {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
        match out.last_mut() {
            Some(last) if last.0 == k => last.1 += c,
            _ => out.push((k, c)),
        }
    }
    out
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
        let k = key_of(100.0);
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

    #[test]
    fn the_bin_table_is_forty_times_log2_of_the_mantissa() {
        for (i, got) in MANTISSA.iter().enumerate() {
            let f = 1.0 + i as f64 / f64::from(1u32 << TABLE_BITS);
            let want = (f64::from(BINS_PER_OCTAVE) * f.log2()).floor() as u8;
            assert_eq!(*got, want, "cell {i}");
        }
    }

    /// `n` log-normal values around 120 ms, rounded to whole milliseconds as browsers report.
    fn lognormal_bins(n: usize, sigma: f64, seed: u64) -> Vec<(u32, u64)> {
        let mut x = seed;
        let mut unit = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let mut acc = Accumulator::new();
        for _ in 0..n {
            let z = (-2.0 * unit().ln()).sqrt() * (2.0 * std::f64::consts::PI * unit()).cos();
            acc.add_bin(key_of((120.0 * (sigma * z).exp()).round().max(1.0)), 1);
        }
        acc.nonzero_bins()
    }

    #[test]
    fn a_busy_closed_bucket_packs_to_a_few_bits_a_bin() {
        // 25,000 samples (a quarter hour of a busy network) spread over about 330 bins.
        let bins = lognormal_bins(25_000, 0.6, 3);
        let packed = PackedBins::from_bins(&bins);
        assert_eq!(packed.bins(), bins);
        let span = (bins[bins.len() - 1].0 - bins[0].0 + 1) as usize;
        let bits_a_bin = packed.heap_bytes() as f64 * 8.0 / span as f64;
        assert!(
            bits_a_bin < 6.5,
            "{bits_a_bin:.1} bits a bin over {span} bins"
        );
        // A [`Sketch`] holds four bytes a non-empty bin: packed, it is under a third of that.
        assert!(
            packed.heap_bytes() * 3 < bins.len() * 4,
            "{} bytes for {} bins",
            packed.heap_bytes(),
            bins.len()
        );
    }

    #[test]
    fn the_rice_parameter_is_the_least_shift_reaching_the_mean() {
        let slow = |s: RiceState| {
            let mut k = 0;
            while k < 48 && (s.n << k) < s.sum {
                k += 1;
            }
            k
        };
        let mut sums: Vec<u64> = (0..=4096).collect();
        for shift in 0..64 {
            let p = 1u64 << shift;
            sums.extend([p - 1, p, p + 1, p.wrapping_mul(3), p.saturating_mul(15)]);
        }
        sums.push(u64::MAX);
        for n in 1..16 {
            for &sum in &sums {
                let s = RiceState { sum, n };
                assert_eq!(s.k(), slow(s), "sum {sum} n {n}");
            }
        }
    }

    #[test]
    fn nonzero_bytes_are_found_at_both_ends_whatever_the_length() {
        for len in 0..40 {
            for a in 0..len {
                for b in a..len {
                    let mut v = vec![0u8; len];
                    v[a] = 1 + (a as u8 % 200);
                    v[b] = 255;
                    assert_eq!(first_nonzero(&v), Some(a), "{len} {a} {b}");
                    assert_eq!(last_nonzero(&v), Some(b), "{len} {a} {b}");
                }
            }
            assert_eq!(first_nonzero(&vec![0; len]), None);
            assert_eq!(last_nonzero(&vec![0; len]), None);
        }
    }

    #[test]
    fn the_bit_writer_writes_the_bits_in_order_whatever_their_widths() {
        // Against one bit a step, lowest first.
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..200 {
            let mut w = BitWriter {
                out: Vec::new(),
                acc: 0,
                bits: 0,
            };
            let mut bits: Vec<bool> = Vec::new();
            for _ in 0..(x % 60) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let n = (x % 57) as u32;
                if x & (1 << 60) != 0 {
                    w.zeros(n);
                    bits.extend(std::iter::repeat_n(false, n as usize));
                } else {
                    w.put(x >> 3, n);
                    bits.extend((0..n).map(|i| (x >> 3) >> i & 1 == 1));
                }
            }
            let mut want = vec![0u8; bits.len().div_ceil(8)];
            for (i, bit) in bits.iter().enumerate() {
                want[i / 8] |= u8::from(*bit) << (i % 8);
            }
            assert_eq!(w.finish(), want);
        }
    }

    #[test]
    fn counts_of_any_size_pack_exactly() {
        for bins in [
            vec![(5, 1), (6, 1 << 63), (7, 1), (9, u64::MAX / 2)],
            vec![(0, u64::MAX), (1, 1), (2047, u64::MAX - 1)],
            vec![(100, (1 << 63) + 1), (101, 1)],
        ] {
            assert_eq!(PackedBins::from_bins(&bins).bins(), bins);
        }
        assert_eq!(PackedBins::from_bins(&[(3, 0)]).bins(), vec![]);
        assert_eq!(PackedBins::from_bins(&[]).heap_bytes(), 0);
    }

    #[test]
    fn late_samples_wait_unpacked_then_fold_in() {
        let bins = lognormal_bins(500, 0.6, 5);
        let mut packed = PackedBins::from_bins(&bins);
        let mut want = Accumulator::new();
        for (k, c) in &bins {
            want.add_bin(*k, *c);
        }
        for i in 0..40u32 {
            let k = 150 + (i * 37) % 200;
            packed.insert_late(k);
            want.add_bin(k, 1);
            assert_eq!(packed.bins(), want.nonzero_bins(), "after {} late", i + 1);
            assert!(packed.late() <= LATE_LIMIT);
        }
        let mut empty = PackedBins::default();
        empty.insert_late(7);
        assert_eq!(empty.bins(), vec![(7, 1)]);
    }

    #[test]
    fn a_thin_bucket_closes_without_the_heap_and_grows_onto_it_with_late_samples() {
        let mut open = OpenBins::default();
        let values = [900u32, 12, 900, 2047, 0, 77, 78, 1500];
        for k in values {
            open.insert(k);
        }
        let mut packed = PackedBins::from_open(&open);
        assert_eq!(
            packed.heap_bytes(),
            0,
            "{FEW} values and their count fit inline"
        );
        let mut want = Accumulator::new();
        for k in values {
            want.add_bin(k, 1);
        }
        assert_eq!(packed.bins(), want.nonzero_bins());
        // Each late sample adds two bytes: past the inline room the bytes move to the heap,
        // and every value is still there.
        for (i, k) in [5u32, 900, 1999].into_iter().enumerate() {
            packed.insert_late(k);
            want.add_bin(k, 1);
            assert_eq!(packed.bins(), want.nonzero_bins(), "after {} late", i + 1);
        }
        assert!(
            packed.heap_bytes() > INLINE,
            "{} bytes",
            packed.heap_bytes()
        );
    }

    #[test]
    fn dense_bins_count_exactly_through_every_counter_width() {
        let mut d = DenseBins::default();
        let mut want = Accumulator::new();
        // Bytes with a few carries, then 16-bit counters, then 32 and 64 bits.
        for round in 0..3u64 {
            for i in 0..20_000u32 {
                let k = 400 + (i * i) % 60 + (i % 7) * 3;
                d.insert(k);
                want.add_bin(k, 1);
            }
            d.add(30, 1 << (20 + 10 * round));
            want.add_bin(30, 1 << (20 + 10 * round));
            assert_eq!(d.bins(), want.nonzero_bins(), "round {round}");
        }
        d.add(2047, 1);
        d.add(u32::MAX, 1);
        want.add_bin(2047, 1);
        assert_eq!(d.bins(), want.nonzero_bins());
        assert_eq!(d.count(), want.count());
        d.clear();
        assert_eq!(d.count(), 0);
        d.insert(500);
        assert_eq!(d.bins(), vec![(500, 1)]);
    }

    #[test]
    fn dense_bins_use_a_byte_a_bin_until_counts_grow() {
        let mut d = DenseBins::default();
        for i in 0..2_000u32 {
            d.insert(300 + i % 100);
        }
        // 100 bins of 20 each, plus growth slack.
        assert!(matches!(d.counters, Counters::Bytes { .. }));
        assert!(d.heap_bytes() < 140, "{}", d.heap_bytes());
        for _ in 0..300 {
            d.insert(350);
        }
        // One bin past 255 costs one carry, not wider counters.
        assert!(matches!(&d.counters, Counters::Bytes { carries, .. } if carries.len() == 1));
        for i in 0..30_000u32 {
            d.insert(300 + i % 100);
        }
        assert!(matches!(d.counters, Counters::Narrow(_)));
        assert_eq!(d.count(), 32_300);
    }

    fn bins_strategy() -> impl Strategy<Value = Vec<(u32, u64)>> {
        prop::collection::btree_map(
            0u32..BINS as u32,
            prop_oneof![
                8 => 1u64..300,
                1 => 1u64..1 << 50,
            ],
            0..300,
        )
        .prop_map(|m| m.into_iter().collect())
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
        fn packed_bins_read_back_exactly(bins in bins_strategy(), late in prop::collection::vec(0u32..BINS as u32, 0..40)) {
            let mut packed = PackedBins::from_bins(&bins);
            prop_assert_eq!(packed.bins(), bins.clone());
            let mut want = Accumulator::new();
            for (k, c) in &bins {
                want.add_bin(*k, *c);
            }
            for k in late {
                packed.insert_late(k);
                want.add_bin(k, 1);
            }
            prop_assert_eq!(packed.bins(), want.nonzero_bins());
            let mut summed = Accumulator::new();
            packed.add_to(&mut summed);
            prop_assert_eq!(summed.nonzero_bins(), want.nonzero_bins());
        }

        #[test]
        fn dense_counters_pack_as_their_bins_pack(adds in prop::collection::vec((0u32..BINS as u32, prop_oneof![8 => Just(1u64), 1 => 1u64..1_000]), 0..200)) {
            let mut d = DenseBins::default();
            for (k, n) in adds {
                if n == 1 { d.insert(k) } else { d.add(k, n) }
            }
            prop_assert_eq!(PackedBins::from_dense(&d).data, PackedBins::from_bins(&d.bins()).data);
        }

        /// A bucket being written holds every value, whether it stays thin (values inline) or
        /// spills into counters, across clears; closed, it holds the same bins, and late
        /// samples added after it closed are kept too.
        #[test]
        fn open_bins_hold_what_was_added_thin_or_spilled(
            buckets in prop::collection::vec(prop::collection::vec((0u32..BINS as u32, prop_oneof![8 => Just(1u64), 1 => 2u64..1_000]), 0..24), 1..4),
            late in prop::collection::vec(0u32..BINS as u32, 0..20),
        ) {
            let mut open = OpenBins::default();
            for adds in &buckets {
                open.clear();
                let mut want = Accumulator::new();
                for &(k, n) in adds {
                    if n == 1 { open.insert(k) } else { open.add(k, n) }
                    want.add_bin(k, n);
                }
                prop_assert_eq!(open.bins(), want.nonzero_bins());
                let mut packed = PackedBins::from_open(&open);
                prop_assert_eq!(packed.bins(), want.nonzero_bins());
                for &k in &late {
                    packed.insert_late(k);
                    want.add_bin(k, 1);
                }
                prop_assert_eq!(packed.bins(), want.nonzero_bins());
            }
        }

        #[test]
        fn dense_bins_hold_what_was_added(adds in prop::collection::vec((0u32..BINS as u32, prop_oneof![4 => Just(1u64), 1 => 1u64..100_000]), 0..400)) {
            let mut d = DenseBins::default();
            let mut want = Accumulator::new();
            for (k, n) in adds {
                if n == 1 { d.insert(k) } else { d.add(k, n) }
                want.add_bin(k, n);
            }
            prop_assert_eq!(d.bins(), want.nonzero_bins());
            prop_assert_eq!(d.count(), want.count());
        }

        #[test]
        fn merging_in_place_equals_merging_into_a_new_buffer(
            a in prop::collection::btree_map(0u32..BINS as u32, 1u64..5_000, 0..300),
            b in prop::collection::btree_map(0u32..BINS as u32, 1u64..5_000, 0..300),
            big in prop_oneof![4 => Just(0u64), 1 => 1u64..3_000_000],
        ) {
            let mut a: Vec<(u32, u64)> = a.into_iter().collect();
            let b: Vec<(u32, u64)> = b.into_iter().collect();
            // Now and then a count near or past an entry's limit: the general path.
            if let Some(first) = a.first_mut() {
                first.1 += big;
            }
            let (sa, sb) = (Sketch::from_bins(&a), Sketch::from_bins(&b));
            let mut merged = sa.clone();
            merged.merge(&sb);
            let mut general = sa.clone();
            general.merge_general(&sb);
            prop_assert_eq!(&merged, &general);
            let mut acc = Accumulator::new();
            acc.add(&sa);
            acc.add(&sb);
            prop_assert_eq!(merged, acc.to_sketch());
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
