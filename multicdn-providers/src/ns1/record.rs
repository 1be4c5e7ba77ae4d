//! A steering plan as one NS1 record (answers, region groups, the filter chain), and the
//! record read back as the steering state. Pure: no I/O.

use std::collections::BTreeMap;

use multicdn_core::{
    CohortId, CohortPlan, Continent, Country, NetworkKey, ProviderId, SteeringPlan, SteeringState,
    TOTAL_BP, Weights,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Priority of the answers that carry the plan's weights.
pub const PRIORITY_PRIMARY: u64 = 1;
/// Priority of providers a cohort gives 0%: served only when every primary answer is down.
pub const PRIORITY_STANDBY: u64 = 2;
/// Priority of the always-up last resort: the plan's split, served only when every answer
/// above is down, so the chain never answers empty.
pub const PRIORITY_LAST_RESORT: u64 = 3;

/// One NS1 record, as sent and as read (fields NS1 adds on read are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ns1Record {
    /// The zone (`example.com`).
    pub zone: String,
    /// The record's name (`www.example.com`).
    pub domain: String,
    /// `CNAME`.
    #[serde(rename = "type")]
    pub rtype: String,
    /// The TTL in seconds.
    pub ttl: u64,
    /// The answers.
    #[serde(default)]
    pub answers: Vec<Ns1Answer>,
    /// The filter chain.
    #[serde(default)]
    pub filters: Vec<Ns1Filter>,
    /// The region groups and their metadata.
    #[serde(default)]
    pub regions: BTreeMap<String, Ns1Region>,
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ns1Answer {
    /// The rdata: the provider's edge host.
    pub answer: Vec<String>,
    /// `weight`, `up`, `priority`, `note`.
    #[serde(default)]
    pub meta: Map<String, Value>,
    /// The region group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// One filter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ns1Filter {
    /// The filter's name.
    pub filter: String,
    /// Its configuration.
    #[serde(default)]
    pub config: Map<String, Value>,
    /// Disabled filters stay in the chain without acting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
}

/// One region group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Ns1Region {
    /// `country`, `asn` lists.
    #[serde(default)]
    pub meta: Map<String, Value>,
}

/// What building a record needs besides the plan.
#[derive(Debug, Clone, Default)]
pub struct RecordInputs {
    /// The zone.
    pub zone: String,
    /// Each provider's edge host.
    pub edges: BTreeMap<ProviderId, String>,
    /// Each provider's data feed id, driving its answers' `up`.
    pub feeds: BTreeMap<ProviderId, String>,
}

fn filter(name: &str, config: Value) -> Ns1Filter {
    Ns1Filter {
        filter: name.to_owned(),
        config: match config {
            Value::Object(m) => m,
            _ => Map::new(),
        },
        disabled: false,
    }
}

/// The filter chain: `up`, (`netfence_asn`), `geofence_country`, (`geofence_regional`),
/// `select_first_region`, `priority`, `weighted_shuffle`, `select_first_n`.
///
/// `geofence_regional` acts on `georegion` metadata; with `remove_no_georegion` and no
/// `georegion` written it would only remove answers, so it is in the chain only when a region
/// group carries `georegion` (`with_georegion`).
pub fn filter_chain(with_asn: bool, with_georegion: bool) -> Vec<Ns1Filter> {
    let mut chain = vec![filter("up", json!({}))];
    if with_asn {
        chain.push(filter("netfence_asn", json!({"remove_no_asn": true})));
    }
    chain.push(filter(
        "geofence_country",
        json!({"remove_no_location": true}),
    ));
    if with_georegion {
        chain.push(filter(
            "geofence_regional",
            json!({"remove_no_georegion": true}),
        ));
    }
    chain.extend([
        filter("select_first_region", json!({})),
        filter("priority", json!({"eliminate": "1"})),
        filter("weighted_shuffle", json!({})),
        filter("select_first_n", json!({"N": "1"})),
    ]);
    chain
}

