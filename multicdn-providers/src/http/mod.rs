//! The one HTTP layer every vendor adapter shares: a reqwest client (rustls) with connect and
//! request timeouts, client-side pacing (`governor`), and retries with backoff and jitter
//! (`backon`) for what can be retried (429, 5xx, connection errors, timeouts), never for
//! 400/401/403. A vendor's `Retry-After` (or Fastly's `Fastly-RateLimit-Reset`) is honoured.
//!
//! Every failure becomes a [`multicdn_core::Error`] naming the provider and the request
//! (method and path, never a credential), with the vendor's code and message, and whether the
//! call may have applied. Vendors differ only in how an answer is read: each adapter passes a
//! `read` function that turns status, headers and body into a value or an error.
//!
//! Every error [`VendorHttp::send`] returns is redacted: the request's credential values, and
//! the value of any credential header a vendor echoes back (`Authorization`, `Fastly-Key`,
//! `X-NSONE-Key`, `X-Amz-Security-Token`, SigV4 signatures), read `[redacted]`.

mod base_url;
pub(crate) mod batch;
mod pace;
mod path;
mod redact;
mod retry_after;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use multicdn_core::{Clock, Error, ProviderId, SystemClock};
use reqwest::{Method, RequestBuilder, StatusCode};

pub use base_url::check_base_url;
pub use pace::{DEFAULT_PACE_MARGIN, Pacer};
pub use path::encode_segment;
pub use redact::{REDACTED, redact, redact_error, request_secrets};
pub use retry_after::{parse_fastly_reset, parse_retry_after};

/// Timeouts and retry settings.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HttpSettings {
    /// TCP + TLS connect deadline.
    pub connect_timeout: Duration,
    /// Whole-request deadline.
    pub request_timeout: Duration,
    /// Attempts per request, the first included (so 4 means up to 3 retries).
    pub max_attempts: u32,
    /// First backoff delay.
    pub min_backoff: Duration,
    /// Longest backoff delay (a vendor's `Retry-After` may ask for more, and is honoured up to
    /// `max_retry_after`).
    pub max_backoff: Duration,
    /// The longest `Retry-After` waited for; a longer one fails the call as rate limited.
    pub max_retry_after: Duration,
    /// The largest response body read, in bytes. The body is read chunk by chunk and a longer
    /// one (or a `Content-Length` above it) fails the call as an unexpected answer, so a
    /// runaway body never takes more memory than this.
    pub max_body_bytes: usize,
}

/// The default [`HttpSettings::max_body_bytes`]: 8 MiB, far above any answer the adapters
/// read (a Route 53 listing page, a Cloudflare ruleset, a Fastly batch purge).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

