//! Traffic shares as integers that always sum to exactly 10,000 basis points.
//!
//! Vendors speak other scales (Route 53: integers 0–255; NS1: any positive number). Conversion
//! uses the largest-remainder method, so the vendor's integers sum to the scale exactly and a
//! whole-percent split survives the round trip: `from_scale(to_scale(w), 100) == w`.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::id::ProviderId;

/// The whole: 100% is 10,000 basis points.
pub const TOTAL_BP: u32 = 10_000;

/// Why a set of weights was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsError {
    /// The shares do not add up to the whole.
    #[error("weights sum to {sum} basis points ({}%), they must sum to exactly 10000 (100%)", *sum as f64 / 100.0)]
    BadSum {
        /// What they summed to.
        sum: u64,
    },
    /// A provider is listed twice.
    #[error("provider {0} is listed twice")]
    Duplicate(ProviderId),
    /// No provider at all.
    #[error("weights name no provider")]
    Empty,
    /// A percentage that is negative, not a number, or above 100.
    #[error("share {0} is not between 0% and 100%")]
    OutOfRange(String),
    /// The vendor's values sum to zero, so no split can be read from them.
    #[error("vendor weights sum to zero")]
    ZeroScale,
}

/// A split of traffic between providers, in basis points that sum to exactly [`TOTAL_BP`].
///
/// Providers are kept sorted by id, so equal splits compare equal and print the same way.
/// A provider may carry 0 (listed, but sent nothing). The shares are immutable and shared, so a
/// clone (a plan copying a cohort it does not change) is a reference count, not an allocation.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Weights {
    shares: Arc<[(ProviderId, u32)]>,
}

