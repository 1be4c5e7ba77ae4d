//! Route 53 health checks from the policy's health section, and their status read back as
//! observations for the health quorum. Pure: no I/O.
//!
//! Each provider gets one `HTTPS_STR_MATCH` check on its edge host: the policy's path, the
//! policy's expected string (which must appear in the first 5,120 bytes of the body), port
//! 443 with SNI (or `HTTP_STR_MATCH` on port 80 for an edge that serves the health object
//! over plain HTTP, [`HealthCheckSpec::plain_http`]). Route 53 offers two request intervals, 10 s and 30 s: the one nearest the
//! policy's interval is used. The failure threshold is the policy's `down_after`, clamped to
//! Route 53's 1–10. Route 53 sends the edge host as `Host`, so the edge must answer the health
//! object for its own hostname.
//!
//! The `CallerReference` is a SHA-256 digest of the check's configuration, so provisioning
//! the same policy again finds the check already made instead of making another, and a changed
//! configuration gets a check of its own (Route 53 refuses a reference reused with other
//! settings, `HealthCheckAlreadyExists`). A check found under its reference but edited since
//! (in the console, say) is put back with `UpdateHealthCheck` ([`HealthCheckSpec::differences`]).

use std::fmt::Write as _;
use std::time::Duration;

use multicdn_core::policy::HealthPolicy;
use multicdn_core::{FailReason, Observation, Outcome, ProviderId, RegionId, Timestamp};
use sha2::{Digest, Sha256};

use super::xml::{RawHealthCheckConfig, RawObservation};

/// The kind of check: a string match over HTTPS or plain HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckType {
    /// `HTTPS_STR_MATCH` (SNI on).
    HttpsStrMatch,
    /// `HTTP_STR_MATCH`.
    HttpStrMatch,
}

impl CheckType {
    /// Route 53's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckType::HttpsStrMatch => "HTTPS_STR_MATCH",
            CheckType::HttpStrMatch => "HTTP_STR_MATCH",
        }
    }
}

/// The regions Route 53 runs health checkers in.
pub const CHECKER_REGIONS: [&str; 8] = [
    "us-east-1",
    "us-west-1",
    "us-west-2",
    "eu-west-1",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-northeast-1",
    "sa-east-1",
];

/// Route 53 needs at least this many checker regions when any are named.
pub const MIN_REGIONS: usize = 3;

/// One provider's check, as sent to Route 53.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckSpec {
    /// The provider checked.
    pub provider: ProviderId,
    /// `HTTPS_STR_MATCH` or `HTTP_STR_MATCH`.
    pub check_type: CheckType,
    /// The edge host (`FullyQualifiedDomainName`).
    pub fqdn: String,
    /// 443 (80 for plain HTTP).
    pub port: u16,
    /// The health object's path.
    pub resource_path: String,
    /// The string the body must contain.
    pub search_string: String,
    /// 10 or 30 seconds.
    pub request_interval: u32,
    /// 1 to 10.
    pub failure_threshold: u32,
    /// Checker regions, at least three.
    pub regions: Vec<String>,
}

impl HealthCheckSpec {
    /// Builds the check for `provider` at `edge_host` from the policy's health section;
    /// `regions` are Route 53 checker regions (see [`checker_regions`]).
    pub fn new(
        provider: ProviderId,
        edge_host: &str,
        health: &HealthPolicy,
        regions: Vec<String>,
    ) -> Result<HealthCheckSpec, String> {
        if health.expect.is_empty() || health.expect.len() > 255 {
            return Err(format!(
                "health.expect {:?} must be 1 to 255 characters for a Route 53 HTTPS_STR_MATCH check",
                health.expect
            ));
        }
        if !health.path.starts_with('/') || health.path.len() > 255 {
            return Err(format!(
                "health.path {:?} must start with / and be at most 255 characters",
                health.path
            ));
        }
        check_regions(&regions)?;
        let interval = health.interval.get();
        let request_interval = if interval <= Duration::from_secs(20) {
            10
        } else {
            30
        };
        Ok(HealthCheckSpec {
            provider,
            check_type: CheckType::HttpsStrMatch,
            fqdn: edge_host.trim_end_matches('.').to_ascii_lowercase(),
            port: 443,
            resource_path: health.path.clone(),
            search_string: health.expect.clone(),
            request_interval,
            failure_threshold: health.down_after.clamp(1, 10),
            regions,
        })
    }

    /// The same check over plain HTTP (`HTTP_STR_MATCH`) on `port`, for an edge that serves
    /// the health object without TLS.
    pub fn plain_http(mut self, port: u16) -> HealthCheckSpec {
        self.check_type = CheckType::HttpStrMatch;
        self.port = port;
        self
    }

