//! The controller lease against a real `nats-server -js` on loopback: one contender leads,
//! the other follows; a leader that stops renewing is replaced once its lease ages out and its
//! writes are fenced from then on; a released lease is taken at once; a server that is down
//! is an error, never a hang, and a write that cannot be fenced is not made.
//!
//! Without `nats-server` the tests say they are skipped; with `CI` set they fail.

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Lease expiry is server time: the tests wait in real time.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use multicdn::core::{
    ApplyOptions, CohortId, CohortPlan, Error, NetworkKey, ProviderId, Steerer, SteeringPlan,
    Weights,
};
use multicdn::lease::{FencedSteerer, LeaseConfig, LeaseError, LeaseState, NatsLease, Term};
use multicdn::prelude::MemorySteerer;
use multicdn_test_support::NatsServer;

const TTL: Duration = Duration::from_secs(2);

fn server() -> Option<NatsServer> {
    NatsServer::start_or_skip("the lease tests").unwrap()
}

async fn lease(server: &NatsServer, holder: &str) -> NatsLease {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(server.url())
        .await
        .unwrap();
    NatsLease::open(client, LeaseConfig::new(holder, TTL))
        .await
        .unwrap()
}

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

fn plan(fastly: u32) -> SteeringPlan {
    SteeringPlan {
        record: "www.example.com".into(),
        ttl: Duration::from_secs(30),
        cohorts: vec![CohortPlan {
            cohort: CohortId::new("default").unwrap(),
            networks: NetworkKey::Global.into(),
            weights: Weights::new([(p("fastly"), fastly), (p("cloudflare"), 10_000 - fastly)])
                .unwrap(),
        }],
    }
}

fn leader(state: LeaseState) -> Term {
    match state {
        LeaseState::Leader(t) => t,
        LeaseState::Follower { holder } => panic!("a follower of {holder}"),
    }
}

#[tokio::test]
async fn one_contender_leads_the_other_follows_and_renewals_keep_the_term() {
    let Some(server) = server() else { return };
    let a = lease(&server, "controller-a").await;
    let b = lease(&server, "controller-b").await;
    let term = leader(a.try_acquire().await.unwrap());
    assert_eq!(term.holder, "controller-a");
    assert!(term.term > 0);
    match b.try_acquire().await.unwrap() {
        LeaseState::Follower { holder } => assert_eq!(holder, term),
        LeaseState::Leader(t) => panic!("two leaders: {term} and {t}"),
    }
    assert_eq!(b.held(), None);
    // Renewals within the TTL keep the tenure, well past one TTL.
    for _ in 0..6 {
        tokio::time::sleep(a.renew_interval()).await;
        assert_eq!(leader(a.try_acquire().await.unwrap()), term);
        assert!(matches!(
            b.try_acquire().await.unwrap(),
            LeaseState::Follower { .. }
        ));
    }
    assert_eq!(a.current().await.unwrap(), Some(term));
}

