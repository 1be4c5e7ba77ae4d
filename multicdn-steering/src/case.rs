//! The business case for a second CDN: what the outage insurance is worth against what it
//! costs, and where the performance argument holds.
//!
//! Two inputs. **Evidence** from the client-side probe ([`EvidenceBuilder`]): every probe
//! beacon times every provider on the same page load, so each beacon is a *pair* (same user,
//! same network, same moment). Per region the builder keeps each provider's p75 and sample
//! count, and a paired sign test over the loads that timed both providers. The sign test asks
//! only "which provider was faster on this load", so it needs no assumption about the shape of
//! latency distributions (heavy-tailed, multi-modal) and one pathological 30-second fetch weighs
//! no more than a 1 ms win. A region's performance argument holds only where the p75 difference
//! is at least the material threshold, the pairs number at least `min_pairs`, and the sign test
//! is significant at `alpha`; otherwise the case makes no claim for it.
//!
//! **Costs** ([`CostInputs`], from YAML): commits and egress prices, the steering layer,
//! engineering, the outage history and what an hour of outage costs. [`cost_case`] prices the
//! three options the seed frames (sections 17, 18, 21): live multi-CDN, a configured standby
//! drilled quarterly, or one CDN run properly.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

use crate::beacon::{Beacon, Received};

/// How the evidence is judged.
#[derive(Debug, Clone, PartialEq)]
pub struct EvidenceConfig {
    /// The two providers compared (`a` is the incumbent).
    pub providers: [String; 2],
    /// The provider order of the array form of probe times.
    pub order: Vec<String>,
    /// A p75 difference below this (ms) is not material.
    pub material_ms: f64,
    /// Fewer paired loads than this: no claim.
    pub min_pairs: u64,
    /// Two-sided significance level of the sign test.
    pub alpha: f64,
}

/// One provider's times in a region.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderStat {
    /// The 75th percentile (ms), `None` without samples.
    pub p75: Option<f64>,
    /// Successful probe times counted.
    pub samples: u64,
}

/// What the probe data says about one region.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionEvidence {
    /// The region (country code, `unknown` when unresolved).
    pub region: String,
    /// Per provider, in [`EvidenceConfig::providers`] order.
    pub stats: [ProviderStat; 2],
    /// `p75(a) - p75(b)`: positive means `b` is faster.
    pub p75_difference_ms: Option<f64>,
    /// Loads that timed both providers.
    pub pairs: u64,
    /// Loads where `b` was faster.
    pub b_faster: u64,
    /// Loads where `a` was faster.
    pub a_faster: u64,
    /// Two-sided sign-test p-value over the pairs (ties dropped).
    pub p_value: f64,
    /// Material, enough pairs, significant.
    pub argument_holds: bool,
}

/// Aggregates probe beacons into per-region evidence.
#[derive(Debug)]
pub struct EvidenceBuilder {
    config: EvidenceConfig,
    regions: BTreeMap<String, RegionAcc>,
    malformed: u64,
    ignored: u64,
}

#[derive(Debug, Default)]
struct RegionAcc {
    times: [Vec<f64>; 2],
    a_faster: u64,
    b_faster: u64,
}

impl EvidenceBuilder {
    /// An empty builder.
    pub fn new(config: EvidenceConfig) -> EvidenceBuilder {
        EvidenceBuilder {
            config,
            regions: BTreeMap::new(),
            malformed: 0,
            ignored: 0,
        }
    }

    /// Adds one NDJSON line (a [`Received`] beacon). A line that does not parse is counted as
    /// malformed; a navigation beacon is counted as ignored.
    pub fn add_line(&mut self, line: &str) {
        if line.trim().is_empty() {
            return;
        }
        match serde_json::from_str::<Received>(line) {
            Ok(received) => self.add(&received),
            Err(_) => self.malformed += 1,
        }
    }

    /// Adds one received beacon.
    pub fn add(&mut self, received: &Received) {
        let Beacon::Probe(probe) = &received.beacon else {
            self.ignored += 1;
            return;
        };
        let region = received
            .network
            .country
            .map_or_else(|| "unknown".to_owned(), |c| c.as_str().to_owned());
        let pairs = probe.pairs(&self.config.order);
        let time_of = |name: &str| {
            pairs
                .iter()
                .find(|(p, _)| *p == name)
                .and_then(|(_, t)| *t)
                .filter(|t| t.is_finite() && *t > 0.0)
        };
        let a = time_of(&self.config.providers[0]);
        let b = time_of(&self.config.providers[1]);
        let acc = self.regions.entry(region).or_default();
        if let Some(a) = a {
            acc.times[0].push(a);
        }
        if let Some(b) = b {
            acc.times[1].push(b);
        }
        if let (Some(a), Some(b)) = (a, b) {
            if b < a {
                acc.b_faster += 1;
            } else if a < b {
                acc.a_faster += 1;
            }
        }
    }

