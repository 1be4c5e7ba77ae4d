//! Akamai: Fast Purge v3, by URL, by cache tag, and by CP code, on the staging or the
//! production network, every request signed with EdgeGrid ([`edgegrid`]).
//!
//! - A soft purge is an **invalidate** (objects are marked stale and revalidated with the
//!   origin); a hard one a **delete** (objects are removed).
//! - [`PurgeScope::Tags`] purges cache tags; [`PurgeScope::Everything`] purges the CP codes
//!   the policy lists (`cp_codes`), and is refused when it lists none;
//!   [`AkamaiPurger::purge_cp_codes`] purges others. Fast Purge has no purge by hostname or
//!   prefix: those are refused with [`Error::Unsupported`] before anything is sent.
//! - Requests carry as many objects as fit in Fast Purge's 50,000-byte body and its
//!   per-type bucket; pacing follows [`AkamaiLimits`].
//! - Errors are read from Akamai's problem-details envelope: the code is the last segment
//!   of `type` (`deny`) or the `title`, the message `title: detail (supportId ...)`. A 429
//!   without `Retry-After` waits the five seconds Akamai's documentation asks for.

pub mod edgegrid;
mod limits;
pub(crate) mod wire;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use multicdn_core::policy::{AkamaiNetwork, ProviderSpec};
use multicdn_core::{
    Clock, Error, KindPacing, Pacing, Provider, ProviderId, ProviderKind, PurgeReceipt,
    PurgeRequest, PurgeScope, Purger, Secret, Stopwatch, SystemClock,
};
use reqwest::Method;
use serde_json::{Value, json};

pub use edgegrid::{EdgeGridCredentials, EdgeGridSigner, NonceSource};
pub use limits::{AkamaiLimits, MAX_BODY_BYTES};

use crate::http::batch::{dedupe, send_batches};
use crate::http::{
    Answer, HttpSettings, Pacer, Sent, VendorHttp, secret_header, with_retry_advice,
};
use crate::spec::required_field;

/// Requests one purge sends at once by default.
const DEFAULT_IN_FLIGHT: usize = 4;

/// The wait Akamai asks for after a 429 that names none ("Wait five seconds, then retry",
/// techdocs.akamai.com/purge-cache/reference/429).
const RATE_LIMIT_WAIT: Duration = Duration::from_secs(5);

/// What a purge removes or marks, as Fast Purge's paths write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Objects {
    Urls,
    Tags,
    CpCodes,
}

impl Objects {
    fn segment(self) -> &'static str {
        match self {
            Objects::Urls => "url",
            Objects::Tags => "tag",
            Objects::CpCodes => "cpcode",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Objects::Urls => "urls",
            Objects::Tags => "tags",
            Objects::CpCodes => "cp codes",
        }
    }
}

/// An Akamai API client's purger and provider description.
#[derive(Clone)]
pub struct AkamaiPurger {
    id: ProviderId,
    edge_host: String,
    network: AkamaiNetwork,
    cp_codes: Vec<u64>,
    signer: EdgeGridSigner,
    http: VendorHttp,
    clock: Arc<dyn Clock>,
    limits: AkamaiLimits,
    urls: Pacer,
    tags: Pacer,
    cp_code_budget: Pacer,
    in_flight: usize,
}

impl fmt::Debug for AkamaiPurger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AkamaiPurger")
            .field("id", &self.id)
            .field("edge_host", &self.edge_host)
            .field("network", &self.network)
            .field("cp_codes", &self.cp_codes)
            .field("signer", &self.signer)
            .field("http", &self.http)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Refuses what is not an EdgeGrid API host, naming the provider.
fn check_api_host(id: &ProviderId, host: &str) -> Result<(), Error> {
    let ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidRequest {
            provider: id.clone(),
            message: format!(
                "api host {host:?} is not an EdgeGrid API host (like akab-xxxxxxxxxxxxxxxx-xxxxxxxxxxxxxxxx.luna.akamaiapis.net, no scheme, no path)"
            ),
        })
    }
}