    /// SNI is sent on HTTPS checks only.
    pub fn enable_sni(&self) -> bool {
        self.check_type == CheckType::HttpsStrMatch
    }

    /// What differs between this spec and a check's configuration as Route 53 reports it
    /// (`field: have -> want`); empty when the check is this spec. A member the listing
    /// leaves out is not compared.
    pub fn differences(&self, config: &RawHealthCheckConfig) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |field: &str, have: Option<String>, want: String| {
            if let Some(have) = have
                && have != want
            {
                out.push(format!("{field}: {have} -> {want}"));
            }
        };
        let num = |v: Option<u32>| v.map(|n| n.to_string());
        check(
            "Type",
            Some(config.check_type.clone()),
            self.check_type.as_str().to_owned(),
        );
        check(
            "Port",
            config.port.map(|p| p.to_string()),
            self.port.to_string(),
        );
        check(
            "ResourcePath",
            config.resource_path.clone(),
            self.resource_path.clone(),
        );
        check(
            "FullyQualifiedDomainName",
            config
                .fully_qualified_domain_name
                .as_ref()
                .map(|f| f.trim_end_matches('.').to_ascii_lowercase()),
            self.fqdn.clone(),
        );
        check(
            "SearchString",
            config.search_string.clone(),
            self.search_string.clone(),
        );
        check(
            "RequestInterval",
            num(config.request_interval),
            self.request_interval.to_string(),
        );
        check(
            "FailureThreshold",
            num(config.failure_threshold),
            self.failure_threshold.to_string(),
        );
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v.join(",")
        };
        check(
            "Regions",
            (!config.regions.items.is_empty()).then(|| sorted(&config.regions.items)),
            sorted(&self.regions),
        );
        check(
            "Inverted",
            Some(config.inverted.to_string()),
            "false".to_owned(),
        );
        check(
            "Disabled",
            Some(config.disabled.to_string()),
            "false".to_owned(),
        );
        out
    }

    /// The deterministic idempotency key: `multicdn-` and 40 hex digits of a SHA-256 over
    /// the configuration.
    pub fn caller_reference(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            self.provider.as_str(),
            self.check_type.as_str(),
            &self.fqdn,
            &self.port.to_string(),
            &self.resource_path,
            &self.search_string,
            &self.request_interval.to_string(),
            &self.failure_threshold.to_string(),
            &self.regions.join(","),
        ] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        let digest = h.finalize();
        let mut out = String::from("multicdn-");
        for b in digest.iter().take(20) {
            let _ = write!(out, "{b:02x}");
        }
        out
    }
}

/// One check per provider of `policy` (on its edge host) from the policy's health section.
/// `regions`: Route 53 checker regions, or `None` to derive them from the policy's probe
/// regions ([`checker_regions`]).
pub fn policy_checks(
    policy: &multicdn_core::Policy,
    regions: Option<Vec<String>>,
) -> Result<Vec<HealthCheckSpec>, String> {
    let regions = match regions {
        Some(r) => r,
        None => checker_regions(&policy.health)?,
    };
    policy
        .providers
        .iter()
        .map(|(p, spec)| {
            HealthCheckSpec::new(p.clone(), &spec.edge_host, &policy.health, regions.clone())
        })
        .collect()
}

fn check_regions(regions: &[String]) -> Result<(), String> {
    if let Some(bad) = regions
        .iter()
        .find(|r| !CHECKER_REGIONS.contains(&r.as_str()))
    {
        return Err(format!(
            "{bad:?} is not a Route 53 checker region (valid: {})",
            CHECKER_REGIONS.join(", ")
        ));
    }
    let mut distinct = regions.to_vec();
    distinct.sort();
    distinct.dedup();
    if distinct.len() != regions.len() {
        return Err("checker regions are listed twice".to_owned());
    }
    if regions.len() < MIN_REGIONS {
        return Err(format!(
            "Route 53 needs at least {MIN_REGIONS} checker regions, got {} ({}); valid: {}",
            regions.len(),
            regions.join(", "),
            CHECKER_REGIONS.join(", ")
        ));
    }
    Ok(())
}

