//! Cohort assembly: the round's cohorts, each with its weights in force, its input and its
//! memory from the last round.
//!
//! Finer cohorts come first (those in force, in plan order; then new ones, in input order; then
//! pinned networks), then the policy's regions in policy order, so that a finer cohort matches
//! before the region holding it. A new cohort starts from its region's weights in force; a
//! cohort listed twice keeps its first entry.

use std::hash::BuildHasherDefault;

use multicdn_core::policy::Pin;
use multicdn_core::{CohortId, CohortPlan, NetworkKey, Networks, SteeringPlan, Timestamp};

use super::state::{self, CohortMemory};
use super::{
    CohortInput, Ctx, IdHasher, IdMap, Inputs, Memory, Work, cohort_id_for, default_cohort_id,
    in_chunks, same_cohort,
};

/// What the round's cohorts borrow: the static plan, and the pins in force with their cohorts.
pub(super) struct Frame<'a> {
    pub(super) static_plan: &'a SteeringPlan,
    default_id: CohortId,
    pub(super) pins: Vec<&'a Pin>,
    pin_ids: Vec<CohortId>,
    pin_networks: Vec<Networks>,
}

impl<'a> Frame<'a> {
    pub(super) fn new(ctx: &Ctx<'a>, static_plan: &'a SteeringPlan) -> Frame<'a> {
        let default_id = static_plan
            .cohorts
            .iter()
            .find(|c| c.networks.contains(&NetworkKey::Global))
            .map(|c| c.cohort.clone())
            .unwrap_or_else(default_cohort_id);
        let pins: Vec<&Pin> = ctx
            .steering
            .pins
            .iter()
            .filter(|p| ctx.now < p.until)
            .collect();
        let pin_ids = pins.iter().map(|p| cohort_id_for(p.network)).collect();
        let pin_networks = pins.iter().map(|p| Networks::one(p.network)).collect();
        Frame {
            static_plan,
            default_id,
            pins,
            pin_ids,
            pin_networks,
        }
    }

    /// The region `id` names, by its place in the static plan. Compared on every cohort: a
    /// first-byte check spares most string comparisons.
    #[inline]
    pub(super) fn region_of(&self, id: &CohortId) -> Option<usize> {
        let first = id.as_str().as_bytes().first();
        self.static_plan
            .cohorts
            .iter()
            .position(|c| c.cohort.as_str().as_bytes().first() == first && &c.cohort == id)
    }

    /// The round's cohorts, in plan order (see the module documentation).
    pub(super) fn cohorts<'r>(&'r self, ctx: &Ctx<'_>, inputs: &'r Inputs<'_>) -> Vec<Work<'r>> {
        let now = ctx.now;
        let old = inputs.state;
        let mut current: IdMap<'_, &CohortPlan> = IdMap::default();
        for c in &inputs.current.cohorts {
            // Only regions: finer cohorts in force are found through `index` below.
            if self.region_of(&c.cohort).is_some() {
                current.insert(&c.cohort, c);
            }
        }
        let memory_of = |entry| memory_of(entry, now);

        // The cohorts of this round: finer ones first (those in force, in plan order, then new
        // ones in input order, then pinned networks), then the regions in policy order.
        let mut work: Vec<Work<'_>> =
            Vec::with_capacity(inputs.cohorts.len() + inputs.current.cohorts.len());
        // The finer cohorts in force, found again by the hash of their id (sorted, so that no
        // table is built for the common case: inputs in plan order). Each is independent of the
        // others: a large plan is read in chunks on every core, each chunk's memory looked up
        // from about where the chunk starts.
        let mut hashes = HashIndex::with_capacity(inputs.current.cohorts.len());
        let plan = inputs.current.cohorts.as_slice();
        let chunks = in_chunks(ctx.threads, plan, |start, chunk: &[CohortPlan]| {
            let near = start * old.cohorts.len() / plan.len().max(1);
            let mut lookup = state::Lookup::near(&old.cohorts, near);
            let mut finer = Vec::with_capacity(chunk.len());
            let mut keys = Vec::with_capacity(chunk.len());
            for c in chunk {
                if self.region_of(&c.cohort).is_none() {
                    keys.push(hashes.hash_bits(&c.cohort));
                    let entry = lookup.get(&c.cohort);
                    finer.push(Work::new(
                        &c.cohort,
                        &c.networks,
                        &c.weights,
                        memory_of(entry),
                        entry.and_then(|e| e.parent.as_ref()),
                    ));
                }
            }
            (finer, keys)
        });
        for (mut finer, keys) in chunks {
            for key in keys {
                hashes.push_hashed(key);
            }
            work.append(&mut finer);
        }
        // New cohorts, pins and regions come after the finer ones in memory too.
        let mut lookup = state::Lookup::near(&old.cohorts, work.len());
        hashes.sort();
        // A cohort listed twice keeps its first entry.
        let twice = hashes.duplicates(&work);
        if !twice.is_empty() {
            let mut at = 0;
            work.retain(|_| {
                at += 1;
                twice.binary_search(&(at - 1)).is_err()
            });
            hashes = HashIndex::with_capacity(work.len());
            for w in &work {
                hashes.push(w.id);
            }
            hashes.sort();
        }
        let in_force = work.len();
        // Cohorts new this round, and (once inputs stray far from plan order) all of them.
        let mut index: IdMap<'_, usize> = IdMap::default();
        let mut strays = 0usize;
        let mut region_inputs: Vec<Option<&CohortInput>> =
            vec![None; self.static_plan.cohorts.len()];
        // Inputs usually list the cohorts in force in plan order: try the next one first.
        let mut guess = 0;
        for i in inputs.cohorts {
            let at = if work
                .get(guess)
                .is_some_and(|w| !w.region && same_cohort(w.id, &i.cohort))
            {
                // Ids in `work` are unique: this is the cohort's only entry.
                guess
            } else {
                if let Some(r) = self.region_of(&i.cohort) {
                    region_inputs[r] = Some(i);
                    continue;
                }
                strays += 1;
                if strays == STRAYS_BEFORE_INDEXING {
                    index.reserve(in_force);
                    for (k, w) in work[..in_force].iter().enumerate() {
                        index.insert(w.id, k);
                    }
                }
                let known = if strays >= STRAYS_BEFORE_INDEXING {
                    index.get(&i.cohort).copied()
                } else {
                    hashes
                        .find(&work, &i.cohort)
                        .or_else(|| index.get(&i.cohort).copied())
                };
                match known {
                    Some(at) => at,
                    None => {
                        let parent = i.parent.as_ref().unwrap_or(&self.default_id);
                        let Some(start) = current.get(parent).map(|c| &c.weights).or_else(|| {
                            self.region_of(parent)
                                .map(|r| &self.static_plan.cohorts[r].weights)
                        }) else {
                            continue;
                        };
                        index.insert(&i.cohort, work.len());
                        work.push(Work::new(
                            &i.cohort,
                            &i.networks,
                            start,
                            memory_of(lookup.get(&i.cohort)),
                            None,
                        ));
                        work.len() - 1
                    }
                }
            };
            if at < in_force {
                guess = at + 1;
            }
            let item = &mut work[at];
            item.input = Some(i);
            item.share = i.share;
            item.parent = i.parent.as_ref();
        }
        for ((pin, id), networks) in self.pins.iter().zip(&self.pin_ids).zip(&self.pin_networks) {
            let exact = self
                .static_plan
                .cohorts
                .iter()
                .any(|c| c.networks == [pin.network])
                || work.iter().any(|w| *w.networks == [pin.network]);
            if !exact {
                let parent = self
                    .static_plan
                    .cohorts
                    .iter()
                    .find(|c| c.networks.contains(&pin.network))
                    .map_or(&self.default_id, |c| &c.cohort);
                let start = current.get(parent).map(|c| &c.weights).or_else(|| {
                    self.region_of(parent)
                        .map(|r| &self.static_plan.cohorts[r].weights)
                });
                if let Some(start) = start {
                    work.push(Work::new(
                        id,
                        networks,
                        start,
                        memory_of(lookup.get(id)),
                        Some(parent),
                    ));
                }
            }
        }
        for (r, c) in self.static_plan.cohorts.iter().enumerate() {
            let w = current
                .get(&c.cohort)
                .map_or(&c.weights, |cur| &cur.weights);
            let input = region_inputs[r];
            let entry = lookup.get(&c.cohort);
            let mut region = Work::new(
                &c.cohort,
                &c.networks,
                w,
                memory_of(entry),
                entry.and_then(|e| e.parent.as_ref()),
            );
            region.region = true;
            region.input = input;
            region.share = input.map_or(0.0, |i| i.share);
            work.push(region);
        }
        work
    }
}

