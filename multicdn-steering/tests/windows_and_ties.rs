//! The rules that judge a network over time and break ties, as a user of the loop would see
//! them: a sparse network is judged on its own longer history (never on its country's cut), a
//! change in its latest window still moves it within minutes, ties go to the warmer cache the
//! cohort already mostly uses (and never split it), cache hits compare providers free of the
//! cache-share bias, and after the deadman the cohorts walk back to where they were.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use multicdn_core::{CohortPlan, Country, NetworkKey, Policy, SteeringPlan, Timestamp};
use multicdn_steering::beacon::ClientNetwork;
use multicdn_steering::engine::{
    CohortInput, Decision, EngineState, Inputs, Mode, ProviderEvidence,
    cohorts::{cohort_inputs, cohort_inputs_over},
    decide,
};
use multicdn_steering::journal::Rule;
use multicdn_steering::scoreboard::{Metric, Scoreboard};
use multicdn_steering::scorer::AvailabilityThenLatency;
use proptest::prelude::*;

mod common;
use common::{Rng, board, c, p, w};

/// Judged on 15 minutes, else 30, 60, 120.
const RUM: &str = "{min_samples: 200, window: 15m, max_window: 2h, relative_gap: 10%, absolute_gap: 10ms, switch_back_factor: 1.5, step: 20%, settle: 5m}";

fn policy() -> Policy {
    common::policy(RUM)
}

fn t0() -> Timestamp {
    Timestamp::parse_rfc3339("2027-03-02T12:00:00Z").unwrap()
}

/// What one network's beacons look like: where, which provider, how many, over how long
/// before `now`, and the median time (log-normal σ 0.3 around it).
struct Load<'a> {
    asn: u32,
    country: &'a str,
    provider: &'a str,
    n: u64,
    over: Duration,
    median: f64,
}

/// Navigation beacons spread evenly over `over`, ending at `now`; `hit` marks them served from
/// the edge's cache.
fn navigations(b: &mut Scoreboard, rng: &mut Rng, now: Timestamp, l: &Load<'_>, hit: bool) {
    let slot = b.provider_slot(l.provider).unwrap();
    let network = ClientNetwork::new(Some(l.asn), Some(Country::new(l.country).unwrap()));
    let span = l.over.as_millis() as u64;
    for i in 0..l.n {
        let at = Timestamp::from_millis(now.as_millis() - 1 - i * span / l.n.max(1));
        b.insert_navigation(at, slot, network, rng.lognormal(l.median, 0.3), hit);
    }
}

/// The loop's inputs over the policy's window ladder, and its decision from `plan`.
fn round_over_ladder(
    policy: &Policy,
    b: &Scoreboard,
    now: Timestamp,
    plan: &SteeringPlan,
) -> (Vec<CohortInput>, Decision) {
    let ladder = b.snapshots(now, &policy.steering.rum.read_windows());
    let scorer = AvailabilityThenLatency::from_policy(&policy.steering.rum);
    let cohorts = cohort_inputs_over(policy, &ladder, Metric::Ttfb, &scorer, plan);
    let d = decide(
        now,
        &Inputs {
            policy,
            current: plan,
            cohorts: &cohorts,
            health: &BTreeMap::new(),
            data_as_of: ladder.last().and_then(|s| s.newest_sample()),
            state: &EngineState::new(),
        },
    );
    (cohorts, d)
}

fn rum_moves<'d>(
    d: &'d Decision,
    cohort: &str,
) -> Vec<&'d multicdn_steering::journal::JournalEntry> {
    d.journal
        .iter()
        .filter(|e| e.rule == Rule::Rum && e.cohort == c(cohort))
        .collect()
}

