use std::time::Duration;

use proptest::prelude::*;

use super::*;

const BASE: &str = r#"
site: {host: www.example.com}
providers:
  fastly: {kind: fastly, edge_host: f.example.net, service_id: svc}
  cloudflare: {kind: cloudflare, edge_host: c.example.net, zone_id: zone}
health: {path: /h, expect: ok, regions: [a, b, c]}
steering:
  record: www.example.com
  zone: example.com
  regions:
    - name: europe
      match: [DE, FR]
      weights: {fastly: 90%, cloudflare: 10%}
    - name: default
      match: ["*"]
      weights: {fastly: 50%, cloudflare: 50%}
  floors: {measurement: 10%}
  failover: {steps: [50%, 100%], interval: 90s}
  rum: {min_samples: 200, relative_gap: 10%, absolute_gap: 20ms, switch_back_factor: 1.5, step: 20%, settle: 10m}
  guardrails: {max_moved_per_hour: 30%, max_change_per_cohort: 40%, stale_after: 15m}
"#;

fn policy_with(extra: &str) -> Policy {
    Policy::from_yaml(&format!("{BASE}{extra}"), "test.yaml").unwrap()
}

fn policy() -> Policy {
    static POLICY: std::sync::LazyLock<Policy> = std::sync::LazyLock::new(|| policy_with(""));
    POLICY.clone()
}

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

fn c(s: &str) -> CohortId {
    CohortId::new(s).unwrap()
}

fn t(secs: u64) -> Timestamp {
    Timestamp::from_secs(1_800_000_000 + secs)
}

fn fc(fastly: u32) -> Weights {
    Weights::new([(p("fastly"), fastly), (p("cloudflare"), 10_000 - fastly)]).unwrap()
}

fn input(cohort: &str, network: &str, share: f64, fastly: f64, cloudflare: f64) -> CohortInput {
    CohortInput {
        cohort: c(cohort),
        networks: [network.parse().unwrap()].into(),
        parent: Some(c("default")),
        share,
        cut: Some(network.parse().unwrap()),
        pairings: Arc::from(vec![]),
        experienced: Arc::from(vec![]),
        evidence: vec![
            ProviderEvidence {
                stderr: None,
                provider: p("cloudflare"),
                score: Some(cloudflare),
                samples: 1000,
            },
            ProviderEvidence {
                stderr: None,
                provider: p("fastly"),
                score: Some(fastly),
                samples: 1000,
            },
        ]
        .into(),
    }
}

struct Sim {
    policy: Policy,
    plan: SteeringPlan,
    state: EngineState,
    health: BTreeMap<ProviderId, ProviderHealth>,
    journal: Vec<JournalEntry>,
}

impl Sim {
    fn new(policy: Policy) -> Sim {
        Sim {
            plan: policy.static_plan(),
            policy,
            state: EngineState::new(),
            health: BTreeMap::new(),
            journal: Vec::new(),
        }
    }

    fn round(&mut self, now: Timestamp, cohorts: &[CohortInput]) -> Decision {
        let d = decide(
            now,
            &Inputs {
                policy: &self.policy,
                current: &self.plan,
                cohorts,
                health: &self.health,
                data_as_of: Some(now),
                state: &self.state,
            },
        );
        self.plan = d.plan.clone();
        self.state = d.state.clone();
        self.journal.extend(d.journal.iter().cloned());
        d
    }

    fn weights(&self, cohort: &str) -> Weights {
        self.plan.cohort(&c(cohort)).unwrap().weights.clone()
    }
}

#[test]
fn a_down_provider_leaves_in_steps_never_all_at_once() {
    let mut sim = Sim::new(policy());
    sim.health.insert(p("fastly"), ProviderHealth::down(t(0)));
    let d = sim.round(t(0), &[]);
    assert_eq!(
        sim.weights("europe"),
        fc(4500),
        "half of fastly's 90% leaves at once"
    );
    assert_eq!(sim.weights("default"), fc(2500));
    assert!(d.journal.iter().all(|e| e.rule == Rule::Failover));
    assert!(
        d.journal[0].evidence.note.contains("fastly down"),
        "{}",
        d.journal[0].evidence.note
    );
    sim.round(t(60), &[]);
    assert_eq!(
        sim.weights("europe"),
        fc(4500),
        "the next step waits for the interval"
    );
    sim.round(t(90), &[]);
    assert_eq!(
        sim.weights("europe"),
        fc(0),
        "floors do not apply to a down provider"
    );
}

#[test]
fn recovery_returns_in_damped_steps_to_the_weights_before_the_failover() {
    let mut sim = Sim::new(policy());
    sim.health.insert(p("fastly"), ProviderHealth::down(t(0)));
    sim.round(t(0), &[]);
    sim.round(t(90), &[]);
    sim.health.insert(p("fastly"), ProviderHealth::up(t(300)));
    let d = sim.round(t(300), &[]);
    assert_eq!(sim.weights("europe"), fc(2000), "one step of 20%");
    assert!(d.journal.iter().any(|e| e.rule == Rule::Recovery));
    sim.round(t(400), &[]);
    assert_eq!(sim.weights("europe"), fc(2000), "settling");
    sim.round(t(900), &[]);
    assert_eq!(sim.weights("europe"), fc(4000));
    // The cohort cap (40% an hour) holds the next step until the hour has passed.
    sim.round(t(1500), &[]);
    assert_eq!(sim.weights("europe"), fc(4000));
    for i in 0..20 {
        sim.round(t(3900 + i * 600), &[]);
    }
    assert_eq!(sim.weights("europe"), fc(9000));
    assert_eq!(sim.weights("default"), fc(5000));
}

#[test]
fn every_provider_down_serves_the_static_weights() {
    let mut sim = Sim::new(policy());
    sim.plan.cohorts[0].weights = fc(5000);
    sim.health.insert(p("fastly"), ProviderHealth::down(t(0)));
    sim.health
        .insert(p("cloudflare"), ProviderHealth::down(t(0)));
    let d = sim.round(t(0), &[]);
    assert_eq!(d.mode, Mode::AllDown);
    assert_eq!(d.plan, sim.policy.static_plan());
    assert_eq!(d.journal.len(), 1);
    assert_eq!(d.journal[0].rule, Rule::AllProvidersDown);
}