#[tokio::test]
async fn a_leader_that_stops_renewing_is_replaced_and_its_writes_are_fenced() {
    let Some(server) = server() else { return };
    let a = lease(&server, "controller-a").await;
    let b = lease(&server, "controller-b").await;
    // Both controllers drive the same actuator (the DNS provider).
    let dns = MemorySteerer::new();
    let through_a = FencedSteerer::new(a.clone(), dns.clone(), p("route53"));
    let through_b = FencedSteerer::new(b.clone(), dns.clone(), p("route53"));

    let a_term = leader(a.try_acquire().await.unwrap());
    through_a
        .apply(&plan(9_000), &ApplyOptions::default())
        .await
        .unwrap();
    // A follower's writes are refused before anything is sent.
    let refused = through_b
        .apply(&plan(1_000), &ApplyOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidRequest { provider, message }
            if provider.as_str() == "route53" && message.contains("does not hold the lease")),
        "{refused}"
    );

    // A stops renewing (paused, partitioned) right after a renewal; B keeps trying.
    let last = Instant::now();
    let b_term = loop {
        if let LeaseState::Leader(t) = b.try_acquire().await.unwrap() {
            break t;
        }
        assert!(
            last.elapsed() < TTL + Duration::from_secs(5),
            "B did not take over within the TTL + 5 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let takeover = last.elapsed();
    println!(
        "takeover after {:.2} s (ttl {} s)",
        takeover.as_secs_f64(),
        TTL.as_secs()
    );
    assert!(
        takeover >= TTL - Duration::from_millis(300),
        "B took the lease {takeover:?} after A's last renewal, before it aged out"
    );
    assert!(b_term.term > a_term.term, "{b_term} after {a_term}");

    // A wakes up mid-round: its write is fenced and the actuator keeps B's view of the world.
    through_b
        .apply(&plan(2_000), &ApplyOptions::default())
        .await
        .unwrap();
    let before = format!("{:?}", dns.current().await.unwrap());
    let fenced = through_a
        .apply(&plan(9_500), &ApplyOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&fenced, Error::InvalidRequest { message, .. }
            if message.contains("fenced") && message.contains("controller-b")),
        "{fenced}"
    );
    assert_eq!(format!("{:?}", dns.current().await.unwrap()), before);
    // Its next renewal finds out, and it follows.
    match a.try_acquire().await.unwrap() {
        LeaseState::Follower { holder } => assert_eq!(holder, b_term),
        LeaseState::Leader(t) => panic!("two leaders: {t} and {b_term}"),
    }
    assert_eq!(a.held(), None);
}

#[tokio::test]
async fn a_released_lease_is_taken_at_once() {
    let Some(server) = server() else { return };
    let a = lease(&server, "controller-a").await;
    let b = lease(&server, "controller-b").await;
    let a_term = leader(a.try_acquire().await.unwrap());
    a.release().await.unwrap();
    assert_eq!(a.held(), None);
    let t = Instant::now();
    let b_term = leader(b.try_acquire().await.unwrap());
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(b_term.term > a_term.term);
    // Releasing what one no longer holds changes nothing.
    a.release().await.unwrap();
    assert_eq!(b.current().await.unwrap(), Some(b_term));
}

#[tokio::test]
async fn a_server_that_is_down_is_an_error_and_nothing_is_written_unfenced() {
    let Some(mut server) = server() else { return };
    let a = lease(&server, "controller-a").await;
    let dns = MemorySteerer::new();
    let through_a = FencedSteerer::new(a.clone(), Arc::new(dns.clone()), p("route53"));
    leader(a.try_acquire().await.unwrap());
    let before = format!("{:?}", dns.current().await.unwrap());
    server.stop();
    let t = Instant::now();
    let err = a.try_acquire().await.unwrap_err();
    assert!(matches!(err, LeaseError::Unavailable { .. }), "{err}");
    let refused = through_a
        .apply(&plan(5_000), &ApplyOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidRequest { message, .. } if message.contains("unavailable")),
        "{refused}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "a down server took {:?} to report",
        t.elapsed()
    );
    assert_eq!(format!("{:?}", dns.current().await.unwrap()), before);
    // Back with its store: the client reconnects and the lease is held again.
    server.restart().unwrap();
    let mut back = None;
    for _ in 0..50 {
        if let Ok(state) = a.try_acquire().await {
            back = Some(state);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        matches!(back, Some(LeaseState::Leader(_))),
        "after the restart: {back:?}"
    );
}

#[tokio::test]
async fn contenders_with_different_ttls_and_bad_names_are_refused() {
    let Some(server) = server() else { return };
    let _a = lease(&server, "controller-a").await;
    let client = async_nats::connect(server.url()).await.unwrap();
    let err = NatsLease::open(
        client.clone(),
        LeaseConfig::new("controller-b", Duration::from_secs(30)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, LeaseError::Config(m) if m.contains("use one ttl")),
        "{err}"
    );
    for config in [
        LeaseConfig::new("c", TTL).at("bad bucket", "controller"),
        LeaseConfig::new("c", TTL).at("multicdn-lease", "a.b"),
        LeaseConfig::new(" ", TTL),
        LeaseConfig::new("c", Duration::from_millis(500)),
    ] {
        let err = NatsLease::open(client.clone(), config.clone())
            .await
            .unwrap_err();
        assert!(matches!(err, LeaseError::Config(_)), "{config:?}: {err}");
    }
}