impl Weights {
    /// Builds weights from basis points; they must sum to exactly 10,000.
    pub fn new(
        shares: impl IntoIterator<Item = (ProviderId, u32)>,
    ) -> Result<Weights, WeightsError> {
        let mut shares: Vec<(ProviderId, u32)> = shares.into_iter().collect();
        if shares.is_empty() {
            return Err(WeightsError::Empty);
        }
        shares.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = shares.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(WeightsError::Duplicate(w[0].0.clone()));
        }
        let sum: u64 = shares.iter().map(|(_, bp)| u64::from(*bp)).sum();
        if sum != u64::from(TOTAL_BP) {
            return Err(WeightsError::BadSum { sum });
        }
        Ok(Weights {
            shares: shares.into(),
        })
    }

    /// Builds weights from percentages (which may carry up to two decimals: `12.5`).
    /// They must sum to 100 once expressed in basis points.
    pub fn from_percentages(
        shares: impl IntoIterator<Item = (ProviderId, f64)>,
    ) -> Result<Weights, WeightsError> {
        let bp = shares
            .into_iter()
            .map(|(id, pct)| Ok((id, percent_to_bp(pct)?)))
            .collect::<Result<Vec<_>, WeightsError>>()?;
        Weights::new(bp)
    }

    /// All traffic to one provider.
    pub fn single(provider: ProviderId) -> Weights {
        Weights {
            shares: Arc::from([(provider, TOTAL_BP)]),
        }
    }

    /// An even split, remainders to the first providers by id.
    pub fn even(providers: impl IntoIterator<Item = ProviderId>) -> Result<Weights, WeightsError> {
        let providers: Vec<ProviderId> = providers.into_iter().collect();
        if providers.is_empty() {
            return Err(WeightsError::Empty);
        }
        let ones = vec![1u32; providers.len()];
        let bp = largest_remainder(&ones, TOTAL_BP);
        Weights::new(providers.into_iter().zip(bp))
    }

    /// The share of one provider in basis points (0 when it is not listed).
    pub fn get(&self, provider: &ProviderId) -> u32 {
        // A plan lists a handful of providers: a scan comparing lengths before bytes (ids
        // cloned from one policy share their text, so the bytes are rarely read) beats a
        // binary search comparing bytes.
        if self.shares.len() <= 8 {
            return self
                .shares
                .iter()
                .find(|(id, _)| id == provider)
                .map_or(0, |(_, bp)| *bp);
        }
        self.shares
            .binary_search_by(|(id, _)| id.cmp(provider))
            .map(|i| self.shares[i].1)
            .unwrap_or(0)
    }

    /// The providers and their shares, sorted by provider id.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&ProviderId, u32)> + '_ {
        self.shares.iter().map(|(id, bp)| (id, *bp))
    }

    /// The providers listed, sorted by id.
    pub fn providers(&self) -> impl ExactSizeIterator<Item = &ProviderId> + '_ {
        self.shares.iter().map(|(id, _)| id)
    }

    /// How many providers are listed.
    pub fn len(&self) -> usize {
        self.shares.len()
    }

    /// Never true for a constructed value; here for the convention.
    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    /// The provider with the largest share (ties go to the first by id).
    pub fn leader(&self) -> &ProviderId {
        // `shares` is never empty by construction.
        let mut best = &self.shares[0];
        for s in &self.shares[1..] {
            if s.1 > best.1 {
                best = s;
            }
        }
        &best.0
    }

    /// Moves up to `bp` basis points from `from` to `to` (adding `to` if absent). Returns the
    /// weights after the move and how much actually moved (never more than `from` had).
    pub fn shift(&self, from: &ProviderId, to: &ProviderId, bp: u32) -> (Weights, u32) {
        let moved = bp.min(self.get(from));
        if moved == 0 || from == to {
            return (self.clone(), 0);
        }
        let step = |(id, share): &(ProviderId, u32)| {
            let share = if id == from {
                share - moved
            } else if id == to {
                share + moved
            } else {
                *share
            };
            (id.clone(), share)
        };
        let shares: Arc<[(ProviderId, u32)]> = if self.shares.iter().any(|(id, _)| id == to) {
            // One allocation: the new shares are written straight into their shared slice.
            self.shares.iter().map(step).collect()
        } else {
            let mut shares: Vec<_> = self.shares.iter().map(step).collect();
            shares.push((to.clone(), moved));
            shares.sort_by(|a, b| a.0.cmp(&b.0));
            shares.into()
        };
        (Weights { shares }, moved)
    }

    /// The basis points that must move to turn `self` into `other`: half the sum of absolute
    /// differences (what leaves one provider arrives at another).
    pub fn distance(&self, other: &Weights) -> u32 {
        let mut total = 0u32;
        for (id, bp) in self.iter() {
            total += bp.abs_diff(other.get(id));
        }
        for (id, bp) in other.iter() {
            if self.get(id) == 0 && !self.shares.iter().any(|(p, _)| p == id) {
                total += bp;
            }
        }
        total / 2
    }

    /// Converts to a vendor's integer scale (Route 53: `to_scale(255)`): each provider gets its
    /// exact share of `scale`, rounded by largest remainder so the values sum to `scale` exactly.
    pub fn to_scale(&self, scale: u32) -> Vec<(ProviderId, u32)> {
        let bp: Vec<u32> = self.shares.iter().map(|(_, bp)| *bp).collect();
        let values = largest_remainder(&bp, scale);
        self.shares
            .iter()
            .map(|(id, _)| id.clone())
            .zip(values)
            .collect()
    }

    /// Reads weights back from a vendor's integers. The result is rounded to multiples of
    /// `step_bp` (use 100 for whole percents, 1 for the finest reading) by largest remainder,
    /// so it still sums to exactly 10,000.
    pub fn from_scale(
        values: impl IntoIterator<Item = (ProviderId, u32)>,
        step_bp: u32,
    ) -> Result<Weights, WeightsError> {
        let values: Vec<(ProviderId, u32)> = values.into_iter().collect();
        let raw: Vec<u32> = values.iter().map(|(_, v)| *v).collect();
        if raw.iter().all(|v| *v == 0) {
            return Err(WeightsError::ZeroScale);
        }
        let step = step_bp.clamp(1, TOTAL_BP);
        if !TOTAL_BP.is_multiple_of(step) {
            return Err(WeightsError::OutOfRange(format!(
                "step of {step} basis points"
            )));
        }
        let units = largest_remainder(&raw, TOTAL_BP / step);
        Weights::new(
            values
                .into_iter()
                .map(|(id, _)| id)
                .zip(units.into_iter().map(|u| u * step)),
        )
    }

    /// The share of `provider` as a percentage.
    pub fn percent(&self, provider: &ProviderId) -> f64 {
        f64::from(self.get(provider)) / 100.0
    }
}

