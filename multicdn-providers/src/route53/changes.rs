//! From the sets in force to the sets wanted: the changes, in a safe order, split into
//! batches Route 53 accepts, and shown as a dry run. Pure: no I/O.

use std::collections::BTreeMap;
use std::fmt;

use super::layout::{GeoLocation, RecordSet, is_managed_name, normalise_name};

/// Route 53 accepts at most this many `ResourceRecord` elements in one batch (an `UPSERT`'s
/// count twice).
pub const MAX_RECORDS_PER_BATCH: usize = 1_000;

/// Route 53 accepts at most this many characters in all the `Value` elements of one batch (an
/// `UPSERT`'s count twice; Route 53 quotas, "maximum number of characters in a change batch").
pub const MAX_VALUE_CHARS_PER_BATCH: usize = 32_000;

/// A change's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// A set that does not exist yet.
    Create,
    /// A set that exists with other values.
    Upsert,
    /// A set no longer wanted; carries the set exactly as it stands.
    Delete,
}

impl Action {
    /// Route 53's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "CREATE",
            Action::Upsert => "UPSERT",
            Action::Delete => "DELETE",
        }
    }
}

/// One change to one set, with what stood before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// What to do.
    pub action: Action,
    /// The set sent: the wanted one, or for a delete the one in force.
    pub set: RecordSet,
    /// The set in force before, if any.
    pub before: Option<RecordSet>,
}

impl Change {
    /// How many `ResourceRecord` elements Route 53 counts for this change.
    pub fn record_count(&self) -> usize {
        let n = self.set.values.len().max(1);
        if self.action == Action::Upsert {
            2 * n
        } else {
            n
        }
    }

    /// How many characters Route 53 counts for this change in its `Value` elements.
    pub fn value_chars(&self) -> usize {
        let n: usize = self.set.values.iter().map(|v| v.chars().count()).sum();
        if self.action == Action::Upsert {
            2 * n
        } else {
            n
        }
    }
}

/// What applying a plan would do to the record's sets: every set touched, with its weight
/// (or target) before and after. Empty means nothing to do.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordSetDiff {
    /// The changes, in the order they are sent.
    pub changes: Vec<Change>,
    /// Managed sets in force before.
    pub sets_before: usize,
    /// Sets the plan and the state hold between them.
    pub sets_total: usize,
}

impl RecordSetDiff {
    /// True when nothing changes.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// How many distinct sets the changes touch (a set replaced by a `DELETE` and a
    /// `CREATE` counts once).
    pub fn touched(&self) -> usize {
        self.changes
            .iter()
            .map(|c| normalised_key(&c.set))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    }

    /// The share of the record's sets the change touches, 0.0 to 1.0.
    pub fn touched_share(&self) -> f64 {
        if self.sets_total == 0 {
            0.0
        } else {
            self.touched() as f64 / self.sets_total as f64
        }
    }

    /// The changes split into batches of at most [`MAX_RECORDS_PER_BATCH`] records and
    /// [`MAX_VALUE_CHARS_PER_BATCH`] value characters, order kept; one batch (applied
    /// atomically) whenever they fit. Every batch is within both limits, so Route 53 never
    /// refuses a later batch after earlier ones applied.
    pub fn batches(&self) -> Vec<&[Change]> {
        split_batches(
            &self.changes,
            MAX_RECORDS_PER_BATCH,
            MAX_VALUE_CHARS_PER_BATCH,
        )
    }
}

/// Splits `changes` into runs of at most `max_records` records and `max_chars` value
/// characters ([`Change::record_count`], [`Change::value_chars`]), keeping order. A single
/// change over a limit on its own is a batch of its own.
pub fn split_batches(changes: &[Change], max_records: usize, max_chars: usize) -> Vec<&[Change]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut count = 0;
    let mut chars = 0;
    for (i, c) in changes.iter().enumerate() {
        let (n, k) = (c.record_count(), c.value_chars());
        if (count + n > max_records || chars + k > max_chars) && i > start {
            // A replacement's DELETE moves to the next batch with its CREATE, unless it
            // opened this batch.
            let cut = if is_replacement(changes, i) && i - 1 > start {
                i - 1
            } else {
                i
            };
            out.push(&changes[start..cut]);
            count = changes[cut..i].iter().map(Change::record_count).sum();
            chars = changes[cut..i].iter().map(Change::value_chars).sum();
            start = cut;
        }
        count += n;
        chars += k;
    }
    if start < changes.len() {
        out.push(&changes[start..]);
    }
    out
}

