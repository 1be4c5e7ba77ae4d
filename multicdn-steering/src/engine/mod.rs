//! The decision engine: `decide(now, inputs) -> Decision`, pure and deterministic.
//!
//! One round turns the scores, the health, the policy and the weights in force into the next
//! plan, with a journal entry for every change. Rules, in order of precedence:
//!
//! 1. **Health failover, in steps.** When a provider goes down at `t`, its share (as it was
//!    when it went down) leaves in the policy's cumulative `failover.steps` (50% at `t`, 100%
//!    at `t + interval`), spread over the healthy providers by their weights. Never all at
//!    once; never limited by the movement caps (it is safety, not optimisation). When every
//!    provider is down, the static weights: never an empty answer.
//! 2. **Pins** set a network's split until they lapse; the journal records their reason.
//! 3. **Significance**: a RUM move needs a gap beyond `relative_gap` (of the slower provider's
//!    score), `absolute_gap`, and [`SIGNIFICANCE_Z`] standard errors of the difference (each
//!    score's [`ProviderEvidence::stderr`], from its cell's count and spread): a thin or noisy
//!    cell cannot move traffic, a thick one with a clear gap moves in the round it shows.
//! 4. **Hysteresis**: moving traffic back the way the last move came needs both gaps times
//!    `switch_back_factor`.
//! 5. **Damping**: one move shifts at most `step`, from the slowest provider with room above
//!    its floor to the fastest; then the cohort settles for `settle` and is measured again
//!    (a [`Rule::Remeasured`] entry, which the realized-improvement figure reads).
//! 6. **Floors**: every healthy provider keeps its measurement floor and commercial commit;
//!    down providers have none.
//! 7. **Guardrails, last**: each cohort changes by at most `max_change_per_cohort` an hour; all
//!    optimizing moves together (pins, recovery, RUM) move at most `max_moved_per_hour` of all
//!    traffic an hour, each cohort weighted by its traffic share (cohorts are served pins
//!    first, then recovery, then the largest relative gaps). Inputs older than `stale_after`
//!    (the deadman) and the big red switch (`static: true`) serve the policy's static weights.
//!
//! **No crumbs.** Optimizing moves go in whole steps of [`MOVE_STEP_BP`] (0.5%): a move a
//! guardrail cuts short is rounded down to whole steps (and held when less than one step is
//! left), and a RUM move needs at least one step of room above the slower provider's floor
//! (or the whole `step`, when the policy's step is smaller). A move that is not cut short
//! reaches its target exactly, however small: the last step of a recovery or a pin. Failover
//! steps and floors are safety, and exact to the basis point.
//!
//! After a failover, once every provider is up again, the cohort returns to its weights from
//! before the failover in damped, settled steps (rule `recovery`), within the guardrails, on a
//! budget of its own (`EngineState::recent_recovery`, `CohortMemory::recent_recovery`: the
//! same caps, counted apart from the optimisation's, so an outage's return never starves RUM
//! of its hourly movement, nor RUM the return). Recovery follows the cohort's own evidence:
//! when its scores show the returning provider slower than the fastest beyond the significance
//! gap, recovery ends there and RUM decides.
//!
//! **Cohorts.** The policy's regions are cohorts, with static weights. Finer cohorts (an ASN
//! with steerable cells, a pinned network) are carved out of the region holding them and start
//! from its weights; they are listed first in the plan, so they match before their region. A
//! cohort's traffic share, which weights the hourly cap, comes from its sample counts
//! ([`cohorts::cohort_inputs`] builds every input from a scoreboard snapshot).

pub mod cohorts;
pub mod drill;
pub mod state;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use multicdn_core::policy::{DrillSpec, Fallback, Pin, SteeringPolicy};
use multicdn_core::{
    CohortId, CohortPlan, HealthState, NetworkKey, Networks, Policy, ProviderId, SteeringPlan,
    TOTAL_BP, Timestamp, Weights, weights::largest_remainder,
};
use serde::{Deserialize, Serialize};

pub use drill::{DrillProgress, Phase};
pub use state::{CohortMemory, EngineState, IdHasher, LastMove};

use crate::journal::{Evidence, Guardrail, JournalEntry, Rule};

pub use multicdn_core::ProviderHealth;

/// One provider's score in a cohort.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderEvidence {
    /// The provider.
    pub provider: ProviderId,
    /// Its score (lower is better), or `None` when it could not be scored.
    pub score: Option<f64>,
    /// Samples behind the score.
    pub samples: u64,
    /// The score's standard error in milliseconds, from the cell's own count and spread
    /// (`None`: unknown, and only the policy's fixed gaps apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<f64>,
}

impl ProviderEvidence {
    /// A score with its sample count and no known standard error.
    pub fn new(provider: ProviderId, score: Option<f64>, samples: u64) -> ProviderEvidence {
        ProviderEvidence {
            provider,
            score,
            samples,
            stderr: None,
        }
    }

    /// With the score's standard error, in milliseconds.
    pub fn with_stderr(mut self, stderr: Option<f64>) -> ProviderEvidence {
        self.stderr = stderr.filter(|s| s.is_finite() && *s >= 0.0);
        self
    }
}

/// How many standard errors of the difference a RUM gap must clear (two-sided 95%): with
/// the fixed gaps of the policy, a thin or noisy cell cannot move traffic, and a thick one with
/// a clear gap moves at once.
pub const SIGNIFICANCE_Z: f64 = 1.96;

/// One cohort's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CohortInput {
    /// The cohort (`europe`, `as7922`).
    pub cohort: CohortId,
    /// The networks it covers.
    pub networks: Networks,
    /// For cohorts carved out of a region: the region, whose weights they start from and whose
    /// static weights they fall back to.
    pub parent: Option<CohortId>,
    /// Its share of all traffic, 0.0 to 1.0 (weights the hourly movement cap).
    pub share: f64,
    /// The cut the scores were read at.
    pub cut: Option<NetworkKey>,
    /// Scores per provider (shared with the journal entries that cite them).
    pub evidence: Arc<[ProviderEvidence]>,
}

/// Everything one round reads.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The policy (providers, static regions, floors, failover, RUM rules, guardrails, pins).
    pub policy: &'a Policy,
    /// The weights in force.
    pub current: &'a SteeringPlan,
    /// Measurements per cohort.
    pub cohorts: &'a [CohortInput],
    /// Provider health; a provider not listed is up.
    pub health: &'a BTreeMap<ProviderId, ProviderHealth>,
    /// When the measurements were last refreshed; `None` means never (the deadman fires).
    pub data_as_of: Option<Timestamp>,
    /// The engine's memory from the previous round.
    pub state: &'a EngineState,
}

/// How the round was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The rules ran.
    Steering,
    /// The inputs were stale: static weights.
    Deadman,
    /// The big red switch: static weights.
    Static,
    /// Every provider was down: static weights.
    AllDown,
}

