//! The journal: every change the engine makes, with the rule that fired and its evidence.
//!
//! Append-only, in memory ([`Journal`]) and as JSON Lines on disk ([`JournalFile`]). It answers
//! "why did AS7922 move on Tuesday" ([`Journal::query`]) and feeds the loop's own health
//! figures ([`Journal::loop_health`]): moves per day, oscillation (a cohort reversing direction
//! again and again), and the realized improvement after each move.
//!
//! ```
//! use multicdn_core::{CohortId, NetworkKey, Timestamp};
//! use multicdn_steering::journal::{Journal, Query};
//!
//! let journal = Journal::new();
//! let tuesday = Timestamp::parse_rfc3339("2026-12-01T00:00:00Z")?;
//! let why = journal.query(&Query::network("AS7922".parse::<NetworkKey>()?).between(tuesday, tuesday + std::time::Duration::from_secs(86_400)));
//! assert!(why.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use multicdn_core::{CohortId, NetworkKey, Networks, ProviderId, Timestamp, Weights};

use crate::engine::ProviderEvidence;
use serde::{Deserialize, Serialize};

use crate::error::SteeringError;

/// The rule that changed a cohort's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Rule {
    /// A provider is down: its traffic moves to the healthy ones in steps.
    Failover,
    /// Every provider is down: the static weights, never an empty answer.
    AllProvidersDown,
    /// A manual pin.
    Pin,
    /// Providers are healthy again: back towards the weights before the failover, damped.
    Recovery,
    /// A significant, hysteresis-cleared score gap: one damped step towards the faster provider.
    Rum,
    /// A healthy provider under its floor (measurement or commit) is raised to it.
    Floor,
    /// The inputs are older than `stale_after`: the static weights.
    Deadman,
    /// The big red switch: the static weights.
    StaticMode,
    /// Not a move: the cohort settled after its last move and was measured again.
    Remeasured,
    /// Every provider is down and the policy has a static fallback: DNS answers with it.
    Fallback,
    /// A provider is healthy again: the static fallback is left for the providers.
    FallbackLeft,
    /// An announced drill: a step of the shift to its target, or of the return.
    Drill,
}

/// A guardrail that held a move back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Guardrail {
    /// The cohort's own change cap for the hour.
    CohortCap,
    /// The cap on total traffic moved per hour.
    HourlyCap,
}

/// Why a rule fired: the numbers it saw.
///
/// The providers' scores and samples are the round's own input, shared rather than copied (a
/// round that moves twenty thousand cohorts writes twenty thousand entries). In JSON they read
/// as two maps: `"scores": {"fastly": 120.5}, "samples": {"fastly": 4210}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(from = "EvidenceFile", into = "EvidenceFile")]
#[non_exhaustive]
pub struct Evidence {
    /// The cut the scores were read at (`AS7922`, or a coarser fallback).
    pub network: Option<NetworkKey>,
    /// Each provider's score (lower is better; `None` where it could not be scored) and its
    /// samples. Read it with [`Evidence::scores`], [`Evidence::score`] and
    /// [`Evidence::samples`].
    pub providers: Arc<[ProviderEvidence]>,
    /// The gap that moved traffic, in score units (ms).
    pub gap_ms: Option<f64>,
    /// The gap as a share of the slower provider's score.
    pub gap_relative: Option<f64>,
    /// The absolute gap the rule required (raised by hysteresis when switching back).
    pub required_ms: Option<f64>,
    /// The relative gap the rule required.
    pub required_relative: Option<f64>,
    /// The move reverses the cohort's previous one (hysteresis applied).
    pub switching_back: bool,
    /// The guardrail that cut the move short.
    pub capped_by: Option<Guardrail>,
    /// A sentence for people.
    pub note: String,
}