#[test]
fn stale_inputs_fall_back_to_static_weights_never_zero() {
    let pol = policy();
    let mut current = pol.static_plan();
    current.cohorts.insert(
        0,
        CohortPlan {
            cohort: c("as7922"),
            networks: [NetworkKey::Asn(7922)].into(),
            weights: fc(1000),
        },
    );
    current.cohorts[1].weights = fc(7000);
    let state = EngineState::new();
    let health = BTreeMap::new();
    let mk = |data_as_of| Inputs {
        policy: &pol,
        current: &current,
        cohorts: &[],
        health: &health,
        data_as_of,
        state: &state,
    };
    let d = decide(t(2000), &mk(Some(t(0))));
    assert_eq!(d.mode, Mode::Deadman);
    assert_eq!(d.plan, pol.static_plan());
    assert!(
        d.plan
            .cohorts
            .iter()
            .all(|c| c.weights.iter().all(|(_, bp)| bp > 0))
    );
    assert_eq!(d.journal.len(), 2, "{:?}", d.journal);
    assert!(
        d.journal
            .iter()
            .all(|e| e.rule == Rule::Deadman && e.evidence.note.contains("stale_after"))
    );
    assert_eq!(decide(t(2000), &mk(None)).mode, Mode::Deadman);
    assert_eq!(decide(t(2000), &mk(Some(t(1500)))).mode, Mode::Steering);
}

#[test]
fn the_big_red_switch_serves_static_weights_whatever_the_scores() {
    let pol = policy_with("  pins: []\n");
    let mut pol = pol;
    pol.steering.guardrails.static_mode = true;
    let mut sim = Sim::new(pol);
    let d = sim.round(t(0), &[input("default", "*", 1.0, 100.0, 300.0)]);
    assert_eq!(d.mode, Mode::Static);
    assert_eq!(d.plan, sim.policy.static_plan());
    assert!(d.journal.is_empty());
}

#[test]
fn a_pin_holds_its_split_until_it_lapses_and_says_why() {
    let pol = policy_with(
        "  pins:\n    - network: AS7922\n      weights: {fastly: 80%, cloudflare: 20%}\n      until: 2027-01-15T08:00:00Z\n      reason: peering maintenance\n",
    );
    let until = pol.steering.pins[0].until;
    let mut sim = Sim::new(pol);
    let d = sim.round(until - Duration::from_secs(7200), &[]);
    assert_eq!(sim.weights("as7922"), fc(8000));
    assert_eq!(
        sim.plan.cohorts[0].cohort,
        c("as7922"),
        "finer cohorts match first"
    );
    let e = d.journal.iter().find(|e| e.rule == Rule::Pin).unwrap();
    assert!(e.evidence.note.contains("peering maintenance"));
    // A pinned cohort does not follow the scores.
    sim.round(
        until - Duration::from_secs(3000),
        &[input("as7922", "AS7922", 0.01, 300.0, 100.0)],
    );
    assert_eq!(sim.weights("as7922"), fc(8000));
    // Lapsed: the scores steer again.
    sim.round(
        until + Duration::from_secs(1),
        &[input("as7922", "AS7922", 0.01, 300.0, 100.0)],
    );
    assert_eq!(sim.weights("as7922"), fc(6000));
}

#[test]
fn a_gap_within_either_threshold_moves_nothing() {
    let mut sim = Sim::new(policy());
    // 15 ms absolute is under 20 ms.
    let d = sim.round(t(0), &[input("default", "*", 1.0, 100.0, 115.0)]);
    assert!(d.journal.is_empty());
    // 30 ms but only 5% of 600 ms.
    let d = sim.round(t(1), &[input("default", "*", 1.0, 570.0, 600.0)]);
    assert!(d.journal.is_empty());
    // Too few samples.
    let mut thin = input("default", "*", 1.0, 100.0, 300.0);
    std::sync::Arc::make_mut(&mut thin.evidence)[0].samples = 199;
    assert!(sim.round(t(2), &[thin]).journal.is_empty());
}

#[test]
fn a_significant_gap_moves_one_damped_step_then_settles() {
    let mut sim = Sim::new(policy());
    let inputs = [input("default", "*", 0.5, 200.0, 100.0)];
    let d = sim.round(t(0), &inputs);
    assert_eq!(sim.weights("default"), fc(3000));
    let e = &d.journal[0];
    assert_eq!(e.rule, Rule::Rum);
    assert_eq!(e.evidence.gap_ms, Some(100.0));
    assert_eq!(e.evidence.samples(&p("fastly")), 1000);
    sim.round(t(300), &inputs);
    assert_eq!(sim.weights("default"), fc(3000), "settling for 10 minutes");
    let d = sim.round(t(600), &inputs);
    assert_eq!(sim.weights("default"), fc(1000));
    assert_eq!(d.journal.len(), 1);
    // The floor holds fastly at 10%; the next round re-measures instead.
    let d = sim.round(t(1200), &inputs);
    assert_eq!(sim.weights("default"), fc(1000));
    assert_eq!(d.journal.len(), 1);
    assert_eq!(d.journal[0].rule, Rule::Remeasured);
}

#[test]
fn switching_back_needs_the_larger_gap() {
    let mut sim = Sim::new(policy());
    sim.round(t(0), &[input("default", "*", 0.1, 200.0, 100.0)]);
    assert_eq!(sim.weights("default"), fc(3000));
    // Now fastly is faster by 25 ms (over 20 ms, but under 30 ms = 20 × 1.5): no switch back.
    let d = sim.round(t(700), &[input("default", "*", 0.1, 175.0, 200.0)]);
    assert!(d.journal.iter().all(|e| !e.is_move()), "{:?}", d.journal);
    let d = sim.round(t(1400), &[input("default", "*", 0.1, 165.0, 200.0)]);
    assert_eq!(sim.weights("default"), fc(5000));
    assert!(d.journal[0].evidence.switching_back);
    assert_eq!(d.journal[0].evidence.required_ms, Some(30.0));
}