/// Memory of a cohort the engine has nothing on yet.
static IDLE: CohortMemory = CohortMemory {
    last_move: None,
    remeasure_due: false,
    recent: Vec::new(),
    recent_recovery: Vec::new(),
    before_failover: None,
    recovering_to: None,
    before_drill: None,
};

/// Inputs out of plan order looked up by binary search before a table is built for them.
const STRAYS_BEFORE_INDEXING: usize = 256;

/// The cohorts in force, found again by the hash of their id: one sorted `u64` per cohort, the
/// id's hash in the high bits and the cohort's place in the low ones (an integer sort, several
/// times faster at a hundred thousand cohorts than sorting pairs). Equal ids have equal keys
/// above the place bits; ids are compared wherever the hashes agree.
struct HashIndex {
    keys: Vec<u64>,
    /// Bits for the place: enough for every cohort pushed (at most `capacity`).
    bits: u32,
}

impl HashIndex {
    fn with_capacity(capacity: usize) -> HashIndex {
        HashIndex {
            keys: Vec::with_capacity(capacity),
            bits: usize::BITS - capacity.leading_zeros(),
        }
    }

    /// Adds the cohort at the next place (`keys.len()`).
    fn push(&mut self, id: &CohortId) {
        self.push_hashed(self.hash_bits(id));
    }