/// A move a guardrail held back entirely.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Held {
    /// The cohort.
    pub cohort: CohortId,
    /// The rule that wanted to move.
    pub rule: Rule,
    /// Basis points it wanted.
    pub wanted_bp: u32,
    /// The guardrail that held it.
    pub by: Guardrail,
}

/// One round's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The plan every actuator takes.
    pub plan: SteeringPlan,
    /// One entry per change (and per re-measurement).
    pub journal: Vec<JournalEntry>,
    /// The memory for the next round.
    pub state: EngineState,
    /// How the round was decided.
    pub mode: Mode,
    /// Moves the guardrails held back entirely.
    pub held: Vec<Held>,
}

/// The cohort id a network steers under when carved out of its region: `as7922`, `de`,
/// `continent-eu`; `*` is the default cohort.
pub fn cohort_id_for(network: NetworkKey) -> CohortId {
    let s = match network {
        NetworkKey::Asn(a) => format!("as{a}"),
        NetworkKey::Country(c) => c.as_str().to_ascii_lowercase(),
        NetworkKey::Continent(c) => format!("continent-{}", c.code().to_ascii_lowercase()),
        NetworkKey::Global => "default".to_owned(),
    };
    // Built only from lowercase letters, digits and '-'.
    CohortId::new(&s).unwrap_or_else(|_| default_cohort_id())
}

fn default_cohort_id() -> CohortId {
    #[allow(clippy::expect_used)]
    CohortId::new("default").expect("a valid id")
}

struct Ctx<'a> {
    now: Timestamp,
    rum: &'a multicdn_core::policy::RumPolicy,
    steering: &'a SteeringPolicy,
    providers: Vec<ProviderId>,
    down: Vec<(ProviderId, Timestamp)>,
    floors: Vec<(ProviderId, u32)>,
    /// Configured standbys: no floor, no RUM moves towards them, failed over to only when
    /// every live provider is down.
    standby: Vec<ProviderId>,
    /// The policy's drills that are running this round, with their phase.
    drills: Vec<(&'a DrillSpec, Phase)>,
    /// Every drill's progress after this round.
    drill_progress: BTreeMap<CohortId, DrillProgress>,
}

impl Ctx<'_> {
    #[inline]
    fn is_down(&self, p: &ProviderId) -> bool {
        self.down.iter().any(|(d, _)| same(d, p))
    }

    #[inline]
    fn is_standby(&self, p: &ProviderId) -> bool {
        self.standby.iter().any(|s| same(s, p))
    }

    #[inline]
    fn floor(&self, p: &ProviderId) -> u32 {
        self.floors
            .iter()
            .find(|(q, _)| same(q, p))
            .map_or(0, |(_, f)| *f)
    }

    /// Cumulative share (bp) of a down provider's traffic that has left by now.
    fn failover_fraction(&self, since: Timestamp) -> u32 {
        let f = &self.steering.failover;
        let Some(last) = f.steps.last() else {
            return TOTAL_BP;
        };
        let interval = f.interval.get().as_millis().max(1);
        let idx = (self.now.since(since).as_millis() / interval) as usize;
        f.steps.get(idx).unwrap_or(last).bp().min(TOTAL_BP)
    }
}

/// One round of decisions (see the module documentation). Pure: same inputs, same decision.
pub fn decide(now: Timestamp, inputs: &Inputs<'_>) -> Decision {
    let policy = inputs.policy;
    let steering = &policy.steering;
    let static_plan = policy.static_plan();
    let providers = policy.provider_ids();
    let down: Vec<(ProviderId, Timestamp)> = providers
        .iter()
        .filter_map(|p| {
            inputs
                .health
                .get(p)
                .filter(|h| h.state == HealthState::Down)
                .map(|h| (p.clone(), h.since))
        })
        .collect();
    let mode = if steering.guardrails.static_mode {
        Some((
            Mode::Static,
            Rule::StaticMode,
            "the big red switch is on: static weights".to_owned(),
        ))
    } else if !providers.is_empty() && down.len() == providers.len() {
        Some((
            Mode::AllDown,
            Rule::AllProvidersDown,
            "every provider is down: static weights, never an empty answer".to_owned(),
        ))
    } else {
        match inputs.data_as_of {
            None => Some((
                Mode::Deadman,
                Rule::Deadman,
                "no measurements yet: static weights".to_owned(),
            )),
            Some(t) if now.since(t) > steering.guardrails.stale_after.get() => Some((
                Mode::Deadman,
                Rule::Deadman,
                format!(
                    "measurements from {t} are older than stale_after {}: static weights",
                    steering.guardrails.stale_after
                ),
            )),
            Some(_) => None,
        }
    };
    let mut drill_progress = inputs.state.drills.clone();
    if let Some((mode, rule, note)) = mode {
        // Static weights (or the fallback) end any drill in progress.
        for spec in &steering.drills {
            if let Some(p) = drill_progress.get_mut(&spec.name)
                && p.ended.is_none()
            {
                if p.aborted.is_none() {
                    p.aborted = Some(drill::Abort {
                        at: now,
                        region: None,
                        reason: note.clone(),
                    });
                }
                p.ended = Some(now);
            }
        }
        let (plan, rule, note) = match (mode, policy.fallback_plan()) {
            (Mode::AllDown, Some(plan)) => (
                plan,
                Rule::Fallback,
                format!(
                    "every provider is down: answering with the static fallback {}",
                    steering.fallback.as_ref().map_or("", |f| f.host.as_str())
                ),
            ),
            _ => (static_plan, rule, note),
        };
        let mut d = fallback(now, inputs, plan, mode, rule, note);
        d.state.drills = drill_progress;
        return d;
    }
    let floors = providers
        .iter()
        .map(|p| (p.clone(), policy.floor_of(p).bp()))
        .collect();
    let standby = providers
        .iter()
        .filter(|p| policy.is_standby(p))
        .cloned()
        .collect();
    // Drills: where each stands; one whose target is down is aborted here.
    let mut drills = Vec::new();
    for spec in &steering.drills {
        let progress = drill_progress.get(&spec.name);
        let mut ph = drill::phase(
            spec,
            &steering.failover,
            progress.and_then(|p| p.aborted.as_ref()),
            now,
        );
        if progress.is_some_and(|p| p.ended.is_some()) {
            continue;
        }
        if ph.is_running() && down.iter().any(|(d, _)| same(d, &spec.to)) {
            let p = drill_progress.entry(spec.name.clone()).or_default();
            if p.aborted.is_none() {
                p.aborted = Some(drill::Abort {
                    at: now,
                    region: None,
                    reason: format!("{} is down", spec.to),
                });
            }
            // The failover moves the target's traffic away; the drill returns at once.
            ph = Phase::Over;
        }
        match ph {
            Phase::Pending => {}
            Phase::Over => {
                if let Some(p) = drill_progress.get_mut(&spec.name)
                    && p.ended.is_none()
                {
                    p.ended = Some(now);
                }
            }
            _ => {
                let p = drill_progress.entry(spec.name.clone()).or_default();
                p.started.get_or_insert(now);
                if ph == Phase::Holding {
                    p.full.get_or_insert(now);
                }
                drills.push((spec, ph));
            }
        }
    }
    let ctx = Ctx {
        now,
        rum: &steering.rum,
        steering,
        providers,
        down,
        floors,
        standby,
        drills,
        drill_progress,
    };
    // Leaving the static fallback: a provider is healthy again. The providers' static weights
    // are the start, and the failover takes every provider still down out of them at once
    // (they have been down all along).
    let fallback_id = Fallback::id();
    let on_fallback = inputs
        .current
        .cohorts
        .iter()
        .any(|c| c.weights.get(&fallback_id) > 0);
    if on_fallback {
        let up: Vec<&ProviderId> = ctx.providers.iter().filter(|p| !ctx.is_down(p)).collect();
        let note = format!(
            "{} healthy again: the static fallback is left for the providers' static weights",
            up.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
        );
        let mut left = Vec::new();
        for c in &inputs.current.cohorts {
            let target = static_plan
                .cohort(&c.cohort)
                .map(|t| t.weights.clone())
                .or_else(|| {
                    inputs
                        .state
                        .parent(&c.cohort)
                        .and_then(|p| static_plan.cohort(p))
                        .map(|t| t.weights.clone())
                });
            if let Some(t) = target
                && t != c.weights
            {
                left.push(JournalEntry {
                    at: now,
                    cohort: c.cohort.clone(),
                    networks: c.networks.clone(),
                    before: c.weights.clone(),
                    after: t,
                    rule: Rule::FallbackLeft,
                    evidence: Evidence {
                        note: note.clone(),
                        ..Evidence::default()
                    },
                });
            }
        }
        let fresh = EngineState {
            drills: inputs.state.drills.clone(),
            ..EngineState::default()
        };
        let restarted = Inputs {
            current: &static_plan,
            state: &fresh,
            ..*inputs
        };
        let mut d = steer(&ctx, &restarted, &static_plan);
        left.append(&mut d.journal);
        d.journal = left;
        return d;
    }
    steer(&ctx, inputs, &static_plan)
}