#[test]
fn the_hourly_cap_weighs_cohorts_by_their_traffic() {
    let mut sim = Sim::new(policy());
    // Two cohorts with 80% of traffic each wanting 20%: 16% + 16% > 30%.
    let inputs = [
        input("as1", "AS1", 0.8, 200.0, 100.0),
        input("as2", "AS2", 0.8, 210.0, 100.0),
    ];
    let d = sim.round(t(0), &inputs);
    let moved: f64 = d
        .journal
        .iter()
        .filter(|e| e.is_move())
        .map(|e| f64::from(e.moved_bp()) * 0.8)
        .sum();
    assert!(moved <= 3000.0 + 1e-9, "{moved}");
    assert_eq!(
        sim.weights("as2"),
        fc(3000),
        "the larger relative gap goes first"
    );
    assert_eq!(sim.weights("as1"), fc(5000 - 1750));
    // Journaled in plan order; the cut-short move says which guardrail cut it.
    let cohorts: Vec<&str> = d.journal.iter().map(|e| e.cohort.as_str()).collect();
    assert_eq!(cohorts, ["as1", "as2"]);
    assert_eq!(d.journal[0].evidence.capped_by, Some(Guardrail::HourlyCap));
    assert_eq!(d.journal[1].evidence.capped_by, None);
    let d = sim.round(t(700), &inputs);
    assert!(d.journal.iter().all(|e| !e.is_move()));
    assert_eq!(d.held.len(), 2);
}

#[test]
fn decisions_are_deterministic() {
    let pol = policy();
    let plan = pol.static_plan();
    let state = EngineState::new();
    let mut health = BTreeMap::new();
    health.insert(p("cloudflare"), ProviderHealth::down(t(0)));
    let cohorts = [
        input("as1", "AS1", 0.3, 200.0, 100.0),
        input("default", "*", 0.5, 150.0, 100.0),
    ];
    let inputs = Inputs {
        policy: &pol,
        current: &plan,
        cohorts: &cohorts,
        health: &health,
        data_as_of: Some(t(10)),
        state: &state,
    };
    assert_eq!(decide(t(10), &inputs), decide(t(10), &inputs));
}

// ---- properties -------------------------------------------------------------------------

const THREE: &str = r#"
site: {host: www.example.com}
providers:
  fastly: {kind: fastly, edge_host: f.example.net, service_id: svc}
  cloudflare: {kind: cloudflare, edge_host: c.example.net, zone_id: zone}
  edgeco: {kind: generic, edge_host: e.example.net}
health: {path: /h, expect: ok, regions: [a, b, c]}
steering:
  record: www.example.com
  zone: example.com
  regions:
    - name: europe
      match: [DE, FR]
      weights: {fastly: 60%, cloudflare: 20%, edgeco: 20%}
    - name: default
      match: ["*"]
      weights: {fastly: 40%, cloudflare: 30%, edgeco: 30%}
  floors: {measurement: 10%, commits: {edgeco: 15%}}
  rum: {min_samples: 200, relative_gap: 10%, absolute_gap: 20ms, step: 20%, settle: 10m}
  guardrails: {max_moved_per_hour: 30%, max_change_per_cohort: 40%, stale_after: 15m}
"#;

fn three() -> Policy {
    static THREE_POLICY: std::sync::LazyLock<Policy> =
        std::sync::LazyLock::new(|| Policy::from_yaml(THREE, "three.yaml").unwrap());
    THREE_POLICY.clone()
}

const NAMES: [&str; 3] = ["cloudflare", "edgeco", "fastly"];

fn split() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..100, 3).prop_map(|raw| {
        let raw = if raw.iter().all(|x| *x == 0) {
            vec![1, 1, 1]
        } else {
            raw
        };
        largest_remainder(&raw, TOTAL_BP)
    })
}

fn weights_of(bp: &[u32]) -> Weights {
    Weights::new(NAMES.iter().map(|n| p(n)).zip(bp.iter().copied())).unwrap()
}

#[derive(Debug, Clone)]
struct Case {
    current: Vec<Vec<u32>>,
    scores: Vec<Vec<Option<f64>>>,
    shares: Vec<f64>,
    down: Vec<Option<u64>>,
    last_move_ago: Vec<Option<u64>>,
}

fn case(cohorts: usize) -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(split(), cohorts),
        prop::collection::vec(
            prop::collection::vec(prop::option::weighted(0.9, 20.0f64..800.0), 3),
            cohorts,
        ),
        prop::collection::vec(0.0f64..1.0, cohorts),
        prop::collection::vec(prop::option::weighted(0.2, 0u64..400), 3),
        prop::collection::vec(prop::option::of(0u64..4000), cohorts),
    )
        .prop_map(|(current, scores, shares, down, last_move_ago)| Case {
            current,
            scores,
            shares,
            down,
            last_move_ago,
        })
}

fn cohort_names(n: usize) -> Vec<CohortId> {
    let mut v: Vec<CohortId> = (0..n.saturating_sub(2))
        .map(|i| c(&format!("as{}", 100 + i)))
        .collect();
    v.push(c("europe"));
    v.push(c("default"));
    v
}

fn build(
    case: &Case,
    pol: &Policy,
) -> (
    SteeringPlan,
    Vec<CohortInput>,
    BTreeMap<ProviderId, ProviderHealth>,
    EngineState,
) {
    let names = cohort_names(case.current.len());
    let statics = pol.static_plan();
    let mut plan = SteeringPlan {
        record: statics.record.clone(),
        ttl: statics.ttl,
        cohorts: Vec::new(),
    };
    let mut inputs = Vec::new();
    let mut state = EngineState::new();
    for (i, id) in names.iter().enumerate() {
        let networks = match id.as_str() {
            "europe" => vec!["DE".parse().unwrap(), "FR".parse().unwrap()],
            "default" => vec![NetworkKey::Global],
            other => vec![NetworkKey::Asn(other[2..].parse().unwrap())],
        };
        plan.cohorts.push(CohortPlan {
            cohort: id.clone(),
            networks: networks.clone().into(),
            weights: weights_of(&case.current[i]),
        });
        inputs.push(CohortInput {
            cohort: id.clone(),
            networks: networks.into(),
            parent: Some(c("default")),
            share: case.shares[i] / names.len() as f64,
            cut: None,
            pairings: Arc::from(vec![]),
            experienced: Arc::from(vec![]),
            evidence: NAMES
                .iter()
                .zip(&case.scores[i])
                .map(|(n, s)| ProviderEvidence {
                    stderr: None,
                    provider: p(n),
                    score: *s,
                    samples: 500,
                })
                .collect(),
        });
        if let Some(ago) = case.last_move_ago[i] {
            let mem = state.cohorts.get_mut_or_default(id);
            mem.last_move = Some(LastMove {
                at: t(10_000 - ago),
                from: p("fastly"),
                to: p("cloudflare"),
            });
        }
    }
    let mut health = BTreeMap::new();
    for (n, d) in NAMES.iter().zip(&case.down) {
        if let Some(ago) = d {
            health.insert(p(n), ProviderHealth::down(t(10_000 - ago)));
        }
    }
    (plan, inputs, health, state)
}

