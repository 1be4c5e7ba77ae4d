//! The drift checker: the same paths through every edge, compared (seed 000, section 13).
//!
//! Each path is fetched through each edge with the site's `Host` and without following
//! redirects (a redirect rule added on one provider is exactly the drift to catch). Statuses
//! are compared, and headers too, except those that legitimately differ between providers (the
//! ignore set) and those on an allowlist of expected differences. Every difference names the
//! path, the header and both values.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use futures::StreamExt;
use multicdn_core::{FailReason, ProviderId};
use reqwest::header::HeaderValue;
use serde::{Deserialize, Serialize};

use crate::edges::Edge;
use crate::error::HealthError;
use crate::http;

/// Headers that legitimately differ between providers: the seed's list, plus `server-timing`,
/// in which each edge names itself (`cdn;desc="fastly"`).
pub const DEFAULT_IGNORED_HEADERS: &[&str] = &[
    "date",
    "age",
    "server",
    "cf-ray",
    "x-served-by",
    "x-cache",
    "x-timer",
    "cf-cache-status",
    "report-to",
    "alt-svc",
    "connection",
    "nel",
    "server-timing",
];

/// An expected difference: a header that may differ, on every path or on one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AllowedDifference {
    /// The header (any case).
    pub header: String,
    /// Only on this path; `None` for every path.
    pub path: Option<String>,
}

impl AllowedDifference {
    /// `header` may differ on every path.
    pub fn header(header: impl Into<String>) -> AllowedDifference {
        AllowedDifference {
            header: header.into().to_ascii_lowercase(),
            path: None,
        }
    }

    /// `header` may differ on `path` only.
    pub fn header_on(header: impl Into<String>, path: impl Into<String>) -> AllowedDifference {
        AllowedDifference {
            header: header.into().to_ascii_lowercase(),
            path: Some(path.into()),
        }
    }

    fn allows(&self, path: &str, header: &str) -> bool {
        self.header.eq_ignore_ascii_case(header) && self.path.as_deref().is_none_or(|p| p == path)
    }
}

/// What differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
#[non_exhaustive]
pub enum DriftKind {
    /// The status code.
    Status,
    /// A header, lowercase.
    Header(String),
}

/// One difference between the baseline edge (the first) and another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Difference {
    /// The path fetched.
    pub path: String,
    /// The status or the header that differs.
    pub kind: DriftKind,
    /// The baseline provider.
    pub baseline: ProviderId,
    /// Its value (`None`: the header is absent).
    pub baseline_value: Option<String>,
    /// The provider that differs from it.
    pub other: ProviderId,
    /// Its value (`None`: the header is absent).
    pub other_value: Option<String>,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| {
            v.as_deref()
                .map_or("(absent)".to_owned(), |v| format!("{v:?}"))
        };
        match &self.kind {
            DriftKind::Status => write!(f, "DRIFT {} status: ", self.path)?,
            DriftKind::Header(h) => write!(f, "DRIFT {} [{h}]: ", self.path)?,
        }
        write!(
            f,
            "{}={} {}={}",
            self.baseline,
            show(&self.baseline_value),
            self.other,
            show(&self.other_value)
        )
    }
}

/// A path that could not be fetched through an edge, so it was not compared there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FetchFailure {
    /// The path.
    pub path: String,
    /// The edge's provider.
    pub provider: ProviderId,
    /// Why.
    pub reason: FailReason,
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DriftReport {
    /// Paths checked.
    pub paths: usize,
    /// Every difference found, by path, then provider, then status before headers (sorted).
    pub differences: Vec<Difference>,
    /// Fetches that failed.
    pub failures: Vec<FetchFailure>,
}

impl DriftReport {
    /// No difference and no failed fetch.
    pub fn is_clean(&self) -> bool {
        self.differences.is_empty() && self.failures.is_empty()
    }
}

/// What an edge answered for a path: status and the compared headers.
type Answer = (u16, BTreeMap<String, String>);

/// Compares edges. Build with [`DriftChecker::builder`].
#[derive(Debug, Clone)]
pub struct DriftChecker {
    client: reqwest::Client,
    edges: Vec<Edge>,
    host: Option<HeaderValue>,
    ignored: BTreeSet<String>,
    allowed: Vec<AllowedDifference>,
    timeout: Duration,
    concurrency: usize,
}

