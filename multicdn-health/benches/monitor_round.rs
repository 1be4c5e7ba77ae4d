//! One monitor round over 1,000 targets on loopback at concurrency 64.
//!
//! The edge answers every probe after 20 ms, so the ideal round is
//! 1,000 / 64 x 20 ms = 312.5 ms. Before criterion measures, a few rounds are timed and the
//! achieved time is printed against the ideal; the run fails if it is over 1.5x.
//!
//! `cargo bench -p multicdn-health --bench monitor_round -- --warm-up-time 1 --measurement-time 3`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::time::Duration;

use axum::response::IntoResponse;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use multicdn_core::{ProviderId, RegionId, Stopwatch, Target};
use multicdn_health::{HealthConfig, HttpProbe, Monitor};

const TARGETS: usize = 1_000;
const CONCURRENCY: usize = 64;
const LATENCY: Duration = Duration::from_millis(20);

/// A loopback edge on its own runtime and thread, answering after `LATENCY`.
fn start_edge() -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new().fallback(|| async {
                tokio::time::sleep(LATENCY).await;
                "ok healthy-v3\n".into_response()
            });
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

fn monitor(addr: std::net::SocketAddr) -> Monitor {
    let mut b = Monitor::builder(HealthConfig::default().with_quorum(1)).concurrency(CONCURRENCY);
    for i in 0..TARGETS {
        let provider = ProviderId::new(&format!("p{i:04}")).unwrap();
        let url = format!("http://{addr}/_health/{i}.txt");
        b = b.target(Target::new(provider, url, "healthy-v3").with_host("www.example.com"));
    }
    let probe = HttpProbe::builder(RegionId::new("bench").unwrap())
        .pool_idle_per_host(CONCURRENCY)
        .build()
        .unwrap();
    b.runner(probe).build().unwrap()
}

fn bench(c: &mut Criterion) {
    let addr = start_edge();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let m = monitor(addr);

    // The figure: achieved vs ideal, over a few rounds after one that opens the connections.
    let ideal = LATENCY.mul_f64(TARGETS as f64 / CONCURRENCY as f64);
    rt.block_on(async {
        let first = m.round_once().await;
        assert_eq!((first.observed, first.failed), (TARGETS, 0), "{:?}", first.events.first());
        let rounds = 5;
        let watch = Stopwatch::start();
        for _ in 0..rounds {
            let r = m.round_once().await;
            assert_eq!((r.observed, r.failed), (TARGETS, 0));
        }
        let per_round = watch.elapsed() / rounds;
        let ratio = per_round.as_secs_f64() / ideal.as_secs_f64();
        println!(
            "monitor round: {TARGETS} targets, concurrency {CONCURRENCY}, edge latency {LATENCY:?}: \
             {per_round:.1?} per round, ideal {ideal:.1?}, {ratio:.2}x ideal"
        );
        assert!(ratio <= 1.5, "a round took {ratio:.2}x the ideal (limit 1.5x)");
    });

    let mut group = c.benchmark_group("monitor");
    group.sample_size(10);
    group.throughput(Throughput::Elements(TARGETS as u64));
    group.bench_function("round_1000_targets_c64_20ms", |b| {
        b.to_async(&rt).iter(|| m.round_once());
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
