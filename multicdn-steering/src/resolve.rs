//! From a client's address to its network (ASN and country).
//!
//! [`NetworkResolver`] is the seam; [`PrefixTable`] is an in-memory longest-prefix match over
//! IPv4 and IPv6 (nested prefixes are flattened into disjoint ranges once, so a lookup is one
//! binary search); with the `maxmind` feature, `MaxMindResolver` reads MaxMind's ASN and
//! country databases.
//!
//! ```
//! use multicdn_steering::resolve::{NetworkResolver, PrefixTable};
//!
//! let table = PrefixTable::from_lines("
//!     203.0.113.0/24  AS64500   DE
//!     203.0.113.128/25 AS64501  -
//!     2001:db8::/32   AS64502   US
//! ")?;
//! let net = table.resolve("203.0.113.200".parse()?);
//! assert_eq!(net.asn, Some(64501));
//! assert_eq!(net.country, None);
//! assert_eq!(table.resolve("2001:db8::1".parse()?).asn, Some(64502));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use multicdn_core::Country;
use rustc_hash::FxHashMap;

use crate::beacon::ClientNetwork;
use crate::error::SteeringError;
use crate::scoreboard::joined;

/// Resolves a client address to its network. Unknown addresses give an empty network.
pub trait NetworkResolver: fmt::Debug + Send + Sync {
    /// The network of `ip`.
    fn resolve(&self, ip: IpAddr) -> ClientNetwork;

    /// The network of each of `ips`, into `out` at the same place (as many as the shorter of
    /// the two holds): what [`NetworkResolver::resolve`] gives each. The default asks one at a
    /// time; a resolver that searches memory answers many at once faster, its reads for the
    /// different addresses in flight together ([`PrefixTable`] does).
    fn resolve_all(&self, ips: &[IpAddr], out: &mut [ClientNetwork]) {
        for (ip, net) in ips.iter().zip(out) {
            *net = self.resolve(*ip);
        }
    }
}

impl<T: NetworkResolver + ?Sized> NetworkResolver for Arc<T> {
    fn resolve(&self, ip: IpAddr) -> ClientNetwork {
        (**self).resolve(ip)
    }

    fn resolve_all(&self, ips: &[IpAddr], out: &mut [ClientNetwork]) {
        (**self).resolve_all(ips, out);
    }
}

impl<T: NetworkResolver + ?Sized> NetworkResolver for &T {
    fn resolve(&self, ip: IpAddr) -> ClientNetwork {
        (**self).resolve(ip)
    }

    fn resolve_all(&self, ips: &[IpAddr], out: &mut [ClientNetwork]) {
        (**self).resolve_all(ips, out);
    }
}

/// A resolver that knows nothing: for beacons whose lines already carry `asn` and `country`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoResolver;

impl NetworkResolver for NoResolver {
    fn resolve(&self, _ip: IpAddr) -> ClientNetwork {
        ClientNetwork::default()
    }
}

/// An in-memory longest-prefix-match table. Two tables are equal when every part is (tables
/// built from the same prefixes in the same order are).
#[derive(Clone, Default, PartialEq)]
pub struct PrefixTable {
    /// The disjoint IPv4 ranges cut at every /16 boundary, ascending: each lies inside one /16
    /// and is its first and last address there and its network, eight bytes, so a /16's
    /// ranges sit together (eight a cache line) and a lookup reads its answer where it
    /// searched.
    v4: Vec<V4Range>,
    /// For each /16 block `b`: how many of `v4` lie before `b << 16` (65,537 entries), so a
    /// lookup searches only the address's own /16.
    v4_blocks: Vec<u32>,
    /// The same for IPv6: starts, then each range's last address and value index.
    v6_starts: Vec<u128>,
    v6: Vec<(u128, u32)>,
    /// The same for the top 16 bits of IPv6 addresses (global unicast sits in a few thousand
    /// of them, so a lookup searches tens of ranges, not the whole table).
    v6_blocks: Vec<u32>,
    /// Each network once (a routing table's hundreds of thousands of prefixes name some tens
    /// of thousands), so the ones lookups read stay in the core's cache.
    values: Vec<ClientNetwork>,
}

/// A part of an IPv4 range inside one /16: its first and last address's low 16 bits and its
/// network's index in [`PrefixTable::values`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct V4Range {
    first: u16,
    last: u16,
    value: u32,
}

/// The ranges starting inside `block` by the index [`blocks`] made (all `ranges` of them when
/// the index is missing).
#[inline]
fn block_range(blocks: &[u32], block: usize, ranges: usize) -> (usize, usize) {
    match (blocks.get(block), blocks.get(block + 1)) {
        (Some(&lo), Some(&hi)) => (lo as usize, hi as usize),
        _ => (0, ranges),
    }
}

/// For each block of the top 16 bits: how many of `starts` lie before it (65,537 entries).
fn blocks(starts: impl Iterator<Item = u128>, shift: u32) -> Vec<u32> {
    let mut out = Vec::with_capacity((1 << 16) + 1);
    let mut starts = starts.peekable();
    let mut i = 0u32;
    for block in 0..(1u128 << 16) {
        while starts.peek().is_some_and(|s| *s < block << shift) {
            starts.next();
            i += 1;
        }
        out.push(i);
    }
    // Past the last block (whose end `1 << 16 << 112` a u128 cannot hold): every range.
    out.push(i + starts.count() as u32);
    out
}

impl fmt::Debug for PrefixTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixTable")
            .field("v4_ranges", &self.v4.len())
            .field("v6_ranges", &self.v6.len())
            .field("networks", &self.values.len())
            .finish()
    }
}

/// Collects prefixes, then builds a [`PrefixTable`]. A prefix given twice keeps the last value.
#[derive(Debug, Clone, Default)]
pub struct PrefixTableBuilder {
    /// IPv4 prefixes: first address, last address, value index (the insertion count).
    v4: Vec<(u32, u32, u32)>,
    /// IPv6 prefixes, the same way.
    v6: Vec<(u128, u128, u32)>,
    values: Vec<ClientNetwork>,
    /// How many sorted runs (in [`sort_prefixes`]'s order) `v4` and `v6` each are, laid end
    /// to end, one per builder appended; 0: not known to be sorted. The build merges runs
    /// instead of sorting.
    runs: usize,
}

impl PrefixTableBuilder {
    /// Adds `prefix` (`192.0.2.0/24`, `2001:db8::/32`; host bits are ignored).
    pub fn insert(
        &mut self,
        prefix: &str,
        network: ClientNetwork,
    ) -> Result<&mut Self, SteeringError> {
        let (addr, len) = parse_prefix(prefix)?;
        self.insert_parsed(addr, len, network);
        Ok(self)
    }

    /// Room for `n` more prefixes.
    fn reserve(&mut self, n: usize) {
        self.v4.reserve(n);
        self.values.reserve(n);
    }

    /// Adds a parsed prefix (`len` at most the address's bits).
    fn insert_parsed(&mut self, addr: IpAddr, len: u8, network: ClientNetwork) {
        self.runs = 0;
        let idx = self.values.len() as u32;
        self.values.push(network);
        match addr {
            IpAddr::V4(a) => {
                let (s, e) = range(u128::from(u32::from(a)), len, 32);
                self.v4.push((s as u32, e as u32, idx));
            }
            IpAddr::V6(a) => {
                let (s, e) = range(u128::from(a), len, 128);
                self.v6.push((s, e, idx));
            }
        }
    }

    /// Sorts the prefixes (on the thread that read them, where a table read in pieces is
    /// built from sorted runs).
    fn sort(&mut self) {
        sort_prefixes(&mut self.v4);
        sort_prefixes(&mut self.v6);
        self.runs = 1;
    }

    /// The table.
    pub fn build(self) -> PrefixTable {
        self.build_on(1)
    }

    /// [`PrefixTableBuilder::build`], the IPv4 and IPv6 ranges built at once with two threads
    /// or more.
    fn build_on(self, threads: usize) -> PrefixTable {
        let PrefixTableBuilder {
            mut v4,
            mut v6,
            values,
            runs,
        } = self;
        let ((mut v4, v4_blocks), (v6_starts, mut v6, v6_blocks)) = if threads >= 2 {
            std::thread::scope(|scope| {
                let v6 = scope.spawn(|| build_v6(&mut v6, runs));
                (build_v4(&mut v4, runs), joined(v6))
            })
        } else {
            (build_v4(&mut v4, runs), build_v6(&mut v6, runs))
        };
        let values = dedup_values(&values, &mut v4, &mut v6);
        PrefixTable {
            v4,
            v4_blocks,
            v6_starts,
            v6,
            v6_blocks,
            values,
        }
    }

