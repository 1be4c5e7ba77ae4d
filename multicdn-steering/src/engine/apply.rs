//! Application: the moves the guardrails let through are made and journaled in cohort order,
//! each cohort's memory updated (its last RUM direction, what it moved this hour, a
//! re-measurement due); then the plan is written, retiring finer cohorts that no longer differ
//! from their region.

use std::borrow::Cow;
use std::sync::Arc;

use multicdn_core::{CohortPlan, SteeringPlan, Timestamp, Weights};

use super::assemble::Frame;
use super::guardrails::{Accepted, Settled};
use super::propose::{Goal, Proposal};
use super::state::{self, EngineState, LastMove};
use super::{Ctx, Decision, Mode, Work, in_chunks, moved_between, step_towards};
use crate::journal::{JournalEntry, Rule};

/// Makes the accepted moves (`accepted` in proposal order).
pub(super) fn apply<'w>(
    now: Timestamp,
    work: &mut [Work<'w>],
    proposals: Vec<Proposal<'w>>,
    accepted: Vec<Accepted>,
    journal: &mut Vec<JournalEntry>,
) {
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
        let mut evidence = p.why.evidence(item.input);
        let (after, moved, direction) = match p.goal {
            Goal::Shift { from, to, .. } => {
                // `allowed` never exceeds what `from` has: all of it moves.
                let (after, moved) = item.w.shift(from, to, allowed);
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
            mem.last_move = Some(match (p.rule, mem.last_move.take()) {
                (Rule::Rum, _) | (_, None) => LastMove { at: now, from, to },
                // A recovery or a pin settles the cohort as any move does; hysteresis goes on
                // reading the direction RUM last moved it.
                (_, Some(prev)) => LastMove { at: now, ..prev },
            });
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
}

/// The round's decision: the plan (finer cohorts that no longer differ from their region and
/// carry no data retired), the journal, and the memory for the next round. Cohorts are
/// independent here: a large round writes its plan in chunks on every core, joined in cohort
/// order.
pub(super) fn decision<'a>(
    ctx: &Ctx<'_>,
    frame: &Frame<'a>,
    mut work: Vec<Work<'a>>,
    journal: Vec<JournalEntry>,
    settled: Settled,
) -> Decision {
    // Finer cohorts that no longer differ from their region and carry no data are retired.
    let region_w: Vec<Weights> = work[work.len() - frame.static_plan.cohorts.len()..]
        .iter()
        .map(|i| i.w.as_ref().clone())
        .collect();
    // What a cohort's weights are replaced with once the plan has taken them (any weights that
    // live as long as the inputs: the cohort is not read again). A valid policy has a region.
    let spent = frame.static_plan.cohorts.first().map(|c| &c.weights);
    let parts = in_chunks(ctx.threads, work.as_mut_slice(), |_, chunk| {
        let mut cohorts = Vec::with_capacity(chunk.len());
        let mut memory = Vec::with_capacity(chunk.len());
        for item in chunk {
            if !item.region && item.input.is_none() {
                let parent_w = item
                    .parent
                    .and_then(|p| frame.region_of(p))
                    .map(|r| &region_w[r]);
                let busy =
                    item.mem().before_failover.is_some() || item.mem().recovering_to.is_some();
                let pinned = frame.pins.iter().any(|p| *item.networks == [p.network]);
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
                    Some(match (item.own.take(), item.kept) {
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
            let weights = match spent {
                Some(spent) => std::mem::replace(&mut item.w, Cow::Borrowed(spent)).into_owned(),
                None => item.w.as_ref().clone(),
            };
            cohorts.push(CohortPlan {
                cohort: item.id.clone(),
                networks: item.networks.clone(),
                weights,
            });
        }
        (cohorts, memory)
    });
    drop(work);
    let (cohorts, memory) = if parts.len() == 1 {
        parts.into_iter().next().unwrap_or_default()
    } else {
        let mut cohorts = Vec::with_capacity(parts.iter().map(|p| p.0.len()).sum());
        let mut memory = Vec::with_capacity(parts.iter().map(|p| p.1.len()).sum());
        for (mut c, mut m) in parts {
            cohorts.append(&mut c);
            memory.append(&mut m);
        }
        (cohorts, memory)
    };
    Decision {
        plan: SteeringPlan {
            record: frame.static_plan.record.clone(),
            ttl: frame.static_plan.ttl,
            cohorts,
        },
        journal,
        state: EngineState {
            cohorts: state::CohortMemories::from_entries(memory),
            recent: settled.recent,
            recent_recovery: settled.recent_recovery,
            drills: ctx.drill_progress.clone(),
        },
        mode: Mode::Steering,
        held: settled.held,
    }
}
