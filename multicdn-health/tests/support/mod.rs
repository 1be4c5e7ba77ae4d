//! Test runners and helpers shared by the integration tests; the edges are
//! `multicdn-test-support`'s [`EdgeServer`] (its module docs list what each path answers).

#![allow(dead_code, unused_imports, unreachable_pub, missing_docs)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support: failing loudly is the point

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use multicdn_core::{
    Clock, Error, FailReason, HealthCheck, ManualClock, Observation, Outcome, ProviderId, RegionId,
    Target,
};
use multicdn_health::{Edge, HttpProbe};
pub use multicdn_test_support::{EdgeServer, MARKER, SITE, SeenRequest};

/// An edge named `name` (its `Server-Timing` cdn) at PoP LHR, health marker [`MARKER`],
/// stripping cache tags (so two edges differ only where a test makes them).
pub async fn edge(name: &str) -> EdgeServer {
    let e = EdgeServer::start(name, "LHR", MARKER).await.unwrap();
    e.set_cache_tags(false);
    e
}

/// Two edges, fastly and cloudflare, and their [`Edge`]s in that order.
pub async fn two_edges() -> (EdgeServer, EdgeServer, Vec<Edge>) {
    let fastly = edge("fastly").await;
    let cloudflare = edge("cloudflare").await;
    let edges = vec![
        Edge::new(id("fastly"), &fastly.base_url()).unwrap(),
        Edge::new(id("cloudflare"), &cloudflare.base_url()).unwrap(),
    ];
    (fastly, cloudflare, edges)
}

/// A port nothing listens on.
pub async fn dead_port_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

pub fn id(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

pub fn region(s: &str) -> RegionId {
    RegionId::new(s).unwrap()
}

pub const REGIONS: [&str; 5] = ["eu-west", "us-east", "us-west", "ap-southeast", "sa-east"];

/// A real HTTP probe whose network path to the edges is broken: every target's URL is sent to
/// `base` instead (a dead port, say). The runner in a region having a bad minute.
#[derive(Debug)]
pub struct BrokenPath {
    pub probe: HttpProbe,
    pub base: String,
}

#[async_trait]
impl HealthCheck for BrokenPath {
    async fn check(&self, target: &Target) -> Result<Observation, Error> {
        let mut t = target.clone();
        let path = t.url.splitn(4, '/').nth(3).unwrap_or_default().to_owned();
        t.url = format!("{}/{path}", self.base);
        self.probe.check(&t).await
    }
}

/// A runner without I/O, for loop and quorum scenarios on paused time: it fails the providers
/// named in `failing` and passes the rest, stamping with `clock`.
#[derive(Debug, Clone)]
pub struct FakeRunner {
    pub region: RegionId,
    pub clock: ManualClock,
    pub failing: Arc<Mutex<BTreeSet<ProviderId>>>,
    pub calls: Arc<AtomicUsize>,
}

impl FakeRunner {
    pub fn new(region: &str, clock: &ManualClock) -> FakeRunner {
        FakeRunner {
            region: RegionId::new(region).unwrap(),
            clock: clock.clone(),
            failing: Arc::default(),
            calls: Arc::default(),
        }
    }

    pub fn fail(&self, provider: &ProviderId, failing: bool) {
        let mut f = self.failing.lock().unwrap();
        if failing {
            f.insert(provider.clone());
        } else {
            f.remove(provider);
        }
    }
}

#[async_trait]
impl HealthCheck for FakeRunner {
    async fn check(&self, target: &Target) -> Result<Observation, Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let outcome = if self.failing.lock().unwrap().contains(&target.provider) {
            Outcome::Fail {
                reason: FailReason::Status { got: 503 },
            }
        } else {
            Outcome::Pass
        };
        Ok(Observation::new(
            target.provider.clone(),
            self.region.clone(),
            self.clock.now(),
            outcome,
            Duration::from_millis(25),
        ))
    }
}
