//! Route 53 round trips against the `moto` emulator on loopback (`.ci/run` starts it and sets
//! `MULTICDN_MOTO_ENDPOINT`). Without the variable these tests say so and skip; in CI (`CI`
//! set) its absence is a failure. Every test makes its own hosted zone and edge hosts, so
//! they run in parallel and against an emulator that keeps state between runs.

// Helpers outside `#[test]` functions unwrap too: a failed setup should fail the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU32, Ordering};

use multicdn_core::{ApplyOptions, Policy, ProviderId, Secret, Steerer, SteeringPlan, Weights};
use multicdn_providers::http::HttpSettings;
use multicdn_providers::route53::{AwsCredentials, Route53Client, Route53Steerer};

fn endpoint() -> Option<String> {
    match std::env::var("MULTICDN_MOTO_ENDPOINT") {
        Ok(e) if !e.is_empty() => Some(e),
        _ => {
            if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
                panic!(
                    "MULTICDN_MOTO_ENDPOINT is not set in CI: .ci/run must start moto before the tests"
                );
            }
            // Written past the test harness's capture, so the skip shows in a plain `cargo test`.
            use std::io::Write as _;
            let _ = std::io::stderr()
                .write_all(b"skipped: MULTICDN_MOTO_ENDPOINT not set (start moto, see .ci/run)\n");
            None
        }
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name no other test or run uses.
fn unique(test: &str) -> String {
    format!(
        "{test}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

fn client(endpoint: &str) -> Route53Client {
    let creds = AwsCredentials::new("testing", Secret::new("testing"));
    Route53Client::new(endpoint, creds, HttpSettings::default()).unwrap()
}

fn p(s: &str) -> ProviderId {
    ProviderId::new(s).unwrap()
}

/// The example policy on a zone and edges of its own.
fn policy(tag: &str) -> Policy {
    example_on_own_zone("policy.yaml", tag)
}

/// `examples/<file>` on a zone and edges of its own.
fn example_on_own_zone(file: &str, tag: &str) -> Policy {
    let mut policy =
        Policy::load(format!("{}/../examples/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let zone = format!("{tag}.example.com");
    policy.steering.record = format!("www.{zone}");
    policy.steering.zone = zone;
    for (id, spec) in policy.providers.iter_mut() {
        spec.edge_host = format!("{id}-{tag}.edge.example.net");
    }
    policy
}

async fn setup(test: &str) -> Option<(Route53Steerer, Policy)> {
    let endpoint = endpoint()?;
    let tag = unique(test);
    let policy = policy(&tag);
    let client = client(&endpoint);
    let zone_id = client
        .create_hosted_zone(&policy.steering.zone, &format!("ref-{tag}"))
        .await
        .unwrap();
    let mut steerer = Route53Steerer::from_policy(client, &zone_id, &policy);
    steerer
        .provision_health_checks(&policy, None)
        .await
        .unwrap();
    Some((steerer, policy))
}

fn failover(plan: &SteeringPlan, cohort: &str) -> SteeringPlan {
    let mut plan = plan.clone();
    let c = plan
        .cohorts
        .iter_mut()
        .find(|c| c.cohort.as_str() == cohort)
        .unwrap();
    c.weights = Weights::from_percentages([(p("fastly"), 50.0), (p("cloudflare"), 50.0)]).unwrap();
    plan
}

#[tokio::test]
async fn an_applied_plan_lists_back_with_the_same_weights_and_health_checks() {
    let Some((steerer, policy)) = setup("listback").await else {
        return;
    };
    let plan = policy.static_plan();
    let diff = steerer
        .apply(&plan, &ApplyOptions::default().wait_for_sync(true))
        .await
        .unwrap();
    assert_eq!(diff.changes.len(), plan.cohorts.len());

    let state = steerer.current().await.unwrap();
    for cohort in &plan.cohorts {
        let got = state
            .cohort(&cohort.cohort)
            .unwrap_or_else(|| panic!("{} missing", cohort.cohort));
        assert_eq!(got.weights, cohort.weights, "{}", cohort.cohort);
        let mut want = cohort.networks.to_vec();
        want.sort();
        assert_eq!(got.networks, want);
    }
    let checks = steerer.health_checks().clone();
    assert_eq!(checks.len(), 2);
    let sets = steerer.record_sets().await.unwrap();
    let weighted: Vec<_> = sets.iter().filter(|s| s.weight.is_some()).collect();
    assert_eq!(weighted.len(), 8);
    for set in weighted {
        let provider = set
            .set_identifier
            .as_deref()
            .unwrap()
            .rsplit('-')
            .next()
            .unwrap();
        assert_eq!(
            set.health_check_id.as_ref(),
            checks.get(provider),
            "{set:?}"
        );
    }
    assert_eq!(sets.iter().filter(|s| s.geo.is_some()).count(), 15);
}

#[tokio::test]
async fn applying_the_same_plan_again_changes_nothing() {
    let Some((steerer, policy)) = setup("again").await else {
        return;
    };
    let plan = policy.static_plan();
    steerer
        .apply(&plan, &ApplyOptions::default())
        .await
        .unwrap();
    let before = steerer.record_sets().await.unwrap();
    let dry = steerer.dry_run(&plan).await.unwrap();
    assert!(dry.is_empty(), "{dry}");
    let again = steerer
        .apply(&plan, &ApplyOptions::default())
        .await
        .unwrap();
    assert!(again.is_empty(), "{again}");
    assert_eq!(steerer.record_sets().await.unwrap(), before);
}

#[tokio::test]
async fn a_failover_plan_changes_only_the_affected_sets() {
    let Some((steerer, policy)) = setup("failover").await else {
        return;
    };
    let plan = policy.static_plan();
    steerer
        .apply(&plan, &ApplyOptions::default())
        .await
        .unwrap();
    let before = steerer.record_sets().await.unwrap();

    let moved = failover(&plan, "europe");
    let dry = steerer.dry_run(&moved).await.unwrap();
    let touched: Vec<&str> = dry
        .changes
        .iter()
        .map(|c| c.set.set_identifier.as_deref().unwrap())
        .collect();
    assert_eq!(touched, ["europe-cloudflare", "europe-fastly"], "{dry}");
    let text = dry.to_string();
    // 50/50 on 0-255: the odd unit goes to the first provider by id.
    assert!(text.contains("[europe-fastly] weight 229 -> 127"), "{text}");
    assert!(text.contains("2 of 23 sets touched"), "{text}");

    let diff = steerer
        .apply(&moved, &ApplyOptions::default())
        .await
        .unwrap();
    assert_eq!(diff.changes.len(), 1);
    assert_eq!(diff.changes[0].cohort.as_str(), "europe");
    let after = steerer.record_sets().await.unwrap();
    let changed: Vec<_> = after.iter().filter(|s| !before.contains(s)).collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert_eq!(after.len(), before.len());
    let state = steerer.current().await.unwrap();
    assert_eq!(
        state.cohort(&moved.cohorts[0].cohort).unwrap().weights,
        moved.cohorts[0].weights
    );
}

#[tokio::test]
async fn a_plan_touching_too_many_sets_is_refused_unless_forced() {
    let Some((steerer, policy)) = setup("guard").await else {
        return;
    };
    let plan = policy.static_plan();
    steerer
        .apply(&plan, &ApplyOptions::default())
        .await
        .unwrap();
    let mut everything = plan.clone();
    for c in &mut everything.cohorts {
        c.weights =
            Weights::from_percentages([(p("fastly"), 30.0), (p("cloudflare"), 70.0)]).unwrap();
    }
    let before = steerer.record_sets().await.unwrap();
    let err = steerer
        .apply(&everything, &ApplyOptions::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_touched_per_apply"), "{err}");
    assert_eq!(steerer.record_sets().await.unwrap(), before);
    steerer
        .apply(&everything, &ApplyOptions::default().force(true))
        .await
        .unwrap();
    let state = steerer.current().await.unwrap();
    assert!(
        state
            .cohorts
            .iter()
            .all(|c| c.weights == everything.cohorts[0].weights)
    );
}

#[tokio::test]
async fn removing_a_cohort_deletes_its_sets_exactly() {
    let Some((steerer, policy)) = setup("remove").await else {
        return;
    };
    let plan = policy.static_plan();
    steerer
        .apply(&plan, &ApplyOptions::default())
        .await
        .unwrap();
    let mut smaller = plan.clone();
    smaller.cohorts.retain(|c| c.cohort.as_str() != "apac");
    steerer
        .apply(&smaller, &ApplyOptions::default().force(true))
        .await
        .unwrap();
    let state = steerer.current().await.unwrap();
    assert_eq!(state.cohorts.len(), 3);
    let sets = steerer.record_sets().await.unwrap();
    assert!(!sets.iter().any(|s| s.name.starts_with("apac.")));
    assert_eq!(sets.iter().filter(|s| s.geo.is_some()).count(), 11);
}

#[tokio::test]
async fn provisioning_health_checks_twice_creates_them_once() {
    let Some(endpoint) = endpoint() else { return };
    let tag = unique("checks");
    let policy = policy(&tag);
    let client = client(&endpoint);
    let zone_id = client
        .create_hosted_zone(&policy.steering.zone, &format!("ref-{tag}"))
        .await
        .unwrap();
    let mut steerer = Route53Steerer::from_policy(client.clone(), &zone_id, &policy);
    let first = steerer
        .provision_health_checks(&policy, None)
        .await
        .unwrap();
    let second = steerer
        .provision_health_checks(&policy, None)
        .await
        .unwrap();
    assert_eq!(first, second);
    // Other tests provision their own checks concurrently: count only this policy's.
    let listed = client.list_health_checks().await.unwrap();
    let references: Vec<&String> = listed
        .iter()
        .filter(|(id, _)| first.values().any(|f| f == id))
        .map(|(_, r)| r)
        .collect();
    assert_eq!(references.len(), 2);
    assert!(references.iter().all(|r| r.starts_with("multicdn-")));
    for reference in references {
        assert_eq!(
            listed.iter().filter(|(_, r)| r == reference).count(),
            1,
            "{reference}"
        );
    }

    let observations = client
        .health_observations(&first, &policy.health.expect)
        .await
        .unwrap();
    assert!(!observations.is_empty());
    assert!(
        observations
            .iter()
            .all(|o| o.runner.as_str().starts_with("route53-"))
    );
}

#[tokio::test]
async fn an_old_cname_chain_deployment_is_migrated_to_health_evaluating_aliases() {
    use multicdn_providers::route53::changes::{Action, Change};
    use multicdn_providers::route53::layout::{LayoutInputs, desired_sets};
    let Some((steerer, policy)) = setup("migrate").await else {
        return;
    };
    let plan = policy.static_plan();
    // What the layout wrote before aliases: geolocation CNAMEs whose value is the pool, and
    // pools without health checks.
    let inputs = LayoutInputs {
        zone: policy.steering.zone.clone(),
        zone_id: String::new(),
        edges: policy
            .providers
            .iter()
            .map(|(id, spec)| (id.clone(), spec.edge_host.clone()))
            .collect(),
        health_checks: Default::default(),
    };
    let old: Vec<Change> = desired_sets(&plan, &inputs)
        .unwrap()
        .into_iter()
        .map(|mut set| {
            if let Some(alias) = set.alias.take() {
                set.values = vec![alias.dns_name];
                set.ttl = Some(30);
            }
            Change {
                action: Action::Create,
                set,
                before: None,
            }
        })
        .collect();
    let zone = steerer.zone_id().to_owned();
    steerer
        .client()
        .change_record_sets(&zone, "the old layout", &old)
        .await
        .unwrap();
    // The old deployment reads back as the plan it carries.
    let state = steerer.current().await.unwrap();
    assert!(
        multicdn_core::SteeringDiff::between(&state, &plan).is_empty(),
        "{state:?}"
    );

    // Every set changes (aliases, health checks): more than the guardrail allows unforced.
    let dry = steerer.dry_run(&plan).await.unwrap();
    let text = dry.to_string();
    assert!(text.contains("23 of 23 sets touched"), "{text}");
    assert!(
        text.contains("alias -> europe._steer.www.migrate"),
        "{text}"
    );
    let err = steerer
        .apply(&plan, &ApplyOptions::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_touched_per_apply"), "{err}");
    steerer
        .apply(&plan, &ApplyOptions::default().force(true))
        .await
        .unwrap();

    let sets = steerer.record_sets().await.unwrap();
    let geos: Vec<_> = sets.iter().filter(|s| s.geo.is_some()).collect();
    assert_eq!(geos.len(), 15);
    for geo in geos {
        let alias = geo.alias.as_ref().unwrap_or_else(|| panic!("{geo:?}"));
        assert_eq!(alias.hosted_zone_id, zone);
        assert!(alias.evaluate_target_health);
        assert!(geo.values.is_empty(), "{geo:?}");
    }
    let checks = steerer.health_checks();
    for set in sets.iter().filter(|s| s.weight.is_some()) {
        assert!(
            set.health_check_id
                .as_ref()
                .is_some_and(|id| checks.values().any(|c| c == id)),
            "{set:?}"
        );
    }
    assert!(steerer.dry_run(&plan).await.unwrap().is_empty());
    let state = steerer.current().await.unwrap();
    assert!(multicdn_core::SteeringDiff::between(&state, &plan).is_empty());
}

/// When every CDN is down the answer is the static fallback's host, never an empty answer,
/// and the next plan puts the providers back.
#[tokio::test]
async fn the_static_fallback_is_answered_and_left_again() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let tag = unique("fallback");
    let policy = example_on_own_zone("policy-standby.yaml", &tag);
    let client = client(&endpoint);
    let zone_id = client
        .create_hosted_zone(&policy.steering.zone, &format!("ref-{tag}"))
        .await
        .unwrap();
    let steerer = Route53Steerer::from_policy(client, &zone_id, &policy);
    let opts = ApplyOptions::default().wait_for_sync(true).force(true);
    // Fastly failed over to the standby, then the standby failed too.
    let mut on_standby = policy.static_plan();
    for c in &mut on_standby.cohorts {
        c.weights = Weights::new([(p("fastly"), 0), (p("cloudflare"), 10_000)]).unwrap();
    }
    steerer.apply(&on_standby, &opts).await.unwrap();
    let fallback = policy.fallback_plan().unwrap();
    steerer.apply(&fallback, &opts).await.unwrap();
    let state = steerer.current().await.unwrap();
    for c in &fallback.cohorts {
        let got = state.cohort(&c.cohort).unwrap();
        assert_eq!(got.weights, c.weights, "{}", c.cohort);
        assert_eq!(
            got.weights.get(&multicdn_core::policy::Fallback::id()),
            10_000
        );
    }
    // Fastly is back: its static weights replace the fallback.
    steerer.apply(&policy.static_plan(), &opts).await.unwrap();
    let state = steerer.current().await.unwrap();
    for c in &policy.static_plan().cohorts {
        assert_eq!(state.cohort(&c.cohort).unwrap().weights, c.weights);
    }
}