/// A value as NS1 may hand it back: numbers (and strings holding one: filter configs are
/// strings on write, ns1-go types `weight` as a float) as one canonical number, so `9000.0`,
/// `9000` and `"9000"` are the same; lists of scalars in region metadata sorted (`country`,
/// `asn` are sets); objects and other lists normalised member by member.
fn normalised(v: &Value, sort_lists: bool) -> Value {
    fn number(f: f64) -> Value {
        if f.fract() == 0.0 && f.abs() < 9.0e15 {
            // Whole and exactly representable: the integer.
            json!(f as i64)
        } else {
            json!(f)
        }
    }
    match v {
        Value::Number(n) => n.as_f64().map_or_else(|| v.clone(), number),
        Value::String(s) => match s.trim().parse::<f64>() {
            Ok(f) if f.is_finite() => number(f),
            _ => v.clone(),
        },
        Value::Array(items) => {
            let mut out: Vec<Value> = items.iter().map(|i| normalised(i, sort_lists)).collect();
            if sort_lists && out.iter().all(|i| !i.is_object() && !i.is_array()) {
                out.sort_by_key(|i| i.to_string());
            }
            Value::Array(out)
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), normalised(v, sort_lists)))
                .collect(),
        ),
        Value::Bool(_) | Value::Null => v.clone(),
    }
}

fn normalised_map(m: &Map<String, Value>, sort_lists: bool) -> Value {
    normalised(&Value::Object(m.clone()), sort_lists)
}

impl Ns1Record {
    /// True when `other` is the same record as NS1 serves it: TTL, answers (rdata without case
    /// or trailing dot, metadata normalised), filters and region groups, compared after the
    /// normalisation octoDNS's NS1 provider applies ([`Ns1Record`] fields NS1 adds on read are
    /// never read). A record read back with `weight: 9000.0` for a written `9000` is the same.
    pub fn same_as(&self, other: &Ns1Record) -> bool {
        fn answers(r: &Ns1Record) -> Vec<(Vec<String>, Value, Option<String>)> {
            r.answers
                .iter()
                .map(|a| {
                    (
                        a.answer
                            .iter()
                            .map(|v| v.trim_end_matches('.').to_ascii_lowercase())
                            .collect(),
                        normalised_map(&a.meta, false),
                        a.region.clone(),
                    )
                })
                .collect()
        }
        fn filters(r: &Ns1Record) -> Vec<(String, Value, bool)> {
            r.filters
                .iter()
                .map(|f| {
                    (
                        f.filter.clone(),
                        normalised_map(&f.config, false),
                        f.disabled,
                    )
                })
                .collect()
        }
        fn regions(r: &Ns1Record) -> BTreeMap<String, Value> {
            r.regions
                .iter()
                .map(|(k, g)| (k.clone(), normalised_map(&g.meta, true)))
                .collect()
        }
        self.ttl == other.ttl
            && answers(self) == answers(other)
            && filters(self) == filters(other)
            && regions(self) == regions(other)
    }
}

/// Every country on `continent` (NS1 has no continents; octoDNS expands them the same way).
pub fn countries_of(continent: Continent) -> Vec<String> {
    let mut out = Vec::new();
    for a in b'A'..=b'Z' {
        for b in b'A'..=b'Z' {
            let code = [a, b];
            let code = std::str::from_utf8(&code).unwrap_or_default().to_owned();
            if let Ok(c) = Country::new(&code)
                && c.continent() == Some(continent)
            {
                out.push(code);
            }
        }
    }
    out
}

fn specificity(c: &CohortPlan) -> u8 {
    c.networks
        .iter()
        .map(NetworkKey::granularity)
        .min()
        .unwrap_or(3)
}