/// Splits `total` in proportion to `parts` with the largest-remainder (Hamilton) method: every
/// part gets the floor of its exact quota, then the leftover units go to the largest fractional
/// remainders (ties to the earlier part). The result sums to `total` exactly. When every part is
/// zero, everything is zero.
pub fn largest_remainder(parts: &[u32], total: u32) -> Vec<u32> {
    let sum: u64 = parts.iter().map(|p| u64::from(*p)).sum();
    if sum == 0 {
        return vec![0; parts.len()];
    }
    let total64 = u64::from(total);
    let mut out = Vec::with_capacity(parts.len());
    let mut remainders = Vec::with_capacity(parts.len());
    let mut given = 0u64;
    for (i, p) in parts.iter().enumerate() {
        let exact = u64::from(*p) * total64;
        let floor = exact / sum;
        given += floor;
        out.push(floor as u32);
        remainders.push((exact % sum, i));
    }
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, i) in remainders.into_iter().take((total64 - given) as usize) {
        out[i] += 1;
    }
    out
}

fn percent_to_bp(pct: f64) -> Result<u32, WeightsError> {
    if !pct.is_finite() || !(0.0..=100.0).contains(&pct) {
        return Err(WeightsError::OutOfRange(format!("{pct}%")));
    }
    let bp = (pct * 100.0).round();
    if ((bp / 100.0) - pct).abs() > 1e-9 {
        return Err(WeightsError::OutOfRange(format!(
            "{pct}% (at most two decimals: basis points)"
        )));
    }
    Ok(bp as u32)
}

impl fmt::Debug for Weights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Weights({self})")
    }
}

impl fmt::Display for Weights {
    /// `cloudflare 10%, fastly 90%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (id, bp)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if bp % 100 == 0 {
                write!(f, "{id} {}%", bp / 100)?;
            } else {
                write!(f, "{id} {:.2}%", f64::from(bp) / 100.0)?;
            }
        }
        Ok(())
    }
}