    /// Adds every prefix of `later`, as if inserted after this builder's own.
    fn append(&mut self, later: PrefixTableBuilder) {
        // Every prefix has its value: no values, no prefixes, nothing to keep or renumber.
        if self.values.is_empty() {
            *self = later;
            return;
        }
        // Renumbering keeps each run's order: its values rise with the base.
        self.runs = if self.runs == 0 || later.runs == 0 {
            0
        } else {
            self.runs + later.runs
        };
        let base = self.values.len() as u32;
        self.values.extend(later.values);
        self.v4
            .extend(later.v4.into_iter().map(|(s, e, v)| (s, e, v + base)));
        self.v6
            .extend(later.v6.into_iter().map(|(s, e, v)| (s, e, v + base)));
    }
}

/// The IPv4 part of a [`PrefixTable`] from the builder's prefixes: ranges (by the builder's
/// value index) and blocks.
type V4Ranges = (Vec<V4Range>, Vec<u32>);
/// The IPv6 part: starts, each range's last address and value index, blocks.
type V6Ranges = (Vec<u128>, Vec<(u128, u32)>, Vec<u32>);

fn build_v4(prefixes: &mut [(u32, u32, u32)], runs: usize) -> V4Ranges {
    order_prefixes(prefixes, runs);
    // Nesting splits a range in at most two around each prefix inside it; a range that spans
    // /16s is cut at each (at most one more a /16).
    let mut ranges = Vec::with_capacity(prefixes.len() * 2 + 1);
    let mut blocks = vec![0u32; (1 << 16) + 1];
    flatten_sorted(prefixes, |s, e, value| {
        for block in (s >> 16)..=(e >> 16) {
            let first = if block == s >> 16 { s as u16 } else { 0 };
            let last = if block == e >> 16 { e as u16 } else { u16::MAX };
            ranges.push(V4Range { first, last, value });
            blocks[block as usize + 1] += 1;
        }
    });
    ranges.shrink_to_fit();
    for b in 1..blocks.len() {
        blocks[b] += blocks[b - 1];
    }
    (ranges, blocks)
}

/// Each network the ranges name, once, in the order the IPv4 then the IPv6 ranges first
/// name it; the ranges' value indices renumbered into it.
fn dedup_values(
    values: &[ClientNetwork],
    v4: &mut [V4Range],
    v6: &mut [(u128, u32)],
) -> Vec<ClientNetwork> {
    const UNSEEN: u32 = u32::MAX;
    let mut renumbered = vec![UNSEEN; values.len()];
    // A network as one word (ASN, country and whether each is known), hashed in one step.
    let word = |n: &ClientNetwork| {
        let country = n.country.map_or(0, |c| {
            let [a, b] = c.as_bytes();
            1 << 16 | u64::from(a) << 8 | u64::from(b)
        });
        n.asn.map_or(0, |a| 1 << 32 | u64::from(a)) << 17 | country
    };
    let mut index: FxHashMap<u64, u32> = FxHashMap::default();
    let mut out = Vec::new();
    let ranges = v4
        .iter_mut()
        .map(|r| &mut r.value)
        .chain(v6.iter_mut().map(|(_, v)| v));
    for v in ranges {
        // Every prefix has its value; were one missing, its ranges would resolve to nothing.
        let Some(slot) = renumbered.get_mut(*v as usize) else {
            *v = UNSEEN;
            continue;
        };
        if *slot == UNSEEN {
            let network = values[*v as usize];
            *slot = *index.entry(word(&network)).or_insert_with(|| {
                out.push(network);
                (out.len() - 1) as u32
            });
        }
        *v = *slot;
    }
    out.shrink_to_fit();
    out
}

fn build_v6(prefixes: &mut [(u128, u128, u32)], runs: usize) -> V6Ranges {
    order_prefixes(prefixes, runs);
    let (mut starts, mut ranges) = (Vec::new(), Vec::new());
    flatten_sorted(prefixes, |s, e, v| {
        starts.push(s);
        ranges.push((e, v));
    });
    let blocks = blocks(starts.iter().copied(), 112);
    (starts, ranges, blocks)
}

/// A table text worth reading on several threads (some 30,000 lines).
const PARALLEL_TEXT: usize = 1 << 20;

/// The prefixes of `text`'s lines and how many lines it has; a line that cannot be read is
/// its 1-based number in `text` and the reason.
fn read_lines(text: &str) -> Result<(PrefixTableBuilder, usize), (usize, SteeringError)> {
    let mut b = PrefixTable::builder();
    b.reserve(memchr::memchr_iter(b'\n', text.as_bytes()).count() + 1);
    let mut count = 0;
    for (n, line) in lines(text).enumerate() {
        count = n + 1;
        // The common shape (`203.0.113.0/24 AS64500 DE`) read in one pass; anything else, or
        // anything it would refuse, the general reading below.
        if let Some((addr, len, network)) = table_line_fast(line) {
            b.insert_parsed(addr, len, network);
            continue;
        }
        if let Some((addr, len, network)) = table_line(line).map_err(|e| (n + 1, e))? {
            b.insert_parsed(addr, len, network);
        }
    }
    b.sort();
    Ok((b, count))
}

/// `text` cut into `parts` pieces of about the same size, each but the last ending with a
/// `\n` (fewer pieces when lines are long).
fn cut_at_lines(text: &str, parts: usize) -> Vec<&str> {
    let mut pieces = Vec::with_capacity(parts);
    let mut rest = text;
    let size = text.len() / parts.max(1);
    while pieces.len() + 1 < parts {
        let Some(end) = rest
            .as_bytes()
            .get(size..)
            .and_then(|tail| memchr::memchr(b'\n', tail))
        else {
            break;
        };
        let (piece, after) = rest.split_at(size + end + 1);
        pieces.push(piece);
        rest = after;
    }
    pieces.push(rest);
    pieces
}

impl PrefixTable {
    /// A builder.
    pub fn builder() -> PrefixTableBuilder {
        PrefixTableBuilder::default()
    }

    /// Reads lines of `prefix asn country` (`203.0.113.0/24 AS64500 DE`); `-` for unknown,
    /// `#` starts a comment, blank lines are skipped. The ASN may be written with or without `AS`.
    /// A line that cannot be read is a [`SteeringError::PrefixTableLine`] naming it.
    pub fn from_lines(text: &str) -> Result<PrefixTable, SteeringError> {
        PrefixTable::from_lines_on(text, 1)
    }

