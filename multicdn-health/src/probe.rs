//! The HTTP content probe: one real object fetched through one CDN's edge, judged by status
//! **and** content (seed 000, section 9).
//!
//! A 503 fails, and so does a 200 whose body is an error page: the probe passes only when the
//! status is expected and the first bytes of the body (64 KiB by default) contain the expected
//! string. It sends `Cache-Control: no-cache`, the site's `Host`, never follows a redirect, and
//! gives up at the target's deadline. A failed probe is an observation saying why (timeout,
//! connect, TLS, status, content mismatch), with its latency and who served it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use multicdn_core::{
    Clock, Error, FailReason, HealthCheck, Observation, Outcome, RegionId, Stopwatch, SystemClock,
    Target, served_by,
};
use reqwest::header::{CACHE_CONTROL, HeaderValue};

use crate::error::HealthError;
use crate::http;

/// How much of the body is searched by default: 64 KiB.
pub const DEFAULT_MAX_BODY: usize = 64 * 1024;

/// A probe's default deadline, as [`Target::new`] sets it: 3 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// A [`HealthCheck`] that fetches a target over HTTP from one runner (region).
///
/// ```no_run
/// use multicdn_core::{HealthCheck, ProviderId, RegionId, Target};
/// use multicdn_health::HttpProbe;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let probe = HttpProbe::new(RegionId::new("eu-west")?)?;
/// let target = Target::new(ProviderId::new("fastly")?, "https://example.map.fastly.net/_health/v3.txt", "healthy-v3")
///     .with_host("www.example.com");
/// let seen = probe.check(&target).await?;
/// println!("{} {:?} in {:?}", seen.provider, seen.outcome, seen.latency);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct HttpProbe {
    client: reqwest::Client,
    runner: RegionId,
    clock: Arc<dyn Clock>,
    max_body: usize,
}

impl HttpProbe {
    /// A probe for `runner` with the system clock, a 64 KiB body limit and a client pooling up
    /// to 64 idle connections per edge.
    pub fn new(runner: RegionId) -> Result<HttpProbe, HealthError> {
        HttpProbe::builder(runner).build()
    }

    /// A probe with chosen settings.
    pub fn builder(runner: RegionId) -> HttpProbeBuilder {
        HttpProbeBuilder {
            runner,
            clock: Arc::new(SystemClock),
            max_body: DEFAULT_MAX_BODY,
            pool_idle_per_host: 64,
            client: None,
        }
    }

    /// The runner this probe speaks for.
    pub fn runner(&self) -> &RegionId {
        &self.runner
    }

    async fn fetch(
        &self,
        target: &Target,
        url: reqwest::Url,
        host: Option<&HeaderValue>,
    ) -> (Outcome, Option<u16>, Option<multicdn_core::ServedBy>) {
        let req = self
            .client
            .get(url)
            .header(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        let mut resp = match http::with_host(req, host).send().await {
            Ok(r) => r,
            Err(e) => return (fail(http::classify(&e)), None, None),
        };
        let status = resp.status().as_u16();
        let served = served_by(resp.headers());
        if !target.expect_status.contains(&status) {
            return (
                fail(FailReason::Status { got: status }),
                Some(status),
                served,
            );
        }
        let outcome = match http::read_prefix(
            &mut resp,
            self.max_body,
            target.expect_body.as_bytes(),
        )
        .await
        {
            Ok((_, true)) => Outcome::Pass,
            Ok((_, false)) => fail(FailReason::ContentMismatch {
                expected: target.expect_body.clone(),
            }),
            Err(e) => fail(match http::classify(&e) {
                r @ (FailReason::Timeout | FailReason::Body { .. }) => r,
                other => FailReason::Body {
                    detail: other.to_string(),
                },
            }),
        };
        (outcome, Some(status), served)
    }
}

fn fail(reason: FailReason) -> Outcome {
    Outcome::Fail { reason }
}

#[async_trait]
impl HealthCheck for HttpProbe {
    async fn check(&self, target: &Target) -> Result<Observation, Error> {
        let invalid = |message: String| Error::InvalidRequest {
            provider: target.provider.clone(),
            message,
        };
        let url = reqwest::Url::parse(&target.url).map_err(|e| {
            invalid(format!(
                "target URL {:?} is not a URL ({e}): write https://edge.example.net/_health/v3.txt",
                target.url
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "target URL {:?} is not http or https",
                target.url
            )));
        }
        let host = http::host_header(target.host.as_deref()).map_err(invalid)?;

        let at = self.clock.now();
        let watch = Stopwatch::start();
        let fetched =
            tokio::time::timeout(target.timeout, self.fetch(target, url, host.as_ref())).await;
        let (outcome, status, served, latency) = match fetched {
            Ok((outcome, status, served)) => (outcome, status, served, watch.elapsed()),
            // A timeout's latency is the deadline, whatever the wall clock says.
            Err(_) => (fail(FailReason::Timeout), None, None, target.timeout),
        };
        let mut o = Observation::new(
            target.provider.clone(),
            self.runner.clone(),
            at,
            outcome,
            latency,
        )
        .with_served_by(served);
        if let Some(s) = status {
            o = o.with_status(s);
        }
        Ok(o)
    }
}

/// Settings for an [`HttpProbe`].
#[derive(Debug)]
pub struct HttpProbeBuilder {
    runner: RegionId,
    clock: Arc<dyn Clock>,
    max_body: usize,
    pool_idle_per_host: usize,
    client: Option<reqwest::Client>,
}

impl HttpProbeBuilder {
    /// The clock that stamps observations (default: the system clock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> HttpProbeBuilder {
        self.clock = Arc::new(clock);
        self
    }

    /// The clock that stamps observations, shared.
    pub fn shared_clock(mut self, clock: Arc<dyn Clock>) -> HttpProbeBuilder {
        self.clock = clock;
        self
    }

    /// How many bytes of the body to search for the expected string (default 64 KiB). An
    /// expected string further in counts as missing.
    pub fn max_body_bytes(mut self, bytes: usize) -> HttpProbeBuilder {
        self.max_body = bytes;
        self
    }

    /// Idle connections kept per edge (default 64): at least the monitor's concurrency, so a
    /// round reuses warm connections.
    pub fn pool_idle_per_host(mut self, n: usize) -> HttpProbeBuilder {
        self.pool_idle_per_host = n;
        self
    }

    /// Uses this client instead of building one. Give it `redirect::Policy::none()`: the probe
    /// judges the edge's own answer.
    pub fn client(mut self, client: reqwest::Client) -> HttpProbeBuilder {
        self.client = Some(client);
        self
    }

    /// The probe.
    pub fn build(self) -> Result<HttpProbe, HealthError> {
        if self.max_body == 0 {
            return Err(HealthError::config(
                "max_body_bytes",
                "must be at least 1 byte; 64 KiB is usual",
            ));
        }
        let client = match self.client {
            Some(c) => c,
            None => http::client(self.pool_idle_per_host, "multicdn-health-probe")?,
        };
        Ok(HttpProbe {
            client,
            runner: self.runner,
            clock: self.clock,
            max_body: self.max_body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use multicdn_core::ProviderId;

    #[test]
    fn the_default_deadline_is_the_one_targets_get() {
        let t = Target::new(
            ProviderId::new("fastly").unwrap(),
            "https://a.example.net/h",
            "ok",
        );
        assert_eq!(t.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn an_empty_body_limit_is_refused() {
        let e = HttpProbe::builder(RegionId::new("eu-west").unwrap())
            .max_body_bytes(0)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("max_body_bytes"), "{e}");
    }
}
