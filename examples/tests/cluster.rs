//! Two `serve --nats` processes, one steering, against a real `nats-server -js`, the NS1
//! emulator, the purge emulators and two emulated edges, all on loopback.
//!
//! The leader is killed (`SIGKILL`) in the middle of a failover: the standby takes over once
//! the lease ages out and goes on from the failover's step; every round is journaled once,
//! with no gap, under the term that ran it, and each plan change reached NS1 exactly once.
//! Then the new leader is paused (`SIGSTOP`) past its lease, a third process takes over and
//! walks the recovered provider back, and the paused one, resumed, writes nothing more.
//!
//! Without `nats-server` the test says it is skipped; with `CI` set it fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Leases expire in real time: the test waits in real time.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use multicdn::ApplyOutcome;
use multicdn::RoundRecord;
use multicdn::leader::{SharedStore, StoreConfig};
use multicdn_core::{Clock, SteeringPlan, SystemClock};
use multicdn_test_support::{EdgeServer, NatsServer, Ns1Api, PurgeApi};

const KEY: &str = "ns1-test-key";
const TTL: &str = "2s";

/// `target/<profile>/examples/serve`, from this test's own path.
fn serve_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    profile_dir
        .join("examples")
        .join(format!("serve{}", std::env::consts::EXE_SUFFIX))
}

