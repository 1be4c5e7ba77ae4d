//! The content-steering actuator: a [`Steerer`] whose "vendor" is the plan held in memory and
//! served to players by [`ContentSteering`](super::server::ContentSteering).
//!
//! Applying a plan swaps the plan in force (shared with the handler through a [`SharedPlan`])
//! and bumps its version; every manifest answered afterwards follows it. How a cohort's
//! [`Weights`] become a `PATHWAY-PRIORITY` order is [`pathway_priority`]:
//!
//! - providers with a share come first, by descending share (ties by id), then providers listed
//!   at 0% (still useful to a player as a last resort), so the order is also the failover order;
//! - for a split cohort, each session's *first* pathway is a deterministic weighted choice: the
//!   session id is hashed (FNV-1a 64, stable across builds and platforms) into a point in
//!   0..10,000 basis points and the provider whose cumulative share (in id order) covers that point
//!   leads. Across many sessions the leaders follow the weights; one session always gets the same
//!   leader for the same weights, so reloading the manifest never bounces a player between
//!   pathways, and a small weight change moves only the sessions whose point crossed a boundary.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use multicdn_core::{
    ApplyOptions, CohortPlan, Error, NetworkKey, ProviderId, Steerer, SteeringDiff, SteeringPlan,
    SteeringState, TOTAL_BP, Weights,
};

/// The plan in force, its version (1 for the first plan applied, +1 for each change) and the
/// providers that must not be offered to players whatever the plan says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanInForce {
    /// The plan.
    pub plan: SteeringPlan,
    /// Bumped on every applied change, of the plan or of the unavailable providers; players
    /// carry it back in `RELOAD-URI`.
    pub version: u64,
    /// Providers known to be down or drained ([`SharedPlan::set_unavailable`]): left out of
    /// every pathway list, unless leaving them out would leave nothing.
    pub unavailable: BTreeSet<ProviderId>,
}

impl PlanInForce {
    /// `order` without the unavailable providers; `order` itself when that would leave none
    /// (a player with no pathway stops, one with a doubtful pathway may still play).
    pub fn offered(&self, order: Vec<ProviderId>) -> Vec<ProviderId> {
        if self.unavailable.is_empty() {
            return order;
        }
        let kept: Vec<ProviderId> = order
            .iter()
            .filter(|p| !self.unavailable.contains(*p))
            .cloned()
            .collect();
        if kept.is_empty() { order } else { kept }
    }
}

#[derive(Debug, Default)]
struct Held {
    in_force: Option<PlanInForce>,
    unavailable: BTreeSet<ProviderId>,
}

/// The plan in force, shared between the actuator (which writes it), the controller (which
/// says which providers are out) and the handler (which reads it on every request). Clones
/// share one plan; a change reaches the next request, no restart.
#[derive(Debug, Clone, Default)]
pub struct SharedPlan {
    inner: Arc<RwLock<Held>>,
}

impl SharedPlan {
    /// No plan yet.
    pub fn new() -> SharedPlan {
        SharedPlan::default()
    }

    /// The plan in force, if any.
    pub fn get(&self) -> Option<PlanInForce> {
        // A poisoned lock still holds a complete value: writers only ever swap whole plans.
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .in_force
            .clone()
    }

    /// Puts `plan` in force when it differs from the current one; returns the version in force.
    pub fn set(&self, plan: SteeringPlan) -> u64 {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let held = &mut *guard;
        match held.in_force.as_mut() {
            Some(current) if current.plan == plan => current.version,
            Some(current) => {
                current.plan = plan;
                current.version += 1;
                current.version
            }
            None => {
                held.in_force = Some(PlanInForce {
                    plan,
                    version: 1,
                    unavailable: held.unavailable.clone(),
                });
                1
            }
        }
    }

    /// The providers not to offer (down, drained, held out), replacing the previous set; a
    /// change bumps the version of the plan in force. The
    /// [`Controller`](https://docs.rs/multicdn) sets it every round from its health ledger.
    pub fn set_unavailable(&self, providers: BTreeSet<ProviderId>) -> u64 {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let held = &mut *guard;
        if held.unavailable == providers {
            return held.in_force.as_ref().map_or(0, |p| p.version);
        }
        held.unavailable = providers;
        match held.in_force.as_mut() {
            Some(current) => {
                current.unavailable = held.unavailable.clone();
                current.version += 1;
                current.version
            }
            None => 0,
        }
    }

    /// The providers not to offer.
    pub fn unavailable(&self) -> BTreeSet<ProviderId> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .unavailable
            .clone()
    }
}

/// The cohort a client falls in: for each of the client's networks from finest to coarsest
/// (ASN, country, continent), the first cohort in plan order that lists it; otherwise the cohort
/// covering `*`.
pub fn cohort_for<'a>(plan: &'a SteeringPlan, networks: &[NetworkKey]) -> Option<&'a CohortPlan> {
    let mut keys: Vec<&NetworkKey> = networks.iter().collect();
    keys.sort_by_key(|k| k.granularity());
    keys.iter()
        .find_map(|k| plan.cohorts.iter().find(|c| c.networks.contains(k)))
        .or_else(|| {
            plan.cohorts
                .iter()
                .find(|c| c.networks.contains(&NetworkKey::Global))
        })
}