    /// Adds the cohort whose [`HashIndex::hash_bits`] are `hash_bits` at the next place.
    fn push_hashed(&mut self, hash_bits: u64) {
        let place = self.keys.len() as u64;
        debug_assert!(place < 1 << self.bits);
        self.keys.push(hash_bits | place);
    }

    fn hash_bits(&self, id: &CohortId) -> u64 {
        use std::hash::BuildHasher;
        let h = BuildHasherDefault::<IdHasher>::default().hash_one(id);
        h.checked_shr(self.bits)
            .and_then(|x| x.checked_shl(self.bits))
            .unwrap_or(0)
    }

    fn sort(&mut self) {
        self.keys.sort_unstable();
    }

    fn place(&self, key: u64) -> usize {
        (key & ((1u64 << self.bits) - 1)) as usize
    }

    fn same_hash(&self, a: u64, b: u64) -> bool {
        (a ^ b) >> self.bits == 0
    }

    /// Later entries of ids listed more than once, sorted.
    fn duplicates(&self, work: &[Work<'_>]) -> Vec<usize> {
        let mut out = Vec::new();
        for group in self
            .keys
            .chunk_by(|a, b| self.same_hash(*a, *b))
            .filter(|g| g.len() > 1)
        {
            // In place order within a group: an entry repeats an earlier one.
            for (k, b) in group.iter().enumerate().skip(1) {
                let b = self.place(*b);
                if group[..k]
                    .iter()
                    .any(|a| same_cohort(work[self.place(*a)].id, work[b].id))
                {
                    out.push(b);
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// The place of a cohort in force.
    fn find(&self, work: &[Work<'_>], id: &CohortId) -> Option<usize> {
        let h = self.hash_bits(id);
        let from = self.keys.partition_point(|k| *k < h);
        self.keys[from..]
            .iter()
            .take_while(|k| self.same_hash(**k, h))
            .map(|k| self.place(*k))
            .find(|i| same_cohort(work[*i].id, id))
    }
}

/// A cohort's memory from the last round (its entry, read in plan order), shared, and a pruned
/// copy when it has moves older than the hour.
fn memory_of(entry: Option<&state::Entry>, now: Timestamp) -> Memory<'_> {
    let kept = entry.and_then(|e| e.memory.as_ref());
    let mem = kept.map_or(&IDLE, |m| &**m);
    let own = mem
        .recent
        .iter()
        .any(|(at, _)| now.since(*at) >= state::HOUR)
        .then(|| {
            let mut mem = Box::new(mem.clone());
            mem.prune(now);
            mem
        });
    (mem, kept, own)
}
