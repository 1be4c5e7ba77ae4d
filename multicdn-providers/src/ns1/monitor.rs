//! NS1 monitoring jobs from the policy's health section, wired to the answers' `up`. Pure: no
//! I/O.
//!
//! Each provider gets one `http` monitoring job fetching the policy's health object through
//! its edge host (`https://{edge}{path}`), passing when the status is the policy's first
//! expected status and the body contains the policy's expected string, from the NS1 monitoring
//! regions matching the policy's probe regions, every `health.interval`, decided by quorum.
//! The job notifies a notify list holding one `datafeed` notifier for a data source of type
//! `nsone_monitoring`; that source has one feed per job (`config.jobid`), and each provider's
//! live answers carry `up: {"feed": <feed id>}`, so NS1 itself drops a provider whose monitor
//! fails, whether or not the controller runs. (A job made through the API moves answers only
//! through such a notify list.)
//!
//! Jobs are found again by name (`multicdn <provider> <edge host>`), so provisioning twice
//! makes each once; a job found with other settings is updated to the policy's.

use multicdn_core::ProviderId;
use multicdn_core::policy::HealthPolicy;
use serde_json::{Value, json};

/// NS1's monitoring regions and the probe-region names they stand for.
pub const MONITOR_REGIONS: [(&str, &[&str]); 9] = [
    ("lga", &["us-east"]),
    ("sjc", &["us-west"]),
    ("dal", &["us-central"]),
    ("ams", &["eu-central", "eu-north"]),
    ("lhr", &["eu-west"]),
    ("sin", &["ap-southeast"]),
    ("nrt", &["ap-northeast"]),
    ("syd", &["ap-southeast-2", "au-east"]),
    ("gru", &["sa-east"]),
];

/// The data source type whose feeds follow monitoring jobs.
pub const MONITORING_SOURCE_TYPE: &str = "nsone_monitoring";

