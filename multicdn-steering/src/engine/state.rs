//! The engine's memory between rounds: explicit state, passed in and returned, so `decide`
//! stays a pure function.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
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

/// The per-cohort memory map.
pub type CohortMap = HashMap<CohortId, CohortMemory, BuildHasherDefault<IdHasher>>;

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
    /// Per cohort with something to remember (moves, failover, recovery).
    pub cohorts: CohortMap,
    /// Optimizing moves in the last hour, weighted by each cohort's traffic share, in basis
    /// points of all traffic.
    pub recent: VecDeque<(Timestamp, f64)>,
    /// Recovery moves in the last hour, weighted the same way: a budget of their own, so that
    /// returning traffic after an outage never spends the optimisation's hourly cap (nor the
    /// other way round).
    pub recent_recovery: VecDeque<(Timestamp, f64)>,
    /// The region each carved-out cohort falls back to, in plan order (the order the next
    /// round reads them in).
    pub(crate) parents: Vec<(CohortId, CohortId)>,
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
    /// missing. A scan: for many cohorts, read [`EngineState::parents`].
    pub fn parent(&self, cohort: &CohortId) -> Option<&CohortId> {
        self.parents
            .iter()
            .find(|(c, _)| c == cohort)
            .map(|(_, p)| p)
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
    pub fn parents(&self) -> impl ExactSizeIterator<Item = (&CohortId, &CohortId)> + '_ {
        self.parents.iter().map(|(c, p)| (c, p))
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
        self.cohorts.retain(|_, m| {
            m.prune(now);
            !m.is_idle()
        });
    }
}

/// Reads parents in plan order, falling back to a map when the plan's order changed.
pub(crate) struct ParentLookup<'a> {
    list: &'a [(CohortId, CohortId)],
    next: usize,
    map: Option<HashMap<&'a CohortId, usize, BuildHasherDefault<IdHasher>>>,
}

impl<'a> ParentLookup<'a> {
    pub(crate) fn new(state: &'a EngineState) -> ParentLookup<'a> {
        ParentLookup {
            list: &state.parents,
            next: 0,
            map: None,
        }
    }

    /// The parent of `cohort`; cheapest when asked in the order they were written.
    pub(crate) fn get(&mut self, cohort: &CohortId) -> Option<&'a CohortId> {
        let list = self.list;
        if let Some((c, p)) = list.get(self.next)
            && (std::ptr::eq(c.as_str(), cohort.as_str()) || c == cohort)
        {
            self.next += 1;
            return Some(p);
        }
        if list.is_empty() {
            return None;
        }
        let map = self
            .map
            .get_or_insert_with(|| list.iter().enumerate().map(|(i, (c, _))| (c, i)).collect());
        let at = *map.get(cohort)?;
        self.next = at + 1;
        Some(&list[at].1)
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
        let mut cohorts: std::collections::BTreeMap<CohortId, MemoryFile> = state
            .cohorts
            .into_iter()
            .map(|(id, memory)| {
                (
                    id,
                    MemoryFile {
                        memory,
                        parent: None,
                    },
                )
            })
            .collect();
        for (id, parent) in state.parents {
            cohorts
                .entry(id)
                .or_insert_with(|| MemoryFile {
                    memory: CohortMemory::default(),
                    parent: None,
                })
                .parent = Some(parent);
        }
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
            if let Some(parent) = m.parent {
                state.parents.push((id.clone(), parent));
            }
            if !m.memory.is_idle() {
                state.cohorts.insert(id, m.memory);
            }
        }
        state
    }
}
