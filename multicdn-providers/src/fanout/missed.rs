//! What one provider has missed and not yet been purged of: pure bookkeeping, updated by the
//! fan-out after each provider's answers and read back as the purges that would clear it.

use std::collections::BTreeMap;

use multicdn_core::{PurgeRequest, PurgeScope};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Items of one kind, each with whether a hard purge of it was missed (`true`) or only soft
/// ones (`false`).
type Items = BTreeMap<String, bool>;

/// What one provider missed and has not acknowledged since: items by kind, and whether a purge
/// of everything was missed.
///
/// A miss is cleared by an acknowledged purge that covers it: the same item of the same kind,
/// or a purge of everything. A soft purge clears only what was missed soft (content marked
/// stale is not content evicted); a hard purge clears both. A missed purge of everything
/// stands for every item missed with it or before it that it covers.
///
/// It serialises as the purges that would clear it ([`Outstanding::requests`]), so that a
/// service can keep it across restarts and hand it back with [`PurgeFanout::restore`]: a miss
/// must not be forgotten because the process that saw it stopped.
///
/// [`PurgeFanout::restore`]: super::PurgeFanout::restore
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outstanding {
    /// `Some(hard)` when a purge of everything was missed.
    everything: Option<bool>,
    /// By kind (`urls`, `tags`, `hosts`, `prefixes`); never an empty set.
    items: BTreeMap<&'static str, Items>,
}

impl Outstanding {
    /// True when nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.everything.is_none() && self.items.is_empty()
    }

    /// Whether a purge of everything was missed.
    pub fn everything(&self) -> bool {
        self.everything.is_some()
    }

    /// The items of `kind` (`urls`, `tags`, `hosts`, `prefixes`) missed, in order.
    pub fn items(&self, kind: &str) -> Vec<&str> {
        self.items
            .get(kind)
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Items missed, every kind.
    pub fn item_count(&self) -> usize {
        self.items.values().map(BTreeMap::len).sum()
    }

    /// The purges that would clear it, in the order [`PurgeFanout::retry_missed`] sends them:
    /// everything first, then each kind's items, hard before soft.
    ///
    /// [`PurgeFanout::retry_missed`]: super::PurgeFanout::retry_missed
    pub fn requests(&self) -> Vec<PurgeRequest> {
        let mut out = Vec::new();
        if let Some(hard) = self.everything {
            out.push(PurgeRequest {
                scope: PurgeScope::Everything,
                soft: !hard,
            });
        }
        for (kind, items) in &self.items {
            let Some(scope) = scope_of(kind) else {
                continue;
            };
            for hard in [true, false] {
                let chosen: Vec<String> = items
                    .iter()
                    .filter(|(_, h)| **h == hard)
                    .map(|(i, _)| i.clone())
                    .collect();
                if !chosen.is_empty() {
                    out.push(PurgeRequest {
                        scope: scope.with_items(chosen),
                        soft: !hard,
                    });
                }
            }
        }
        out
    }

    /// Records that `request` was missed for `items` (ignored for a purge of everything).
    pub(crate) fn missed(&mut self, request: &PurgeRequest, items: &[String]) {
        let hard = !request.soft;
        if matches!(request.scope, PurgeScope::Everything) {
            self.everything = Some(self.everything.unwrap_or(false) || hard);
        } else if !items.is_empty() {
            let set = self.items.entry(request.scope.kind()).or_default();
            for item in items {
                let h = set.entry(item.clone()).or_insert(hard);
                *h = *h || hard;
            }
        }
        self.normalise();
    }

    /// Records that `request` was acknowledged for `items` (all of them, for a purge of
    /// everything).
    pub(crate) fn acknowledged(&mut self, request: &PurgeRequest, items: &[String]) {
        let hard = !request.soft;
        let covers = |missed_hard: bool| hard || !missed_hard;
        if matches!(request.scope, PurgeScope::Everything) {
            if self.everything.is_some_and(covers) {
                self.everything = None;
            }
            for set in self.items.values_mut() {
                set.retain(|_, h| !covers(*h));
            }
        } else if let Some(set) = self.items.get_mut(request.scope.kind()) {
            for item in items {
                if set.get(item).is_some_and(|h| covers(*h)) {
                    set.remove(item);
                }
            }
        }
        self.normalise();
    }

    /// Drops what an outstanding purge of everything stands for, and empty kinds.
    fn normalise(&mut self) {
        if let Some(everything_hard) = self.everything {
            for set in self.items.values_mut() {
                set.retain(|_, h| *h && !everything_hard);
            }
        }
        self.items.retain(|_, set| !set.is_empty());
    }
}

