//! Splitting a purge into vendor-sized requests and sending them a few at a time. Shared by
//! the adapters; the pure parts are tested here.

use std::collections::HashSet;
use std::future::Future;

use futures::{StreamExt, TryStreamExt};
use multicdn_core::{Error, ProviderId, PurgeReceipt, Stopwatch};

use crate::http::Sent;

/// The items, first occurrence kept, order preserved.
pub(crate) fn dedupe(items: &[String]) -> Vec<String> {
    let mut seen = HashSet::with_capacity(items.len());
    items
        .iter()
        .filter(|i| seen.insert(i.as_str()))
        .cloned()
        .collect()
}

/// The items, deduplicated in order, in requests of at most `per_request` (at least 1).
pub(crate) fn chunks(items: &[String], per_request: usize) -> Vec<Vec<String>> {
    dedupe(items)
        .chunks(per_request.max(1))
        .map(<[String]>::to_vec)
        .collect()
}

/// What a batched purge acknowledged.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Acked {
    /// The vendor's purge ids.
    pub(crate) ids: Vec<String>,
    /// Requests made.
    pub(crate) requests: u32,
    /// Attempts, retries included.
    pub(crate) attempts: u32,
}

impl Acked {
    /// What one request acknowledged.
    pub(crate) fn one(sent: Sent<Vec<String>>) -> Acked {
        Acked {
            ids: sent.value,
            requests: 1,
            attempts: sent.attempts,
        }
    }

    /// The receipt of `provider`'s purge of `items` items, begun when `watch` started.
    pub(crate) fn receipt(
        self,
        provider: &ProviderId,
        items: usize,
        watch: Stopwatch,
    ) -> PurgeReceipt {
        PurgeReceipt::new(
            provider.clone(),
            self.ids,
            items,
            self.requests,
            self.attempts,
            watch.elapsed(),
        )
    }
}

/// Sends `batches` through `send`, at most `in_flight` at once; the first failure fails the
/// whole purge (the batches still in flight are abandoned).
pub(crate) async fn send_batches<F, Fut>(
    batches: Vec<Vec<String>>,
    in_flight: usize,
    send: F,
) -> Result<Acked, Error>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: Future<Output = Result<Sent<Vec<String>>, Error>>,
{
    futures::stream::iter(batches)
        .map(send)
        .buffer_unordered(in_flight.max(1))
        .try_fold(Acked::default(), |mut acked, sent| async move {
            acked.ids.extend(sent.value);
            acked.requests += 1;
            acked.attempts += sent.attempts;
            Ok(acked)
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn chunks_cover_every_distinct_item_once_within_the_limit(
            items in proptest::collection::vec("[a-e]{1,2}", 0..300),
            per_request in 0usize..300,
        ) {
            let got = chunks(&items, per_request);
            let flat: Vec<String> = got.iter().flatten().cloned().collect();
            prop_assert_eq!(flat, dedupe(&items));
            prop_assert!(got.iter().all(|c| !c.is_empty() && c.len() <= per_request.max(1)));
            let distinct = dedupe(&items).len();
            prop_assert_eq!(got.len(), distinct.div_ceil(per_request.max(1)));
        }
    }

    #[test]
    fn dedupe_keeps_the_first_of_each_in_order() {
        let items: Vec<String> = ["b", "a", "b", "c", "a"].map(String::from).into();
        assert_eq!(dedupe(&items), ["b", "a", "c"]);
    }

    #[tokio::test]
    async fn send_batches_adds_up_ids_requests_and_attempts() {
        let batches = vec![vec!["a".to_owned()], vec!["b".to_owned(), "c".to_owned()]];
        let acked = send_batches(batches, 2, |b| async move {
            Ok(Sent {
                value: b,
                attempts: 2,
            })
        })
        .await
        .unwrap();
        let mut ids = acked.ids.clone();
        ids.sort();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!((acked.requests, acked.attempts), (2, 4));
    }
}