fn satisfies_floors(w: &Weights, pol: &Policy) -> bool {
    NAMES
        .iter()
        .all(|n| w.get(&p(n)) >= pol.steering.floors.for_provider(&p(n)).bp())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn weights_always_sum_to_ten_thousand(case in case(4)) {
        let pol = three();
        let (plan, inputs, health, state) = build(&case, &pol);
        let d = decide(t(10_000), &Inputs { policy: &pol, current: &plan, cohorts: &inputs, health: &health, data_as_of: Some(t(9_999)), state: &state });
        prop_assert!(!d.plan.cohorts.is_empty());
        prop_assert!(d.plan.check(Some(&pol.provider_ids())).is_ok());
        for c in &d.plan.cohorts {
            prop_assert_eq!(c.weights.iter().map(|(_, bp)| bp).sum::<u32>(), TOTAL_BP);
        }
    }

    #[test]
    fn floors_hold_for_every_healthy_provider(case in case(4)) {
        let pol = three();
        let (plan, inputs, health, state) = build(&case, &pol);
        let d = decide(t(10_000), &Inputs { policy: &pol, current: &plan, cohorts: &inputs, health: &health, data_as_of: Some(t(9_999)), state: &state });
        if d.mode == Mode::Steering {
            for c in &d.plan.cohorts {
                for n in NAMES {
                    if !health.contains_key(&p(n)) {
                        prop_assert!(c.weights.get(&p(n)) >= pol.steering.floors.for_provider(&p(n)).bp(), "{} {}", c.cohort, c.weights);
                    }
                }
            }
        } else {
            prop_assert_eq!(d.mode, Mode::AllDown);
        }
    }

    #[test]
    fn no_cohort_moves_more_than_its_step(case in case(4)) {
        let pol = three();
        let mut case = case;
        case.down = vec![None; 3];
        let (mut plan, inputs, health, state) = build(&case, &pol);
        for c in &mut plan.cohorts {
            // Start from weights that already meet the floors, so only steering moves them.
            if !satisfies_floors(&c.weights, &pol) {
                c.weights = pol.static_plan().cohorts[1].weights.clone();
            }
        }
        let d = decide(t(10_000), &Inputs { policy: &pol, current: &plan, cohorts: &inputs, health: &health, data_as_of: Some(t(9_999)), state: &state });
        for c in &d.plan.cohorts {
            let before = &plan.cohort(&c.cohort).unwrap().weights;
            prop_assert!(before.distance(&c.weights) <= pol.steering.rum.step.bp(), "{}: {} -> {}", c.cohort, before, c.weights);
        }
    }

    #[test]
    fn total_movement_per_hour_stays_under_its_cap(case in case(6), drift in prop::collection::vec(-300.0f64..300.0, 12)) {
        let pol = three();
        let mut case = case;
        case.down = vec![None; 3];
        case.last_move_ago = vec![None; case.current.len()];
        let (mut plan, mut inputs, health, mut state) = build(&case, &pol);
        for c in &mut plan.cohorts {
            if !satisfies_floors(&c.weights, &pol) {
                c.weights = pol.static_plan().cohorts[1].weights.clone();
            }
        }
        let shares: HashMap<CohortId, f64> = inputs.iter().map(|i| (i.cohort.clone(), i.share)).collect();
        let mut moves: Vec<(Timestamp, f64)> = Vec::new();
        for (round, d) in drift.iter().enumerate() {
            let now = t(10_000 + round as u64 * 660);
            for i in &mut inputs {
                for e in std::sync::Arc::make_mut(&mut i.evidence).iter_mut() {
                    if e.provider.as_str() == "fastly" {
                        e.score = e.score.map(|s| (s + d).max(1.0));
                    }
                }
            }
            let dec = decide(now, &Inputs { policy: &pol, current: &plan, cohorts: &inputs, health: &health, data_as_of: Some(now), state: &state });
            for e in dec.journal.iter().filter(|e| e.is_move()) {
                moves.push((now, f64::from(e.moved_bp()) * shares[&e.cohort]));
            }
            plan = dec.plan;
            state = dec.state;
            let hour: f64 = moves.iter().filter(|(at, _)| now.since(*at) < Duration::from_secs(3600)).map(|(_, m)| m).sum();
            prop_assert!(hour <= f64::from(pol.steering.guardrails.max_moved_per_hour.bp()) + 1e-6, "{} bp in the hour", hour);
        }
    }

    #[test]
    fn providers_equal_within_noise_never_move_over_a_day(seed in any::<u64>(), base in 30.0f64..900.0) {
        let pol = policy();
        let mut sim = Sim::new(pol);
        let mut x = seed | 1;
        let mut noise = || {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            // Within ±9 ms of each other: under the 20 ms absolute gap.
            (x % 1800) as f64 / 100.0 - 9.0
        };
        for round in 0..288u64 {
            let inputs = [
                input("as7922", "AS7922", 0.2, base + noise() / 2.0, base + noise() / 2.0),
                input("europe", "DE", 0.5, base + noise() / 2.0, base + noise() / 2.0),
                input("default", "*", 0.3, base + noise() / 2.0, base + noise() / 2.0),
            ];
            let d = sim.round(t(round * 300), &inputs);
            prop_assert!(d.journal.iter().all(|e| !e.is_move()), "{:?}", d.journal);
        }
    }
}