    /// Lines that did not parse.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    /// Beacons that were not probe beacons.
    pub fn ignored(&self) -> u64 {
        self.ignored
    }

    /// Probe beacons taken in.
    pub fn probes(&self) -> u64 {
        self.regions
            .values()
            .map(|r| r.times[0].len().max(r.times[1].len()) as u64)
            .sum()
    }

    /// The evidence per region, sorted by region.
    pub fn finish(self) -> Vec<RegionEvidence> {
        let config = self.config;
        self.regions
            .into_iter()
            .map(|(region, mut acc)| {
                let stats = [0, 1].map(|i| ProviderStat {
                    p75: p75(&mut acc.times[i]),
                    samples: acc.times[i].len() as u64,
                });
                let p75_difference_ms = match (stats[0].p75, stats[1].p75) {
                    (Some(a), Some(b)) => Some(a - b),
                    _ => None,
                };
                let pairs = acc.a_faster + acc.b_faster;
                let p_value = sign_test(acc.b_faster, pairs);
                let argument_holds = p75_difference_ms
                    .is_some_and(|d| d.abs() >= config.material_ms)
                    && pairs >= config.min_pairs
                    && p_value < config.alpha
                    // The significant direction agrees with the p75 difference.
                    && p75_difference_ms.is_some_and(|d| (d > 0.0) == (acc.b_faster > acc.a_faster));
                RegionEvidence {
                    region,
                    stats,
                    p75_difference_ms,
                    pairs,
                    b_faster: acc.b_faster,
                    a_faster: acc.a_faster,
                    p_value,
                    argument_holds,
                }
            })
            .collect()
    }
}

/// The 75th percentile by nearest rank.
fn p75(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = (0.75 * values.len() as f64).ceil() as usize;
    values.get(rank.saturating_sub(1)).copied()
}

/// Two-sided sign test: the probability, with no true difference, of a split at least as
/// lopsided as `k` of `n`. Exact up to 1,000 pairs, the normal approximation (with continuity
/// correction) above.
pub fn sign_test(k: u64, n: u64) -> f64 {
    if n == 0 {
        return 1.0;
    }
    let low = k.min(n - k);
    if n <= 1000 {
        // P(X <= low) for Binomial(n, 1/2), summed in log space.
        let ln_half_n = n as f64 * 0.5f64.ln();
        let mut ln_choose = 0.0f64;
        let mut tail = 0.0f64;
        for i in 0..=low {
            if i > 0 {
                ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
            }
            tail += (ln_choose + ln_half_n).exp();
        }
        (2.0 * tail).min(1.0)
    } else {
        let mean = n as f64 / 2.0;
        let sd = (n as f64).sqrt() / 2.0;
        let z = (mean - low as f64 - 0.5).max(0.0) / sd;
        (2.0 * normal_upper_tail(z)).min(1.0)
    }
}

/// `P(Z > z)` for a standard normal (Abramowitz and Stegun 7.1.26, error below 1.5e-7).
fn normal_upper_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    0.5 * poly * (-x * x).exp()
}

/// One provider's contract.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderCost {
    /// The provider's name (as in the probe beacons).
    pub name: String,
    /// Monthly commit: the least the contract bills.
    pub monthly_commit: f64,
    /// Price per GB of egress.
    pub egress_per_gb: f64,
    /// Share of traffic under the multi-CDN split, 0..=1.
    pub share: f64,
}