impl Evidence {
    /// The providers that could be scored, with their scores, in the order the input listed
    /// them.
    pub fn scores(&self) -> impl Iterator<Item = (&ProviderId, f64)> + '_ {
        self.providers
            .iter()
            .filter_map(|e| e.score.map(|s| (&e.provider, s)))
    }

    /// `provider`'s score, when it could be scored.
    pub fn score(&self, provider: &ProviderId) -> Option<f64> {
        self.providers
            .iter()
            .find(|e| e.provider == *provider)
            .and_then(|e| e.score)
    }

    /// `provider`'s samples (0 when it is not listed).
    pub fn samples(&self, provider: &ProviderId) -> u64 {
        self.providers
            .iter()
            .find(|e| e.provider == *provider)
            .map_or(0, |e| e.samples)
    }

    /// True when some provider has a score.
    pub fn has_scores(&self) -> bool {
        self.providers.iter().any(|e| e.score.is_some())
    }
}

impl PartialEq for Evidence {
    /// Providers compare as a set: the same scores and samples in any order.
    fn eq(&self, other: &Evidence) -> bool {
        self.network == other.network
            && self.providers.len() == other.providers.len()
            && self
                .providers
                .iter()
                .all(|e| other.providers.iter().any(|o| o == e))
            && self.gap_ms == other.gap_ms
            && self.gap_relative == other.gap_relative
            && self.required_ms == other.required_ms
            && self.required_relative == other.required_relative
            && self.switching_back == other.switching_back
            && self.capped_by == other.capped_by
            && self.note == other.note
    }
}

/// [`Evidence`] as written: the providers as two maps.
#[derive(Serialize, Deserialize)]
struct EvidenceFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    network: Option<NetworkKey>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    scores: BTreeMap<ProviderId, f64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    samples: BTreeMap<ProviderId, u64>,
    /// Standard errors of the scores, where the cells gave them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    stderr: BTreeMap<ProviderId, f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gap_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gap_relative: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    required_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    required_relative: Option<f64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    switching_back: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capped_by: Option<Guardrail>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    note: String,
}

impl From<Evidence> for EvidenceFile {
    fn from(e: Evidence) -> EvidenceFile {
        EvidenceFile {
            network: e.network,
            scores: e.scores().map(|(p, s)| (p.clone(), s)).collect(),
            samples: e
                .providers
                .iter()
                .map(|p| (p.provider.clone(), p.samples))
                .collect(),
            stderr: e
                .providers
                .iter()
                .filter_map(|p| p.stderr.map(|s| (p.provider.clone(), s)))
                .collect(),
            gap_ms: e.gap_ms,
            gap_relative: e.gap_relative,
            required_ms: e.required_ms,
            required_relative: e.required_relative,
            switching_back: e.switching_back,
            capped_by: e.capped_by,
            note: e.note,
        }
    }
}

impl From<EvidenceFile> for Evidence {
    fn from(mut f: EvidenceFile) -> Evidence {
        let mut providers: Vec<ProviderEvidence> = f
            .samples
            .into_iter()
            .map(|(provider, samples)| ProviderEvidence {
                score: f.scores.remove(&provider),
                stderr: f.stderr.remove(&provider),
                provider,
                samples,
            })
            .collect();
        // A score written without its samples.
        providers.extend(f.scores.into_iter().map(|(provider, s)| ProviderEvidence {
            stderr: f.stderr.remove(&provider),
            provider,
            score: Some(s),
            samples: 0,
        }));
        Evidence {
            network: f.network,
            providers: providers.into(),
            gap_ms: f.gap_ms,
            gap_relative: f.gap_relative,
            required_ms: f.required_ms,
            required_relative: f.required_relative,
            switching_back: f.switching_back,
            capped_by: f.capped_by,
            note: f.note,
        }
    }
}

/// One change to one cohort.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// When.
    pub at: Timestamp,
    /// Which cohort.
    pub cohort: CohortId,
    /// The networks it covers.
    pub networks: Networks,
    /// Weights before.
    pub before: Weights,
    /// Weights after.
    pub after: Weights,
    /// The rule that fired.
    pub rule: Rule,
    /// What it saw.
    pub evidence: Evidence,
}

impl JournalEntry {
    /// True when traffic moved (every rule but [`Rule::Remeasured`]).
    pub fn is_move(&self) -> bool {
        self.before != self.after
    }

    /// Basis points moved.
    pub fn moved_bp(&self) -> u32 {
        self.before.distance(&self.after)
    }

