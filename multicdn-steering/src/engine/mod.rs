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
//! 3. **Significance**: a RUM move needs a gap beyond both `relative_gap` (of the slower
//!    provider's score) and `absolute_gap`.
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
//! After a failover, once every provider is up again, the cohort returns to its weights from
//! before the failover in damped, settled steps (rule `recovery`), within the guardrails.
//!
//! **Cohorts.** The policy's regions are cohorts, with static weights. Finer cohorts (an ASN
//! with steerable cells, a pinned network) are carved out of the region holding them and start
//! from its weights; they are listed first in the plan, so they match before their region. A
//! cohort's traffic share, which weights the hourly cap, comes from its sample counts
//! ([`cohorts::cohort_inputs`] builds every input from a scoreboard snapshot).

pub mod cohorts;
pub mod state;

use std::collections::{BTreeMap, HashMap};

use multicdn_core::policy::{Pin, SteeringPolicy};
use multicdn_core::{
    CohortId, CohortPlan, HealthState, NetworkKey, Policy, ProviderId, SteeringPlan, TOTAL_BP,
    Timestamp, Weights, weights::largest_remainder,
};
use serde::{Deserialize, Serialize};

pub use state::{CohortMemory, EngineState, LastMove};

use crate::journal::{Evidence, Guardrail, JournalEntry, Rule};

/// A provider's health as the engine needs it: the state and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderHealth {
    /// Up or down.
    pub state: HealthState,
    /// When it entered that state (failover steps count from here).
    pub since: Timestamp,
}

impl ProviderHealth {
    /// Up since `since`.
    pub fn up(since: Timestamp) -> ProviderHealth {
        ProviderHealth {
            state: HealthState::Up,
            since,
        }
    }

    /// Down since `since`.
    pub fn down(since: Timestamp) -> ProviderHealth {
        ProviderHealth {
            state: HealthState::Down,
            since,
        }
    }
}

/// One provider's score in a cohort.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderEvidence {
    /// The provider.
    pub provider: ProviderId,
    /// Its score (lower is better), or `None` when it could not be scored.
    pub score: Option<f64>,
    /// Samples behind the score.
    pub samples: u64,
}

/// One cohort's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CohortInput {
    /// The cohort (`europe`, `as7922`).
    pub cohort: CohortId,
    /// The networks it covers.
    pub networks: Vec<NetworkKey>,
    /// For cohorts carved out of a region: the region, whose weights they start from and whose
    /// static weights they fall back to.
    pub parent: Option<CohortId>,
    /// Its share of all traffic, 0.0 to 1.0 (weights the hourly movement cap).
    pub share: f64,
    /// The cut the scores were read at.
    pub cut: Option<NetworkKey>,
    /// Scores per provider.
    pub evidence: Vec<ProviderEvidence>,
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
}

