//! A scoreboard written by many threads and read while they write.
//!
//! A [`SharedScoreboard`] is a [`Scoreboard`] split by network into shards, each behind its
//! own lock ([`Scoreboard::shard_of`] picks it). A beacon locks the one shard its network is
//! in, for as long as one insert takes. Reading the whole board ([`SharedScoreboard::copy`],
//! what a decision round does) copies one shard at a time, so a writer waits at most for one
//! shard's copy (a 256th of the board by default), and only when it writes to that shard at
//! that moment, rather than for a copy of the whole board.
//!
//! ```
//! use multicdn_steering::beacon::{ClientNetwork, NavigationBeacon};
//! use multicdn_steering::scoreboard::{Recorded, Scoreboard, ScoreboardConfig};
//! use multicdn_steering::shared::SharedScoreboard;
//! use multicdn_core::{ProviderId, Timestamp};
//!
//! let providers = [ProviderId::new("cloudfront")?, ProviderId::new("fastly")?];
//! let board = SharedScoreboard::new(Scoreboard::new(ScoreboardConfig::default(), &providers)?);
//! let nav = NavigationBeacon::new("/", 84.0, "fastly", "LHR", "MISS");
//! let at = Timestamp::from_millis(1_700_000_000_000);
//! let network = ClientNetwork::new(Some(7922), None);
//! assert_eq!(board.record_navigation(at, network, &nav), Recorded::Stored);
//! assert_eq!(board.copy().cells(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use multicdn_core::{ProviderId, Timestamp};

use crate::beacon::{ClientNetwork, NavigationBeacon, ProbeBeacon};
use crate::error::SteeringError;
use crate::scoreboard::{Quality, Recorded, Scoreboard, ScoreboardConfig};

/// A [`Scoreboard`] in shards, each behind its own lock (see the module documentation).
#[derive(Debug)]
pub struct SharedScoreboard {
    shards: Box<[Mutex<Scoreboard>]>,
    config: ScoreboardConfig,
    /// Held to read by whatever spans shards (a copy, an absorb), to write by a replace: the
    /// shards seen together are always of one split, with one provider list.
    epoch: RwLock<()>,
}

impl SharedScoreboard {
    /// The shards [`SharedScoreboard::new`] makes: enough that copying one is short (a few
    /// hundred cells of a board of a hundred thousand networks) and that a writer rarely
    /// meets the one being copied.
    pub const DEFAULT_SHARDS: usize = 256;

    /// `board` in [`SharedScoreboard::DEFAULT_SHARDS`] shards.
    pub fn new(board: Scoreboard) -> SharedScoreboard {
        SharedScoreboard::with_shards(board, SharedScoreboard::DEFAULT_SHARDS)
    }

    /// `board` in `shards` shards (at least one).
    pub fn with_shards(board: Scoreboard, shards: usize) -> SharedScoreboard {
        let config = board.config().clone();
        SharedScoreboard {
            shards: board.split(shards).into_iter().map(Mutex::new).collect(),
            config,
            epoch: RwLock::new(()),
        }
    }

    /// How many shards there are.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The configuration (the same in every shard).
    pub fn config(&self) -> &ScoreboardConfig {
        &self.config
    }

