//! The record layout: a steering plan as Route 53 record sets, and record sets read back as the
//! steering state. Pure: no I/O.
//!
//! For a record `www.example.com` and a cohort `europe`:
//!
//! - the cohort's **pool** lives at `europe._steer.www.example.com`: one weighted CNAME set per
//!   provider (`SetIdentifier` `europe-fastly`, `Weight` 0–255, the provider's health check, the
//!   provider's edge host as the value);
//! - **geolocation** alias records (type `CNAME`, as Route 53 requires of an alias to a CNAME
//!   set in the same zone) at `www.example.com` point each network of the cohort at its pool:
//!   `AliasTarget` with the hosted zone's own id, the pool's name and `EvaluateTargetHealth`, so
//!   Route 53 itself skips a pool whose weighted sets are all unhealthy and never serves a
//!   provider whose check fails, whether or not the controller is running. `SetIdentifier`
//!   `geo-DE` (`CountryCode` `DE`), `geo-continent-EU` (`ContinentCode` `EU`), `geo-default`
//!   (`CountryCode` `*`). The identifier names the network, not the cohort, so a country moving
//!   between cohorts is one `UPSERT`.
//!
//! The layout before this one pointed the geolocation sets at their pools with plain CNAME
//! values (a CNAME chain); [`read_state`] reads both, and the diff replaces such a set with its
//! alias (a `DELETE` and a `CREATE` side by side in one batch, which Route 53 applies as one).

use std::collections::BTreeMap;

use multicdn_core::{
    CohortId, CohortPlan, NetworkKey, ProviderId, SteeringPlan, SteeringState, Weights,
};

/// The only record type this layout writes.
pub const RECORD_TYPE: &str = "CNAME";

/// The label between a cohort's name and the record in a pool's name.
pub const POOL_LABEL: &str = "_steer";

/// Route 53's weight scale: 0 to 255.
pub const WEIGHT_SCALE: u32 = 255;

/// Route 53 holds at most this many sets per name and type.
pub const MAX_SETS_PER_NAME: usize = 100;

/// A geolocation selector.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GeoLocation {
    /// `ContinentCode`.
    Continent(String),
    /// `CountryCode` (two letters).
    Country(String),
    /// `CountryCode` `*`: everywhere no other set matches.
    Default,
    /// `CountryCode` with `SubdivisionCode` (read back only; never written).
    Subdivision(String, String),
}

impl GeoLocation {
    /// The network this selector covers, when it maps to one.
    pub fn network(&self) -> Option<NetworkKey> {
        match self {
            GeoLocation::Continent(c) => {
                multicdn_core::Continent::from_code(c).map(NetworkKey::Continent)
            }
            GeoLocation::Country(c) => multicdn_core::Country::new(c).ok().map(NetworkKey::Country),
            GeoLocation::Default => Some(NetworkKey::Global),
            GeoLocation::Subdivision(..) => None,
        }
    }
}

/// An alias record's target: another record set in the same hosted zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasTarget {
    /// The hosted zone holding the target (this zone), without `/hostedzone/`.
    pub hosted_zone_id: String,
    /// The target's name (the pool), lowercase, without the trailing dot.
    pub dns_name: String,
    /// Route 53 answers with the target only while it has a healthy set.
    pub evaluate_target_health: bool,
}

impl AliasTarget {
    fn normalised(&self) -> (String, String, bool) {
        (
            crate::route53::bare_zone_id(&self.hosted_zone_id).to_ascii_uppercase(),
            normalise_name(&self.dns_name),
            self.evaluate_target_health,
        )
    }
}

/// One resource record set, as written and as read back (names lowercase, without the
/// trailing dot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSet {
    /// The owner name.
    pub name: String,
    /// The type (`CNAME`).
    pub rtype: String,
    /// The set identifier (weighted and geolocation sets).
    pub set_identifier: Option<String>,
    /// The weight (weighted sets). Read back as Route 53 holds it.
    pub weight: Option<u32>,
    /// The geolocation (geolocation sets).
    pub geo: Option<GeoLocation>,
    /// The TTL in seconds (none on an alias).
    pub ttl: Option<u64>,
    /// The values (one for a CNAME; none on an alias).
    pub values: Vec<String>,
    /// The alias target (the geolocation sets at the record name).
    pub alias: Option<AliasTarget>,
    /// The health check attached.
    pub health_check_id: Option<String>,
    /// Routing this layout never writes (`Region`, `Failover`, `MultiValueAnswer`), named
    /// when a set read back carries it.
    pub foreign: Option<String>,
}