/// The example policy with a failover whose second step comes 8 s after the first, on `zone`.
fn policy(dir: &Path, zone: &str) -> PathBuf {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/policy.yaml"))
        .unwrap()
        .replace("    interval: 90s", "    interval: 8s")
        .replace("record: www.example.com", &format!("record: www.{zone}"))
        .replace("zone: example.com", &format!("zone: {zone}"));
    assert!(text.contains("interval: 8s"), "the failover interval moved");
    let path = dir.join("policy.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The DNS both controllers write to.
enum Dns {
    /// The NS1 emulator (test-support), which counts record writes.
    Ns1(Ns1Api),
    /// Route 53 in moto, whose request recorder counts change batches.
    Route53 { endpoint: String, zone_id: String },
}

impl Dns {
    fn args(&self) -> Vec<String> {
        match self {
            Dns::Ns1(api) => ["--dns", "ns1", "--dns-endpoint", &api.base_url()]
                .map(str::to_owned)
                .to_vec(),
            Dns::Route53 { endpoint, zone_id } => [
                "--dns",
                "route53",
                "--dns-endpoint",
                endpoint,
                "--zone-id",
                zone_id,
            ]
            .map(str::to_owned)
            .to_vec(),
        }
    }

    fn actuator(&self) -> &'static str {
        match self {
            Dns::Ns1(_) => "ns1",
            Dns::Route53 { .. } => "route53",
        }
    }

    /// Writes of a plan the vendor took since the test began.
    async fn writes(&self) -> u64 {
        match self {
            Dns::Ns1(api) => api.writes(),
            Dns::Route53 { endpoint, zone_id } => {
                let text = reqwest::get(format!("{endpoint}/moto-api/recorder/download-recording"))
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
                text.lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .filter(|r| r["method"] == "POST")
                    .filter(|r| {
                        r["url"].as_str().is_some_and(|u| {
                            u.contains(zone_id.as_str())
                                && u.trim_end_matches('/').ends_with("/rrset")
                        })
                    })
                    .count() as u64
            }
        }
    }
}

/// Route 53 in moto (`MULTICDN_MOTO_ENDPOINT`, started by `.ci/run`): a zone of its own made by
/// the `steer` tool, then moto's request recorder started. `None` (skipped) without moto
/// outside CI.
async fn route53(dir: &Path, zone: &str) -> Option<Dns> {
    let endpoint = match std::env::var("MULTICDN_MOTO_ENDPOINT") {
        Ok(e) if !e.is_empty() => e,
        _ => {
            assert!(
                !std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false"),
                "MULTICDN_MOTO_ENDPOINT is not set in CI: .ci/run must start moto"
            );
            use std::io::Write as _;
            let _ = std::io::stderr().write_all(b"skipped: MULTICDN_MOTO_ENDPOINT not set\n");
            return None;
        }
    };
    let steer = serve_binary().with_file_name(format!("steer{}", std::env::consts::EXE_SUFFIX));
    let out = Command::new(steer)
        .args(["apply", "--policy", policy(dir, zone).to_str().unwrap()])
        .args([
            "--vendor",
            "route53",
            "--endpoint",
            &endpoint,
            "--create-zone",
        ])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env_remove("AWS_SESSION_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "steer --create-zone: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let zone_id = text
        .lines()
        .find_map(|l| l.strip_prefix("created hosted zone "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no zone id in {text}"))
        .to_owned();
    let client = reqwest::Client::new();
    for step in ["reset-recording", "start-recording"] {
        let r = client
            .post(format!("{endpoint}/moto-api/recorder/{step}"))
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "moto recorder {step}: {}",
            r.status()
        );
    }
    Some(Dns::Route53 { endpoint, zone_id })
}

struct World<'a> {
    nats: NatsServer,
    dns: &'a Dns,
    purge: PurgeApi,
    fastly: EdgeServer,
    cloudflare: EdgeServer,
    dir: tempfile::TempDir,
    policy: PathBuf,
}

/// A `serve` process, killed when dropped.
struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

/// Navigation beacons to every process's receiver, five a second each, so the loop has fresh
/// evidence (without any, the deadman holds the static weights).
fn feed_beacons(processes: Arc<Mutex<Vec<String>>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let mut n = 0u64;
        loop {
            let bases = processes.lock().unwrap().clone();
            for base in bases {
                n += 1;
                let provider = if n.is_multiple_of(3) {
                    "cloudflare"
                } else {
                    "fastly"
                };
                let body = format!(
                    r#"{{"id":"t-{n}","path":"/","ttfb":{},"provider":"{provider}","pop":"","cache":"HIT"}}"#,
                    40 + n % 20
                );
                let request = client
                    .post(format!("{base}/rum/nav"))
                    .header("content-type", "text/plain;charset=UTF-8")
                    .header("origin", "https://www.example.com")
                    .body(body);
                // A paused process does not answer: never wait for it here.
                tokio::spawn(async move {
                    let _ = request.send().await;
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    /// Whether it stopped by itself (it should not, but for a signal).
    fn exited(&self) -> bool {
        let pid = self.child.id();
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.split_whitespace().nth(2) == Some("Z"))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its public base URL, from what it printed at start. Waits on the runtime's timer, not
    /// the thread: the emulated vendors this process calls run on the same runtime.
    async fn public(&self) -> String {
        for _ in 0..200 {
            if let Some(line) = self
                .log()
                .lines()
                .find(|l| l.trim_start().starts_with("dashboard "))
            {
                let url = line.trim_start().trim_start_matches("dashboard").trim();
                return url.trim_end_matches("/dashboard/").to_owned();
            }
            assert!(!self.exited(), "{} stopped:\n{}", self.name, self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{} printed no dashboard URL:\n{}", self.name, self.log());
    }

    fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} {}", self.name);
    }
}

impl World<'_> {
    fn start(&self, name: &str) -> Process {
        let log = self.dir.path().join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(serve_binary())
            .args(["--policy", self.policy.to_str().unwrap()])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(self.dns.args())
            .args(["--fastly-api", &self.purge.fastly_base()])
            .args(["--cloudflare-api", &self.purge.cloudflare_base()])
            .args(["--edge", &format!("fastly={}", self.fastly.base_url())])
            .args([
                "--edge",
                &format!("cloudflare={}", self.cloudflare.base_url()),
            ])
            .args(["--nats", &self.nats.url(), "--name", name])
            .args(["--lease-ttl", TTL, "--interval", "300ms"])
            .env("NS1_API_KEY", KEY)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env_remove("AWS_SESSION_TOKEN")
            .env("FASTLY_API_TOKEN", "fastly-token")
            .env("CLOUDFLARE_API_TOKEN", "cloudflare-token")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Process {
            name: name.to_owned(),
            child,
            log,
        }
    }
}

/// The journal and the plan in force, as the shared store holds them.
async fn shared(store: &SharedStore) -> (Vec<RoundRecord>, Option<SteeringPlan>) {
    match store.load().await.unwrap() {
        Some(l) => (l.saved.journal, Some(l.saved.state.plan)),
        None => (Vec::new(), None),
    }
}

/// Polls the shared store until `done` holds, for at most `within`.
async fn until(
    store: &SharedStore,
    procs: &[&Process],
    within: Duration,
    what: &str,
    done: impl Fn(&[RoundRecord], u32) -> bool,
) -> Vec<RoundRecord> {
    let started = Instant::now();
    loop {
        let (j, plan) = shared(store).await;
        let fastly = plan.as_ref().map_or(u32::MAX, europe_fastly);
        if done(&j, fastly) {
            return j;
        }
        let exited = procs.iter().any(|p| p.exited());
        if exited || started.elapsed() >= within {
            let logs: Vec<String> = procs
                .iter()
                .map(|p| format!("--- {} ---\n{}", p.name, p.log()))
                .collect();
            panic!(
                "{what}: not within {within:?}; fastly in europe at {fastly}, journal ends {:?}\n{}",
                j.last(),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Fastly's share of Europe in a plan (basis points).
fn europe_fastly(plan: &SteeringPlan) -> u32 {
    plan.cohort(&"europe".parse().unwrap())
        .unwrap()
        .weights
        .get(&"fastly".parse().unwrap())
}

/// Rounds whose plan `actuator` was written with.
fn journaled_writes(j: &[RoundRecord], actuator: &str) -> u64 {
    j.iter()
        .flat_map(|r| &r.applied)
        .filter(|a| a.actuator == actuator)
        .filter(|a| matches!(a.outcome, ApplyOutcome::Applied { changes, .. } if changes > 0))
        .count() as u64
}

fn assert_journal_whole(j: &[RoundRecord]) {
    let rounds: Vec<u64> = j.iter().map(|r| r.round).collect();
    let expected: Vec<u64> = (1..=j.len() as u64).collect();
    assert_eq!(rounds, expected, "the journal has a gap or a duplicate");
    assert!(j.iter().all(|r| r.term.is_some()), "a round without a term");
    let terms: Vec<u64> = j.iter().filter_map(|r| r.term).collect();
    assert!(
        terms.windows(2).all(|w| w[0] <= w[1]),
        "a deposed leader's round after its successor's: {terms:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_ns1_one_of_two_processes_steers_and_a_killed_or_paused_leader_hands_over_cleanly() {
    let Some(nats) = NatsServer::start_or_skip("the cluster test").unwrap() else {
        return;
    };
    let ns1 = Ns1Api::start(KEY).await.unwrap();
    ns1.create_zone("example.com");
    let dir = tempfile::tempdir().unwrap();
    let policy = policy(dir.path(), "example.com");
    handover(nats, Dns::Ns1(ns1), dir, policy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_route53_one_of_two_processes_steers_and_a_killed_or_paused_leader_hands_over_cleanly() {
    let Some(nats) = NatsServer::start_or_skip("the cluster test").unwrap() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let zone = format!("cluster-{}.example.com", std::process::id());
    let Some(dns) = route53(dir.path(), &zone).await else {
        return;
    };
    let policy = policy(dir.path(), &zone);
    handover(nats, dns, dir, policy).await;
}

async fn handover(nats: NatsServer, dns: Dns, dir: tempfile::TempDir, policy: PathBuf) {
    handover_on(nats, &dns, dir, policy).await;
    if let Dns::Route53 { endpoint, .. } = &dns {
        let _ = reqwest::Client::new()
            .post(format!("{endpoint}/moto-api/recorder/stop-recording"))
            .send()
            .await;
    }
}

async fn handover_on(nats: NatsServer, dns: &Dns, dir: tempfile::TempDir, policy: PathBuf) {
    let world = World {
        policy,
        nats,
        dns,
        purge: PurgeApi::start().await.unwrap(),
        fastly: EdgeServer::start("fastly", "LHR", "healthy-v3")
            .await
            .unwrap(),
        cloudflare: EdgeServer::start("cloudflare", "AMS", "healthy-v3")
            .await
            .unwrap(),
        dir,
    };
    let client = async_nats::connect(world.nats.url()).await.unwrap();
    let store = SharedStore::open(client, StoreConfig::default())
        .await
        .unwrap();

    let receivers = Arc::new(Mutex::new(Vec::new()));
    let feeder = feed_beacons(receivers.clone());
    let a = world.start("a");
    // Read before the lock is taken: the beacon feeder takes it on a runtime thread.
    let url = a.public().await;
    receivers.lock().unwrap().push(url);
    let j = until(&store, &[&a], Duration::from_secs(30), "a leads", |j, _| {
        j.len() >= 2
    })
    .await;
    let a_term = j[0].term.unwrap();
    let b = world.start("b");
    let url = b.public().await;
    receivers.lock().unwrap().push(url);
    // Fastly's edge fails its health object: quorum down after two rounds, then the failover's
    // first step (50%), its second 8 s later.
    tokio::time::sleep(Duration::from_secs(1)).await;
    world.fastly.set_healthy(false);
    let j = until(
        &store,
        &[&a, &b],
        Duration::from_secs(20),
        "the first step",
        |_, fastly| fastly == 4_500,
    )
    .await;
    assert!(
        j.iter().all(|r| r.term == Some(a_term)),
        "b ran a round while a led"
    );
    let killed_at = SystemClock.now();
    a.signal("-KILL");
    let killed_round = j.last().unwrap().round;

    let j = until(
        &store,
        &[&b],
        Duration::from_secs(20),
        "b takes over and finishes the failover",
        |j, fastly| j.iter().any(|r| r.term != Some(a_term)) && fastly == 0,
    )
    .await;
    assert_journal_whole(&j);
    let first_b = j.iter().find(|r| r.term != Some(a_term)).unwrap();
    let b_term = first_b.term.unwrap();
    let takeover_ms = first_b.at.as_millis().saturating_sub(killed_at.as_millis());
    println!("takeover after a kill: {takeover_ms} ms (lease ttl {TTL})");
    assert!(
        takeover_ms < 2_000 + 1_500,
        "takeover took {takeover_ms} ms"
    );
    assert!(
        first_b.takeover.is_some(),
        "b's first round records the takeover"
    );
    assert!(
        first_b
            .out
            .contains_key(&multicdn_core::ProviderId::new("fastly").unwrap()),
        "b's first round holds fastly out from a's ledger (a fresh start would wait for its own probes)"
    );
    assert!(first_b.round <= killed_round + 2);
    assert_eq!(
        world.dns.writes().await,
        journaled_writes(&j, world.dns.actuator()),
        "each plan change written once"
    );

    // Pause b past its lease; c takes over; fastly recovers meanwhile and c walks it back.
    let c = world.start("c");
    let url = c.public().await;
    receivers.lock().unwrap().push(url);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let paused_at = SystemClock.now();
    b.signal("-STOP");
    world.fastly.set_healthy(true);
    let j = until(
        &store,
        &[&b, &c],
        Duration::from_secs(30),
        "c takes over and walks fastly back",
        |j, fastly| j.iter().any(|r| r.term.is_some_and(|t| t > b_term)) && fastly > 0,
    )
    .await;
    let first_c = j
        .iter()
        .find(|r| r.term.is_some_and(|t| t > b_term))
        .unwrap();
    let c_term = first_c.term.unwrap();
    let pause_takeover_ms = first_c.at.as_millis().saturating_sub(paused_at.as_millis());
    println!("takeover after a pause: {pause_takeover_ms} ms (lease ttl {TTL})");
    b.signal("-CONT");
    // Let b wake, find itself deposed, and (were it not fenced) write its stale plan.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (j, plan) = shared(&store).await;
    assert_journal_whole(&j);
    let first_c_round = j.iter().find(|r| r.term == Some(c_term)).unwrap().round;
    assert!(
        j.iter()
            .filter(|r| r.round > first_c_round)
            .all(|r| r.term == Some(c_term)),
        "a round by the paused leader after its successor's first"
    );
    assert_eq!(
        world.dns.writes().await,
        journaled_writes(&j, world.dns.actuator()),
        "a write NS1 got that no journaled round made"
    );
    let log = b.log();
    assert!(
        log.contains("lease lapsed") || log.contains("not leading") || log.contains("fenced"),
        "the paused leader does not say it was deposed:\n{log}"
    );
    let plan = plan.unwrap();
    assert!(europe_fastly(&plan) > 0, "c walked fastly back");
    drop(c);
    feeder.abort();
}
