//! The evidence rules as properties: a thin cohort never moves on a coarser cut, paired or not;
//! paired evidence with equal providers never moves (whatever the navigation beacons' cache
//! bias, however few the pairs); paired evidence with a clear gap moves a cohort too thin for
//! independent samples; recovery never moves toward a provider the cohort's own evidence shows
//! slower beyond the gap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use multicdn_core::{CohortPlan, Country, NetworkKey, Policy, SteeringPlan, Timestamp};
use multicdn_steering::beacon::ClientNetwork;
use multicdn_steering::engine::{
    CohortInput, EngineState, Inputs, ProviderEvidence, ProviderHealth, cohorts::cohort_inputs,
    decide,
};
use multicdn_steering::journal::Rule;
use multicdn_steering::scoreboard::{Metric, Sample, Scoreboard};
use multicdn_steering::scorer::AvailabilityThenLatency;
use proptest::prelude::*;

mod common;
use common::{Rng, board, c, p, w};

const RUM: &str = "{min_samples: 200, window: 1h, relative_gap: 10%, absolute_gap: 20ms, switch_back_factor: 1.5, step: 20%, settle: 10m}";

#[allow(clippy::too_many_arguments)]
fn add(
    board: &mut Scoreboard,
    rng: &mut Rng,
    now: Timestamp,
    asn: u32,
    metric: Metric,
    provider: &str,
    n: u64,
    median: f64,
) {
    let slot = board.provider_slot(provider).unwrap();
    let network = ClientNetwork::new(Some(asn), Some(Country::new("DE").unwrap()));
    for i in 0..n {
        board.insert(&Sample {
            at: Timestamp::from_millis(now.as_millis() - 1 - (i * 7) % 1_800_000),
            metric,
            provider: slot,
            network,
            value: Some(rng.lognormal(median, 0.3)),
        });
    }
}

/// `n` probe loads of one network that timed both providers: each load's user factor
/// (log-normal σ `user`) is shared by both times, each fetch adds its own (σ 0.15).
#[allow(clippy::too_many_arguments)]
fn add_paired(
    board: &mut Scoreboard,
    rng: &mut Rng,
    now: Timestamp,
    asn: u32,
    n: u64,
    fastly: f64,
    cloudflare: f64,
    user: f64,
) {
    let slots = [
        board.provider_slot("fastly").unwrap(),
        board.provider_slot("cloudflare").unwrap(),
    ];
    let network = ClientNetwork::new(Some(asn), Some(Country::new("DE").unwrap()));
    for i in 0..n {
        let at = Timestamp::from_millis(now.as_millis() - 1 - (i * 7) % 1_800_000);
        let u = rng.lognormal(1.0, user);
        let times = [
            (slots[0], Some(fastly * u * rng.lognormal(1.0, 0.15))),
            (slots[1], Some(cloudflare * u * rng.lognormal(1.0, 0.15))),
        ];
        for (provider, value) in times {
            board.insert(&Sample {
                at,
                metric: Metric::Probe,
                provider,
                network,
                value,
            });
        }
        board.insert_pairs(at, network, &times);
    }
}

/// AS3320 with both providers equally fast on `n` paired loads (users' own speed spread by
/// `user`), and navigations showing cloudflare, at a tenth of fastly's traffic, slower by the
/// miss penalty of a cold cache.
fn equal_on_pairs(
    policy: &Policy,
    now: Timestamp,
    n: u64,
    median: f64,
    user: f64,
    seed: u64,
) -> Scoreboard {
    let mut b = board(policy);
    let mut rng = Rng(seed);
    add_paired(&mut b, &mut rng, now, 3320, n, median, median, user);
    for (provider, count, ms) in [("fastly", 9 * n, median), ("cloudflare", n, median + 80.0)] {
        add(
            &mut b,
            &mut rng,
            now,
            3320,
            Metric::Ttfb,
            provider,
            count,
            ms,
        );
    }
    b
}

/// One round on the board's last hour, from the static plan (plus `plan`'s changes).
fn round(
    policy: &Policy,
    b: &Scoreboard,
    now: Timestamp,
    plan: &SteeringPlan,
) -> (Vec<CohortInput>, multicdn_steering::engine::Decision) {
    let snapshot = b.snapshot(now, Duration::from_secs(3600));
    let scorer = AvailabilityThenLatency::from_policy(&policy.steering.rum);
    let cohorts = cohort_inputs(policy, &snapshot, Metric::Ttfb, &scorer, plan);
    let d = decide(
        now,
        &Inputs {
            policy,
            current: plan,
            cohorts: &cohorts,
            health: &BTreeMap::new(),
            data_as_of: snapshot.newest_sample(),
            state: &EngineState::new(),
        },
    );
    (cohorts, d)
}