/// FNV-1a, 64 bits: a hash that is the same on every build and platform.
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separate parts so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where a session falls in 0..10,000 basis points, salted by cohort so cohorts are independent.
pub fn session_point(session: &str, salt: &str) -> u32 {
    (fnv1a(&[salt.as_bytes(), session.as_bytes()]) % u64::from(TOTAL_BP)) as u32
}

/// The `PATHWAY-PRIORITY` order for one cohort's weights (see the module docs). Without a
/// session the order is simply by descending share.
pub fn pathway_priority(weights: &Weights, session: Option<&str>, salt: &str) -> Vec<ProviderId> {
    let mut order: Vec<(&ProviderId, u32)> = weights.iter().collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let mut out: Vec<ProviderId> = order.iter().map(|(id, _)| (*id).clone()).collect();
    if let Some(session) = session {
        let point = session_point(session, salt);
        let mut upto = 0u32;
        let leader = weights.iter().find(|(_, bp)| {
            upto += bp;
            *bp > 0 && point < upto
        });
        if let Some((leader, _)) = leader
            && let Some(pos) = out.iter().position(|p| p == leader)
        {
            let id = out.remove(pos);
            out.insert(0, id);
        }
    }
    out
}

/// A [`Steerer`] for content steering: it keeps the plan that the steering handler serves.
#[derive(Debug, Clone)]
pub struct ContentSteeringSteerer {
    name: ProviderId,
    plan: SharedPlan,
    known: Option<Vec<ProviderId>>,
    max_touched_share: Option<f64>,
}

impl ContentSteeringSteerer {
    /// An actuator writing into `plan`. `name` identifies it in errors (`content-steering`).
    pub fn new(name: ProviderId, plan: SharedPlan) -> ContentSteeringSteerer {
        ContentSteeringSteerer {
            name,
            plan,
            known: None,
            max_touched_share: None,
        }
    }

    /// Refuses plans naming a pathway outside `known` (the pathways the media playlists carry).
    pub fn with_known_pathways(mut self, known: Vec<ProviderId>) -> ContentSteeringSteerer {
        self.known = Some(known);
        self
    }

    /// Refuses (unless forced) a change touching more than `share` (0.0–1.0) of the cohorts of
    /// a plan already in force. The first plan is always accepted.
    pub fn with_max_touched_share(mut self, share: f64) -> ContentSteeringSteerer {
        self.max_touched_share = Some(share);
        self
    }

    /// The shared plan, for the handler.
    pub fn shared_plan(&self) -> SharedPlan {
        self.plan.clone()
    }

    fn state(&self) -> SteeringState {
        match self.plan.get() {
            Some(p) => SteeringState {
                record: p.plan.record,
                cohorts: p.plan.cohorts,
            },
            None => SteeringState::default(),
        }
    }

    fn invalid(&self, message: String) -> Error {
        Error::InvalidRequest {
            provider: self.name.clone(),
            message,
        }
    }
}

#[async_trait]
impl Steerer for ContentSteeringSteerer {
    async fn current(&self) -> Result<SteeringState, Error> {
        Ok(self.state())
    }