impl Outstanding {
    /// What missing every one of `requests` leaves outstanding (the inverse of
    /// [`Outstanding::requests`]).
    pub fn from_requests<'a>(requests: impl IntoIterator<Item = &'a PurgeRequest>) -> Outstanding {
        let mut o = Outstanding::default();
        o.missed_all(requests);
        o
    }

    /// Adds everything `other` has outstanding.
    pub(crate) fn merge(&mut self, other: &Outstanding) {
        self.missed_all(&other.requests());
    }

    /// Records that each of `requests` was missed, whole.
    fn missed_all<'a>(&mut self, requests: impl IntoIterator<Item = &'a PurgeRequest>) {
        for r in requests {
            self.missed(r, r.scope.items());
        }
    }
}

impl Serialize for Outstanding {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.requests().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Outstanding {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let requests = Vec::<PurgeRequest>::deserialize(d)?;
        Ok(Outstanding::from_requests(&requests))
    }
}

/// The scope of a kind, empty.
fn scope_of(kind: &str) -> Option<PurgeScope> {
    match kind {
        "urls" => Some(PurgeScope::Urls(Vec::new())),
        "tags" => Some(PurgeScope::Tags(Vec::new())),
        "hosts" => Some(PurgeScope::Hosts(Vec::new())),
        "prefixes" => Some(PurgeScope::Prefixes(Vec::new())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn acknowledged_items_of_the_same_kind_clear_a_miss_and_others_do_not() {
        let mut o = Outstanding::default();
        o.missed(&PurgeRequest::tags(["a", "b"]), &v(&["a", "b"]));
        o.acknowledged(&PurgeRequest::urls(["a"]), &v(&["a"]));
        assert_eq!(o.items("tags"), ["a", "b"]);
        o.acknowledged(&PurgeRequest::tags(["a", "c"]), &v(&["a", "c"]));
        assert_eq!(o.items("tags"), ["b"]);
        assert_eq!(o.requests(), [PurgeRequest::tags(["b"])]);
        o.acknowledged(&PurgeRequest::tags(["b"]), &v(&["b"]));
        assert!(o.is_empty());
    }

    #[test]
    fn a_purge_of_everything_clears_every_kind_and_stands_for_the_items_it_covers() {
        let mut o = Outstanding::default();
        o.missed(&PurgeRequest::tags(["a"]), &v(&["a"]));
        o.missed(&PurgeRequest::urls(["https://x/1"]), &v(&["https://x/1"]));
        o.acknowledged(&PurgeRequest::everything(), &[]);
        assert!(o.is_empty());

        o.missed(&PurgeRequest::tags(["a"]), &v(&["a"]));
        o.missed(&PurgeRequest::everything(), &[]);
        assert!(o.everything());
        assert_eq!(o.item_count(), 0, "the missed purge of everything covers a");
        assert_eq!(o.requests(), [PurgeRequest::everything()]);
        // An item acknowledged does not clear a missed purge of everything.
        o.acknowledged(&PurgeRequest::tags(["a"]), &v(&["a"]));
        assert!(o.everything());
    }

    #[test]
    fn a_soft_purge_clears_only_what_was_missed_soft() {
        let mut o = Outstanding::default();
        o.missed(&PurgeRequest::tags(["hard"]), &v(&["hard"]));
        o.missed(&PurgeRequest::tags(["soft"]).soft(), &v(&["soft"]));
        assert_eq!(
            o.requests(),
            [
                PurgeRequest::tags(["hard"]),
                PurgeRequest::tags(["soft"]).soft()
            ]
        );
        o.acknowledged(
            &PurgeRequest::tags(["hard", "soft"]).soft(),
            &v(&["hard", "soft"]),
        );
        assert_eq!(o.requests(), [PurgeRequest::tags(["hard"])]);
        // Missing an item hard after missing it soft makes it hard.
        o.missed(&PurgeRequest::tags(["x"]).soft(), &v(&["x"]));
        o.missed(&PurgeRequest::tags(["x"]), &v(&["x"]));
        assert_eq!(o.requests(), [PurgeRequest::tags(["hard", "x"])]);
    }

    #[test]
    fn a_failed_purge_of_everything_is_recorded_without_items() {
        let mut o = Outstanding::default();
        o.missed(&PurgeRequest::everything(), &[]);
        assert!(!o.is_empty() && o.everything());
        o.acknowledged(&PurgeRequest::everything().soft(), &[]);
        assert!(o.everything(), "a soft purge does not clear a hard miss");
        o.acknowledged(&PurgeRequest::everything(), &[]);
        assert!(o.is_empty());
    }

    #[test]
    fn serialises_as_the_purges_that_clear_it() {
        let mut o = Outstanding::default();
        o.missed(&PurgeRequest::tags(["a", "b"]), &v(&["a", "b"]));
        o.missed(
            &PurgeRequest::urls(["https://x/1"]).soft(),
            &v(&["https://x/1"]),
        );
        let json = serde_json::to_value(&o).unwrap();
        assert_eq!(
            json,
            serde_json::to_value([
                PurgeRequest::tags(["a", "b"]),
                PurgeRequest::urls(["https://x/1"]).soft(),
            ])
            .unwrap()
        );
        let back: Outstanding = serde_json::from_value(json).unwrap();
        assert_eq!(back, o);
        assert!(serde_json::from_str::<Outstanding>("{\"tags\": 1}").is_err());
    }

    fn arb_request() -> impl Strategy<Value = (PurgeRequest, Vec<String>)> {
        let items = proptest::collection::vec("[a-d]", 0..4);
        (0u8..3, items, any::<bool>()).prop_map(|(kind, items, soft)| {
            let scope = match kind {
                0 => PurgeScope::Tags(items.clone()),
                1 => PurgeScope::Urls(items.clone()),
                _ => PurgeScope::Everything,
            };
            let items = scope.items().to_vec();
            (PurgeRequest { scope, soft }, items)
        })
    }

    /// Applies each step: a request missed (`true`) or acknowledged.
    fn replay(steps: &[((PurgeRequest, Vec<String>), bool)]) -> Outstanding {
        let mut o = Outstanding::default();
        for ((request, items), missed) in steps {
            if *missed {
                o.missed(request, items);
            } else {
                o.acknowledged(request, items);
            }
        }
        o
    }

    proptest! {
        #[test]
        fn acknowledging_its_own_requests_always_clears_it(
            steps in proptest::collection::vec((arb_request(), any::<bool>()), 0..12),
        ) {
            let mut o = replay(&steps);
            for r in o.requests() {
                prop_assert!(!r.scope.items().is_empty() || matches!(r.scope, PurgeScope::Everything));
                let items = r.scope.items().to_vec();
                o.acknowledged(&r, &items);
            }
            prop_assert!(o.is_empty(), "{:?}", o);
        }

        #[test]
        fn reads_back_what_it_wrote(
            steps in proptest::collection::vec((arb_request(), any::<bool>()), 0..12),
        ) {
            let o = replay(&steps);
            let json = serde_json::to_string(&o).unwrap();
            let back: Outstanding = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back, o);
        }
    }
}