impl AkamaiPurger {
    /// A purger for the API client `credentials` at `api_host`, purging on `network`;
    /// `base_url` overrides `https://{api_host}` (HTTPS, or HTTP on loopback).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: ProviderId,
        edge_host: impl Into<String>,
        api_host: &str,
        network: AkamaiNetwork,
        cp_codes: Vec<u64>,
        credentials: EdgeGridCredentials,
        base_url: Option<&str>,
        settings: HttpSettings,
    ) -> Result<AkamaiPurger, Error> {
        check_api_host(&id, api_host)?;
        // The tokens travel in the Authorization header: refuse any a header cannot carry.
        secret_header(&id, credentials.client_token.expose())?;
        secret_header(&id, credentials.access_token.expose())?;
        let base = base_url.map_or_else(|| format!("https://{api_host}"), str::to_owned);
        let limits = AkamaiLimits::default();
        let http = VendorHttp::new(id.clone(), &base, settings)?
            .with_pacer(Pacer::new("akamai-requests", limits.requests));
        Ok(AkamaiPurger {
            edge_host: edge_host.into(),
            network,
            cp_codes,
            signer: EdgeGridSigner::new(credentials),
            http,
            clock: Arc::new(SystemClock),
            urls: Pacer::new("akamai-urls", limits.urls),
            tags: Pacer::new("akamai-tags", limits.tags),
            cp_code_budget: Pacer::new("akamai-cp-codes", limits.cp_codes),
            limits,
            in_flight: DEFAULT_IN_FLIGHT,
            id,
        })
    }

    /// A purger from the policy's provider entry (`kind: akamai`, `api_host`, `network`,
    /// `cp_codes`, `edge_host`), with `credentials`; `base_url` overrides the API address.
    pub fn from_spec(
        id: ProviderId,
        spec: &ProviderSpec,
        credentials: EdgeGridCredentials,
        base_url: Option<&str>,
        settings: HttpSettings,
    ) -> Result<AkamaiPurger, Error> {
        let api_host = required_field(
            &id,
            spec,
            ProviderKind::Akamai,
            "api_host",
            spec.api_host.as_ref(),
            "for an Akamai purger",
        )?;
        AkamaiPurger::new(
            id,
            spec.edge_host.clone(),
            &api_host,
            spec.network.unwrap_or_default(),
            spec.cp_codes.clone(),
            credentials,
            base_url,
            settings,
        )
    }

    /// [`AkamaiPurger::from_spec`], reading the credentials from the variables
    /// `client_token_env`, `client_secret_env` and `access_token_env` name.
    pub fn from_spec_env(
        id: ProviderId,
        spec: &ProviderSpec,
        base_url: Option<&str>,
        settings: HttpSettings,
    ) -> Result<AkamaiPurger, Error> {
        let credentials = credentials_from_env(&id, spec)?;
        AkamaiPurger::from_spec(id, spec, credentials, base_url, settings)
    }

    /// Replaces the budgets (fresh, full buckets) and the body size limit.
    pub fn with_limits(mut self, limits: AkamaiLimits) -> AkamaiPurger {
        self.http = self
            .http
            .with_pacer(Pacer::new("akamai-requests", limits.requests));
        self.urls = Pacer::new("akamai-urls", limits.urls);
        self.tags = Pacer::new("akamai-tags", limits.tags);
        self.cp_code_budget = Pacer::new("akamai-cp-codes", limits.cp_codes);
        self.limits = limits;
        self
    }

    /// Sets how many requests one purge sends at once (default 4).
    pub fn with_in_flight(mut self, n: usize) -> AkamaiPurger {
        self.in_flight = n.max(1);
        self
    }

    /// Reads the time requests are signed at from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> AkamaiPurger {
        self.http = self.http.with_clock(clock.clone());
        self.clock = clock;
        self
    }

    /// Takes the signatures' nonces from `nonce` (for tests; each must be fresh).
    pub fn with_nonce_source(mut self, nonce: NonceSource) -> AkamaiPurger {
        self.signer = self.signer.with_nonce_source(nonce);
        self
    }

    /// The budgets and body limit.
    pub fn limits(&self) -> &AkamaiLimits {
        &self.limits
    }

    /// The network purges go to.
    pub fn network(&self) -> AkamaiNetwork {
        self.network
    }

    /// The CP codes a purge of everything purges.
    pub fn cp_codes(&self) -> &[u64] {
        &self.cp_codes
    }

    /// Purges `cp_codes` (invalidates them when `soft`, deletes them otherwise).
    pub async fn purge_cp_codes(
        &self,
        cp_codes: &[u64],
        soft: bool,
    ) -> Result<PurgeReceipt, Error> {
        let watch = Stopwatch::start();
        if cp_codes.is_empty() || cp_codes.contains(&0) {
            return Err(self.invalid(format!(
                "CP codes {cp_codes:?}: give at least one, every one a positive number; nothing was purged"
            )));
        }
        let objects: Vec<Value> = cp_codes.iter().map(|c| json!(c)).collect();
        self.purge_objects(Objects::CpCodes, objects, soft, watch)
            .await
    }

    fn invalid(&self, message: String) -> Error {
        Error::InvalidRequest {
            provider: self.id.clone(),
            message,
        }
    }

    fn budget(&self, objects: Objects) -> &Pacer {
        match objects {
            Objects::Urls => &self.urls,
            Objects::Tags => &self.tags,
            Objects::CpCodes => &self.cp_code_budget,
        }
    }

    /// Objects a request of this type carries at most: what its bucket holds (a larger
    /// request could never be granted).
    fn max_objects(&self, objects: Objects) -> usize {
        usize::try_from(self.budget(objects).limit().burst.max(1)).unwrap_or(usize::MAX)
    }

    /// Splits `objects` into requests and sends them.
    async fn purge_objects(
        &self,
        kind: Objects,
        objects: Vec<Value>,
        soft: bool,
        watch: Stopwatch,
    ) -> Result<PurgeReceipt, Error> {
        let batches = wire::bodies(&objects, self.limits.max_body_bytes, self.max_objects(kind))
            .map_err(|m| self.invalid(format!("{m}; nothing was purged")))?;
        let items = objects.len();
        let acked = send_batches(
            batches
                .into_iter()
                .map(|b| vec![Value::Array(b).to_string()])
                .collect(),
            self.in_flight,
            |batch| async move {
                let objects = batch.into_iter().next().unwrap_or_default();
                self.send(kind, soft, objects).await
            },
        )
        .await?;
        Ok(acked.receipt(&self.id, items, watch))
    }

    /// Sends one purge request; `objects` is the JSON array of its objects.
    async fn send(
        &self,
        kind: Objects,
        soft: bool,
        objects: String,
    ) -> Result<Sent<Vec<String>>, Error> {
        let action = if soft { "invalidate" } else { "delete" };
        let path = format!(
            "/ccu/v3/{action}/{}/{}",
            kind.segment(),
            self.network.as_str()
        );
        let count = serde_json::from_str::<Vec<Value>>(&objects).map_or(0, |v| v.len());
        let label = format!("POST {path} ({count} {})", kind.plural());
        let body = format!("{{\"objects\":{objects}}}").into_bytes();
        let full = self.http.url(&path);
        let target =
            url::Url::parse(&full).map_err(|e| self.invalid(format!("cannot sign {full}: {e}")))?;
        let host = match (target.host_str(), target.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_owned(),
            (None, _) => return Err(self.invalid(format!("cannot sign {full}: no host"))),
        };
        let path_and_query = match target.query() {
            Some(q) => format!("{}?{q}", target.path()),
            None => target.path().to_owned(),
        };
        let cost = u32::try_from(count).unwrap_or(u32::MAX);
        self.http
            .send_paced(
                &label,
                &[(self.budget(kind), cost)],
                || {
                    let auth = self.signer.authorize(
                        &edgegrid::SignedRequest {
                            method: "POST",
                            scheme: target.scheme(),
                            host: &host,
                            path_and_query: &path_and_query,
                            headers: &[],
                            body: &body,
                        },
                        self.clock.now(),
                    );
                    let req = self
                        .http
                        .request(Method::POST, &path)
                        .header("Content-Type", "application/json")
                        .header("Accept", "application/json")
                        .body(body.clone());
                    // The tokens were checked at construction and the rest of the header is
                    // base64 and digits; a header that still cannot be built is sent without
                    // it, and Akamai's refusal is read as an authentication error.
                    match http::HeaderValue::from_str(&auth) {
                        Ok(mut v) => {
                            v.set_sensitive(true);
                            req.header("Authorization", v)
                        }
                        Err(_) => req,
                    }
                },
                |answer| self.read(&label, answer),
            )
            .await
    }

    /// Reads an answer into the purge id, or the error it means.
    fn read(&self, label: &str, answer: &Answer) -> Result<Vec<String>, Error> {
        if answer.status.is_success() {
            let (id, _) =
                wire::read_accepted(&answer.body).map_err(|message| Error::UnexpectedResponse {
                    provider: self.id.clone(),
                    request: label.to_owned(),
                    message,
                })?;
            return Ok(vec![id]);
        }
        let (code, message) = wire::problem(&answer.body);
        let err = self.http.status_error(label, answer, code, message);
        let limited = answer.status.as_u16() == 429;
        Err(with_retry_advice(
            err,
            limited,
            limited.then_some(RATE_LIMIT_WAIT),
        ))
    }
}

