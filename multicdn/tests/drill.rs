//! A drill run by the Controller on simulated time: the shift to the standby in the failover's
//! steps, the watch over real-user p90 against the baseline, the stepwise abort, the report.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use multicdn::RoundReport;
use multicdn::prelude::*;
use multicdn::steering::engine::drill;
use support::{p, start};

const STANDBY: &str = include_str!("../../examples/policy-standby.yaml");

/// The shipped standby policy with its drill at 09:10, held `hold`.
fn policy(hold: &str) -> Policy {
    let src = STANDBY
        .replace("at: 2027-01-12T10:00:00Z", "at: 2026-12-01T09:10:00Z")
        .replace("      hold: 1h\n", &format!("      hold: {hold}\n"));
    Policy::from_yaml(&src, "policy-standby.yaml").unwrap()
}

/// `n` navigation beacons from Deutsche Telekom users in Germany (Europe) through `cdn`.
fn feed(c: &Controller, now: Timestamp, cdn: &str, ttfb: u32, n: usize) {
    let mut text = String::new();
    for i in 0..n {
        // A spread of values so the percentiles are not one number.
        let v = ttfb + (i as u32 % 10) * 2;
        text.push_str(&format!(
            "{{\"at\":{},\"asn\":3320,\"country\":\"DE\",\"ttfb\":{v},\"provider\":\"{cdn}\"}}\n",
            now.as_millis()
        ));
    }
    c.ingest_bytes(text.as_bytes());
}

fn europe(r: &RoundReport, provider: &str) -> u32 {
    r.plan
        .cohort(&"europe".parse().unwrap())
        .unwrap()
        .weights
        .get(&p(provider))
}

