//! The in-memory steerer: the embedded default actuator. It holds the answers in force and
//! resolves a client's networks to a provider by weighted choice, counting every answer, so
//! a quickstart or a test can watch traffic move as plans are applied.
//!
//! ```
//! use std::time::Duration;
//! use multicdn_core::{ApplyOptions, CohortId, CohortPlan, NetworkKey, ProviderId, SteeringPlan, Steerer, Weights};
//! use multicdn_providers::memory::MemorySteerer;
//!
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
//! let fastly = ProviderId::new("fastly")?;
//! let steerer = MemorySteerer::with_seed(7);
//! let plan = SteeringPlan {
//!     record: "www.example.com".into(),
//!     ttl: Duration::from_secs(30),
//!     cohorts: vec![CohortPlan {
//!         cohort: CohortId::new("default")?,
//!         networks: NetworkKey::Global.into(),
//!         weights: Weights::single(fastly.clone()),
//!     }],
//! };
//! steerer.apply(&plan, &ApplyOptions::default()).await?;
//! assert_eq!(steerer.resolve(&["DE".parse()?])?, fastly);
//! assert_eq!(steerer.served_total(&fastly), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # .map_err(|e| e.to_string())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use multicdn_core::policy::Share;
use multicdn_core::{
    ApplyOptions, CohortId, CohortPlan, Error, NetworkKey, ProviderId, Steerer, SteeringDiff,
    SteeringPlan, SteeringState, TOTAL_BP,
};

/// What [`MemorySteerer::resolve`] can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No plan has been applied yet.
    #[error("no steering plan is in force: apply one first")]
    NoPlan,
    /// No cohort covers the client's networks (a plan always has a `*` cohort, so this
    /// means the plan in force has none).
    #[error("no cohort covers {0}")]
    NoCohort(String),
}

/// A small, fast, seedable generator (SplitMix64): deterministic for tests, good enough for
/// spreading answers by weight.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), without modulo bias.
    fn below(&mut self, n: u32) -> u32 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u32
    }
}

#[derive(Debug)]
struct Inner {
    record: String,
    cohorts: Vec<CohortPlan>,
    rng: SplitMix64,
    served: BTreeMap<CohortId, BTreeMap<ProviderId, u64>>,
    applied: u64,
}

/// The in-memory steerer. Clones share one state (an `Arc` inside), so it is cheap to hand
/// to a control loop and to a request path at once.
#[derive(Clone)]
pub struct MemorySteerer {
    inner: Arc<Mutex<Inner>>,
    max_touched: Option<Share>,
}

impl fmt::Debug for MemorySteerer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("MemorySteerer")
            .field("record", &inner.record)
            .field("cohorts", &inner.cohorts.len())
            .field("applied", &inner.applied)
            .finish()
    }
}

impl Default for MemorySteerer {
    fn default() -> Self {
        MemorySteerer::with_seed(0x6d75_6c74_6963_646e)
    }
}

impl MemorySteerer {
    /// An empty steerer with a fixed default seed.
    pub fn new() -> MemorySteerer {
        MemorySteerer::default()
    }

    /// An empty steerer whose choices follow `seed`: the same seed and the same calls give
    /// the same answers.
    pub fn with_seed(seed: u64) -> MemorySteerer {
        MemorySteerer {
            inner: Arc::new(Mutex::new(Inner {
                record: String::new(),
                cohorts: Vec::new(),
                rng: SplitMix64(seed),
                served: BTreeMap::new(),
                applied: 0,
            })),
            max_touched: None,
        }
    }