impl DriftChecker {
    /// A checker over `edges`; the first is the baseline every other is compared with.
    pub fn builder(edges: Vec<Edge>) -> DriftCheckerBuilder {
        DriftCheckerBuilder {
            edges,
            host: None,
            ignored: DEFAULT_IGNORED_HEADERS
                .iter()
                .map(|h| (*h).to_owned())
                .collect(),
            allowed: Vec::new(),
            timeout: Duration::from_secs(10),
            concurrency: 8,
        }
    }

    async fn fetch(&self, edge: &Edge, path: &str) -> Result<Answer, FailReason> {
        let req = http::with_host(self.client.get(edge.url_for(path)), self.host.as_ref());
        let sent = tokio::time::timeout(self.timeout, req.send()).await;
        let resp = match sent {
            Err(_) => return Err(FailReason::Timeout),
            Ok(Err(e)) => return Err(http::classify(&e)),
            Ok(Ok(r)) => r,
        };
        let mut headers: BTreeMap<String, String> = BTreeMap::new();
        for (name, value) in resp.headers() {
            let name = name.as_str().to_ascii_lowercase();
            if self.ignored.contains(&name) {
                continue;
            }
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            headers
                .entry(name)
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(&value);
                })
                .or_insert(value);
        }
        Ok((resp.status().as_u16(), headers))
    }

    /// Fetches every path through every edge and compares each edge with the baseline.
    pub async fn check<S: AsRef<str>>(&self, paths: &[S]) -> DriftReport {
        // A plain list of futures (no closures in the stream's type) keeps this `Send`.
        let mut fetches = Vec::with_capacity(paths.len() * self.edges.len());
        for (pi, path) in paths.iter().enumerate() {
            for (ei, edge) in self.edges.iter().enumerate() {
                let path = path.as_ref();
                fetches.push(async move { ((pi, ei), self.fetch(edge, path).await) });
            }
        }
        let mut answers: BTreeMap<(usize, usize), Result<Answer, FailReason>> =
            futures::stream::iter(fetches)
                .buffer_unordered(self.concurrency)
                .collect()
                .await;

        let mut report = DriftReport {
            paths: paths.len(),
            ..DriftReport::default()
        };
        for (pi, path) in paths.iter().enumerate() {
            let path = path.as_ref();
            let mut results: Vec<(&Edge, Option<Answer>)> = Vec::new();
            for (ei, edge) in self.edges.iter().enumerate() {
                match answers.remove(&(pi, ei)) {
                    Some(Ok(a)) => results.push((edge, Some(a))),
                    Some(Err(reason)) => {
                        report.failures.push(FetchFailure {
                            path: path.to_owned(),
                            provider: edge.provider.clone(),
                            reason,
                        });
                        results.push((edge, None));
                    }
                    None => results.push((edge, None)),
                }
            }
            let Some((base_edge, Some(base))) = results.first() else {
                continue;
            };
            for (edge, answer) in &results[1..] {
                let Some(answer) = answer else { continue };
                report
                    .differences
                    .extend(self.compare(path, base_edge, base, edge, answer));
            }
        }
        report
    }

    fn compare(
        &self,
        path: &str,
        a_edge: &Edge,
        a: &Answer,
        b_edge: &Edge,
        b: &Answer,
    ) -> Vec<Difference> {
        let diff = |kind, av: Option<String>, bv: Option<String>| Difference {
            path: path.to_owned(),
            kind,
            baseline: a_edge.provider.clone(),
            baseline_value: av,
            other: b_edge.provider.clone(),
            other_value: bv,
        };
        let mut out = Vec::new();
        if a.0 != b.0 {
            out.push(diff(
                DriftKind::Status,
                Some(a.0.to_string()),
                Some(b.0.to_string()),
            ));
        }
        let names: BTreeSet<&String> = a.1.keys().chain(b.1.keys()).collect();
        for name in names {
            let (av, bv) = (a.1.get(name), b.1.get(name));
            if av == bv || self.allowed.iter().any(|x| x.allows(path, name)) {
                continue;
            }
            out.push(diff(
                DriftKind::Header(name.clone()),
                av.cloned(),
                bv.cloned(),
            ));
        }
        out
    }
}

/// Settings for a [`DriftChecker`].
#[derive(Debug)]
pub struct DriftCheckerBuilder {
    edges: Vec<Edge>,
    host: Option<String>,
    ignored: BTreeSet<String>,
    allowed: Vec<AllowedDifference>,
    timeout: Duration,
    concurrency: usize,
}