impl Ctx<'_> {
    fn is_down(&self, p: &ProviderId) -> bool {
        self.down.iter().any(|(d, _)| d == p)
    }

    fn floor(&self, p: &ProviderId) -> u32 {
        self.floors
            .iter()
            .find(|(q, _)| q == p)
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
    if let Some((mode, rule, note)) = mode {
        return fallback(now, inputs, static_plan, mode, rule, note);
    }
    let floors = providers
        .iter()
        .map(|p| (p.clone(), steering.floors.for_provider(p).bp()))
        .collect();
    let ctx = Ctx {
        now,
        rum: &steering.rum,
        steering,
        providers,
        down,
        floors,
    };
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
    for c in &inputs.current.cohorts {
        let target = statics.get(&c.cohort).copied().or_else(|| {
            let parent = inputs
                .state
                .cohorts
                .get(&c.cohort)
                .and_then(|m| m.parent.as_ref());
            parent.and_then(|p| statics.get(p).copied()).or(default)
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
    for m in state.cohorts.values_mut() {
        // A fallback ends any failover bookkeeping: the static weights are the new start.
        m.before_failover = None;
        m.recovering_to = None;
    }
    state.prune(now);
    Decision {
        plan: static_plan,
        journal,
        state,
        mode,
        held: Vec::new(),
    }
}

struct Work<'a> {
    id: CohortId,
    networks: Vec<NetworkKey>,
    input: Option<&'a CohortInput>,
    share: f64,
    w: Weights,
    region: bool,
}

struct Proposal {
    work: usize,
    target: Weights,
    rule: Rule,
    evidence: Evidence,
    priority: u8,
    gap: f64,
}

fn steer(ctx: &Ctx<'_>, inputs: &Inputs<'_>, static_plan: &SteeringPlan) -> Decision {
    let now = ctx.now;
    let mut state = inputs.state.clone();
    state.prune(now);
    let current: HashMap<&CohortId, &CohortPlan> = inputs
        .current
        .cohorts
        .iter()
        .map(|c| (&c.cohort, c))
        .collect();
    let statics: HashMap<&CohortId, &CohortPlan> =
        static_plan.cohorts.iter().map(|c| (&c.cohort, c)).collect();
    let default_id = static_plan
        .cohorts
        .iter()
        .find(|c| c.networks.contains(&NetworkKey::Global))
        .map(|c| c.cohort.clone())
        .unwrap_or_else(default_cohort_id);
    let pins: Vec<&Pin> = ctx.steering.pins.iter().filter(|p| now < p.until).collect();

    // The cohorts of this round: finer ones (sorted by id) first, then the regions in order.
    let mut finer: BTreeMap<CohortId, (Vec<NetworkKey>, Option<&CohortInput>)> = BTreeMap::new();
    for c in &inputs.current.cohorts {
        if !statics.contains_key(&c.cohort) {
            finer.insert(c.cohort.clone(), (c.networks.clone(), None));
        }
    }
    for i in inputs.cohorts {
        if !statics.contains_key(&i.cohort) {
            finer.insert(i.cohort.clone(), (i.networks.clone(), Some(i)));
        }
    }
    for pin in &pins {
        let exact = static_plan
            .cohorts
            .iter()
            .any(|c| c.networks == [pin.network])
            || finer.values().any(|(n, _)| n == &[pin.network]);
        if !exact {
            finer.insert(cohort_id_for(pin.network), (vec![pin.network], None));
        }
    }
    let region_inputs: HashMap<&CohortId, &CohortInput> = inputs
        .cohorts
        .iter()
        .filter(|i| statics.contains_key(&i.cohort))
        .map(|i| (&i.cohort, i))
        .collect();

    let parent_of = |id: &CohortId,
                     networks: &[NetworkKey],
                     input: Option<&CohortInput>,
                     state: &EngineState|
     -> CohortId {
        if let Some(p) = input.and_then(|i| i.parent.clone()) {
            return p;
        }
        if let Some(p) = state.cohorts.get(id).and_then(|m| m.parent.clone()) {
            return p;
        }
        static_plan
            .cohorts
            .iter()
            .find(|c| networks.iter().any(|n| c.networks.contains(n)))
            .map(|c| c.cohort.clone())
            .unwrap_or_else(|| default_id.clone())
    };

    let mut work: Vec<Work<'_>> = Vec::with_capacity(finer.len() + static_plan.cohorts.len());
    for (id, (networks, input)) in finer {
        let parent = parent_of(&id, &networks, input, &state);
        let Some(before) = current
            .get(&id)
            .or_else(|| current.get(&parent))
            .or_else(|| statics.get(&parent))
            .or_else(|| statics.get(&default_id))
            .map(|c| c.weights.clone())
        else {
            continue;
        };
        let mem = state.cohorts.entry(id.clone()).or_default();
        mem.parent = Some(parent);
        work.push(Work {
            share: input.map_or(0.0, |i| i.share),
            id,
            networks,
            input,
            w: before,
            region: false,
        });
    }
    for c in &static_plan.cohorts {
        let before = current
            .get(&c.cohort)
            .map_or_else(|| c.weights.clone(), |cur| cur.weights.clone());
        let input = region_inputs.get(&c.cohort).copied();
        work.push(Work {
            id: c.cohort.clone(),
            networks: c.networks.clone(),
            input,
            share: input.map_or(0.0, |i| i.share),
            w: before,
            region: true,
        });
    }

    let mut journal: Vec<JournalEntry> = Vec::new();
    let mut proposals: Vec<Proposal> = Vec::new();
    for (wi, item) in work.iter_mut().enumerate() {
        let mem = state.cohorts.entry(item.id.clone()).or_default();
        // 1. Health failover.
        health(ctx, item, mem, &mut journal);
        let settling = mem
            .last_move
            .as_ref()
            .is_some_and(|m| now.since(m.at) < ctx.rum.settle.get());
        // 2. Pins.
        let pin = pins.iter().find(|p| item.networks == [p.network]);
        let proposal = if let Some(pin) = pin {
            pin.weights().ok().and_then(|pw| {
                let target = floored(ctx, &respect_down(ctx, &pw, &item.w));
                (target != item.w).then(|| Proposal {
                    work: wi,
                    target,
                    rule: Rule::Pin,
                    evidence: Evidence {
                        note: format!("pinned until {}: {}", pin.until, pin.reason),
                        ..evidence_of(item.input)
                    },
                    priority: 0,
                    gap: 0.0,
                })
            })
        } else if let Some(goal) = mem.recovering_to.clone().filter(|_| ctx.down.is_empty()) {
            if item.w == floored(ctx, &goal) {
                mem.recovering_to = None;
                None
            } else if settling {
                None
            } else {
                let target = floored(
                    ctx,
                    &step_towards(&item.w, &floored(ctx, &goal), ctx.rum.step.bp()),
                );
                (target != item.w).then(|| Proposal {
                    work: wi,
                    target,
                    rule: Rule::Recovery,
                    evidence: Evidence {
                        note: format!("every provider is up: back towards {goal}"),
                        ..evidence_of(item.input)
                    },
                    priority: 1,
                    gap: 0.0,
                })
            }
        } else if ctx.rum.enabled && !settling {
            item.input
                .and_then(|input| rum(ctx, &item.w, input, mem.last_move.as_ref()))
                .map(|(target, evidence, gap)| Proposal {
                    work: wi,
                    target,
                    rule: Rule::Rum,
                    evidence,
                    priority: 2,
                    gap,
                })
        } else {
            None
        };
        proposals.extend(proposal);
    }

    // 7. Guardrails: pins first, then recovery, then the largest relative gaps.
    proposals.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.gap.total_cmp(&a.gap))
            .then(a.work.cmp(&b.work))
    });
    let g = &ctx.steering.guardrails;
    let mut total_left =
        (f64::from(g.max_moved_per_hour.bp()) - state.moved_last_hour(now)).max(0.0);
    let mut held = Vec::new();
    let mut moved_now: Vec<bool> = vec![false; work.len()];
    for mut p in proposals {
        let item = &mut work[p.work];
        let mem = state.cohorts.entry(item.id.clone()).or_default();
        let wanted = item.w.distance(&p.target);
        let cohort_left = g
            .max_change_per_cohort
            .bp()
            .saturating_sub(mem.moved_last_hour(now));
        let mut allowed = wanted.min(cohort_left);
        let mut by = (allowed < wanted).then_some(Guardrail::CohortCap);
        if item.share > 0.0 {
            let by_total = (total_left / item.share).floor();
            if by_total < f64::from(allowed) {
                allowed = by_total.max(0.0) as u32;
                by = Some(Guardrail::HourlyCap);
            }
        }
        if allowed == 0 {
            held.push(Held {
                cohort: item.id.clone(),
                rule: p.rule,
                wanted_bp: wanted,
                by: by.unwrap_or(Guardrail::CohortCap),
            });
            continue;
        }
        let after = step_towards(&item.w, &p.target, allowed);
        let moved = item.w.distance(&after);
        if moved == 0 {
            continue;
        }
        p.evidence.capped_by = by;
        let entry = JournalEntry {
            at: now,
            cohort: item.id.clone(),
            networks: item.networks.clone(),
            before: item.w.clone(),
            after: after.clone(),
            rule: p.rule,
            evidence: p.evidence,
        };
        if let Some((from, to)) = entry.direction() {
            mem.last_move = Some(LastMove { at: now, from, to });
        }
        mem.remeasure_due = true;
        mem.recent.push((now, moved));
        let weighted = f64::from(moved) * item.share;
        total_left = (total_left - weighted).max(0.0);
        if weighted > 0.0 {
            state.recent.push_back((now, weighted));
        }
        journal.push(entry);
        item.w = after;
        moved_now[p.work] = true;
    }

    // 6. Floors that the weights in force did not meet (after a recovery, a hand edit).
    for (wi, item) in work.iter_mut().enumerate() {
        let fixed = floored(ctx, &item.w);
        if fixed != item.w {
            journal.push(JournalEntry {
                at: now,
                cohort: item.id.clone(),
                networks: item.networks.clone(),
                before: item.w.clone(),
                after: fixed.clone(),
                rule: Rule::Floor,
                evidence: Evidence {
                    note: "a healthy provider was under its floor (measurement or commit)"
                        .to_owned(),
                    ..evidence_of(item.input)
                },
            });
            item.w = fixed;
        }
        // Settled after a move: measure again, for the realized-improvement figure.
        let mem = state.cohorts.entry(item.id.clone()).or_default();
        if mem.remeasure_due
            && !moved_now[wi]
            && mem
                .last_move
                .as_ref()
                .is_none_or(|m| now.since(m.at) >= ctx.rum.settle.get())
            && let Some(input) = item.input
        {
            mem.remeasure_due = false;
            journal.push(JournalEntry {
                at: now,
                cohort: item.id.clone(),
                networks: item.networks.clone(),
                before: item.w.clone(),
                after: item.w.clone(),
                rule: Rule::Remeasured,
                evidence: Evidence {
                    note: "settled after the last move; measured again".to_owned(),
                    ..evidence_of(Some(input))
                },
            });
        }
    }

    // Finer cohorts that no longer differ from their region and carry no data are retired.
    let region_w: HashMap<CohortId, Weights> = work
        .iter()
        .filter(|i| i.region)
        .map(|i| (i.id.clone(), i.w.clone()))
        .collect();
    let mut cohorts = Vec::with_capacity(work.len());
    for item in work {
        if !item.region && item.input.is_none() {
            let mem = state.cohorts.get(&item.id);
            let parent_w = mem
                .and_then(|m| m.parent.as_ref())
                .and_then(|p| region_w.get(p));
            let busy =
                mem.is_some_and(|m| m.before_failover.is_some() || m.recovering_to.is_some());
            let pinned = pins.iter().any(|p| item.networks == [p.network]);
            if !busy && !pinned && parent_w == Some(&item.w) {
                state.cohorts.remove(&item.id);
                continue;
            }
        }
        cohorts.push(CohortPlan {
            cohort: item.id,
            networks: item.networks,
            weights: item.w,
        });
    }
    Decision {
        plan: SteeringPlan {
            record: static_plan.record.clone(),
            ttl: static_plan.ttl,
            cohorts,
        },
        journal,
        state,
        mode: Mode::Steering,
        held,
    }
}