    /// Refuses, unless forced, a plan that changes more than `share` of the cohorts in force
    /// (off by default: the embedded steerer usually follows every plan).
    pub fn with_max_touched(mut self, share: Share) -> MemorySteerer {
        self.max_touched = Some(share);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the state half-written (every write is
        // one assignment), so a poisoned lock is still safe to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cohort that answers a client seen as `networks` (its ASN, country, continent, in
    /// any order): the most specific match wins (ASN, then country, then continent, then
    /// `*`); among cohorts equally specific, the first in the plan.
    pub fn cohort_for(&self, networks: &[NetworkKey]) -> Result<CohortId, ResolveError> {
        let inner = self.lock();
        pick_cohort(&inner.cohorts, networks).map(|c| c.cohort.clone())
    }

    /// Answers one query: picks the cohort for `networks`, then a provider by its weight, and
    /// counts the answer.
    pub fn resolve(&self, networks: &[NetworkKey]) -> Result<ProviderId, ResolveError> {
        let mut inner = self.lock();
        if inner.cohorts.is_empty() {
            return Err(ResolveError::NoPlan);
        }
        let cohort = pick_cohort(&inner.cohorts, networks)?.clone();
        let roll = inner.rng.below(TOTAL_BP);
        let mut acc = 0u32;
        let mut chosen = cohort.weights.leader().clone();
        for (provider, bp) in cohort.weights.iter() {
            acc += bp;
            if roll < acc {
                chosen = provider.clone();
                break;
            }
        }
        *inner
            .served
            .entry(cohort.cohort.clone())
            .or_default()
            .entry(chosen.clone())
            .or_default() += 1;
        Ok(chosen)
    }

    /// Answers served so far, per cohort, per provider.
    pub fn served(&self) -> BTreeMap<CohortId, BTreeMap<ProviderId, u64>> {
        self.lock().served.clone()
    }

    /// Answers served so far for `provider`, across cohorts.
    pub fn served_total(&self, provider: &ProviderId) -> u64 {
        self.lock()
            .served
            .values()
            .filter_map(|m| m.get(provider))
            .sum()
    }

    /// Forgets the counts (the answers in force stay).
    pub fn reset_counts(&self) {
        self.lock().served.clear();
    }

    /// How many plans have changed something.
    pub fn applied(&self) -> u64 {
        self.lock().applied
    }
}

fn pick_cohort<'a>(
    cohorts: &'a [CohortPlan],
    networks: &[NetworkKey],
) -> Result<&'a CohortPlan, ResolveError> {
    if cohorts.is_empty() {
        return Err(ResolveError::NoPlan);
    }
    let mut keys: Vec<NetworkKey> = networks.to_vec();
    // A country implies its continent, so a client seen only as `DE` still finds `EU`.
    for n in networks {
        if let NetworkKey::Country(c) = n
            && let Some(continent) = c.continent()
        {
            keys.push(NetworkKey::Continent(continent));
        }
    }
    keys.push(NetworkKey::Global);
    keys.sort_by_key(NetworkKey::granularity);
    for key in &keys {
        if let Some(c) = cohorts.iter().find(|c| c.networks.contains(key)) {
            return Ok(c);
        }
    }
    Err(ResolveError::NoCohort(
        networks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    ))
}

fn invalid(message: String) -> Error {
    Error::InvalidRequest {
        provider: memory_id(),
        message,
    }
}

#[allow(clippy::expect_used)] // a constant that satisfies the id rules; covered by a test
fn memory_id() -> ProviderId {
    ProviderId::new("memory").expect("memory is a valid provider id")
}

#[async_trait]
impl Steerer for MemorySteerer {
    async fn current(&self) -> Result<SteeringState, Error> {
        let inner = self.lock();
        Ok(SteeringState {
            record: inner.record.clone(),
            cohorts: inner.cohorts.clone(),
        })
    }

