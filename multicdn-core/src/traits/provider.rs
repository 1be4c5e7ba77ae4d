use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::id::ProviderId;
use crate::served_by::{ServedBy, served_by};

/// Which vendor a provider is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ProviderKind {
    /// Fastly.
    Fastly,
    /// Cloudflare.
    Cloudflare,
    /// Akamai (Fast Purge v3, signed with EdgeGrid).
    Akamai,
    /// Any other CDN: steerable and probeable, but no purge or configuration adapter.
    Generic,
}

impl ProviderKind {
    /// The lowercase vendor name, as edges write it in `Server-Timing: cdn;desc=...`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Fastly => "fastly",
            ProviderKind::Cloudflare => "cloudflare",
            ProviderKind::Akamai => "akamai",
            ProviderKind::Generic => "generic",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// [`Provider`] describes one CDN: its id, its edge, and how to recognise its responses. What
/// it can purge is its [`Purger`](super::Purger)'s to say ([`Purger::pacing`](super::Purger::pacing)).
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
pub trait Provider: fmt::Debug + Send + Sync {
    /// The id the policy gives it.
    fn id(&self) -> &ProviderId;
    /// The vendor.
    fn kind(&self) -> ProviderKind;
    /// The edge hostname traffic is steered to (`example.map.fastly.net`).
    fn edge_host(&self) -> &str;
    /// Reads a response's headers and says whether this provider served it.
    fn recognise(&self, headers: &http::HeaderMap) -> Option<ServedBy> {
        served_by(headers).filter(|s| s.provider == self.kind().as_str())
    }
}

impl<T: Provider + ?Sized> Provider for Arc<T> {
    fn id(&self) -> &ProviderId {
        (**self).id()
    }
    fn kind(&self) -> ProviderKind {
        (**self).kind()
    }
    fn edge_host(&self) -> &str {
        (**self).edge_host()
    }
    fn recognise(&self, headers: &http::HeaderMap) -> Option<ServedBy> {
        (**self).recognise(headers)
    }
}