fn controller(pol: Policy, clock: &ManualClock, steerer: &MemorySteerer) -> Controller {
    Controller::builder(pol)
        .actuator("memory", steerer.clone())
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Rounds every 30 s until `until`, feeding Europe's traffic as the plan sends it (fastly at
/// `fastly_ms`, the standby at `standby_ms`); the standby's share of Europe after each.
async fn run(
    c: &Controller,
    clock: &ManualClock,
    until: Timestamp,
    fastly_ms: u32,
    standby_ms: u32,
) -> Vec<u32> {
    let mut shares = Vec::new();
    let mut on_standby = 0;
    while clock.now() < until {
        let now = clock.now();
        // 100 page loads a round, split as the last plan split them.
        let to_standby = (on_standby as usize * 100) / 10_000;
        feed(c, now, "fastly", fastly_ms, 100 - to_standby);
        feed(c, now, "cloudflare", standby_ms, to_standby);
        let r = c.round(now).await;
        on_standby = europe(&r, "cloudflare");
        shares.push(on_standby);
        clock.advance(Duration::from_secs(30));
    }
    shares
}

#[tokio::test]
async fn a_drill_that_holds_shifts_in_steps_reports_and_returns() {
    let clock = ManualClock::new(start());
    let steerer = MemorySteerer::new();
    let c = controller(policy("10m"), &clock, &steerer);
    let at = Timestamp::parse_rfc3339("2026-12-01T09:10:00Z").unwrap();
    let before = run(&c, &clock, at, 40, 45).await;
    assert!(
        before.iter().all(|s| *s == 0),
        "the standby carries nothing: {before:?}"
    );
    // The drill: 50% at 09:10, 100% at 09:11:30, held 10 minutes, back in two steps.
    let during = run(
        &c,
        &clock,
        at.plus(Duration::from_secs(90 + 600 + 180)),
        40,
        45,
    )
    .await;
    assert_eq!(&during[..3], [5_000, 5_000, 5_000]);
    assert_eq!(during[3], 10_000);
    assert_eq!(during[during.len() - 1], 0, "{during:?}");
    // Every cohort (the regions and any network carved out of them) is back on fastly.
    let applied = steerer.current().await.unwrap().cohorts;
    assert!(applied.len() >= 3, "{applied:?}");
    assert!(
        applied.iter().all(|c| c.weights.get(&p("cloudflare")) == 0),
        "{applied:?}"
    );
    // The figures after the return are read once the cohorts have settled (rum.settle 10m).
    run(
        &c,
        &clock,
        clock.now().plus(Duration::from_secs(660)),
        40,
        45,
    )
    .await;
    let drills = c.drills().await;
    let progress = &drills["q1-standby"];
    assert!(progress.aborted.is_none(), "{progress:?}");
    assert_eq!(progress.time_to_shift(), Some(Duration::from_secs(90)));
    let europe_figures = &progress.regions["europe"];
    let (b, d, a) = (
        europe_figures.before.unwrap(),
        europe_figures.during.unwrap(),
        europe_figures.after.unwrap(),
    );
    // Each window is read in whole scoreboard buckets.
    assert!(
        b.samples >= 500 && d.samples >= 500 && a.samples >= 500,
        "{b:?} {d:?} {a:?}"
    );
    // Before: fastly at 40-58 ms; during: mostly the standby at 45-63 ms.
    assert!((55.0..=60.0).contains(&b.p90_ms.unwrap()), "{b:?}");
    assert!(d.p90_ms.unwrap() > b.p90_ms.unwrap(), "{d:?}");
    let spec = &c.policy().steering.drills[0];
    let report = drill::report(spec, progress);
    assert!(report.contains("complete after 90 s"), "{report}");
    assert!(report.contains("completed without an abort"), "{report}");
    assert!(report.contains("europe"), "{report}");
    // Every step is journaled as the drill's, and none counts as oscillation.
    let journal = c.journal().await;
    let steps: Vec<_> = journal
        .entries()
        .iter()
        .filter(|e| e.rule == multicdn::steering::journal::Rule::Drill)
        .collect();
    assert!(steps.len() >= 4, "{steps:?}");
    let health = journal.loop_health(start(), clock.now(), Duration::from_secs(7_200), 2);
    assert!(health.oscillating.is_empty(), "{:?}", health.oscillating);
}

#[tokio::test]
async fn a_regression_on_the_standby_aborts_the_drill_stepwise() {
    let clock = ManualClock::new(start());
    let steerer = MemorySteerer::new();
    let c = controller(policy("1h"), &clock, &steerer);
    let at = Timestamp::parse_rfc3339("2026-12-01T09:10:00Z").unwrap();
    run(&c, &clock, at, 40, 45).await;
    // The standby serves Europe at 400 ms: p90 up far more than the policy's 150 ms.
    let during = run(&c, &clock, at.plus(Duration::from_secs(600)), 40, 400).await;
    let drills = c.drills().await;
    let progress = &drills["q1-standby"];
    let abort = progress.aborted.as_ref().expect("aborted");
    assert_eq!(abort.region, Some("europe".parse().unwrap()));
    assert!(abort.reason.contains("p90 TTFB"), "{}", abort.reason);
    // It returned in steps (never 100% to 0% at once) long before the hour was up.
    let peak = during
        .iter()
        .position(|s| *s == *during.iter().max().unwrap())
        .unwrap();
    let after_peak: Vec<u32> = during[peak..].to_vec();
    assert!(
        after_peak
            .iter()
            .any(|s| *s > 0 && *s < 10_000 && *s < during[peak]),
        "{during:?}"
    );
    assert_eq!(*during.last().unwrap(), 0, "{during:?}");
    assert!(progress.ended.is_some());
    let report = drill::report(&c.policy().steering.drills[0], progress);
    assert!(report.contains("ABORTED"), "{report}");
    assert!(report.contains("europe: p90 TTFB"), "{report}");
    let journal = c.journal().await;
    assert!(
        journal
            .entries()
            .iter()
            .any(|e| e.evidence.note.contains("aborted, returning")),
        "no stepwise return journaled"
    );
}