/// Reads the three EdgeGrid credentials from the variables the provider entry names.
pub fn credentials_from_env(
    id: &ProviderId,
    spec: &ProviderSpec,
) -> Result<EdgeGridCredentials, Error> {
    let read = |field: &str, var: Option<&String>| -> Result<Secret, Error> {
        let Some(var) = var.filter(|v| !v.is_empty()) else {
            return Err(Error::InvalidRequest {
                provider: id.clone(),
                message: format!(
                    "providers.{id}.{field} is not set; name the environment variable holding the EdgeGrid {}",
                    field.trim_end_matches("_env").replace('_', " ")
                ),
            });
        };
        Secret::from_env(var).ok_or_else(|| Error::InvalidRequest {
            provider: id.clone(),
            message: format!(
                "the environment variable {var} (providers.{id}.{field}) is unset or empty"
            ),
        })
    };
    Ok(EdgeGridCredentials {
        client_token: read("client_token_env", spec.client_token_env.as_ref())?,
        client_secret: read("client_secret_env", spec.client_secret_env.as_ref())?,
        access_token: read("access_token_env", spec.access_token_env.as_ref())?,
    })
}

#[async_trait]
impl Purger for AkamaiPurger {
    fn provider(&self) -> &ProviderId {
        &self.id
    }

