//! Fastly: purge by URL, by surrogate key (one, or batches of up to 256), and everything; soft
//! purge where Fastly allows it (not for `purge_all`).
//!
//! Fastly has no purge by hostname or by prefix: those are refused with
//! [`Error::Unsupported`] before anything is sent (purging everything instead would be a guess
//! with a large blast radius; ask for it explicitly).
//!
//! Pacing follows [`FastlyLimits`]: every URL and every key spends one token of the purge
//! budget (about 100,000 an hour), `purge_all` one token of the 1,000-an-hour non-read budget.

pub mod deploy;
mod limits;
pub(crate) mod wire;

use std::fmt;

use async_trait::async_trait;
use multicdn_core::policy::ProviderSpec;
use multicdn_core::{
    Error, KindPacing, Pacing, Provider, ProviderId, ProviderKind, PurgeReceipt, PurgeRequest,
    PurgeScope, Purger, Secret, Stopwatch,
};
use reqwest::{Method, RequestBuilder};

pub use limits::{FastlyLimits, MAX_KEYS_PER_BATCH, hourly};

use crate::http::batch::{Acked, chunks, send_batches};
use crate::http::{Answer, HttpSettings, Pacer, Sent, VendorHttp, secret_header};
use crate::spec::{required_field, token_from_env};

/// Fastly's API.
pub const DEFAULT_BASE_URL: &str = "https://api.fastly.com";

/// Requests one purge sends at once by default.
const DEFAULT_IN_FLIGHT: usize = 4;

/// Refuses what is not a Fastly service id (letters and digits), naming the provider.
pub(crate) fn check_service_id(id: &ProviderId, service_id: &str) -> Result<(), Error> {
    if service_id.is_empty() || !service_id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Error::InvalidRequest {
            provider: id.clone(),
            message: format!(
                "service id {service_id:?} is not a Fastly service id (letters and digits, like SU1Z0isxPaozGVKXdv0eY)"
            ),
        });
    }
    Ok(())
}

/// A Fastly service's purger and provider description.
#[derive(Clone)]
pub struct FastlyPurger {
    id: ProviderId,
    edge_host: String,
    service_id: String,
    token: Secret,
    /// `Fastly-Key`, built once and marked sensitive.
    key: http::HeaderValue,
    http: VendorHttp,
    limits: FastlyLimits,
    purges: Pacer,
    non_read: Pacer,
    in_flight: usize,
}

impl fmt::Debug for FastlyPurger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastlyPurger")
            .field("id", &self.id)
            .field("edge_host", &self.edge_host)
            .field("service_id", &self.service_id)
            .field("token", &self.token)
            .field("http", &self.http)
            .field("limits", &self.limits)
            .finish()
    }
}

impl FastlyPurger {
    /// A purger for service `service_id`, talking to `base_url` (HTTPS, or HTTP on loopback).
    pub fn new(
        id: ProviderId,
        edge_host: impl Into<String>,
        service_id: impl Into<String>,
        token: Secret,
        base_url: &str,
        settings: HttpSettings,
    ) -> Result<FastlyPurger, Error> {
        let service_id = service_id.into();
        check_service_id(&id, &service_id)?;
        let key = secret_header(&id, token.expose())?;
        let http = VendorHttp::new(id.clone(), base_url, settings)?;
        let limits = FastlyLimits::default();
        Ok(FastlyPurger {
            key,
            edge_host: edge_host.into(),
            service_id,
            token,
            http,
            purges: Pacer::new("fastly-purges", limits.purges),
            non_read: Pacer::new("fastly-non-read", limits.non_read),
            limits,
            in_flight: DEFAULT_IN_FLIGHT,
            id,
        })
    }

    /// A purger from the policy's provider entry (`kind: fastly`, `service_id`, `edge_host`),
    /// with `token`; `base_url` overrides Fastly's API address.
    pub fn from_spec(
        id: ProviderId,
        spec: &ProviderSpec,
        token: Secret,
        base_url: Option<&str>,
        settings: HttpSettings,
    ) -> Result<FastlyPurger, Error> {
        let service_id = required_field(
            &id,
            spec,
            ProviderKind::Fastly,
            "service_id",
            spec.service_id.as_ref(),
            "for a Fastly purger",
        )?;
        FastlyPurger::new(
            id,
            spec.edge_host.clone(),
            service_id,
            token,
            base_url.unwrap_or(DEFAULT_BASE_URL),
            settings,
        )
    }