#[test]
fn a_carved_out_cohort_without_data_keeps_its_weights_and_falls_back_to_its_region() {
    let mut sim = Sim::new(policy());
    let mut as3320 = input("as3320", "AS3320", 0.2, 300.0, 100.0);
    as3320.parent = Some(c("europe"));
    sim.round(t(0), &[as3320]);
    assert_eq!(
        sim.weights("as3320"),
        fc(7000),
        "carved out of europe's 90/10, one step"
    );
    sim.round(t(700), &[]);
    assert_eq!(
        sim.weights("as3320"),
        fc(7000),
        "no data: no move, and the cohort stays"
    );
    let d = decide(
        t(5000),
        &Inputs {
            policy: &sim.policy,
            current: &sim.plan,
            cohorts: &[],
            health: &sim.health,
            data_as_of: Some(t(700)),
            state: &sim.state,
        },
    );
    assert_eq!(d.mode, Mode::Deadman);
    let e = d.journal.iter().find(|e| e.cohort == c("as3320")).unwrap();
    assert_eq!(
        e.after,
        fc(9000),
        "europe's static weights, not the default's"
    );
}

#[test]
fn memory_is_found_whatever_the_order_the_plan_and_inputs_list_the_cohorts_in() {
    // The engine keeps its memory in the order the last round wrote it and reads it front to
    // back; a plan and inputs in another order must find every cohort's memory all the same
    // (moves settle, the hourly budget is spent once), and decide exactly as in order.
    let mut sim = Sim::new(policy());
    let inputs: Vec<CohortInput> = (1..=40)
        .map(|n| input(&format!("as{n}"), &format!("AS{n}"), 0.001, 300.0, 100.0))
        .collect();
    let first = sim.round(t(0), &inputs);
    assert_eq!(first.journal.len(), 40, "every cohort moves a step");
    let mut reversed_plan = sim.plan.clone();
    // Carved-out cohorts are listed before the regions.
    reversed_plan.cohorts[..40].reverse();
    let mut reversed_inputs = inputs.clone();
    reversed_inputs.reverse();
    let mk = |plan: &SteeringPlan, cohorts: &[CohortInput], at| {
        decide(
            at,
            &Inputs {
                policy: &sim.policy,
                current: plan,
                cohorts,
                health: &sim.health,
                data_as_of: Some(at),
                state: &sim.state,
            },
        )
    };
    let sorted = |d: &Decision| {
        let mut j: Vec<String> = d.journal.iter().map(|e| e.to_string()).collect();
        j.sort();
        let mut w: Vec<String> = d
            .plan
            .cohorts
            .iter()
            .map(|c| format!("{}: {}", c.cohort, c.weights))
            .collect();
        w.sort();
        (j, w)
    };
    for at in [t(60), t(700)] {
        let (a, b) = (
            mk(&sim.plan, &inputs, at),
            mk(&reversed_plan, &reversed_inputs, at),
        );
        assert_eq!(sorted(&a), sorted(&b), "at {at}");
        assert_eq!(a.state, b.state, "at {at}");
        for n in 1..=40 {
            let id = c(&format!("as{n}"));
            assert!(
                b.state
                    .cohorts
                    .get(&id)
                    .is_some_and(|m| m.last_move.is_some()),
                "{id}"
            );
            assert_eq!(b.state.parent(&id), Some(&c("default")));
        }
    }
    // A minute after the moves every cohort is settling: nothing moves, in either order.
    let settling = mk(&reversed_plan, &reversed_inputs, t(60));
    assert!(
        settling.journal.iter().all(|e| e.rule != Rule::Rum),
        "{:?}",
        settling.journal
    );
    assert!(
        mk(&reversed_plan, &reversed_inputs, t(700))
            .journal
            .iter()
            .any(|e| e.rule == Rule::Rum),
        "settled: the next step"
    );
}