impl RecordSet {
    /// The key Route 53 identifies a set by: name, type, set identifier.
    pub fn key(&self) -> (String, String, String) {
        (
            self.name.clone(),
            self.rtype.clone(),
            self.set_identifier.clone().unwrap_or_default(),
        )
    }

    /// The name this set sends resolvers to: the alias target, or else the first value.
    pub fn target(&self) -> Option<&str> {
        match &self.alias {
            Some(a) => Some(a.dns_name.as_str()),
            None => self.values.first().map(String::as_str),
        }
    }

    /// True when both sets would answer the same (names and values compared without case or
    /// trailing dots).
    pub fn same_content(&self, other: &RecordSet) -> bool {
        let values =
            |s: &RecordSet| -> Vec<String> { s.values.iter().map(|v| normalise_name(v)).collect() };
        self.weight == other.weight
            && self.geo == other.geo
            && self.ttl == other.ttl
            && values(self) == values(other)
            && self.alias.as_ref().map(AliasTarget::normalised)
                == other.alias.as_ref().map(AliasTarget::normalised)
            && self.health_check_id == other.health_check_id
            && self.foreign == other.foreign
    }
}

/// Lowercase, without a trailing dot, with Route 53's octal escapes for `*` undone.
pub fn normalise_name(name: &str) -> String {
    name.trim_end_matches('.')
        .replace("\\052", "*")
        .to_ascii_lowercase()
}

/// The pool name for `cohort` under `record`.
pub fn pool_name(cohort: &CohortId, record: &str) -> String {
    format!("{cohort}.{POOL_LABEL}.{}", normalise_name(record))
}

/// The cohort a pool name belongs to, when `name` is a pool of `record`.
pub fn cohort_of_pool(name: &str, record: &str) -> Option<CohortId> {
    let suffix = format!(".{POOL_LABEL}.{}", normalise_name(record));
    let label = normalise_name(name).strip_suffix(&suffix)?.to_owned();
    CohortId::new(&label).ok()
}

/// True when `name` is the record itself or one of its pools.
pub fn is_managed_name(name: &str, record: &str) -> bool {
    let name = normalise_name(name);
    let record = normalise_name(record);
    name == record || name.ends_with(&format!(".{POOL_LABEL}.{record}"))
}

/// True when `name` is `record` or a name under it (where a listing starting at `record`
/// may still hold managed sets).
pub fn is_within(name: &str, record: &str) -> bool {
    let name = normalise_name(name);
    let record = normalise_name(record);
    name == record || name.ends_with(&format!(".{record}"))
}

/// The set identifier of a geolocation set.
pub fn geo_identifier(geo: &GeoLocation) -> String {
    match geo {
        GeoLocation::Continent(c) => format!("geo-continent-{c}"),
        GeoLocation::Country(c) => format!("geo-{c}"),
        GeoLocation::Default => "geo-default".to_owned(),
        GeoLocation::Subdivision(c, s) => format!("geo-{c}-{s}"),
    }
}

/// The set identifier of a provider's weighted set in a cohort's pool.
pub fn pool_identifier(cohort: &CohortId, provider: &ProviderId) -> String {
    format!("{cohort}-{provider}")
}

/// What the layout needs besides the plan.
#[derive(Debug, Clone, Default)]
pub struct LayoutInputs {
    /// The hosted zone's name (`example.com`).
    pub zone: String,
    /// The hosted zone's id (the geolocation aliases' `HostedZoneId`).
    pub zone_id: String,
    /// Each provider's edge host.
    pub edges: BTreeMap<ProviderId, String>,
    /// Each provider's health check id, where one is attached.
    pub health_checks: BTreeMap<ProviderId, String>,
}

