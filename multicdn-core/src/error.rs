//! The error every I/O trait returns: it says who failed, on which request, whether a retry
//! can help, and whether the call may already have taken effect.

use std::time::Duration;

use crate::id::ProviderId;

/// A failed call to a provider, a steerer or a probe.
///
/// Each variant carries what a caller needs to act: the provider, the request (method and path,
/// never a credential), the vendor's own code and message, and two flags:
/// [`Error::is_retryable`] and [`Error::may_have_applied`] (a purge or a weight change whose
/// answer was lost may still have happened).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The vendor answered with an error.
    #[error("{provider}: {request} failed with HTTP {status}{}: {message}", code.as_ref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Vendor {
        /// The provider.
        provider: ProviderId,
        /// `POST /zones/{zone}/purge_cache`.
        request: String,
        /// The HTTP status.
        status: u16,
        /// The vendor's own error code (`1012`, `InvalidChangeBatch`).
        code: Option<String>,
        /// The vendor's message.
        message: String,
        /// Whether repeating the same request can succeed.
        retryable: bool,
        /// How long the vendor asked us to wait.
        retry_after: Option<Duration>,
    },
    /// The credentials were refused (401/403). Never retried.
    #[error("{provider}: {request} was refused: authentication failed (HTTP {status}): {message}")]
    Auth {
        /// The provider.
        provider: ProviderId,
        /// The request.
        request: String,
        /// 401 or 403.
        status: u16,
        /// The vendor's message.
        message: String,
    },
    /// The vendor's rate limit was hit and retries did not outlast it.
    #[error("{provider}: {request} was rate limited{}", retry_after.map(|d| format!(" (retry after {d:?})")).unwrap_or_default())]
    RateLimited {
        /// The provider.
        provider: ProviderId,
        /// The request.
        request: String,
        /// When the vendor said to come back.
        retry_after: Option<Duration>,
    },
    /// No answer within the deadline. The request may have been applied.
    #[error("{provider}: {request} timed out after {after:?}; it may have been applied")]
    Timeout {
        /// The provider.
        provider: ProviderId,
        /// The request.
        request: String,
        /// The deadline.
        after: Duration,
    },
    /// The connection failed before a request was sent.
    #[error("{provider}: {request} could not connect: {message}")]
    Connect {
        /// The provider.
        provider: ProviderId,
        /// The request.
        request: String,
        /// What the transport said.
        message: String,
    },
    /// The connection broke after the request was sent, or the answer could not be read.
    #[error("{provider}: {request} failed in transit: {message}; it may have been applied")]
    Transport {
        /// The provider.
        provider: ProviderId,
        /// The request.
        request: String,
        /// What the transport said.
        message: String,
    },
    /// The vendor answered success in a shape this library does not understand.
    #[error("{provider}: {request} returned an unexpected answer: {message}")]
    UnexpectedResponse {
        /// The provider.
        provider: ProviderId,
        /// The request.
        request: String,
        /// What was wrong with it.
        message: String,
    },
    /// The request was refused before anything was sent.
    #[error("{provider}: invalid request, nothing was sent: {message}")]
    InvalidRequest {
        /// The provider.
        provider: ProviderId,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// The provider cannot do this at all (a soft purge-all on Fastly).
    #[error("{provider}: {feature} is not supported")]
    Unsupported {
        /// The provider.
        provider: ProviderId,
        /// The feature.
        feature: String,
    },
}

impl Error {
    /// The provider the error concerns.
    pub fn provider(&self) -> &ProviderId {
        match self {
            Error::Vendor { provider, .. }
            | Error::Auth { provider, .. }
            | Error::RateLimited { provider, .. }
            | Error::Timeout { provider, .. }
            | Error::Connect { provider, .. }
            | Error::Transport { provider, .. }
            | Error::UnexpectedResponse { provider, .. }
            | Error::InvalidRequest { provider, .. }
            | Error::Unsupported { provider, .. } => provider,
        }
    }

    /// Whether the same request may succeed if sent again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Vendor { retryable, .. } => *retryable,
            Error::RateLimited { .. }
            | Error::Timeout { .. }
            | Error::Connect { .. }
            | Error::Transport { .. } => true,
            _ => false,
        }
    }

    /// How long the vendor asked the caller to wait before retrying.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Vendor { retry_after, .. } | Error::RateLimited { retry_after, .. } => {
                *retry_after
            }
            _ => None,
        }
    }

    /// Whether the call may have taken effect even though it failed: the request was sent and
    /// its answer was lost, or the vendor failed after accepting it (5xx).
    pub fn may_have_applied(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::Transport { .. } | Error::UnexpectedResponse { .. } => {
                true
            }
            Error::Vendor { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// True for a refused credential.
    pub fn is_auth(&self) -> bool {
        matches!(self, Error::Auth { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> ProviderId {
        ProviderId::new("cloudflare").unwrap()
    }

    #[test]
    fn classifies_retry_and_may_have_applied() {
        let vendor = Error::Vendor {
            provider: p(),
            request: "POST /zones/z/purge_cache".into(),
            status: 502,
            code: None,
            message: "bad gateway".into(),
            retryable: true,
            retry_after: None,
        };
        assert!(vendor.is_retryable() && vendor.may_have_applied());
        let auth = Error::Auth {
            provider: p(),
            request: "POST /zones/z/purge_cache".into(),
            status: 401,
            message: "Invalid API Token".into(),
        };
        assert!(!auth.is_retryable() && !auth.may_have_applied() && auth.is_auth());
        assert!(auth.to_string().contains("authentication failed"));
        let timeout = Error::Timeout {
            provider: p(),
            request: "x".into(),
            after: Duration::from_secs(3),
        };
        assert!(timeout.may_have_applied());
    }

    #[test]
    fn vendor_errors_show_code_and_message() {
        let e = Error::Vendor {
            provider: p(),
            request: "POST /zones/z/purge_cache".into(),
            status: 200,
            code: Some("1012".into()),
            message: "Request must contain one of purge_everything, files, tags".into(),
            retryable: false,
            retry_after: None,
        };
        let s = e.to_string();
        assert!(s.contains("(1012)") && s.contains("purge_everything") && s.contains("cloudflare"));
    }
}
