//! The NS1 API client: records and data feeds, through the shared vendor HTTP layer.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use multicdn_core::{Error, ProviderId, Secret};
use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::monitor::{MONITORING_SOURCE_TYPE, MonitorSpec};
use super::record::Ns1Record;
use crate::http::{Answer, HttpSettings, ReadResult, VendorHttp, secret_header, with_retry_advice};

/// NS1's public API base.
pub const DEFAULT_BASE: &str = "https://api.nsone.net";

/// The provider id NS1 errors carry.
#[allow(clippy::expect_used)] // a constant that satisfies the id rules; covered by a test
pub fn provider_id() -> ProviderId {
    ProviderId::new("ns1").expect("ns1 is a valid provider id")
}

/// The NS1 API. The key travels only in `X-NSONE-Key`.
#[derive(Clone)]
pub struct Ns1Client {
    http: VendorHttp,
    key: Secret,
    /// `X-NSONE-Key`, built once and marked sensitive.
    key_header: http::HeaderValue,
}

impl fmt::Debug for Ns1Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ns1Client")
            .field("http", &self.http)
            .field("key", &self.key)
            .finish()
    }
}

#[derive(Debug, Deserialize)]
struct WithId {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    sourcetype: Option<String>,
}

/// The job named as `spec` names its job, with its id.
fn find_job<'a>(jobs: &'a [Value], spec: &MonitorSpec) -> Option<(&'a Value, String)> {
    let job = jobs
        .iter()
        .find(|j| j.get("name").and_then(Value::as_str) == Some(spec.name.as_str()))?;
    Some((job, job.get("id")?.as_str()?.to_owned()))
}

/// A wait NS1's rate-limit headers imply when a `429` carries no `Retry-After`: the time one
/// request's token takes to refill (`X-RateLimit-Period` / `X-RateLimit-Limit` seconds).
pub fn rate_limit_wait(headers: &http::HeaderMap) -> Option<Duration> {
    let num = |name: &str| -> Option<f64> {
        headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0 && *v < 1e6)
    };
    let period = num("x-ratelimit-period")?;
    let limit = num("x-ratelimit-limit").unwrap_or(1.0);
    Some(Duration::from_secs_f64(period / limit))
}

impl Ns1Client {
    /// A client for `base` ([`DEFAULT_BASE`] in production; HTTP only on loopback).
    pub fn new(base: &str, key: Secret, settings: HttpSettings) -> Result<Ns1Client, Error> {
        Ok(Ns1Client {
            http: VendorHttp::new(provider_id(), base, settings)?,
            key_header: secret_header(&provider_id(), key.expose())?,
            key,
        })
    }

    /// The key from an environment variable (`NS1_API_KEY`, say).
    pub fn from_env(base: &str, var: &str, settings: HttpSettings) -> Result<Ns1Client, Error> {
        let key = Secret::from_env(var).ok_or_else(|| Error::InvalidRequest {
            provider: provider_id(),
            message: format!("{var} is not set: it must hold the NS1 API key"),
        })?;
        Ns1Client::new(base, key, settings)
    }

