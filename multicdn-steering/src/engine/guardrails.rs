//! Guardrails, last: the hourly caps settle the proposals in order of precedence (pins, then
//! recovery, then the largest relative gaps), each cohort's own cap and the caps on all
//! traffic, with recovery on a budget of its own. A move cut short goes in whole steps.

use std::collections::VecDeque;

use multicdn_core::{Timestamp, Weights};

use super::propose::{Goal, Proposal, Ranked};
use super::state::{self, EngineState};
use super::{Ctx, Held, MOVE_STEP_BP, Work, moved_between, step_towards};
use crate::journal::{Guardrail, Rule};

/// A move the guardrails let through.
pub(super) struct Accepted {
    pub(super) proposal: usize,
    /// Basis points allowed.
    pub(super) allowed: u32,
    /// The guardrail that cut it short.
    pub(super) by: Option<Guardrail>,
    /// The split after it, for pins and recovery.
    pub(super) after: Option<Weights>,
}

/// What the guardrails let through and held, and the hour's movement after it.
pub(super) struct Settled {
    /// The moves allowed, in cohort order.
    pub(super) accepted: Vec<Accepted>,
    pub(super) held: Vec<Held>,
    pub(super) recent: VecDeque<(Timestamp, f64)>,
    pub(super) recent_recovery: VecDeque<(Timestamp, f64)>,
}

pub(super) fn settle(
    ctx: &Ctx<'_>,
    old: &EngineState,
    work: &[Work<'_>],
    proposals: &[Proposal<'_>],
    mut ranked: Vec<Ranked>,
) -> Settled {
    let now = ctx.now;
    let g = &ctx.steering.guardrails;
    // 7. Guardrails: pins first, then recovery, then the largest relative gaps. The caps are
    // settled in that order on the small `Ranked` records; the moves are then made, and
    // journaled, in cohort order (the plan's order, in which the cohorts' data lies in memory).
    ranked.sort_unstable_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.gap.total_cmp(&a.gap))
            .then(a.work.cmp(&b.work))
    });
    let mut recent: VecDeque<(Timestamp, f64)> = old
        .recent
        .iter()
        .filter(|(at, _)| now.since(*at) < state::HOUR)
        .copied()
        .collect();
    let mut total_left = (f64::from(g.max_moved_per_hour.bp())
        - recent.iter().map(|(_, m)| m).sum::<f64>())
    .max(0.0);
    let mut recent_recovery: VecDeque<(Timestamp, f64)> = old
        .recent_recovery
        .iter()
        .filter(|(at, _)| now.since(*at) < state::HOUR)
        .copied()
        .collect();
    let mut recovery_left = (f64::from(g.max_recovered_per_hour.bp())
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
    accepted.sort_unstable_by_key(|a| a.proposal);
    Settled {
        accepted,
        held,
        recent,
        recent_recovery,
    }
}