impl Default for HttpSettings {
    fn default() -> HttpSettings {
        HttpSettings {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            max_attempts: 4,
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(300),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

impl HttpSettings {
    /// Sets the whole-request deadline.
    pub fn with_request_timeout(mut self, d: Duration) -> HttpSettings {
        self.request_timeout = d;
        self
    }

    /// Sets the attempts per request.
    pub fn with_max_attempts(mut self, n: u32) -> HttpSettings {
        self.max_attempts = n.max(1);
        self
    }

    /// Sets the largest response body read.
    pub fn with_max_body_bytes(mut self, n: usize) -> HttpSettings {
        self.max_body_bytes = n;
        self
    }

    /// Sets the backoff range.
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> HttpSettings {
        self.min_backoff = min;
        self.max_backoff = max.max(min);
        self
    }
}

pub use multicdn_core::RateLimit;

/// What a vendor's answer was read as.
pub type ReadResult<T> = Result<T, Error>;

/// A vendor's answer, before it is read.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: StatusCode,
    /// The response headers.
    pub headers: http::HeaderMap,
    /// The body, read whole (vendor API answers are small).
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The outcome of a call: the value and how many attempts it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent<T> {
    /// What the answer was read as.
    pub value: T,
    /// Attempts made, the first included.
    pub attempts: u32,
}

/// One vendor's HTTP client: base URL, timeouts, retries and pacing.
#[derive(Clone)]
pub struct VendorHttp {
    provider: ProviderId,
    base: url::Url,
    client: reqwest::Client,
    settings: HttpSettings,
    pacer: Option<Pacer>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for VendorHttp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VendorHttp")
            .field("provider", &self.provider)
            .field("base", &self.base.as_str())
            .field("settings", &self.settings)
            .field("pacer", &self.pacer)
            .finish()
    }
}

impl VendorHttp {
    /// A client for `provider` at `base` (HTTPS, or HTTP on loopback only).
    pub fn new(
        provider: ProviderId,
        base: &str,
        settings: HttpSettings,
    ) -> Result<VendorHttp, Error> {
        let base = check_base_url(&provider, base)?;
        VendorHttp::build(provider, base, settings)
    }

    /// A client for a service that authenticates its callers by address (the origin shield's
    /// purge ACL) and is sent no credential, so plain HTTP is allowed to any host: the shield
    /// usually sits on a private network without TLS. Never use it for a vendor API.
    pub fn without_credentials(
        provider: ProviderId,
        base: &str,
        settings: HttpSettings,
    ) -> Result<VendorHttp, Error> {
        let base = url::Url::parse(base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or_else(|| Error::InvalidRequest {
                provider: provider.clone(),
                message: format!("base URL {base:?} is not an http:// or https:// URL"),
            })?;
        VendorHttp::build(provider, base, settings)
    }

    fn build(
        provider: ProviderId,
        base: url::Url,
        settings: HttpSettings,
    ) -> Result<VendorHttp, Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .timeout(settings.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("multicdn/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::InvalidRequest {
                provider: provider.clone(),
                message: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(VendorHttp {
            provider,
            base,
            client,
            settings,
            pacer: None,
            clock: Arc::new(SystemClock),
        })
    }

    /// Paces every request through a client-side token bucket.
    pub fn with_rate_limit(self, limit: RateLimit) -> VendorHttp {
        self.with_pacer(Pacer::new("client", limit))
    }

    /// Paces every request through `pacer`, which may be shared with other clients spending
    /// the same vendor budget.
    pub fn with_pacer(mut self, pacer: Pacer) -> VendorHttp {
        self.pacer = Some(pacer);
        self
    }

    /// Reads wall-clock time (for `Fastly-RateLimit-Reset`) from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> VendorHttp {
        self.clock = clock;
        self
    }

    /// The provider.
    pub fn provider(&self) -> &ProviderId {
        &self.provider
    }

    /// The rate limit in force, if any.
    pub fn rate_limit(&self) -> Option<RateLimit> {
        self.pacer.as_ref().map(Pacer::limit)
    }

    /// The settings.
    pub fn settings(&self) -> &HttpSettings {
        &self.settings
    }

    /// The full URL for `path` (which starts with `/`, relative to the base's path).
    pub fn url(&self, path: &str) -> String {
        let base = self.base.as_str().trim_end_matches('/');
        format!("{base}{path}")
    }

    /// Starts a request; `path` is relative to the base URL.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.client.request(method, self.url(path))
    }

    /// Sends the request `build` makes (called again for each attempt), reads the answer with
    /// `read`, and retries what can be retried. `label` names the request in errors
    /// (`POST /service/{id}/purge`): never put a credential in it.
    pub async fn send<T>(
        &self,
        label: &str,
        build: impl Fn() -> RequestBuilder,
        read: impl Fn(&Answer) -> ReadResult<T>,
    ) -> Result<Sent<T>, Error> {
        self.send_paced(label, &[], build, read).await
    }

    /// [`VendorHttp::send`], also drawing `cost` tokens from each of `budgets` before every
    /// attempt (a retry spends the vendor's budget as the first attempt did). Use it where a
    /// vendor counts some requests against a budget of their own (Fastly counts each purged key;
    /// Cloudflare's purge bucket is per plan).
    pub async fn send_paced<T>(
        &self,
        label: &str,
        budgets: &[(&Pacer, u32)],
        build: impl Fn() -> RequestBuilder,
        read: impl Fn(&Answer) -> ReadResult<T>,
    ) -> Result<Sent<T>, Error> {
        let mut delays = ExponentialBuilder::default()
            .with_jitter()
            .with_min_delay(self.settings.min_backoff)
            .with_max_delay(self.settings.max_backoff)
            .with_max_times(self.settings.max_attempts.saturating_sub(1) as usize)
            .build();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            if let Some(pacer) = &self.pacer {
                pacer.acquire(1).await;
            }
            for (pacer, cost) in budgets {
                pacer.acquire(*cost).await;
            }
            let (client, request) = build().build_split();
            let request = match request {
                Ok(r) => r,
                Err(e) => return Err(self.transport_error(label, &e)),
            };
            // The request's own credentials, to keep out of anything an error says.
            let secrets = request_secrets(request.headers());
            let outcome = match client.execute(request).await {
                Ok(response) => {
                    let status = response.status();
                    let headers = response.headers().clone();
                    match self.read_body(label, response).await {
                        Ok(body) => read(&Answer {
                            status,
                            headers,
                            body,
                        }),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(self.transport_error(label, &e)),
            };
            let err = match outcome {
                Ok(value) => return Ok(Sent { value, attempts }),
                Err(err) => redact_error(err, &secrets),
            };
            if !err.is_retryable() {
                return Err(err);
            }
            let Some(backoff) = delays.next() else {
                return Err(err);
            };
            let wait = match err.retry_after() {
                Some(asked) if asked > self.settings.max_retry_after => return Err(err),
                Some(asked) => asked.max(backoff),
                None => backoff,
            };
            tracing::debug!(provider = %self.provider, request = label, attempt = attempts, ?wait, error = %err, "retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// The body, chunk by chunk, refused once it passes `max_body_bytes`.
    async fn read_body(
        &self,
        label: &str,
        mut response: reqwest::Response,
    ) -> Result<Vec<u8>, Error> {
        let limit = self.settings.max_body_bytes;
        let too_big = |got: String| Error::UnexpectedResponse {
            provider: self.provider.clone(),
            request: label.to_owned(),
            message: format!(
                "the response body ({got}) is larger than the {limit} bytes this client reads; nothing more was read"
            ),
        };
        if let Some(n) = response.content_length()
            && n > limit as u64
        {
            return Err(too_big(format!("Content-Length {n}")));
        }
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len().saturating_add(chunk.len()) > limit {
                        return Err(too_big(format!("over {limit} bytes")));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Ok(body),
                Err(e) => return Err(self.transport_error(label, &e)),
            }
        }
    }

    fn transport_error(&self, label: &str, e: &reqwest::Error) -> Error {
        if e.is_timeout() {
            Error::Timeout {
                provider: self.provider.clone(),
                request: label.to_owned(),
                after: self.settings.request_timeout,
            }
        } else if e.is_connect() {
            Error::Connect {
                provider: self.provider.clone(),
                request: label.to_owned(),
                message: error_chain(e),
            }
        } else {
            Error::Transport {
                provider: self.provider.clone(),
                request: label.to_owned(),
                message: error_chain(e),
            }
        }
    }

    /// The common reading of an HTTP error status, for adapters to call after extracting the
    /// vendor's code and message: 401/403 -> [`Error::Auth`]; 429 -> retryable with the
    /// vendor's `Retry-After`; 5xx -> retryable; other 4xx -> not retryable.
    pub fn status_error(
        &self,
        label: &str,
        answer: &Answer,
        code: Option<String>,
        message: String,
    ) -> Error {
        let status = answer.status.as_u16();
        // Fastly sends `Fastly-RateLimit-Reset` on every counted request, so it is advice to
        // wait only when the limit is what refused the call: on 429, or with none remaining.
        let limited = status == 429
            || answer
                .headers
                .get("fastly-ratelimit-remaining")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim() == "0");
        let retry_after = parse_retry_after(&answer.headers).or_else(|| {
            limited
                .then(|| parse_fastly_reset(&answer.headers, self.clock.now()))
                .flatten()
        });
        match status {
            401 | 403 => Error::Auth {
                provider: self.provider.clone(),
                request: label.to_owned(),
                status,
                message,
            },
            _ => Error::Vendor {
                provider: self.provider.clone(),
                request: label.to_owned(),
                status,
                code,
                message,
                retryable: status == 429 || status >= 500,
                retry_after,
            },
        }
    }
}

/// A header value carrying a credential, marked sensitive so the HTTP stack never prints it.
/// `Err` (naming the provider, never the value) when the credential holds characters a header
/// cannot carry, such as a newline from a badly quoted variable.
pub fn secret_header(provider: &ProviderId, value: &str) -> Result<http::HeaderValue, Error> {
    let mut v = http::HeaderValue::from_str(value).map_err(|_| Error::InvalidRequest {
        provider: provider.clone(),
        message: "the API token holds characters an HTTP header cannot carry (a newline or a quote from the environment?)".to_owned(),
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// `err` with a vendor's own retry advice added: made retryable when `retryable`, and given
/// `retry_after` when it has no wait of its own. Only a vendor error carries advice; any other
/// error is returned as it is.
pub(crate) fn with_retry_advice(
    err: Error,
    retryable: bool,
    retry_after: Option<Duration>,
) -> Error {
    match err {
        Error::Vendor {
            provider,
            request,
            status,
            code,
            message,
            retryable: was_retryable,
            retry_after: was_after,
        } => Error::Vendor {
            provider,
            request,
            status,
            code,
            message,
            retryable: was_retryable || retryable,
            retry_after: was_after.or(retry_after),
        },
        other => other,
    }
}

/// The error and its sources, joined: reqwest's top-level message alone hides the cause.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_advice_is_added_to_vendor_errors_only() {
        let p = ProviderId::new("cdn").unwrap();
        let vendor = Error::Vendor {
            provider: p.clone(),
            request: "POST /x".into(),
            status: 400,
            code: Some("Throttling".into()),
            message: "slow down".into(),
            retryable: false,
            retry_after: None,
        };
        let wait = Some(Duration::from_secs(2));
        let amended = with_retry_advice(vendor.clone(), true, wait);
        assert!(amended.is_retryable());
        assert_eq!(amended.retry_after(), wait);
        // No advice: unchanged.
        assert!(!with_retry_advice(vendor, false, None).is_retryable());
        let auth = Error::Auth {
            provider: p,
            request: "POST /x".into(),
            status: 401,
            message: "no".into(),
        };
        assert!(!with_retry_advice(auth, true, wait).is_retryable());
    }

    #[test]
    fn ideal_time_counts_only_what_the_bucket_cannot_absorb() {
        let pro = RateLimit::new(5.0, 25);
        assert_eq!(pro.ideal_time(25), Duration::ZERO);
        assert_eq!(pro.ideal_time(40), Duration::from_secs(3));
        let free = RateLimit::new(5.0 / 60.0, 25);
        assert_eq!(free.ideal_time(30), Duration::from_secs(60));
    }
}