    /// The provider that lost the most and the one that gained the most.
    pub fn direction(&self) -> Option<(ProviderId, ProviderId)> {
        let mut lost: Option<(&ProviderId, i64)> = None;
        let mut gained: Option<(&ProviderId, i64)> = None;
        let mut all: Vec<&ProviderId> = self
            .before
            .providers()
            .chain(self.after.providers())
            .collect();
        all.sort();
        all.dedup();
        for p in all {
            let d = i64::from(self.after.get(p)) - i64::from(self.before.get(p));
            if d < 0 && lost.is_none_or(|(_, x)| d < x) {
                lost = Some((p, d));
            }
            if d > 0 && gained.is_none_or(|(_, x)| d > x) {
                gained = Some((p, d));
            }
        }
        Some((lost?.0.clone(), gained?.0.clone()))
    }

    /// The traffic-weighted score of `weights` under `scores` (only scored providers count).
    fn blended(weights: &Weights, evidence: &Evidence) -> Option<f64> {
        let (mut sum, mut w) = (0.0, 0.0);
        for (p, bp) in weights.iter() {
            if let Some(s) = evidence.score(p) {
                sum += f64::from(bp) * s;
                w += f64::from(bp);
            }
        }
        (w > 0.0).then(|| sum / w)
    }
}

impl fmt::Display for JournalEntry {
    /// One line for people: `2026-12-01T09:00:00Z as7922 rum: cloudflare 50%, fastly 50% ->
    /// cloudflare 70%, fastly 30% (cloudflare 120.2 ms vs fastly 154.7 ms at AS7922: 34.5 ms,
    /// 22.3%, beyond 20 ms and 10.0%)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = serde_json::to_value(self.rule)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        write!(
            f,
            "{} {} {rule}: {} -> {}",
            self.at, self.cohort, self.before, self.after
        )?;
        let e = &self.evidence;
        let mut parts: Vec<String> = Vec::new();
        if let (Some(gap), Some(rel)) = (e.gap_ms, e.gap_relative) {
            let mut by_score: Vec<(&ProviderId, f64)> = e.scores().collect();
            by_score.sort_by(|a, b| a.1.total_cmp(&b.1));
            let scores = by_score
                .iter()
                .map(|(p, s)| format!("{p} {s:.1} ms"))
                .collect::<Vec<_>>()
                .join(" vs ");
            let at = e.network.map(|n| format!(" at {n}")).unwrap_or_default();
            parts.push(format!(
                "{scores}{at}: {gap:.1} ms, {:.1}%, beyond {:.0} ms and {:.1}%{}",
                rel * 100.0,
                e.required_ms.unwrap_or_default(),
                e.required_relative.unwrap_or_default() * 100.0,
                if e.switching_back {
                    " (switching back)"
                } else {
                    ""
                }
            ));
        } else if e.has_scores() && !e.is_empty_note() {
            parts.push(
                e.scores()
                    .map(|(p, s)| format!("{p} {s:.1} ms"))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        }
        if let Some(g) = e.capped_by {
            parts.push(format!("capped by {g:?}"));
        }
        if !e.note.is_empty() {
            parts.push(e.note.clone());
        }
        if !parts.is_empty() {
            write!(f, " ({})", parts.join("; "))?;
        }
        Ok(())
    }
}

impl Evidence {
    fn is_empty_note(&self) -> bool {
        self.note.is_empty()
    }
}

/// A journal query: any of cohort, network and time range.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    /// Only this cohort.
    pub cohort: Option<CohortId>,
    /// Only cohorts covering this network.
    pub network: Option<NetworkKey>,
    /// From this time (inclusive).
    pub from: Option<Timestamp>,
    /// Until this time (exclusive).
    pub to: Option<Timestamp>,
    /// Only entries that moved traffic.
    pub moves_only: bool,
}

impl Query {
    /// Entries of one cohort.
    pub fn cohort(cohort: CohortId) -> Query {
        Query {
            cohort: Some(cohort),
            ..Query::default()
        }
    }