/// Static weights for every region; finer cohorts fold back into their regions.
fn fallback(
    now: Timestamp,
    inputs: &Inputs<'_>,
    static_plan: SteeringPlan,
    mode: Mode,
    rule: Rule,
    note: String,
) -> Decision {
    let statics: HashMap<&CohortId, &CohortPlan> =
        static_plan.cohorts.iter().map(|c| (&c.cohort, c)).collect();
    let default = static_plan
        .cohorts
        .iter()
        .find(|c| c.networks.contains(&NetworkKey::Global));
    let mut journal = Vec::new();
    let parents: IdMap<'_, &CohortId> = inputs.state.parents().collect();
    for c in &inputs.current.cohorts {
        let target = statics.get(&c.cohort).copied().or_else(|| {
            parents
                .get(&c.cohort)
                .and_then(|p| statics.get(p).copied())
                .or(default)
        });
        if let Some(t) = target
            && t.weights != c.weights
        {
            journal.push(JournalEntry {
                at: now,
                cohort: c.cohort.clone(),
                networks: c.networks.clone(),
                before: c.weights.clone(),
                after: t.weights.clone(),
                rule,
                evidence: Evidence {
                    note: note.clone(),
                    ..Evidence::default()
                },
            });
        }
    }
    let mut state = inputs.state.clone();
    state.cohorts.update_all(|m| {
        // A fallback ends any failover bookkeeping: the static weights are the new start.
        m.before_failover = None;
        m.recovering_to = None;
        m.before_drill = None;
    });
    state.prune(now);
    Decision {
        plan: static_plan,
        journal,
        state,
        mode,
        held: Vec::new(),
    }
}

/// One cohort of the round, borrowed from the inputs. Its weights are taken (a reference count)
/// when the rules first read them, so that the moves and the plan never go back to the weights
/// in force: at a hundred thousand cohorts, every return trip to scattered memory shows.
struct Work<'a> {
    id: &'a CohortId,
    networks: &'a Networks,
    input: Option<&'a CohortInput>,
    share: f64,
    w: Cow<'a, Weights>,
    region: bool,
    /// Its memory from the last round, until this round changes it (`own`).
    old: &'a CohortMemory,
    /// The same, shared: what the next round gets when this one leaves it as it was.
    kept: Option<&'a Arc<CohortMemory>>,
    own: Option<Box<CohortMemory>>,
    /// The region it falls back to (written into its memory with the plan).
    parent: Option<&'a CohortId>,
    moved: bool,
    /// Its weights (after any failover step) were under a floor when the round looked.
    unfloored: bool,
}

impl Work<'_> {
    #[inline]
    fn mem(&self) -> &CohortMemory {
        self.own.as_deref().unwrap_or(self.old)
    }

    #[inline]
    fn mem_mut(&mut self) -> &mut CohortMemory {
        let old = self.old;
        self.own.get_or_insert_with(|| Box::new(old.clone()))
    }
}

/// Where an optimizing rule wants a cohort.
enum Goal<'a> {
    /// A split (pins, recovery).
    Weights(Weights),
    /// A RUM step: `bp` from `from` to `to`, and the split after the whole step (made while
    /// the cohort's weights are at hand; made again only when a guardrail cuts the step short).
    Shift {
        from: &'a ProviderId,
        to: &'a ProviderId,
        bp: u32,
        after: Weights,
    },
}

/// The numbers behind a RUM move.
#[derive(Clone, Copy)]
struct RumFacts {
    gap: f64,
    relative: f64,
    need_ms: f64,
    need_rel: f64,
    switching_back: bool,
}

struct Proposal<'a> {
    work: usize,
    goal: Goal<'a>,
    /// What the rule saw (the journal entry's evidence, if the move is made).
    evidence: Evidence,
    rule: Rule,
    priority: u8,
    gap: f64,
}

/// What the guardrails read of a proposal: small, so that ordering them is cheap.
struct Ranked {
    priority: u8,
    gap: f64,
    work: usize,
    proposal: usize,
    wanted: u32,
    cohort_left: u32,
    share: f64,
}

/// A move the guardrails let through.
struct Accepted {
    proposal: usize,
    /// Basis points allowed.
    allowed: u32,
    /// The guardrail that cut it short.
    by: Option<Guardrail>,
    /// The split after it, for pins and recovery.
    after: Option<Weights>,
}

type IdMap<'a, V> = HashMap<&'a CohortId, V, BuildHasherDefault<IdHasher>>;

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

/// The same cohort: the same shared string (ids cloned from one another), or equal text.
#[inline]
fn same_cohort(a: &CohortId, b: &CohortId) -> bool {
    std::ptr::eq(a.as_str(), b.as_str()) || a == b
}