/// The cost inputs, as `case.yaml` holds them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostInputs {
    /// The currency symbol printed (`£`).
    pub currency: String,
    /// Egress per month, GB.
    pub monthly_egress_gb: f64,
    /// The providers; the first is the incumbent, the single CDN.
    pub providers: Vec<ProviderCost>,
    /// Managed DNS with health checks and steering, per month.
    pub steering_monthly: f64,
    /// Engineering to run two live configurations, per month.
    pub engineering_monthly: f64,
    /// Extra origin capacity from cache fragmentation, per month.
    #[serde(default)]
    pub origin_monthly: f64,
    /// Outage history: the hours of provider outage seen.
    pub outage_hours: f64,
    /// Over how many years.
    pub outage_years: f64,
    /// What an hour of outage costs.
    pub cost_per_hour: f64,
    /// The fraction of outage loss live multi-CDN avoids, 0..=1.
    pub multi_avoids: f64,
    /// A configured standby (drilled, no live traffic), per month.
    pub standby_monthly: f64,
    /// The fraction of outage loss the standby avoids, 0..=1.
    pub standby_avoids: f64,
    /// A p75 difference (ms) below this is not material.
    pub material_ms: f64,
    /// Fewer paired loads in a region than this: no claim.
    pub min_pairs: u64,
    /// Significance level of the sign test.
    #[serde(default = "default_alpha")]
    pub alpha: f64,
}

fn default_alpha() -> f64 {
    0.01
}

/// A cost file that cannot be used: where, which field, what is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaseError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file does not hold valid cost inputs.
    #[error("{file}:{line}:{column}: {field}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The field (`providers[1].share`), empty when the document itself is wrong.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// No line of the beacon input parsed.
    #[error("no beacon line parsed ({malformed} malformed)")]
    NoBeacons {
        /// Lines that did not parse.
        malformed: u64,
    },
}

impl CostInputs {
    /// Reads and checks the inputs at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<CostInputs, CaseError> {
        let file = path.as_ref().display().to_string();
        let src = std::fs::read_to_string(path.as_ref()).map_err(|source| CaseError::Read {
            file: file.clone(),
            source,
        })?;
        CostInputs::from_yaml(&src, &file)
    }

    /// Parses and checks inputs; `file` names them in errors.
    pub fn from_yaml(src: &str, file: &str) -> Result<CostInputs, CaseError> {
        let inputs: CostInputs = serde_saphyr::from_str(src).map_err(|e| {
            let (line, column) = e
                .location()
                .map_or((1, 1), |l| (l.line() as usize, l.column() as usize));
            let message = e.to_string();
            CaseError::Invalid {
                file: file.to_owned(),
                line,
                column,
                field: field_at(src, line),
                message: message.lines().next().unwrap_or_default().to_owned(),
            }
        })?;
        if let Some((field, message)) = inputs.problem() {
            let line = line_of(src, &field);
            return Err(CaseError::Invalid {
                file: file.to_owned(),
                line,
                column: 1,
                field,
                message,
            });
        }
        Ok(inputs)
    }

    /// The first problem a parsed file has, as `(field, message)`.
    fn problem(&self) -> Option<(String, String)> {
        let nonneg = [
            ("monthly_egress_gb", self.monthly_egress_gb),
            ("steering_monthly", self.steering_monthly),
            ("engineering_monthly", self.engineering_monthly),
            ("origin_monthly", self.origin_monthly),
            ("outage_hours", self.outage_hours),
            ("cost_per_hour", self.cost_per_hour),
            ("standby_monthly", self.standby_monthly),
            ("material_ms", self.material_ms),
        ];
        for (field, v) in nonneg {
            if !(v.is_finite() && v >= 0.0) {
                return Some((field.to_owned(), format!("must be a number >= 0, not {v}")));
            }
        }
        if !(self.outage_years.is_finite() && self.outage_years > 0.0) {
            return Some(("outage_years".to_owned(), "must be > 0".to_owned()));
        }
        for (field, v) in [
            ("multi_avoids", self.multi_avoids),
            ("standby_avoids", self.standby_avoids),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Some((field.to_owned(), format!("must be within 0..=1, not {v}")));
            }
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Some(("alpha".to_owned(), "must be within (0, 1)".to_owned()));
        }
        if self.providers.len() != 2 {
            return Some((
                "providers".to_owned(),
                format!("must list two providers, not {}", self.providers.len()),
            ));
        }
        for (i, p) in self.providers.iter().enumerate() {
            for (name, v) in [
                ("monthly_commit", p.monthly_commit),
                ("egress_per_gb", p.egress_per_gb),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Some((
                        format!("providers[{i}].{name}"),
                        format!("must be a number >= 0, not {v}"),
                    ));
                }
            }
            if !(0.0..=1.0).contains(&p.share) {
                return Some((
                    format!("providers[{i}].share"),
                    format!("must be within 0..=1, not {}", p.share),
                ));
            }
        }
        let total: f64 = self.providers.iter().map(|p| p.share).sum();
        if (total - 1.0).abs() > 1e-9 {
            return Some((
                "providers".to_owned(),
                format!("shares must add up to 1, not {total}"),
            ));
        }
        None
    }

    /// The evidence configuration these inputs imply for the two providers.
    pub fn evidence_config(&self) -> EvidenceConfig {
        let names: Vec<String> = self.providers.iter().map(|p| p.name.clone()).collect();
        EvidenceConfig {
            providers: [
                names.first().cloned().unwrap_or_default(),
                names.get(1).cloned().unwrap_or_default(),
            ],
            order: names,
            material_ms: self.material_ms,
            min_pairs: self.min_pairs,
            alpha: self.alpha,
        }
    }
}