    /// Entries of cohorts covering `network`.
    pub fn network(network: NetworkKey) -> Query {
        Query {
            network: Some(network),
            ..Query::default()
        }
    }

    /// Limits to `[from, to)`.
    pub fn between(mut self, from: Timestamp, to: Timestamp) -> Query {
        self.from = Some(from);
        self.to = Some(to);
        self
    }

    /// Only moves.
    pub fn moves_only(mut self) -> Query {
        self.moves_only = true;
        self
    }

    fn matches(&self, e: &JournalEntry) -> bool {
        self.cohort.as_ref().is_none_or(|c| *c == e.cohort)
            && self.network.is_none_or(|n| e.networks.contains(&n))
            && self.from.is_none_or(|f| e.at >= f)
            && self.to.is_none_or(|t| e.at < t)
            && (!self.moves_only || e.is_move())
    }
}

/// A cohort that keeps reversing direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Oscillation {
    /// The cohort.
    pub cohort: CohortId,
    /// Reversals within the window.
    pub reversals: usize,
    /// The first reversal counted.
    pub from: Timestamp,
    /// The last.
    pub to: Timestamp,
}

/// What a move achieved, measured after the cohort settled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Improvement {
    /// The cohort.
    pub cohort: CohortId,
    /// When it moved.
    pub moved_at: Timestamp,
    /// When it was measured again.
    pub measured_at: Timestamp,
    /// The traffic-weighted score before the move (ms).
    pub before_ms: f64,
    /// The traffic-weighted score measured after it (ms).
    pub after_ms: f64,
}

impl Improvement {
    /// Milliseconds gained (positive is better).
    pub fn gain_ms(&self) -> f64 {
        self.before_ms - self.after_ms
    }
}

/// The loop's own health over a period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LoopHealth {
    /// Moves in the period.
    pub moves: usize,
    /// Moves per day (period length in days, at least one).
    pub moves_per_day: f64,
    /// Moves by rule.
    pub by_rule: BTreeMap<Rule, usize>,
    /// Cohorts reversing at least the threshold number of times within the window.
    pub oscillating: Vec<Oscillation>,
    /// Realized improvement after each measured move.
    pub improvements: Vec<Improvement>,
    /// Their mean gain, in ms.
    pub mean_gain_ms: Option<f64>,
}

/// The journal, in memory. Entries are kept in time order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Journal {
    entries: Vec<JournalEntry>,
}

impl Journal {
    /// An empty journal.
    pub fn new() -> Journal {
        Journal::default()
    }

    /// Appends entries; an entry older than the last is placed in time order.
    pub fn extend(&mut self, entries: impl IntoIterator<Item = JournalEntry>) {
        for e in entries {
            let pos = self.entries.partition_point(|x| x.at <= e.at);
            self.entries.insert(pos, e);
        }
    }

    /// Every entry, oldest first.
    pub fn entries(&self) -> &[JournalEntry] {
        &self.entries
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries matching `q`, oldest first.
    pub fn query(&self, q: &Query) -> Vec<&JournalEntry> {
        let start = q
            .from
            .map_or(0, |f| self.entries.partition_point(|e| e.at < f));
        self.entries[start..]
            .iter()
            .take_while(|e| q.to.is_none_or(|t| e.at < t))
            .filter(|e| q.matches(e))
            .collect()
    }

    /// Reads a JSON Lines journal file.
    pub fn load(path: impl AsRef<Path>) -> Result<Journal, SteeringError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| SteeringError::Io {
            path: path.to_owned(),
            action: "open the journal",
            source,
        })?;
        let mut j = Journal::new();
        let mut entries = Vec::new();
        for (i, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|source| SteeringError::Io {
                path: path.to_owned(),
                action: "read the journal",
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let e: JournalEntry =
                serde_json::from_str(&line).map_err(|e| SteeringError::BadJournalLine {
                    path: path.to_owned(),
                    line: i + 1,
                    message: e.to_string(),
                })?;
            entries.push(e);
        }
        j.extend(entries);
        Ok(j)
    }

