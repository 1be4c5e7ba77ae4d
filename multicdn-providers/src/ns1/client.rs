//! The NS1 API client: records and data feeds, through the shared vendor HTTP layer.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use multicdn_core::{Error, ProviderId, Secret};
use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

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
        let sources: Vec<WithId> = self.must(Method::GET, "/data/sources", None).await?;
        if let Some(s) = sources
            .into_iter()
            .find(|s| s.name.as_deref() == Some(name))
        {
            return Ok(s.id);
        }
        let made: WithId = self
            .must(
                Method::PUT,
                "/data/sources",
                Some(json!({"name": name, "sourcetype": "nsone_v1"})),
            )
            .await?;
        Ok(made.id)
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
