//! Cloudflare: purge files (URLs), cache tags, hostnames, prefixes, or everything, with
//! `POST /zones/{zone_id}/purge_cache`, one kind a request, at most 100 items a request (500
//! URLs on Enterprise). Every answer's envelope is checked: a `200` with `success:false` is a
//! failure carrying Cloudflare's codes and messages (see [`wire`](self) for how codes are
//! classified). Cloudflare has no soft purge: a soft request is refused with
//! [`Error::Unsupported`], nothing sent.
//!
//! Pacing follows [`CloudflareLimits`] for the zone's plan.

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
use reqwest::Method;

pub use limits::{CloudflareLimits, MAX_ITEMS_PER_REQUEST, MAX_URLS_PER_REQUEST_ENTERPRISE};

use crate::http::batch::{Acked, chunks, send_batches};
use crate::http::{
    Answer, HttpSettings, Pacer, Sent, VendorHttp, encode_segment, parse_retry_after,
    secret_header, with_retry_advice,
};
use crate::spec::{required_field, token_from_env};

/// Cloudflare's API.
pub const DEFAULT_BASE_URL: &str = "https://api.cloudflare.com/client/v4";

/// Requests one purge sends at once by default.
const DEFAULT_IN_FLIGHT: usize = 4;

/// Refuses what is not a Cloudflare zone id (hex digits), naming the provider.
pub(crate) fn check_zone_id(id: &ProviderId, zone_id: &str) -> Result<(), Error> {
    if zone_id.is_empty() || !zone_id.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Error::InvalidRequest {
            provider: id.clone(),
            message: format!(
                "zone id {zone_id:?} is not a Cloudflare zone id (32 hex digits, like 023e105f4ecef8ad9ca31a8372d0c353)"
            ),
        });
    }
    Ok(())
}

/// `Authorization: Bearer <token>`, marked sensitive; `Err` (naming the provider, never the
/// token) when the token cannot be carried in a header.
pub(crate) fn bearer_header(id: &ProviderId, token: &Secret) -> Result<http::HeaderValue, Error> {
    secret_header(id, &format!("Bearer {}", token.expose()))
}

/// A Cloudflare zone's purger and provider description.
#[derive(Clone)]
pub struct CloudflarePurger {
    id: ProviderId,
    edge_host: String,
    zone_id: String,
    token: Secret,
    /// `Authorization: Bearer ...`, built once and marked sensitive.
    bearer: http::HeaderValue,
    http: VendorHttp,
    limits: CloudflareLimits,
    purge: Pacer,
    /// Single-file (URL) purges: a token a URL.
    urls: Pacer,
    in_flight: usize,
}

impl fmt::Debug for CloudflarePurger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudflarePurger")
            .field("id", &self.id)
            .field("edge_host", &self.edge_host)
            .field("zone_id", &self.zone_id)
            .field("token", &self.token)
            .field("http", &self.http)
            .field("limits", &self.limits)
            .finish()
    }
}

impl CloudflarePurger {
    /// A purger for zone `zone_id` with `limits`, talking to `base_url` (HTTPS, or HTTP on
    /// loopback).
    pub fn new(
        id: ProviderId,
        edge_host: impl Into<String>,
        zone_id: impl Into<String>,
        token: Secret,
        limits: CloudflareLimits,
        base_url: &str,
        settings: HttpSettings,
    ) -> Result<CloudflarePurger, Error> {
        let zone_id = zone_id.into();
        check_zone_id(&id, &zone_id)?;
        let bearer = bearer_header(&id, &token)?;
        let http = VendorHttp::new(id.clone(), base_url, settings)?
            .with_pacer(Pacer::new("cloudflare-global", limits.global));
        Ok(CloudflarePurger {
            bearer,
            edge_host: edge_host.into(),
            zone_id,
            token,
            http,
            purge: Pacer::new("cloudflare-purge", limits.purge),
            urls: Pacer::new("cloudflare-urls", limits.urls),
            limits,
            in_flight: DEFAULT_IN_FLIGHT,
            id,
        })
    }

    /// A purger from the policy's provider entry (`kind: cloudflare`, `zone_id`, `plan`,
    /// `edge_host`), with `token`; `base_url` overrides Cloudflare's API address. The plan
    /// (Pro when absent) sets the limits.
    pub fn from_spec(
        id: ProviderId,
        spec: &ProviderSpec,
        token: Secret,
        base_url: Option<&str>,
        settings: HttpSettings,
    ) -> Result<CloudflarePurger, Error> {
        let zone_id = required_field(
            &id,
            spec,
            ProviderKind::Cloudflare,
            "zone_id",
            spec.zone_id.as_ref(),
            "for a Cloudflare purger",
        )?;
        let limits = CloudflareLimits::for_plan(spec.plan.unwrap_or_default());
        CloudflarePurger::new(
            id,
            spec.edge_host.clone(),
            zone_id,
            token,
            limits,
            base_url.unwrap_or(DEFAULT_BASE_URL),
            settings,
        )
    }

