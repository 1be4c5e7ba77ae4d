//! What each round decided and what each actuator did with it: the controller's journal.
//!
//! Rounds are numbered from 1 without gaps; a round's record holds the engine's journal entries
//! (every change, with its rule and evidence) and one [`ApplyRecord`] per actuator. A plan that
//! reached some actuators but not others is a [`RoundRecord::partial`] round, and the next round
//! applies it again to those that missed it.

use std::collections::BTreeMap;

use multicdn_core::{Error, ProviderId, SteeringPlan, Timestamp};
use multicdn_steering::engine::Mode;
use multicdn_steering::journal::JournalEntry;
use serde::{Deserialize, Serialize};

use crate::ledger::OutReason;

/// An actuator's error, classified as the library classifies every error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ErrorRecord {
    /// The provider (or actuator) named by the error.
    pub provider: ProviderId,
    /// The error, as text.
    pub message: String,
    /// Whether the same call may succeed later.
    pub retryable: bool,
    /// Whether the change may have been applied anyway (a timeout after sending).
    pub may_have_applied: bool,
    /// Whether credentials were refused.
    pub auth: bool,
}

impl From<&Error> for ErrorRecord {
    fn from(e: &Error) -> ErrorRecord {
        ErrorRecord {
            provider: e.provider().clone(),
            message: e.to_string(),
            retryable: e.is_retryable(),
            may_have_applied: e.may_have_applied(),
            auth: e.is_auth(),
        }
    }
}

/// What one actuator did in a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ApplyOutcome {
    /// The plan is in force on it; `changes` cohorts changed.
    Applied {
        /// Cohorts changed.
        changes: usize,
        /// Attempts it took.
        attempts: u32,
    },
    /// It already had this plan: nothing was sent.
    UpToDate,
    /// Every attempt failed; the next round tries again.
    Failed {
        /// The last error.
        error: ErrorRecord,
        /// Attempts made.
        attempts: u32,
    },
    /// Dry run: nothing was sent.
    DryRun,
}

impl ApplyOutcome {
    /// True when the plan is in force on the actuator after the round.
    pub fn in_force(&self) -> bool {
        matches!(self, ApplyOutcome::Applied { .. } | ApplyOutcome::UpToDate)
    }
}

/// One actuator's part of a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyRecord {
    /// The actuator's name (`route53`, `ns1`, `memory`, `content-steering`).
    pub actuator: String,
    /// What happened.
    #[serde(flatten)]
    pub outcome: ApplyOutcome,
}

/// One round: what was decided, and what was applied where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RoundRecord {
    /// The round's number, from 1, without gaps.
    pub round: u64,
    /// When it was decided.
    pub at: Timestamp,
    /// How it was decided (steering, deadman, static, all down).
    pub mode: Mode,
    /// Decided only: nothing was applied.
    pub dry_run: bool,
    /// Every provider held out, and why.
    pub out: BTreeMap<ProviderId, Vec<OutReason>>,
    /// The engine's journal entries of the round: every change, its rule and evidence.
    pub decided: Vec<JournalEntry>,
    /// Whether the plan differs from the previous round's.
    pub plan_changed: bool,
    /// One record per actuator, in the order they were configured.
    pub applied: Vec<ApplyRecord>,
    /// The leader's term (the lease's fencing token) when the round ran under a lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// The round that continued another controller's: what its last intent was and where it
    /// was already in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover: Option<Takeover>,
}

/// A round decided and about to be applied, recorded first where a successor reads it: a
/// controller that dies between applying and journaling leaves it, and the one that takes over
/// checks whether that plan is already in force before writing anything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Intent {
    /// The round's number.
    pub round: u64,
    /// When it was decided.
    pub at: Timestamp,
    /// The leader's term.
    pub term: u64,
    /// The plan about to be applied.
    pub plan: SteeringPlan,
}

/// What a controller found when it took over from another: the round the other had decided
/// and begun to apply without journaling it, and the actuators that already held that plan
/// (they are not written again when this round decides the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Takeover {
    /// The term of the controller taken over from (`None`: it left no intent).
    pub from_term: Option<u64>,
    /// The round it had begun (`None`: it left none unfinished).
    pub unfinished_round: Option<u64>,
    /// The actuators on which that round's plan was found in force.
    pub in_force: Vec<String>,
    /// The actuators on which it was not (it was never applied there, or only in part).
    pub not_in_force: Vec<String>,
}

impl RoundRecord {
    /// True when the plan reached some actuators and not others (or none, while it should
    /// have): the round is reported, and the next round retries those that missed it.
    pub fn partial(&self) -> bool {
        !self.dry_run && self.applied.iter().any(|a| !a.outcome.in_force())
    }

    /// The actuators that do not hold the round's plan.
    pub fn failed(&self) -> Vec<&ApplyRecord> {
        self.applied
            .iter()
            .filter(|a| matches!(a.outcome, ApplyOutcome::Failed { .. }))
            .collect()
    }
}
