//! The controller driving real parts on simulated time: probes through the loopback edges,
//! purges through the emulated vendor purge APIs, the content-steering handler players ask,
//! Route 53 (moto, started by `.ci/run`, `MULTICDN_MOTO_ENDPOINT`) and NS1 (its loopback
//! emulator) as actuators.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use multicdn::prelude::*;
use multicdn::providers::ns1::Ns1Client;
use multicdn::providers::route53::{AwsCredentials, Route53Client};
use multicdn::steering::video::{Protocol, SteeringConfig, SteeringRequest};
use multicdn::{ApplyOutcome, RoundReport};
use multicdn_test_support::{EdgeMode, EdgeServer, Fault, Ns1Api, PurgeApi};
use support::{POLICY, europe, feed, p, quorum_down, start};

fn quick() -> HttpSettings {
    HttpSettings::default()
        .with_request_timeout(Duration::from_secs(5))
        .with_max_attempts(2)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
}

/// What a player in Germany is offered, in order.
fn offered(h: &ContentSteering, now: Timestamp) -> Vec<String> {
    let req = SteeringRequest::from_query_string(
        Protocol::Hls,
        "session=player-1",
        vec!["AS3320".parse().unwrap(), "DE".parse().unwrap()],
    );
    h.handle(&req, now).manifest.unwrap().pathway_priority
}

struct Loopback {
    fastly_edge: EdgeServer,
    _cloudflare_edge: EdgeServer,
    purge_api: PurgeApi,
    controller: Controller,
    clock: ManualClock,
    dns: MemorySteerer,
    handler: ContentSteering,
}