    /// [`FastlyPurger::from_spec`], reading the token from the variable `token_env` names.
    pub fn from_spec_env(
        id: ProviderId,
        spec: &ProviderSpec,
        base_url: Option<&str>,
        settings: HttpSettings,
    ) -> Result<FastlyPurger, Error> {
        let token = token_from_env(&id, spec)?;
        FastlyPurger::from_spec(id, spec, token, base_url, settings)
    }

    /// Replaces the budgets (fresh, full buckets).
    pub fn with_limits(mut self, limits: FastlyLimits) -> FastlyPurger {
        self.purges = Pacer::new("fastly-purges", limits.purges);
        self.non_read = Pacer::new("fastly-non-read", limits.non_read);
        self.limits = limits;
        self
    }

    /// Shares budgets with other purgers using the same token (clones of one [`Pacer`] share
    /// a bucket). Their limits replace this purger's.
    pub fn with_shared_budgets(mut self, purges: Pacer, non_read: Pacer) -> FastlyPurger {
        self.limits.purges = purges.limit();
        self.limits.non_read = non_read.limit();
        self.purges = purges;
        self.non_read = non_read;
        self
    }

    /// Sets how many requests one purge sends at once (default 4).
    pub fn with_in_flight(mut self, n: usize) -> FastlyPurger {
        self.in_flight = n.max(1);
        self
    }

    /// The budgets.
    pub fn limits(&self) -> &FastlyLimits {
        &self.limits
    }

    /// The service id.
    pub fn service_id(&self) -> &str {
        &self.service_id
    }

    fn unsupported(&self, feature: String) -> Error {
        Error::Unsupported {
            provider: self.id.clone(),
            feature: format!("{feature} (Fastly purges URLs, surrogate keys, or everything)"),
        }
    }

    fn invalid(&self, message: String) -> Error {
        Error::InvalidRequest {
            provider: self.id.clone(),
            message,
        }
    }

    fn post(&self, path: &str, soft: bool) -> RequestBuilder {
        let mut req = self
            .http
            .request(Method::POST, path)
            .header("Fastly-Key", self.key.clone())
            .header("Accept", "application/json");
        if soft {
            req = req.header("Fastly-Soft-Purge", "1");
        }
        req
    }

    fn check_status(&self, label: &str, answer: &Answer) -> Result<(), Error> {
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(self
                .http
                .status_error(label, answer, None, wire::error_message(&answer.body)))
        }
    }

    fn unexpected(&self, label: &str, message: String) -> Error {
        Error::UnexpectedResponse {
            provider: self.id.clone(),
            request: label.to_owned(),
            message,
        }
    }

    /// Purges one URL; the purge id.
    async fn purge_url(&self, url: &str, soft: bool) -> Result<Sent<Vec<String>>, Error> {
        let (path, label) = wire::url_purge_path(url).map_err(|m| self.invalid(m))?;
        self.purge_one(&path, &format!("POST {label}"), soft).await
    }

    /// Purges one surrogate key; the purge id.
    async fn purge_key(&self, key: &str, soft: bool) -> Result<Sent<Vec<String>>, Error> {
        let path = wire::key_purge_path(&self.service_id, key);
        self.purge_one(&path, &format!("POST {path}"), soft).await
    }

    /// One purge of one item (URL or key) at `path`, one token of the purge budget; the purge
    /// id Fastly must answer with.
    async fn purge_one(
        &self,
        path: &str,
        label: &str,
        soft: bool,
    ) -> Result<Sent<Vec<String>>, Error> {
        self.http
            .send_paced(
                label,
                &[(&self.purges, 1)],
                || self.post(path, soft),
                |answer| {
                    self.check_status(label, answer)?;
                    let id = wire::read_status(&answer.body, true)
                        .map_err(|m| self.unexpected(label, m))?;
                    Ok(id.into_iter().collect())
                },
            )
            .await
    }

    /// Purges a batch of keys (one request); the purge ids in key order.
    async fn purge_batch(&self, keys: &[String], soft: bool) -> Result<Sent<Vec<String>>, Error> {
        if let [key] = keys {
            return self.purge_key(key, soft).await;
        }
        let path = format!(
            "/service/{}/purge",
            crate::http::encode_segment(&self.service_id)
        );
        let label = format!("POST {path} ({} keys)", keys.len());
        let body = serde_json::json!({ "surrogate_keys": keys });
        let cost = u32::try_from(keys.len()).unwrap_or(u32::MAX);
        self.http
            .send_paced(
                &label,
                &[(&self.purges, cost)],
                || self.post(&path, soft).json(&body),
                |answer| {
                    self.check_status(&label, answer)?;
                    wire::read_batch(&answer.body, keys).map_err(|m| self.unexpected(&label, m))
                },
            )
            .await
    }

    /// Purges everything the service holds (never soft).
    async fn purge_all(&self) -> Result<Sent<Vec<String>>, Error> {
        let path = format!(
            "/service/{}/purge_all",
            crate::http::encode_segment(&self.service_id)
        );
        let label = format!("POST {path}");
        self.http
            .send_paced(
                &label,
                &[(&self.non_read, 1)],
                || self.post(&path, false),
                |answer| {
                    self.check_status(&label, answer)?;
                    let id = wire::read_status(&answer.body, false)
                        .map_err(|m| self.unexpected(&label, m))?;
                    Ok(id.into_iter().collect())
                },
            )
            .await
    }
}