    async fn apply(
        &self,
        plan: &SteeringPlan,
        options: &ApplyOptions,
    ) -> Result<SteeringDiff, Error> {
        plan.check(None)
            .map_err(|e| invalid(format!("plan for {}: {e}", plan.record)))?;
        let mut inner = self.lock();
        let state = SteeringState {
            record: inner.record.clone(),
            cohorts: inner.cohorts.clone(),
        };
        let diff = SteeringDiff::between(&state, plan);
        let networks_changed = plan
            .cohorts
            .iter()
            .any(|c| state.cohort(&c.cohort).map(|s| &s.networks) != Some(&c.networks))
            || state.record != plan.record;
        if diff.is_empty() && !networks_changed {
            return Ok(diff);
        }
        if let Some(limit) = self.max_touched
            && !state.cohorts.is_empty()
            && !options.force
            && diff.touched_share() > limit.fraction()
        {
            return Err(invalid(format!(
                "the plan changes {} of {} cohorts ({:.0}%), more than the {limit} allowed; apply with force if intended:\n{diff}",
                diff.changes.len(),
                diff.cohorts_total,
                diff.touched_share() * 100.0
            )));
        }
        inner.record = plan.record.clone();
        inner.cohorts = plan.cohorts.clone();
        inner.applied += 1;
        Ok(diff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multicdn_core::Weights;
    use std::time::Duration;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    fn plan(eu_fastly: f64) -> SteeringPlan {
        let w = |f: f64| {
            Weights::from_percentages([(p("fastly"), f), (p("cloudflare"), 100.0 - f)]).unwrap()
        };
        SteeringPlan {
            record: "www.example.com".into(),
            ttl: Duration::from_secs(30),
            cohorts: vec![
                CohortPlan {
                    cohort: CohortId::new("comcast").unwrap(),
                    networks: ["AS7922".parse().unwrap()].into(),
                    weights: w(0.0),
                },
                CohortPlan {
                    cohort: CohortId::new("germany").unwrap(),
                    networks: ["DE".parse().unwrap()].into(),
                    weights: w(100.0),
                },
                CohortPlan {
                    cohort: CohortId::new("europe").unwrap(),
                    networks: ["EU".parse().unwrap()].into(),
                    weights: w(eu_fastly),
                },
                CohortPlan {
                    cohort: CohortId::new("default").unwrap(),
                    networks: [NetworkKey::Global].into(),
                    weights: w(50.0),
                },
            ],
        }
    }

    fn nets(s: &[&str]) -> Vec<NetworkKey> {
        s.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn the_most_specific_cohort_answers() {
        let s = MemorySteerer::with_seed(1);
        futures::executor::block_on(s.apply(&plan(90.0), &ApplyOptions::default())).unwrap();
        assert_eq!(
            s.cohort_for(&nets(&["DE", "AS7922"])).unwrap().as_str(),
            "comcast"
        );
        assert_eq!(
            s.cohort_for(&nets(&["DE", "AS3320"])).unwrap().as_str(),
            "germany"
        );
        assert_eq!(s.cohort_for(&nets(&["FR"])).unwrap().as_str(), "europe");
        assert_eq!(s.cohort_for(&nets(&["BR"])).unwrap().as_str(), "default");
        assert_eq!(s.cohort_for(&[]).unwrap().as_str(), "default");
    }

    #[test]
    fn answers_follow_the_weights_and_the_seed() {
        let run = |seed| {
            let s = MemorySteerer::with_seed(seed);
            futures::executor::block_on(s.apply(&plan(90.0), &ApplyOptions::default())).unwrap();
            (0..10_000)
                .map(|_| s.resolve(&nets(&["FR"])).unwrap())
                .collect::<Vec<_>>()
        };
        let a = run(42);
        assert_eq!(a, run(42));
        assert_ne!(a, run(43));
        let fastly = a.iter().filter(|x| x.as_str() == "fastly").count();
        assert!((8_800..=9_200).contains(&fastly), "{fastly}");
    }

    #[test]
    fn counts_answers_per_cohort_and_resets() {
        let s = MemorySteerer::with_seed(3);
        assert_eq!(s.resolve(&[]), Err(ResolveError::NoPlan));
        futures::executor::block_on(s.apply(&plan(90.0), &ApplyOptions::default())).unwrap();
        for _ in 0..100 {
            s.resolve(&nets(&["DE"])).unwrap();
            s.resolve(&nets(&["AS7922"])).unwrap();
        }
        let served = s.served();
        assert_eq!(
            served[&CohortId::new("germany").unwrap()][&p("fastly")],
            100
        );
        assert_eq!(
            served[&CohortId::new("comcast").unwrap()][&p("cloudflare")],
            100
        );
        assert_eq!(s.served_total(&p("fastly")), 100);
        s.reset_counts();
        assert!(s.served().is_empty());
        assert_eq!(memory_id().as_str(), "memory");
    }

    #[test]
    fn a_zero_weight_is_never_chosen() {
        let mut rng = SplitMix64(9);
        assert!((0..100_000).all(|_| rng.below(10) < 10));
        let s = MemorySteerer::with_seed(5);
        futures::executor::block_on(s.apply(&plan(100.0), &ApplyOptions::default())).unwrap();
        assert!((0..1000).all(|_| s.resolve(&nets(&["FR"])).unwrap().as_str() == "fastly"));
    }
}