    fn error(&self, label: &str, answer: &Answer) -> Error {
        let text = answer.text();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| {
                let t: String = text.chars().take(300).collect();
                if t.is_empty() {
                    format!("HTTP {}", answer.status.as_u16())
                } else {
                    t
                }
            });
        // A 429 without Retry-After: the wait NS1's rate-limit headers imply.
        let implied = (answer.status.as_u16() == 429)
            .then(|| rate_limit_wait(&answer.headers))
            .flatten();
        with_retry_advice(
            self.http.status_error(label, answer, None, message),
            false,
            implied,
        )
    }

    /// Sends one request; `None` for a 404 when `missing_ok`.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        missing_ok: bool,
    ) -> Result<Option<T>, Error> {
        let label = format!("{method} /v1{path}");
        let build = || {
            let mut r = self
                .http
                .request(method.clone(), &format!("/v1{path}"))
                .header("X-NSONE-Key", self.key_header.clone());
            if let Some(b) = &body {
                r = r.json(b);
            }
            r
        };
        let read = |answer: &Answer| -> ReadResult<Option<T>> {
            if answer.status.as_u16() == 404 && missing_ok {
                return Ok(None);
            }
            if !answer.status.is_success() {
                return Err(self.error(&label, answer));
            }
            serde_json::from_slice(&answer.body)
                .map(Some)
                .map_err(|e| Error::UnexpectedResponse {
                    provider: provider_id(),
                    request: label.clone(),
                    message: format!("cannot read the answer: {e}"),
                })
        };
        Ok(self.http.send(&label, build, read).await?.value)
    }

    async fn must<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<T, Error> {
        let label = format!("{method} /v1{path}");
        self.call(method, path, body, false)
            .await?
            .ok_or_else(|| Error::UnexpectedResponse {
                provider: provider_id(),
                request: label,
                message: "empty answer".into(),
            })
    }

    /// The record, or `None` when it does not exist.
    pub async fn get_record(
        &self,
        zone: &str,
        domain: &str,
        rtype: &str,
    ) -> Result<Option<Ns1Record>, Error> {
        self.call(
            Method::GET,
            &format!("/zones/{zone}/{domain}/{rtype}"),
            None,
            true,
        )
        .await
    }

    /// The record types the zone holds at `domain` (`GET /v1/zones/{zone}`, whose `records`
    /// list every record's `domain` and `type`), compared without case or trailing dot.
    pub async fn types_at(&self, zone: &str, domain: &str) -> Result<Vec<String>, Error> {
        let path = format!("/zones/{zone}");
        let answer: Value = self.must(Method::GET, &path, None).await?;
        let Some(records) = answer.get("records").and_then(Value::as_array) else {
            return Err(Error::UnexpectedResponse {
                provider: provider_id(),
                request: format!("GET /v1{path}"),
                message: "the zone has no records list".into(),
            });
        };
        let wanted = domain.trim_end_matches('.');
        Ok(records
            .iter()
            .filter(|r| {
                r.get("domain")
                    .and_then(Value::as_str)
                    .is_some_and(|d| d.trim_end_matches('.').eq_ignore_ascii_case(wanted))
            })
            .filter_map(|r| r.get("type").and_then(Value::as_str).map(str::to_owned))
            .collect())
    }

    /// Creates the record (`PUT`). NS1's echo of the record is not interpreted.
    pub async fn create_record(&self, record: &Ns1Record) -> Result<(), Error> {
        let path = format!("/zones/{}/{}/{}", record.zone, record.domain, record.rtype);
        let _: Value = self.must(Method::PUT, &path, Some(json!(record))).await?;
        Ok(())
    }

    /// Replaces the record's answers, filters and regions (`POST`).
    pub async fn update_record(&self, record: &Ns1Record) -> Result<(), Error> {
        let path = format!("/zones/{}/{}/{}", record.zone, record.domain, record.rtype);
        let _: Value = self.must(Method::POST, &path, Some(json!(record))).await?;
        Ok(())
    }

    /// The data source named `name` (type `nsone_v1`), made if missing; returns its id.
    pub async fn ensure_source(&self, name: &str) -> Result<String, Error> {
        self.ensure_source_of_type(name, "nsone_v1").await
    }

    /// The id of the data source named `name` of type `sourcetype`, if there is one (a
    /// source of that name but another type does not count).
    async fn find_source(&self, name: &str, sourcetype: &str) -> Result<Option<String>, Error> {
        let sources: Vec<WithId> = self.must(Method::GET, "/data/sources", None).await?;
        Ok(sources
            .into_iter()
            .find(|s| {
                s.name.as_deref() == Some(name)
                    && s.sourcetype.as_deref().is_none_or(|t| t == sourcetype)
            })
            .map(|s| s.id))
    }

    /// The data source named `name` of type `sourcetype`, made if missing; returns its id.
    async fn ensure_source_of_type(&self, name: &str, sourcetype: &str) -> Result<String, Error> {
        if let Some(id) = self.find_source(name, sourcetype).await? {
            return Ok(id);
        }
        let made: WithId = self
            .must(
                Method::PUT,
                "/data/sources",
                Some(json!({"name": name, "sourcetype": sourcetype})),
            )
            .await?;
        Ok(made.id)
    }

    /// Looks up, writing nothing, what [`Ns1Client::ensure_monitors`] makes: the source id and
    /// each provider's feed id when the source, the notify list, every job (as the spec says)
    /// and every feed exist; `None` when anything is missing or differs (an apply would write).
    pub async fn find_monitors(
        &self,
        source_name: &str,
        specs: &[MonitorSpec],
    ) -> Result<Option<(String, BTreeMap<ProviderId, String>)>, Error> {
        let Some(source) = self
            .find_source(source_name, MONITORING_SOURCE_TYPE)
            .await?
        else {
            return Ok(None);
        };
        let Some(list) = self.find_notify_list(source_name, &source).await? else {
            return Ok(None);
        };
        let jobs: Vec<Value> = self.must(Method::GET, "/monitoring/jobs", None).await?;
        let feeds = self.monitor_feeds(&source).await?;
        let mut out = BTreeMap::new();
        for spec in specs {
            let Some((job, id)) = find_job(&jobs, spec) else {
                return Ok(None);
            };
            let Some(feed) = feeds.get(&id).filter(|_| spec.matches(job, &list)) else {
                return Ok(None);
            };
            out.insert(spec.provider.clone(), feed.clone());
        }
        Ok(Some((source, out)))
    }

    /// Makes (or finds) what drives answers from monitors: a data source `source_name` of type
    /// `nsone_monitoring`, a notify list of the same name with one `datafeed` notifier for it,
    /// one `http` monitoring job per spec notifying that list (a job found by name with other
    /// settings is updated), and one feed per job. Returns the source id and each provider's
    /// feed id.
    pub async fn ensure_monitors(
        &self,
        source_name: &str,
        specs: &[MonitorSpec],
    ) -> Result<(String, BTreeMap<ProviderId, String>), Error> {
        let source = self
            .ensure_source_of_type(source_name, MONITORING_SOURCE_TYPE)
            .await?;
        let list = match self.find_notify_list(source_name, &source).await? {
            Some(id) => id,
            None => {
                let made: WithId = self
                    .must(
                        Method::PUT,
                        "/lists",
                        Some(json!({
                            "name": source_name,
                            "notify_list": [{"type": "datafeed", "config": {"sourceid": source}}],
                        })),
                    )
                    .await?;
                made.id
            }
        };
        let jobs: Vec<Value> = self.must(Method::GET, "/monitoring/jobs", None).await?;
        let mut job_ids = BTreeMap::new();
        for spec in specs {
            let body = spec.body(&list);
            let id = match find_job(&jobs, spec) {
                Some((job, id)) if spec.matches(job, &list) => id,
                Some((_, id)) => {
                    let _: Value = self
                        .must(Method::POST, &format!("/monitoring/jobs/{id}"), Some(body))
                        .await?;
                    id
                }
                None => {
                    let made: WithId = self
                        .must(Method::PUT, "/monitoring/jobs", Some(body))
                        .await?;
                    made.id
                }
            };
            job_ids.insert(spec.provider.clone(), id);
        }
        let feeds = self.monitor_feeds(&source).await?;
        let mut out = BTreeMap::new();
        for (provider, job) in job_ids {
            let id = match feeds.get(&job) {
                Some(f) => f.clone(),
                None => {
                    let made: WithId = self
                        .must(
                            Method::PUT,
                            &format!("/data/feeds/{source}"),
                            Some(json!({"name": format!("multicdn {provider} monitor"), "config": {"jobid": job}})),
                        )
                        .await?;
                    made.id
                }
            };
            out.insert(provider, id);
        }
        Ok((source, out))
    }

    /// The feeds on `source_id` by the job they follow (`config.jobid`).
    async fn monitor_feeds(&self, source_id: &str) -> Result<BTreeMap<String, String>, Error> {
        let feeds: Vec<WithId> = self
            .must(Method::GET, &format!("/data/feeds/{source_id}"), None)
            .await?;
        Ok(feeds
            .into_iter()
            .filter_map(|f| {
                let job = f.config.as_ref()?.get("jobid")?.as_str()?.to_owned();
                Some((job, f.id))
            })
            .collect())
    }

    /// The notify list `name` holding a `datafeed` notifier for `source_id`, if there is one.
    async fn find_notify_list(&self, name: &str, source_id: &str) -> Result<Option<String>, Error> {
        let lists: Vec<Value> = self.must(Method::GET, "/lists", None).await?;
        let feeds_source = |l: &Value| {
            l.get("notify_list")
                .and_then(Value::as_array)
                .is_some_and(|n| {
                    n.iter().any(|n| {
                        n.get("type").and_then(Value::as_str) == Some("datafeed")
                            && n.pointer("/config/sourceid").and_then(Value::as_str)
                                == Some(source_id)
                    })
                })
        };
        Ok(lists
            .iter()
            .find(|l| l.get("name").and_then(Value::as_str) == Some(name) && feeds_source(l))
            .and_then(|l| l.get("id")?.as_str())
            .map(str::to_owned))
    }

    /// One feed per provider on `source_id`, labelled with the provider's id, made if
    /// missing; returns the feed ids by provider.
    pub async fn ensure_feeds(
        &self,
        source_id: &str,
        providers: &[ProviderId],
    ) -> Result<BTreeMap<ProviderId, String>, Error> {
        let existing: Vec<WithId> = self
            .must(Method::GET, &format!("/data/feeds/{source_id}"), None)
            .await?;
        let label_of = |f: &WithId| -> Option<String> {
            f.config.as_ref()?.get("label")?.as_str().map(str::to_owned)
        };
        let mut out = BTreeMap::new();
        for p in providers {
            if let Some(f) = existing
                .iter()
                .find(|f| label_of(f).as_deref() == Some(p.as_str()))
            {
                out.insert(p.clone(), f.id.clone());
                continue;
            }
            let made: WithId = self
                .must(
                    Method::PUT,
                    &format!("/data/feeds/{source_id}"),
                    Some(json!({"name": format!("multicdn {p}"), "config": {"label": p.as_str()}})),
                )
                .await?;
            out.insert(p.clone(), made.id);
        }
        Ok(out)
    }

    /// Publishes up/down for providers through the source's feeds (keyed by label), so the
    /// answers they drive move without rewriting the record.
    pub async fn publish_up(
        &self,
        source_id: &str,
        states: &BTreeMap<ProviderId, bool>,
    ) -> Result<(), Error> {
        let body: serde_json::Map<String, Value> = states
            .iter()
            .map(|(p, up)| (p.to_string(), json!({"up": up})))
            .collect();
        let _: Option<Value> = self
            .call(
                Method::POST,
                &format!("/feed/{source_id}"),
                Some(Value::Object(body)),
                false,
            )
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_429_without_retry_after_waits_one_token() {
        let mut h = http::HeaderMap::new();
        h.insert("x-ratelimit-period", "10".parse().unwrap());
        h.insert("x-ratelimit-limit", "20".parse().unwrap());
        assert_eq!(rate_limit_wait(&h), Some(Duration::from_millis(500)));
        h.insert("x-ratelimit-period", "soon".parse().unwrap());
        assert_eq!(rate_limit_wait(&h), None);
        assert_eq!(provider_id().as_str(), "ns1");
    }

    #[test]
    fn the_key_never_prints() {
        let c = Ns1Client::new(
            "http://127.0.0.1:1",
            Secret::new("k-123"),
            HttpSettings::default(),
        )
        .unwrap();
        assert!(!format!("{c:?}").contains("k-123"));
    }
}