    /// [`CloudflarePurger::from_spec`], reading the token from the variable `token_env` names.
    pub fn from_spec_env(
        id: ProviderId,
        spec: &ProviderSpec,
        base_url: Option<&str>,
        settings: HttpSettings,
    ) -> Result<CloudflarePurger, Error> {
        let token = token_from_env(&id, spec)?;
        CloudflarePurger::from_spec(id, spec, token, base_url, settings)
    }

    /// Replaces the limits (fresh, full buckets).
    pub fn with_limits(mut self, limits: CloudflareLimits) -> CloudflarePurger {
        self.http = self
            .http
            .with_pacer(Pacer::new("cloudflare-global", limits.global));
        self.purge = Pacer::new("cloudflare-purge", limits.purge);
        self.urls = Pacer::new("cloudflare-urls", limits.urls);
        self.limits = limits;
        self
    }

    /// Shares the plan's purge bucket and the token's global budget with other purgers of the
    /// same account and token (clones of one [`Pacer`] share a bucket).
    pub fn with_shared_budgets(mut self, purge: Pacer, global: Pacer) -> CloudflarePurger {
        self.limits.purge = purge.limit();
        self.limits.global = global.limit();
        self.http = self.http.with_pacer(global);
        self.purge = purge;
        self
    }

    /// Sets how many requests one purge sends at once (default 4).
    pub fn with_in_flight(mut self, n: usize) -> CloudflarePurger {
        self.in_flight = n.max(1);
        self
    }

    /// The limits.
    pub fn limits(&self) -> &CloudflareLimits {
        &self.limits
    }

    /// The zone id.
    pub fn zone_id(&self) -> &str {
        &self.zone_id
    }

    fn invalid(&self, message: String) -> Error {
        Error::InvalidRequest {
            provider: self.id.clone(),
            message,
        }
    }

    /// Reads an answer into the purge id, or the error it means.
    fn read(&self, label: &str, answer: &Answer) -> Result<Option<String>, Error> {
        Ok(wire::purge_id(&read_answer(&self.http, label, answer)?))
    }

    /// Sends one purge request of one kind.
    async fn send(
        &self,
        kind: &'static str,
        items: Vec<String>,
    ) -> Result<Sent<Vec<String>>, Error> {
        let path = format!("/zones/{}/purge_cache", encode_segment(&self.zone_id));
        let body = match kind {
            "everything" => serde_json::json!({ "purge_everything": true }),
            "urls" => serde_json::json!({ "files": items }),
            other => {
                let mut map = serde_json::Map::new();
                map.insert(other.to_owned(), serde_json::json!(items));
                serde_json::Value::Object(map)
            }
        };
        let label = if kind == "everything" {
            format!("POST {path} (everything)")
        } else {
            format!("POST {path} ({} {kind})", items.len())
        };
        // URL purges spend the single-file budget, a token a URL; the rest the purge bucket.
        let budget = if kind == "urls" {
            (&self.urls, u32::try_from(items.len()).unwrap_or(u32::MAX))
        } else {
            (&self.purge, 1)
        };
        self.http
            .send_paced(
                &label,
                &[budget],
                || {
                    self.http
                        .request(Method::POST, &path)
                        .header("Authorization", self.bearer.clone())
                        .json(&body)
                },
                |answer| Ok(self.read(&label, answer)?.into_iter().collect()),
            )
            .await
    }
}