/// 120 paired loads at AS3320 (fewer than `min_samples`, more than `min_pairs`), fastly 40%
/// slower: the paired cohort is judged and moves, with the pairing in the journal's note;
/// the same times as independent samples are too thin to judge at all.
#[test]
fn paired_evidence_moves_a_cohort_too_thin_for_independent_samples() {
    let policy = common::policy(RUM);
    let now = Timestamp::parse_rfc3339("2027-03-02T12:00:00Z").unwrap();
    let plan = policy.static_plan();

    let nav = |b: &mut Scoreboard, rng: &mut Rng| {
        add(b, rng, now, 3320, Metric::Ttfb, "fastly", 1_080, 98.0);
        add(b, rng, now, 3320, Metric::Ttfb, "cloudflare", 120, 70.0);
    };
    let mut b = board(&policy);
    let mut rng = Rng(7);
    add_paired(&mut b, &mut rng, now, 3320, 120, 98.0, 70.0, 0.4);
    nav(&mut b, &mut rng);
    let (cohorts, d) = round(&policy, &b, now, &plan);
    let input = cohorts
        .iter()
        .find(|i| i.cohort == c("as3320"))
        .expect("AS3320 is judged");
    assert_eq!(input.pairings.len(), 1, "{input:?}");
    assert_eq!(input.pairings[0].pairs, 120);
    assert!(input.pairings[0].correlation > 0.6, "{input:?}");
    let moved: Vec<_> = d
        .journal
        .iter()
        .filter(|e| e.cohort == c("as3320"))
        .collect();
    assert_eq!(moved.len(), 1, "{:?}", d.journal);
    assert_eq!(moved[0].rule, Rule::Rum);
    assert!(moved[0].after.get(&p("cloudflare")) > moved[0].before.get(&p("cloudflare")));
    assert!(
        moved[0].evidence.note.contains("paired on 120 probe loads"),
        "{}",
        moved[0]
    );

    // The same loads, their pairs not recorded.
    let mut b = board(&policy);
    let mut rng = Rng(7);
    add(
        &mut b,
        &mut rng,
        now,
        3320,
        Metric::Probe,
        "fastly",
        120,
        98.0,
    );
    add(
        &mut b,
        &mut rng,
        now,
        3320,
        Metric::Probe,
        "cloudflare",
        120,
        70.0,
    );
    nav(&mut b, &mut rng);
    let (cohorts, d) = round(&policy, &b, now, &plan);
    assert!(
        cohorts.iter().all(|i| i.cohort != c("as3320")),
        "{cohorts:?}"
    );
    assert!(d.journal.iter().all(|e| e.cohort != c("as3320")));
}

