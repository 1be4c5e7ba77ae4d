//! Floors and re-measurement, after the moves: every healthy provider keeps its measurement
//! floor and commercial commit (a move is checked again, and weights in force that did not meet
//! them, after a recovery or a hand edit, are fixed); a cohort settled after its last move is
//! measured again, for the realized-improvement figure.

use std::borrow::Cow;

use super::{Ctx, Work, evidence_of, floored, in_chunks, meets_floors};
use crate::journal::{Evidence, JournalEntry, Rule};

pub(super) fn floors(ctx: &Ctx<'_>, work: &mut [Work<'_>], journal: &mut Vec<JournalEntry>) {
    // Cohorts are independent here: a large round runs in chunks on every core, journaled in
    // cohort order.
    for mut entries in in_chunks(ctx.threads, work, |_, chunk| {
        let mut entries = Vec::new();
        floors_chunk(ctx, chunk, &mut entries);
        entries
    }) {
        journal.append(&mut entries);
    }
}

fn floors_chunk(ctx: &Ctx<'_>, work: &mut [Work<'_>], journal: &mut Vec<JournalEntry>) {
    let now = ctx.now;
    // 6. Floors that the weights in force did not meet (after a recovery, a hand edit).
    for item in work.iter_mut() {
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
}