/// Reads any Cloudflare API answer: the envelope of a success, or the error it means. A `2xx`
/// with `success:false` is a failure classified by its codes; an error status is read through
/// the HTTP layer with Cloudflare's codes and messages, a rate-limit code making it retryable
/// whatever the status.
pub(crate) fn read_answer(
    http: &VendorHttp,
    label: &str,
    answer: &Answer,
) -> Result<wire::Envelope, Error> {
    let provider = http.provider();
    let envelope = wire::read_envelope(&answer.body);
    if answer.status.is_success() {
        let envelope = envelope.map_err(|message| Error::UnexpectedResponse {
            provider: provider.clone(),
            request: label.to_owned(),
            message,
        })?;
        if envelope.success {
            return Ok(envelope);
        }
        let f = wire::failure(&envelope.errors);
        let status = answer.status.as_u16();
        return Err(match f.class {
            wire::Class::Auth => Error::Auth {
                provider: provider.clone(),
                request: label.to_owned(),
                status,
                message: f.message,
            },
            class => Error::Vendor {
                provider: provider.clone(),
                request: label.to_owned(),
                status,
                code: f.code,
                message: f.message,
                retryable: class == wire::Class::RateLimited,
                retry_after: parse_retry_after(&answer.headers),
            },
        });
    }
    let (class, code, message) = match envelope {
        Ok(e) => {
            let f = wire::failure(&e.errors);
            (Some(f.class), f.code, f.message)
        }
        Err(_) => (None, None, answer.text().chars().take(300).collect()),
    };
    let err = http.status_error(label, answer, code, message);
    Err(with_retry_advice(
        err,
        class == Some(wire::Class::RateLimited),
        None,
    ))
}

/// Why `item` cannot be purged as `kind`, if it cannot.
fn invalid_item(kind: &str, item: &str) -> Option<String> {
    if item.trim().is_empty() {
        return Some(format!("an empty item in a purge of {kind}"));
    }
    match kind {
        "urls" => {
            let ok = url::Url::parse(item)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
            (!ok).then(|| format!("{item:?} is not a full URL; write https://www.example.com/path"))
        }
        "hosts" => (item.contains('/') || item.contains(':')).then(|| {
            format!("{item:?} is not a hostname; write www.example.com (no scheme, no path)")
        }),
        "prefixes" => item.contains("://").then(|| {
            format!("prefix {item:?} has a scheme; write www.example.com/path (no scheme)")
        }),
        _ => None,
    }
}

#[async_trait]
impl Purger for CloudflarePurger {
    fn provider(&self) -> &ProviderId {
        &self.id
    }

    /// What this purger can purge and how it is paced.
    fn pacing(&self) -> Pacing {
        let b = self.limits.budgets();
        let items = Some(KindPacing::new(self.limits.items_per_request, b.clone()));
        Pacing::default()
            .with_kind(
                &PurgeScope::Urls(Vec::new()),
                Some(KindPacing::new(
                    self.limits.urls_per_request,
                    self.limits.url_budgets(),
                )),
            )
            .with_kind(&PurgeScope::Tags(Vec::new()), items.clone())
            .with_kind(&PurgeScope::Hosts(Vec::new()), items.clone())
            .with_kind(&PurgeScope::Prefixes(Vec::new()), items)
            .with_kind(&PurgeScope::Everything, Some(KindPacing::new(1, b)))
            .with_soft(false, false)
    }

    /// Checks `request` without sending anything: no soft purge, every item well formed for
    /// its kind. [`Purger::purge`] does this first; the fan-out does it for every provider
    /// before sending to any.
    fn validate(&self, request: &PurgeRequest) -> Result<(), Error> {
        if let Err(feature) = self.pacing().check(request) {
            return Err(Error::Unsupported {
                provider: self.id.clone(),
                feature: format!(
                    "{feature} (Cloudflare always evicts; send the purge with soft = false)"
                ),
            });
        }
        let kind = request.scope.kind();
        match request
            .scope
            .items()
            .iter()
            .find_map(|i| invalid_item(kind, i))
        {
            Some(why) => Err(self.invalid(format!("{why}; nothing was purged"))),
            None => Ok(()),
        }
    }

    async fn purge(&self, request: &PurgeRequest) -> Result<PurgeReceipt, Error> {
        let watch = Stopwatch::start();
        self.validate(request)?;
        let pacing = self.pacing();
        let kind = request.scope.kind();
        if matches!(request.scope, PurgeScope::Everything) {
            let acked = Acked::one(self.send(kind, Vec::new()).await?);
            return Ok(acked.receipt(&self.id, 0, watch));
        }
        let per_request = pacing
            .for_scope(&request.scope)
            .map_or(MAX_ITEMS_PER_REQUEST, |k| k.per_request);
        let batches = chunks(request.scope.items(), per_request);
        let items: usize = batches.iter().map(Vec::len).sum();
        let acked = send_batches(batches, self.in_flight, |batch| self.send(kind, batch)).await?;
        Ok(acked.receipt(&self.id, items, watch))
    }
}

impl Provider for CloudflarePurger {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn kind(&self) -> ProviderKind {
        ProviderKind::Cloudflare
    }

    fn edge_host(&self) -> &str {
        &self.edge_host
    }
}