    /// The providers, sorted.
    pub fn providers(&self) -> Vec<ProviderId> {
        self.lock(0).providers().to_vec()
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Scoreboard> {
        // A shard is never empty: `split` makes at least one.
        let i = shard % self.shards.len().max(1);
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the shard that holds `network`'s cells, under its lock.
    pub fn with_network<R>(
        &self,
        network: ClientNetwork,
        f: impl FnOnce(&mut Scoreboard) -> R,
    ) -> R {
        let shard = Scoreboard::shard_of(network, self.shards.len());
        f(&mut self.lock(shard))
    }

    /// [`Scoreboard::record_navigation`] into the network's shard.
    pub fn record_navigation(
        &self,
        at: Timestamp,
        network: ClientNetwork,
        beacon: &NavigationBeacon,
    ) -> Recorded {
        self.with_network(network, |b| b.record_navigation(at, network, beacon))
    }

    /// [`Scoreboard::record_probe`] into the network's shard.
    pub fn record_probe(
        &self,
        at: Timestamp,
        network: ClientNetwork,
        beacon: &ProbeBeacon,
        order: &[String],
    ) -> Vec<Recorded> {
        self.with_network(network, |b| b.record_probe(at, network, beacon, order))
    }

    /// Adds every sample of `board` (a batch ingested beside this one), each network's into
    /// its shard. `board` must have the same bucket length; its providers are matched by name
    /// (see [`Scoreboard::merge`]), and a provider this board does not know is an error with
    /// nothing added.
    pub fn absorb(&self, board: Scoreboard) -> Result<(), SteeringError> {
        self.check_buckets(&board)?;
        let _epoch = self.epoch.read().unwrap_or_else(PoisonError::into_inner);
        let known = self.lock(0).providers().to_vec();
        if let Some(p) = board.providers().iter().find(|p| !known.contains(p)) {
            return Err(SteeringError::Merge(format!(
                "the other scoreboard has provider {p}, which this one does not know (known: {})",
                known
                    .iter()
                    .map(ProviderId::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        for (i, part) in board.split_sparse(self.shards.len()) {
            self.lock(i).absorb(part)?;
        }
        Ok(())
    }

    /// Replaces the whole board with `board` (one built elsewhere: the merge of every shard's),
    /// which must have the same bucket length; its providers become this board's. Every shard
    /// is swapped under all the locks at once, so no reader sees half of each.
    pub fn replace(&self, board: Scoreboard) -> Result<(), SteeringError> {
        self.check_buckets(&board)?;
        let parts = board.split(self.shards.len());
        let _epoch = self.epoch.write().unwrap_or_else(PoisonError::into_inner);
        // Locks taken in shard order, as `copy` takes them one at a time: no deadlock.
        let mut guards: Vec<MutexGuard<'_, Scoreboard>> =
            (0..self.shards.len()).map(|i| self.lock(i)).collect();
        for (guard, part) in guards.iter_mut().zip(parts) {
            **guard = part;
        }
        Ok(())
    }

    fn check_buckets(&self, board: &Scoreboard) -> Result<(), SteeringError> {
        if board.config().bucket_ms() == self.config.bucket_ms() {
            return Ok(());
        }
        Err(SteeringError::Merge(format!(
            "the other scoreboard's buckets are {} ms, this one's {} ms",
            board.config().bucket_ms(),
            self.config.bucket_ms()
        )))
    }

    /// Drops buckets older than the retention as of `now`, a shard at a time.
    pub fn expire(&self, now: Timestamp) {
        for i in 0..self.shards.len() {
            self.lock(i).expire(now);
        }
    }

    /// The whole board, copied a shard at a time (each under its own lock only while it is
    /// copied). A beacon written meanwhile is in the copy or not, never half in it.
    pub fn copy(&self) -> Scoreboard {
        self.copy_with(|_| {})
    }

    /// [`SharedScoreboard::expire`] at `now` and [`SharedScoreboard::copy`] in one pass: each
    /// shard aged and copied under one hold of its lock.
    pub fn copy_expired(&self, now: Timestamp) -> Scoreboard {
        self.copy_with(|b| b.expire(now))
    }

    fn copy_with(&self, mut before: impl FnMut(&mut Scoreboard)) -> Scoreboard {
        let _epoch = self.epoch.read().unwrap_or_else(PoisonError::into_inner);
        let mut whole: Option<Scoreboard> = None;
        for i in 0..self.shards.len() {
            let part = {
                let mut shard = self.lock(i);
                before(&mut shard);
                shard.clone()
            };
            match whole.as_mut() {
                None => whole = Some(part),
                // Parts of one split (no `replace` while the epoch is held): the same
                // providers and bucket length, so the cells move.
                Some(w) => w.absorb_cells(part),
            }
        }
        match whole {
            Some(w) => w,
            None => self.lock(0).clone(),
        }
    }

    /// The counters of every shard, summed.
    pub fn quality(&self) -> Quality {
        let mut q = Quality::default();
        for i in 0..self.shards.len() {
            q.add(&self.lock(i).quality());
        }
        q
    }

    /// How many base cells hold data, in every shard.
    pub fn cells(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).cells()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multicdn_core::Country;
    use std::sync::Arc;

    const T0: u64 = 1_700_000_000_000;

    fn providers(names: &[&str]) -> Vec<ProviderId> {
        names.iter().map(|n| ProviderId::new(n).unwrap()).collect()
    }

    fn board(names: &[&str]) -> Scoreboard {
        Scoreboard::new(ScoreboardConfig::default(), &providers(names)).unwrap()
    }

    /// Beacon `i`, dated within the first `span` ms: a network among 5,000 (some with no
    /// country, some with no ASN), a provider (an unknown one among them), navigations with
    /// hits and probes with failed fetches.
    fn beacon_over(
        i: u64,
        span: u64,
    ) -> (
        Timestamp,
        ClientNetwork,
        Result<NavigationBeacon, ProbeBeacon>,
    ) {
        let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let asn = (x >> 40) % 5_000;
        let country = ["US", "GB", "DE", "JP", "BR"][((x >> 20) % 5) as usize];
        let network = ClientNetwork::new(
            (!asn.is_multiple_of(17)).then_some(64_512 + asn as u32),
            (!asn.is_multiple_of(13)).then(|| Country::new(country).unwrap()),
        );
        let at = Timestamp::from_millis(T0 + (i * 977) % span);
        let p = ["cloudfront", "fastly", "akamai", "unknown"][((x >> 8) % 4) as usize];
        let ms = 20.0 + ((x >> 30) % 400) as f64;
        let b = if i.is_multiple_of(3) {
            Err(ProbeBeacon::new(
                [
                    ("cloudfront".to_owned(), Some(ms)),
                    (
                        "fastly".to_owned(),
                        (!i.is_multiple_of(7)).then_some(ms * 1.1),
                    ),
                    ("akamai".to_owned(), Some(ms * 0.9)),
                ],
                "akamai",
            ))
        } else {
            let cache = if i.is_multiple_of(2) { "HIT" } else { "MISS" };
            Ok(NavigationBeacon::new("/", ms, p, "LHR", cache))
        };
        (at, network, b)
    }

    fn record_into(board: &mut Scoreboard, i: u64) {
        record_over(board, i, 3 * 3_600_000);
    }

    fn record_over(board: &mut Scoreboard, i: u64, span: u64) {
        let (at, network, b) = beacon_over(i, span);
        match b {
            Ok(nav) => {
                board.record_navigation(at, network, &nav);
            }
            Err(probe) => {
                board.record_probe(at, network, &probe, &[]);
            }
        }
    }

    fn record_shared(board: &SharedScoreboard, i: u64) {
        record_shared_over(board, i, 3 * 3_600_000);
    }

    /// [`record_over`] into the shard of beacon `i`'s network.
    fn record_shared_over(board: &SharedScoreboard, i: u64, span: u64) {
        let (_, network, _) = beacon_over(i, span);
        board.with_network(network, |b| record_over(b, i, span));
    }

    fn text(board: &Scoreboard) -> String {
        serde_json::to_string(board).unwrap()
    }

    #[test]
    fn a_shared_board_holds_what_one_board_holds() {
        let names = ["akamai", "cloudfront", "fastly"];
        let mut one = board(&names);
        let shared = SharedScoreboard::new(board(&names));
        for i in 0..60_000 {
            record_into(&mut one, i);
            record_shared(&shared, i);
        }
        let copy = shared.copy();
        assert!(copy.cells() > 10_000, "{} cells", copy.cells());
        assert_eq!(shared.cells(), one.cells());
        assert_eq!(shared.quality(), one.quality());
        assert!(one.quality().unknown_provider > 0);
        assert_eq!(text(&copy), text(&one));

        // Aged alike: the copy of the aged shards is the aged board.
        let now = Timestamp::from_millis(T0 + 3 * 3_600_000 + 2 * 3_600_000);
        one.expire(now);
        let aged = shared.copy_expired(now);
        assert!(aged.cells() < copy.cells());
        assert_eq!(text(&aged), text(&one));
        assert_eq!(shared.cells(), one.cells());
    }

    #[test]
    fn a_board_split_and_absorbed_again_is_the_same_board() {
        let names = ["akamai", "cloudfront", "fastly"];
        let mut one = board(&names);
        for i in 0..20_000 {
            record_into(&mut one, i);
        }
        let before = text(&one);
        let parts = one.split(7);
        assert_eq!(parts.len(), 7);
        assert!(parts.iter().all(|p| p.cells() > 0));
        let mut whole = board(&names);
        for p in parts {
            whole.absorb(p).unwrap();
        }
        assert_eq!(text(&whole), before);
    }

    #[test]
    fn beacons_recorded_while_the_board_is_copied_are_all_kept() {
        let names = ["akamai", "cloudfront", "fastly"];
        let shared = Arc::new(SharedScoreboard::with_shards(board(&names), 64));
        // Within the retention: what is kept does not depend on the order of arrival.
        const SPAN: u64 = 30 * 60_000;
        let mut one = board(&names);
        for i in 0..40_000 {
            record_over(&mut one, i, SPAN);
        }
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    for i in (w..40_000).step_by(2) {
                        record_shared_over(&shared, i, SPAN);
                    }
                })
            })
            .collect();
        let mut copies = 0;
        while !writers.iter().all(|w| w.is_finished()) {
            let c = shared.copy();
            assert!(c.quality().stored <= one.quality().stored);
            copies += 1;
        }
        for w in writers {
            w.join().unwrap();
        }
        assert!(copies > 0);
        assert_eq!(shared.quality(), one.quality());
        assert_eq!(text(&shared.copy()), text(&one));
    }

    #[test]
    fn a_batch_is_absorbed_into_its_networks_shards_and_a_stranger_refused() {
        let names = ["akamai", "cloudfront", "fastly"];
        let shared = SharedScoreboard::new(board(&names));
        // A batch that knows fewer providers (its slots differ) merges by name.
        let mut batch = board(&["cloudfront", "fastly"]);
        for i in 0..5_000 {
            record_shared(&shared, i);
        }
        for i in 5_000..9_000 {
            record_into(&mut batch, i);
        }
        shared.absorb(batch.clone()).unwrap();
        let mut reference = board(&names);
        for i in 0..5_000 {
            record_into(&mut reference, i);
        }
        reference.merge(&batch).unwrap();
        assert_eq!(text(&shared.copy()), text(&reference));

        let stranger = board(&["cdn77", "fastly"]);
        let err = shared.absorb(stranger).unwrap_err().to_string();
        assert!(err.contains("cdn77"), "{err}");
        assert_eq!(text(&shared.copy()), text(&reference));

        let coarse = Scoreboard::new(
            ScoreboardConfig::default().bucket(std::time::Duration::from_secs(3_600)),
            &providers(&names),
        )
        .unwrap();
        let err = shared.absorb(coarse).unwrap_err().to_string();
        assert!(err.contains("buckets"), "{err}");
    }

    #[test]
    fn a_replaced_board_takes_the_new_providers_in_every_shard() {
        let shared = SharedScoreboard::new(board(&["akamai", "cloudfront", "fastly"]));
        for i in 0..2_000 {
            record_shared(&shared, i);
        }
        let mut fed = board(&["cdn77", "cloudfront", "fastly"]);
        for i in 10_000..12_000 {
            record_into(&mut fed, i);
        }
        let want = text(&fed);
        shared.replace(fed).unwrap();
        assert_eq!(text(&shared.copy()), want);
        assert_eq!(
            shared.providers(),
            providers(&["cdn77", "cloudfront", "fastly"])
        );
        // A beacon for a provider only the old board knew is now unknown, in any shard.
        let nav = NavigationBeacon::new("/", 50.0, "akamai", "", "");
        for asn in 0..50 {
            let r = shared.record_navigation(
                Timestamp::from_millis(T0),
                ClientNetwork::new(Some(asn), None),
                &nav,
            );
            assert_eq!(r, Recorded::UnknownProvider);
        }
    }
}
