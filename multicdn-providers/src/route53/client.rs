//! The Route 53 API client: SigV4-signed requests (`aws-sigv4`) through the shared vendor
//! HTTP layer, XML in and out.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use multicdn_core::{Clock, Error, Observation, ProviderId, Secret, SystemClock};
use reqwest::Method;

use super::changes::Change;
use super::health::{HealthCheckSpec, observation};
use super::layout::{RecordSet, is_within, normalise_name};
use super::xml::{self, ChangeInfo, RawHealthCheckConfig};
use crate::http::{Answer, HttpSettings, ReadResult, VendorHttp, with_retry_advice};

/// Route 53's public endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://route53.amazonaws.com";

/// Route 53 signs for this region whatever the zone.
const SIGNING_REGION: &str = "us-east-1";

/// The service name in the credential scope.
const SIGNING_SERVICE: &str = "route53";

/// The most pages one listing reads before giving up.
const MAX_PAGES: usize = 10_000;

/// AWS credentials: an access key id, its secret, and an optional session token. `Debug`
/// shows only the key id's first four characters.
#[derive(Clone)]
pub struct AwsCredentials {
    access_key_id: Secret,
    secret_access_key: Secret,
    session_token: Option<Secret>,
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id: String = self.access_key_id.expose().chars().take(4).collect();
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &format!("{id}…"))
            .field("secret_access_key", &self.secret_access_key)
            .field("session_token", &self.session_token)
            .finish()
    }
}

impl AwsCredentials {
    /// Explicit credentials.
    pub fn new(access_key_id: impl Into<String>, secret_access_key: Secret) -> AwsCredentials {
        AwsCredentials {
            access_key_id: Secret::new(access_key_id),
            secret_access_key,
            session_token: None,
        }
    }

    /// Adds a session token (temporary credentials).
    pub fn with_session_token(mut self, token: Secret) -> AwsCredentials {
        self.session_token = Some(token);
        self
    }

    /// The standard variables: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, when set,
    /// `AWS_SESSION_TOKEN`.
    pub fn from_env() -> Result<AwsCredentials, Error> {
        AwsCredentials::from_lookup(Secret::from_env)
    }

    /// The same variables read through `lookup` (an empty value counts as unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<Secret>) -> Result<AwsCredentials, Error> {
        let read = |var: &str| lookup(var).filter(|s| !s.expose().is_empty());
        let missing = |var: &str| Error::InvalidRequest {
            provider: provider_id(),
            message: format!(
                "{var} is not set: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or pass credentials explicitly"
            ),
        };
        Ok(AwsCredentials {
            access_key_id: read("AWS_ACCESS_KEY_ID").ok_or_else(|| missing("AWS_ACCESS_KEY_ID"))?,
            secret_access_key: read("AWS_SECRET_ACCESS_KEY")
                .ok_or_else(|| missing("AWS_SECRET_ACCESS_KEY"))?,
            session_token: read("AWS_SESSION_TOKEN"),
        })
    }

    fn identity(&self) -> Identity {
        Credentials::new(
            self.access_key_id.expose(),
            self.secret_access_key.expose(),
            self.session_token.as_ref().map(|t| t.expose().to_owned()),
            None,
            "multicdn",
        )
        .into()
    }
}

/// The provider id Route 53 errors carry.
#[allow(clippy::expect_used)] // a constant that satisfies the id rules; covered by a test
pub fn provider_id() -> ProviderId {
    ProviderId::new("route53").expect("route53 is a valid provider id")
}

/// A hosted zone id without the `/hostedzone/` prefix.
pub fn bare_zone_id(id: &str) -> &str {
    id.trim_start_matches('/').trim_start_matches("hostedzone/")
}

/// Percent-encodes a query value (everything but unreserved characters), as SigV4 expects.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A health check as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingHealthCheck {
    /// Its id.
    pub id: String,
    /// The caller reference it was made with.
    pub caller_reference: String,
    /// Its configuration, when listed.
    pub config: Option<RawHealthCheckConfig>,
    /// `HealthCheckVersion`, which an update must name.
    pub version: Option<u64>,
}