#[test]
fn memory_read_back_from_json_decides_the_same() {
    // The state's cohorts come back from JSON in id order, not in plan order: the engine must
    // find every carved-out cohort's region all the same.
    let mut sim = Sim::new(policy());
    let mut inputs: Vec<CohortInput> = [9, 3, 7, 1, 5]
        .iter()
        .map(|n| {
            let mut i = input(&format!("as{n}"), &format!("AS{n}"), 0.01, 300.0, 100.0);
            i.parent = Some(c(if n % 2 == 0 { "default" } else { "europe" }));
            i
        })
        .collect();
    sim.round(t(0), &inputs);
    assert_eq!(sim.state.parents().count(), 5);
    let json = serde_json::to_string(&sim.state).unwrap();
    assert!(json.contains(r#""as7":{"#), "{json}");
    let back: EngineState = serde_json::from_str(&json).unwrap();
    assert_eq!(back.parent(&c("as7")), Some(&c("europe")));
    assert_eq!(back.cohorts, sim.state.cohorts);
    // No data for two of them: they keep their weights, and the deadman folds them back into
    // their own regions.
    inputs.truncate(3);
    let mk = |state: &EngineState, plan: &SteeringPlan, at| {
        decide(
            at,
            &Inputs {
                policy: &sim.policy,
                current: plan,
                cohorts: &inputs,
                health: &sim.health,
                data_as_of: Some(t(700)),
                state,
            },
        )
    };
    for at in [t(700), t(5000)] {
        let (x, y) = (mk(&back, &sim.plan, at), mk(&sim.state, &sim.plan, at));
        assert_eq!((x.plan, x.journal, x.mode), (y.plan, y.journal, y.mode));
    }
    let deadman = mk(&back, &sim.plan, t(5000));
    assert_eq!(deadman.mode, Mode::Deadman);
    let as5 = deadman
        .journal
        .iter()
        .find(|e| e.cohort == c("as5"))
        .unwrap();
    assert_eq!(as5.after, fc(9000), "europe's static weights");
}

#[test]
fn a_capped_move_goes_in_whole_half_percent_steps_and_a_crumb_is_held() {
    let mut sim = Sim::new(policy());
    // as1 (80% of traffic, the larger gap) moves 20% of it first: 16% of the 30% an hour.
    // That leaves 14% of all traffic, 1917.8 bp of as2's 73%: it moves 1900, not 1917.
    let inputs = [
        input("as1", "AS1", 0.8, 250.0, 100.0),
        input("as2", "AS2", 0.73, 200.0, 100.0),
    ];
    let d = sim.round(t(0), &inputs);
    assert_eq!(sim.weights("as1"), fc(3000));
    assert_eq!(sim.weights("as2"), fc(3100));
    let as2 = d.journal.iter().find(|e| e.cohort == c("as2")).unwrap();
    assert_eq!(as2.evidence.capped_by, Some(Guardrail::HourlyCap));
    assert_eq!(as2.moved_bp(), 1900);
    // A move cut to less than one step is held, not made.
    let pol = Policy::from_yaml(
        &BASE.replace("max_moved_per_hour: 30%", "max_moved_per_hour: 0.3%"),
        "test.yaml",
    )
    .unwrap();
    let mut sim = Sim::new(pol);
    let d = sim.round(t(0), &[input("as1", "AS1", 0.8, 200.0, 100.0)]);
    // 30 bp of all traffic is 37.5 bp of as1's: under one 50 bp step.
    assert!(d.journal.iter().all(|e| !e.is_move()), "{:?}", d.journal);
    assert_eq!(d.held.len(), 1);
    assert_eq!(d.held[0].by, Guardrail::HourlyCap);
    assert_eq!(sim.weights("as1"), fc(5000));
}

#[test]
fn rum_does_not_move_a_provider_less_than_a_step_above_its_floor() {
    let mut sim = Sim::new(policy());
    // Fastly is 0.3% above its 10% floor: not worth a move, however slow it is.
    sim.plan.cohorts[1].weights = fc(1030);
    let d = sim.round(t(0), &[input("default", "*", 0.5, 300.0, 100.0)]);
    assert!(d.journal.iter().all(|e| !e.is_move()), "{:?}", d.journal);
    sim.plan.cohorts[1].weights = fc(1050);
    let d = sim.round(t(1), &[input("default", "*", 0.5, 300.0, 100.0)]);
    assert_eq!(d.journal[0].moved_bp(), MOVE_STEP_BP);
    assert_eq!(sim.weights("default"), fc(1000));
}

fn ctx_of<'a>(
    pol: &'a Policy,
    health: &BTreeMap<ProviderId, ProviderHealth>,
    now: Timestamp,
) -> Ctx<'a> {
    let providers = pol.provider_ids();
    let down: Vec<(ProviderId, Timestamp)> = providers
        .iter()
        .filter_map(|p| {
            health
                .get(p)
                .filter(|h| h.state == HealthState::Down)
                .map(|h| (p.clone(), h.since))
        })
        .collect();
    Ctx {
        now,
        threads: 1,
        rum: &pol.steering.rum,
        steering: &pol.steering,
        failed_over: failed_over(&pol.steering.failover, now, &down),
        down,
        floors: providers
            .iter()
            .map(|p| (p.clone(), pol.floor_of(p).bp()))
            .collect(),
        standby: providers
            .iter()
            .filter(|p| pol.is_standby(p))
            .cloned()
            .collect(),
        drills: Vec::new(),
        drill_progress: BTreeMap::new(),
        providers,
    }
}

fn three_pinned() -> Policy {
    Policy::from_yaml(&format!("{THREE}  pins:\n    - network: AS101\n      weights: {{fastly: 20%, cloudflare: 50%, edgeco: 30%}}\n      until: 2027-01-15T08:00:00Z\n      reason: test\n    - network: AS7\n      weights: {{fastly: 20%, cloudflare: 50%, edgeco: 30%}}\n      until: 2027-01-15T08:00:00Z\n      reason: test\n"), "three.yaml").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn no_optimizing_move_is_smaller_than_a_step_unless_it_reaches_its_target(
        case in case(6),
        drift in prop::collection::vec(-300.0f64..300.0, 10),
        flips in prop::collection::vec(prop::option::weighted(0.3, 0usize..3), 10),
        pinned in any::<bool>(),
    ) {
        let pol = if pinned { three_pinned() } else { three() };
        let (mut plan, mut inputs, mut health, mut state) = build(&case, &pol);
        for (round, d) in drift.iter().enumerate() {
            let now = t(10_000 + round as u64 * 700);
            for i in &mut inputs {
                for e in std::sync::Arc::make_mut(&mut i.evidence).iter_mut() {
                    if e.provider.as_str() == "fastly" {
                        e.score = e.score.map(|s| (s + d).max(1.0));
                    }
                }
            }
            if let Some(k) = flips[round] {
                let n = p(NAMES[k]);
                if health.remove(&n).is_none() {
                    health.insert(n, ProviderHealth::down(now));
                }
            }
            let dec = decide(now, &Inputs { policy: &pol, current: &plan, cohorts: &inputs, health: &health, data_as_of: Some(now), state: &state });
            let ctx = ctx_of(&pol, &health, now);
            for e in dec.journal.iter().filter(|e| e.is_move()) {
                let moved = e.moved_bp();
                match e.rule {
                    Rule::Rum | Rule::Pin | Rule::Recovery if e.evidence.capped_by.is_some() => {
                        prop_assert!(moved >= MOVE_STEP_BP && moved % MOVE_STEP_BP == 0, "{e}");
                    }
                    Rule::Rum => prop_assert!(moved >= MOVE_STEP_BP, "{e}"),
                    Rule::Pin if moved < MOVE_STEP_BP => {
                        let pin = pol.steering.pins.iter().find(|p| e.networks == [p.network]).unwrap();
                        let target = floored(&ctx, &respect_down(&ctx, &pin.weights().unwrap(), &e.before));
                        prop_assert_eq!(&e.after, &target, "{}", e);
                    }
                    Rule::Recovery if moved < MOVE_STEP_BP => {
                        let mem = state.cohorts.get(&e.cohort).unwrap();
                        let goal = mem.recovering_to.as_ref().or(mem.before_failover.as_ref()).unwrap();
                        prop_assert_eq!(&e.after, &floored(&ctx, goal), "{}", e);
                    }
                    _ => {}
                }
            }
            plan = dec.plan;
            state = dec.state;
        }
    }
}

// ---- Configured standby, static fallback, drills (seed 000 sections 18-21) ----