    /// The loop's health over `[from, to)`: moves per day, cohorts reversing `reversals` times
    /// or more within `window`, and the realized improvement of each move.
    pub fn loop_health(
        &self,
        from: Timestamp,
        to: Timestamp,
        window: Duration,
        reversals: usize,
    ) -> LoopHealth {
        let period = self.query(&Query::default().between(from, to));
        let moves: Vec<&JournalEntry> = period.iter().copied().filter(|e| e.is_move()).collect();
        let days = (to.since(from).as_secs_f64() / 86_400.0).max(1.0);
        let mut by_rule = BTreeMap::new();
        for m in &moves {
            *by_rule.entry(m.rule).or_insert(0) += 1;
        }
        let improvements = self.improvements(&period);
        let mean_gain_ms = (!improvements.is_empty()).then(|| {
            improvements.iter().map(Improvement::gain_ms).sum::<f64>() / improvements.len() as f64
        });
        LoopHealth {
            moves: moves.len(),
            moves_per_day: moves.len() as f64 / days,
            by_rule,
            oscillating: oscillations(&moves, window, reversals),
            improvements,
            mean_gain_ms,
        }
    }

    /// For each scored move, the next measurement of the same cohort (its remeasure after
    /// settling, or its next scored entry).
    fn improvements(&self, period: &[&JournalEntry]) -> Vec<Improvement> {
        let mut next_scored: HashMap<&CohortId, &JournalEntry> = HashMap::new();
        let mut out = Vec::new();
        for e in period.iter().rev() {
            if e.is_move()
                && matches!(e.rule, Rule::Rum | Rule::Pin | Rule::Recovery)
                && let Some(later) = next_scored.get(&e.cohort)
                // Like with like: both splits scored on the same, later measurement (the
                // move's own evidence was read at another moment, on other caches).
                && let Some(before) = JournalEntry::blended(&e.before, &later.evidence)
                && let Some(after) = JournalEntry::blended(&e.after, &later.evidence)
            {
                out.push(Improvement {
                    cohort: e.cohort.clone(),
                    moved_at: e.at,
                    measured_at: later.at,
                    before_ms: before,
                    after_ms: after,
                });
            }
            if e.evidence.has_scores() {
                next_scored.insert(&e.cohort, e);
            }
        }
        out.reverse();
        out
    }
}

fn oscillations(moves: &[&JournalEntry], window: Duration, threshold: usize) -> Vec<Oscillation> {
    let mut by_cohort: BTreeMap<&CohortId, Vec<&JournalEntry>> = BTreeMap::new();
    for m in moves {
        by_cohort.entry(&m.cohort).or_default().push(m);
    }
    let mut out = Vec::new();
    for (cohort, list) in by_cohort {
        let mut reversal_times: Vec<Timestamp> = Vec::new();
        let mut last: Option<(ProviderId, ProviderId)> = None;
        // Only the loop reversing itself on RUM is oscillation: failover, recovery, the
        // deadman and floors answer health and policy, not the scores.
        for m in list.into_iter().filter(|m| m.rule == Rule::Rum) {
            let Some(dir) = m.direction() else { continue };
            if let Some((from, to)) = &last
                && *from == dir.1
                && *to == dir.0
            {
                reversal_times.push(m.at);
            }
            last = Some(dir);
        }
        let mut best: Option<Oscillation> = None;
        let mut start = 0;
        for end in 0..reversal_times.len() {
            while reversal_times[end].since(reversal_times[start]) > window {
                start += 1;
            }
            let n = end - start + 1;
            if n >= threshold.max(1) && best.as_ref().is_none_or(|b| n > b.reversals) {
                best = Some(Oscillation {
                    cohort: cohort.clone(),
                    reversals: n,
                    from: reversal_times[start],
                    to: reversal_times[end],
                });
            }
        }
        out.extend(best);
    }
    out
}

/// The journal on disk: JSON Lines, opened for appending.
#[derive(Debug)]
pub struct JournalFile {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JournalFile {
    /// Opens (creating) `path` for appending.
    pub fn open(path: impl AsRef<Path>) -> Result<JournalFile, SteeringError> {
        let path = path.as_ref().to_owned();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| SteeringError::Io {
                path: path.clone(),
                action: "open the journal for appending",
                source,
            })?;
        Ok(JournalFile {
            path,
            out: BufWriter::new(file),
        })
    }