impl DriftCheckerBuilder {
    /// The site's hostname, sent as `Host` to every edge.
    pub fn host(mut self, host: impl Into<String>) -> DriftCheckerBuilder {
        self.host = Some(host.into());
        self
    }

    /// Also ignores `header` everywhere.
    pub fn ignore(mut self, header: &str) -> DriftCheckerBuilder {
        self.ignored.insert(header.to_ascii_lowercase());
        self
    }

    /// Replaces the ignore set (the default is [`DEFAULT_IGNORED_HEADERS`]).
    pub fn ignore_only<S: AsRef<str>>(
        mut self,
        headers: impl IntoIterator<Item = S>,
    ) -> DriftCheckerBuilder {
        self.ignored = headers
            .into_iter()
            .map(|h| h.as_ref().to_ascii_lowercase())
            .collect();
        self
    }

    /// Allows an expected difference.
    pub fn allow(mut self, allowed: AllowedDifference) -> DriftCheckerBuilder {
        self.allowed.push(allowed);
        self
    }

    /// Each fetch's deadline (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> DriftCheckerBuilder {
        self.timeout = timeout;
        self
    }

    /// Fetches in flight at once (default 8).
    pub fn concurrency(mut self, n: usize) -> DriftCheckerBuilder {
        self.concurrency = n;
        self
    }

    /// The checker.
    pub fn build(self) -> Result<DriftChecker, HealthError> {
        if self.edges.len() < 2 {
            return Err(HealthError::config(
                "edges",
                format!(
                    "drift needs at least two edges to compare, got {}",
                    self.edges.len()
                ),
            ));
        }
        if self.concurrency == 0 {
            return Err(HealthError::config(
                "concurrency",
                "must be at least 1 fetch in flight",
            ));
        }
        let host =
            http::host_header(self.host.as_deref()).map_err(|m| HealthError::config("host", m))?;
        Ok(DriftChecker {
            client: http::client(self.concurrency, "multicdn-health-drift")?,
            edges: self.edges,
            host,
            ignored: self.ignored,
            allowed: self.allowed,
            timeout: self.timeout,
            concurrency: self.concurrency,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(p: &str) -> Edge {
        Edge::new(ProviderId::new(p).unwrap(), "http://127.0.0.1:1").unwrap()
    }

    fn answer(status: u16, headers: &[(&str, &str)]) -> Answer {
        (
            status,
            headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn compares_status_and_each_header_naming_both_values() {
        let checker = DriftChecker::builder(vec![edge("fastly"), edge("cloudflare")])
            .allow(AllowedDifference::header_on("x-frame-options", "/embed"))
            .build()
            .unwrap();
        let a = answer(
            200,
            &[
                ("cache-control", "max-age=60"),
                ("strict-transport-security", "max-age=31536000"),
            ],
        );
        let b = answer(301, &[("cache-control", "max-age=60"), ("location", "/x")]);
        let d = checker.compare("/", &edge("fastly"), &a, &edge("cloudflare"), &b);
        let shown: Vec<String> = d.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            vec![
                "DRIFT / status: fastly=\"200\" cloudflare=\"301\"",
                "DRIFT / [location]: fastly=(absent) cloudflare=\"/x\"",
                "DRIFT / [strict-transport-security]: fastly=\"max-age=31536000\" cloudflare=(absent)",
            ]
        );
    }

    #[test]
    fn the_allowlist_applies_per_header_and_path() {
        let checker = DriftChecker::builder(vec![edge("fastly"), edge("cloudflare")])
            .allow(AllowedDifference::header_on("X-Frame-Options", "/embed"))
            .allow(AllowedDifference::header("via"))
            .build()
            .unwrap();
        let a = answer(200, &[("x-frame-options", "DENY"), ("via", "1.1 varnish")]);
        let b = answer(200, &[]);
        assert!(
            checker
                .compare("/embed", &edge("fastly"), &a, &edge("cloudflare"), &b)
                .is_empty()
        );
        let d = checker.compare("/", &edge("fastly"), &a, &edge("cloudflare"), &b);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].kind, DriftKind::Header("x-frame-options".into()));
    }

    #[test]
    fn one_edge_is_not_enough() {
        let e = DriftChecker::builder(vec![edge("fastly")])
            .build()
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least two edges"), "{e}");
    }
}