    /// [`PrefixTable::from_lines`] with up to `threads` threads: a large table's lines are
    /// read and sorted a piece a thread, the sorted pieces merged, and its IPv4 and IPv6
    /// ranges built at once. The same table, or the same error naming the same line: a prefix
    /// given twice keeps its last value whichever pieces hold it. The `scoreboard` tool with a
    /// 300,000-prefix table and a 3-line log runs in 45 ms on two threads, 59 ms on one (the
    /// medians of 15 interleaved runs; 50 ms on two before the pieces were sorted apart).
    pub fn from_lines_on(text: &str, threads: usize) -> Result<PrefixTable, SteeringError> {
        let parts = if text.len() < PARALLEL_TEXT {
            1
        } else {
            threads.max(1)
        };
        let pieces = cut_at_lines(text, parts);
        let read: Vec<_> = if pieces.len() == 1 {
            pieces.into_iter().map(read_lines).collect()
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = pieces
                    .into_iter()
                    .map(|piece| scope.spawn(move || read_lines(piece)))
                    .collect();
                handles.into_iter().map(joined).collect()
            })
        };
        let mut table = PrefixTable::builder();
        let mut before = 0;
        for piece in read {
            match piece {
                Ok((b, lines)) => {
                    table.append(b);
                    before += lines;
                }
                Err((line, e)) => {
                    return Err(SteeringError::PrefixTableLine {
                        line: before + line,
                        source: Box::new(e),
                    });
                }
            }
        }
        Ok(table.build_on(parts))
    }

    /// The most specific network holding `ip`, if any.
    #[inline]
    pub fn lookup(&self, ip: IpAddr) -> Option<&ClientNetwork> {
        match ip {
            IpAddr::V4(a) => self.find_v4(u32::from(a)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => self.find_v4(u32::from(v4)),
                None => self.values.get(self.find_v6(u128::from(a))? as usize),
            },
        }
    }

    /// The IPv4 ranges inside `ip`'s /16, as indices into `v4`.
    #[inline]
    fn v4_block(&self, ip: u32) -> (usize, usize) {
        block_range(&self.v4_blocks, (ip >> 16) as usize, self.v4.len())
    }

    #[inline]
    fn find_v4(&self, ip: u32) -> Option<&ClientNetwork> {
        let (lo, hi) = self.v4_block(ip);
        // The /16's ranges are the only ones that can hold `ip`: the answer is the last of
        // them starting at or below it, if it ends at or above.
        let low = ip as u16;
        let i = self.v4.get(lo..hi)?.partition_point(|r| r.first <= low);
        let r = self.v4.get(lo + i.checked_sub(1)?)?;
        (low <= r.last).then(|| self.values.get(r.value as usize))?
    }

    #[inline]
    fn find_v6(&self, ip: u128) -> Option<u32> {
        let (lo, hi) = self.v6_block(ip);
        // As for IPv4: the answer is the last range starting at or below `ip`.
        let i = lo + self.v6_starts.get(lo..hi)?.partition_point(|s| *s <= ip);
        let (end, value) = self.v6.get(i.checked_sub(1)?)?;
        (ip <= *end).then_some(*value)
    }

    /// How many disjoint ranges the table holds (an IPv4 range that spans /16s counted once a
    /// /16).
    pub fn ranges(&self) -> usize {
        self.v4.len() + self.v6.len()
    }
}

impl NetworkResolver for PrefixTable {
    #[inline]
    fn resolve(&self, ip: IpAddr) -> ClientNetwork {
        self.lookup(ip).copied().unwrap_or_default()
    }

    /// [`PrefixTable::lookup`] of many addresses in lockstep: every address's block first,
    /// then each step of the binary searches for all of them, then their ranges, so the cache
    /// misses of different addresses overlap where one lookup after another waits on each in
    /// turn (three a lookup in a table of routing-table size).
    fn resolve_all(&self, ips: &[IpAddr], out: &mut [ClientNetwork]) {
        for (ips, out) in ips.chunks(LANES).zip(out.chunks_mut(LANES)) {
            self.resolve_lanes(ips, out);
        }
    }
}

/// Addresses [`PrefixTable::resolve_all`] searches in lockstep.
const LANES: usize = 64;

impl PrefixTable {
    /// [`NetworkResolver::resolve_all`] of at most [`LANES`] addresses: the IPv4 ones (IPv4-
    /// mapped IPv6 included) searched together, then the IPv6 ones.
    fn resolve_lanes(&self, ips: &[IpAddr], out: &mut [ClientNetwork]) {
        let n = ips.len().min(out.len()).min(LANES);
        let (mut v4, mut v6) = (Lanes::<u16>::new(), Lanes::<u128>::new());
        for (k, ip) in ips.iter().take(n).enumerate() {
            let v4_addr = match ip {
                IpAddr::V4(a) => Ok(*a),
                IpAddr::V6(a) => a.to_ipv4_mapped().ok_or(*a),
            };
            match v4_addr {
                Ok(a) => {
                    let ip = u32::from(a);
                    v4.push(k, ip as u16, self.v4_block(ip));
                }
                Err(a) => {
                    let ip = u128::from(a);
                    v6.push(k, ip, self.v6_block(ip));
                }
            }
        }
        for (k, low, lo, below) in v4.search(&self.v4, |r| r.first) {
            // Only the /16's own ranges can hold the address.
            out[k] = (below > lo)
                .then(|| self.v4.get(below - 1))
                .flatten()
                .filter(|r| low <= r.last)
                .and_then(|r| self.values.get(r.value as usize))
                .copied()
                .unwrap_or_default();
        }
        for (k, ip, _, below) in v6.search(&self.v6_starts, |s| *s) {
            out[k] = below
                .checked_sub(1)
                .and_then(|i| self.v6.get(i))
                .filter(|(end, _)| ip <= *end)
                .and_then(|(_, value)| self.values.get(*value as usize))
                .copied()
                .unwrap_or_default();
        }
    }

    /// The IPv6 ranges that start inside the top 16 bits of `ip`, as indices into `v6_starts`.
    #[inline]
    fn v6_block(&self, ip: u128) -> (usize, usize) {
        block_range(&self.v6_blocks, (ip >> 112) as usize, self.v6_starts.len())
    }
}

/// Addresses of one family searched together ([`PrefixTable::resolve_lanes`]): each one's
/// place in the batch, the key searched for, where its search began and the part still to
/// search.
struct Lanes<A> {
    n: usize,
    lane: [usize; LANES],
    key: [A; LANES],
    lo: [usize; LANES],
    base: [usize; LANES],
    len: [usize; LANES],
}

impl<A: Copy + Default + PartialOrd> Lanes<A> {
    fn new() -> Self {
        Lanes {
            n: 0,
            lane: [0; LANES],
            key: [A::default(); LANES],
            lo: [0; LANES],
            base: [0; LANES],
            len: [0; LANES],
        }
    }

    /// Adds the key at place `lane` of the batch, to be searched for in `items[lo..hi]`.
    #[inline]
    fn push(&mut self, lane: usize, key: A, (lo, hi): (usize, usize)) {
        if self.n < LANES {
            let i = self.n;
            (
                self.lane[i],
                self.key[i],
                self.lo[i],
                self.base[i],
                self.len[i],
            ) = (lane, key, lo, lo, hi.saturating_sub(lo));
            self.n += 1;
        }
    }

    /// The binary searches of `find_v4` and `find_v6`, one step for every key at a time (a
    /// key whose search is done steps in place), `start` reading where an item starts: for
    /// each, its place, itself, where its search began and how many items start at or below
    /// it (counted from the start of `items`).
    fn search<T>(
        mut self,
        items: &[T],
        start: impl Fn(&T) -> A,
    ) -> impl Iterator<Item = (usize, A, usize, usize)> {
        let n = self.n;
        // With no items there is nothing to step through; otherwise `mid.min(top)` below is
        // always one of them.
        let mut widest = match items.len() {
            0 => 0,
            _ => self.len[..n].iter().copied().max().unwrap_or(0),
        };
        let top = items.len().saturating_sub(1);
        while widest > 1 {
            widest = 0;
            for k in 0..n {
                let half = self.len[k] / 2;
                // Without a branch on the comparison, whose outcome is a coin toss the
                // predictor would lose half the time. A search done (`half` 0) compares
                // some item and stays where it is; the others' `mid` is inside `items`.
                let mid = self.base[k] + half;
                let up = start(&items[mid.min(top)]) <= self.key[k];
                self.base[k] = std::hint::select_unpredictable(up, mid, self.base[k]);
                self.len[k] -= half;
                widest = widest.max(self.len[k]);
            }
        }
        let at_or_below = move |i: usize, key: A| items.get(i).is_some_and(|t| start(t) <= key);
        (0..n).map(move |k| {
            // One more item starts at or below the key when the last one left does.
            let last = self.len[k] == 1 && at_or_below(self.base[k], self.key[k]);
            (
                self.lane[k],
                self.key[k],
                self.lo[k],
                self.base[k] + usize::from(last),
            )
        })
    }
}

/// `text` without every leading `prefix` (as `trim_start_matches` with a string, without its
/// searcher).
fn strip_all<'a>(mut text: &'a str, prefix: &str) -> &'a str {
    while let Some(rest) = text.strip_prefix(prefix) {
        text = rest;
    }
    text
}

/// An address as `str::parse::<IpAddr>` reads it: dotted-quad IPv4 (four decimal octets, no
/// leading zeros) read here in one pass, anything else by the standard library.
#[inline]
pub(crate) fn parse_ip(text: &str) -> Option<IpAddr> {
    if let Some(a) = parse_v4(text.as_bytes()) {
        return Some(IpAddr::V4(a));
    }
    if let Some(a) = parse_v6(text.as_bytes()) {
        return Some(IpAddr::V6(a));
    }
    text.parse().ok()
}

