use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::Error;
use crate::id::{ProviderId, RegionId};
use crate::served_by::ServedBy;

/// What to probe: a real object fetched through one provider's edge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Target {
    /// The provider whose edge is probed.
    pub provider: ProviderId,
    /// The URL to fetch: the edge hostname and the object's path
    /// (`https://example.map.fastly.net/_health/v3.txt`).
    pub url: String,
    /// The site's hostname, sent as `Host` so the edge applies the site's configuration.
    pub host: Option<String>,
    /// Statuses that count as a pass (usually just 200).
    pub expect_status: Vec<u16>,
    /// A string the body must contain (`healthy-v3`): a 200 with an error page fails.
    pub expect_body: String,
    /// The deadline for the whole fetch.
    #[serde(with = "crate::policy::units::duration_ms")]
    pub timeout: Duration,
}

impl Target {
    /// A target expecting `200` and `expect_body`, with the default 3 s deadline.
    pub fn new(
        provider: ProviderId,
        url: impl Into<String>,
        expect_body: impl Into<String>,
    ) -> Target {
        Target {
            provider,
            url: url.into(),
            host: None,
            expect_status: vec![200],
            expect_body: expect_body.into(),
            timeout: Duration::from_secs(3),
        }
    }

    /// Sends `Host: host`.
    pub fn with_host(mut self, host: impl Into<String>) -> Target {
        self.host = Some(host.into());
        self
    }

    /// Sets the deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Target {
        self.timeout = timeout;
        self
    }

    /// Sets the statuses that pass.
    pub fn with_expect_status(mut self, statuses: Vec<u16>) -> Target {
        self.expect_status = statuses;
        self
    }
}

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailReason {
    /// No complete answer before the deadline.
    Timeout,
    /// The TCP connection failed (refused, unreachable, DNS).
    Connect {
        /// What the transport said.
        detail: String,
    },
    /// The TLS handshake failed (certificate, protocol).
    Tls {
        /// What the TLS layer said.
        detail: String,
    },
    /// The status was not one of those expected.
    Status {
        /// What came back.
        got: u16,
    },
    /// The status was fine but the body lacked the expected string: an error page.
    ContentMismatch {
        /// The string that was missing.
        expected: String,
    },
    /// The body could not be read.
    Body {
        /// What went wrong.
        detail: String,
    },
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailReason::Timeout => f.write_str("timeout"),
            FailReason::Connect { detail } => write!(f, "connect: {detail}"),
            FailReason::Tls { detail } => write!(f, "tls: {detail}"),
            FailReason::Status { got } => write!(f, "status {got}"),
            FailReason::ContentMismatch { expected } => {
                write!(f, "content mismatch: body lacks {expected:?}")
            }
            FailReason::Body { detail } => write!(f, "body: {detail}"),
        }
    }
}

/// Pass or fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// Expected status and content.
    Pass,
    /// Anything else, with the reason.
    Fail {
        /// Why.
        reason: FailReason,
    },
}

impl Outcome {
    /// True for a pass.
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Pass)
    }
}

/// One probe of one target from one runner. Serialisable, so runners in other regions can feed
/// a quorum through any transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Observation {
    /// The provider probed.
    pub provider: ProviderId,
    /// The runner (region) that probed it.
    pub runner: RegionId,
    /// When the probe started.
    pub at: Timestamp,
    /// Pass or fail, with the reason.
    pub outcome: Outcome,
    /// How long it took (to the deadline, for a timeout).
    #[serde(with = "crate::policy::units::duration_ms")]
    pub latency: Duration,
    /// The HTTP status, when one came back.
    pub status: Option<u16>,
    /// Who served it, from `Server-Timing` or the vendor headers.
    pub served_by: Option<ServedBy>,
}

impl Observation {
    /// An observation.
    pub fn new(
        provider: ProviderId,
        runner: RegionId,
        at: Timestamp,
        outcome: Outcome,
        latency: Duration,
    ) -> Observation {
        Observation {
            provider,
            runner,
            at,
            outcome,
            latency,
            status: None,
            served_by: None,
        }
    }

    /// Sets the HTTP status.
    pub fn with_status(mut self, status: u16) -> Observation {
        self.status = Some(status);
        self
    }

    /// Sets who served it.
    pub fn with_served_by(mut self, served_by: Option<ServedBy>) -> Observation {
        self.served_by = served_by;
        self
    }

    /// True for a pass.
    pub fn passed(&self) -> bool {
        self.outcome.passed()
    }
}

/// [`HealthCheck`] probes one target once. It keeps no state: quorum and hysteresis decide.
///
/// A failed probe is an `Ok(Observation)` with [`Outcome::Fail`]; `Err` is for a check that
/// could not run at all (an invalid target).
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait HealthCheck: fmt::Debug + Send + Sync {
    /// Probes `target` once.
    async fn check(&self, target: &Target) -> Result<Observation, Error>;
}

#[async_trait]
impl<T: HealthCheck + ?Sized> HealthCheck for Arc<T> {
    async fn check(&self, target: &Target) -> Result<Observation, Error> {
        (**self).check(target).await
    }
}
