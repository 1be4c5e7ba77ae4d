//! The engine's memory between rounds: explicit state, passed in and returned, so `decide`
//! stays a pure function.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use multicdn_core::{CohortId, ProviderId, Timestamp, Weights};
use serde::{Deserialize, Serialize};

use super::drill::{Abort, DrillProgress};

/// The hour the movement caps look back over.
pub const HOUR: Duration = Duration::from_secs(3600);

/// A fast hasher for cohort ids (short strings this process made; not exposed to untrusted
/// keys in a way that matters: a collision costs time, never correctness).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 32)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(i)).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }
}

/// One cohort the engine keeps: its region, for carved-out cohorts (whose static weights they
/// fall back to while their data is missing), and its memory (`None`: nothing to remember).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) id: CohortId,
    pub(crate) parent: Option<CohortId>,
    pub(crate) memory: Option<Arc<CohortMemory>>,
}

/// The engine's per-cohort memory, in the order the last round wrote it: the plan's order,
/// which is the order the next round reads it in, so a round walks it front to back instead
/// of hashing every cohort into a table (a lookup out of that order uses an index built the
/// first time one is needed). Every carved-out cohort has an entry, with its region; a cohort
/// with nothing to remember reads as absent.
///
/// A memory the round did not change is shared with the round before (a reference count),
/// not copied.
#[derive(Debug, Clone, Default)]
pub struct CohortMemories {
    entries: Vec<Entry>,
    /// `(hash of the id, position)`, sorted: built on the first lookup out of order.
    index: OnceLock<Vec<(u64, u32)>>,
}

fn id_hash(id: &CohortId) -> u64 {
    BuildHasherDefault::<IdHasher>::default().hash_one(id)
}

/// The same cohort: the same shared text (ids cloned from one another), or equal text.
#[inline]
pub(crate) fn same_id(a: &CohortId, b: &CohortId) -> bool {
    std::ptr::eq(a.as_str(), b.as_str()) || a == b
}

impl CohortMemories {
    /// A cohort's memory, if it has any.
    pub fn get(&self, cohort: &CohortId) -> Option<&CohortMemory> {
        self.position(cohort)
            .and_then(|at| self.entries[at].memory.as_deref())
    }

    /// How many cohorts have something to remember.
    pub fn len(&self) -> usize {
        self.entries.iter().filter(|e| e.memory.is_some()).count()
    }

    /// True when no cohort has anything to remember.
    pub fn is_empty(&self) -> bool {
        self.entries.iter().all(|e| e.memory.is_none())
    }

    /// Every cohort with something to remember, in the order the last round wrote them.
    pub fn iter(&self) -> impl Iterator<Item = (&CohortId, &CohortMemory)> + '_ {
        self.entries
            .iter()
            .filter_map(|e| e.memory.as_deref().map(|m| (&e.id, m)))
    }

    /// Sets a cohort's memory (an idle one is forgotten); its region, if any, is kept.
    pub fn insert(&mut self, cohort: CohortId, memory: CohortMemory) {
        let memory = (!memory.is_idle()).then(|| Arc::new(memory));
        match self.position(&cohort) {
            Some(at) => self.entries[at].memory = memory,
            None if memory.is_some() => self.push(Entry {
                id: cohort,
                parent: None,
                memory,
            }),
            None => {}
        }
    }

    /// A cohort's memory to change in place, empty if it had none.
    pub fn get_mut_or_default(&mut self, cohort: &CohortId) -> &mut CohortMemory {
        let at = match self.position(cohort) {
            Some(at) => at,
            None => {
                self.push(Entry {
                    id: cohort.clone(),
                    parent: None,
                    memory: None,
                });
                self.entries.len() - 1
            }
        };
        Arc::make_mut(self.entries[at].memory.get_or_insert_with(Arc::default))
    }

    /// Changes every memory in place, then forgets the idle ones (and drops cohorts left with
    /// neither memory nor region).
    pub(crate) fn update_all(&mut self, mut f: impl FnMut(&mut CohortMemory)) {
        for e in &mut self.entries {
            if let Some(m) = e.memory.as_mut() {
                let m = Arc::make_mut(m);
                f(m);
                if m.is_idle() {
                    e.memory = None;
                }
            }
        }
        self.entries
            .retain(|e| e.memory.is_some() || e.parent.is_some());
        self.index = OnceLock::new();
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Appends a cohort not listed yet (the round writes its memory in order).
    pub(crate) fn push(&mut self, entry: Entry) {
        self.entries.push(entry);
        self.index = OnceLock::new();
    }

    /// The entries of a round, in plan order.
    pub(crate) fn from_entries(entries: Vec<Entry>) -> CohortMemories {
        CohortMemories {
            entries,
            index: OnceLock::new(),
        }
    }

    /// Where a cohort's entry is, through the index.
    pub(crate) fn position(&self, cohort: &CohortId) -> Option<usize> {
        let index = self.index.get_or_init(|| {
            let mut index: Vec<(u64, u32)> = self
                .entries
                .iter()
                .enumerate()
                .map(|(i, e)| (id_hash(&e.id), i as u32))
                .collect();
            index.sort_unstable();
            index
        });
        let h = id_hash(cohort);
        let from = index.partition_point(|(x, _)| *x < h);
        index[from..]
            .iter()
            .take_while(|(x, _)| *x == h)
            .map(|(_, i)| *i as usize)
            .find(|i| same_id(&self.entries[*i].id, cohort))
    }
}

