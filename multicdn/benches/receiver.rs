//! The beacon receiver over real HTTP/1.1 keep-alive on loopback: one core serving (a
//! current-thread runtime), the load generator on the other.
//!
//! What every beacon goes through is what production sees: a trusted proxy's
//! `X-Forwarded-For` naming one of 100,000 clients (so the per-client limit, 10 a second with
//! bursts of 30, is in play and never hit), the `Origin` check, a body cap, network resolution
//! through a routing-table-like prefix table (250,000 nested IPv4 prefixes /8 to /24 and
//! 50,000 IPv6), the duplicate check on a unique id, and the scoreboard insert, on a mix of
//! navigation beacons (varied paths, providers, PoPs, cache states, heavy-tailed times) and
//! probe beacons (both forms, failed fetches among them), with the wall clock moving.
//!
//! ```text
//! cargo bench -p multicdn --features service --bench receiver
//! ```
//!
//! `throughput` is the closed-loop rate (64 connections, each sending as soon as the previous
//! answer arrives); the line after it divides the beacons sent by the server thread's own CPU
//! time (from /proc), the rate per server core whatever the load generator costs. Then an open
//! loop at 10,000, 25,000 and 50,000 beacons a second for 3 s each prints p50/p99/max of the
//! time from each beacon's scheduled send to its answer (so a stall counts against every
//! beacon it delays; the generator's own delays count too: it shares the machine).

// A benchmark measures wall time: Instant::now is what it is for.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    missing_docs
)]

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use multicdn::prelude::*;
use multicdn::service::{ClientLimit, ServeLimits, Service, ServiceConfig};
use multicdn::steering::beacon::ClientNetwork;
use multicdn::steering::resolve::PrefixTable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const POLICY: &str = include_str!("../../examples/policy.yaml");
const CONNECTIONS: usize = 64;
const CLIENTS: u32 = 100_000;
const COUNTRIES: [&str; 12] = [
    "US", "GB", "DE", "FR", "JP", "AU", "BR", "IN", "CA", "NL", "SG", "ES",
];

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn prefixes() -> PrefixTable {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut b = PrefixTable::builder();
    let net = |rng: &mut Rng| {
        let asn = 1 + rng.below(60_000) as u32;
        let c = COUNTRIES[rng.below(COUNTRIES.len() as u64) as usize];
        ClientNetwork::new(Some(asn), Some(Country::new(c).unwrap()))
    };
    // Covering /8s to /16s, then the bulk of /24s inside them, as a routing table has.
    for _ in 0..2_000 {
        let len = 8 + rng.below(9);
        let a = rng.below(224) as u8;
        b.insert(&format!("{a}.{}.0.0/{len}", rng.below(256)), net(&mut rng))
            .unwrap();
    }
    for _ in 0..248_000 {
        let len = 17 + rng.below(8);
        let ip = rng.below(1 << 32) as u32 & !((1u32 << (32 - len)) - 1);
        let ip = std::net::Ipv4Addr::from(ip);
        b.insert(&format!("{ip}/{len}"), net(&mut rng)).unwrap();
    }
    for _ in 0..50_000 {
        let len = [32u64, 36, 40, 44, 48][rng.below(5) as usize];
        let hi = (0x2000u128 | u128::from(rng.below(0x1000))) << 112 | u128::from(rng.next()) << 48;
        let mask = !((1u128 << (128 - len)) - 1);
        let ip = std::net::Ipv6Addr::from(hi & mask);
        b.insert(&format!("{ip}/{len}"), net(&mut rng)).unwrap();
    }
    b.build()
}

/// The clients the proxy forwards for: addresses spread over the table.
fn clients() -> Vec<String> {
    let mut rng = Rng(42);
    (0..CLIENTS)
        .map(|_| {
            if rng.below(5) == 0 {
                format!(
                    "2{:03x}:{:x}::{:x}",
                    rng.below(0x1000),
                    rng.below(0x10000),
                    rng.below(0xffff)
                )
            } else {
                std::net::Ipv4Addr::from(rng.below(224 << 24) as u32).to_string()
            }
        })
        .collect()
}