/// NS1 monitoring regions for the policy's probe regions (an NS1 region code is taken as
/// is). Probe regions with no NS1 region are skipped; none at all is an error.
pub fn monitor_regions(health: &HealthPolicy) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for region in &health.regions {
        let r = region.as_str();
        let found = MONITOR_REGIONS
            .iter()
            .find(|(code, names)| *code == r || names.contains(&r))
            .map(|(code, _)| (*code).to_owned());
        if let Some(code) = found
            && !out.contains(&code)
        {
            out.push(code);
        }
    }
    if out.is_empty() {
        return Err(format!(
            "from health.regions: none of {} is an NS1 monitoring region (valid: {})",
            health
                .regions
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            MONITOR_REGIONS
                .iter()
                .map(|(c, names)| format!("{c} ({})", names.join(", ")))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(out)
}

/// One provider's monitoring job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorSpec {
    /// The provider monitored.
    pub provider: ProviderId,
    /// `multicdn <provider> <edge host>`: how the job is found again.
    pub name: String,
    /// `https://{edge}{path}`.
    pub url: String,
    /// The status that passes.
    pub status: u16,
    /// The string the body must contain.
    pub expect: String,
    /// NS1 monitoring regions.
    pub regions: Vec<String>,
    /// Seconds between checks from each region.
    pub frequency: u64,
    /// Connect and idle timeout, in seconds (HTTP monitors take seconds).
    pub timeout_secs: u64,
}

impl MonitorSpec {
    /// The job for `provider` at `edge_host` from the policy's health section.
    pub fn new(
        provider: ProviderId,
        edge_host: &str,
        health: &HealthPolicy,
        regions: Vec<String>,
    ) -> Result<MonitorSpec, String> {
        if health.expect.is_empty() {
            return Err("health.expect is empty: an NS1 monitor needs a string to match".into());
        }
        if !health.path.starts_with('/') {
            return Err(format!("health.path {:?} must start with /", health.path));
        }
        let edge = edge_host.trim_end_matches('.').to_ascii_lowercase();
        Ok(MonitorSpec {
            name: format!("multicdn {provider} {edge}"),
            url: format!("https://{edge}{}", health.path),
            status: health.expect_status.first().copied().unwrap_or(200),
            expect: health.expect.clone(),
            regions,
            frequency: health.interval.get().as_secs().max(1),
            timeout_secs: health.timeout.get().as_secs().max(1),
            provider,
        })
    }

    /// The job body for `PUT /v1/monitoring/jobs` (and `POST /v1/monitoring/jobs/{id}`),
    /// notifying `notify_list`.
    pub fn body(&self, notify_list: &str) -> Value {
        json!({
            "name": self.name,
            "job_type": "http",
            "active": true,
            "config": {
                "url": self.url,
                "method": "GET",
                "connect_timeout": self.timeout_secs,
                "idle_timeout": self.timeout_secs,
                "follow_redirect": false,
                "tls_add_verify": true,
            },
            "rules": [
                {"key": "status_code", "comparison": "==", "value": self.status.to_string()},
                {"key": "body", "comparison": "contains", "value": self.expect},
            ],
            "regions": self.regions,
            "frequency": self.frequency,
            "policy": "quorum",
            "rapid_recheck": false,
            "notify_list": notify_list,
            "notify_failback": true,
            "notify_regional": false,
            "notes": format!("multicdn health check for {}", self.provider),
        })
    }

    /// True when `job` (as NS1 lists it) runs as [`MonitorSpec::body`] says: every member
    /// the body sets holds the same value (members NS1 adds are ignored; numbers compared as
    /// numbers, so `30.0` is `30`).
    pub fn matches(&self, job: &Value, notify_list: &str) -> bool {
        let Value::Object(want) = self.body(notify_list) else {
            return false;
        };
        want.iter()
            .all(|(k, v)| job.get(k).is_some_and(|have| same(have, v)))
    }
}

fn same(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Object(a), Value::Object(b)) => {
            b.iter().all(|(k, v)| a.get(k).is_some_and(|x| same(x, v)))
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        _ => have == want,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> HealthPolicy {
        let yaml = include_str!("../../../examples/policy.yaml");
        multicdn_core::Policy::from_yaml(yaml, "policy.yaml")
            .unwrap()
            .health
    }

    #[test]
    fn the_policy_becomes_an_http_job_matching_status_and_body_from_its_regions() {
        let h = health();
        let regions = monitor_regions(&h).unwrap();
        assert_eq!(regions, ["lhr", "lga", "sjc", "sin", "gru"]);
        let spec = MonitorSpec::new(
            ProviderId::new("fastly").unwrap(),
            "Example.map.fastly.net.",
            &h,
            regions,
        )
        .unwrap();
        let body = spec.body("nl-1");
        assert_eq!(body["job_type"], "http");
        assert_eq!(
            body["config"]["url"],
            "https://example.map.fastly.net/_health/v3.txt"
        );
        assert_eq!(body["config"]["connect_timeout"], 3);
        assert_eq!(body["frequency"], 30);
        assert_eq!(body["notify_list"], "nl-1");
        assert_eq!(
            body["rules"],
            json!([
                {"key": "status_code", "comparison": "==", "value": "200"},
                {"key": "body", "comparison": "contains", "value": "healthy-v3"},
            ])
        );
        // As NS1 lists it: ids, status and floats added; still the same job.
        let mut listed = body.clone();
        listed["id"] = json!("job-1");
        listed["frequency"] = json!(30.0);
        listed["status"] = json!({"global": {"status": "up"}});
        assert!(spec.matches(&listed, "nl-1"));
        listed["rules"][1]["value"] = json!("healthy-v2");
        assert!(!spec.matches(&listed, "nl-1"));
        assert!(!spec.matches(&body, "nl-2"));
    }

    #[test]
    fn regions_without_an_ns1_monitor_are_refused_naming_the_valid_ones() {
        let mut h = health();
        h.regions = vec![multicdn_core::RegionId::new("mars").unwrap()];
        let e = monitor_regions(&h).unwrap_err();
        assert!(e.contains("lhr (eu-west)"), "{e}");
    }
}