/// Route 53 checker regions for the policy's probe regions: each probe region is matched to
/// the checker region it names (`eu-west` -> `eu-west-1`, `us-west` -> `us-west-2`,
/// `ap-southeast` -> `ap-southeast-1`). Probe regions with no match are skipped; fewer than
/// three matches is an error naming the valid regions (configure them explicitly instead).
pub fn checker_regions(health: &HealthPolicy) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for region in &health.regions {
        let r = region.as_str();
        let found = if CHECKER_REGIONS.contains(&r) {
            Some(r.to_owned())
        } else {
            match r {
                "us-west" => Some("us-west-2".to_owned()),
                _ => CHECKER_REGIONS
                    .iter()
                    .find(|c| c.strip_suffix("-1").is_some_and(|base| base == r))
                    .map(|c| (*c).to_owned()),
            }
        };
        if let Some(found) = found
            && !out.contains(&found)
        {
            out.push(found);
        }
    }
    check_regions(&out).map_err(|e| format!("from health.regions: {e}"))?;
    Ok(out)
}

/// One checker's report as an observation: the checker's region is the runner; `Success...`
/// passes; a failure's text is read for a status code, a missing search string or a timeout.
pub(crate) fn observation(
    provider: &ProviderId,
    expected: &str,
    raw: &RawObservation,
    now: Timestamp,
) -> Option<Observation> {
    let report = raw.status_report.as_ref()?;
    let status_text = report.status.clone().unwrap_or_default();
    let region = raw
        .region
        .clone()
        .or_else(|| raw.ip_address.clone())
        .unwrap_or_else(|| "unknown".into());
    let runner = RegionId::new(&runner_id(&region)).ok()?;
    let at = report
        .checked_time
        .as_deref()
        .and_then(|t| Timestamp::parse_rfc3339(t).ok())
        .unwrap_or(now);
    let code = status_code(&status_text);
    let outcome = if status_text.starts_with("Success") {
        Outcome::Pass
    } else {
        Outcome::Fail {
            reason: fail_reason(&status_text, code, expected),
        }
    };
    let mut obs = Observation::new(provider.clone(), runner, at, outcome, Duration::ZERO);
    if let Some(code) = code {
        obs = obs.with_status(code);
    }
    Some(obs)
}

/// `route53-us-east-1`: a runner id (lowercase letters, digits, `-`) from a checker region.
fn runner_id(region: &str) -> String {
    let cleaned: String = region
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut id = format!("route53-{cleaned}");
    id.truncate(63);
    id
}

fn status_code(text: &str) -> Option<u16> {
    let i = text.find("Status Code")?;
    text[i + "Status Code".len()..]
        .trim_start_matches([':', ' '])
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|d| d.parse().ok())
}