/// AS3320 sends 300 beacons a provider over 100 minutes: 45 in the latest 15, too few to judge
/// it there; on two hours of its own history fastly is clearly slower and the cohort moves.
/// A single 15-minute window gives it no input at all (and never its country's cut).
#[test]
fn a_sparse_network_is_judged_on_its_own_longer_history() {
    let policy = policy();
    let now = t0();
    let mut b = board(&policy);
    let mut rng = Rng(11);
    for (provider, median) in [("fastly", 110.0), ("cloudflare", 60.0)] {
        let load = Load {
            asn: 3320,
            country: "DE",
            provider,
            n: 300,
            over: Duration::from_secs(100 * 60),
            median,
        };
        navigations(&mut b, &mut rng, now, &load, false);
    }
    let plan = policy.static_plan();
    let (cohorts, d) = round_over_ladder(&policy, &b, now, &plan);
    let input = cohorts
        .iter()
        .find(|i| i.cohort == c("as3320"))
        .expect("AS3320 is judged on its longer history");
    assert_eq!(input.cut, Some(NetworkKey::Asn(3320)), "its own cut");
    assert!(input.evidence.iter().all(|e| e.samples == 300), "{input:?}");
    let moves = rum_moves(&d, "as3320");
    assert_eq!(moves.len(), 1, "{:?}", d.journal);
    assert!(moves[0].after.get(&p("cloudflare")) > moves[0].before.get(&p("cloudflare")));

    let short = b.snapshot(now, policy.steering.rum.window.get());
    let scorer = AvailabilityThenLatency::from_policy(&policy.steering.rum);
    let alone = cohort_inputs(&policy, &short, Metric::Ttfb, &scorer, &plan);
    assert!(alone.iter().all(|i| i.cohort != c("as3320")), "{alone:?}");
}

/// The same sparse network, fastly the faster for two hours, then degraded by 150 ms for the
/// last 12 minutes: the two-hour window alone would hide it (most of its samples are from
/// before), the change in the latest window shows, and the cohort moves off fastly now.
#[test]
fn a_change_in_the_latest_window_moves_a_network_judged_on_a_long_one() {
    let policy = policy();
    let now = t0();
    let mut rng = Rng(5);
    let setup = |degraded: bool, rng: &mut Rng| {
        let mut b = board(&policy);
        for (provider, median) in [("fastly", 60.0), ("cloudflare", 100.0)] {
            let load = Load {
                asn: 3320,
                country: "DE",
                provider,
                n: 300,
                over: Duration::from_secs(110 * 60),
                median,
            };
            navigations(&mut b, rng, now, &load, false);
        }
        let recent = Load {
            asn: 3320,
            country: "DE",
            provider: "fastly",
            n: 60,
            over: Duration::from_secs(12 * 60),
            median: if degraded { 210.0 } else { 60.0 },
        };
        navigations(&mut b, rng, now, &recent, false);
        b
    };
    let mut plan = policy.static_plan();
    plan.cohorts.insert(
        0,
        CohortPlan {
            cohort: c("as3320"),
            networks: [NetworkKey::Asn(3320)].into(),
            weights: w(9_000),
        },
    );
    // Unchanged: fastly is the faster, nothing to do at 90%.
    let (_, d) = round_over_ladder(&policy, &setup(false, &mut rng), now, &plan);
    assert!(rum_moves(&d, "as3320").is_empty(), "{:?}", d.journal);
    // Degraded for 12 minutes: the cohort moves towards cloudflare in this round.
    let (cohorts, d) = round_over_ladder(&policy, &setup(true, &mut rng), now, &plan);
    let input = cohorts.iter().find(|i| i.cohort == c("as3320")).unwrap();
    let score = |name: &str| {
        input
            .evidence
            .iter()
            .find(|e| e.provider == p(name))
            .and_then(|e| e.score)
            .unwrap()
    };
    assert!(score("fastly") > score("cloudflare") + 50.0, "{input:?}");
    let moves = rum_moves(&d, "as3320");
    assert_eq!(moves.len(), 1, "{:?}", d.journal);
    assert!(moves[0].after.get(&p("fastly")) < 9_000);
}

