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
    same_cohort,
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
        let mut lookup = state::Lookup::new(&old.cohorts);
        // The finer cohorts in force, found again by the hash of their id (sorted, so that no
        // table is built for the common case: inputs in plan order).
        let mut hashes: Vec<(u64, usize)> = Vec::with_capacity(inputs.current.cohorts.len());
        for c in &inputs.current.cohorts {
            if self.region_of(&c.cohort).is_none() {
                hashes.push((id_hash(&c.cohort), work.len()));
                let entry = lookup.get(&c.cohort);
                work.push(Work::new(
                    &c.cohort,
                    &c.networks,
                    &c.weights,
                    memory_of(entry),
                    entry.and_then(|e| e.parent.as_ref()),
                ));
            }
        }
        hashes.sort_unstable();
        // A cohort listed twice keeps its first entry.
        let twice = duplicates(&hashes, &work);
        if !twice.is_empty() {
            let mut at = 0;
            work.retain(|_| {
                at += 1;
                twice.binary_search(&(at - 1)).is_err()
            });
            hashes = work
                .iter()
                .enumerate()
                .map(|(i, w)| (id_hash(w.id), i))
                .collect();
            hashes.sort_unstable();
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
                    find_hashed(&hashes, &work, &i.cohort).or_else(|| index.get(&i.cohort).copied())
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

fn id_hash(id: &CohortId) -> u64 {
    use std::hash::BuildHasher;
    BuildHasherDefault::<IdHasher>::default().hash_one(id)
}

/// Later entries of ids listed more than once (equal ids have equal hashes), sorted.
fn duplicates(hashes: &[(u64, usize)], work: &[Work<'_>]) -> Vec<usize> {
    let mut out = Vec::new();
    for group in hashes.chunk_by(|a, b| a.0 == b.0).filter(|g| g.len() > 1) {
        // In work order within a group: an entry repeats an earlier one.
        for (k, (_, b)) in group.iter().enumerate().skip(1) {
            if group[..k]
                .iter()
                .any(|(_, a)| same_cohort(work[*a].id, work[*b].id))
            {
                out.push(*b);
            }
        }
    }
    out.sort_unstable();
    out
}

/// The entry of a cohort in force, by the hash of its id.
fn find_hashed(hashes: &[(u64, usize)], work: &[Work<'_>], id: &CohortId) -> Option<usize> {
    let h = id_hash(id);
    let from = hashes.partition_point(|(x, _)| *x < h);
    hashes[from..]
        .iter()
        .take_while(|(x, _)| *x == h)
        .map(|(_, i)| *i)
        .find(|i| same_cohort(work[*i].id, id))
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