fn fail_reason(text: &str, code: Option<u16>, expected: &str) -> FailReason {
    let lower = text.to_ascii_lowercase();
    if lower.contains("search string") || lower.contains("did not contain") {
        return FailReason::ContentMismatch {
            expected: expected.to_owned(),
        };
    }
    if let Some(got) = code.filter(|c| *c != 200) {
        return FailReason::Status { got };
    }
    if lower.contains("timed out") || lower.contains("timeout") {
        return FailReason::Timeout;
    }
    if lower.contains("ssl") || lower.contains("tls") || lower.contains("certificate") {
        return FailReason::Tls {
            detail: text.to_owned(),
        };
    }
    FailReason::Connect {
        detail: text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route53::xml::RawStatusReport;

    fn health() -> HealthPolicy {
        let yaml = include_str!("../../../examples/policy.yaml");
        multicdn_core::Policy::from_yaml(yaml, "policy.yaml")
            .unwrap()
            .health
    }

    fn p(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    #[test]
    fn the_policy_becomes_a_string_match_check_with_a_stable_reference() {
        let h = health();
        let regions = checker_regions(&h).unwrap();
        assert_eq!(
            regions,
            [
                "eu-west-1",
                "us-east-1",
                "us-west-2",
                "ap-southeast-1",
                "sa-east-1"
            ]
        );
        let spec =
            HealthCheckSpec::new(p("fastly"), "Example.map.fastly.net.", &h, regions.clone())
                .unwrap();
        assert_eq!(spec.fqdn, "example.map.fastly.net");
        assert_eq!(spec.request_interval, 30);
        assert_eq!(spec.failure_threshold, 2);
        assert_eq!(spec.search_string, "healthy-v3");
        let again =
            HealthCheckSpec::new(p("fastly"), "example.map.fastly.net", &h, regions.clone())
                .unwrap();
        assert_eq!(spec.caller_reference(), again.caller_reference());
        assert!(spec.caller_reference().len() <= 64);
        let other =
            HealthCheckSpec::new(p("cloudflare"), "example.map.fastly.net", &h, regions).unwrap();
        assert_ne!(spec.caller_reference(), other.caller_reference());
    }

    #[test]
    fn http_and_https_checks_differ_in_type_port_sni_and_reference() {
        let h = health();
        let regions = checker_regions(&h).unwrap();
        let https = HealthCheckSpec::new(p("fastly"), "e.example.net", &h, regions).unwrap();
        let http = https.clone().plain_http(80);
        let xml = crate::route53::xml::create_health_check(&http);
        assert!(
            xml.contains("<Port>80</Port><Type>HTTP_STR_MATCH</Type><ResourcePath>/_health/v3.txt</ResourcePath>"),
            "{xml}"
        );
        assert!(xml.contains("<EnableSNI>false</EnableSNI>"), "{xml}");
        let xml = crate::route53::xml::create_health_check(&https);
        assert!(
            xml.contains("<Port>443</Port><Type>HTTPS_STR_MATCH</Type>")
                && xml.contains("<SearchString>healthy-v3</SearchString><RequestInterval>30</RequestInterval><FailureThreshold>2</FailureThreshold>")
                && xml.contains("<EnableSNI>true</EnableSNI><Regions><Region>eu-west-1</Region>"),
            "{xml}"
        );
        assert_ne!(https.caller_reference(), http.caller_reference());
    }

    #[test]
    fn a_check_edited_by_hand_shows_what_differs() {
        let h = health();
        let spec = HealthCheckSpec::new(
            p("fastly"),
            "e.example.net",
            &h,
            checker_regions(&h).unwrap(),
        )
        .unwrap();
        let mut config = RawHealthCheckConfig {
            port: Some(443),
            check_type: "HTTPS_STR_MATCH".into(),
            resource_path: Some("/_health/v3.txt".into()),
            fully_qualified_domain_name: Some("E.example.net.".into()),
            search_string: Some("healthy-v3".into()),
            request_interval: Some(30),
            failure_threshold: Some(2),
            regions: crate::route53::xml::RawRegions {
                items: [
                    "us-east-1",
                    "sa-east-1",
                    "eu-west-1",
                    "us-west-2",
                    "ap-southeast-1",
                ]
                .map(String::from)
                .to_vec(),
            },
            inverted: false,
            disabled: false,
        };
        assert_eq!(spec.differences(&config), Vec::<String>::new());
        config.search_string = Some("ok".into());
        config.disabled = true;
        assert_eq!(
            spec.differences(&config),
            ["SearchString: ok -> healthy-v3", "Disabled: true -> false"]
        );
    }

    #[test]
    fn too_few_or_unknown_regions_are_refused() {
        let h = health();
        let e = HealthCheckSpec::new(
            p("f"),
            "e.net",
            &h,
            vec!["us-east-1".into(), "eu-west-1".into()],
        )
        .unwrap_err();
        assert!(e.contains("at least 3"), "{e}");
        let e = HealthCheckSpec::new(p("f"), "e.net", &h, vec!["mars-1".into()]).unwrap_err();
        assert!(e.contains("not a Route 53 checker region"), "{e}");
    }

    #[test]
    fn checker_reports_become_observations() {
        let raw = |status: &str| RawObservation {
            region: Some("eu-west-1".into()),
            ip_address: Some("15.177.10.1".into()),
            status_report: Some(RawStatusReport {
                status: Some(status.into()),
                checked_time: Some("2026-11-30T15:00:00Z".into()),
            }),
        };
        let now = Timestamp::from_secs(1);
        let ok = observation(
            &p("fastly"),
            "healthy-v3",
            &raw("Success: HTTP Status Code: 200. Resolved IP: 1.2.3.4. OK"),
            now,
        )
        .unwrap();
        assert!(ok.passed());
        assert_eq!(ok.runner.as_str(), "route53-eu-west-1");
        assert_eq!(ok.status, Some(200));
        assert_eq!(
            ok.at,
            Timestamp::parse_rfc3339("2026-11-30T15:00:00Z").unwrap()
        );
        let bad = observation(
            &p("fastly"),
            "healthy-v3",
            &raw("Failure: HTTP Status Code 503, Service Unavailable."),
            now,
        )
        .unwrap();
        assert_eq!(
            bad.outcome,
            Outcome::Fail {
                reason: FailReason::Status { got: 503 }
            }
        );
        let content = observation(
            &p("fastly"),
            "healthy-v3",
            &raw("Failure: HTTP Status Code: 200. The response body did not contain the search string."),
            now,
        )
        .unwrap();
        assert_eq!(
            content.outcome,
            Outcome::Fail {
                reason: FailReason::ContentMismatch {
                    expected: "healthy-v3".into()
                }
            }
        );
        let timeout = observation(
            &p("fastly"),
            "healthy-v3",
            &raw("Failure: Connection timed out."),
            now,
        )
        .unwrap();
        assert_eq!(
            timeout.outcome,
            Outcome::Fail {
                reason: FailReason::Timeout
            }
        );
    }
}