#[async_trait]
impl Purger for FastlyPurger {
    fn provider(&self) -> &ProviderId {
        &self.id
    }

    /// What this purger can purge and how it is paced.
    fn pacing(&self) -> Pacing {
        let items = vec![self.limits.purge_budget()];
        Pacing::default()
            .with_kind(
                &PurgeScope::Urls(Vec::new()),
                Some(KindPacing::new(1, items.clone())),
            )
            .with_kind(
                &PurgeScope::Tags(Vec::new()),
                Some(KindPacing::new(self.limits.keys_per_batch, items)),
            )
            .with_kind(
                &PurgeScope::Everything,
                Some(KindPacing::new(1, vec![self.limits.non_read_budget()])),
            )
            .with_soft(true, false)
    }

    /// Checks `request` without sending anything: the kind and soft flag are supported, every
    /// key and URL is well formed. [`Purger::purge`] does this first; the fan-out does it for
    /// every provider before sending to any.
    fn validate(&self, request: &PurgeRequest) -> Result<(), Error> {
        if let Err(feature) = self.pacing().check(request) {
            return Err(self.unsupported(feature));
        }
        let why = match &request.scope {
            PurgeScope::Tags(keys) => keys.iter().find_map(|k| wire::invalid_key(k)),
            PurgeScope::Urls(urls) => urls.iter().find_map(|u| wire::url_purge_path(u).err()),
            _ => None,
        };
        match why {
            Some(why) => Err(self.invalid(format!("{why}; nothing was purged"))),
            None => Ok(()),
        }
    }

    async fn purge(&self, request: &PurgeRequest) -> Result<PurgeReceipt, Error> {
        let watch = Stopwatch::start();
        self.validate(request)?;
        let soft = request.soft;
        match &request.scope {
            PurgeScope::Everything => {
                let acked = Acked::one(self.purge_all().await?);
                Ok(acked.receipt(&self.id, 0, watch))
            }
            PurgeScope::Tags(keys) => {
                let batches = chunks(keys, self.limits.keys_per_batch);
                let items = batches.iter().map(Vec::len).sum();
                let acked = send_batches(batches, self.in_flight, |batch| async move {
                    self.purge_batch(&batch, soft).await
                })
                .await?;
                Ok(acked.receipt(&self.id, items, watch))
            }
            PurgeScope::Urls(urls) => {
                let batches = chunks(urls, 1);
                let items = batches.len();
                let acked = send_batches(batches, self.in_flight, |batch| async move {
                    let url = batch.first().map(String::as_str).unwrap_or_default();
                    self.purge_url(url, soft).await
                })
                .await?;
                Ok(acked.receipt(&self.id, items, watch))
            }
            other => Err(self.unsupported(format!("purge by {}", other.kind()))),
        }
    }
}

impl Provider for FastlyPurger {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn kind(&self) -> ProviderKind {
        ProviderKind::Fastly
    }

    fn edge_host(&self) -> &str {
        &self.edge_host
    }
}