/// Where a change goes in the order: targets exist before what points at them, pointers go
/// before their targets. A `DELETE` that makes way for a `CREATE` of the same set (a CNAME
/// value becoming an alias) goes right before it, in the same place in the order.
fn rank(change: &Change, record: &str, replaced: bool) -> u8 {
    let at_record = normalise_name(&change.set.name) == record;
    match (change.action, at_record, change.set.geo.is_some()) {
        // Pools first, so every geolocation set's target exists when it lands.
        (Action::Create | Action::Upsert, false, _) => 0,
        (Action::Delete, false, _) if replaced => 0,
        // Sets at the name that are not ours (a plain weighted setup being replaced) go
        // before the geolocation sets that cannot share the name with them.
        (Action::Delete, true, false) => 1,
        (Action::Create | Action::Upsert, true, _) => 2,
        (Action::Delete, true, true) if replaced => 2,
        (Action::Delete, true, true) => 3,
        (Action::Delete, false, _) => 4,
    }
}

fn normalised_key(set: &RecordSet) -> (String, String, String) {
    let mut key = set.key();
    key.0 = normalise_name(&key.0);
    key
}

/// True when `changes[i]` creates the set `changes[i - 1]` deletes: the pair must share a
/// batch.
fn is_replacement(changes: &[Change], i: usize) -> bool {
    i > 0
        && changes[i].action == Action::Create
        && changes[i - 1].action == Action::Delete
        && normalised_key(&changes[i].set) == normalised_key(&changes[i - 1].set)
}

/// Compares the managed sets in force (`existing`: any listing of the zone; sets outside
/// the record and its pools are ignored) with the sets wanted, and orders the changes.
pub fn diff_sets(
    record: &str,
    existing: &[RecordSet],
    desired: &[RecordSet],
) -> Result<RecordSetDiff, String> {
    let record = normalise_name(record);
    // Other types at a managed name (an A/AAAA at the record, say): Route 53 refuses a CNAME
    // beside them, so the plan is refused before any batch is sent.
    let mut by_name: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for set in existing
        .iter()
        .filter(|s| is_managed_name(&s.name, &record))
    {
        by_name
            .entry(normalise_name(&set.name))
            .or_default()
            .push(set.rtype.as_str());
    }
    for (name, types) in &by_name {
        crate::dns::check_cname_alone(name, types.iter().copied())?;
    }
    let mut current: BTreeMap<(String, String, String), &RecordSet> = BTreeMap::new();
    for set in existing
        .iter()
        .filter(|s| is_managed_name(&s.name, &record) && s.rtype == "CNAME")
    {
        current.insert(normalised_key(set), set);
    }
    if let Some(foreign) = current
        .values()
        .find_map(|s| s.foreign.as_ref().map(|f| (s, f)))
    {
        return Err(format!(
            "{} [{}] uses {} routing, which this layout does not manage: remove it before steering {record}",
            foreign.0.name,
            foreign.0.set_identifier.as_deref().unwrap_or("-"),
            foreign.1
        ));
    }
    let mut changes = Vec::new();
    let mut replaced = std::collections::BTreeSet::new();
    let mut wanted = std::collections::BTreeSet::new();
    for set in desired {
        let key = normalised_key(set);
        wanted.insert(key.clone());
        match current.get(&key) {
            None => changes.push(Change {
                action: Action::Create,
                set: set.clone(),
                before: None,
            }),
            // A set with values becoming an alias (or back): the old set is deleted and the new
            // one created in the same batch, the way Route 53's ChangeResourceRecordSets
            // reference turns a CNAME into an alias in one transaction.
            Some(before) if before.alias.is_some() != set.alias.is_some() => {
                replaced.insert(key);
                changes.push(Change {
                    action: Action::Delete,
                    set: (*before).clone(),
                    before: Some((*before).clone()),
                });
                changes.push(Change {
                    action: Action::Create,
                    set: set.clone(),
                    before: Some((*before).clone()),
                });
            }
            Some(before) if !before.same_content(set) => changes.push(Change {
                action: Action::Upsert,
                set: set.clone(),
                before: Some((*before).clone()),
            }),
            Some(_) => {}
        }
    }
    for (key, set) in &current {
        if !wanted.contains(key) {
            changes.push(Change {
                action: Action::Delete,
                set: (*set).clone(),
                before: Some((*set).clone()),
            });
        }
    }
    changes.sort_by_key(|c| {
        let replaces = c.action == Action::Delete && replaced.contains(&normalised_key(&c.set));
        rank(c, &record, replaces)
    });
    let sets_total = wanted.len() + current.keys().filter(|k| !wanted.contains(*k)).count();
    Ok(RecordSetDiff {
        changes,
        sets_before: current.len(),
        sets_total,
    })
}