/// The last key named at or before `line` (for a parse error's field).
fn field_at(src: &str, line: usize) -> String {
    src.lines()
        .take(line)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find_map(|l| {
            let l = l.trim_start().trim_start_matches("- ");
            let (key, _) = l.split_once(':')?;
            (!key.is_empty() && !key.starts_with('#')).then(|| key.trim().to_owned())
        })
        .unwrap_or_default()
}

/// The line where the last segment of `field` is a key (1 when absent).
fn line_of(src: &str, field: &str) -> usize {
    let key = field.rsplit('.').next().unwrap_or(field);
    let key = key.split('[').next().unwrap_or(key);
    let nth = field
        .split_once('[')
        .and_then(|(_, r)| r.split_once(']'))
        .and_then(|(n, _)| n.parse::<usize>().ok());
    let mut seen = 0;
    for (i, l) in src.lines().enumerate() {
        let t = l.trim_start().trim_start_matches("- ");
        if t.strip_prefix(key).is_some_and(|r| r.starts_with(':')) {
            match nth {
                Some(n) if field.contains('.') && seen < n => seen += 1,
                _ => return i + 1,
            }
        }
    }
    1
}

/// One provider's contract under the multi-CDN split.
#[derive(Debug, Clone, PartialEq)]
pub struct Shortfall {
    /// The provider.
    pub provider: String,
    /// What its share of traffic costs at its egress price, per month.
    pub usage_monthly: f64,
    /// Its commit, per month.
    pub commit_monthly: f64,
    /// Commit not covered by usage, per month (0 when usage exceeds it).
    pub shortfall_monthly: f64,
}

/// What the case recommends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Live multi-CDN avoids more loss than it costs, and more net than the standby.
    MultiCdnPays,
    /// A configured standby's net return beats live multi-CDN and is positive.
    StandbyIsCheaper,
    /// Neither pays for itself: run one CDN properly.
    SingleCdn,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::MultiCdnPays => "multi-CDN pays",
            Verdict::StandbyIsCheaper => "a configured standby is cheaper",
            Verdict::SingleCdn => "single CDN: neither pays for itself",
        })
    }
}

/// The priced case.
#[derive(Debug, Clone, PartialEq)]
pub struct CostCase {
    /// Expected annual outage loss on one CDN.
    pub expected_annual_loss: f64,
    /// Of that, what live multi-CDN avoids per year.
    pub multi_avoided: f64,
    /// What the standby avoids per year.
    pub standby_avoided: f64,
    /// The single CDN's bill per month: max(commit, all traffic at its price).
    pub single_monthly: f64,
    /// Both contracts under the split, per month.
    pub contracts_monthly: f64,
    /// Per provider, under the split.
    pub shortfalls: Vec<Shortfall>,
    /// Multi-CDN's cost over the single CDN, per month: contracts beyond the single bill,
    /// steering, engineering, origin.
    pub multi_extra_monthly: f64,
    /// The same, per year.
    pub multi_extra_annual: f64,
    /// The standby, per year.
    pub standby_annual: f64,
    /// `multi_avoided - multi_extra_annual`.
    pub multi_net: f64,
    /// `standby_avoided - standby_annual`.
    pub standby_net: f64,
    /// The recommendation.
    pub verdict: Verdict,
}