/// A busy network, judged on the policy's 15-minute window, three minutes into a bucket;
/// fastly degraded by 140 ms for those three minutes: a fifth of the window's samples, not
/// enough to move its p75 past cloudflare's, but the latest half window shows the change and
/// the cohort moves now.
#[test]
fn a_busy_network_moves_on_a_change_in_the_latest_half_window() {
    let policy = policy();
    let now = t0() + Duration::from_secs(3 * 60);
    let three_minutes_ago = t0();
    let mut rng = Rng(9);
    let setup = |degraded: bool, rng: &mut Rng| {
        let mut b = board(&policy);
        let load = |provider, n, minutes: u64, median| Load {
            asn: 7922,
            country: "US",
            provider,
            n,
            over: Duration::from_secs(minutes * 60),
            median,
        };
        navigations(
            &mut b,
            rng,
            three_minutes_ago,
            &load("fastly", 1_650, 11, 60.0),
            true,
        );
        let recent = load("fastly", 450, 3, if degraded { 200.0 } else { 60.0 });
        navigations(&mut b, rng, now, &recent, true);
        navigations(&mut b, rng, now, &load("cloudflare", 560, 14, 90.0), true);
        b
    };
    let mut plan = policy.static_plan();
    plan.cohorts.insert(
        0,
        CohortPlan {
            cohort: c("as7922"),
            networks: [NetworkKey::Asn(7922)].into(),
            weights: w(9_000),
        },
    );
    let (_, d) = round_over_ladder(&policy, &setup(false, &mut rng), now, &plan);
    assert!(rum_moves(&d, "as7922").is_empty(), "{:?}", d.journal);
    let b = setup(true, &mut rng);
    // On the window alone, fastly still looks the faster at the p75.
    let window = b.snapshot(now, policy.steering.rum.window.get());
    let p75 = |name: &str| {
        window
            .cell(Metric::TtfbHit, NetworkKey::Asn(7922), &p(name))
            .stats
            .p75
            .unwrap()
    };
    assert!(
        p75("fastly") < p75("cloudflare"),
        "{} {}",
        p75("fastly"),
        p75("cloudflare")
    );
    let (_, d) = round_over_ladder(&policy, &b, now, &plan);
    let moves = rum_moves(&d, "as7922");
    assert_eq!(moves.len(), 1, "{:?}", d.journal);
    assert!(moves[0].after.get(&p("fastly")) < 9_000, "{}", moves[0]);
}

/// Cloudflare's navigations carry a cold cache's misses; its hits are as fast as fastly's.
/// Judged on hits, the providers are equal: no move on the evidence.
#[test]
fn cache_hits_compare_providers_free_of_the_cache_share() {
    let policy = policy();
    let now = t0();
    let mut b = board(&policy);
    let mut rng = Rng(3);
    let nav = |provider, n, median| Load {
        asn: 3320,
        country: "DE",
        provider,
        n,
        over: Duration::from_secs(10 * 60),
        median,
    };
    // Fastly at 90% of the network: 88% hits. Cloudflare at 10%: 60% hits.
    navigations(&mut b, &mut rng, now, &nav("fastly", 2_640, 50.0), true);
    navigations(&mut b, &mut rng, now, &nav("fastly", 360, 170.0), false);
    navigations(&mut b, &mut rng, now, &nav("cloudflare", 300, 50.0), true);
    navigations(&mut b, &mut rng, now, &nav("cloudflare", 200, 170.0), false);
    let mut plan = policy.static_plan();
    plan.cohorts.insert(
        0,
        CohortPlan {
            cohort: c("as3320"),
            networks: [NetworkKey::Asn(3320)].into(),
            weights: w(9_000),
        },
    );
    let (cohorts, d) = round_over_ladder(&policy, &b, now, &plan);
    let input = cohorts.iter().find(|i| i.cohort == c("as3320")).unwrap();
    // Scored on hits: 300 cloudflare samples, not its 500 navigations.
    let cf = input
        .evidence
        .iter()
        .find(|e| e.provider == p("cloudflare"))
        .unwrap();
    assert_eq!(cf.samples, 300, "{input:?}");
    // What users get now still shows the cold cache, for the tie-break.
    assert!(!input.experienced.is_empty());
    // No move towards the cold cache; a tie consolidates on fastly, which has no room left.
    assert!(
        d.journal.iter().all(|e| e.cohort != c("as3320")),
        "{:?}",
        d.journal
    );
}