/// Checks the plan against what NS1 can express and builds the record. Region groups go
/// most specific first (ASN, country, continent, default), the order `select_first_region`
/// needs.
pub fn build_record(plan: &SteeringPlan, inputs: &RecordInputs) -> Result<Ns1Record, String> {
    let known: Vec<ProviderId> = inputs.edges.keys().cloned().collect();
    plan.check(Some(&known))?;
    let record = plan.record.trim_end_matches('.').to_ascii_lowercase();
    let zone = inputs.zone.trim_end_matches('.').to_ascii_lowercase();
    if record.is_empty() || !(record == zone || record.ends_with(&format!(".{zone}"))) {
        return Err(format!(
            "record {:?} is outside the zone {zone:?}: steer a name in the zone (like www.{zone})",
            plan.record
        ));
    }
    crate::dns::check_not_apex(&record, &zone)?;
    let mut cohorts: Vec<&CohortPlan> = plan.cohorts.iter().collect();
    cohorts.sort_by_key(|c| specificity(c));
    let mut answers = Vec::new();
    let mut regions = BTreeMap::new();
    let mut with_asn = false;
    for cohort in cohorts {
        let asns: Vec<u32> = cohort
            .networks
            .iter()
            .filter_map(|n| {
                if let NetworkKey::Asn(a) = n {
                    Some(*a)
                } else {
                    None
                }
            })
            .collect();
        let global = cohort.networks.contains(&NetworkKey::Global);
        let places = cohort.networks.len() - asns.len() - usize::from(global);
        if (!asns.is_empty() && (places > 0 || global)) || (global && places > 0) {
            return Err(format!(
                "cohort {} mixes {}: an NS1 region group selects by ASN, by place, or catches all; split it into one cohort per kind",
                cohort.cohort,
                cohort
                    .networks
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let mut meta = Map::new();
        if !asns.is_empty() {
            with_asn = true;
            if asns.len() > 1000 {
                return Err(format!(
                    "cohort {} lists {} ASNs; NS1 holds at most 1000",
                    cohort.cohort,
                    asns.len()
                ));
            }
            meta.insert("asn".into(), json!(asns));
        } else if !global {
            let mut countries: Vec<String> = Vec::new();
            for n in &cohort.networks {
                match n {
                    NetworkKey::Country(c) => countries.push(c.as_str().to_owned()),
                    NetworkKey::Continent(c) => countries.extend(countries_of(*c)),
                    _ => {}
                }
            }
            countries.sort();
            countries.dedup();
            meta.insert("country".into(), json!(countries));
        }
        let group = cohort.cohort.to_string();
        regions.insert(group.clone(), Ns1Region { meta });
        let answer = |provider: &ProviderId,
                      weight: u32,
                      priority: u64,
                      live: bool,
                      kind: &str|
         -> Result<Ns1Answer, String> {
            let edge = inputs
                .edges
                .get(provider)
                .ok_or_else(|| format!("provider {provider} has no edge host"))?;
            let up = match (live, inputs.feeds.get(provider)) {
                (true, Some(feed)) => json!({"feed": feed}),
                _ => json!(true),
            };
            let mut meta = Map::new();
            meta.insert(
                "note".into(),
                json!(format!(
                    "multicdn cohort={} provider={provider} tier={kind}",
                    cohort.cohort
                )),
            );
            meta.insert("priority".into(), json!(priority));
            meta.insert("up".into(), up);
            meta.insert("weight".into(), json!(weight));
            Ok(Ns1Answer {
                answer: vec![edge.trim_end_matches('.').to_ascii_lowercase()],
                meta,
                region: Some(group.clone()),
            })
        };
        for (provider, bp) in cohort.weights.iter().filter(|(_, bp)| *bp > 0) {
            answers.push(answer(provider, bp, PRIORITY_PRIMARY, true, "primary")?);
        }
        for (provider, _) in cohort.weights.iter().filter(|(_, bp)| *bp == 0) {
            answers.push(answer(provider, 1, PRIORITY_STANDBY, true, "standby")?);
        }
        for (provider, bp) in cohort.weights.iter().filter(|(_, bp)| *bp > 0) {
            answers.push(answer(
                provider,
                bp,
                PRIORITY_LAST_RESORT,
                false,
                "last-resort",
            )?);
        }
    }
    Ok(Ns1Record {
        zone,
        domain: record,
        rtype: "CNAME".into(),
        ttl: plan.ttl.as_secs(),
        answers,
        filters: filter_chain(
            with_asn,
            regions.values().any(|g| g.meta.contains_key("georegion")),
        ),
        regions,
    })
}

fn meta_u64(meta: &Map<String, Value>, key: &str) -> Option<u64> {
    match meta.get(key)? {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f.round() as u64)),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn provider_of(answer: &Ns1Answer, edges: &BTreeMap<ProviderId, String>) -> Option<ProviderId> {
    let host = answer
        .answer
        .first()?
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if let Some((p, _)) = edges
        .iter()
        .find(|(_, e)| e.trim_end_matches('.').eq_ignore_ascii_case(&host))
    {
        return Some(p.clone());
    }
    let note = answer.meta.get("note")?.as_str()?;
    let id = note
        .split_whitespace()
        .find_map(|w| w.strip_prefix("provider="))?;
    ProviderId::new(id).ok()
}

fn networks_of(region: Option<&Ns1Region>) -> Vec<NetworkKey> {
    let Some(region) = region else {
        return vec![NetworkKey::Global];
    };
    let mut out = Vec::new();
    if let Some(Value::Array(asns)) = region.meta.get("asn") {
        out.extend(asns.iter().filter_map(|a| {
            a.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .or_else(|| {
                    a.as_str()
                        .and_then(|s| s.trim_start_matches("AS").parse().ok())
                })
                .map(NetworkKey::Asn)
        }));
    }
    if let Some(Value::Array(countries)) = region.meta.get("country") {
        let mut set: Vec<String> = countries
            .iter()
            .filter_map(|c| c.as_str().map(str::to_owned))
            .collect();
        for continent in Continent::ALL {
            let all = countries_of(continent);
            if !all.is_empty() && all.iter().all(|c| set.contains(c)) {
                set.retain(|c| !all.contains(c));
                out.push(NetworkKey::Continent(continent));
            }
        }
        out.extend(
            set.iter()
                .filter_map(|c| Country::new(c).ok())
                .map(NetworkKey::Country),
        );
    }
    if out.is_empty() {
        out.push(NetworkKey::Global);
    }
    out.sort();
    out
}

/// The steering state a record holds: one cohort per region group, its weights from the
/// group's primary answers (standby answers read as 0%).
pub fn read_state(record: &Ns1Record, edges: &BTreeMap<ProviderId, String>) -> SteeringState {
    let mut groups: BTreeMap<String, Vec<(ProviderId, u32)>> = BTreeMap::new();
    for a in &record.answers {
        let Some(group) = &a.region else { continue };
        let Some(provider) = provider_of(a, edges) else {
            continue;
        };
        let value = match meta_u64(&a.meta, "priority").unwrap_or(PRIORITY_PRIMARY) {
            PRIORITY_PRIMARY => meta_u64(&a.meta, "weight")
                .unwrap_or(1)
                .min(u64::from(u32::MAX)) as u32,
            PRIORITY_STANDBY => 0,
            _ => continue,
        };
        let entry = groups.entry(group.clone()).or_default();
        if !entry.iter().any(|(p, _)| p == &provider) {
            entry.push((provider, value));
        }
    }
    let mut cohorts: Vec<CohortPlan> = groups
        .into_iter()
        .filter_map(|(group, values)| {
            let cohort = CohortId::new(&group).ok()?;
            let sum: u64 = values.iter().map(|(_, v)| u64::from(*v)).sum();
            let weights = if sum == u64::from(TOTAL_BP) {
                Weights::new(values).ok()?
            } else {
                Weights::from_scale(values, 1).ok()?
            };
            Some(CohortPlan {
                cohort,
                networks: networks_of(record.regions.get(&group)).into(),
                weights,
            })
        })
        .collect();
    cohorts.sort_by_key(|c| (specificity(c), c.cohort.clone()));
    SteeringState {
        record: record.domain.clone(),
        cohorts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    fn inputs() -> RecordInputs {
        RecordInputs {
            zone: "example.com".into(),
            edges: [
                (p("fastly"), "f.example.net".to_owned()),
                (p("cloudflare"), "c.example.net".to_owned()),
            ]
            .into(),
            feeds: [(p("fastly"), "feed-f".to_owned())].into(),
        }
    }

    fn plan() -> SteeringPlan {
        let w = |f: f64| {
            Weights::from_percentages([(p("fastly"), f), (p("cloudflare"), 100.0 - f)]).unwrap()
        };
        SteeringPlan {
            record: "www.example.com".into(),
            ttl: Duration::from_secs(30),
            cohorts: vec![
                CohortPlan {
                    cohort: CohortId::new("default").unwrap(),
                    networks: [NetworkKey::Global].into(),
                    weights: w(50.0),
                },
                CohortPlan {
                    cohort: CohortId::new("europe").unwrap(),
                    networks: ["EU".parse().unwrap(), "TR".parse().unwrap()].into(),
                    weights: w(100.0),
                },
                CohortPlan {
                    cohort: CohortId::new("comcast").unwrap(),
                    networks: ["AS7922".parse().unwrap()].into(),
                    weights: w(90.0),
                },
            ],
        }
    }

    #[test]
    fn groups_go_most_specific_first_with_a_last_resort_in_each() {
        let r = build_record(&plan(), &inputs()).unwrap();
        let groups: Vec<&str> = r
            .answers
            .iter()
            .filter_map(|a| a.region.as_deref())
            .collect();
        assert_eq!(groups.first(), Some(&"comcast"));
        assert_eq!(groups.last(), Some(&"default"));
        assert_eq!(r.filters[1].filter, "netfence_asn");
        assert_eq!(r.regions["comcast"].meta["asn"], json!([7922]));
        assert!(r.regions["default"].meta.is_empty());
        let eu = r.regions["europe"].meta["country"].as_array().unwrap();
        assert!(
            eu.contains(&json!("DE")) && eu.contains(&json!("TR")) && !eu.contains(&json!("US"))
        );
        for group in ["comcast", "europe", "default"] {
            let last: Vec<&Ns1Answer> = r
                .answers
                .iter()
                .filter(|a| {
                    a.region.as_deref() == Some(group)
                        && a.meta["priority"] == json!(PRIORITY_LAST_RESORT)
                })
                .collect();
            assert!(
                !last.is_empty() && last.iter().all(|a| a.meta["up"] == json!(true)),
                "{group}"
            );
        }
        // Europe gives cloudflare 0%: a standby answer, driven by its feed (none: always up).
        let standby: Vec<&Ns1Answer> = r
            .answers
            .iter()
            .filter(|a| a.meta["priority"] == json!(PRIORITY_STANDBY))
            .collect();
        assert_eq!(standby.len(), 1);
        assert_eq!(standby[0].answer, vec!["c.example.net".to_owned()]);
        let fastly_primary = r
            .answers
            .iter()
            .find(|a| a.region.as_deref() == Some("comcast") && a.answer[0] == "f.example.net")
            .unwrap();
        assert_eq!(fastly_primary.meta["up"], json!({"feed": "feed-f"}));
        assert_eq!(fastly_primary.meta["weight"], json!(9000));
    }

    #[test]
    fn the_record_reads_back_as_the_plan() {
        let r = build_record(&plan(), &inputs()).unwrap();
        let json = serde_json::to_string(&r).unwrap();
        let back: Ns1Record = serde_json::from_str(&json).unwrap();
        let state = read_state(&back, &inputs().edges);
        let diff = multicdn_core::SteeringDiff::between(&state, &plan());
        assert!(diff.is_empty(), "{diff}");
        let europe = state.cohort(&CohortId::new("europe").unwrap()).unwrap();
        assert_eq!(
            europe.networks,
            vec![
                NetworkKey::Country(Country::new("TR").unwrap()),
                "EU".parse().unwrap()
            ]
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
        );
    }

    #[test]
    fn refuses_what_ns1_cannot_express() {
        let mut mixed = plan();
        let mut networks = mixed.cohorts[2].networks.to_vec();
        networks.push("DE".parse().unwrap());
        mixed.cohorts[2].networks = networks.into();
        assert!(
            build_record(&mixed, &inputs())
                .unwrap_err()
                .contains("mixes")
        );
        let mut outside = plan();
        outside.record = "www.example.org".into();
        assert!(
            build_record(&outside, &inputs())
                .unwrap_err()
                .contains("outside the zone")
        );
        let mut unknown = plan();
        unknown.cohorts[0].weights = Weights::single(p("akamai"));
        assert!(
            build_record(&unknown, &inputs())
                .unwrap_err()
                .contains("unknown provider")
        );
        let mut apex = plan();
        apex.record = "example.com.".into();
        let e = build_record(&apex, &inputs()).unwrap_err();
        assert!(e.contains("zone apex"), "{e}");
    }

    #[test]
    fn continents_expand_to_their_countries() {
        let eu = countries_of(Continent::Europe);
        assert!(eu.contains(&"DE".to_owned()) && eu.len() > 40);
        assert!(countries_of(Continent::Antarctica).contains(&"AQ".to_owned()));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn providers() -> Vec<ProviderId> {
        ["a", "b", "c"]
            .iter()
            .map(|p| ProviderId::new(p).unwrap())
            .collect()
    }

    /// Any split in basis points, zeros included.
    fn split() -> impl Strategy<Value = Weights> {
        prop::collection::vec(0u32..=10_000, 3).prop_filter_map("needs a share", |raw| {
            (raw.iter().sum::<u32>() > 0).then(|| {
                let bp = multicdn_core::weights::largest_remainder(&raw, TOTAL_BP);
                Weights::new(providers().into_iter().zip(bp)).unwrap()
            })
        })
    }

    const PLACES: [&str; 6] = ["AS7922", "AS3320", "DE", "continent:AS", "EU", "BR"];

    fn plan() -> impl Strategy<Value = SteeringPlan> {
        prop::collection::vec(split(), 1..=7).prop_map(|splits| {
            let n = splits.len();
            SteeringPlan {
                record: "www.example.com".into(),
                ttl: Duration::from_secs(30),
                cohorts: splits
                    .into_iter()
                    .enumerate()
                    .map(|(i, weights)| CohortPlan {
                        cohort: CohortId::new(&format!("c{i}")).unwrap(),
                        networks: [if i + 1 == n { "*" } else { PLACES[i] }.parse().unwrap()]
                            .into(),
                        weights,
                    })
                    .collect(),
            }
        })
    }

    fn inputs() -> RecordInputs {
        RecordInputs {
            zone: "example.com".into(),
            edges: providers()
                .into_iter()
                .map(|p| (p.clone(), format!("{p}.edge.net")))
                .collect(),
            feeds: providers()
                .into_iter()
                .map(|p| (p.clone(), format!("feed-{p}")))
                .collect(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn any_plan_reads_back_exactly_and_every_group_has_an_always_up_answer(plan in plan()) {
            let record = build_record(&plan, &inputs()).unwrap();
            let json = serde_json::to_string(&record).unwrap();
            let back: Ns1Record = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(&back, &record);
            let state = read_state(&back, &inputs().edges);
            prop_assert!(multicdn_core::SteeringDiff::between(&state, &plan).is_empty());
            for group in record.regions.keys() {
                prop_assert!(record.answers.iter().any(|a| a.region.as_ref() == Some(group) && a.meta["up"] == json!(true)));
            }
            // Groups appear in answer order from most to least specific.
            let order: Vec<&str> = record.answers.iter().filter_map(|a| a.region.as_deref()).collect();
            let catch_all = plan.cohorts.last().unwrap().cohort.as_str();
            prop_assert_eq!(*order.last().unwrap(), catch_all);
        }
    }
}