/// The whole machine on loopback: five probe runners through both edges, both purge APIs
/// fanned out, an in-memory DNS and the content-steering handler, one controller.
async fn loopback() -> Loopback {
    let policy = Policy::load(POLICY).unwrap();
    let clock = ManualClock::new(start());
    let fastly_edge = EdgeServer::start("fastly", "LHR", &policy.health.expect)
        .await
        .unwrap();
    let cloudflare_edge = EdgeServer::start("cloudflare", "FRA", &policy.health.expect)
        .await
        .unwrap();
    let purge_api = PurgeApi::start().await.unwrap();
    let overrides = BTreeMap::from([
        (p("fastly"), fastly_edge.base_url()),
        (p("cloudflare"), cloudflare_edge.base_url()),
    ]);
    let mut monitor = Monitor::builder(HealthConfig::from_policy(&policy.health))
        .clock(clock.clone())
        .targets(targets_from_policy(&policy, &overrides).unwrap());
    for region in &policy.health.regions {
        monitor = monitor.runner(
            HttpProbe::builder(region.clone())
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
    }
    let spec = |id: &str| policy.providers[&p(id)].clone();
    let fastly = FastlyPurger::from_spec(
        p("fastly"),
        &spec("fastly"),
        Secret::new("test-fastly-token"),
        Some(&purge_api.fastly_base()),
        quick(),
    )
    .unwrap();
    let cloudflare = CloudflarePurger::from_spec(
        p("cloudflare"),
        &spec("cloudflare"),
        Secret::new("test-cloudflare-token"),
        Some(&purge_api.cloudflare_base()),
        quick(),
    )
    .unwrap();
    let fanout = PurgeFanout::new([
        FanoutMember::new(Arc::new(fastly)),
        FanoutMember::new(Arc::new(cloudflare)),
    ])
    .with_clock(Arc::new(clock.clone()));
    let dns = MemorySteerer::new();
    let video = SharedPlan::new();
    let handler = ContentSteering::new(SteeringConfig::default(), video.clone());
    let controller = Controller::builder(policy)
        .actuator("memory", dns.clone())
        .content_steering(ContentSteeringSteerer::new(p("content-steering"), video))
        .monitor(monitor.build().unwrap())
        .purge_fanout(fanout)
        .clock(clock.clone())
        .build()
        .unwrap();
    Loopback {
        fastly_edge,
        _cloudflare_edge: cloudflare_edge,
        purge_api,
        controller,
        clock,
        dns,
        handler,
    }
}

impl Loopback {
    async fn round(&self) -> RoundReport {
        feed(&self.controller, self.clock.now());
        let r = self.controller.round(self.clock.now()).await;
        self.clock.advance(Duration::from_secs(30));
        r
    }
}

#[tokio::test]
async fn an_edge_that_fails_its_probes_is_demoted_in_steps_on_dns_and_for_players() {
    let l = loopback().await;
    let first = l.round().await;
    assert_eq!(europe(&first, "fastly"), 9_000);
    assert_eq!(offered(&l.handler, l.clock.now())[0], "fastly");

    // Fastly's edge starts serving a 200 error page: only the content check catches it.
    l.fastly_edge.set_mode(EdgeMode::ErrorPage);
    let mut shares = Vec::new();
    let mut offers = Vec::new();
    for _ in 0..5 {
        let r = l.round().await;
        assert!(!r.partial(), "{:?}", r.record.applied);
        // DNS and players hold the round's plan.
        let state = l.dns.current().await.unwrap();
        assert_eq!(state.cohorts, r.plan.cohorts);
        shares.push(europe(&r, "fastly"));
        offers.push(offered(&l.handler, l.clock.now()));
    }
    // Two bad rounds make the quorum's verdict (down_after: 2), then the policy's steps: half
    // at once, the rest after 90 s. Never all at once.
    assert_eq!(shares, [9_000, 4_500, 4_500, 4_500, 0], "{shares:?}");
    // Players stop being offered fastly from the round it is down, though DNS still sends it
    // half its share while the failover steps.
    assert_eq!(offers[0], ["fastly", "cloudflare"]);
    assert!(
        offers[1..].iter().all(|o| o == &["cloudflare"]),
        "{offers:?}"
    );
    let rounds = l.controller.rounds().await;
    assert_eq!(rounds[2].out[&p("fastly")][0].kind(), "quorum_down");
    assert!(
        l.fastly_edge.request_count() >= 10,
        "every runner probed the edge"
    );
}

#[tokio::test]
async fn a_missed_purge_and_a_failed_edge_keep_a_provider_out_until_both_clear() {
    let l = loopback().await;
    l.round().await;
    l.fastly_edge.set_mode(EdgeMode::Unavailable);
    l.round().await;
    l.round().await;
    // Fastly's token is refused while its edge is down: the purge is missed on fastly only.
    l.purge_api.refuse_tokens("fastly", true);
    let missed = l
        .controller
        .purge(&PurgeRequest::tags(["product-123", "price-list"]))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(missed.failed_providers(), [&p("fastly")]);
    assert!(
        l.purge_api
            .purged()
            .iter()
            .any(|(v, items)| v == "cloudflare" && items.len() == 2)
    );
    let r = l.round().await;
    let kinds: Vec<&str> = r.record.out[&p("fastly")]
        .iter()
        .map(|r| r.kind())
        .collect();
    assert_eq!(kinds, ["quorum_down", "purge_missed"]);

    // The edge recovers; after up_after (10) good rounds the quorum verdict clears, but the
    // purge is still owed: fastly stays out, at 0%, and players are not offered it.
    l.fastly_edge.set_mode(EdgeMode::Healthy);
    let mut last = r;
    for _ in 0..12 {
        last = l.round().await;
    }
    let kinds: Vec<&str> = last.record.out[&p("fastly")]
        .iter()
        .map(|r| r.kind())
        .collect();
    assert_eq!(kinds, ["purge_missed"]);
    assert_eq!(europe(&last, "fastly"), 0);
    assert_eq!(offered(&l.handler, l.clock.now()), ["cloudflare"]);

    // The token works again; the retry re-sends exactly what fastly missed, and it is back.
    l.purge_api.refuse_tokens("fastly", false);
    let retried = l.controller.retry_missed().await.unwrap().unwrap();
    assert_eq!(retried.recovered, [p("fastly")]);
    let fastly_purged: Vec<String> = l
        .purge_api
        .purged()
        .into_iter()
        .filter(|(v, _)| v == "fastly")
        .flat_map(|(_, items)| items)
        .collect();
    let mut fastly_purged = fastly_purged;
    fastly_purged.sort();
    assert_eq!(fastly_purged, ["price-list", "product-123"]);
    let back = l.round().await;
    assert!(!back.record.out.contains_key(&p("fastly")));
    assert_eq!(offered(&l.handler, l.clock.now()).len(), 2);
    assert!(
        l.purge_api.malformed().is_empty(),
        "{:?}",
        l.purge_api.malformed()
    );
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn moto() -> Option<String> {
    match std::env::var("MULTICDN_MOTO_ENDPOINT") {
        Ok(e) if !e.is_empty() => Some(e),
        _ => {
            assert!(
                !std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false"),
                "MULTICDN_MOTO_ENDPOINT is not set in CI: .ci/run must start moto before the tests"
            );
            use std::io::Write as _;
            let _ = std::io::stderr()
                .write_all(b"skipped: MULTICDN_MOTO_ENDPOINT not set (start moto, see .ci/run)\n");
            None
        }
    }
}

#[tokio::test]
async fn route53_and_ns1_take_every_plan_from_the_controller_and_a_failing_one_is_retried() {
    let Some(endpoint) = moto() else {
        return;
    };
    let tag = format!(
        "ctrl-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    );
    let mut policy = Policy::load(POLICY).unwrap();
    let zone = format!("{tag}.example.com");
    policy.steering.record = format!("www.{zone}");
    policy.steering.zone = zone.clone();

    let aws = Route53Client::new(
        &endpoint,
        AwsCredentials::new("testing", Secret::new("testing")),
        quick(),
    )
    .unwrap();
    let zone_id = aws
        .create_hosted_zone(&zone, &format!("ref-{tag}"))
        .await
        .unwrap();
    let route53 = Route53Steerer::from_policy(aws, &zone_id, &policy);
    let ns1_api = Ns1Api::start("ns1-test-key").await.unwrap();
    ns1_api.create_zone(&zone);
    let ns1_client =
        Ns1Client::new(&ns1_api.base_url(), Secret::new("ns1-test-key"), quick()).unwrap();
    let ns1 = Ns1Steerer::from_policy(ns1_client, &policy);

    let clock = ManualClock::new(start());
    let c = Controller::builder(policy.clone())
        .actuator("route53", route53.clone())
        .actuator("ns1", ns1.clone())
        .clock(clock.clone())
        .retry(Retry {
            attempts: 1,
            ..Retry::default()
        })
        .build()
        .unwrap();

    let check_both_hold = |plan: Arc<SteeringPlan>| {
        let route53 = route53.clone();
        let ns1 = ns1.clone();
        async move {
            // Route 53 cannot select by ASN: it holds the plan without its ASN cohorts, whose
            // users follow their country there. NS1 holds every cohort.
            let geo = plan.without_asns();
            assert!(
                geo.cohorts.len() < plan.cohorts.len(),
                "the policy pins an ASN"
            );
            for (name, state, want) in [
                ("route53", route53.current().await.unwrap(), &geo),
                ("ns1", ns1.current().await.unwrap(), &*plan),
            ] {
                assert_eq!(state.cohorts.len(), want.cohorts.len(), "{name}");
                for cohort in &want.cohorts {
                    let got = state
                        .cohort(&cohort.cohort)
                        .unwrap_or_else(|| panic!("{name}: {} missing", cohort.cohort));
                    // Route 53 weighs 0-255: a share is kept to within one step of 1/255.
                    let step = if name == "route53" { 10_000 / 255 } else { 0 };
                    for provider in cohort.weights.providers() {
                        let (g, w) = (got.weights.get(provider), cohort.weights.get(provider));
                        assert!(
                            g.abs_diff(w) <= step,
                            "{name}: {}: {} got {g} bp, want {w}",
                            cohort.cohort,
                            provider
                        );
                    }
                }
            }
        }
    };

    feed(&c, clock.now());
    let first = c.round(clock.now()).await;
    assert!(!first.partial(), "{:?}", first.record.applied);
    check_both_hold(first.plan.clone()).await;
    let writes = ns1_api.writes();
    assert_eq!(writes, 1, "one record, created once");

    // Fastly fails. NS1's API is down for the round the failover starts: Route 53 takes the
    // plan, NS1 does not, and the journal says so.
    c.report(quorum_down("fastly", clock.now()));
    ns1_api.set_fault(Fault::Unavailable);
    clock.advance(Duration::from_secs(30));
    feed(&c, clock.now());
    let partial = c.round(clock.now()).await;
    assert_eq!(europe(&partial, "fastly"), 4_500);
    assert!(partial.partial());
    let outcome = |r: &RoundReport, name: &str| {
        r.record
            .applied
            .iter()
            .find(|a| a.actuator == name)
            .unwrap()
            .outcome
            .clone()
    };
    assert!(matches!(
        outcome(&partial, "route53"),
        ApplyOutcome::Applied { .. }
    ));
    let ApplyOutcome::Failed { error, .. } = outcome(&partial, "ns1") else {
        panic!("{:?}", partial.record.applied);
    };
    assert!(error.message.contains("503"), "{error:?}");
    assert_eq!(ns1_api.writes(), writes);

    // NS1 is back: the next round gives it the plan it missed, and Route 53 is up to date.
    ns1_api.set_fault(Fault::None);
    clock.advance(Duration::from_secs(30));
    feed(&c, clock.now());
    let retried = c.round(clock.now()).await;
    assert!(!retried.partial(), "{:?}", retried.record.applied);
    assert_eq!(outcome(&retried, "route53"), ApplyOutcome::UpToDate);
    assert!(matches!(
        outcome(&retried, "ns1"),
        ApplyOutcome::Applied { .. }
    ));
    check_both_hold(retried.plan.clone()).await;

    // The failover completes on both.
    clock.advance(Duration::from_secs(60));
    feed(&c, clock.now());
    let done = c.round(clock.now()).await;
    assert_eq!(europe(&done, "fastly"), 0);
    assert!(!done.partial(), "{:?}", done.record.applied);
    check_both_hold(done.plan.clone()).await;
    let record = ns1_api
        .record(&zone, &policy.steering.record, "CNAME")
        .expect("the NS1 record");
    assert!(record["answers"].as_array().is_some_and(|a| !a.is_empty()));
}