    /// Appends entries, one JSON object a line, and flushes.
    pub fn append(&mut self, entries: &[JournalEntry]) -> Result<(), SteeringError> {
        let io = |source| SteeringError::Io {
            path: self.path.clone(),
            action: "append to the journal",
            source,
        };
        for e in entries {
            serde_json::to_writer(&mut self.out, e).map_err(|e| io(std::io::Error::other(e)))?;
            self.out.write_all(b"\n").map_err(io)?;
        }
        self.out.flush().map_err(io)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    fn w(a: u32) -> Weights {
        Weights::new([(p("a"), a), (p("b"), 10_000 - a)]).unwrap()
    }

    fn entry(at: u64, cohort: &str, before: u32, after: u32, scores: (f64, f64)) -> JournalEntry {
        JournalEntry {
            at: Timestamp::from_secs(at),
            cohort: CohortId::new(cohort).unwrap(),
            networks: Networks::one(cohort.to_uppercase().parse().unwrap_or(NetworkKey::Global)),
            before: w(before),
            after: w(after),
            rule: if before == after {
                Rule::Remeasured
            } else {
                Rule::Rum
            },
            evidence: Evidence {
                providers: [(p("a"), scores.0), (p("b"), scores.1)]
                    .into_iter()
                    .map(|(provider, s)| ProviderEvidence {
                        stderr: None,
                        provider,
                        score: Some(s),
                        samples: 500,
                    })
                    .collect(),
                ..Evidence::default()
            },
        }
    }

    #[test]
    fn answers_why_a_network_moved_in_a_time_range() {
        let mut j = Journal::new();
        j.extend([
            entry(100, "as7922", 5000, 7000, (100.0, 150.0)),
            entry(50, "as1", 5000, 3000, (1.0, 1.0)),
            entry(200_000, "as7922", 7000, 9000, (100.0, 150.0)),
        ]);
        assert_eq!(j.entries()[0].at, Timestamp::from_secs(50));
        let hits = j.query(
            &Query::network(NetworkKey::Asn(7922))
                .between(Timestamp::from_secs(0), Timestamp::from_secs(86_400)),
        );
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].after, w(7000));
        assert_eq!(
            j.query(&Query::cohort(CohortId::new("as1").unwrap())).len(),
            1
        );
    }

    #[test]
    fn an_entry_reads_as_one_line_for_people() {
        let mut e = entry(0, "as7922", 5000, 7000, (100.0, 150.0));
        e.evidence.gap_ms = Some(50.0);
        e.evidence.gap_relative = Some(0.333);
        e.evidence.required_ms = Some(20.0);
        e.evidence.required_relative = Some(0.1);
        let line = e.to_string();
        assert!(
            line.contains("as7922 rum: a 50%, b 50% -> a 70%, b 30%"),
            "{line}"
        );
        assert!(
            line.contains("a 100.0 ms vs b 150.0 ms: 50.0 ms, 33.3%, beyond 20 ms and 10.0%"),
            "{line}"
        );
    }

    #[test]
    fn round_trips_through_a_jsonl_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let mut f = JournalFile::open(&path).unwrap();
        f.append(&[entry(1, "as1", 5000, 7000, (1.0, 2.0))])
            .unwrap();
        f.append(&[entry(2, "as1", 7000, 7000, (1.0, 2.0))])
            .unwrap();
        drop(f);
        let j = Journal::load(&path).unwrap();
        assert_eq!(j.len(), 2);
        assert_eq!(j.entries()[0], entry(1, "as1", 5000, 7000, (1.0, 2.0)));
        std::fs::write(&path, "{\"nope\":1}\n").unwrap();
        let err = Journal::load(&path).unwrap_err().to_string();
        assert!(err.contains("journal.jsonl:1"), "{err}");
    }

    #[test]
    fn evidence_reads_as_scores_and_samples_maps() {
        let mut e = entry(1, "as1", 5000, 7000, (120.5, 98.25));
        // Listed out of order, with one provider that could not be scored.
        e.evidence.providers = vec![
            ProviderEvidence {
                stderr: None,
                provider: p("b"),
                score: Some(98.25),
                samples: 4210,
            },
            ProviderEvidence {
                stderr: None,
                provider: p("c"),
                score: None,
                samples: 12,
            },
            ProviderEvidence {
                stderr: None,
                provider: p("a"),
                score: Some(120.5),
                samples: 3900,
            },
        ]
        .into();
        let json = serde_json::to_value(&e.evidence).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "scores": {"a": 120.5, "b": 98.25},
                "samples": {"a": 3900, "b": 4210, "c": 12},
            })
        );
        let back: Evidence = serde_json::from_value(json).unwrap();
        assert_eq!(back, e.evidence, "the same providers, in any order");
        assert_eq!(back.score(&p("c")), None);
        assert_eq!(back.samples(&p("c")), 12);
        assert_eq!(back.score(&p("b")), Some(98.25));
        assert_eq!(back.samples(&p("zz")), 0);
        let mut other = back.clone();
        std::sync::Arc::make_mut(&mut other.providers)[0].samples += 1;
        assert_ne!(other, e.evidence);
    }

    #[test]
    fn flags_a_cohort_that_keeps_reversing() {
        let mut j = Journal::new();
        let mut a = 5000;
        for i in 0..6u64 {
            let next = if i % 2 == 0 { 7000 } else { 5000 };
            j.extend([entry(i * 600, "as1", a, next, (1.0, 1.0))]);
            a = next;
        }
        j.extend([
            entry(0, "as2", 5000, 7000, (1.0, 1.0)),
            entry(600, "as2", 7000, 9000, (1.0, 1.0)),
        ]);
        let h = j.loop_health(
            Timestamp::EPOCH,
            Timestamp::from_secs(86_400),
            Duration::from_secs(3600),
            3,
        );
        assert_eq!(h.moves, 8);
        assert_eq!(h.moves_per_day, 8.0);
        assert_eq!(h.oscillating.len(), 1);
        assert_eq!(h.oscillating[0].cohort.as_str(), "as1");
        assert_eq!(h.oscillating[0].reversals, 5);
    }

    #[test]
    fn failover_recovery_and_deadman_back_and_forth_is_not_oscillation() {
        let mut j = Journal::new();
        let mut a = 5000;
        for (i, rule) in [
            Rule::Failover,
            Rule::Recovery,
            Rule::Deadman,
            Rule::Failover,
        ]
        .into_iter()
        .cycle()
        .take(8)
        .enumerate()
        {
            let next = if i % 2 == 0 { 1000 } else { 5000 };
            let mut e = entry(i as u64 * 300, "default", a, next, (1.0, 1.0));
            e.rule = rule;
            j.extend([e]);
            a = next;
        }
        let h = j.loop_health(
            Timestamp::EPOCH,
            Timestamp::from_secs(86_400),
            Duration::from_secs(3600),
            3,
        );
        assert_eq!(h.moves, 8);
        assert!(h.oscillating.is_empty(), "{:?}", h.oscillating);
    }

    #[test]
    fn realized_improvement_scores_both_splits_on_the_next_measurement() {
        let mut j = Journal::new();
        // Moved 50/50 -> 70/30 at a=100, b=200; remeasured a=110, b=200: the old split would
        // now give 155, the new one gives 137 (like with like: one measurement, both splits).
        j.extend([
            entry(0, "as1", 5000, 7000, (100.0, 200.0)),
            entry(600, "as1", 7000, 7000, (110.0, 200.0)),
        ]);
        let h = j.loop_health(
            Timestamp::EPOCH,
            Timestamp::from_secs(86_400),
            Duration::from_secs(3600),
            3,
        );
        assert_eq!(h.improvements.len(), 1);
        let i = &h.improvements[0];
        assert!((i.before_ms - 155.0).abs() < 1e-9);
        assert!((i.after_ms - 137.0).abs() < 1e-9);
        assert!((h.mean_gain_ms.unwrap() - 18.0).abs() < 1e-9);
    }
}