/// The granularity of optimizing moves, in basis points (0.5%): a move a guardrail cuts short
/// is rounded down to whole steps, and RUM never moves less than one step.
pub const MOVE_STEP_BP: u32 = 50;

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
fn memory_of(
    entry: Option<&state::Entry>,
    now: Timestamp,
) -> (
    &CohortMemory,
    Option<&Arc<CohortMemory>>,
    Option<Box<CohortMemory>>,
) {
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

fn steer(ctx: &Ctx<'_>, inputs: &Inputs<'_>, static_plan: &SteeringPlan) -> Decision {
    let now = ctx.now;
    let old = inputs.state;
    // Compared on every cohort: a first-byte check spares most string comparisons.
    let region_of = |id: &CohortId| {
        let first = id.as_str().as_bytes().first();
        static_plan
            .cohorts
            .iter()
            .position(|c| c.cohort.as_str().as_bytes().first() == first && &c.cohort == id)
    };
    let default_id = static_plan
        .cohorts
        .iter()
        .find(|c| c.networks.contains(&NetworkKey::Global))
        .map(|c| c.cohort.clone())
        .unwrap_or_else(default_cohort_id);
    let pins: Vec<&Pin> = ctx.steering.pins.iter().filter(|p| now < p.until).collect();
    let pin_ids: Vec<CohortId> = pins.iter().map(|p| cohort_id_for(p.network)).collect();
    let pin_networks: Vec<Networks> = pins.iter().map(|p| Networks::one(p.network)).collect();
    let mut current: IdMap<'_, &CohortPlan> = IdMap::default();
    for c in &inputs.current.cohorts {
        // Only regions: finer cohorts in force are found through `index` below.
        if region_of(&c.cohort).is_some() {
            current.insert(&c.cohort, c);
        }
    }
    let memory_of = |entry| memory_of(entry, now);

    // The cohorts of this round: finer ones first (those in force, in plan order, then new
    // ones in input order, then pinned networks), then the regions in policy order.
    let mut work: Vec<Work<'_>> =
        Vec::with_capacity(inputs.cohorts.len() + inputs.current.cohorts.len());
    let mut lookup = state::Lookup::new(&old.cohorts);
    let region_count = static_plan.cohorts.len();
    // The finer cohorts in force, found again by the hash of their id (sorted, so that no
    // table is built for the common case: inputs in plan order).
    let mut hashes: Vec<(u64, usize)> = Vec::with_capacity(inputs.current.cohorts.len());
    for c in &inputs.current.cohorts {
        if region_of(&c.cohort).is_none() {
            hashes.push((id_hash(&c.cohort), work.len()));
            let entry = lookup.get(&c.cohort);
            let (old, kept, own) = memory_of(entry);
            work.push(Work {
                id: &c.cohort,
                networks: &c.networks,
                input: None,
                share: 0.0,
                w: Cow::Borrowed(&c.weights),
                region: false,
                parent: entry.and_then(|e| e.parent.as_ref()),
                old,
                kept,
                own,
                moved: false,
                unfloored: false,
            });
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
    let mut region_inputs: Vec<Option<&CohortInput>> = vec![None; region_count];
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
            if let Some(r) = region_of(&i.cohort) {
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
                    let parent = i.parent.as_ref().unwrap_or(&default_id);
                    let Some(start) = current
                        .get(parent)
                        .map(|c| &c.weights)
                        .or_else(|| region_of(parent).map(|r| &static_plan.cohorts[r].weights))
                    else {
                        continue;
                    };
                    index.insert(&i.cohort, work.len());
                    let (old, kept, own) = memory_of(lookup.get(&i.cohort));
                    work.push(Work {
                        id: &i.cohort,
                        networks: &i.networks,
                        input: None,
                        share: 0.0,
                        w: Cow::Borrowed(start),
                        region: false,
                        old,
                        kept,
                        own,
                        parent: None,
                        moved: false,
                        unfloored: false,
                    });
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
    for ((pin, id), networks) in pins.iter().zip(&pin_ids).zip(&pin_networks) {
        let exact = static_plan
            .cohorts
            .iter()
            .any(|c| c.networks == [pin.network])
            || work.iter().any(|w| *w.networks == [pin.network]);
        if !exact {
            let parent = static_plan
                .cohorts
                .iter()
                .find(|c| c.networks.contains(&pin.network))
                .map_or(&default_id, |c| &c.cohort);
            let start = current
                .get(parent)
                .map(|c| &c.weights)
                .or_else(|| region_of(parent).map(|r| &static_plan.cohorts[r].weights));
            if let Some(start) = start {
                let (old, kept, own) = memory_of(lookup.get(id));
                work.push(Work {
                    id,
                    networks,
                    input: None,
                    share: 0.0,
                    w: Cow::Borrowed(start),
                    region: false,
                    old,
                    kept,
                    own,
                    parent: Some(parent),
                    moved: false,
                    unfloored: false,
                });
            }
        }
    }
    for (r, c) in static_plan.cohorts.iter().enumerate() {
        let w = current
            .get(&c.cohort)
            .map_or(&c.weights, |cur| &cur.weights);
        let input = region_inputs[r];
        let entry = lookup.get(&c.cohort);
        let (old, kept, own) = memory_of(entry);
        work.push(Work {
            id: &c.cohort,
            networks: &c.networks,
            input,
            share: input.map_or(0.0, |i| i.share),
            w: Cow::Borrowed(w),
            region: true,
            parent: entry.and_then(|e| e.parent.as_ref()),
            old,
            kept,
            own,
            moved: false,
            unfloored: false,
        });
    }

    let g = &ctx.steering.guardrails;
    let mut journal: Vec<JournalEntry> = Vec::new();
    let mut proposals: Vec<Proposal<'_>> = Vec::new();
    let mut ranked: Vec<Ranked> = Vec::new();
    for (wi, item) in work.iter_mut().enumerate() {
        // 1. Health failover.
        health(ctx, item, &mut journal);
        // The weights are read here anyway: hold them now, so that the later passes (the
        // moves, the plan) never go back to the weights in force.
        if let Cow::Borrowed(w) = item.w {
            item.w = Cow::Owned(w.clone());
        }
        // An announced drill, or the return from one: no other optimizing rule, no floors.
        if drill_step(ctx, old, item, &mut journal) {
            item.unfloored = false;
            continue;
        }
        // Floors are checked here, while the weights are at hand; a move is checked again
        // after it is made.
        item.unfloored = !meets_floors(ctx, &item.w);
        let settling = item
            .mem()
            .last_move
            .as_ref()
            .is_some_and(|m| now.since(m.at) < ctx.rum.settle.get());
        // 2. Pins.
        let pin = if pins.is_empty() {
            None
        } else {
            pins.iter().find(|p| *item.networks == [p.network])
        };
        let proposal = if let Some(pin) = pin {
            pin.weights().ok().and_then(|pw| {
                let target = floored(ctx, &respect_down(ctx, &pw, &item.w));
                (target != *item.w).then(|| Proposal {
                    work: wi,
                    goal: Goal::Weights(target),
                    evidence: Evidence {
                        note: format!("pinned until {}: {}", pin.until, pin.reason),
                        ..evidence_of(item.input)
                    },
                    rule: Rule::Pin,
                    priority: 0,
                    gap: 0.0,
                })
            })
        } else if let Some(goal) = item
            .mem()
            .recovering_to
            .as_ref()
            .filter(|_| ctx.down.is_empty())
        {
            let goal_floored = floored(ctx, goal);
            // Recovery follows the cohort's own evidence: it never walks traffic towards a
            // provider the cohort's scores show slower beyond the gap (RUM decides from here).
            let against_rum = goal_floored
                .iter()
                .any(|(p, bp)| bp > share_of(&item.w, p) && shown_slower(ctx, item.input, p));
            if *item.w == goal_floored || against_rum {
                item.mem_mut().recovering_to = None;
                None
            } else if settling {
                None
            } else {
                let target = floored(
                    ctx,
                    &step_towards(&item.w, &goal_floored, ctx.rum.step.bp()),
                );
                (target != *item.w).then(|| Proposal {
                    work: wi,
                    goal: Goal::Weights(target),
                    evidence: Evidence {
                        note: format!("every provider is up: back towards {goal}"),
                        ..evidence_of(item.input)
                    },
                    rule: Rule::Recovery,
                    priority: 1,
                    gap: 0.0,
                })
            }
        } else if ctx.rum.enabled && !settling {
            item.input.and_then(|input| {
                rum(ctx, &item.w, input, item.mem().last_move.as_ref()).map(
                    |(from, to, bp, facts)| Proposal {
                        work: wi,
                        goal: Goal::Shift {
                            from,
                            to,
                            bp,
                            after: item.w.shift(from, to, bp).0,
                        },
                        evidence: Evidence {
                            gap_ms: Some(rounded(facts.gap, 1e3)),
                            gap_relative: Some(rounded(facts.relative, 1e6)),
                            required_ms: Some(rounded(facts.need_ms, 1e3)),
                            required_relative: Some(rounded(facts.need_rel, 1e6)),
                            switching_back: facts.switching_back,
                            ..evidence_of(Some(input))
                        },
                        rule: Rule::Rum,
                        priority: 2,
                        gap: facts.relative,
                    },
                )
            })
        } else {
            None
        };
        if let Some(p) = proposal {
            let wanted = match &p.goal {
                // `bp` never exceeds what `from` has above its floor.
                Goal::Shift { bp, .. } => *bp,
                Goal::Weights(target) => moved_between(&item.w, target),
            };
            ranked.push(Ranked {
                priority: p.priority,
                gap: p.gap,
                work: wi,
                proposal: proposals.len(),
                wanted,
                // Recovery answers health: its own budget, not the optimisation's.
                cohort_left: if p.rule == Rule::Recovery {
                    g.max_change_per_cohort
                        .bp()
                        .saturating_sub(item.mem().recovered_last_hour(now))
                } else {
                    g.max_change_per_cohort
                        .bp()
                        .saturating_sub(item.mem().moved_last_hour(now))
                },
                share: item.share,
            });
            proposals.push(p);
        }
    }

    // 7. Guardrails: pins first, then recovery, then the largest relative gaps. The caps are
    // settled in that order on the small `Ranked` records; the moves are then made, and
    // journaled, in cohort order (the plan's order, in which the cohorts' data lies in memory).
    ranked.sort_unstable_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.gap.total_cmp(&a.gap))
            .then(a.work.cmp(&b.work))
    });
    let mut recent: std::collections::VecDeque<(Timestamp, f64)> = old
        .recent
        .iter()
        .filter(|(at, _)| now.since(*at) < state::HOUR)
        .copied()
        .collect();
    let mut total_left = (f64::from(g.max_moved_per_hour.bp())
        - recent.iter().map(|(_, m)| m).sum::<f64>())
    .max(0.0);
    let mut recent_recovery: std::collections::VecDeque<(Timestamp, f64)> = old
        .recent_recovery
        .iter()
        .filter(|(at, _)| now.since(*at) < state::HOUR)
        .copied()
        .collect();
    let mut recovery_left = (f64::from(g.max_moved_per_hour.bp())
        - recent_recovery.iter().map(|(_, m)| m).sum::<f64>())
    .max(0.0);
    let mut held = Vec::new();
    recent.reserve(ranked.len());
    let mut accepted: Vec<Accepted> = Vec::with_capacity(ranked.len());
    for r in &ranked {
        let wanted = r.wanted;
        let mut allowed = wanted.min(r.cohort_left);
        let mut by = (allowed < wanted).then_some(Guardrail::CohortCap);
        let recovery = proposals[r.proposal].rule == Rule::Recovery;
        let left = if recovery { recovery_left } else { total_left };
        if r.share > 0.0 {
            let by_total = (left / r.share).floor();
            if by_total < f64::from(allowed) {
                allowed = by_total.max(0.0) as u32;
                by = Some(Guardrail::HourlyCap);
            }
        }
        if by.is_some() {
            // Cut short: whole steps only, never a crumb.
            allowed -= allowed % MOVE_STEP_BP;
        }
        let p = &proposals[r.proposal];
        if allowed == 0 {
            held.push(Held {
                cohort: work[r.work].id.clone(),
                rule: p.rule,
                wanted_bp: wanted,
                by: by.unwrap_or(Guardrail::CohortCap),
            });
            continue;
        }
        let (moved, after) = match &p.goal {
            // A shift within what `from` has: all of `allowed` moves.
            Goal::Shift { .. } => (allowed, None),
            Goal::Weights(target) => {
                let w = &work[r.work].w;
                let after = step_towards(w, target, allowed);
                (moved_between(w, &after), Some(after))
            }
        };
        if moved == 0 {
            continue;
        }
        let weighted = f64::from(moved) * r.share;
        if recovery {
            recovery_left = (recovery_left - weighted).max(0.0);
            if weighted > 0.0 {
                recent_recovery.push_back((now, weighted));
            }
        } else {
            total_left = (total_left - weighted).max(0.0);
            if weighted > 0.0 {
                recent.push_back((now, weighted));
            }
        }
        accepted.push(Accepted {
            proposal: r.proposal,
            allowed,
            by,
            after,
        });
    }
    drop(ranked);
    accepted.sort_unstable_by_key(|a| a.proposal);
    journal.reserve(accepted.len());
    let mut accepted = accepted.into_iter().peekable();
    for (pi, p) in proposals.into_iter().enumerate() {
        let Some(Accepted {
            allowed, by, after, ..
        }) = accepted.next_if(|a| a.proposal == pi)
        else {
            continue;
        };
        let item = &mut work[p.work];
        let mut evidence = p.evidence;
        let (after, moved, direction) = match p.goal {
            Goal::Shift {
                from,
                to,
                bp,
                after: whole,
            } => {
                // `bp` never exceeds what `from` has: the whole step moves all of it.
                let (after, moved) = if allowed == bp {
                    (whole, bp)
                } else {
                    item.w.shift(from, to, allowed)
                };
                (after, moved, Some((from.clone(), to.clone())))
            }
            Goal::Weights(target) => {
                let after = after.unwrap_or_else(|| step_towards(&item.w, &target, allowed));
                let moved = moved_between(&item.w, &after);
                (after, moved, None)
            }
        };
        evidence.capped_by = by;
        let before = std::mem::replace(&mut item.w, Cow::Owned(after.clone())).into_owned();
        let entry = JournalEntry {
            at: now,
            cohort: item.id.clone(),
            networks: item.networks.clone(),
            before,
            after,
            rule: p.rule,
            evidence,
        };
        let mem = item.mem_mut();
        if let Some((from, to)) = direction.or_else(|| entry.direction()) {
            mem.last_move = Some(LastMove { at: now, from, to });
        }
        mem.remeasure_due = true;
        if p.rule == Rule::Recovery {
            mem.recent_recovery.push((now, moved));
        } else {
            mem.recent.push((now, moved));
        }
        journal.push(entry);
        item.moved = true;
    }

    // 6. Floors that the weights in force did not meet (after a recovery, a hand edit).
    for item in &mut work {
        if (item.unfloored || item.moved) && !meets_floors(ctx, &item.w) {
            let fixed = floored(ctx, &item.w);
            journal.push(JournalEntry {
                at: now,
                cohort: item.id.clone(),
                networks: item.networks.clone(),
                before: item.w.as_ref().clone(),
                after: fixed.clone(),
                rule: Rule::Floor,
                evidence: Evidence {
                    note: "a healthy provider was under its floor (measurement or commit)"
                        .to_owned(),
                    ..evidence_of(item.input)
                },
            });
            item.w = Cow::Owned(fixed);
        }
        // Settled after a move: measure again, for the realized-improvement figure.
        if item.mem().remeasure_due
            && !item.moved
            && item
                .mem()
                .last_move
                .as_ref()
                .is_none_or(|m| now.since(m.at) >= ctx.rum.settle.get())
            && let Some(input) = item.input
        {
            item.mem_mut().remeasure_due = false;
            journal.push(JournalEntry {
                at: now,
                cohort: item.id.clone(),
                networks: item.networks.clone(),
                before: item.w.as_ref().clone(),
                after: item.w.as_ref().clone(),
                rule: Rule::Remeasured,
                evidence: Evidence {
                    note: "settled after the last move; measured again".to_owned(),
                    ..evidence_of(Some(input))
                },
            });
        }
    }

    // Finer cohorts that no longer differ from their region and carry no data are retired.
    let region_w: Vec<Weights> = work[work.len() - region_count..]
        .iter()
        .map(|i| i.w.as_ref().clone())
        .collect();
    let mut cohorts = Vec::with_capacity(work.len());
    let mut memory = state::CohortMemories::with_capacity(work.len());
    for item in work {
        if !item.region && item.input.is_none() {
            let parent_w = item.parent.and_then(&region_of).map(|r| &region_w[r]);
            let busy = item.mem().before_failover.is_some() || item.mem().recovering_to.is_some();
            let pinned = pins.iter().any(|p| *item.networks == [p.network]);
            if !busy && !pinned && parent_w == Some(item.w.as_ref()) {
                continue;
            }
        }
        // Finer cohorts keep their parent region, for the rounds their data is missing; a
        // memory this round left as it was is shared, not copied.
        let idle = item.mem().is_idle();
        let parent = item.parent.filter(|_| !idle || !item.region).cloned();
        if !idle || parent.is_some() {
            let kept = if idle {
                None
            } else {
                Some(match (item.own, item.kept) {
                    (Some(own), _) => Arc::new(*own),
                    (None, Some(kept)) => Arc::clone(kept),
                    (None, None) => Arc::new(item.old.clone()),
                })
            };
            memory.push(state::Entry {
                id: item.id.clone(),
                parent,
                memory: kept,
            });
        }
        cohorts.push(CohortPlan {
            cohort: item.id.clone(),
            networks: item.networks.clone(),
            weights: item.w.into_owned(),
        });
    }
    Decision {
        plan: SteeringPlan {
            record: static_plan.record.clone(),
            ttl: static_plan.ttl,
            cohorts,
        },
        journal,
        state: EngineState {
            cohorts: memory,
            recent,
            recent_recovery,
            drills: ctx.drill_progress.clone(),
        },
        mode: Mode::Steering,
        held,
    }
}

/// The gaps cited as evidence are rounded (to microseconds, to millionths), as the inputs' scores
/// are, so that the journal reads as people write numbers.
fn rounded(x: f64, scale: f64) -> f64 {
    (x * scale).round() / scale
}

fn evidence_of(input: Option<&CohortInput>) -> Evidence {
    let Some(input) = input else {
        return Evidence::default();
    };
    Evidence {
        network: input.cut,
        providers: Arc::clone(&input.evidence),
        ..Evidence::default()
    }
}

/// Rule 1: moves a down provider's traffic away in the policy's steps.
fn health(ctx: &Ctx<'_>, item: &mut Work<'_>, journal: &mut Vec<JournalEntry>) {
    if item.mem().before_failover.is_none() && ctx.down.is_empty() {
        return;
    }
    let affected = ctx.down.iter().any(|(d, _)| {
        item.w.get(d) > 0
            || item
                .mem()
                .before_failover
                .as_ref()
                .is_some_and(|b| b.get(d) > 0)
    });
    if !affected {
        if ctx.down.is_empty() {
            let mem = item.mem_mut();
            if let Some(before) = mem.before_failover.take() {
                mem.recovering_to = Some(before);
            }
        }
        return;
    }
    // The memory changes only when the failover begins here, or interrupts a recovery: most
    // rounds of a failover in progress read it and leave it as it was.
    let base = match &item.mem().before_failover {
        Some(base) if item.mem().recovering_to.is_none() => base.clone(),
        _ => {
            let start = item.w.as_ref().clone();
            let mem = item.mem_mut();
            mem.recovering_to = None;
            mem.before_failover.get_or_insert(start).clone()
        }
    };
    let mut w = item.w.as_ref().clone();
    let mut notes = Vec::new();
    for (d, since) in &ctx.down {
        let frac = ctx.failover_fraction(*since);
        let allowed =
            (u64::from(base.get(d)) * u64::from(TOTAL_BP - frac) / u64::from(TOTAL_BP)) as u32;
        let have = w.get(d);
        if have > allowed {
            w = spread(ctx, &w, d, have - allowed);
            notes.push(format!(
                "{d} down since {since}: {}% of its share moved",
                frac / 100
            ));
        }
    }
    if w != *item.w {
        journal.push(JournalEntry {
            at: ctx.now,
            cohort: item.id.clone(),
            networks: item.networks.clone(),
            before: item.w.as_ref().clone(),
            after: w.clone(),
            rule: Rule::Failover,
            evidence: Evidence {
                note: notes.join("; "),
                ..Evidence::default()
            },
        });
        item.w = Cow::Owned(w);
    }
}

/// A drill's step for one cohort: its weights when the drill began with the drill's level of
/// every other provider's share moved to the target, or, once the drill is over, those weights
/// again. True when a drill holds the cohort this round.
fn drill_step(
    ctx: &Ctx<'_>,
    old: &EngineState,
    item: &mut Work<'_>,
    journal: &mut Vec<JournalEntry>,
) -> bool {
    let active = ctx
        .drills
        .iter()
        .find(|(spec, _)| drill::covers(spec, item.id, item.parent));
    let Some((spec, phase)) = active else {
        let Some((name, base)) = item.mem().before_drill.clone() else {
            return false;
        };
        item.mem_mut().before_drill = None;
        let target = floored(ctx, &respect_down(ctx, &base, &item.w));
        drill_move(ctx, item, target, journal, || {
            format!("drill {name} over: back to {base}")
        });
        return true;
    };
    let base = match &item.mem().before_drill {
        Some((name, w)) if name == &spec.name => w.clone(),
        _ => {
            // A network carved out of its region while the drill runs inherited the drilled
            // weights: its own weights before the drill are its region's.
            let parents = item
                .parent
                .and_then(|p| old.cohorts.get(p))
                .and_then(|m| m.before_drill.as_ref())
                .filter(|(name, _)| name == &spec.name);
            let w = parents.map_or_else(|| item.w.as_ref().clone(), |(_, w)| w.clone());
            item.mem_mut().before_drill = Some((spec.name.clone(), w.clone()));
            w
        }
    };
    let fraction = u64::from(spec.share.bp()) * u64::from(phase.level()) / u64::from(TOTAL_BP);
    let mut target = base.clone();
    for (p, bp) in base.iter() {
        if !same(p, &spec.to) {
            let moved = (u64::from(bp) * fraction / u64::from(TOTAL_BP)) as u32;
            target = target.shift(p, &spec.to, moved).0;
        }
    }
    let target = respect_down(ctx, &target, &item.w);
    let what = match phase {
        Phase::Returning { .. }
            if ctx
                .drill_progress
                .get(&spec.name)
                .is_some_and(|p| p.aborted.is_some()) =>
        {
            "aborted, returning"
        }
        Phase::Returning { .. } => "returning",
        Phase::Holding => "holding",
        _ => "shifting",
    };
    let on_target = f64::from(target.get(&spec.to)) / 100.0;
    drill_move(ctx, item, target, journal, || {
        format!(
            "drill {} {what}: {on_target:.1}% of traffic on {} (from {base})",
            spec.name, spec.to
        )
    });
    true
}

/// Puts a cohort on a drill's `target` weights, journaled as the drill's, when they differ.
fn drill_move(
    ctx: &Ctx<'_>,
    item: &mut Work<'_>,
    target: Weights,
    journal: &mut Vec<JournalEntry>,
    note: impl FnOnce() -> String,
) {
    if target == *item.w {
        return;
    }
    journal.push(JournalEntry {
        at: ctx.now,
        cohort: item.id.clone(),
        networks: item.networks.clone(),
        before: item.w.as_ref().clone(),
        after: target.clone(),
        rule: Rule::Drill,
        evidence: Evidence {
            note: note(),
            ..evidence_of(item.input)
        },
    });
    item.w = Cow::Owned(target);
}

/// Moves `amount` from `from` to the healthy providers, in proportion to their weights (evenly
/// when they have none).
fn spread(ctx: &Ctx<'_>, w: &Weights, from: &ProviderId, amount: u32) -> Weights {
    let mut healthy: Vec<&ProviderId> = ctx
        .providers
        .iter()
        .filter(|p| !ctx.is_down(p) && !ctx.is_standby(p))
        .collect();
    if healthy.is_empty() {
        // Every live provider is down: the configured standby takes the traffic.
        healthy = ctx.providers.iter().filter(|p| !ctx.is_down(p)).collect();
    }
    if healthy.is_empty() {
        return w.clone();
    }
    let mut parts: Vec<u32> = healthy.iter().map(|p| w.get(p)).collect();
    if parts.iter().all(|x| *x == 0) {
        parts = vec![1; healthy.len()];
    }
    let split = largest_remainder(&parts, amount);
    let mut out = w.clone();
    for (p, bp) in healthy.into_iter().zip(split) {
        out = out.shift(from, p, bp).0;
    }
    out
}

/// A pin's split, except that a down provider never gets more than it has now.
fn respect_down(ctx: &Ctx<'_>, target: &Weights, now: &Weights) -> Weights {
    let mut out = target.clone();
    for (d, _) in &ctx.down {
        let have = now.get(d);
        let want = out.get(d);
        if want > have {
            out = spread(ctx, &out, d, want - have);
        }
    }
    out
}

/// Raises every healthy provider under its floor, taking from the providers with the most
/// room above theirs (down providers last).
fn floored(ctx: &Ctx<'_>, w: &Weights) -> Weights {
    if meets_floors(ctx, w) {
        return w.clone();
    }
    let mut out = w.clone();
    for p in &ctx.providers {
        if ctx.is_down(p) {
            continue;
        }
        let floor = ctx.floor(p);
        let mut need = floor.saturating_sub(out.get(p));
        while need > 0 {
            // The donor with the most room: healthy providers above their floors, then down ones.
            let donor = ctx
                .providers
                .iter()
                .filter(|q| *q != p)
                .map(|q| {
                    let room = if ctx.is_down(q) {
                        0
                    } else {
                        out.get(q).saturating_sub(ctx.floor(q))
                    };
                    (q, room)
                })
                .filter(|(_, room)| *room > 0)
                .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
                .map(|(q, room)| (q.clone(), room))
                .or_else(|| {
                    ctx.providers
                        .iter()
                        .filter(|q| *q != p && ctx.is_down(q) && out.get(q) > 0)
                        .map(|q| (q.clone(), out.get(q)))
                        .next()
                });
            let Some((q, room)) = donor else { break };
            let (next, moved) = out.shift(&q, p, need.min(room));
            if moved == 0 {
                break;
            }
            out = next;
            need -= moved;
        }
    }
    out
}

/// The same provider: the same shared string (the common case, ids cloned from the policy),
/// or equal text.
#[inline]
fn same(a: &ProviderId, b: &ProviderId) -> bool {
    std::ptr::eq(a.as_str(), b.as_str()) || a == b
}

#[inline]
fn share_of(w: &Weights, p: &ProviderId) -> u32 {
    w.iter().find(|(q, _)| same(q, p)).map_or(0, |(_, bp)| bp)
}

/// True when every healthy provider is at or above its floor.
#[inline]
fn meets_floors(ctx: &Ctx<'_>, w: &Weights) -> bool {
    // Usually the weights list exactly the policy's providers, in the same (sorted) order.
    if w.len() == ctx.floors.len()
        && w.iter()
            .zip(&ctx.floors)
            .all(|((p, _), (q, _))| std::ptr::eq(p.as_str(), q.as_str()))
    {
        return w
            .iter()
            .zip(&ctx.floors)
            .all(|((p, bp), (_, floor))| bp >= *floor || ctx.is_down(p));
    }
    ctx.floors
        .iter()
        .all(|(p, floor)| share_of(w, p) >= *floor || ctx.is_down(p))
}

/// Moves up to `budget` basis points from `from` towards `to`: each step from the provider
/// furthest above its target to the one furthest below (ties to the first by id).
fn step_towards(from: &Weights, to: &Weights, budget: u32) -> Weights {
    let mut ids: Vec<&ProviderId> = from.providers().collect();
    let mut extra = false;
    for p in to.providers() {
        if !ids.iter().any(|q| same(q, p)) {
            ids.push(p);
            extra = true;
        }
    }
    if extra {
        ids.sort();
    }
    let mut cur: Vec<i64> = ids.iter().map(|p| i64::from(share_of(from, p))).collect();
    let goal: Vec<i64> = ids.iter().map(|p| i64::from(share_of(to, p))).collect();
    let mut left = i64::from(budget);
    while left > 0 {
        let (mut over, mut under) = (None::<usize>, None::<usize>);
        for i in 0..ids.len() {
            let d = cur[i] - goal[i];
            if d > 0 && over.is_none_or(|o| d > cur[o] - goal[o]) {
                over = Some(i);
            }
            if d < 0 && under.is_none_or(|u| d < cur[u] - goal[u]) {
                under = Some(i);
            }
        }
        let (Some(o), Some(u)) = (over, under) else {
            break;
        };
        let amount = (cur[o] - goal[o]).min(goal[u] - cur[u]).min(left);
        cur[o] -= amount;
        cur[u] += amount;
        left -= amount;
    }
    Weights::new(
        ids.into_iter().cloned().zip(
            cur.into_iter()
                .map(|x| x.clamp(0, i64::from(TOTAL_BP)) as u32),
        ),
    )
    .unwrap_or_else(|_| from.clone())
}

/// Basis points that move between two splits (half the sum of absolute differences).
fn moved_between(a: &Weights, b: &Weights) -> u32 {
    let mut total = 0u32;
    for (p, x) in a.iter() {
        total += x.abs_diff(share_of(b, p));
    }
    for (p, y) in b.iter() {
        if !a.providers().any(|q| same(q, p)) {
            total += y;
        }
    }
    total / 2
}

/// A cohort's scored providers: `(provider, score, stderr)`, only those with at least
/// `min_samples`, up, and in the policy; slowest first.
fn scored<'i>(
    ctx: &Ctx<'_>,
    input: &'i CohortInput,
    slots: &mut [(Option<&'i ProviderId>, f64, f64); 8],
) -> usize {
    let rum = ctx.rum;
    let mut n = 0;
    for e in input.evidence.iter() {
        if n == slots.len() {
            break;
        }
        if e.samples >= rum.min_samples
            && !ctx.is_down(&e.provider)
            && !ctx.is_standby(&e.provider)
            && let Some(s) = e.score.filter(|s| s.is_finite() && *s >= 0.0)
            && ctx.providers.iter().any(|p| same(p, &e.provider))
        {
            slots[n] = (Some(&e.provider), s, e.stderr.unwrap_or(0.0));
            n += 1;
        }
    }
    slots[..n].sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    n
}

/// The gap `slow` must have over `best` to be significant: the policy's fixed gaps (times
/// `factor` for hysteresis) and [`SIGNIFICANCE_Z`] standard errors of the difference.
/// Returns `(gap, relative, need_ms, need_rel, significant)`.
fn significance(
    ctx: &Ctx<'_>,
    slow: (f64, f64),
    best: (f64, f64),
    factor: f64,
) -> (f64, f64, f64, f64, bool) {
    let rum = ctx.rum;
    let gap = slow.0 - best.0;
    let relative = if slow.0 > 0.0 { gap / slow.0 } else { 0.0 };
    let noise = SIGNIFICANCE_Z * (slow.1 * slow.1 + best.1 * best.1).sqrt();
    let need_ms = (rum.absolute_gap.get().as_secs_f64() * 1000.0 * factor).max(noise);
    let need_rel = rum.relative_gap.fraction() * factor;
    (
        gap,
        relative,
        need_ms,
        need_rel,
        gap > need_ms && relative > need_rel,
    )
}

/// True when the cohort's own evidence shows `p` slower than its fastest provider beyond the
/// significance gap (recovery never walks traffic towards such a provider).
fn shown_slower(ctx: &Ctx<'_>, input: Option<&CohortInput>, p: &ProviderId) -> bool {
    let Some(input) = input else { return false };
    let mut slots: [(Option<&ProviderId>, f64, f64); 8] = [(None, 0.0, 0.0); 8];
    let n = scored(ctx, input, &mut slots);
    if n < 2 {
        return false;
    }
    let (Some(best), best_score, best_se) = slots[n - 1] else {
        return false;
    };
    if same(best, p) {
        return false;
    }
    slots[..n - 1].iter().any(|&(q, score, se)| {
        q.is_some_and(|q| same(q, p))
            && significance(ctx, (score, se), (best_score, best_se), 1.0).4
    })
}

/// Rules 3–5: significance, hysteresis and damping.
fn rum<'i>(
    ctx: &Ctx<'_>,
    w: &Weights,
    input: &'i CohortInput,
    last: Option<&LastMove>,
) -> Option<(&'i ProviderId, &'i ProviderId, u32, RumFacts)> {
    let rum = ctx.rum;
    let mut slots: [(Option<&'i ProviderId>, f64, f64); 8] = [(None, 0.0, 0.0); 8];
    let n = scored(ctx, input, &mut slots);
    if n < 2 {
        return None;
    }
    let scored = &slots[..n];
    let (best, best_score, best_se) = *scored.last()?;
    let best = best?;
    for &(slow, slow_score, slow_se) in &scored[..scored.len() - 1] {
        let slow = slow?;
        let room = share_of(w, slow).saturating_sub(ctx.floor(slow));
        if room == 0 || room < MOVE_STEP_BP.min(rum.step.bp()) {
            // Less than a step above its floor: nothing worth a move.
            continue;
        }
        let switching_back = last.is_some_and(|m| &m.from == best && &m.to == slow);
        let factor = if switching_back {
            rum.switch_back_factor.max(1.0)
        } else {
            1.0
        };
        let (gap, relative, need_ms, need_rel, significant) =
            significance(ctx, (slow_score, slow_se), (best_score, best_se), factor);
        if !significant {
            // Every other provider is closer to the best: none is significant either.
            return None;
        }
        let amount = rum.step.bp().min(room);
        return Some((
            slow,
            best,
            amount,
            RumFacts {
                gap,
                relative,
                need_ms,
                need_rel,
                switching_back,
            },
        ));
    }
    None
}

#[cfg(test)]
mod tests;