impl Serialize for Weights {
    /// A map of provider to basis points.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.shares.len()))?;
        for (id, bp) in self.shares.iter() {
            map.serialize_entry(id, bp)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Weights {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = std::collections::BTreeMap::<ProviderId, u32>::deserialize(d)?;
        Weights::new(map).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    #[test]
    fn refuses_sums_other_than_the_whole() {
        let err = Weights::new([(p("a"), 5000), (p("b"), 4000)]).unwrap_err();
        assert_eq!(err, WeightsError::BadSum { sum: 9000 });
        assert!(err.to_string().contains("90%"));
        assert!(matches!(
            Weights::new([(p("a"), 5000), (p("a"), 5000)]),
            Err(WeightsError::Duplicate(_))
        ));
        assert_eq!(Weights::new([]), Err(WeightsError::Empty));
    }

    #[test]
    fn reads_percentages_with_two_decimals() {
        let w = Weights::from_percentages([(p("fastly"), 87.5), (p("cloudflare"), 12.5)]).unwrap();
        assert_eq!(w.get(&p("fastly")), 8750);
        assert_eq!(w.to_string(), "cloudflare 12.50%, fastly 87.50%");
        assert!(Weights::from_percentages([(p("a"), 100.001)]).is_err());
        assert!(Weights::from_percentages([(p("a"), f64::NAN)]).is_err());
    }

    #[test]
    fn converts_the_seed_split_to_route53_scale() {
        let w = Weights::from_percentages([(p("fastly"), 85.0), (p("cloudflare"), 15.0)]).unwrap();
        let scaled = w.to_scale(255);
        // 15% of 255 = 38.25, 85% = 216.75: the leftover unit goes to the larger remainder.
        assert_eq!(scaled, vec![(p("cloudflare"), 38), (p("fastly"), 217)]);
        assert_eq!(Weights::from_scale(scaled, 100).unwrap(), w);
    }

    #[test]
    fn shift_moves_at_most_what_the_source_has() {
        let w = Weights::from_percentages([(p("a"), 90.0), (p("b"), 10.0)]).unwrap();
        let (after, moved) = w.shift(&p("b"), &p("a"), 2000);
        assert_eq!(moved, 1000);
        assert_eq!(after.get(&p("a")), 10_000);
        assert_eq!(w.distance(&after), 1000);
        let (after, moved) = w.shift(&p("a"), &p("c"), 500);
        assert_eq!((after.get(&p("c")), moved), (500, 500));
    }

    fn whole_percent_split() -> impl Strategy<Value = Vec<u32>> {
        prop::collection::vec(0u32..=100, 1..=6).prop_filter_map("needs a non-zero part", |raw| {
            let sum: u32 = raw.iter().sum();
            (sum > 0).then(|| {
                largest_remainder(&raw, 100)
                    .into_iter()
                    .map(|x| x * 100)
                    .collect()
            })
        })
    }

    fn ids(n: usize) -> Vec<ProviderId> {
        (0..n).map(|i| p(&format!("p{i}"))).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn largest_remainder_always_sums_to_the_total(
            parts in prop::collection::vec(0u32..1_000_000, 1..10),
            total in 1u32..100_000,
        ) {
            let out = largest_remainder(&parts, total);
            let sum: u64 = parts.iter().map(|x| u64::from(*x)).sum();
            let got: u64 = out.iter().map(|x| u64::from(*x)).sum();
            prop_assert_eq!(got, if sum == 0 { 0 } else { u64::from(total) });
        }

        #[test]
        fn any_constructed_weights_sum_to_ten_thousand(split in whole_percent_split()) {
            let w = Weights::new(ids(split.len()).into_iter().zip(split)).unwrap();
            prop_assert_eq!(w.iter().map(|(_, bp)| bp).sum::<u32>(), TOTAL_BP);
            let scaled = w.to_scale(255);
            prop_assert_eq!(scaled.iter().map(|(_, v)| v).sum::<u32>(), 255);
        }

        #[test]
        fn whole_percent_splits_survive_the_route53_round_trip(split in whole_percent_split()) {
            let w = Weights::new(ids(split.len()).into_iter().zip(split)).unwrap();
            let back = Weights::from_scale(w.to_scale(255), 100).unwrap();
            prop_assert_eq!(back, w);
        }

        #[test]
        fn a_one_percent_step_stays_visible_on_the_route53_scale(a in 0u32..100) {
            let before = Weights::new([(p("a"), a * 100), (p("b"), (100 - a) * 100)]).unwrap();
            let after = Weights::new([(p("a"), (a + 1) * 100), (p("b"), (99 - a) * 100)]).unwrap();
            prop_assert_ne!(before.to_scale(255), after.to_scale(255));
        }

        #[test]
        fn the_finest_round_trip_is_within_one_vendor_unit(
            raw in prop::collection::vec(0u32..=10_000, 2..=5)
        ) {
            prop_assume!(raw.iter().sum::<u32>() > 0);
            let bp = largest_remainder(&raw, TOTAL_BP);
            let w = Weights::new(ids(bp.len()).into_iter().zip(bp)).unwrap();
            let back = Weights::from_scale(w.to_scale(255), 1).unwrap();
            for (id, share) in w.iter() {
                // One unit of 255 is 39.2 basis points; rounding back adds under one basis point.
                prop_assert!(share.abs_diff(back.get(id)) <= 40, "{} {} {}", id, share, back.get(id));
            }
        }
    }
}