/// A cohort's inputs with the unbiased signal tied (`lean` ms in fastly's favour, within the
/// gaps) and what users get now favouring fastly's warmer cache by 60 ms.
fn tied(lean: f64) -> CohortInput {
    let e = |name: &str, score: f64, n| {
        ProviderEvidence::new(p(name), Some(score), n).with_stderr(Some(0.5))
    };
    CohortInput {
        cohort: c("as7922"),
        networks: [NetworkKey::Asn(7922)].into(),
        parent: Some(c("default")),
        share: 0.2,
        cut: Some(NetworkKey::Asn(7922)),
        evidence: Arc::from(vec![
            e("cloudflare", 80.0, 5_000),
            e("fastly", 80.0 - lean, 5_000),
        ]),
        pairings: Arc::from(vec![]),
        experienced: Arc::from(vec![
            e("cloudflare", 150.0, 20_000),
            e("fastly", 90.0, 20_000),
        ]),
    }
}

fn plan_with(fastly: u32) -> SteeringPlan {
    let mut plan = policy().static_plan();
    plan.cohorts.insert(
        0,
        CohortPlan {
            cohort: c("as7922"),
            networks: [NetworkKey::Asn(7922)].into(),
            weights: w(fastly),
        },
    );
    plan
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Ties go to the warmer cache only where it already carries at least as much of the
    /// cohort: from a fastly majority (or an even split) the cohort consolidates on fastly;
    /// from a cloudflare majority it holds, never split towards the minority; a lean the
    /// other way on the unbiased signal is never overruled.
    #[test]
    fn a_tie_consolidates_on_the_majority_and_never_splits(
        fastly in 1_000u32..=9_000,
        lean in -8.0f64..8.0,
    ) {
        let fastly = fastly - fastly % 50;
        let policy = policy();
        let plan = plan_with(fastly);
        let d = decide(t0(), &Inputs {
            policy: &policy,
            current: &plan,
            cohorts: &[tied(lean)],
            health: &BTreeMap::new(),
            data_as_of: Some(t0()),
            state: &EngineState::new(),
        });
        let after = d.plan.cohort(&c("as7922")).unwrap().weights.get(&p("fastly"));
        if fastly >= 5_000 && lean >= 0.0 && fastly < 9_000 {
            prop_assert!(after > fastly, "{:?}", d.journal);
            let e = d.journal.iter().find(|e| e.cohort == c("as7922")).unwrap();
            prop_assert!(e.evidence.note.contains("warmer"), "{e}");
        } else {
            prop_assert_eq!(after, fastly, "{:?}", d.journal);
        }
    }
}

/// Beacons stop for 20 minutes: the deadman serves the static weights; when they resume the
/// carved-out cohort walks back, in recovery steps, to the split it had (its evidence unchanged).
#[test]
fn after_the_deadman_each_cohort_walks_back_to_where_it_was() {
    let policy = policy();
    let input = tied(30.0); // fastly clearly faster on the unbiased signal: 80 vs 50 ms
    let mut plan = plan_with(9_000);
    let mut state = EngineState::new();
    let mut last_data = t0();
    let mut seen_deadman = false;
    let mut recovered_at = None;
    for minute in 0..120u64 {
        let now = t0() + Duration::from_secs(minute * 60);
        let silent = (10..30).contains(&minute);
        if !silent {
            last_data = now;
        }
        let d = decide(
            now,
            &Inputs {
                policy: &policy,
                current: &plan,
                cohorts: if silent {
                    &[]
                } else {
                    std::slice::from_ref(&input)
                },
                health: &BTreeMap::new(),
                data_as_of: Some(last_data),
                state: &state,
            },
        );
        if d.mode == Mode::Deadman {
            seen_deadman = true;
            assert!(now.since(last_data) > Duration::from_secs(15 * 60));
        }
        for e in d.journal.iter().filter(|e| e.cohort == c("as7922")) {
            if e.rule == Rule::Recovery {
                assert!(
                    e.after.get(&p("fastly")) > e.before.get(&p("fastly")),
                    "{e}"
                );
            }
        }
        plan = d.plan;
        state = d.state;
        if seen_deadman
            && d.mode == Mode::Steering
            && recovered_at.is_none()
            && plan
                .cohort(&c("as7922"))
                .is_some_and(|x| x.weights.get(&p("fastly")) == 9_000)
        {
            recovered_at = Some(minute);
        }
    }
    assert!(seen_deadman, "the deadman fired");
    let back = recovered_at.expect("the cohort walked back to 90% fastly");
    assert!(back <= 60, "back at minute {back}");
}
