//! The one error this crate returns, for everything that is not a probe's verdict.
//!
//! A failed probe is not an error: it is an [`Observation`](multicdn_core::Observation) whose
//! outcome says why. These are the failures around the probes: a configuration that cannot
//! work, an observation about a provider nobody monitors, an HTTP client that cannot be built.

use multicdn_core::ProviderId;

/// What went wrong, and what would be valid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HealthError {
    /// A setting cannot work.
    #[error("invalid setting {setting}: {message}")]
    Config {
        /// The setting (`quorum`, `concurrency`, `targets`).
        setting: &'static str,
        /// What is wrong, and what would be valid.
        message: String,
    },
    /// An edge's base URL (from the policy or an override) is not usable.
    #[error("{provider}: edge base URL {url:?} is not usable: {message}")]
    EdgeUrl {
        /// The provider.
        provider: ProviderId,
        /// The URL as given.
        url: String,
        /// What is wrong, and what would be valid.
        message: String,
    },
    /// An observation or a command named a provider that is not monitored.
    #[error("unknown provider {provider}: monitored providers are {known}")]
    UnknownProvider {
        /// The provider named.
        provider: ProviderId,
        /// The providers that are monitored, comma separated.
        known: String,
    },
    /// A probe could not run at all (an invalid target), so it cast no vote.
    #[error("probe of {provider} could not run: {source}")]
    Check {
        /// The provider whose target was probed.
        provider: ProviderId,
        /// What the check said.
        source: Box<multicdn_core::Error>,
    },
    /// The HTTP client could not be built (no TLS roots, an invalid setting).
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

impl HealthError {
    pub(crate) fn config(setting: &'static str, message: impl Into<String>) -> HealthError {
        HealthError::Config {
            setting,
            message: message.into(),
        }
    }
}