/// A spec's check looked up by its caller reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheckLookup {
    /// The check wanted.
    pub spec: HealthCheckSpec,
    /// Its id, when it exists.
    pub id: Option<String>,
    /// Its `HealthCheckVersion`, when it exists.
    pub version: Option<u64>,
    /// What differs from the spec (`field: have -> want`), when it was edited since.
    pub differences: Vec<String>,
}

/// The Route 53 API.
#[derive(Clone)]
pub struct Route53Client {
    http: VendorHttp,
    credentials: AwsCredentials,
    clock: Arc<dyn Clock>,
    page_size: u32,
}

impl fmt::Debug for Route53Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route53Client")
            .field("http", &self.http)
            .field("credentials", &self.credentials)
            .field("page_size", &self.page_size)
            .finish()
    }
}

impl Route53Client {
    /// A client for `endpoint` ([`DEFAULT_ENDPOINT`] in production; HTTP only on loopback).
    pub fn new(
        endpoint: &str,
        credentials: AwsCredentials,
        settings: HttpSettings,
    ) -> Result<Route53Client, Error> {
        Ok(Route53Client {
            http: VendorHttp::new(provider_id(), endpoint, settings)?,
            credentials,
            clock: Arc::new(SystemClock),
            page_size: 300,
        })
    }