/// The test policy with cloudflare as the configured standby: every region on fastly.
fn standby_with(extra: &str) -> Policy {
    let src = BASE
        .replace("zone_id: zone}", "zone_id: zone, standby: true}")
        .replace(
            "{fastly: 90%, cloudflare: 10%}",
            "{fastly: 100%, cloudflare: 0%}",
        )
        .replace(
            "{fastly: 50%, cloudflare: 50%}",
            "{fastly: 100%, cloudflare: 0%}",
        );
    Policy::from_yaml(&format!("{src}{extra}"), "standby.yaml").unwrap()
}

#[test]
fn a_standby_carries_nothing_and_rum_never_moves_traffic_to_it() {
    let mut sim = Sim::new(standby_with(""));
    assert_eq!(sim.weights("default"), fc(10_000));
    // The standby measures three times faster, for hours: nothing moves, and no floor is
    // enforced for it.
    for i in 0..10 {
        let d = sim.round(t(i * 900), &[input("default", "*", 1.0, 300.0, 100.0)]);
        assert!(d.journal.iter().all(|e| !e.is_move()), "{:?}", d.journal);
    }
    assert_eq!(sim.weights("default"), fc(10_000));
    assert_eq!(sim.weights("europe"), fc(10_000));
}

#[test]
fn the_standby_takes_traffic_in_failover_steps_and_gives_it_back() {
    let mut sim = Sim::new(standby_with(""));
    sim.health.insert(p("fastly"), ProviderHealth::down(t(0)));
    let d = sim.round(t(0), &[]);
    assert_eq!(
        sim.weights("default"),
        fc(5_000),
        "first step to the standby"
    );
    assert!(d.journal.iter().all(|e| e.rule == Rule::Failover));
    sim.round(t(90), &[]);
    assert_eq!(sim.weights("default"), fc(0), "all on the standby");
    assert_eq!(sim.weights("europe"), fc(0));
    // Fastly recovers: the traffic returns to it, and none is left on the standby.
    // The return is damped like any recovery (the primary's caches are cold) and spends the
    // hourly budget, so it takes hours; it never goes back towards the standby.
    sim.health.insert(p("fastly"), ProviderHealth::up(t(600)));
    let mut last = 0;
    for i in 0..240 {
        sim.round(t(600 + i * 90), &[]);
        let now = sim.weights("default").get(&p("fastly"));
        assert!(now >= last, "round {i}: {now} after {last}");
        last = now;
    }
    assert_eq!(sim.weights("default"), fc(10_000));
    assert_eq!(sim.weights("europe"), fc(10_000));
}

#[test]
fn every_provider_down_answers_with_the_static_fallback_and_leaves_it_when_one_recovers() {
    let pol = policy_with("  fallback: {host: catalogue.example-static.net}\n");
    let mut sim = Sim::new(pol);
    sim.health.insert(p("fastly"), ProviderHealth::down(t(0)));
    sim.health
        .insert(p("cloudflare"), ProviderHealth::down(t(0)));
    let d = sim.round(t(0), &[]);
    assert_eq!(d.mode, Mode::AllDown);
    for cohort in ["europe", "default"] {
        let w = sim.weights(cohort);
        assert_eq!(w.get(&Fallback::id()), TOTAL_BP, "{cohort}: {w}");
    }
    assert!(
        d.journal.iter().any(|e| e.rule == Rule::Fallback
            && e.evidence.note.contains("catalogue.example-static.net"))
    );
    // Still all down: the fallback holds, no new entries claim a move.
    sim.round(t(90), &[]);
    assert_eq!(sim.weights("default").get(&Fallback::id()), TOTAL_BP);
    // Cloudflare is back, fastly still down: straight to cloudflare, never an empty or
    // fallback answer while a provider is healthy.
    sim.health
        .insert(p("cloudflare"), ProviderHealth::up(t(180)));
    let d = sim.round(t(180), &[]);
    assert_eq!(d.mode, Mode::Steering);
    assert_eq!(sim.weights("europe"), fc(0), "{}", sim.weights("europe"));
    assert_eq!(sim.weights("default"), fc(0));
    assert!(
        d.journal.iter().any(|e| e.rule == Rule::FallbackLeft
            && e.evidence.note.contains("cloudflare healthy again"))
    );
    assert!(
        sim.plan
            .cohorts
            .iter()
            .all(|c| c.weights.get(&Fallback::id()) == 0)
    );
}

#[test]
fn without_a_fallback_every_provider_down_serves_the_static_weights() {
    let mut sim = Sim::new(policy());
    sim.health.insert(p("fastly"), ProviderHealth::down(t(0)));
    sim.health
        .insert(p("cloudflare"), ProviderHealth::down(t(0)));
    sim.round(t(0), &[]);
    assert_eq!(sim.weights("europe"), fc(9_000));
}

fn drill(extra: &str) -> Policy {
    // t(100) is 2027-01-15T08:01:40Z.
    standby_with(&format!(
        "  drills:\n    - name: q1-standby\n      at: 2027-01-15T08:01:40Z\n      to: cloudflare\n      hold: 30m\n{extra}"
    ))
}