/// Checks the plan against what Route 53 can express and returns the record sets it becomes,
/// pools first. Every problem is reported before anything is sent.
pub fn desired_sets(plan: &SteeringPlan, inputs: &LayoutInputs) -> Result<Vec<RecordSet>, String> {
    let known: Vec<ProviderId> = inputs.edges.keys().cloned().collect();
    plan.check(Some(&known))?;
    let record = normalise_name(&plan.record);
    let zone = normalise_name(&inputs.zone);
    if record.is_empty() || !(record == zone || record.ends_with(&format!(".{zone}"))) {
        return Err(format!(
            "record {:?} is outside the hosted zone {zone:?}: steer a name in the zone (like www.{zone})",
            plan.record
        ));
    }
    crate::dns::check_not_apex(&record, &zone)?;
    let ttl = plan.ttl.as_secs();
    if ttl > 2_147_483_647 {
        return Err(format!(
            "TTL of {ttl}s is beyond what Route 53 accepts (2147483647)"
        ));
    }
    let mut pools = Vec::new();
    let mut geos = Vec::new();
    let mut seen: BTreeMap<GeoLocation, &CohortId> = BTreeMap::new();
    for cohort in &plan.cohorts {
        if cohort.weights.len() > MAX_SETS_PER_NAME {
            return Err(format!(
                "cohort {} names {} providers; Route 53 holds at most {MAX_SETS_PER_NAME} weighted sets per name",
                cohort.cohort,
                cohort.weights.len()
            ));
        }
        let pool = pool_name(&cohort.cohort, &record);
        for (provider, scaled) in cohort.weights.to_scale(WEIGHT_SCALE) {
            let bp = cohort.weights.get(&provider);
            if bp > 0 && scaled == 0 {
                return Err(format!(
                    "cohort {}: {provider}'s share of {:.2}% rounds to weight 0 on Route 53's 0-255 scale, which would serve it only when every other provider is down; give it at least 0.2% or 0%",
                    cohort.cohort,
                    f64::from(bp) / 100.0
                ));
            }
            let edge = inputs
                .edges
                .get(&provider)
                .ok_or_else(|| format!("provider {provider} has no edge host"))?;
            pools.push(RecordSet {
                name: pool.clone(),
                rtype: RECORD_TYPE.to_owned(),
                set_identifier: Some(pool_identifier(&cohort.cohort, &provider)),
                weight: Some(scaled),
                geo: None,
                ttl: Some(ttl),
                values: vec![normalise_name(edge)],
                alias: None,
                health_check_id: inputs.health_checks.get(&provider).cloned(),
                foreign: None,
            });
        }
        for network in &cohort.networks {
            let geo = match network {
                NetworkKey::Asn(n) => {
                    return Err(format!(
                        "cohort {} matches AS{n}: Route 53 geolocation cannot select by ASN; steer ASNs with NS1 or drop the cohort for this actuator",
                        cohort.cohort
                    ));
                }
                NetworkKey::Country(c) => GeoLocation::Country(c.as_str().to_owned()),
                NetworkKey::Continent(c) => GeoLocation::Continent(c.code().to_owned()),
                NetworkKey::Global => GeoLocation::Default,
            };
            if let Some(other) = seen.insert(geo.clone(), &cohort.cohort) {
                return Err(format!(
                    "network {network} appears in cohorts {other} and {}: each network belongs to one cohort",
                    cohort.cohort
                ));
            }
            geos.push(RecordSet {
                name: record.clone(),
                rtype: RECORD_TYPE.to_owned(),
                set_identifier: Some(geo_identifier(&geo)),
                weight: None,
                geo: Some(geo),
                ttl: None,
                values: Vec::new(),
                alias: Some(AliasTarget {
                    hosted_zone_id: crate::route53::bare_zone_id(&inputs.zone_id).to_owned(),
                    dns_name: pool.clone(),
                    evaluate_target_health: true,
                }),
                health_check_id: None,
                foreign: None,
            });
        }
    }
    if geos.len() > MAX_SETS_PER_NAME {
        return Err(format!(
            "the plan needs {} geolocation sets at {record}; Route 53 holds at most {MAX_SETS_PER_NAME} per name: cover more networks with continents",
            geos.len()
        ));
    }
    pools.extend(geos);
    Ok(pools)
}

/// Reads a vendor weight vector back as [`Weights`]: whole percents when that reading maps
/// back to exactly these integers (so a whole-percent plan round-trips exactly), otherwise
/// the finest reading (basis points).
pub fn read_weights(values: Vec<(ProviderId, u32)>) -> Option<Weights> {
    let coarse = Weights::from_scale(values.clone(), 100).ok()?;
    let mut scaled = coarse.to_scale(WEIGHT_SCALE);
    let mut given = values.clone();
    scaled.sort();
    given.sort();
    if scaled == given {
        return Some(coarse);
    }
    Weights::from_scale(values, 1).ok()
}

/// A cohort's networks and its providers' vendor weights, as read.
type CohortParts = (Vec<NetworkKey>, Vec<(ProviderId, u32)>);