/// The server thread's id, for reading its CPU time from /proc.
static SERVER_TID: AtomicU64 = AtomicU64::new(0);

/// CPU time (user + system) the server thread has used, from /proc (Linux; ticks of 10 ms).
fn server_cpu() -> Option<Duration> {
    let tid = SERVER_TID.load(Ordering::Relaxed);
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

fn start_server() -> (SocketAddr, Service) {
    let policy = Policy::from_yaml(POLICY, "policy.yaml").unwrap();
    let controller = Controller::builder(policy.clone())
        .resolver(prefixes())
        .interval(std::time::Duration::from_secs(
            std::env::var("ROUND_S")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(30),
        ))
        .build()
        .unwrap();
    let config = ServiceConfig::for_policy(&policy)
        .trusted_proxies(["127.0.0.0/8".parse().unwrap()])
        .client_limit(ClientLimit {
            per_second: NonZeroU32::new(10).unwrap(),
            burst: NonZeroU32::new(30).unwrap(),
            buckets: 1 << 17,
        });
    let service = Service::new(controller, config);
    let observed = service.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Some(tid) = std::fs::read_to_string("/proc/thread-self/stat")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|t| t.parse().ok()))
        {
            SERVER_TID.store(tid, Ordering::Relaxed);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let rounds = service.clone();
            tokio::spawn(async move { rounds.run(std::future::pending()).await });
            service
                .serve(listener, ServeLimits::default(), std::future::pending())
                .await
                .unwrap();
        });
    });
    (addr, observed)
}

/// The controller rounds run so far on the server thread and the time they took (a round
/// holds the thread, and the scoreboard, while it reads the board).
fn rounds(service: &Service) -> (u64, f64) {
    let text = service.metrics_text();
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (
        value("multicdn_round_duration_seconds_count") as u64,
        value("multicdn_round_duration_seconds_sum"),
    )
}

