//! The purge fan-out with an origin shield in front of the CDNs: the shield is purged first,
//! the CDNs only with what it acknowledged; what the shield misses is held back from every
//! CDN (without demoting them) and sent on by the retry that purges the shield of it. The
//! CDNs are the strict Fastly and Cloudflare purge stubs; the shield is a purger that records,
//! at each call, how many purges the CDNs had already received.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use multicdn_core::{Error, Event, ProviderId, PurgeReceipt, PurgeRequest, PurgeScope, Purger};
use multicdn_providers::cloudflare::CloudflareLimits;
use multicdn_providers::fanout::{EventSink, FanoutError, FanoutMember, Pacing, PurgeFanout};
use multicdn_test_support::PurgeApi;
use support::vendors::{cloudflare, fast, fastly, pid, tags};

/// A shield that acknowledges in chunks of two, fails chunks holding a given item (or all of
/// them), and notes how many purges the CDNs had received when each call arrived.
struct Shield {
    id: ProviderId,
    cdns: Arc<PurgeApi>,
    fail: Mutex<Failing>,
    /// At each call: its items, and the CDN purges received before it.
    calls: Mutex<Vec<(Vec<String>, usize)>>,
}

#[derive(Clone, PartialEq)]
enum Failing {
    Nothing,
    Everything,
    ChunksWith(String),
}

impl fmt::Debug for Shield {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Shield")
    }
}