/// Colon-separated hexadecimal IPv6 (at most one `::`, no embedded IPv4) exactly as the
/// standard library accepts it (`None` for anything else, which the caller hands to the
/// standard parser).
#[inline]
fn parse_v6(b: &[u8]) -> Option<std::net::Ipv6Addr> {
    let mut groups = [0u16; 8];
    // Groups before the `::` (or all of them), then after it.
    let (mut head, mut tail) = ([0u16; 8], [0u16; 8]);
    let (mut heads, mut tails) = (0usize, 0usize);
    let mut gap = false;
    let mut i = 0;
    if b.starts_with(b"::") {
        gap = true;
        i = 2;
    }
    while i < b.len() {
        let start = i;
        let mut v = 0u16;
        while let Some(d) = b.get(i).and_then(|c| (*c as char).to_digit(16)) {
            if i - start == 4 {
                return None;
            }
            v = (v << 4) | d as u16;
            i += 1;
        }
        if i == start {
            return None;
        }
        let (list, n) = if gap {
            (&mut tail, &mut tails)
        } else {
            (&mut head, &mut heads)
        };
        *list.get_mut(*n)? = v;
        *n += 1;
        if i == b.len() {
            break;
        }
        // A `.` (embedded IPv4) or anything else: the standard parser's call.
        if b[i] != b':' {
            return None;
        }
        i += 1;
        if b.get(i) == Some(&b':') {
            if gap {
                return None;
            }
            gap = true;
            i += 1;
        } else if i == b.len() {
            return None;
        }
    }
    if gap {
        // `::` stands for at least one group.
        if heads + tails > 7 {
            return None;
        }
    } else if heads != 8 {
        return None;
    }
    groups[..heads].copy_from_slice(&head[..heads]);
    groups[8 - tails..].copy_from_slice(&tail[..tails]);
    Some(std::net::Ipv6Addr::from(groups))
}

/// A dotted quad exactly as the standard library accepts one (`None` for anything else,
/// which the caller hands to the standard parser).
#[inline]
fn parse_v4(b: &[u8]) -> Option<std::net::Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (n, octet) in octets.iter_mut().enumerate() {
        if n > 0 {
            if b.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let start = i;
        let mut v = 0u32;
        while let Some(d) = b.get(i).filter(|d| d.is_ascii_digit()) {
            if i - start == 3 {
                return None;
            }
            v = v * 10 + u32::from(d - b'0');
            i += 1;
        }
        let digits = i - start;
        // No empty octet, no leading zero (`01`), none above 255.
        if digits == 0 || (digits > 1 && b[start] == b'0') {
            return None;
        }
        *octet = u8::try_from(v).ok()?;
    }
    (i == b.len()).then(|| std::net::Ipv4Addr::from(octets))
}

fn parse_prefix(text: &str) -> Result<(IpAddr, u8), SteeringError> {
    let bad = |why| SteeringError::BadPrefix {
        value: text.to_owned(),
        why,
    };
    let (addr, len) = text
        .trim()
        .split_once('/')
        .ok_or_else(|| bad("there is no /length"))?;
    let addr = parse_ip(addr).ok_or_else(|| bad("the address is not an IP address"))?;
    let len: u8 = len.parse().map_err(|_| bad("the length is not a number"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(bad("the length is longer than the address"));
    }
    Ok((addr, len))
}

/// The first and last address of a prefix in a space of `bits` bits.
fn range(addr: u128, len: u8, bits: u8) -> (u128, u128) {
    let host = u32::from(bits - len);
    let span: u128 = if host >= 128 {
        u128::MAX
    } else {
        (1u128 << host) - 1
    };
    let span = if bits < 128 {
        span & ((1u128 << bits) - 1)
    } else {
        span
    };
    let start = addr & !span;
    (start, start | span)
}

/// A prefix table line as [`PrefixTable::from_lines`] reads it in general: `None` for a blank
/// or comment line.
fn table_line(line: &str) -> Result<Option<(IpAddr, u8, ClientNetwork)>, SteeringError> {
    let line = match line.as_bytes().iter().position(|b| *b == b'#') {
        Some(hash) => line.get(..hash).unwrap_or_default(),
        None => line,
    }
    .trim();
    if line.is_empty() {
        return Ok(None);
    }
    let mut parts = line.split_ascii_whitespace();
    let prefix = parts.next().unwrap_or_default();
    let asn = match parts.next() {
        None | Some("-") => None,
        Some(a) => Some(
            strip_all(strip_all(a, "AS"), "as")
                .parse::<u32>()
                .map_err(|_| SteeringError::BadPrefix {
                    value: line.to_owned(),
                    why: "the ASN is not a number (write AS64500 or 64500, or -)",
                })?,
        ),
    };
    let country = match parts.next() {
        None | Some("-") => None,
        Some(c) => Some(Country::new(c).map_err(|_| SteeringError::BadPrefix {
            value: line.to_owned(),
            why: "the country is not two letters (write DE, or -)",
        })?),
    };
    let (addr, len) = parse_prefix(prefix)?;
    Ok(Some((addr, len, ClientNetwork::new(asn, country))))
}

/// The lines of `text` as `str::lines` cuts them (at `\n`, a `\r` before it dropped), the
/// line ends found with `memchr`.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match memchr::memchr(b'\n', rest.as_bytes()) {
            Some(end) => {
                let line = rest.get(..end).unwrap_or_default();
                rest = rest.get(end + 1..).unwrap_or_default();
                Some(line.strip_suffix('\r').unwrap_or(line))
            }
            None => Some(std::mem::take(&mut rest)),
        }
    })
}

/// A prefix table line of the common shape, `203.0.113.0/24 AS64500 DE` or
/// `2001:db8::/32 AS64500 DE` (one space or tab or more between the fields, the ASN with
/// `AS` or without, `-` for an unknown ASN or country, nothing else on the line), as
/// [`PrefixTable::from_lines`] reads it; `None` for any other line (the general reading's
/// call, errors included).
fn table_line_fast(line: &str) -> Option<(IpAddr, u8, ClientNetwork)> {
    let b = line.as_bytes();
    let slash = b.iter().take(40).position(|c| *c == b'/')?;
    let text = b.get(..slash)?;
    let (addr, max, width) = match parse_v4(text) {
        Some(a) => (IpAddr::V4(a), 32, 2),
        None => (IpAddr::V6(parse_v6(text)?), 128, 3),
    };
    let mut i = slash + 1;
    let (len, next) = digits(b, i, width)?;
    i = next;
    if len > max {
        return None;
    }
    let blanks = |i: usize| {
        let n = b.get(i..).map_or(0, |r| {
            r.iter().take_while(|c| matches!(c, b' ' | b'\t')).count()
        });
        (n > 0).then_some(i + n)
    };
    i = blanks(i)?;
    let asn = if b.get(i) == Some(&b'-') {
        i += 1;
        None
    } else {
        if b.get(i..i + 2) == Some(b"AS") {
            i += 2;
        }
        let (asn, next) = digits(b, i, 10)?;
        i = next;
        Some(u32::try_from(asn).ok()?)
    };
    i = blanks(i)?;
    let country = if b.get(i) == Some(&b'-') {
        i += 1;
        None
    } else {
        let code = line.get(i..i + 2)?;
        i += 2;
        Some(Country::new(code).ok()?)
    };
    (i == b.len()).then_some((addr, len as u8, ClientNetwork::new(asn, country)))
}

/// Decimal digits at `i` (one to `max`, leading zeros allowed, as `str::parse` reads them)
/// followed by a byte that is not one: their value and where they end.
fn digits(b: &[u8], i: usize, max: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    let mut j = i;
    while let Some(d) = b.get(j).filter(|d| d.is_ascii_digit()) {
        if j - i == max {
            return None;
        }
        v = v * 10 + u64::from(d - b'0');
        j += 1;
    }
    (j > i).then_some((v, j))
}

/// An address of either family, as the prefix flattening needs it.
trait Address: Copy + Ord {
    const ZERO: Self;
    fn next(self) -> Option<Self>;
    fn prev(self) -> Self;
}

impl Address for u32 {
    const ZERO: Self = 0;
    fn next(self) -> Option<Self> {
        self.checked_add(1)
    }
    fn prev(self) -> Self {
        self - 1
    }
}

impl Address for u128 {
    const ZERO: Self = 0;
    fn next(self) -> Option<Self> {
        self.checked_add(1)
    }
    fn prev(self) -> Self {
        self - 1
    }
}