    /// Signs with times from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Route53Client {
        self.http = self.http.with_clock(clock.clone());
        self.clock = clock;
        self
    }

    /// Sets how many record sets a listing asks for per page (Route 53's `maxitems`, 1–300).
    pub fn with_page_size(mut self, n: u32) -> Route53Client {
        self.page_size = n.clamp(1, 300);
        self
    }

    fn sign(&self, method: &str, url: &str, body: &[u8]) -> Result<Vec<(String, String)>, String> {
        let identity = self.credentials.identity();
        let time = UNIX_EPOCH + Duration::from_millis(self.clock.now().as_millis());
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(SIGNING_REGION)
            .name(SIGNING_SERVICE)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| e.to_string())?
            .into();
        let request =
            SignableRequest::new(method, url, std::iter::empty(), SignableBody::Bytes(body))
                .map_err(|e| e.to_string())?;
        let (instructions, _signature) = sign(request, &params)
            .map_err(|e| e.to_string())?
            .into_parts();
        Ok(instructions
            .headers()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect())
    }

    /// Sends one signed request; `read` turns a 2xx answer into a value.
    async fn call<T>(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        read: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, Error> {
        let label = format!("{method} {}", path.split('?').next().unwrap_or(path));
        let url = self.http.url(path);
        let body = body.unwrap_or_default();
        // Sign once up front so a request that cannot be signed fails here, with nothing sent.
        self.sign(method.as_str(), &url, body.as_bytes())
            .map_err(|e| Error::InvalidRequest {
                provider: provider_id(),
                message: format!("{label} cannot be signed: {e}"),
            })?;
        let build = || {
            let mut request = self.http.request(method.clone(), path);
            // Signed again for every attempt, so the signature carries the attempt's time.
            match self.sign(method.as_str(), &url, body.as_bytes()) {
                Ok(headers) => {
                    for (k, v) in headers {
                        request = request.header(k, v);
                    }
                }
                Err(e) => {
                    tracing::warn!(request = %label, error = %e, "signing failed; Route 53 will refuse the request")
                }
            }
            if !body.is_empty() {
                request = request
                    .header("content-type", "application/xml")
                    .body(body.clone());
            }
            request
        };
        let read_answer = |answer: &Answer| -> ReadResult<T> {
            let text = answer.text();
            if answer.status.is_success() {
                return read(&text).map_err(|message| Error::UnexpectedResponse {
                    provider: provider_id(),
                    request: label.clone(),
                    message,
                });
            }
            Err(self.error(&label, answer, &text))
        };
        Ok(self.http.send(&label, build, read_answer).await?.value)
    }

    /// Route 53's error answer as an error: its code and every message; `Throttling` and
    /// `PriorRequestNotComplete` (HTTP 400) are marked retryable.
    fn error(&self, label: &str, answer: &Answer, text: &str) -> Error {
        let parsed = xml::parse_error(text);
        let message = if parsed.messages.is_empty() {
            let mut t: String = text.chars().take(300).collect();
            if t.is_empty() {
                t = format!("HTTP {}", answer.status.as_u16());
            }
            t
        } else {
            parsed.messages.join("; ")
        };
        let throttled = matches!(
            parsed.code.as_deref(),
            Some("Throttling" | "PriorRequestNotComplete")
        );
        let err = self.http.status_error(label, answer, parsed.code, message);
        with_retry_advice(err, throttled, None)
    }

    /// The record sets at `record` and every name under it, read page by page. A server that
    /// hands back the page it was asked past is an error, never a loop.
    pub async fn list_record_sets(
        &self,
        zone_id: &str,
        record: &str,
    ) -> Result<Vec<RecordSet>, Error> {
        let zone = bare_zone_id(zone_id);
        let record = normalise_name(record);
        let mut out = Vec::new();
        let mut start = (format!("{record}."), None::<String>, None::<String>);
        let mut asked: HashSet<(String, Option<String>, Option<String>)> = HashSet::new();
        for _ in 0..MAX_PAGES {
            asked.insert(start.clone());
            let mut path = format!(
                "/2013-04-01/hostedzone/{zone}/rrset?maxitems={}&name={}",
                self.page_size,
                encode(&start.0)
            );
            if let Some(t) = &start.1 {
                path.push_str(&format!("&type={}", encode(t)));
            }
            if let Some(i) = &start.2 {
                path.push_str(&format!("&identifier={}", encode(i)));
            }
            let page: xml::ListRecordSetsResponse = self
                .call(Method::GET, &path, None, |b| {
                    xml::parse(b, "ListResourceRecordSetsResponse")
                })
                .await?;
            let mut past = false;
            for raw in page.resource_record_sets.items {
                let set = raw.into_set();
                if !is_within(&set.name, &record) {
                    past = true;
                    break;
                }
                out.push(set);
            }
            if past || !page.is_truncated {
                return Ok(out);
            }
            let Some(name) = page.next_record_name else {
                return Err(self.unexpected(
                    "GET rrset",
                    "IsTruncated is true but NextRecordName is missing",
                ));
            };
            let next = (name, page.next_record_type, page.next_record_identifier);
            if asked.contains(&next) {
                return Err(self.unexpected(
                    "GET rrset",
                    &format!(
                        "the listing repeated a page (next record {} {} {}): stopping rather than looping",
                        next.0,
                        next.1.as_deref().unwrap_or("-"),
                        next.2.as_deref().unwrap_or("-")
                    ),
                ));
            }
            start = next;
        }
        Err(self.unexpected("GET rrset", &format!("more than {MAX_PAGES} pages")))
    }

    fn unexpected(&self, request: &str, message: &str) -> Error {
        Error::UnexpectedResponse {
            provider: provider_id(),
            request: request.to_owned(),
            message: message.to_owned(),
        }
    }

    /// Sends one change batch (applied completely or not at all).
    pub async fn change_record_sets(
        &self,
        zone_id: &str,
        comment: &str,
        changes: &[Change],
    ) -> Result<ChangeInfo, Error> {
        let zone = bare_zone_id(zone_id);
        let body = xml::change_batch(comment, changes);
        let r: xml::ChangeInfoResponse = self
            .call(
                Method::POST,
                &format!("/2013-04-01/hostedzone/{zone}/rrset/"),
                Some(body),
                |b| xml::parse(b, "ChangeResourceRecordSetsResponse"),
            )
            .await?;
        Ok(r.change_info)
    }

    /// A change's status (`PENDING`, `INSYNC`).
    pub async fn get_change(&self, change_id: &str) -> Result<ChangeInfo, Error> {
        let id = change_id
            .trim_start_matches('/')
            .trim_start_matches("change/");
        let r: xml::ChangeInfoResponse = self
            .call(
                Method::GET,
                &format!("/2013-04-01/change/{id}"),
                None,
                |b| xml::parse(b, "GetChangeResponse"),
            )
            .await?;
        Ok(r.change_info)
    }

    /// Polls a change every `poll` until it is `INSYNC`, for at most `timeout`.
    pub async fn wait_in_sync(
        &self,
        change_id: &str,
        timeout: Duration,
        poll: Duration,
    ) -> Result<ChangeInfo, Error> {
        let mut waited = Duration::ZERO;
        loop {
            let info = self.get_change(change_id).await?;
            if info.status == "INSYNC" {
                return Ok(info);
            }
            if waited >= timeout {
                return Err(Error::Timeout {
                    provider: provider_id(),
                    request: format!(
                        "GET /2013-04-01/change/{change_id} (waiting for INSYNC, still {})",
                        info.status
                    ),
                    after: timeout,
                });
            }
            let step = poll.max(Duration::from_millis(1));
            tokio::time::sleep(step).await;
            waited += step;
        }
    }

    /// Creates a public hosted zone and returns its id (without `/hostedzone/`).
    pub async fn create_hosted_zone(
        &self,
        name: &str,
        caller_reference: &str,
    ) -> Result<String, Error> {
        let body = xml::create_hosted_zone(name, caller_reference);
        let r: xml::CreateHostedZoneResponse = self
            .call(Method::POST, "/2013-04-01/hostedzone", Some(body), |b| {
                xml::parse(b, "CreateHostedZoneResponse")
            })
            .await?;
        Ok(bare_zone_id(&r.hosted_zone.id).to_owned())
    }

    /// Every health check: id and caller reference.
    pub async fn list_health_checks(&self) -> Result<Vec<(String, String)>, Error> {
        Ok(self
            .list_health_check_configs()
            .await?
            .into_iter()
            .map(|h| (h.id, h.caller_reference))
            .collect())
    }

    /// Every health check with its configuration and version, read page by page.
    pub async fn list_health_check_configs(&self) -> Result<Vec<ExistingHealthCheck>, Error> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        let mut asked: HashSet<Option<String>> = HashSet::new();
        for _ in 0..MAX_PAGES {
            asked.insert(marker.clone());
            let path = match &marker {
                Some(m) => format!("/2013-04-01/healthcheck?maxitems=100&marker={}", encode(m)),
                None => "/2013-04-01/healthcheck?maxitems=100".to_owned(),
            };
            let page: xml::ListHealthChecksResponse = self
                .call(Method::GET, &path, None, |b| {
                    xml::parse(b, "ListHealthChecksResponse")
                })
                .await?;
            out.extend(
                page.health_checks
                    .items
                    .into_iter()
                    .map(|h| ExistingHealthCheck {
                        id: h.id,
                        caller_reference: h.caller_reference,
                        config: h.health_check_config,
                        version: h.health_check_version,
                    }),
            );
            if !page.is_truncated {
                return Ok(out);
            }
            let next = page.next_marker;
            if next.is_none() || asked.contains(&next) {
                return Err(self.unexpected(
                    "GET healthcheck",
                    "the listing repeated a page or gave no NextMarker",
                ));
            }
            marker = next;
        }
        Err(self.unexpected("GET healthcheck", &format!("more than {MAX_PAGES} pages")))
    }

    /// Creates one health check and returns its id.
    pub async fn create_health_check(&self, spec: &HealthCheckSpec) -> Result<String, Error> {
        let body = xml::create_health_check(spec);
        let r: xml::HealthCheckResponse = self
            .call(Method::POST, "/2013-04-01/healthcheck", Some(body), |b| {
                xml::parse(b, "CreateHealthCheckResponse")
            })
            .await?;
        Ok(r.health_check.id)
    }

    /// Puts the check `id` (at `version`) back to `spec` (`UpdateHealthCheck`).
    pub async fn update_health_check(
        &self,
        id: &str,
        spec: &HealthCheckSpec,
        version: u64,
    ) -> Result<(), Error> {
        let body = xml::update_health_check(spec, version);
        let _: xml::HealthCheckResponse = self
            .call(
                Method::POST,
                &format!("/2013-04-01/healthcheck/{}", encode(id)),
                Some(body),
                |b| xml::parse(b, "UpdateHealthCheckResponse"),
            )
            .await?;
        Ok(())
    }

    /// Looks each spec's check up by its caller reference, writing nothing: its id when it
    /// exists, and what differs when it was edited since it was made.
    pub async fn find_health_checks(
        &self,
        specs: &[HealthCheckSpec],
    ) -> Result<Vec<HealthCheckLookup>, Error> {
        let existing = self.list_health_check_configs().await?;
        Ok(specs
            .iter()
            .map(|spec| {
                let reference = spec.caller_reference();
                let found = existing.iter().find(|h| h.caller_reference == reference);
                HealthCheckLookup {
                    spec: spec.clone(),
                    id: found.map(|h| h.id.clone()),
                    version: found.and_then(|h| h.version),
                    differences: found
                        .and_then(|h| h.config.as_ref())
                        .map(|c| spec.differences(c))
                        .unwrap_or_default(),
                }
            })
            .collect())
    }

    /// Makes sure every spec has a health check configured as it says and returns their ids
    /// by provider. A check whose caller reference already exists is reused (put back with
    /// `UpdateHealthCheck` if it was edited since), so provisioning twice creates once.
    pub async fn provision_health_checks(
        &self,
        specs: &[HealthCheckSpec],
    ) -> Result<BTreeMap<ProviderId, String>, Error> {
        let mut out = BTreeMap::new();
        for found in self.find_health_checks(specs).await? {
            let spec = &found.spec;
            let reference = spec.caller_reference();
            let id = match (found.id, found.version) {
                (Some(id), _) if found.differences.is_empty() => id,
                (Some(id), Some(version)) => {
                    tracing::warn!(provider = %spec.provider, check = %id, changed = %found.differences.join("; "), "health check edited since it was made; putting it back");
                    self.update_health_check(&id, spec, version).await?;
                    id
                }
                (Some(id), None) => {
                    return Err(Error::UnexpectedResponse {
                        provider: provider_id(),
                        request: "GET healthcheck".to_owned(),
                        message: format!(
                            "health check {id} ({reference}) differs from the policy ({}) and Route 53 gave no HealthCheckVersion to update it at",
                            found.differences.join("; ")
                        ),
                    });
                }
                (None, _) => match self.create_health_check(spec).await {
                    Ok(id) => id,
                    Err(Error::Vendor {
                        code: Some(code), ..
                    }) if code == "HealthCheckAlreadyExists" => {
                        let again = self.find_health_checks(std::slice::from_ref(spec)).await?;
                        again.into_iter().find_map(|f| f.id).ok_or_else(|| Error::InvalidRequest {
                            provider: provider_id(),
                            message: format!(
                                "a health check with caller reference {reference} existed and was deleted; Route 53 never reuses a reference: change the check's configuration or create it by hand"
                            ),
                        })?
                    }
                    Err(e) => return Err(e),
                },
            };
            out.insert(spec.provider.clone(), id);
        }
        Ok(out)
    }

    /// Each checker's latest report on each provider's check, as observations for the health
    /// quorum (one per checker region; the runner is `route53-<region>`).
    pub async fn health_observations(
        &self,
        checks: &BTreeMap<ProviderId, String>,
        expected: &str,
    ) -> Result<Vec<Observation>, Error> {
        let now = self.clock.now();
        let mut out = Vec::new();
        for (provider, id) in checks {
            let r: xml::HealthCheckStatusResponse = self
                .call(
                    Method::GET,
                    &format!("/2013-04-01/healthcheck/{id}/status"),
                    None,
                    |b| xml::parse(b, "GetHealthCheckStatusResponse"),
                )
                .await?;
            out.extend(
                r.health_check_observations
                    .items
                    .iter()
                    .filter_map(|raw| observation(provider, expected, raw, now)),
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_print_their_secret() {
        let c = AwsCredentials::new("AKIAEXAMPLEKEY", Secret::new("s3cr3t"))
            .with_session_token(Secret::new("tok"));
        let s = format!("{c:?}");
        assert!(
            !s.contains("s3cr3t") && !s.contains("tok\"") && !s.contains("EXAMPLEKEY"),
            "{s}"
        );
        assert!(s.contains("AKIA"));
    }

    #[test]
    fn signatures_match_botocores_for_the_same_requests() {
        // Reference values computed with botocore's SigV4Auth for the same credentials,
        // time, method, URL and body.
        let clock = multicdn_core::ManualClock::new(
            multicdn_core::Timestamp::parse_rfc3339("2026-11-30T12:00:00Z").unwrap(),
        );
        let creds = AwsCredentials::new(
            "AKIDEXAMPLE",
            Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
        );
        let client = Route53Client::new(DEFAULT_ENDPOINT, creds, HttpSettings::default())
            .unwrap()
            .with_clock(Arc::new(clock));
        let auth = |method: &str, url: &str, body: &[u8]| -> String {
            let headers = client.sign(method, url, body).unwrap();
            let date = headers.iter().find(|(k, _)| k == "x-amz-date").unwrap();
            assert_eq!(date.1, "20261130T120000Z");
            headers
                .into_iter()
                .find(|(k, _)| k == "authorization")
                .unwrap()
                .1
        };
        let scope = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/us-east-1/route53/aws4_request, SignedHeaders=host;x-amz-date, Signature=";
        assert_eq!(
            auth(
                "GET",
                "https://route53.amazonaws.com/2013-04-01/hostedzone/Z1/rrset?maxitems=300&name=www.example.com.",
                b""
            ),
            format!("{scope}fbe1a91d8a7f7f5ae30681513acef044ca313ca3175ac5f075b0931bd3321d19")
        );
        assert_eq!(
            auth(
                "POST",
                "https://route53.amazonaws.com/2013-04-01/hostedzone/Z1/rrset/",
                b"<x>body</x>"
            ),
            format!("{scope}4307f02171ddd680716cbc28f55a5e67856f2e758cdd3a8e8cc863bdc5db1aa7")
        );
    }

    #[test]
    fn credentials_come_from_the_standard_variables() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| Secret::new(*v))
            }
        };
        let c = AwsCredentials::from_lookup(env(&[
            ("AWS_ACCESS_KEY_ID", "AKIA1"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_SESSION_TOKEN", "t"),
        ]))
        .unwrap();
        assert_eq!(c.session_token.as_ref().map(Secret::expose), Some("t"));
        let e = AwsCredentials::from_lookup(env(&[
            ("AWS_ACCESS_KEY_ID", "AKIA1"),
            ("AWS_SECRET_ACCESS_KEY", ""),
        ]))
        .unwrap_err();
        assert!(
            e.to_string().contains("AWS_SECRET_ACCESS_KEY is not set"),
            "{e}"
        );
        assert_eq!(provider_id().as_str(), "route53");
    }

    #[test]
    fn query_values_are_percent_encoded_for_signing() {
        assert_eq!(encode("www.example.com."), "www.example.com.");
        assert_eq!(encode("a b*c/"), "a%20b%2Ac%2F");
        assert_eq!(bare_zone_id("/hostedzone/Z123"), "Z123");
    }
}
