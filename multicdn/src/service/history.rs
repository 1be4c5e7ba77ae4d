//! What the dashboard's p75 chart draws: each round's p75 per provider, globally and for the
//! busiest countries, for a bounded number of rounds.

use std::collections::VecDeque;

use multicdn_core::{NetworkKey, ProviderId, Timestamp};
use multicdn_steering::scoreboard::{Metric, Snapshot};
use serde::Serialize;

use super::Service;

/// Countries kept per round besides the global cut (the busiest).
const COUNTRIES_KEPT: usize = 24;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    at: Timestamp,
    provider: String,
    p75: f64,
}

#[derive(Debug)]
struct Round {
    at: Timestamp,
    /// (cut, provider slot, p75)
    values: Vec<(NetworkKey, u16, f64)>,
}

#[derive(Debug)]
pub(crate) struct History {
    rounds: VecDeque<Round>,
    cap: usize,
}

impl History {
    pub(crate) fn new(cap: usize) -> History {
        History {
            rounds: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    pub(crate) fn push(&mut self, at: Timestamp, snapshot: &Snapshot, providers: &[ProviderId]) {
        let mut countries: Vec<(u64, NetworkKey)> = snapshot
            .networks(Metric::Ttfb)
            .into_iter()
            .filter(|k| matches!(k, NetworkKey::Country(_)))
            .map(|k| (snapshot.samples(Metric::Ttfb, k), k))
            .collect();
        countries.sort_by_key(|c| std::cmp::Reverse(c.0));
        let keys = std::iter::once(NetworkKey::Global)
            .chain(countries.into_iter().take(COUNTRIES_KEPT).map(|(_, k)| k));
        let mut values = Vec::new();
        for key in keys {
            for (slot, p) in providers.iter().enumerate() {
                if let Some(p75) = snapshot.cell(Metric::Ttfb, key, p).stats.p75 {
                    values.push((key, slot as u16, p75));
                }
            }
        }
        if self.rounds.len() >= self.cap {
            self.rounds.pop_front();
        }
        self.rounds.push_back(Round { at, values });
    }

    fn points(&self, network: NetworkKey, providers: &[ProviderId]) -> Vec<Point> {
        self.rounds
            .iter()
            .flat_map(|r| {
                r.values
                    .iter()
                    .filter(move |(k, _, _)| *k == network)
                    .filter_map(move |(_, slot, p75)| {
                        Some(Point {
                            at: r.at,
                            provider: providers.get(usize::from(*slot))?.to_string(),
                            p75: *p75,
                        })
                    })
            })
            .collect()
    }

    fn start(&self) -> Option<Timestamp> {
        self.rounds.front().map(|r| r.at)
    }
}

impl Service {
    pub(crate) fn history_p75(&self, network: NetworkKey) -> Vec<Point> {
        self.inner
            .history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .points(network, self.providers())
    }

    pub(crate) fn history_start(&self) -> Option<Timestamp> {
        self.inner
            .history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .start()
    }
}
