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
//!    (a [`Rule::Remeasured`] entry, which the realized-improvement figure reads). **Ties go
//!    to the warmer cache**: where the unbiased signal (paired probes, cache hits) shows no
//!    material gap and leans the same way, a significant gap in what users get now
//!    ([`CohortInput::experienced`], misses included) moves the cohort towards the provider
//!    that already carries most of it, never back against a move made on the evidence.
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
//! gap, recovery ends there and RUM decides. The deadman's return is a recovery too: when
//! evidence resumes, each cohort walks back from the static weights to where it was.
//!
//! **Where each rule lives.** [`decide`] serves the big red switch and the deadman itself; a
//! steering round runs in phases, one module each: `assemble` (the round's cohorts, their
//! inputs and memory), `propose` (rule 1 and drills act; rules 2–5 propose, with the RUM rules
//! in `rum`), `guardrails` (rule 7 settles the proposals), `apply` (the moves made and
//! journaled, the plan written), `floors` (rule 6, and re-measurement).
//!
//! **Cohorts.** The policy's regions are cohorts, with static weights. Finer cohorts (an ASN
//! with steerable cells, a pinned network) are carved out of the region holding them and start
//! from its weights; they are listed first in the plan, so they match before their region. A
//! cohort's traffic share, which weights the hourly cap, comes from its sample counts
//! ([`cohorts::cohort_inputs`] builds every input from a scoreboard snapshot).

mod apply;
mod assemble;
pub mod cohorts;
pub mod drill;
mod floors;
mod guardrails;
mod propose;
mod rum;
pub mod state;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use multicdn_core::policy::{DrillSpec, Fallback, SteeringPolicy};
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

/// Two providers of a cohort compared on the same probe loads (see
/// [`Pairing`](crate::scoreboard::Pairing)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairedEvidence {
    /// One provider.
    pub a: ProviderId,
    /// The other.
    pub b: ProviderId,
    /// Loads that timed both.
    pub pairs: u64,
    /// The correlation of one load's two log times, -1 to 1.
    pub correlation: f64,
}

impl PairedEvidence {
    /// True when it compares `x` and `y`, in either order.
    fn compares(&self, x: &ProviderId, y: &ProviderId) -> bool {
        (same(&self.a, x) && same(&self.b, y)) || (same(&self.a, y) && same(&self.b, x))
    }

    /// The correlation of the two providers' estimates of one quantile, from the loads'
    /// correlation by Sheppard's formula (`2/π · asin ρ`, exact at the median for normal
    /// log times, close at the quartiles): below the loads' own, so the shrinking of the
    /// difference's error is not overstated.
    fn estimate_correlation(&self) -> f64 {
        (std::f64::consts::FRAC_2_PI * self.correlation.clamp(-1.0, 1.0).asin()).clamp(-1.0, 1.0)
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
    /// Providers compared on the same probe loads: such a pair needs `min_pairs` pairs rather
    /// than `min_samples` samples each, and the error of its difference shrinks by their
    /// correlation.
    #[serde(default, skip_serializing_if = "<[_]>::is_empty")]
    pub pairings: Arc<[PairedEvidence]>,
    /// What the cohort's users get now, per provider, cache misses included (navigation TTFB),
    /// when `evidence` is on a signal free of the cache's warmth. It breaks ties: where
    /// `evidence` shows no material gap, traffic moves towards the provider users get faster
    /// now (the warmer cache), so that equal providers do not share a cohort half and half,
    /// both caches colder than one would be.
    #[serde(default, skip_serializing_if = "<[_]>::is_empty")]
    pub experienced: Arc<[ProviderEvidence]>,
}

/// One comparison of a cohort's providers: their scores and how they were paired.
#[derive(Clone, Copy)]
struct Comparison<'i> {
    evidence: &'i [ProviderEvidence],
    pairings: &'i [PairedEvidence],
}