/// Evidence is rounded (to microseconds, to millionths) so it reads back from JSON exactly.
fn rounded(x: f64, scale: f64) -> f64 {
    (x * scale).round() / scale
}

fn evidence_of(input: Option<&CohortInput>) -> Evidence {
    let Some(input) = input else {
        return Evidence::default();
    };
    Evidence {
        network: input.cut,
        scores: input
            .evidence
            .iter()
            .filter_map(|e| e.score.map(|s| (e.provider.clone(), rounded(s, 1e3))))
            .collect(),
        samples: input
            .evidence
            .iter()
            .map(|e| (e.provider.clone(), e.samples))
            .collect(),
        ..Evidence::default()
    }
}

/// Rule 1: moves a down provider's traffic away in the policy's steps.
fn health(
    ctx: &Ctx<'_>,
    item: &mut Work<'_>,
    mem: &mut CohortMemory,
    journal: &mut Vec<JournalEntry>,
) {
    let affected = ctx.down.iter().any(|(d, _)| {
        item.w.get(d) > 0 || mem.before_failover.as_ref().is_some_and(|b| b.get(d) > 0)
    });
    if !affected {
        if ctx.down.is_empty()
            && let Some(before) = mem.before_failover.take()
        {
            mem.recovering_to = Some(before);
        }
        return;
    }
    let base = mem
        .before_failover
        .get_or_insert_with(|| item.w.clone())
        .clone();
    mem.recovering_to = None;
    let mut w = item.w.clone();
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
    if w != item.w {
        journal.push(JournalEntry {
            at: ctx.now,
            cohort: item.id.clone(),
            networks: item.networks.clone(),
            before: item.w.clone(),
            after: w.clone(),
            rule: Rule::Failover,
            evidence: Evidence {
                note: notes.join("; "),
                ..Evidence::default()
            },
        });
        item.w = w;
    }
}