/// The steering state the managed sets hold: one cohort for each pool some geolocation set
/// points at (an alias, or a CNAME value in the older layout), its networks from those sets,
/// its weights from the pool's sets.
pub fn read_state(record: &str, sets: &[RecordSet]) -> SteeringState {
    let record_n = normalise_name(record);
    let mut cohorts: BTreeMap<CohortId, CohortParts> = BTreeMap::new();
    for set in sets
        .iter()
        .filter(|s| s.rtype == RECORD_TYPE && s.foreign.is_none())
    {
        if normalise_name(&set.name) == record_n {
            let (Some(geo), Some(value)) = (&set.geo, set.target()) else {
                continue;
            };
            let (Some(cohort), Some(network)) = (cohort_of_pool(value, &record_n), geo.network())
            else {
                continue;
            };
            cohorts.entry(cohort).or_default().0.push(network);
        } else if let Some(cohort) = cohort_of_pool(&set.name, &record_n) {
            let Some(id) = &set.set_identifier else {
                continue;
            };
            let Some(provider) = id
                .strip_prefix(&format!("{cohort}-"))
                .and_then(|p| ProviderId::new(p).ok())
            else {
                continue;
            };
            cohorts
                .entry(cohort)
                .or_default()
                .1
                .push((provider, set.weight.unwrap_or(0)));
        }
    }
    let mut out: Vec<CohortPlan> = cohorts
        .into_iter()
        .filter(|(_, (networks, _))| !networks.is_empty())
        .filter_map(|(cohort, (mut networks, values))| {
            networks.sort();
            Some(CohortPlan {
                cohort,
                networks: networks.into(),
                weights: read_weights(values)?,
            })
        })
        .collect();
    // Most specific first, the default last: the order cohorts match in.
    out.sort_by_key(|c| {
        (
            c.networks
                .iter()
                .map(NetworkKey::granularity)
                .min()
                .unwrap_or(3),
            c.cohort.clone(),
        )
    });
    SteeringState {
        record: record_n,
        cohorts: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    fn inputs() -> LayoutInputs {
        LayoutInputs {
            zone: "example.com".into(),
            zone_id: "/hostedzone/Z0EXAMPLE".into(),
            edges: [
                (p("fastly"), "example.map.fastly.net".to_owned()),
                (p("cloudflare"), "example.cdn.cloudflare.net".to_owned()),
            ]
            .into(),
            health_checks: [(p("fastly"), "hc-f".to_owned())].into(),
        }
    }

    type CohortSpec<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, f64)]);

    fn plan(cohorts: &[CohortSpec<'_>]) -> SteeringPlan {
        SteeringPlan {
            record: "www.example.com".into(),
            ttl: Duration::from_secs(30),
            cohorts: cohorts
                .iter()
                .map(|(name, nets, w)| CohortPlan {
                    cohort: CohortId::new(name).unwrap(),
                    networks: nets.iter().map(|n| n.parse().unwrap()).collect(),
                    weights: Weights::from_percentages(w.iter().map(|(id, pct)| (p(id), *pct)))
                        .unwrap(),
                })
                .collect(),
        }
    }

    fn two_cohorts() -> SteeringPlan {
        plan(&[
            (
                "europe",
                &["DE", "continent:AS"],
                &[("fastly", 90.0), ("cloudflare", 10.0)],
            ),
            ("default", &["*"], &[("fastly", 50.0), ("cloudflare", 50.0)]),
        ])
    }

    #[test]
    fn a_plan_becomes_pools_then_geolocation_sets_pointing_at_them() {
        let sets = desired_sets(&two_cohorts(), &inputs()).unwrap();
        let names: Vec<(String, String)> = sets
            .iter()
            .map(|s| (s.name.clone(), s.set_identifier.clone().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("europe._steer.www.example.com", "europe-cloudflare"),
                ("europe._steer.www.example.com", "europe-fastly"),
                ("default._steer.www.example.com", "default-cloudflare"),
                ("default._steer.www.example.com", "default-fastly"),
                ("www.example.com", "geo-DE"),
                ("www.example.com", "geo-continent-AS"),
                ("www.example.com", "geo-default"),
            ]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
        // 90/10 on 0-255 by largest remainder: 229.5 and 25.5, the tie to the first by id.
        assert_eq!(sets[0].weight, Some(26));
        assert_eq!(sets[1].weight, Some(229));
        assert_eq!(sets[1].health_check_id.as_deref(), Some("hc-f"));
        assert_eq!(sets[0].health_check_id, None);
        assert_eq!(sets[6].geo, Some(GeoLocation::Default));
    }

    #[test]
    fn geolocation_sets_are_aliases_to_their_pool_in_the_same_zone_evaluating_its_health() {
        let sets = desired_sets(&two_cohorts(), &inputs()).unwrap();
        for geo in sets.iter().filter(|s| s.geo.is_some()) {
            assert_eq!(geo.rtype, "CNAME", "an alias to a CNAME set is a CNAME");
            assert!(geo.values.is_empty() && geo.ttl.is_none(), "{geo:?}");
            let alias = geo.alias.as_ref().unwrap();
            assert_eq!(alias.hosted_zone_id, "Z0EXAMPLE");
            assert!(alias.evaluate_target_health);
            assert!(alias.dns_name.ends_with("._steer.www.example.com"));
        }
        assert_eq!(
            sets[4].target(),
            Some("europe._steer.www.example.com"),
            "{:?}",
            sets[4]
        );
        // The weighted sets stay plain CNAMEs carrying their provider's check.
        assert!(
            sets.iter()
                .filter(|s| s.weight.is_some())
                .all(|s| s.alias.is_none() && s.values.len() == 1)
        );
    }

    #[test]
    fn the_older_cname_chain_reads_back_as_the_same_state() {
        let plan = two_cohorts();
        let chain: Vec<RecordSet> = desired_sets(&plan, &inputs())
            .unwrap()
            .into_iter()
            .map(|mut s| {
                if let Some(alias) = s.alias.take() {
                    s.values = vec![format!("{}.", alias.dns_name)];
                    s.ttl = Some(30);
                }
                s
            })
            .collect();
        let state = read_state("www.example.com", &chain);
        assert_eq!(state.cohorts.len(), 2);
        assert_eq!(
            multicdn_core::SteeringDiff::between(&state, &plan).changes,
            vec![]
        );
    }

    #[test]
    fn the_sets_read_back_as_the_plan() {
        let plan = two_cohorts();
        let sets = desired_sets(&plan, &inputs()).unwrap();
        let state = read_state("www.example.com.", &sets);
        assert_eq!(
            multicdn_core::SteeringDiff::between(&state, &plan).changes,
            vec![]
        );
    }

    #[test]
    fn refuses_what_route53_cannot_express() {
        let asn = plan(&[
            ("comcast", &["AS7922"], &[("fastly", 100.0)]),
            ("default", &["*"], &[("fastly", 100.0)]),
        ]);
        assert!(desired_sets(&asn, &inputs()).unwrap_err().contains("ASN"));
        let tiny = plan(&[("default", &["*"], &[("fastly", 99.9), ("cloudflare", 0.1)])]);
        let e = desired_sets(&tiny, &inputs()).unwrap_err();
        assert!(e.contains("rounds to weight 0"), "{e}");
        let mut outside = two_cohorts();
        outside.record = "www.example.org".into();
        assert!(
            desired_sets(&outside, &inputs())
                .unwrap_err()
                .contains("outside the hosted zone")
        );
        let unknown = plan(&[("default", &["*"], &[("akamai", 100.0)])]);
        assert!(
            desired_sets(&unknown, &inputs())
                .unwrap_err()
                .contains("unknown provider akamai")
        );
        let twice = plan(&[
            ("a", &["DE"], &[("fastly", 100.0)]),
            ("b", &["DE", "*"], &[("fastly", 100.0)]),
        ]);
        assert!(
            desired_sets(&twice, &inputs())
                .unwrap_err()
                .contains("appears in cohorts")
        );
        let mut apex = two_cohorts();
        apex.record = "example.com".into();
        let e = desired_sets(&apex, &inputs()).unwrap_err();
        assert!(e.contains("zone apex"), "{e}");
    }

    #[test]
    fn a_zero_share_is_weight_zero_not_an_error() {
        let zero = plan(&[("default", &["*"], &[("fastly", 100.0), ("cloudflare", 0.0)])]);
        let sets = desired_sets(&zero, &inputs()).unwrap();
        assert_eq!(sets[0].weight, Some(0));
        assert_eq!(sets[1].weight, Some(255));
    }

    #[test]
    fn weights_read_back_at_whole_percent_only_when_exact() {
        let w = Weights::from_percentages([(p("a"), 85.0), (p("b"), 15.0)]).unwrap();
        assert_eq!(read_weights(w.to_scale(255)), Some(w));
        let fine = Weights::from_percentages([(p("a"), 87.5), (p("b"), 12.5)]).unwrap();
        let back = read_weights(fine.to_scale(255)).unwrap();
        assert!(back.get(&p("a")).abs_diff(8750) <= 40);
        assert_eq!(read_weights(vec![(p("a"), 0)]), None);
    }

    #[test]
    fn pool_names_map_back_to_cohorts() {
        assert_eq!(
            cohort_of_pool("Europe._steer.WWW.example.com.", "www.example.com"),
            CohortId::new("europe").ok()
        );
        assert_eq!(cohort_of_pool("www.example.com", "www.example.com"), None);
        assert!(is_managed_name(
            "x._steer.www.example.com",
            "www.example.com"
        ));
        assert!(!is_managed_name("api.example.com", "www.example.com"));
    }
}
