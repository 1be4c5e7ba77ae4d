//! Proposals: what each rule wants of each cohort, in precedence order. Health failover and
//! drills act at once (they are safety); pins, recovery and RUM propose a move, which the
//! guardrails then settle.

use std::borrow::Cow;
use std::sync::Arc;

use multicdn_core::policy::Pin;
use multicdn_core::{ProviderId, Weights};

use super::rum::{RumFacts, rum, shown_slower, warmer};
use super::state::EngineState;
use super::{
    CohortInput, Ctx, Work, drill_step, evidence_of, floored, health, in_chunks, meets_floors,
    moved_between, respect_down, rounded, share_of, step_towards,
};
use crate::journal::{Evidence, JournalEntry, Rule};

/// Where an optimizing rule wants a cohort.
pub(super) enum Goal<'a> {
    /// A split (pins, recovery).
    Weights(Weights),
    /// A RUM step: `bp` from `from` to `to`.
    Shift {
        from: &'a ProviderId,
        to: &'a ProviderId,
        bp: u32,
    },
}

/// What the rule saw: the journal entry's evidence is written from it for the moves made only
/// (at a binding hourly cap most proposals are held, and a held one is journaled as `Held`).
pub(super) enum Why<'a> {
    Pin(&'a Pin),
    /// Back towards this split.
    Recovery(Weights),
    Rum(RumFacts),
}

pub(super) struct Proposal<'a> {
    pub(super) work: usize,
    pub(super) goal: Goal<'a>,
    pub(super) why: Why<'a>,
    pub(super) rule: Rule,
    pub(super) priority: u8,
    pub(super) gap: f64,
}

impl Why<'_> {
    /// The journal entry's evidence for the move, from what the rule saw and the cohort's
    /// input.
    pub(super) fn evidence(&self, input: Option<&CohortInput>) -> Evidence {
        match self {
            Why::Pin(pin) => Evidence {
                note: format!("pinned until {}: {}", pin.until, pin.reason),
                ..evidence_of(input)
            },
            Why::Recovery(goal) => Evidence {
                note: format!(
                    "every provider is up and measured: back towards {goal}, where the cohort \
                     was before the failover or the deadman"
                ),
                ..evidence_of(input)
            },
            Why::Rum(facts) => Evidence {
                gap_ms: Some(rounded(facts.gap, 1e3)),
                gap_relative: Some(rounded(facts.relative, 1e6)),
                required_ms: Some(rounded(facts.need_ms, 1e3)),
                required_relative: Some(rounded(facts.need_rel, 1e6)),
                switching_back: facts.switching_back,
                note: facts.note(),
                providers: input.map_or_else(
                    || Arc::from(Vec::new()),
                    |i| {
                        Arc::clone(if facts.warmer {
                            &i.experienced
                        } else {
                            &i.evidence
                        })
                    },
                ),
                ..evidence_of(input)
            },
        }
    }
}

/// What the guardrails read of a proposal: small, so that ordering them is cheap.
pub(super) struct Ranked {
    pub(super) priority: u8,
    pub(super) gap: f64,
    pub(super) work: usize,
    pub(super) proposal: usize,
    pub(super) wanted: u32,
    pub(super) cohort_left: u32,
    pub(super) share: f64,
}

/// Each cohort's proposal, if any (its failover and drill steps made and journaled on the way),
/// and the small records the guardrails rank them by. Cohorts are independent here: a large
/// round runs in chunks on every core, and the chunks' results are joined in cohort order (the
/// outcome does not depend on how many there were).
pub(super) fn propose<'w>(
    ctx: &Ctx<'_>,
    old: &EngineState,
    pins: &[&'w Pin],
    work: &mut [Work<'w>],
    journal: &mut Vec<JournalEntry>,
) -> (Vec<Proposal<'w>>, Vec<Ranked>) {
    let chunks = in_chunks(ctx.threads, work, |offset, chunk| {
        let mut journal = Vec::new();
        let (proposals, ranked) = propose_chunk(ctx, old, pins, offset, chunk, &mut journal);
        (proposals, ranked, journal)
    });
    let mut proposals = Vec::with_capacity(chunks.iter().map(|c| c.0.len()).sum());
    let mut ranked = Vec::with_capacity(proposals.capacity());
    for (mut p, r, mut j) in chunks {
        let before = proposals.len();
        ranked.extend(r.into_iter().map(|r| Ranked {
            proposal: r.proposal + before,
            ..r
        }));
        proposals.append(&mut p);
        journal.append(&mut j);
    }
    (proposals, ranked)
}

/// [`propose`] for the cohorts `work`, the first of them at `offset` in the round.
fn propose_chunk<'w>(
    ctx: &Ctx<'_>,
    old: &EngineState,
    pins: &[&'w Pin],
    offset: usize,
    work: &mut [Work<'w>],
    journal: &mut Vec<JournalEntry>,
) -> (Vec<Proposal<'w>>, Vec<Ranked>) {
    let now = ctx.now;
    let g = &ctx.steering.guardrails;
    let mut proposals: Vec<Proposal<'_>> = Vec::new();
    let mut ranked: Vec<Ranked> = Vec::new();
    for (wi, item) in (offset..).zip(work.iter_mut()) {
        // 1. Health failover.
        health(ctx, item, journal);
        // The weights are read here anyway: hold them now, so that the later passes (the
        // moves, the plan) never go back to the weights in force.
        if let Cow::Borrowed(w) = item.w {
            item.w = Cow::Owned(w.clone());
        }
        // An announced drill, or the return from one: no other optimizing rule, no floors.
        if drill_step(ctx, old, item, journal) {
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
                (target != *item.w).then_some(Proposal {
                    work: wi,
                    goal: Goal::Weights(target),
                    why: Why::Pin(pin),
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
                    why: Why::Recovery(goal.clone()),
                    rule: Rule::Recovery,
                    priority: 1,
                    gap: 0.0,
                })
            }
        } else if ctx.rum.enabled && !settling {
            item.input.and_then(|input| {
                let last = item.mem().last_move.as_ref();
                rum(ctx, &item.w, input.primary(), last)
                    .or_else(|| warmer(ctx, &item.w, input, last))
                    .map(|(from, to, bp, facts)| Proposal {
                        work: wi,
                        goal: Goal::Shift { from, to, bp },
                        why: Why::Rum(facts),
                        rule: Rule::Rum,
                        priority: 2,
                        gap: facts.relative,
                    })
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
    (proposals, ranked)
}