/// Builds one request: a navigation beacon (60%) or a probe beacon, from client `client`.
fn request(out: &mut Vec<u8>, rng: &mut Rng, id: u64, clients: &[String]) {
    let client = &clients[rng.below(clients.len() as u64) as usize];
    let mut body = String::with_capacity(200);
    let heavy = |rng: &mut Rng, typical: f64| typical * (1.0 + 0.8 * -(1.0 - rng.unit()).ln());
    if rng.below(10) < 6 {
        let provider = if rng.below(3) == 0 {
            "cloudflare"
        } else {
            "fastly"
        };
        let cache = ["HIT", "HIT", "HIT", "MISS", "PASS"][rng.below(5) as usize];
        let pop = ["LHR", "FRA", "IAD", "NRT", "SYD", "GRU"][rng.below(6) as usize];
        let _ = write!(
            body,
            r#"{{"id":"{id:016x}","path":"/products/{}/{}","ttfb":{},"provider":"{provider}","pop":"{pop}","cache":"{cache}"}}"#,
            rng.below(5000),
            ["reviews", "gallery", "", "sizes"][rng.below(4) as usize],
            heavy(rng, 60.0).round()
        );
        out.extend_from_slice(b"POST /rum/nav HTTP/1.1\r\n");
    } else {
        let f = heavy(rng, 55.0);
        let c = if rng.below(50) == 0 {
            "null".to_owned()
        } else {
            format!("{:.1}", heavy(rng, 58.0))
        };
        if rng.below(2) == 0 {
            let _ = write!(
                body,
                r#"{{"id":"{id:016x}","times":{{"fastly":{f:.1},"cloudflare":{c}}},"best":"fastly"}}"#
            );
        } else {
            let _ = write!(
                body,
                r#"{{"id":"{id:016x}","times":[{c},{f:.1}],"best":"cloudflare"}}"#
            );
        }
        out.extend_from_slice(b"POST /rum/cdn HTTP/1.1\r\n");
    }
    let _ = write!(
        AsString(out),
        "Host: rum.example.com\r\nOrigin: https://www.example.com\r\nContent-Type: text/plain;charset=UTF-8\r\nX-Forwarded-For: {client}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
}

struct AsString<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for AsString<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Reads one response; its status. Kept cheap: the load generator shares the machine.
async fn response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> u16 {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = &buf[..end];
            let status = head
                .get(9..12)
                .and_then(|s| std::str::from_utf8(s).ok())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let len = head
                .split(|&b| b == b'\n')
                .find_map(|line| {
                    let (name, value) = line.split_at(line.iter().position(|&b| b == b':')?);
                    name.eq_ignore_ascii_case(b"content-length").then(|| {
                        std::str::from_utf8(&value[1..])
                            .ok()?
                            .trim()
                            .parse::<usize>()
                            .ok()
                    })?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                buf.drain(..end + 4 + len);
                return status;
            }
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Requests generated up front (the load generator only writes and reads). More than the
/// receiver remembers ids for, so a request sent again is a new beacon to it.
const POOL: usize = 1 << 18;

struct Pool {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Pool {
    fn new() -> Pool {
        let clients = clients();
        let mut rng = Rng(7);
        let (mut bytes, mut ends) = (Vec::with_capacity(POOL * 420), Vec::with_capacity(POOL));
        for id in 0..POOL as u64 {
            request(&mut bytes, &mut rng, id, &clients);
            ends.push(bytes.len());
        }
        Pool { bytes, ends }
    }

    fn get(&self, i: usize) -> &[u8] {
        let i = i % self.ends.len();
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }
}

struct Load {
    rt: tokio::runtime::Runtime,
    conns: Vec<TcpStream>,
    pool: Arc<Pool>,
    next: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    sent: u64,
    server_cpu: Duration,
}

impl Load {
    fn new(addr: SocketAddr) -> Load {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let conns = rt.block_on(async {
            let mut v = Vec::new();
            for _ in 0..CONNECTIONS {
                let s = TcpStream::connect(addr).await.unwrap();
                s.set_nodelay(true).unwrap();
                v.push(s);
            }
            v
        });
        Load {
            rt,
            conns,
            pool: Arc::new(Pool::new()),
            next: Arc::new(AtomicU64::new(0)),
            refused: Arc::new(AtomicU64::new(0)),
            sent: 0,
            server_cpu: Duration::ZERO,
        }
    }

    /// Sends `n` beacons closed-loop over every connection; the time taken.
    fn closed(&mut self, n: u64) -> Duration {
        let conns = std::mem::take(&mut self.conns);
        let per = n.div_ceil(conns.len() as u64);
        let (pool, next, refused) = (self.pool.clone(), self.next.clone(), self.refused.clone());
        let cpu_before = server_cpu();
        let (elapsed, conns) = self.rt.block_on(async move {
            let started = Instant::now();
            let tasks: Vec<_> = conns
                .into_iter()
                .map(|mut s| {
                    let (pool, next, refused) = (pool.clone(), next.clone(), refused.clone());
                    tokio::spawn(async move {
                        let mut buf = Vec::with_capacity(4096);
                        for _ in 0..per {
                            let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                            s.write_all(pool.get(i)).await.unwrap();
                            if response(&mut s, &mut buf).await != 204 {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        s
                    })
                })
                .collect();
            let mut back = Vec::new();
            for t in tasks {
                back.push(t.await.unwrap());
            }
            (started.elapsed(), back)
        });
        self.conns = conns;
        self.sent += per * CONNECTIONS as u64;
        if let (Some(a), Some(b)) = (cpu_before, server_cpu()) {
            self.server_cpu += b.saturating_sub(a);
        }
        // Each connection sent `per`; report the time for `n`.
        elapsed.mul_f64(n as f64 / (per * CONNECTIONS as u64) as f64)
    }

    /// Sends at `rate` a second for `secs`, open loop; for each beacon the time from its
    /// scheduled send, and from its actual send (the generator's timer wakes up to a
    /// millisecond late), to its answer.
    fn open(&mut self, rate: u64, secs: u64) -> Vec<(Duration, Duration)> {
        let conns = std::mem::take(&mut self.conns);
        let per_conn = rate * secs / conns.len() as u64;
        let gap = Duration::from_secs_f64(conns.len() as f64 / rate as f64);
        let (pool, next) = (self.pool.clone(), self.next.clone());
        let (lat, conns) = self.rt.block_on(async move {
            let t0 = tokio::time::Instant::now();
            let tasks: Vec<_> = conns
                .into_iter()
                .enumerate()
                .map(|(i, mut s)| {
                    let (pool, next) = (pool.clone(), next.clone());
                    tokio::spawn(async move {
                        let mut buf = Vec::new();
                        let mut lat = Vec::with_capacity(per_conn as usize);
                        let offset = gap.mul_f64(i as f64 / CONNECTIONS as f64);
                        for k in 0..per_conn {
                            let due = t0 + offset + gap * k as u32;
                            tokio::time::sleep_until(due).await;
                            let j = next.fetch_add(1, Ordering::Relaxed) as usize;
                            let sent = tokio::time::Instant::now();
                            s.write_all(pool.get(j)).await.unwrap();
                            response(&mut s, &mut buf).await;
                            lat.push((due.elapsed(), sent.elapsed()));
                        }
                        (lat, s)
                    })
                })
                .collect();
            let (mut all, mut back) = (Vec::new(), Vec::new());
            for t in tasks {
                let (l, s) = t.await.unwrap();
                all.extend(l);
                back.push(s);
            }
            (all, back)
        });
        self.conns = conns;
        lat
    }
}

fn main() {
    let (addr, service) = start_server();
    let mut load = Load::new(addr);
    // `RECEIVER_PROFILE=n`: only `n` beacons closed-loop, for a profiler (callgrind counts
    // the server thread's instructions per beacon whatever else the machine runs).
    if let Some(n) = std::env::var("RECEIVER_PROFILE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let took = load.closed(n);
        println!(
            "profile: {} beacons in {took:?}, refused {}",
            load.sent,
            load.refused.load(Ordering::Relaxed)
        );
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("receiver");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    g.bench_function("beacons over HTTP/1.1 keep-alive (1 server core)", |b| {
        b.iter_custom(|iters| load.closed(iters));
    });
    g.finish();
    let refused = load.refused.load(Ordering::Relaxed);
    println!("refused during the throughput run (rate limit or otherwise): {refused}");
    if !load.server_cpu.is_zero() {
        println!(
            "per server core: {} beacons in {:.2} s of the server thread's CPU time = {:.0} beacons/s per core",
            load.sent,
            load.server_cpu.as_secs_f64(),
            load.sent as f64 / load.server_cpu.as_secs_f64()
        );
    }

    for rate in [10_000, 25_000, 50_000] {
        let (rounds_before, _) = rounds(&service);
        let lat = load.open(rate, 3);
        let (rounds_after, _) = rounds(&service);
        let report = |mut v: Vec<Duration>| {
            v.sort_unstable();
            let q = |p: f64| v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;
            format!(
                "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                q(0.5),
                q(0.99),
                q(1.0)
            )
        };
        println!(
            "latency at {rate}/s (open loop, {} beacons, {} controller rounds ended in the phase): from the scheduled send {}; from the actual send {}",
            lat.len(),
            rounds_after - rounds_before,
            report(lat.iter().map(|l| l.0).collect()),
            report(lat.iter().map(|l| l.1).collect()),
        );
    }
    let (n, secs) = rounds(&service);
    println!(
        "controller rounds on the server thread (every 30 s, ROUND_S): {n}, {secs:.2} s in all"
    );
    c.final_summary();
}