proptest! {
    // The cases come from a fixed seed: the rules are statistical (see the chance-move rate
    // below), and a run must not fail on a new draw from the one-in-two-thousand tail.
    #![proptest_config(ProptestConfig {
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x6d75_6c74_6963_646e),
        ..ProptestConfig::with_cases(24)
    })]

    /// The thin-cohort rule with paired probes: AS3320's pairs are fewer than `min_pairs`;
    /// its country's, another network's, show cloudflare far faster. It holds.
    #[test]
    fn a_thinly_paired_cohort_never_moves_on_a_coarser_cut(
        own in 0u64..80,
        gap in 30.0f64..200.0,
        seed in 1u64..u64::MAX,
    ) {
        let policy = common::policy(RUM);
        let now = Timestamp::parse_rfc3339("2027-03-02T12:00:00Z").unwrap();
        let mut b = board(&policy);
        let mut rng = Rng(seed);
        add_paired(&mut b, &mut rng, now, 64_600, 2_000, 60.0 + gap, 60.0, 0.3);
        add_paired(&mut b, &mut rng, now, 3320, own, 60.0 + gap, 60.0, 0.3);
        for (prov, median) in [("fastly", 60.0 + gap), ("cloudflare", 60.0)] {
            add(&mut b, &mut rng, now, 64_600, Metric::Ttfb, prov, 2_000, median);
            add(&mut b, &mut rng, now, 3320, Metric::Ttfb, prov, own, median);
        }
        let mut plan = policy.static_plan();
        plan.cohorts.insert(0, CohortPlan {
            cohort: c("as3320"),
            networks: [NetworkKey::Asn(3320)].into(),
            weights: w(5_000),
        });
        let (cohorts, d) = round(&policy, &b, now, &plan);
        prop_assert!(cohorts.iter().all(|i| i.cohort != c("as3320")), "thin AS3320 got an input");
        prop_assert!(d.journal.iter().all(|e| e.cohort != c("as3320")));
        prop_assert_eq!(&d.plan.cohort(&c("as3320")).unwrap().weights, &w(5_000));
    }

    /// Both providers equally fast on paired loads, from `min_pairs` up, users' own speed
    /// spread wide: the paired test's smaller error still sees no gap. Nothing moves.
    #[test]
    fn equal_providers_never_move_however_few_the_pairs(
        n in 80u64..400,
        median in 20.0f64..200.0,
        user in 0.1f64..0.6,
        seed in 1u64..u64::MAX,
    ) {
        let policy = common::policy(RUM);
        let now = Timestamp::parse_rfc3339("2027-03-02T12:00:00Z").unwrap();
        let b = equal_on_pairs(&policy, now, n, median, user, seed);
        let (cohorts, d) = round(&policy, &b, now, &policy.static_plan());
        prop_assert!(cohorts.iter().any(|i| i.cohort == c("as3320")), "AS3320 is judged");
        prop_assert!(
            d.journal.iter().all(|e| e.rule != Rule::Rum),
            "{:?}",
            d.journal.iter().map(ToString::to_string).collect::<Vec<_>>()
        );
    }

    /// AS3320 steers as its own cohort (carved out at 50/50), but its own cells are thin; its
    /// country's cut, dominated by another network, shows cloudflare far faster. It holds.
    #[test]
    fn a_thin_cohort_never_moves_on_a_coarser_cut(
        own in 0u64..199,
        gap in 30.0f64..200.0,
        seed in 1u64..u64::MAX,
    ) {
        let policy = common::policy(RUM);
        let now = Timestamp::parse_rfc3339("2027-03-02T12:00:00Z").unwrap();
        let mut b = board(&policy);
        let mut rng = Rng(seed);
        for metric in [Metric::Ttfb, Metric::Probe] {
            for (prov, median) in [("fastly", 60.0 + gap), ("cloudflare", 60.0)] {
                add(&mut b, &mut rng, now, 64_600, metric, prov, 2_000, median);
                add(&mut b, &mut rng, now, 3320, metric, prov, own, median);
            }
        }
        let mut plan = policy.static_plan();
        plan.cohorts.insert(0, CohortPlan {
            cohort: c("as3320"),
            networks: [NetworkKey::Asn(3320)].into(),
            weights: w(5_000),
        });
        let snapshot = b.snapshot(now, Duration::from_secs(3600));
        let scorer = AvailabilityThenLatency::from_policy(&policy.steering.rum);
        let cohorts = cohort_inputs(&policy, &snapshot, Metric::Ttfb, &scorer, &plan);
        prop_assert!(cohorts.iter().all(|i| i.cohort != c("as3320")), "thin AS3320 got an input");
        let d = decide(now, &Inputs {
            policy: &policy,
            current: &plan,
            cohorts: &cohorts,
            health: &BTreeMap::new(),
            data_as_of: snapshot.newest_sample(),
            state: &EngineState::new(),
        });
        prop_assert!(d.journal.iter().all(|e| e.cohort != c("as3320")));
        prop_assert_eq!(&d.plan.cohort(&c("as3320")).unwrap().weights, &w(5_000));
    }

    /// Both providers equally fast on the paired probe; navigation TTFB biased by cloudflare's
    /// cold cache at the 10% floor (a miss penalty on most of its loads). Nothing moves.
    #[test]
    fn paired_evidence_with_equal_providers_never_moves(
        n in 200u64..3_000,
        median in 20.0f64..200.0,
        miss in 50.0f64..300.0,
        seed in 1u64..u64::MAX,
    ) {
        let policy = common::policy(RUM);
        let now = Timestamp::parse_rfc3339("2027-03-02T12:00:00Z").unwrap();
        let mut b = board(&policy);
        let mut rng = Rng(seed);
        add(&mut b, &mut rng, now, 3320, Metric::Probe, "fastly", n, median);
        add(&mut b, &mut rng, now, 3320, Metric::Probe, "cloudflare", n, median);
        add(&mut b, &mut rng, now, 3320, Metric::Ttfb, "fastly", 9 * n, median);
        add(&mut b, &mut rng, now, 3320, Metric::Ttfb, "cloudflare", n, median + miss);
        let plan = policy.static_plan();
        let snapshot = b.snapshot(now, Duration::from_secs(3600));
        let scorer = AvailabilityThenLatency::from_policy(&policy.steering.rum);
        let cohorts = cohort_inputs(&policy, &snapshot, Metric::Ttfb, &scorer, &plan);
        let d = decide(now, &Inputs {
            policy: &policy,
            current: &plan,
            cohorts: &cohorts,
            health: &BTreeMap::new(),
            data_as_of: snapshot.newest_sample(),
            state: &EngineState::new(),
        });
        prop_assert!(
            d.journal.iter().all(|e| e.rule != Rule::Rum),
            "{:?}",
            d.journal.iter().map(ToString::to_string).collect::<Vec<_>>()
        );
    }

    /// Fastly goes down and comes back; the cohort's own evidence shows it slower than
    /// cloudflare beyond the gap. Recovery never hands it traffic back.
    #[test]
    fn recovery_never_moves_toward_a_provider_shown_slower(
        gap in 40.0f64..300.0,
        up_after in 2u64..30,
    ) {
        let policy = common::policy(RUM);
        let t0 = Timestamp::parse_rfc3339("2027-03-02T12:00:00Z").unwrap();
        let input = CohortInput {
            cohort: c("europe"),
            networks: [NetworkKey::Country(Country::new("DE").unwrap())].into(),
            parent: None,
            share: 0.5,
            cut: None,
            evidence: Arc::from(vec![
                ProviderEvidence::new(p("cloudflare"), Some(80.0), 5_000).with_stderr(Some(1.0)),
                ProviderEvidence::new(p("fastly"), Some(80.0 + gap), 5_000).with_stderr(Some(1.0)),
            ]),
            pairings: Arc::from(vec![]),
            experienced: Arc::from(vec![]),
        };
        let mut plan: SteeringPlan = policy.static_plan();
        let mut state = EngineState::new();
        let mut health = BTreeMap::new();
        health.insert(p("fastly"), ProviderHealth::down(t0));
        for minute in 0..180u64 {
            let now = t0 + Duration::from_secs(minute * 60);
            if minute == up_after {
                health.insert(p("fastly"), ProviderHealth::up(now));
            }
            // While fastly is down its evidence would be missing; after, it is the slower one.
            let cohorts = if minute < up_after { vec![] } else { vec![input.clone()] };
            let d = decide(now, &Inputs {
                policy: &policy,
                current: &plan,
                cohorts: &cohorts,
                health: &health,
                data_as_of: Some(now),
                state: &state,
            });
            for e in &d.journal {
                if e.rule == Rule::Recovery && e.cohort == c("europe") {
                    prop_assert!(
                        e.after.get(&p("fastly")) <= e.before.get(&p("fastly")),
                        "recovery handed the slower fastly traffic: {e}"
                    );
                }
            }
            plan = d.plan;
            state = d.state;
        }
    }
}

/// The rule is a two-sided 95% test with the policy's fixed gaps on top, so equal providers
/// can show a significant gap by chance; measured here, they do in about one cohort in two
/// thousand (the property above runs its cases from a fixed seed for that reason). Over a
/// thousand independent draws of the same world, fewer than one in two hundred moves.
#[test]
fn equal_providers_move_on_chance_in_fewer_than_one_cohort_in_two_hundred() {
    let policy = common::policy(RUM);
    let now = Timestamp::parse_rfc3339("2027-03-02T12:00:00Z").unwrap();
    let mut draw = Rng(12_345);
    let trials = 1_000;
    let mut moved = 0;
    for k in 0..trials {
        let n = 80 + (draw.next() * 320.0) as u64;
        let median = 20.0 + draw.next() * 180.0;
        let user = 0.1 + draw.next() * 0.5;
        let b = equal_on_pairs(&policy, now, n, median, user, 1 + k);
        let (_, d) = round(&policy, &b, now, &policy.static_plan());
        if d.journal.iter().any(|e| e.rule == Rule::Rum) {
            moved += 1;
        }
    }
    assert!(moved * 200 < trials, "{moved} of {trials} moved");
}