/// Equal when the same cohorts remember the same things and have the same regions, whatever
/// the order they were written in.
impl PartialEq for CohortMemories {
    fn eq(&self, other: &CohortMemories) -> bool {
        let significant = |m: &CohortMemories| {
            m.entries
                .iter()
                .filter(|e| e.memory.is_some() || e.parent.is_some())
                .count()
        };
        significant(self) == significant(other)
            && self
                .entries
                .iter()
                .filter(|e| e.memory.is_some() || e.parent.is_some())
                .all(|e| {
                    other.position(&e.id).is_some_and(|at| {
                        let o = &other.entries[at];
                        o.parent == e.parent && o.memory.as_deref() == e.memory.as_deref()
                    })
                })
    }
}

/// Entries a [`Lookup`] reads ahead before it asks the index.
const LOOK_AHEAD: usize = 4;

/// Reads entries in the order they were written, through the index when a cohort is out of
/// that order.
pub(crate) struct Lookup<'a> {
    memories: &'a CohortMemories,
    next: usize,
}

impl<'a> Lookup<'a> {
    /// A lookup that expects its first cohort at about `at`.
    pub(crate) fn near(memories: &'a CohortMemories, at: usize) -> Lookup<'a> {
        Lookup { memories, next: at }
    }

    /// A cohort's entry; cheapest when asked in the order they were written (a few entries
    /// ahead of the last one found, or of where the lookup began, are looked at before the
    /// index is built).
    pub(crate) fn get(&mut self, cohort: &CohortId) -> Option<&'a Entry> {
        let entries = &self.memories.entries;
        let from = self.next.min(entries.len());
        let ahead = &entries[from..entries.len().min(from + LOOK_AHEAD)];
        if let Some(k) = ahead.iter().position(|e| same_id(&e.id, cohort)) {
            self.next = from + k + 1;
            return Some(&ahead[k]);
        }
        if entries.is_empty() {
            return None;
        }
        let at = self.memories.position(cohort)?;
        self.next = at + 1;
        Some(&entries[at])
    }
}

/// A cohort's last optimizing move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastMove {
    /// When.
    pub at: Timestamp,
    /// The provider that lost traffic.
    pub from: ProviderId,
    /// The provider that gained it.
    pub to: ProviderId,
}

/// What the engine remembers about one cohort.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CohortMemory {
    /// The last optimizing move, for settling and hysteresis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_move: Option<LastMove>,
    /// A move awaits its re-measurement once the cohort has settled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remeasure_due: bool,
    /// Optimizing moves in the last hour: when, and basis points.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<(Timestamp, u32)>,
    /// Recovery moves in the last hour: their own per-cohort budget, beside the optimisation's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_recovery: Vec<(Timestamp, u32)>,
    /// The weights in force when a provider first went down (failover steps are shares of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_failover: Option<Weights>,
    /// Where recovery returns the cohort once every provider is up again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovering_to: Option<Weights>,
    /// The weights the cohort had when a drill began (its steps are shares of them), and the
    /// drill's name: where it returns when the drill is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_drill: Option<(CohortId, Weights)>,
}

impl CohortMemory {
    /// Basis points moved by optimizing rules in the hour before `now`.
    pub fn moved_last_hour(&self, now: Timestamp) -> u32 {
        self.recent
            .iter()
            .filter(|(at, _)| now.since(*at) < HOUR)
            .map(|(_, bp)| *bp)
            .sum()
    }

    /// Basis points moved by recovery in the hour before `now`.
    pub fn recovered_last_hour(&self, now: Timestamp) -> u32 {
        self.recent_recovery
            .iter()
            .filter(|(at, _)| now.since(*at) < HOUR)
            .map(|(_, bp)| *bp)
            .sum()
    }

    pub(crate) fn prune(&mut self, now: Timestamp) {
        self.recent.retain(|(at, _)| now.since(*at) < HOUR);
        self.recent_recovery.retain(|(at, _)| now.since(*at) < HOUR);
    }

    /// True when there is nothing to remember.
    pub(crate) fn is_idle(&self) -> bool {
        self.last_move.is_none()
            && !self.remeasure_due
            && self.recent.is_empty()
            && self.recent_recovery.is_empty()
            && self.before_failover.is_none()
            && self.recovering_to.is_none()
            && self.before_drill.is_none()
    }
}