impl CohortInput {
    /// The comparison RUM decides on.
    fn primary(&self) -> Comparison<'_> {
        Comparison {
            evidence: &self.evidence,
            pairings: &self.pairings,
        }
    }

    /// The users' experience, unpaired.
    fn experience(&self) -> Comparison<'_> {
        Comparison {
            evidence: &self.experienced,
            pairings: &[],
        }
    }
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
    /// Threads the per-cohort phases may use.
    threads: usize,
    rum: &'a multicdn_core::policy::RumPolicy,
    steering: &'a SteeringPolicy,
    providers: Vec<ProviderId>,
    down: Vec<(ProviderId, Timestamp)>,
    /// For each provider in `down`: the cumulative share (bp) of its traffic moved by now.
    failed_over: Vec<u32>,
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
}

/// For each down provider: the cumulative share (bp) of its traffic moved by `now`.
fn failed_over(
    f: &multicdn_core::policy::Failover,
    now: Timestamp,
    down: &[(ProviderId, Timestamp)],
) -> Vec<u32> {
    down.iter()
        .map(|(_, since)| failover_fraction(f, now, *since))
        .collect()
}

/// Cumulative share (bp) of a provider's traffic that has left by `now`, down since `since`.
fn failover_fraction(f: &multicdn_core::policy::Failover, now: Timestamp, since: Timestamp) -> u32 {
    let Some(last) = f.steps.last() else {
        return TOTAL_BP;
    };
    let interval = f.interval.get().as_millis().max(1);
    let idx = (now.since(since).as_millis() / interval) as usize;
    f.steps.get(idx).unwrap_or(last).bp().min(TOTAL_BP)
}

/// One round of decisions (see the module documentation). Pure: same inputs, same decision.
///
/// A round over more than 32,768 cohorts runs its per-cohort phases on every core, in scoped
/// threads that end before it returns; the decision is the same whatever the number of cores.
pub fn decide(now: Timestamp, inputs: &Inputs<'_>) -> Decision {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    decide_on(now, inputs, cores)
}

