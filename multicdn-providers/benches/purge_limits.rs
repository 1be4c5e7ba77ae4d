//! Purging 4,000 tags on Fastly and Cloudflare (Pro) against a loopback server that enforces
//! the documented limits as token buckets and answers 429 past them. Prints, for the parallel
//! fan-out and the queued mode, the time achieved, the ideal time the limits allow, and the
//! 429s provoked; exits 1 if any run provoked a 429 or took more than 10% over the ideal.
//!
//! `cargo bench -p multicdn-providers --bench purge_limits`

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub,
    dead_code
)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use multicdn_core::policy::CloudflarePlan;
use multicdn_core::{ProviderId, PurgeRequest, Secret};
use multicdn_providers::cloudflare::{CloudflareLimits, CloudflarePurger};
use multicdn_providers::fanout::{FanoutMember, FanoutReport, PurgeFanout};
use multicdn_providers::fastly::FastlyPurger;
use multicdn_providers::http::HttpSettings;
use multicdn_test_support::{PurgeApi, PurgeLimits};

const TAGS: usize = 4_000;
const RUNS: usize = 2;

fn fanout(server: &PurgeApi) -> PurgeFanout {
    let settings = HttpSettings::default();
    let fastly = FastlyPurger::new(
        ProviderId::new("fastly").unwrap(),
        "example.map.fastly.net",
        "SU1Z0isxPaozGVKXdv0eY",
        Secret::new("bench-fastly-token"),
        &server.fastly_base(),
        settings.clone(),
    )
    .unwrap();
    let cloudflare = CloudflarePurger::new(
        ProviderId::new("cloudflare").unwrap(),
        "www.example.com.cdn.cloudflare.net",
        "023e105f4ecef8ad9ca31a8372d0c353",
        Secret::new("bench-cloudflare-token"),
        CloudflareLimits::for_plan(CloudflarePlan::Pro),
        &server.cloudflare_base(),
        settings,
    )
    .unwrap();
    PurgeFanout::new(vec![
        FanoutMember::new(Arc::new(fastly)),
        FanoutMember::new(Arc::new(cloudflare)),
    ])
}

struct Run {
    mode: &'static str,
    report: FanoutReport,
    too_many: u64,
}

async fn run(mode: &'static str) -> Run {
    // A fresh server and fresh purgers: both sides start with full buckets.
    let server = PurgeApi::start_limited(PurgeLimits::documented_pro())
        .await
        .expect("a loopback purge API");
    let fanout = fanout(&server);
    let tags: Vec<String> = (0..TAGS).map(|i| format!("product-{i:05}")).collect();
    let request = PurgeRequest::tags(tags);
    let report = match mode {
        "parallel" => fanout.purge(&request).await,
        _ => fanout.purge_queued(&request, |_| {}).await,
    }
    .expect("the purge completes");
    Run {
        mode,
        report,
        too_many: server.too_many(),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

fn main() -> ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "purge {TAGS} tags on Fastly (documented hourly caps) and Cloudflare (Pro: 5/s, bucket 25)"
    );
    println!("against a loopback server enforcing the same limits (429 past them)\n");
    println!(
        "{:<9} {:>10} {:>10} {:>8} {:>5}   per provider (requests, ack)",
        "mode", "achieved", "ideal", "over", "429s"
    );
    let mut ok = true;
    for mode in ["parallel", "queued"] {
        for _ in 0..RUNS {
            let r = rt.block_on(run(mode));
            let ideal = r.report.ideal;
            let achieved = r.report.elapsed;
            let over = achieved.as_secs_f64() / ideal.as_secs_f64().max(1e-9) - 1.0;
            let providers: Vec<String> = r
                .report
                .receipts
                .iter()
                .map(|p| {
                    format!(
                        "{} {} req {}",
                        p.provider,
                        p.requests,
                        secs(p.acknowledged_in)
                    )
                })
                .collect();
            println!(
                "{:<9} {:>10} {:>10} {:>7.1}% {:>5}   {}",
                r.mode,
                secs(achieved),
                secs(ideal),
                over * 100.0,
                r.too_many,
                providers.join(", ")
            );
            ok &= r.too_many == 0 && over <= 0.10;
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        println!("\nFAILED: a run provoked a 429 or took more than 10% over the ideal");
        ExitCode::FAILURE
    }
}