impl Shield {
    fn new(cdns: Arc<PurgeApi>) -> Arc<Shield> {
        Arc::new(Shield {
            id: pid("shield"),
            cdns,
            fail: Mutex::new(Failing::Nothing),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn set(&self, failing: Failing) {
        *self.fail.lock().unwrap() = failing;
    }

    fn calls(&self) -> Vec<(Vec<String>, usize)> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Purger for Shield {
    fn provider(&self) -> &ProviderId {
        &self.id
    }

    fn pacing(&self) -> Pacing {
        Pacing::unlimited(2)
    }

    async fn purge(&self, r: &PurgeRequest) -> Result<PurgeReceipt, Error> {
        let items = r.scope.items().to_vec();
        self.calls
            .lock()
            .unwrap()
            .push((items.clone(), self.cdns.purged().len()));
        let fails = match &*self.fail.lock().unwrap() {
            Failing::Nothing => false,
            Failing::Everything => true,
            Failing::ChunksWith(item) => items.contains(item),
        };
        if fails {
            return Err(Error::Connect {
                provider: self.id.clone(),
                request: "PURGE /".into(),
                message: "connection refused".into(),
            });
        }
        Ok(PurgeReceipt::new(
            self.id.clone(),
            vec![],
            items.len(),
            1,
            1,
            Default::default(),
        ))
    }
}

fn cdn_members(server: &PurgeApi) -> Vec<FanoutMember> {
    vec![
        FanoutMember::new(Arc::new(fastly(&server.fastly_base(), fast(2)))),
        FanoutMember::new(Arc::new(cloudflare(
            &server.cloudflare_base(),
            CloudflareLimits::default(),
            fast(2),
        ))),
    ]
}

/// The items each CDN acknowledged, by vendor.
fn purged_by(server: &PurgeApi, vendor: &str) -> BTreeSet<String> {
    server
        .purged()
        .into_iter()
        .filter(|(v, _)| v == vendor)
        .flat_map(|(_, items)| items)
        .collect()
}

fn collecting() -> (EventSink, Arc<Mutex<Vec<Event>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    (
        EventSink::new(move |e| seen.lock().unwrap().push(e)),
        events,
    )
}

async fn setup() -> (
    Arc<PurgeApi>,
    Arc<Shield>,
    PurgeFanout,
    Arc<Mutex<Vec<Event>>>,
) {
    let cdns = Arc::new(PurgeApi::start().await.unwrap());
    let shield = Shield::new(cdns.clone());
    let (sink, events) = collecting();
    let fanout = PurgeFanout::new(cdn_members(&cdns))
        .with_shield(FanoutMember::new(shield.clone()))
        .with_events(sink)
        // One chunk at a time, so which of the shield's chunks were sent is certain.
        .with_in_flight(1);
    (cdns, shield, fanout, events)
}

#[tokio::test]
async fn the_shield_is_purged_before_any_cdn_in_every_mode() {
    let (cdns, shield, fanout, _) = setup().await;
    let report = fanout.purge(&PurgeRequest::tags(tags(5))).await.unwrap();
    let calls = shield.calls();
    assert_eq!(calls.len(), 3, "five tags in chunks of two");
    assert!(
        calls.iter().all(|(_, cdn_purges)| *cdn_purges == 0),
        "a CDN was purged before the shield had acknowledged: {calls:?}"
    );
    let want: BTreeSet<String> = tags(5).into_iter().collect();
    assert_eq!(purged_by(&cdns, "fastly"), want);
    assert_eq!(purged_by(&cdns, "cloudflare"), want);
    let who: Vec<&str> = report
        .receipts
        .iter()
        .map(|r| r.provider.as_str())
        .collect();
    assert_eq!(who, ["shield", "fastly", "cloudflare"]);

    // The queued mode too: the whole import through the shield, then the CDNs' queue.
    let before = cdns.purged().len();
    let import: Vec<String> = (0..300).map(|i| format!("import-{i}")).collect();
    fanout
        .purge_queued(&PurgeRequest::tags(import.clone()), |_| {})
        .await
        .unwrap();
    let queued: Vec<(Vec<String>, usize)> = shield.calls().into_iter().skip(3).collect();
    assert_eq!(queued.len(), 150);
    assert!(
        queued.iter().all(|(_, cdn_purges)| *cdn_purges == before),
        "a queued chunk reached a CDN before the shield had acknowledged everything"
    );
    let fastly_now = purged_by(&cdns, "fastly");
    assert!(import.iter().all(|t| fastly_now.contains(t)));
}

#[tokio::test]
async fn a_shield_that_misses_holds_every_cdn_back_and_the_retry_sends_it_on() {
    let (cdns, shield, fanout, events) = setup().await;
    shield.set(Failing::Everything);
    let err = fanout
        .purge(&PurgeRequest::tags(tags(4)))
        .await
        .unwrap_err();
    let FanoutError::Missed { failures, held, .. } = &err else {
        panic!("{err}");
    };
    let failed: Vec<&str> = failures.iter().map(|f| f.provider.as_str()).collect();
    assert_eq!(failed, ["shield"], "only the shield missed");
    assert_eq!(failures[0].missed, tags(4));
    let held: Vec<&str> = held.iter().map(ProviderId::as_str).collect();
    assert_eq!(held, ["fastly", "cloudflare"]);
    let text = err.to_string();
    assert!(
        text.contains("held back from fastly, cloudflare until the shield is purged"),
        "{text}"
    );
    assert!(
        cdns.purged().is_empty(),
        "a CDN was purged past a shield that missed"
    );
    // Only the shield is behind; the CDNs are not demoted for its miss.
    let behind: Vec<String> = fanout.outstanding().keys().map(|p| p.to_string()).collect();
    assert_eq!(behind, ["shield"]);
    let missed: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Event::PurgeMissed { .. }))
        .map(|e| e.provider().to_string())
        .collect();
    assert_eq!(missed, ["shield"]);

    // A retry while the shield still fails sends the CDNs nothing.
    let again = fanout.retry_missed().await.unwrap_err();
    assert_eq!(again.failed_providers(), [&pid("shield")]);
    assert!(cdns.purged().is_empty());

    // The shield back: the retry purges it, then the CDNs, of what it had missed.
    shield.set(Failing::Nothing);
    let calls_before = shield.calls().len();
    let report = fanout.retry_missed().await.unwrap();
    assert!(
        shield
            .calls()
            .iter()
            .skip(calls_before)
            .all(|(_, cdn_purges)| *cdn_purges == 0),
        "the retry reached a CDN before the shield"
    );
    let want: BTreeSet<String> = tags(4).into_iter().collect();
    assert_eq!(purged_by(&cdns, "fastly"), want);
    assert_eq!(purged_by(&cdns, "cloudflare"), want);
    assert_eq!(report.recovered, [pid("shield")]);
    assert!(fanout.outstanding().is_empty());
}

#[tokio::test]
async fn the_cdns_get_exactly_what_the_shield_acknowledged() {
    let (cdns, shield, fanout, _) = setup().await;
    // Chunks [0,1] [2,3] [4,5], one at a time: the second fails, the third is not sent.
    shield.set(Failing::ChunksWith("tag-0003".into()));
    let err = fanout
        .purge(&PurgeRequest::tags(tags(6)))
        .await
        .unwrap_err();
    let FanoutError::Missed { failures, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(failures[0].missed.len(), 4, "{:?}", failures[0].missed);
    let acked: BTreeSet<String> = ["tag-0000", "tag-0001"].map(String::from).into();
    assert_eq!(purged_by(&cdns, "fastly"), acked);
    assert_eq!(purged_by(&cdns, "cloudflare"), acked);

    // A later purge that covers the held items clears the shield and reaches the CDNs.
    shield.set(Failing::Nothing);
    let report = fanout.purge(&PurgeRequest::tags(tags(6))).await.unwrap();
    assert_eq!(report.recovered, [pid("shield")]);
    assert_eq!(purged_by(&cdns, "fastly").len(), 6);
    assert!(fanout.outstanding().is_empty());
}

#[tokio::test]
async fn a_purge_the_shield_cannot_do_is_refused_everywhere_before_anything_is_sent() {
    let cdns = Arc::new(PurgeApi::start().await.unwrap());
    let shield = multicdn_providers::shield::ShieldPurger::new(
        pid("shield"),
        "http://10.0.0.5:6081/",
        fast(1),
    )
    .unwrap();
    let fanout =
        PurgeFanout::new(cdn_members(&cdns)).with_shield(FanoutMember::new(Arc::new(shield)));
    let err = fanout
        .purge(&PurgeRequest {
            scope: PurgeScope::Everything,
            soft: false,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, FanoutError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("shield"), "{err}");
    assert!(cdns.purged().is_empty());
}

#[tokio::test]
async fn misses_of_the_shield_kept_across_a_restart_are_retried_shield_first() {
    let (cdns, shield, fanout, _) = setup().await;
    shield.set(Failing::Everything);
    fanout
        .purge(&PurgeRequest::urls(["https://www.example.com/a"]))
        .await
        .unwrap_err();
    let saved = serde_json::to_string(&fanout.outstanding()).unwrap();

    // A new process: a fresh fan-out with the same members, handed what was written down.
    shield.set(Failing::Nothing);
    let next = PurgeFanout::new(cdn_members(&cdns)).with_shield(FanoutMember::new(shield.clone()));
    let behind = next
        .restore(&serde_json::from_str(&saved).unwrap())
        .unwrap();
    assert_eq!(behind, [pid("shield")]);
    next.retry_missed().await.unwrap();
    assert_eq!(
        purged_by(&cdns, "cloudflare"),
        ["https://www.example.com/a".to_owned()].into()
    );
}

#[tokio::test]
async fn the_shield_purger_speaks_the_rendered_vcl_and_reads_its_refusals() {
    use multicdn_providers::shield::ShieldPurger;
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    // Tags: one PURGE of / with every tag in xkey-purge.
    Mock::given(method("PURGE"))
        .and(path("/"))
        .and(header("xkey-purge", "product-1 product-2"))
        .respond_with(ResponseTemplate::new(200).set_body_string("Invalidated 2"))
        .expect(1)
        .mount(&server)
        .await;
    // A URL: under its own Host. The first answer is a 503, retried.
    Mock::given(method("PURGE"))
        .and(path("/products/1"))
        .and(header("host", "www.example.com"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("PURGE"))
        .and(path("/products/1"))
        .and(header("host", "www.example.com"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    // The ACL's refusal of an address it does not list.
    Mock::given(method("PURGE"))
        .and(path("/denied"))
        .respond_with(ResponseTemplate::new(405).set_body_string("Not allowed"))
        .mount(&server)
        .await;
    let shield = ShieldPurger::new(pid("shield"), &server.uri(), fast(3)).unwrap();

    let r = shield
        .purge(&PurgeRequest::tags(["product-1", "product-2"]))
        .await
        .unwrap();
    assert_eq!((r.items, r.requests), (2, 1));
    let r = shield
        .purge(&PurgeRequest::urls(["https://www.example.com/products/1"]))
        .await
        .unwrap();
    assert_eq!((r.requests, r.attempts), (1, 2), "the 503 was not retried");
    let err = shield
        .purge(&PurgeRequest::urls(["/denied"]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Auth { status: 405, .. }), "{err:?}");
    assert!(err.to_string().contains("shield.purgers"), "{err}");
    // A tag xkey would split is refused before anything is sent.
    let bad = shield
        .purge(&PurgeRequest::tags(["two words"]))
        .await
        .unwrap_err();
    assert!(matches!(bad, Error::InvalidRequest { .. }), "{bad}");
    // Plain HTTP to a private host is allowed (no credential is sent); other schemes are not.
    assert!(ShieldPurger::new(pid("shield"), "http://10.0.0.5:6081/", fast(1)).is_ok());
    assert!(ShieldPurger::new(pid("shield"), "ftp://10.0.0.5/", fast(1)).is_err());
}
