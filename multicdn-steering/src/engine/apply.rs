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
use super::{Ctx, Decision, Mode, Work, moved_between, step_towards};
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
/// carry no data retired), the journal, and the memory for the next round.
pub(super) fn decision(
    ctx: &Ctx<'_>,
    frame: &Frame<'_>,
    work: Vec<Work<'_>>,
    journal: Vec<JournalEntry>,
    settled: Settled,
) -> Decision {
    // Finer cohorts that no longer differ from their region and carry no data are retired.
    let region_w: Vec<Weights> = work[work.len() - frame.static_plan.cohorts.len()..]
        .iter()
        .map(|i| i.w.as_ref().clone())
        .collect();
    let mut cohorts = Vec::with_capacity(work.len());
    let mut memory = state::CohortMemories::with_capacity(work.len());
    for item in work {
        if !item.region && item.input.is_none() {
            let parent_w = item
                .parent
                .and_then(|p| frame.region_of(p))
                .map(|r| &region_w[r]);
            let busy = item.mem().before_failover.is_some() || item.mem().recovering_to.is_some();
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
            record: frame.static_plan.record.clone(),
            ttl: frame.static_plan.ttl,
            cohorts,
        },
        journal,
        state: EngineState {
            cohorts: memory,
            recent: settled.recent,
            recent_recovery: settled.recent_recovery,
            drills: ctx.drill_progress.clone(),
        },
        mode: Mode::Steering,
        held: settled.held,
    }
}