/// Sorts prefixes by start, the larger first at equal starts; equal prefixes in their
/// insertion order (by value index, unique), so the last given wins when flattened. The
/// order is a stable sort's, at an unstable sort's price (a third less time on 300,000
/// prefixes).
fn sort_prefixes<A: Address>(prefixes: &mut [(A, A, u32)]) {
    prefixes.sort_unstable_by(prefix_order);
}

/// [`sort_prefixes`]'s order.
fn prefix_order<A: Address>(a: &(A, A, u32), b: &(A, A, u32)) -> std::cmp::Ordering {
    a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2))
}

/// Puts `prefixes`, `runs` sorted runs laid end to end (0: not known to be sorted), in
/// [`sort_prefixes`]'s order: the standard library's stable sort finds the runs and merges
/// them in linear time.
fn order_prefixes<A: Address>(prefixes: &mut [(A, A, u32)], runs: usize) {
    match runs {
        0 => sort_prefixes(prefixes),
        1 => {}
        _ => prefixes.sort_by(prefix_order),
    }
}

/// Turns nested prefixes, in [`sort_prefixes`]'s order, into disjoint ranges, each owned by
/// its most specific prefix: `emit(first, last, value)` for each range, ascending.
fn flatten_sorted<A: Address>(prefixes: &[(A, A, u32)], mut emit: impl FnMut(A, A, u32)) {
    let mut stack: Vec<(A, u32)> = Vec::new();
    let mut cursor: Option<A> = Some(A::ZERO);
    let mut close = |cursor: Option<A>, end: A, v: u32| {
        if let Some(c) = cursor
            && c <= end
        {
            emit(c, end, v);
        }
    };
    for &(s, e, v) in prefixes {
        while let Some(&(top_end, top_v)) = stack.last() {
            if top_end >= s {
                break;
            }
            close(cursor, top_end, top_v);
            cursor = top_end.next();
            stack.pop();
        }
        if let (Some(&(_, top_v)), Some(c)) = (stack.last(), cursor)
            && c < s
        {
            close(Some(c), s.prev(), top_v);
        }
        cursor = Some(s);
        stack.push((e, v));
    }
    while let Some((top_end, top_v)) = stack.pop() {
        close(cursor, top_end, top_v);
        cursor = top_end.next();
    }
}

#[cfg(feature = "maxmind")]
pub use maxmind::MaxMindResolver;

#[cfg(feature = "maxmind")]
mod maxmind {
    use std::fmt;
    use std::net::IpAddr;
    use std::path::Path;

    use maxminddb::{Reader, geoip2};
    use multicdn_core::Country;

    use super::NetworkResolver;
    use crate::beacon::ClientNetwork;
    use crate::error::SteeringError;

    /// Resolves through MaxMind databases: an ASN database (GeoLite2-ASN) and a country (or
    /// city) database (GeoLite2-Country), either optional.
    pub struct MaxMindResolver {
        asn: Option<Reader<Vec<u8>>>,
        country: Option<Reader<Vec<u8>>>,
    }