/// The engine's whole memory.
///
/// Serialised as `{"cohorts": {id: memory}, "recent": [...]}`, a carved-out cohort's memory
/// carrying its `parent` region.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(from = "StateFile", into = "StateFile")]
pub struct EngineState {
    /// Per cohort: what it remembers (moves, failover, recovery) and, for carved-out cohorts,
    /// the region it falls back to.
    pub cohorts: CohortMemories,
    /// Optimizing moves in the last hour, weighted by each cohort's traffic share, in basis
    /// points of all traffic.
    pub recent: VecDeque<(Timestamp, f64)>,
    /// Recovery moves in the last hour, weighted the same way: a budget of their own, so that
    /// returning traffic after an outage never spends the optimisation's hourly cap (nor the
    /// other way round).
    pub recent_recovery: VecDeque<(Timestamp, f64)>,
    /// Every drill of the policy that has begun: its progress and report, by name.
    pub drills: BTreeMap<CohortId, DrillProgress>,
}

impl EngineState {
    /// Fresh memory.
    pub fn new() -> EngineState {
        EngineState::default()
    }

    /// Share-weighted basis points moved in the hour before `now`.
    pub fn moved_last_hour(&self, now: Timestamp) -> f64 {
        self.recent
            .iter()
            .filter(|(at, _)| now.since(*at) < HOUR)
            .map(|(_, bp)| *bp)
            .sum()
    }

    /// The region a carved-out cohort falls back to (its static weights) while its data is
    /// missing.
    pub fn parent(&self, cohort: &CohortId) -> Option<&CohortId> {
        self.cohorts
            .position(cohort)
            .and_then(|at| self.cohorts.entries()[at].parent.as_ref())
    }

    /// Aborts the running drill `name` at `at`: its return begins, stepwise, from the level
    /// it reached. `region` names the region whose figures regressed, if any. False when no
    /// such drill is running or it was already aborted.
    pub fn abort_drill(
        &mut self,
        name: &CohortId,
        at: Timestamp,
        region: Option<CohortId>,
        reason: impl Into<String>,
    ) -> bool {
        match self.drills.get_mut(name) {
            Some(p) if p.aborted.is_none() && p.ended.is_none() => {
                p.aborted = Some(Abort {
                    at,
                    region,
                    reason: reason.into(),
                });
                true
            }
            _ => false,
        }
    }

    /// Every carved-out cohort and its region.
    pub fn parents(&self) -> impl Iterator<Item = (&CohortId, &CohortId)> + '_ {
        self.cohorts
            .entries()
            .iter()
            .filter_map(|e| e.parent.as_ref().map(|p| (&e.id, p)))
    }

    pub(crate) fn prune(&mut self, now: Timestamp) {
        while self
            .recent
            .front()
            .is_some_and(|(at, _)| now.since(*at) >= HOUR)
        {
            self.recent.pop_front();
        }
        while self
            .recent_recovery
            .front()
            .is_some_and(|(at, _)| now.since(*at) >= HOUR)
        {
            self.recent_recovery.pop_front();
        }
        self.cohorts.update_all(|m| m.prune(now));
    }
}

/// A cohort's memory as serialised: with its parent region.
#[derive(Serialize, Deserialize)]
struct MemoryFile {
    #[serde(flatten)]
    memory: CohortMemory,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent: Option<CohortId>,
}

/// The serialised form of [`EngineState`].
#[derive(Serialize, Deserialize)]
struct StateFile {
    #[serde(default)]
    cohorts: std::collections::BTreeMap<CohortId, MemoryFile>,
    #[serde(default)]
    recent: VecDeque<(Timestamp, f64)>,
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    recent_recovery: VecDeque<(Timestamp, f64)>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    drills: BTreeMap<CohortId, DrillProgress>,
}

impl From<EngineState> for StateFile {
    fn from(state: EngineState) -> StateFile {
        let cohorts: std::collections::BTreeMap<CohortId, MemoryFile> = state
            .cohorts
            .entries
            .into_iter()
            .filter(|e| e.memory.is_some() || e.parent.is_some())
            .map(|e| {
                let memory = e
                    .memory
                    .map(|m| Arc::try_unwrap(m).unwrap_or_else(|m| (*m).clone()))
                    .unwrap_or_default();
                (
                    e.id,
                    MemoryFile {
                        memory,
                        parent: e.parent,
                    },
                )
            })
            .collect();
        StateFile {
            cohorts,
            recent: state.recent,
            recent_recovery: state.recent_recovery,
            drills: state.drills,
        }
    }
}

impl From<StateFile> for EngineState {
    fn from(file: StateFile) -> EngineState {
        let mut state = EngineState {
            recent: file.recent,
            recent_recovery: file.recent_recovery,
            drills: file.drills,
            ..EngineState::default()
        };
        for (id, m) in file.cohorts {
            let memory = (!m.memory.is_idle()).then(|| Arc::new(m.memory));
            if memory.is_some() || m.parent.is_some() {
                state.cohorts.push(Entry {
                    id,
                    parent: m.parent,
                    memory,
                });
            }
        }
        state
    }
}