    /// What this purger can purge and how it is paced. Items a request are an estimate (what
    /// fits in 50,000 bytes at about 100 bytes a URL and 40 a tag); the purger cuts by the
    /// body's real size.
    fn pacing(&self) -> Pacing {
        let per = |kind: Objects, typical: usize| {
            (self.limits.max_body_bytes / typical).clamp(1, self.max_objects(kind))
        };
        let urls = self.limits.budgets("akamai-urls", self.limits.urls);
        let tags = self.limits.budgets("akamai-tags", self.limits.tags);
        let cp = self.limits.budgets("akamai-cp-codes", self.limits.cp_codes);
        let everything = (!self.cp_codes.is_empty()).then(|| KindPacing::new(1, cp));
        Pacing::default()
            .with_kind(
                &PurgeScope::Urls(Vec::new()),
                Some(KindPacing::new(per(Objects::Urls, 100), urls)),
            )
            .with_kind(
                &PurgeScope::Tags(Vec::new()),
                Some(KindPacing::new(per(Objects::Tags, 40), tags)),
            )
            .with_kind(&PurgeScope::Everything, everything)
            .with_soft(true, true)
    }

    /// Checks `request` without sending anything: the kind is supported (everything only with
    /// `cp_codes`), every URL and tag is well formed.
    fn validate(&self, request: &PurgeRequest) -> Result<(), Error> {
        if let Err(feature) = self.pacing().check(request) {
            let why = if matches!(request.scope, PurgeScope::Everything) {
                format!(
                    "{feature} (list the CP codes to purge in providers.{}.cp_codes)",
                    self.id
                )
            } else {
                format!("{feature} (Akamai Fast Purge purges URLs, cache tags and CP codes)")
            };
            return Err(Error::Unsupported {
                provider: self.id.clone(),
                feature: why,
            });
        }
        let why = match &request.scope {
            PurgeScope::Urls(urls) => urls.iter().find_map(|u| wire::invalid_url(u)),
            PurgeScope::Tags(tags) => tags.iter().find_map(|t| wire::invalid_tag(t)),
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
        let strings = |items: &[String]| dedupe(items).into_iter().map(Value::String).collect();
        match &request.scope {
            PurgeScope::Urls(urls) => {
                self.purge_objects(Objects::Urls, strings(urls), soft, watch)
                    .await
            }
            PurgeScope::Tags(tags) => {
                self.purge_objects(Objects::Tags, strings(tags), soft, watch)
                    .await
            }
            PurgeScope::Everything => {
                let codes: Vec<Value> = self.cp_codes.iter().map(|c| json!(c)).collect();
                self.purge_objects(Objects::CpCodes, codes, soft, watch)
                    .await
            }
            other => Err(Error::Unsupported {
                provider: self.id.clone(),
                feature: format!("purge by {}", other.kind()),
            }),
        }
    }
}

impl Provider for AkamaiPurger {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn kind(&self) -> ProviderKind {
        ProviderKind::Akamai
    }

    fn edge_host(&self) -> &str {
        &self.edge_host
    }
}