    impl fmt::Debug for MaxMindResolver {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let kind = |r: &Option<Reader<Vec<u8>>>| {
                r.as_ref().map(|r| r.metadata().database_type.clone())
            };
            f.debug_struct("MaxMindResolver")
                .field("asn", &kind(&self.asn))
                .field("country", &kind(&self.country))
                .finish()
        }
    }

    impl MaxMindResolver {
        /// Opens the databases at the given paths.
        pub fn open(
            asn: Option<&Path>,
            country: Option<&Path>,
        ) -> Result<MaxMindResolver, SteeringError> {
            let open = |p: &Path| {
                Reader::open_readfile(p).map_err(|e| SteeringError::MaxMind {
                    path: p.to_owned(),
                    message: e.to_string(),
                })
            };
            Ok(MaxMindResolver {
                asn: asn.map(open).transpose()?,
                country: country.map(open).transpose()?,
            })
        }

        /// Reads databases already in memory.
        pub fn from_bytes(
            asn: Option<Vec<u8>>,
            country: Option<Vec<u8>>,
        ) -> Result<MaxMindResolver, SteeringError> {
            let read = |b: Vec<u8>| {
                Reader::from_source(b).map_err(|e| SteeringError::MaxMind {
                    path: "(in memory)".into(),
                    message: e.to_string(),
                })
            };
            Ok(MaxMindResolver {
                asn: asn.map(read).transpose()?,
                country: country.map(read).transpose()?,
            })
        }
    }

    /// Maps the databases' records to a network; codes that are not two letters are dropped.
    pub(crate) fn network_from_records(asn: Option<u32>, iso_code: Option<&str>) -> ClientNetwork {
        ClientNetwork::new(asn, iso_code.and_then(|c| Country::new(c).ok()))
    }

    impl NetworkResolver for MaxMindResolver {
        fn resolve(&self, ip: IpAddr) -> ClientNetwork {
            let asn = self.asn.as_ref().and_then(|r| {
                r.lookup(ip)
                    .ok()?
                    .decode::<geoip2::Asn<'_>>()
                    .ok()
                    .flatten()?
                    .autonomous_system_number
            });
            let country = self.country.as_ref().and_then(|r| {
                let rec = r
                    .lookup(ip)
                    .ok()?
                    .decode::<geoip2::Country<'_>>()
                    .ok()
                    .flatten()?;
                rec.country
                    .iso_code
                    .or(rec.registered_country.iso_code)
                    .map(str::to_owned)
            });
            network_from_records(asn, country.as_deref())
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn maps_records_and_drops_malformed_country_codes() {
            let n = network_from_records(Some(7922), Some("US"));
            assert_eq!(n.asn, Some(7922));
            assert_eq!(n.country.map(|c| c.to_string()).as_deref(), Some("US"));
            assert_eq!(network_from_records(None, Some("USA")).country, None);
        }

        /// A UTF-8 string in the MaxMind data format (sizes of 29 and more take a second byte).
        fn put_str(out: &mut Vec<u8>, s: &str) {
            if s.len() < 29 {
                out.push((2 << 5) | s.len() as u8);
            } else {
                out.push((2 << 5) | 29);
                out.push((s.len() - 29) as u8);
            }
            out.extend_from_slice(s.as_bytes());
        }

        /// A tiny MaxMind database (format 2.0, IPv4, 24-bit records) holding one prefix, a
        /// /24, whose record is `data`.
        fn tiny_db(prefix: [u8; 3], data: &[u8], database_type: &str) -> Vec<u8> {
            fn string(out: &mut Vec<u8>, s: &str) {
                put_str(out, s);
            }
            fn uint(out: &mut Vec<u8>, kind: u8, v: u64, width: usize) {
                let bytes = v.to_be_bytes();
                let bytes = &bytes[8 - width..];
                if kind >= 8 {
                    out.push(width as u8);
                    out.push(kind - 7);
                } else {
                    out.push((kind << 5) | width as u8);
                }
                out.extend_from_slice(bytes);
            }
            let nodes = 24u32;
            let bits: Vec<u8> = (0..24)
                .map(|i| (prefix[i / 8] >> (7 - i % 8)) & 1)
                .collect();
            let mut out = Vec::new();
            for (depth, bit) in bits.iter().enumerate() {
                let onward = if depth == 23 {
                    nodes + 16
                } else {
                    depth as u32 + 1
                };
                let (left, right) = if *bit == 0 {
                    (onward, nodes)
                } else {
                    (nodes, onward)
                };
                out.extend_from_slice(&left.to_be_bytes()[1..]);
                out.extend_from_slice(&right.to_be_bytes()[1..]);
            }
            out.extend_from_slice(&[0u8; 16]);
            out.extend_from_slice(data);
            out.extend_from_slice(b"\xAB\xCD\xEFMaxMind.com");
            out.push((7 << 5) | 9);
            string(&mut out, "binary_format_major_version");
            uint(&mut out, 5, 2, 1);
            string(&mut out, "binary_format_minor_version");
            uint(&mut out, 5, 0, 0);
            string(&mut out, "build_epoch");
            uint(&mut out, 9, 1_764_504_000, 4);
            string(&mut out, "database_type");
            string(&mut out, database_type);
            string(&mut out, "description");
            out.push(7 << 5);
            string(&mut out, "ip_version");
            uint(&mut out, 5, 4, 1);
            string(&mut out, "languages");
            out.push(0);
            out.push(11 - 7);
            string(&mut out, "node_count");
            uint(&mut out, 6, u64::from(nodes), 1);
            string(&mut out, "record_size");
            uint(&mut out, 5, 24, 1);
            out
        }

        #[test]
        fn reads_asn_and_country_from_maxmind_databases() {
            let mut asn = Vec::new();
            asn.push((7 << 5) | 2);
            for (k, v) in [
                ("autonomous_system_number", None),
                ("autonomous_system_organization", Some("COMCAST-7922")),
            ] {
                put_str(&mut asn, k);
                match v {
                    None => asn.extend_from_slice(&[(6 << 5) | 2, 0x1e, 0xf2]),
                    Some(s) => put_str(&mut asn, s),
                }
            }
            let mut country = Vec::new();
            country.push((7 << 5) | 1);
            put_str(&mut country, "country");
            country.push((7 << 5) | 1);
            put_str(&mut country, "iso_code");
            put_str(&mut country, "US");
            let resolver = MaxMindResolver::from_bytes(
                Some(tiny_db([198, 51, 100], &asn, "GeoLite2-ASN")),
                Some(tiny_db([198, 51, 100], &country, "GeoLite2-Country")),
            )
            .unwrap();
            let net = resolver.resolve("198.51.100.7".parse().unwrap());
            assert_eq!(net.asn, Some(7922));
            assert_eq!(net.country.map(|c| c.to_string()).as_deref(), Some("US"));
            assert!(
                resolver
                    .resolve("203.0.113.7".parse().unwrap())
                    .is_unknown()
            );
            // An IPv6 address in an IPv4-only database is unknown, not an error.
            assert!(
                resolver
                    .resolve("2001:db8::1".parse().unwrap())
                    .is_unknown()
            );
            assert!(format!("{resolver:?}").contains("GeoLite2-ASN"));
        }

        #[test]
        fn a_file_that_is_not_a_database_is_an_error_naming_it() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("asn.mmdb");
            std::fs::write(&path, b"not a database").unwrap();
            let err = MaxMindResolver::open(Some(&path), None)
                .unwrap_err()
                .to_string();
            assert!(err.contains("asn.mmdb"), "{err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn net(asn: u32) -> ClientNetwork {
        ClientNetwork::new(Some(asn), None)
    }

    #[test]
    fn a_table_read_on_several_threads_is_the_table_read_on_one() {
        use crate::sim::beacons::LogSpec;
        let spec = LogSpec {
            v4_prefixes: 80_000,
            v6_prefixes: 16_000,
            asns: 3_000,
            ..LogSpec::default()
        };
        let mut text = spec.prefixes().to_text();
        // Comments, blank and CRLF lines, other spellings; the same prefixes again, later,
        // with other networks (the last given wins, wherever the pieces are cut).
        let again: Vec<String> = text
            .lines()
            .step_by(97)
            .map(|l| {
                let prefix = l.split_whitespace().next().unwrap();
                format!("{prefix}\t64999 -  # moved\r")
            })
            .collect();
        text.insert_str(0, "# a routing table\n\n");
        text.push_str(&again.join("\n"));
        text.push_str("\n10.0.0.0/8 - DE\n\n");
        assert!(text.len() > 2 * PARALLEL_TEXT, "{} bytes", text.len());
        let one = PrefixTable::from_lines(&text).unwrap();
        // The pieces' prefixes are sorted where they are read and merged at the build: the
        // same table as the prefixes inserted one by one and sorted whole.
        let mut inserted = PrefixTable::builder();
        for line in lines(&text) {
            if let Some((addr, len, network)) = table_line(line).unwrap() {
                inserted.insert_parsed(addr, len, network);
            }
        }
        assert_eq!(inserted.runs, 0);
        assert!(inserted.build() == one, "sorted whole");
        for threads in [2, 3, 4, 16] {
            let many = PrefixTable::from_lines_on(&text, threads).unwrap();
            assert!(one == many, "{threads} threads");
        }
        let moved = again[again.len() / 2].split_whitespace().next().unwrap();
        let addr: IpAddr = moved.split('/').next().unwrap().parse().unwrap();
        assert_eq!(one.resolve(addr).asn, Some(64999));
        // A bad line, deep in a later piece: the same error, naming the same line.
        let lines = text.lines().count();
        let mut bad: Vec<&str> = text.lines().collect();
        bad.insert(lines * 3 / 4, "10.0.0.0/8 AS1 GERMANY");
        let bad = bad.join("\n");
        let want = PrefixTable::from_lines(&bad).unwrap_err().to_string();
        assert!(
            want.contains(&format!("line {}", lines * 3 / 4 + 1)),
            "{want}"
        );
        for threads in [2, 4] {
            let got = PrefixTable::from_lines_on(&bad, threads).unwrap_err();
            assert_eq!(got.to_string(), want, "{threads} threads");
        }
    }

    #[test]
    fn a_text_is_cut_after_line_ends_into_pieces_that_make_it_whole() {
        let text = "a\nbb\nccc\ndddd\n\neeeee";
        for parts in 1..8 {
            let pieces = cut_at_lines(text, parts);
            assert_eq!(pieces.concat(), text, "{parts}");
            assert!(pieces.len() <= parts.max(1), "{parts}: {pieces:?}");
            for piece in &pieces[..pieces.len() - 1] {
                assert!(piece.ends_with('\n'), "{parts}: {pieces:?}");
            }
        }
        // Many lines: as many pieces as asked, of about one size.
        let text: String = (0..1_000).map(|i| format!("{i}\n")).collect();
        let pieces = cut_at_lines(&text, 3);
        assert_eq!(pieces.len(), 3);
        for piece in &pieces {
            assert!(piece.len().abs_diff(text.len() / 3) < 10, "{}", piece.len());
        }
        // One long line: one piece.
        assert_eq!(cut_at_lines(&"x".repeat(100), 4), ["x".repeat(100)]);
    }

    #[test]
    fn the_most_specific_prefix_wins() {
        let mut b = PrefixTable::builder();
        b.insert("10.0.0.0/8", net(1)).unwrap();
        b.insert("10.1.0.0/16", net(2)).unwrap();
        b.insert("10.1.2.0/24", net(3)).unwrap();
        b.insert("0.0.0.0/0", net(9)).unwrap();
        let t = b.build();
        let at = |s: &str| t.resolve(s.parse().unwrap()).asn;
        assert_eq!(at("10.1.2.3"), Some(3));
        assert_eq!(at("10.1.3.3"), Some(2));
        assert_eq!(at("10.2.0.0"), Some(1));
        assert_eq!(at("11.0.0.0"), Some(9));
        assert_eq!(at("255.255.255.255"), Some(9));
        assert_eq!(at("::ffff:10.1.2.3"), Some(3));
        assert_eq!(at("2001:db8::1"), None);
    }

    #[test]
    fn refuses_malformed_prefixes_with_what_would_be_valid() {
        for bad in ["10.0.0.0", "10.0.0.0/33", "nope/8", "10.0.0.0/x", "::/129"] {
            let err = PrefixTable::builder()
                .insert(bad, net(1))
                .unwrap_err()
                .to_string();
            assert!(err.contains("192.0.2.0/24"), "{err}");
        }
        assert!(PrefixTable::from_lines("10.0.0.0/8 ASX DE").is_err());
        assert!(PrefixTable::from_lines("10.0.0.0/8 AS1 DEU").is_err());
    }

    #[test]
    fn covers_the_whole_ipv6_space() {
        let mut b = PrefixTable::builder();
        b.insert("::/0", net(1)).unwrap();
        b.insert("ffff::/16", net(2)).unwrap();
        let t = b.build();
        assert_eq!(
            t.resolve("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap())
                .asn,
            Some(2)
        );
        assert_eq!(t.resolve("fffe::".parse().unwrap()).asn, Some(1));
    }

    #[test]
    fn the_address_parser_reads_what_the_standard_library_reads() {
        for text in [
            "1.2.3.4",
            "0.0.0.0",
            "255.255.255.255",
            "256.1.1.1",
            "01.2.3.4",
            "1.2.3.04",
            "1.2.3",
            "1.2.3.4.5",
            "1..2.3",
            ".1.2.3",
            "1.2.3.",
            "1.2.3.4 ",
            " 1.2.3.4",
            "1234.1.1.1",
            "0001.1.1.1",
            "1.2.3.-4",
            "+1.2.3.4",
            "::1",
            "::ffff:1.2.3.4",
            "2001:db8::7",
            "",
            "1.2.3.4/24",
            "1.2.3.٤",
            "999.999.999.999",
            "::",
            ":::",
            "1::",
            "::1",
            "1:2:3:4:5:6:7:8",
            "1:2:3:4:5:6:7::",
            "::2:3:4:5:6:7:8",
            "1:2:3:4:5:6:7:8::",
            "::1:2:3:4:5:6:7:8",
            "1:2:3:4:5:6:7",
            "1::2::3",
            "1:::2",
            ":1::",
            "1:",
            ":1",
            "12345::",
            "ABCD:ef01::",
            "0000:0000::0001",
            "fe80::1%eth0",
            "::ffff:1.2.3.4",
            "2001:db8::1.2.3.4",
            "1:2:3:4:5:6:7:8:9",
            "g::",
            "1::2:",
        ] {
            assert_eq!(parse_ip(text), text.parse::<IpAddr>().ok(), "{text:?}");
        }
    }

    #[test]
    fn the_one_pass_table_line_reads_as_the_general_reading() {
        let prefixes = [
            "203.0.113.0/24",
            "203.0.113.7/24",
            "0.0.0.0/0",
            "255.255.255.255/32",
            "10.0.0.0/33",
            "10.0.0.0/024",
            "10.0.0.0/08",
            "10.0.0.0/+8",
            "10.0.0.0/",
            "10.0.0/8",
            "010.0.0.0/8",
            "256.0.0.0/8",
            "10.0.0.0/8/8",
            "2001:db8::/32",
            "2001:db8::/129",
            "2001:db8::/0128",
            "2001:DB8:0:0:0:0:0:1/128",
            "::/0",
            "2001:db8:::/48",
            "2001:db8::1::/48",
            "12345::/16",
            "::ffff:10.0.0.0/104",
            " 10.0.0.0/8",
            "10.0.0.0 /8",
            "1.2.3.4",
        ];
        let asns = [
            "AS64500",
            "64500",
            "as64500",
            "ASAS1",
            "AS",
            "AS0",
            "AS007",
            "AS4294967295",
            "AS4294967296",
            "AS12345678901",
            "+5",
            "AS+5",
            "-",
            "--",
            "x",
            "AS1#c",
        ];
        let countries = [
            "DE", "de", "gb", "DEU", "D", "ZZ", "-", "D1", "\u{e9}e", "GB#x", "",
        ];
        let gaps = [" ", "\t", "  ", " \t ", "\x0c", ""];
        let tails = ["", " ", " extra", "#comment", "\r"];
        let mut fast = 0;
        for prefix in prefixes {
            for asn in asns {
                for country in countries {
                    for (g, gap) in gaps.iter().enumerate() {
                        for tail in tails {
                            let second = gaps[(g + 1) % gaps.len()];
                            for line in [
                                format!("{prefix}{gap}{asn}{gap}{country}{tail}"),
                                format!("{prefix}{gap}{asn}{second}{country}{tail}"),
                                format!("{prefix}{gap}{asn}{tail}"),
                            ] {
                                let Some((addr, len, network)) = table_line_fast(&line) else {
                                    continue;
                                };
                                fast += 1;
                                let general = table_line(&line);
                                assert!(
                                    matches!(&general, Ok(Some(g)) if *g == (addr, len, network)),
                                    "{line:?}: {:?} by the one pass, {general:?} in general",
                                    (addr, len, network)
                                );
                            }
                        }
                    }
                }
            }
        }
        // The common shapes take the one pass (the comparison above is not empty).
        assert!(fast > 500, "{fast} lines read in one pass");
        for line in [
            "203.0.113.0/24 AS64500 DE",
            "10.0.0.0/8\t64500\tde",
            "1.2.3.4/32 - -",
            "2001:db8::/32 AS64500 DE",
        ] {
            assert!(table_line_fast(line).is_some(), "{line}");
        }
    }

    #[test]
    fn table_lines_are_cut_as_str_lines_cuts_them() {
        for text in [
            "",
            "\n",
            "a",
            "a\n",
            "a\r\n",
            "a\r",
            "a\r\r\nb",
            "\r\n\r\n",
            "a\n\nb\r",
            "\u{e9}\r\n\u{e9}",
        ] {
            assert_eq!(
                lines(text).collect::<Vec<_>>(),
                text.lines().collect::<Vec<_>>(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn ipv4_prefixes_sort_as_the_tuples_sort() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut prefixes = Vec::new();
        for v in 0..5_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct starts and lengths: many ties on the start, some on both.
            let len = (x % 4) as u8 * 8 + (x >> 8) as u8 % 2;
            let addr = u128::from((x >> 16) as u32 & 0xff00_0000);
            let (s, e) = range(addr, len, 32);
            prefixes.push((s as u32, e as u32, v));
        }
        let mut tuples = prefixes.clone();
        tuples.sort_unstable_by_key(|&(s, e, v)| (s, std::cmp::Reverse(e), v));
        sort_prefixes(&mut prefixes);
        assert_eq!(prefixes, tuples);
    }

    #[test]
    fn table_lines_take_as_prefixes_and_comments_as_before() {
        let t = PrefixTable::from_lines(
            "10.0.0.0/8 ASAS64500 DE # a comment\n# only a comment\n11.0.0.0/8 as64501 -\n12.0.0.0/8 64502#x",
        )
        .unwrap();
        let asn = |ip: &str| t.resolve(ip.parse().unwrap()).asn;
        assert_eq!(asn("10.1.1.1"), Some(64500));
        assert_eq!(asn("11.1.1.1"), Some(64501));
        assert_eq!(asn("12.1.1.1"), Some(64502));
        assert!(PrefixTable::from_lines("10.0.0.0/8 ASx").is_err());
        assert!(PrefixTable::from_lines("10.0.0.01/8 AS1").is_err());
        // A refused line is named by its number, comments and blank lines counted.
        let err = PrefixTable::from_lines("# table\n10.0.0.0/8 AS1 DE\n\n10.0.0.0/33 AS2 DE\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("line 4: invalid prefix \"10.0.0.0/33\""),
            "{err}"
        );
    }

    /// A resolver answering one address at a time (the trait's default `resolve_all`).
    #[derive(Debug)]
    struct NoBatch<'a>(&'a PrefixTable);

    impl NetworkResolver for NoBatch<'_> {
        fn resolve(&self, ip: IpAddr) -> ClientNetwork {
            self.0.resolve(ip)
        }
    }

    fn prefixes() -> impl Strategy<Value = Vec<(u32, u8)>> {
        prop::collection::vec((any::<u32>(), 0u8..=32), 1..40)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn any_text_parses_as_the_standard_library_parses_it(text in "[0-9.:a-f]{0,20}", octets in prop::collection::vec(0u32..1100, 4)) {
            prop_assert_eq!(parse_ip(&text), text.parse::<IpAddr>().ok());
            let quad = format!("{}.{}.{}.{}", octets[0], octets[1], octets[2], octets[3]);
            prop_assert_eq!(parse_ip(&quad), quad.parse::<IpAddr>().ok());
            let v6 = std::net::Ipv6Addr::from((u128::from(octets[0]) << 112) | u128::from(octets[1] % 3) << 40 | u128::from(octets[2]));
            for text in [v6.to_string(), v6.to_string().to_uppercase(), format!("{:x}", u128::from(v6)), format!("{}:{}", v6, octets[3])] {
                prop_assert_eq!(parse_ip(&text), text.parse::<IpAddr>().ok(), "{}", text);
            }
        }

        #[test]
        fn agrees_with_a_linear_scan(ps in prefixes(), probes in prop::collection::vec(any::<u32>(), 20)) {
            let mut b = PrefixTable::builder();
            for (i, (a, len)) in ps.iter().enumerate() {
                b.insert(&format!("{}/{}", std::net::Ipv4Addr::from(*a), len), net(i as u32)).unwrap();
            }
            let t = b.build();
            let mut checks: Vec<u32> = probes;
            checks.extend(ps.iter().map(|(a, _)| *a));
            for ip in checks {
                // The longest matching prefix; among equal prefixes, the last inserted.
                let mut best: Option<(u8, usize)> = None;
                for (i, (a, len)) in ps.iter().enumerate() {
                    let mask = if *len == 0 { 0 } else { u32::MAX << (32 - len) };
                    if ip & mask == a & mask && best.is_none_or(|(l, _)| *len >= l) {
                        best = Some((*len, i));
                    }
                }
                let got = t.resolve(IpAddr::V4(ip.into())).asn;
                prop_assert_eq!(got, best.map(|(_, i)| i as u32));
            }
        }

        #[test]
        fn resolving_many_at_once_agrees_with_one_at_a_time(
            ps in prop::collection::vec((0u32..3, any::<u16>(), 8u8..=32), 1..300),
            v6 in prop::collection::vec((any::<u64>(), 16u8..=64), 0..200),
            probes in prop::collection::vec((0u8..4, 0u32..3, any::<u16>(), any::<u64>()), 0..200),
        ) {
            // Three /16s hold every IPv4 prefix, so a block has up to hundreds of ranges and the
            // searches of different lanes take different numbers of steps; the probes mix IPv4,
            // IPv4-mapped IPv6, IPv6 and addresses outside every prefix, more of them than one
            // lockstep round takes.
            let v4 = |block: u32, low: u16| ((0x0a00 + block) << 16) | u32::from(low);
            let mut b = PrefixTable::builder();
            for (i, (block, low, len)) in ps.iter().enumerate() {
                let a = std::net::Ipv4Addr::from(v4(*block, *low));
                b.insert(&format!("{a}/{len}"), net(i as u32)).unwrap();
            }
            for (i, (high, len)) in v6.iter().enumerate() {
                let a = std::net::Ipv6Addr::from((0x2001u128 << 112) | (u128::from(*high) << 48));
                b.insert(&format!("{a}/{len}"), net(10_000 + i as u32)).unwrap();
            }
            let t = b.build();
            let mut ips: Vec<IpAddr> = probes
                .iter()
                .map(|&(kind, block, low, high)| match kind {
                    0 => IpAddr::V4(v4(block, low).into()),
                    1 => IpAddr::V6(std::net::Ipv4Addr::from(v4(block, low)).to_ipv6_mapped()),
                    2 => IpAddr::V6(((0x2001u128 << 112) | (u128::from(high) << 48)).into()),
                    _ => IpAddr::V4(std::net::Ipv4Addr::from(high as u32)),
                })
                .collect();
            // Each prefix's first and last address, and the ones either side: where a range
            // starts and ends.
            for (block, low, len) in &ps {
                let host = u32::MAX.checked_shr(u32::from(*len)).unwrap_or(0);
                let first = v4(*block, *low) & !host;
                for a in [first.wrapping_sub(1), first, first | host, (first | host).wrapping_add(1)] {
                    ips.push(IpAddr::V4(a.into()));
                }
            }
            for (high, len) in &v6 {
                let host = u128::MAX.checked_shr(u32::from(*len)).unwrap_or(0);
                let first = ((0x2001u128 << 112) | (u128::from(*high) << 48)) & !host;
                for a in [first - 1, first, first | host, (first | host) + 1] {
                    ips.push(IpAddr::V6(a.into()));
                }
            }
            let one_at_a_time: Vec<ClientNetwork> = ips.iter().map(|ip| t.resolve(*ip)).collect();
            let mut at_once = vec![net(u32::MAX); ips.len()];
            t.resolve_all(&ips, &mut at_once);
            prop_assert_eq!(&at_once, &one_at_a_time);
            // The trait's own answer, as a resolver without a batch path gives it.
            let mut default = vec![net(u32::MAX); ips.len()];
            NetworkResolver::resolve_all(&&NoBatch(&t), &ips, &mut default);
            prop_assert_eq!(&default, &one_at_a_time);
        }

        #[test]
        fn prefixes_sharing_networks_resolve_to_their_own(
            ps in prop::collection::vec((any::<bool>(), any::<u32>(), 0u8..=32, 0usize..5), 1..60),
            probes in prop::collection::vec((any::<bool>(), any::<u32>()), 20),
        ) {
            // Each network is stored once however many prefixes name it, IPv4 and IPv6 alike:
            // a few networks, some alike but for their country or its absence, named by many
            // prefixes of both families.
            let de = Country::new("DE").unwrap();
            let fr = Country::new("FR").unwrap();
            let pool = [
                ClientNetwork::new(Some(64500), Some(de)),
                ClientNetwork::new(Some(64500), Some(fr)),
                ClientNetwork::new(Some(64500), None),
                ClientNetwork::new(None, Some(de)),
                ClientNetwork::new(None, None),
            ];
            let addr = |v6: bool, a: u32| -> u128 {
                if v6 { (0x2001u128 << 112) | u128::from(a) << 80 } else { u128::from(a) }
            };
            let mut b = PrefixTable::builder();
            for (v6, a, len, n) in &ps {
                let text = if *v6 {
                    format!("{}/{}", std::net::Ipv6Addr::from(addr(true, *a)), 16 + len * 3)
                } else {
                    format!("{}/{}", std::net::Ipv4Addr::from(*a), len)
                };
                b.insert(&text, pool[*n]).unwrap();
            }
            let t = b.build();
            let mut checks = probes;
            checks.extend(ps.iter().map(|(v6, a, _, _)| (*v6, *a)));
            for (v6, ip) in checks {
                let mut best: Option<(u8, usize)> = None;
                for (i, (p6, a, len, _)) in ps.iter().enumerate() {
                    if *p6 != v6 {
                        continue;
                    }
                    let (bits, len) = if v6 { (128, 16 + len * 3) } else { (32, *len) };
                    let mask = u128::MAX.checked_shl(u32::from(bits - len)).unwrap_or(0)
                        & (u128::MAX >> (128 - bits));
                    if addr(v6, ip) & mask == addr(v6, *a) & mask && best.is_none_or(|(l, _)| len >= l) {
                        best = Some((len, i));
                    }
                }
                let ip_addr = if v6 {
                    IpAddr::V6(addr(true, ip).into())
                } else {
                    IpAddr::V4(ip.into())
                };
                let want = best.map(|(_, i)| pool[ps[i].3]).unwrap_or_default();
                prop_assert_eq!(t.resolve(ip_addr), want);
                let mut at_once = [net(u32::MAX)];
                t.resolve_all(&[ip_addr], &mut at_once);
                prop_assert_eq!(at_once[0], want);
            }
            // Stored once: never more networks than the prefixes name apart.
            let mut named: Vec<ClientNetwork> = ps.iter().map(|p| pool[p.3]).collect();
            named.sort_by_key(|n| (n.asn, n.country.map(|c| c.as_bytes())));
            named.dedup();
            prop_assert!(t.values.len() <= named.len(), "{} networks for {}", t.values.len(), named.len());
        }

        #[test]
        fn ipv6_agrees_with_a_linear_scan(
            ps in prop::collection::vec(((0u128..4, any::<u128>()), 0u8..=128), 1..40),
            probes in prop::collection::vec((0u128..4, any::<u128>()), 20),
        ) {
            // Four top-16-bit blocks around 2001::, so prefixes nest and share blocks; short
            // prefixes span many blocks.
            let addr = |(top, rest): (u128, u128)| ((0x2000 + top) << 112) | (rest >> 16);
            let ps: Vec<(u128, u8)> = ps.into_iter().map(|(a, l)| (addr(a), l)).collect();
            let mut b = PrefixTable::builder();
            for (i, (a, len)) in ps.iter().enumerate() {
                b.insert(&format!("{}/{}", std::net::Ipv6Addr::from(*a), len), net(i as u32)).unwrap();
            }
            let t = b.build();
            let mut checks: Vec<u128> = probes.into_iter().map(addr).collect();
            checks.extend(ps.iter().map(|(a, _)| *a));
            checks.push(0);
            checks.push(u128::MAX);
            for ip in checks {
                let mut best: Option<(u8, usize)> = None;
                for (i, (a, len)) in ps.iter().enumerate() {
                    let mask = if *len == 0 { 0 } else { u128::MAX << (128 - len) };
                    if ip & mask == a & mask && best.is_none_or(|(l, _)| *len >= l) {
                        best = Some((*len, i));
                    }
                }
                let v6 = std::net::Ipv6Addr::from(ip);
                // An IPv4-mapped address is looked up as IPv4.
                if v6.to_ipv4_mapped().is_some() {
                    continue;
                }
                let got = t.resolve(IpAddr::V6(v6)).asn;
                prop_assert_eq!(got, best.map(|(_, i)| i as u32));
            }
        }
    }
}