fn describe(set: &RecordSet) -> String {
    match (&set.weight, &set.alias) {
        (Some(w), _) => format!("weight {w}"),
        (None, Some(a)) => format!(
            "alias -> {}{}",
            a.dns_name,
            if a.evaluate_target_health {
                " (evaluate target health)"
            } else {
                ""
            }
        ),
        (None, None) => format!("-> {}", set.target().unwrap_or("")),
    }
}

fn geo_text(geo: &Option<GeoLocation>) -> String {
    match geo {
        Some(GeoLocation::Continent(c)) => format!(" continent {c}"),
        Some(GeoLocation::Country(c)) => format!(" country {c}"),
        Some(GeoLocation::Default) => " default".to_owned(),
        Some(GeoLocation::Subdivision(c, s)) => format!(" subdivision {c}-{s}"),
        None => String::new(),
    }
}

impl fmt::Display for RecordSetDiff {
    /// One line a set: `~ europe._steer.www.example.com [europe-fastly] weight 229 -> 178`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.changes.is_empty() {
            return writeln!(f, "no changes");
        }
        for c in &self.changes {
            let id = c.set.set_identifier.as_deref().unwrap_or("-");
            let geo = geo_text(&c.set.geo);
            match (c.action, &c.before) {
                (Action::Create, _) => {
                    writeln!(f, "+ {} [{id}]{geo} {}", c.set.name, describe(&c.set))?
                }
                (Action::Delete, _) => {
                    writeln!(f, "- {} [{id}]{geo} {}", c.set.name, describe(&c.set))?
                }
                (Action::Upsert, Some(before)) => {
                    let (b, a) = (describe(before), describe(&c.set));
                    let after = a
                        .strip_prefix("weight ")
                        .or_else(|| a.strip_prefix("-> "))
                        .unwrap_or(&a);
                    if b == a {
                        writeln!(
                            f,
                            "~ {} [{id}]{geo} {b} (ttl, value or health check)",
                            c.set.name
                        )?
                    } else {
                        writeln!(f, "~ {} [{id}]{geo} {b} -> {after}", c.set.name)?
                    }
                }
                (Action::Upsert, None) => {
                    writeln!(f, "~ {} [{id}]{geo} {}", c.set.name, describe(&c.set))?
                }
            }
        }
        writeln!(
            f,
            "{} of {} sets touched ({:.0}%)",
            self.touched(),
            self.sets_total,
            self.touched_share() * 100.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout::{LayoutInputs, desired_sets};
    use super::*;
    use multicdn_core::{CohortId, CohortPlan, ProviderId, SteeringPlan, Weights};
    use std::time::Duration;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    fn inputs() -> LayoutInputs {
        LayoutInputs {
            zone: "example.com".into(),
            zone_id: "Z1".into(),
            edges: [
                (p("fastly"), "f.example.net".to_owned()),
                (p("cloudflare"), "c.example.net".to_owned()),
            ]
            .into(),
            health_checks: BTreeMap::new(),
        }
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
                    cohort: CohortId::new("europe").unwrap(),
                    networks: ["DE".parse().unwrap(), "FR".parse().unwrap()].into(),
                    weights: w(eu_fastly),
                },
                CohortPlan {
                    cohort: CohortId::new("default").unwrap(),
                    networks: ["*".parse().unwrap()].into(),
                    weights: w(50.0),
                },
            ],
        }
    }

    #[test]
    fn from_nothing_pools_are_created_before_the_names_pointing_at_them() {
        let desired = desired_sets(&plan(90.0), &inputs()).unwrap();
        let diff = diff_sets("www.example.com", &[], &desired).unwrap();
        assert_eq!(diff.changes.len(), 7);
        let first_geo = diff
            .changes
            .iter()
            .position(|c| c.set.geo.is_some())
            .unwrap();
        assert!(
            diff.changes[..first_geo]
                .iter()
                .all(|c| c.set.weight.is_some())
        );
        assert!(diff.changes.iter().all(|c| c.action == Action::Create));
        assert_eq!(diff.batches().len(), 1);
    }

    #[test]
    fn applying_the_same_plan_again_changes_nothing() {
        let desired = desired_sets(&plan(90.0), &inputs()).unwrap();
        let diff = diff_sets("www.example.com", &desired, &desired).unwrap();
        assert!(diff.is_empty());
        assert_eq!(diff.to_string(), "no changes\n");
    }

    #[test]
    fn a_weight_change_upserts_only_that_cohorts_pool_and_shows_before_and_after() {
        let before = desired_sets(&plan(90.0), &inputs()).unwrap();
        let after = desired_sets(&plan(70.0), &inputs()).unwrap();
        let diff = diff_sets("www.example.com", &before, &after).unwrap();
        assert_eq!(diff.changes.len(), 2);
        assert!(diff.changes.iter().all(|c| c.action == Action::Upsert));
        let text = diff.to_string();
        assert!(
            text.contains("~ europe._steer.www.example.com [europe-fastly] weight 229 -> 178"),
            "{text}"
        );
        assert!(text.contains("2 of 7 sets touched (29%)"), "{text}");
    }

    #[test]
    fn removed_sets_are_deleted_exactly_as_they_stand_pointers_before_targets() {
        let before = desired_sets(&plan(90.0), &inputs()).unwrap();
        let mut smaller = plan(90.0);
        smaller.cohorts.remove(0);
        let after = desired_sets(&smaller, &inputs()).unwrap();
        let diff = diff_sets("www.example.com", &before, &after).unwrap();
        let deletes: Vec<&Change> = diff
            .changes
            .iter()
            .filter(|c| c.action == Action::Delete)
            .collect();
        assert_eq!(deletes.len(), 4);
        assert!(deletes[0].set.geo.is_some() && deletes[1].set.geo.is_some());
        assert!(deletes[2].set.weight.is_some());
        for d in deletes {
            assert!(before.contains(&d.set));
        }
    }

    #[test]
    fn batches_split_at_a_thousand_records_counting_upserts_twice() {
        let set = desired_sets(&plan(90.0), &inputs()).unwrap().remove(0);
        let changes: Vec<Change> = (0..700)
            .map(|_| Change {
                action: Action::Upsert,
                set: set.clone(),
                before: None,
            })
            .collect();
        let batches = split_batches(&changes, MAX_RECORDS_PER_BATCH, MAX_VALUE_CHARS_PER_BATCH);
        assert_eq!(
            batches.iter().map(|b| b.len()).collect::<Vec<_>>(),
            vec![500, 200]
        );
        let creates: Vec<Change> = (0..1000)
            .map(|_| Change {
                action: Action::Create,
                set: set.clone(),
                before: None,
            })
            .collect();
        assert_eq!(
            split_batches(&creates, MAX_RECORDS_PER_BATCH, MAX_VALUE_CHARS_PER_BATCH).len(),
            1
        );
    }

    #[test]
    fn batches_split_at_32000_value_characters_counting_upserts_twice() {
        // 300 UPSERTs of a 60-character target: 600 records (under 1,000) but 36,000
        // characters, which Route 53 refuses with InvalidChangeBatch.
        let mut set = desired_sets(&plan(90.0), &inputs()).unwrap().remove(0);
        set.values = vec![format!("{}.example.net", "e".repeat(48))];
        assert_eq!(set.values[0].len(), 60);
        let changes: Vec<Change> = (0..300)
            .map(|_| Change {
                action: Action::Upsert,
                set: set.clone(),
                before: None,
            })
            .collect();
        let diff = RecordSetDiff {
            changes,
            sets_before: 300,
            sets_total: 300,
        };
        let batches = diff.batches();
        assert_eq!(
            batches.iter().map(|b| b.len()).collect::<Vec<_>>(),
            vec![266, 34]
        );
        for b in &batches {
            assert!(b.iter().map(Change::value_chars).sum::<usize>() <= MAX_VALUE_CHARS_PER_BATCH);
        }
        // CREATEs count once: 36,000 / 2 fits one batch.
        let creates: Vec<Change> = diff
            .changes
            .iter()
            .map(|c| Change {
                action: Action::Create,
                ..c.clone()
            })
            .collect();
        assert_eq!(
            split_batches(&creates, MAX_RECORDS_PER_BATCH, MAX_VALUE_CHARS_PER_BATCH).len(),
            1
        );
    }

    /// The sets of the layout before aliases: geolocation CNAMEs whose value is the pool.
    fn cname_chain(sets: Vec<RecordSet>) -> Vec<RecordSet> {
        sets.into_iter()
            .map(|mut s| {
                if let Some(alias) = s.alias.take() {
                    s.values = vec![alias.dns_name];
                    s.ttl = Some(30);
                }
                s
            })
            .collect()
    }

    #[test]
    fn an_old_cname_chain_is_replaced_by_aliases_delete_beside_create_in_one_batch() {
        let desired = desired_sets(&plan(90.0), &inputs()).unwrap();
        let old = cname_chain(desired.clone());
        let diff = diff_sets("www.example.com", &old, &desired).unwrap();
        // Three geolocation sets, each a DELETE of the CNAME right before the CREATE of its
        // alias; the pools are untouched.
        let actions: Vec<(Action, &str, bool)> = diff
            .changes
            .iter()
            .map(|c| {
                (
                    c.action,
                    c.set.set_identifier.as_deref().unwrap(),
                    c.set.alias.is_some(),
                )
            })
            .collect();
        assert_eq!(
            actions,
            [
                (Action::Delete, "geo-DE", false),
                (Action::Create, "geo-DE", true),
                (Action::Delete, "geo-FR", false),
                (Action::Create, "geo-FR", true),
                (Action::Delete, "geo-default", false),
                (Action::Create, "geo-default", true),
            ]
        );
        assert_eq!(diff.touched(), 3);
        assert!(diff.to_string().contains("3 of 7 sets touched"), "{diff}");
        assert!(
            diff.to_string().contains(
                "+ www.example.com [geo-DE] country DE alias -> europe._steer.www.example.com (evaluate target health)"
            ),
            "{diff}"
        );
        for d in diff.changes.iter().filter(|c| c.action == Action::Delete) {
            assert!(
                old.contains(&d.set),
                "a DELETE repeats the set as it stands"
            );
        }
        // Applied, the aliases read as nothing to do.
        assert!(
            diff_sets("www.example.com", &desired, &desired)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_batch_split_never_separates_a_replacements_delete_from_its_create() {
        let desired = desired_sets(&plan(90.0), &inputs()).unwrap();
        let diff = diff_sets("www.example.com", &cname_chain(desired.clone()), &desired).unwrap();
        // Three records a batch would cut between geo-FR's DELETE and CREATE.
        let batches = split_batches(&diff.changes, 3, MAX_VALUE_CHARS_PER_BATCH);
        assert_eq!(
            batches.iter().map(|b| b.len()).collect::<Vec<_>>(),
            vec![2, 2, 2]
        );
        for b in batches {
            assert_eq!(normalised_key(&b[0].set), normalised_key(&b[1].set));
        }
    }

    #[test]
    fn foreign_routing_at_the_name_is_refused() {
        let mut odd = desired_sets(&plan(90.0), &inputs()).unwrap();
        odd[0].foreign = Some("Failover".into());
        let e = diff_sets("www.example.com", &odd, &[]).unwrap_err();
        assert!(e.contains("Failover"), "{e}");
    }

    #[test]
    fn an_a_record_at_the_name_is_refused_before_anything_is_sent() {
        let desired = desired_sets(&plan(90.0), &inputs()).unwrap();
        let a = RecordSet {
            name: "WWW.example.com.".into(),
            rtype: "A".into(),
            set_identifier: None,
            weight: None,
            geo: None,
            ttl: Some(300),
            values: vec!["192.0.2.1".into()],
            alias: None,
            health_check_id: None,
            foreign: None,
        };
        let e = diff_sets("www.example.com", std::slice::from_ref(&a), &desired).unwrap_err();
        assert!(e.contains("www.example.com already holds A records"), "{e}");
        // An A record elsewhere in the zone is none of the layout's business.
        let elsewhere = RecordSet {
            name: "api.example.com".into(),
            ..a
        };
        assert!(diff_sets("www.example.com", &[elsewhere], &desired).is_ok());
    }
}

#[cfg(test)]
mod properties {
    use super::super::layout::{LayoutInputs, desired_sets, read_state};
    use super::*;
    use multicdn_core::{
        CohortId, CohortPlan, NetworkKey, ProviderId, SteeringDiff, SteeringPlan, Weights,
    };
    use proptest::prelude::*;
    use std::time::Duration;

    const COUNTRIES: [&str; 8] = ["DE", "FR", "GB", "US", "CA", "JP", "AU", "BR"];

    fn providers() -> Vec<ProviderId> {
        ["a", "b", "c"]
            .iter()
            .map(|p| ProviderId::new(p).unwrap())
            .collect()
    }

    fn inputs() -> LayoutInputs {
        LayoutInputs {
            zone: "example.com".into(),
            zone_id: "Z1".into(),
            edges: providers()
                .into_iter()
                .map(|p| (p.clone(), format!("{p}.edge.net")))
                .collect(),
            health_checks: BTreeMap::new(),
        }
    }

    /// Whole-percent splits over one to three providers; at least 1% or exactly 0 each.
    fn split() -> impl Strategy<Value = Weights> {
        prop::collection::vec(0u32..=100, 3).prop_filter_map("needs a share", |raw| {
            let sum: u32 = raw.iter().sum();
            (sum > 0).then(|| {
                let pct = multicdn_core::weights::largest_remainder(&raw, 100);
                Weights::new(
                    providers()
                        .into_iter()
                        .zip(pct.into_iter().map(|x| x * 100)),
                )
                .unwrap()
            })
        })
    }

    /// Up to eight country cohorts (each country used once) and the default.
    fn plan() -> impl Strategy<Value = SteeringPlan> {
        (prop::collection::vec(split(), 1..=8), 1u64..=3600).prop_map(|(splits, ttl)| {
            let n = splits.len();
            let cohorts = splits
                .into_iter()
                .enumerate()
                .map(|(i, weights)| CohortPlan {
                    cohort: CohortId::new(&format!("c{i}")).unwrap(),
                    networks: if i + 1 == n {
                        [NetworkKey::Global].into()
                    } else {
                        vec![COUNTRIES[i].parse().unwrap()].into()
                    },
                    weights,
                })
                .collect();
            SteeringPlan {
                record: "www.example.com".into(),
                ttl: Duration::from_secs(ttl),
                cohorts,
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn any_plan_reads_back_as_itself_and_reapplies_as_nothing(plan in plan()) {
            let sets = desired_sets(&plan, &inputs()).unwrap();
            let state = read_state("www.example.com", &sets);
            prop_assert!(SteeringDiff::between(&state, &plan).is_empty());
            prop_assert!(diff_sets("www.example.com", &sets, &sets).unwrap().is_empty());
            for cohort in &plan.cohorts {
                let pool: u32 = sets
                    .iter()
                    .filter(|s| s.name.starts_with(&format!("{}.", cohort.cohort)))
                    .filter_map(|s| s.weight)
                    .sum();
                prop_assert_eq!(pool, 255);
            }
        }

        #[test]
        fn between_any_two_plans_targets_come_before_pointers(a in plan(), b in plan()) {
            let before = desired_sets(&a, &inputs()).unwrap();
            let after = desired_sets(&b, &inputs()).unwrap();
            let diff = diff_sets("www.example.com", &before, &after).unwrap();
            // Applying the changes in order never leaves a geolocation set pointing at a pool
            // with no sets.
            let mut live: Vec<RecordSet> = before.clone();
            for c in &diff.changes {
                live.retain(|s| s.key() != c.set.key());
                if c.action != Action::Delete {
                    live.push(c.set.clone());
                }
                for geo in live.iter().filter(|s| s.geo.is_some()) {
                    prop_assert!(live.iter().any(|p| p.weight.is_some() && Some(p.name.as_str()) == geo.target()));
                }
            }
            let state = read_state("www.example.com", &live);
            prop_assert!(SteeringDiff::between(&state, &b).is_empty());
            prop_assert!(diff.batches().iter().all(|b| b.iter().map(Change::record_count).sum::<usize>() <= MAX_RECORDS_PER_BATCH));
            prop_assert!(diff.batches().iter().all(|b| b.iter().map(Change::value_chars).sum::<usize>() <= MAX_VALUE_CHARS_PER_BATCH));
        }
    }
}