#[test]
fn a_drill_shifts_in_steps_holds_returns_and_is_never_oscillation() {
    let mut sim = Sim::new(drill(""));
    let faster_fastly = [input("default", "*", 1.0, 100.0, 300.0)];
    sim.round(t(0), &faster_fastly);
    assert_eq!(sim.weights("default"), fc(10_000), "pending");
    sim.round(t(100), &faster_fastly);
    assert_eq!(sim.weights("default"), fc(5_000), "first step");
    sim.round(t(190), &faster_fastly);
    assert_eq!(sim.weights("default"), fc(0), "whole share on the standby");
    assert_eq!(sim.weights("europe"), fc(0));
    // Held for 30 minutes although fastly measures three times faster, and no floor.
    for i in 0..19 {
        sim.round(t(190 + i * 90), &faster_fastly);
        assert_eq!(sim.weights("default"), fc(0), "holding at round {i}");
    }
    let progress = sim.state.drills.get(&c("q1-standby")).unwrap().clone();
    assert_eq!(progress.time_to_shift(), Some(Duration::from_secs(90)));
    assert!(progress.ended.is_none());
    // The return: 90 s ramp + 30 min hold after t(100).
    sim.round(t(100 + 90 + 1800), &faster_fastly);
    assert_eq!(sim.weights("default"), fc(5_000), "first step back");
    sim.round(t(100 + 180 + 1800), &faster_fastly);
    assert_eq!(sim.weights("default"), fc(10_000), "back");
    sim.round(t(100 + 270 + 1800), &faster_fastly);
    assert_eq!(sim.weights("default"), fc(10_000));
    let progress = sim.state.drills.get(&c("q1-standby")).unwrap();
    assert!(progress.ended.is_some() && progress.aborted.is_none());
    let drills: Vec<_> = sim
        .journal
        .iter()
        .filter(|e| e.rule == Rule::Drill)
        .collect();
    assert_eq!(
        drills.len(),
        8,
        "two cohorts, two steps each way: {drills:#?}"
    );
    assert!(
        drills[0]
            .evidence
            .note
            .contains("drill q1-standby shifting"),
        "{}",
        drills[0].evidence.note
    );
    let mut journal = crate::journal::Journal::new();
    journal.extend(sim.journal.clone());
    let health = journal.loop_health(t(0), t(4000), Duration::from_secs(7200), 2);
    assert!(health.oscillating.is_empty(), "{:?}", health.oscillating);
    assert_eq!(health.by_rule.get(&Rule::Drill), Some(&8));
}

#[test]
fn an_aborted_drill_returns_at_once_from_the_level_reached() {
    let mut sim = Sim::new(drill(""));
    sim.round(t(100), &[]);
    sim.round(t(190), &[]);
    assert_eq!(sim.weights("default"), fc(0));
    assert!(sim.state.abort_drill(
        &c("q1-standby"),
        t(300),
        Some(c("europe")),
        "europe: p90 up 400 ms"
    ));
    let d = sim.round(t(300), &[]);
    assert_eq!(sim.weights("default"), fc(5_000), "one step back at once");
    assert!(
        d.journal
            .iter()
            .any(|e| e.evidence.note.contains("aborted, returning"))
    );
    sim.round(t(390), &[]);
    assert_eq!(sim.weights("default"), fc(10_000));
    let progress = sim.state.drills.get(&c("q1-standby")).unwrap();
    assert_eq!(progress.aborted.as_ref().unwrap().region, Some(c("europe")));
    assert!(progress.ended.is_some());
    // Long after, nothing moves again.
    let d = sim.round(t(5000), &[]);
    assert!(d.journal.iter().all(|e| !e.is_move()), "{:?}", d.journal);
}

#[test]
fn a_drill_whose_target_goes_down_ends_and_the_failover_takes_over() {
    let mut sim = Sim::new(drill(""));
    sim.round(t(100), &[]);
    sim.round(t(190), &[]);
    sim.health
        .insert(p("cloudflare"), ProviderHealth::down(t(250)));
    sim.round(t(250), &[]);
    let progress = sim.state.drills.get(&c("q1-standby")).unwrap();
    assert!(
        progress
            .aborted
            .as_ref()
            .unwrap()
            .reason
            .contains("cloudflare is down")
    );
    // Back on fastly within the failover's steps, and it stays there.
    sim.round(t(340), &[]);
    sim.round(t(430), &[]);
    assert_eq!(sim.weights("default"), fc(10_000));
}

#[test]
fn a_partial_drill_of_one_region_leaves_the_others_alone() {
    let mut sim = Sim::new(drill("      share: 50%\n      cohorts: [europe]\n"));
    sim.round(t(100), &[]);
    sim.round(t(190), &[]);
    assert_eq!(sim.weights("europe"), fc(5_000));
    assert_eq!(sim.weights("default"), fc(10_000));
}

#[test]
fn the_big_red_switch_ends_a_running_drill() {
    let mut pol = drill("");
    pol.steering.guardrails.static_mode = true;
    let mut sim = Sim::new(drill(""));
    sim.round(t(100), &[]);
    sim.policy = pol;
    let d = sim.round(t(190), &[]);
    assert_eq!(d.mode, Mode::Static);
    assert_eq!(sim.weights("default"), fc(10_000));
    assert!(
        sim.state
            .drills
            .get(&c("q1-standby"))
            .unwrap()
            .ended
            .is_some()
    );
}

/// A round over more cohorts than one chunk holds decides the same on one thread as on two or
/// three: failover steps, floors fixed, RUM moves and moves the hourly cap holds, each journaled
/// in cohort order whichever chunk made it.
#[test]
fn a_large_round_decides_the_same_on_any_number_of_threads() {
    let n = 3 * CHUNK_MIN + 77;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let case = Case {
        current: (0..n)
            .map(|_| {
                let raw: Vec<u32> = (0..3).map(|_| 1 + next(100) as u32).collect();
                largest_remainder(&raw, TOTAL_BP)
            })
            .collect(),
        scores: (0..n)
            .map(|_| {
                (0..3)
                    .map(|_| (next(10) > 0).then(|| 20.0 + next(780) as f64))
                    .collect()
            })
            .collect(),
        shares: (0..n).map(|_| next(1000) as f64 / 1000.0).collect(),
        // cloudflare down for 40 s: the first failover step.
        down: vec![Some(40), None, None],
        last_move_ago: (0..n).map(|_| (next(3) == 0).then(|| next(4000))).collect(),
    };
    let pol = three();
    let (plan, inputs, health, mut state) = build(&case, &pol);
    // Most of the hour's movement already spent: the cap binds.
    state.recent.push_back((t(10_000 - 600), 2_900.0));
    let round = |threads| {
        decide_on(
            t(10_000),
            &Inputs {
                policy: &pol,
                current: &plan,
                cohorts: &inputs,
                health: &health,
                data_as_of: Some(t(10_000)),
                state: &state,
            },
            threads,
        )
    };
    let one = round(1);
    let count = |r: Rule| one.journal.iter().filter(|e| e.rule == r).count();
    assert!(count(Rule::Failover) > 10_000, "failover steps");
    assert!(count(Rule::Rum) > 100, "RUM moves");
    assert!(count(Rule::Floor) > 100, "floors fixed");
    assert!(one.held.len() > 1_000, "moves held by the cap");
    for threads in [2, 3] {
        assert!(round(threads) == one, "{threads} threads decide otherwise");
    }
}