/// Moves `amount` from `from` to the healthy providers, in proportion to their weights (evenly
/// when they have none).
fn spread(ctx: &Ctx<'_>, w: &Weights, from: &ProviderId, amount: u32) -> Weights {
    let healthy: Vec<&ProviderId> = ctx.providers.iter().filter(|p| !ctx.is_down(p)).collect();
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

/// Moves up to `budget` basis points from `from` towards `to`: each step from the provider
/// furthest above its target to the one furthest below.
fn step_towards(from: &Weights, to: &Weights, budget: u32) -> Weights {
    let mut out = from.clone();
    let mut left = budget;
    let mut all: Vec<ProviderId> = from.providers().chain(to.providers()).cloned().collect();
    all.sort();
    all.dedup();
    while left > 0 {
        let diff = |p: &ProviderId| i64::from(out.get(p)) - i64::from(to.get(p));
        let over = all
            .iter()
            .filter(|p| diff(p) > 0)
            .max_by_key(|p| (diff(p), std::cmp::Reverse((*p).clone())));
        let under = all
            .iter()
            .filter(|p| diff(p) < 0)
            .min_by_key(|p| (diff(p), (*p).clone()));
        let (Some(o), Some(u)) = (over, under) else {
            break;
        };
        let amount = (diff(o) as u32).min((-diff(u)) as u32).min(left);
        let (next, moved) = out.shift(o, u, amount);
        if moved == 0 {
            break;
        }
        out = next;
        left -= moved;
    }
    out
}

/// Rules 3–5: significance, hysteresis and damping.
fn rum(
    ctx: &Ctx<'_>,
    w: &Weights,
    input: &CohortInput,
    last: Option<&LastMove>,
) -> Option<(Weights, Evidence, f64)> {
    let rum = ctx.rum;
    let mut scored: Vec<(&ProviderId, f64)> = input
        .evidence
        .iter()
        .filter(|e| {
            e.samples >= rum.min_samples
                && !ctx.is_down(&e.provider)
                && ctx.providers.contains(&e.provider)
        })
        .filter_map(|e| {
            e.score
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| (&e.provider, s))
        })
        .collect();
    if scored.len() < 2 {
        return None;
    }
    // Slowest first.
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let (best, best_score) = *scored.last()?;
    for &(slow, slow_score) in &scored[..scored.len() - 1] {
        let room = w.get(slow).saturating_sub(ctx.floor(slow));
        if room == 0 {
            continue;
        }
        let gap = slow_score - best_score;
        let relative = if slow_score > 0.0 {
            gap / slow_score
        } else {
            0.0
        };
        let switching_back = last.is_some_and(|m| &m.from == best && &m.to == slow);
        let factor = if switching_back {
            rum.switch_back_factor.max(1.0)
        } else {
            1.0
        };
        let need_ms = rum.absolute_gap.get().as_secs_f64() * 1000.0 * factor;
        let need_rel = rum.relative_gap.fraction() * factor;
        if !(gap > need_ms && relative > need_rel) {
            // Every other provider is closer to the best: none is significant either.
            return None;
        }
        let amount = rum.step.bp().min(room);
        let (target, _) = w.shift(slow, best, amount);
        let evidence = Evidence {
            gap_ms: Some(rounded(gap, 1e3)),
            gap_relative: Some(rounded(relative, 1e6)),
            required_ms: Some(rounded(need_ms, 1e3)),
            required_relative: Some(rounded(need_rel, 1e6)),
            switching_back,
            note: format!(
                "{best} {best_score:.1} ms vs {slow} {slow_score:.1} ms: {gap:.1} ms ({:.1}%) beyond {need_ms:.0} ms and {:.1}%; moving {}%",
                relative * 100.0,
                need_rel * 100.0,
                f64::from(amount) / 100.0
            ),
            ..evidence_of(Some(input))
        };
        return Some((target, evidence, relative));
    }
    None
}

#[cfg(test)]
mod tests;