/// Prices the case from checked inputs.
pub fn cost_case(inputs: &CostInputs) -> CostCase {
    let expected_annual_loss = inputs.outage_hours / inputs.outage_years * inputs.cost_per_hour;
    let multi_avoided = expected_annual_loss * inputs.multi_avoids;
    let standby_avoided = expected_annual_loss * inputs.standby_avoids;
    let shortfalls: Vec<Shortfall> = inputs
        .providers
        .iter()
        .map(|p| {
            let usage = inputs.monthly_egress_gb * p.share * p.egress_per_gb;
            Shortfall {
                provider: p.name.clone(),
                usage_monthly: usage,
                commit_monthly: p.monthly_commit,
                shortfall_monthly: (p.monthly_commit - usage).max(0.0),
            }
        })
        .collect();
    let contracts_monthly: f64 = shortfalls
        .iter()
        .map(|s| s.usage_monthly.max(s.commit_monthly))
        .sum();
    let single_monthly = inputs.providers.first().map_or(0.0, |p| {
        (inputs.monthly_egress_gb * p.egress_per_gb).max(p.monthly_commit)
    });
    let multi_extra_monthly = (contracts_monthly - single_monthly)
        + inputs.steering_monthly
        + inputs.engineering_monthly
        + inputs.origin_monthly;
    let multi_extra_annual = multi_extra_monthly * 12.0;
    let standby_annual = inputs.standby_monthly * 12.0;
    let multi_net = multi_avoided - multi_extra_annual;
    let standby_net = standby_avoided - standby_annual;
    let verdict = if multi_net > 0.0 && multi_net >= standby_net {
        Verdict::MultiCdnPays
    } else if standby_net > 0.0 {
        Verdict::StandbyIsCheaper
    } else {
        Verdict::SingleCdn
    };
    CostCase {
        expected_annual_loss,
        multi_avoided,
        standby_avoided,
        single_monthly,
        contracts_monthly,
        shortfalls,
        multi_extra_monthly,
        multi_extra_annual,
        standby_annual,
        multi_net,
        standby_net,
        verdict,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::beacon::{ClientNetwork, ProbeBeacon};
    use multicdn_core::{Country, Timestamp};

    /// Seed section 17 (with section 3's contracts): two $2,000 commits on traffic that
    /// costs 1,400 on one provider; steering 500; a day a month of engineering. A 45-minute
    /// outage costs 30,000, one every three years.
    const SECTION_17: &str = "\
currency: \"£\"
monthly_egress_gb: 35000
providers:
  - name: fastly
    monthly_commit: 2000
    egress_per_gb: 0.04
    share: 0.85
  - name: cloudflare
    monthly_commit: 2000
    egress_per_gb: 0.04
    share: 0.15
steering_monthly: 500
engineering_monthly: 1500
outage_hours: 0.75
outage_years: 3
cost_per_hour: 40000
multi_avoids: 1.0
standby_monthly: 400
standby_avoids: 0.9
material_ms: 30
min_pairs: 200
";

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-6, "{a} != {b}");
    }

    #[test]
    fn reproduces_section_17() {
        let inputs = CostInputs::from_yaml(SECTION_17, "case.yaml").unwrap();
        let case = cost_case(&inputs);
        close(case.expected_annual_loss, 10_000.0);
        close(case.multi_extra_monthly, 4_000.0);
        close(case.multi_extra_annual, 48_000.0);
        close(case.multi_net, -38_000.0);
        close(case.single_monthly, 2_000.0);
        close(case.contracts_monthly, 4_000.0);
        assert_eq!(case.verdict, Verdict::StandbyIsCheaper);
    }

    #[test]
    fn shortfall_under_the_split() {
        let case = cost_case(&CostInputs::from_yaml(SECTION_17, "case.yaml").unwrap());
        close(case.shortfalls[0].usage_monthly, 1_190.0);
        close(case.shortfalls[0].shortfall_monthly, 810.0);
        close(case.shortfalls[1].usage_monthly, 210.0);
        close(case.shortfalls[1].shortfall_monthly, 1_790.0);
        let total: f64 = case.shortfalls.iter().map(|s| s.shortfall_monthly).sum();
        close(total, 2_600.0);
    }

    #[test]
    fn verdict_boundaries() {
        let mut inputs = CostInputs::from_yaml(SECTION_17, "case.yaml").unwrap();
        // Loss exactly equal to multi-CDN's annual cost: no net gain, the standby still pays.
        inputs.cost_per_hour = 48_000.0 * 3.0 / 0.75;
        let case = cost_case(&inputs);
        close(case.multi_net, 0.0);
        assert_eq!(case.verdict, Verdict::StandbyIsCheaper);
        // Far larger loss: multi-CDN's full avoidance beats the standby's 90%.
        inputs.cost_per_hour = 4_000_000.0;
        assert_eq!(cost_case(&inputs).verdict, Verdict::MultiCdnPays);
        // Loss exactly the standby's cost at its 90%: neither pays.
        inputs.cost_per_hour = 4_800.0 / 0.9 * 3.0 / 0.75;
        let case = cost_case(&inputs);
        close(case.standby_net, 0.0);
        assert_eq!(case.verdict, Verdict::SingleCdn);
    }

    #[test]
    fn bad_fields_are_named_with_their_line() {
        let bad = SECTION_17.replace("share: 0.15", "share: 1.5");
        let err = CostInputs::from_yaml(&bad, "case.yaml").unwrap_err();
        let CaseError::Invalid { line, field, .. } = &err else {
            panic!("{err}")
        };
        assert_eq!(field, "providers[1].share");
        assert_eq!(*line, 11, "{err}");
        let bad = SECTION_17.replace("cost_per_hour: 40000", "cost_per_hour: lots");
        let err = CostInputs::from_yaml(&bad, "case.yaml").unwrap_err();
        let CaseError::Invalid { line, field, .. } = &err else {
            panic!("{err}")
        };
        assert_eq!((*line, field.as_str()), (16, "cost_per_hour"), "{err}");
        assert!(err.to_string().starts_with("case.yaml:16:"), "{err}");
        let bad = SECTION_17.replace("material_ms", "materiel_ms");
        let err = CostInputs::from_yaml(&bad, "case.yaml").unwrap_err();
        assert!(err.to_string().contains("materiel_ms"), "{err}");
    }

    fn probe(country: &str, a: f64, b: f64) -> Received {
        Received {
            at: Timestamp::parse_rfc3339("2026-12-01T09:00:00Z").unwrap(),
            network: ClientNetwork::new(Some(64500), Some(Country::new(country).unwrap())),
            beacon: Beacon::Probe(ProbeBeacon::new(
                [
                    ("fastly".to_owned(), Some(a)),
                    ("cloudflare".to_owned(), Some(b)),
                ],
                "",
            )),
        }
    }

    fn config() -> EvidenceConfig {
        CostInputs::from_yaml(SECTION_17, "case.yaml")
            .unwrap()
            .evidence_config()
    }

    #[test]
    fn too_few_pairs_make_no_claim() {
        let mut b = EvidenceBuilder::new(config());
        for i in 0..50 {
            b.add(&probe("AU", 300.0 + f64::from(i), 100.0));
        }
        let ev = b.finish();
        assert_eq!(ev[0].pairs, 50);
        assert!(ev[0].p75_difference_ms.unwrap() > 150.0);
        assert!(ev[0].p_value < 1e-10);
        assert!(!ev[0].argument_holds, "50 pairs is below min_pairs");
    }

    #[test]
    fn material_and_significant_holds_small_difference_does_not() {
        let mut b = EvidenceBuilder::new(config());
        for i in 0..400 {
            let jitter = f64::from(i % 40);
            b.add(&probe("AU", 260.0 + jitter, 200.0 + jitter));
            // GB: 12 ms, as in section 8: significant, not material.
            b.add(&probe("GB", 52.0 + jitter, 40.0 + jitter));
            // US: a coin toss.
            let (x, y) = if i % 2 == 0 {
                (50.0, 60.0)
            } else {
                (60.0, 50.0)
            };
            b.add(&probe("US", x, y));
        }
        b.add_line("{not json");
        b.add_line(r#"{"at":"2026-12-01T09:00:00Z","network":{},"beacon":{"path":"/","ttfb":1,"provider":"fastly","pop":"LHR","cache":"HIT"}}"#);
        assert_eq!((b.malformed(), b.ignored(), b.probes()), (1, 1, 1200));
        let ev = b.finish();
        let by: BTreeMap<_, _> = ev.iter().map(|e| (e.region.as_str(), e)).collect();
        assert!(by["AU"].argument_holds);
        close(by["AU"].p75_difference_ms.unwrap(), 60.0);
        assert!(!by["GB"].argument_holds);
        assert!(by["GB"].p_value < 0.01);
        assert!(!by["US"].argument_holds);
        close(by["US"].p_value, 1.0);
    }

    #[test]
    fn sign_test_matches_binomial() {
        // 9 of 10: 2 * (1 + 10) / 1024.
        close(sign_test(9, 10), 22.0 / 1024.0);
        close(sign_test(5, 10), 1.0);
        assert!(sign_test(600, 1100) < 0.01 && sign_test(600, 1100) > 0.001);
        assert!((sign_test(500, 1001) - sign_test(501, 1001)).abs() < 1e-12);
    }
}