    async fn apply(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<SteeringDiff, Error> {
        plan.check(self.known.as_deref())
            .map_err(|why| self.invalid(format!("steering plan for {}: {why}", plan.record)))?;
        let state = self.state();
        let diff = SteeringDiff::between(&state, plan);
        if let Some(limit) = self.max_touched_share
            && !options.force
            && !state.cohorts.is_empty()
            && diff.touched_share() > limit
        {
            return Err(self.invalid(format!(
                "the plan changes {:.0}% of cohorts, above the safety share of {:.0}%; \
                 apply with force to override",
                diff.touched_share() * 100.0,
                limit * 100.0
            )));
        }
        self.plan.set(plan.clone());
        Ok(diff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multicdn_core::CohortId;
    use proptest::prelude::*;
    use std::time::Duration;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    fn split(a: u32) -> Weights {
        Weights::new([(p("cdn-a"), a), (p("cdn-b"), TOTAL_BP - a)]).unwrap()
    }

    fn plan(cohorts: Vec<(&str, &str, Weights)>) -> SteeringPlan {
        SteeringPlan {
            record: "video".into(),
            ttl: Duration::from_secs(300),
            cohorts: cohorts
                .into_iter()
                .map(|(id, net, weights)| CohortPlan {
                    cohort: CohortId::new(id).unwrap(),
                    networks: [net.parse().unwrap()].into(),
                    weights,
                })
                .collect(),
        }
    }

    #[test]
    fn orders_pathways_by_descending_share_without_a_session() {
        let order = pathway_priority(&split(3000), None, "x");
        assert_eq!(order, vec![p("cdn-b"), p("cdn-a")]);
    }

    #[test]
    fn a_session_always_gets_the_same_leader() {
        let w = split(5000);
        let first = pathway_priority(&w, Some("session-42"), "default");
        for _ in 0..10 {
            assert_eq!(pathway_priority(&w, Some("session-42"), "default"), first);
        }
    }

    #[test]
    fn leaders_follow_the_weights_across_sessions() {
        let w = split(7000);
        let n = 20_000;
        let a_first = (0..n)
            .filter(|i| pathway_priority(&w, Some(&format!("s{i}")), "eu")[0] == p("cdn-a"))
            .count();
        let share = a_first as f64 / n as f64;
        assert!((share - 0.7).abs() < 0.02, "cdn-a led {share}");
    }

    #[test]
    fn a_zero_share_pathway_never_leads_but_stays_listed() {
        let w = split(TOTAL_BP);
        for i in 0..500 {
            let order = pathway_priority(&w, Some(&format!("s{i}")), "x");
            assert_eq!(order, vec![p("cdn-a"), p("cdn-b")]);
        }
    }

    #[test]
    fn picks_the_finest_matching_cohort_then_the_default() {
        let pl = plan(vec![
            ("de", "DE", split(1000)),
            ("as3320", "AS3320", split(9000)),
            ("default", "*", split(5000)),
        ]);
        let nets = |s: &[&str]| s.iter().map(|n| n.parse().unwrap()).collect::<Vec<_>>();
        assert_eq!(
            cohort_for(&pl, &nets(&["DE", "AS3320"]))
                .unwrap()
                .cohort
                .as_str(),
            "as3320"
        );
        assert_eq!(
            cohort_for(&pl, &nets(&["DE", "AS1"]))
                .unwrap()
                .cohort
                .as_str(),
            "de"
        );
        assert_eq!(
            cohort_for(&pl, &nets(&["FR"])).unwrap().cohort.as_str(),
            "default"
        );
        assert_eq!(cohort_for(&pl, &[]).unwrap().cohort.as_str(), "default");
    }

    #[tokio::test]
    async fn apply_bumps_the_version_only_on_change_and_reads_back() {
        let shared = SharedPlan::new();
        let s = ContentSteeringSteerer::new(p("content-steering"), shared.clone());
        assert!(s.current().await.unwrap().cohorts.is_empty());
        let pl = plan(vec![("default", "*", split(5000))]);
        let diff = s.apply(&pl, &ApplyOptions::default()).await.unwrap();
        assert_eq!(diff.changes.len(), 1);
        assert_eq!(shared.get().unwrap().version, 1);
        assert!(s.plan(&pl).await.unwrap().is_empty());
        s.apply(&pl, &ApplyOptions::default()).await.unwrap();
        assert_eq!(shared.get().unwrap().version, 1);
        s.apply(
            &plan(vec![("default", "*", split(6000))]),
            &ApplyOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(shared.get().unwrap().version, 2);
        assert_eq!(s.current().await.unwrap().cohorts[0].weights, split(6000));
    }

    #[tokio::test]
    async fn refuses_unknown_pathways_and_oversized_changes_unless_forced() {
        let s = ContentSteeringSteerer::new(p("content-steering"), SharedPlan::new())
            .with_known_pathways(vec![p("cdn-a"), p("cdn-b")])
            .with_max_touched_share(0.5);
        let other = plan(vec![("default", "*", Weights::single(p("cdn-z")))]);
        let err = s.apply(&other, &ApplyOptions::default()).await.unwrap_err();
        assert!(err.to_string().contains("cdn-z"), "{err}");
        s.apply(
            &plan(vec![("default", "*", split(5000))]),
            &ApplyOptions::default(),
        )
        .await
        .unwrap();
        let big = plan(vec![("default", "*", split(1000))]);
        let err = s.apply(&big, &ApplyOptions::default()).await.unwrap_err();
        assert!(err.to_string().contains("safety share"), "{err}");
        s.apply(&big, &ApplyOptions::default().force(true))
            .await
            .unwrap();
    }

    proptest! {
        #[test]
        fn the_order_lists_every_provider_once_and_a_leader_with_a_share(
            raw in prop::collection::vec(0u32..100, 1..6),
            session in "[a-z0-9]{1,12}",
        ) {
            prop_assume!(raw.iter().sum::<u32>() > 0);
            let bp = multicdn_core::weights::largest_remainder(&raw, TOTAL_BP);
            let ids: Vec<ProviderId> = (0..bp.len()).map(|i| p(&format!("p{i}"))).collect();
            let w = Weights::new(ids.iter().cloned().zip(bp)).unwrap();
            let order = pathway_priority(&w, Some(&session), "c");
            let mut sorted = order.clone();
            sorted.sort();
            prop_assert_eq!(sorted, ids);
            prop_assert!(w.get(&order[0]) > 0);
        }
    }
}