/// [`decide`] with at most `threads` threads.
fn decide_on(now: Timestamp, inputs: &Inputs<'_>, threads: usize) -> Decision {
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
    let failed_over = failed_over(&steering.failover, now, &down);
    let ctx = Ctx {
        now,
        threads,
        rum: &steering.rum,
        steering,
        providers,
        down,
        failed_over,
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
    if mode == Mode::Deadman {
        // The deadman is safety, as a failover is: once measurements are fresh again, each
        // cohort recovers towards where it was (or was returning to), by the recovery rule.
        for c in &inputs.current.cohorts {
            let static_w = statics.get(&c.cohort).map(|t| &t.weights);
            if static_w != Some(&c.weights) {
                let m = state.cohorts.get_mut_or_default(&c.cohort);
                let before = m.before_failover.take();
                if m.recovering_to.is_none() {
                    m.recovering_to = Some(before.unwrap_or_else(|| c.weights.clone()));
                }
            }
        }
    }
    state.cohorts.update_all(|m| {
        // A fallback ends any failover bookkeeping: the static weights are the new start (and,
        // after the deadman, the way back).
        m.before_failover = None;
        if mode != Mode::Deadman {
            m.recovering_to = None;
        }
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

/// A cohort's memory from the last round, as [`assemble`] reads it: the memory, the shared
/// entry it came from, and a pruned copy when it had moves older than the hour.
type Memory<'a> = (
    &'a CohortMemory,
    Option<&'a Arc<CohortMemory>>,
    Option<Box<CohortMemory>>,
);

impl<'a> Work<'a> {
    /// A cohort with `w` in force, its input (if any) attached later.
    fn new(
        id: &'a CohortId,
        networks: &'a Networks,
        w: &'a Weights,
        (old, kept, own): Memory<'a>,
        parent: Option<&'a CohortId>,
    ) -> Work<'a> {
        Work {
            id,
            networks,
            input: None,
            share: 0.0,
            w: Cow::Borrowed(w),
            region: false,
            old,
            kept,
            own,
            parent,
            moved: false,
            unfloored: false,
        }
    }

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

type IdMap<'a, V> = HashMap<&'a CohortId, V, BuildHasherDefault<IdHasher>>;

/// The same cohort: the same shared string (ids cloned from one another), or equal text.
#[inline]
fn same_cohort(a: &CohortId, b: &CohortId) -> bool {
    std::ptr::eq(a.as_str(), b.as_str()) || a == b
}

/// The granularity of optimizing moves, in basis points (0.5%): a move a guardrail cuts short
/// is rounded down to whole steps, and RUM never moves less than one step.
pub const MOVE_STEP_BP: u32 = 50;

/// Cohorts per chunk below which a phase runs on the calling thread alone: a thread costs tens
/// of microseconds, a cohort about half of one.
const CHUNK_MIN: usize = 16_384;

/// Runs `f` over `items` (the round's cohorts, or the plan's) in contiguous chunks, one per
/// core when the round is large enough to pay for threads (scoped: they end before this
/// returns), and returns each chunk's result in order; `f` gets the position of the chunk's
/// first item.
fn in_chunks<S: Split, T: Send>(
    threads: usize,
    items: S,
    f: impl Fn(usize, S) -> T + Sync,
) -> Vec<T> {
    let chunks = threads.min(items.len() / CHUNK_MIN).max(1);
    if chunks == 1 {
        return vec![f(0, items)];
    }
    let size = items.len().div_ceil(chunks);
    std::thread::scope(|scope| {
        let f = &f;
        let mut rest = items;
        let mut offset = 0;
        let mut handles = Vec::with_capacity(chunks);
        while rest.len() > size {
            let (chunk, tail) = rest.split(size);
            let at = offset;
            handles.push(scope.spawn(move || f(at, chunk)));
            offset += size;
            rest = tail;
        }
        // The last chunk on this thread.
        let last = f(offset, rest);
        let mut out: Vec<T> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect();
        out.push(last);
        out
    })
}

/// A slice [`in_chunks`] can hand out in parts.
trait Split: Sized + Send {
    fn len(&self) -> usize;
    fn split(self, at: usize) -> (Self, Self);
}

impl<T: Sync> Split for &[T] {
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn split(self, at: usize) -> (Self, Self) {
        self.split_at(at)
    }
}

impl<T: Send> Split for &mut [T] {
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn split(self, at: usize) -> (Self, Self) {
        self.split_at_mut(at)
    }
}

/// One round of steering: the phases in order, one module each.
fn steer(ctx: &Ctx<'_>, inputs: &Inputs<'_>, static_plan: &SteeringPlan) -> Decision {
    let frame = assemble::Frame::new(ctx, static_plan);
    let mut work = frame.cohorts(ctx, inputs);
    let mut journal = Vec::new();
    let (proposals, ranked) =
        propose::propose(ctx, inputs.state, &frame.pins, &mut work, &mut journal);
    let mut settled = guardrails::settle(ctx, inputs.state, &work, &proposals, ranked);
    let accepted = std::mem::take(&mut settled.accepted);
    journal.reserve(accepted.len());
    apply::apply(ctx.now, &mut work, proposals, accepted, &mut journal);
    floors::floors(ctx, &mut work, &mut journal);
    apply::decision(ctx, &frame, work, journal, settled)
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
    if item.mem().before_failover.is_none() || item.mem().recovering_to.is_some() {
        let start = item.w.as_ref().clone();
        let mem = item.mem_mut();
        mem.recovering_to = None;
        mem.before_failover.get_or_insert(start);
    }
    // What each down provider may keep of the share it had before the failover; most rounds
    // of a failover in progress find every one already there, and copy nothing.
    let mut over: Vec<(&ProviderId, Timestamp, u32, u32)> = Vec::new();
    if let Some(base) = &item.mem().before_failover {
        for ((d, since), frac) in ctx.down.iter().zip(&ctx.failed_over) {
            let allowed =
                (u64::from(base.get(d)) * u64::from(TOTAL_BP - frac) / u64::from(TOTAL_BP)) as u32;
            if item.w.get(d) > allowed {
                over.push((d, *since, *frac, allowed));
            }
        }
    }
    if over.is_empty() {
        return;
    }
    let mut w = item.w.as_ref().clone();
    let mut notes = Vec::new();
    for (d, since, frac, allowed) in over {
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

#[cfg(test)]
mod tests;
