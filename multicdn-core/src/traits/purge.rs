use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::id::ProviderId;

use super::pacing::Pacing;

/// What to purge. A tag is one concept: Fastly surrogate keys and Cloudflare cache tags are
/// both purged with [`PurgeScope::Tags`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PurgeScope {
    /// Full URLs, `https://www.example.com/css/styles.css`.
    Urls(Vec<String>),
    /// Tags: surrogate keys (Fastly), cache tags (Cloudflare).
    Tags(Vec<String>),
    /// Hostnames: everything under `www.example.com`.
    Hosts(Vec<String>),
    /// URL prefixes without scheme: `www.example.com/foo`.
    Prefixes(Vec<String>),
    /// Everything the provider holds for this service or zone.
    Everything,
}

impl PurgeScope {
    /// The items named (empty for [`PurgeScope::Everything`]).
    pub fn items(&self) -> &[String] {
        match self {
            PurgeScope::Urls(v)
            | PurgeScope::Tags(v)
            | PurgeScope::Hosts(v)
            | PurgeScope::Prefixes(v) => v,
            PurgeScope::Everything => &[],
        }
    }

    /// `urls`, `tags`, `hosts`, `prefixes` or `everything`.
    pub fn kind(&self) -> &'static str {
        match self {
            PurgeScope::Urls(_) => "urls",
            PurgeScope::Tags(_) => "tags",
            PurgeScope::Hosts(_) => "hosts",
            PurgeScope::Prefixes(_) => "prefixes",
            PurgeScope::Everything => "everything",
        }
    }

    /// The same kind of scope holding other items.
    pub fn with_items(&self, items: Vec<String>) -> PurgeScope {
        match self {
            PurgeScope::Urls(_) => PurgeScope::Urls(items),
            PurgeScope::Tags(_) => PurgeScope::Tags(items),
            PurgeScope::Hosts(_) => PurgeScope::Hosts(items),
            PurgeScope::Prefixes(_) => PurgeScope::Prefixes(items),
            PurgeScope::Everything => PurgeScope::Everything,
        }
    }
}

/// One purge: a scope, and whether to mark stale instead of evicting where supported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeRequest {
    /// What to purge.
    pub scope: PurgeScope,
    /// Mark stale rather than evict (Fastly soft purge); refused where unsupported.
    #[serde(default)]
    pub soft: bool,
}

impl PurgeRequest {
    /// Evicts the given tags.
    pub fn tags<I: IntoIterator<Item = S>, S: Into<String>>(tags: I) -> PurgeRequest {
        PurgeRequest {
            scope: PurgeScope::Tags(tags.into_iter().map(Into::into).collect()),
            soft: false,
        }
    }

    /// Evicts the given URLs.
    pub fn urls<I: IntoIterator<Item = S>, S: Into<String>>(urls: I) -> PurgeRequest {
        PurgeRequest {
            scope: PurgeScope::Urls(urls.into_iter().map(Into::into).collect()),
            soft: false,
        }
    }

    /// Evicts everything.
    pub fn everything() -> PurgeRequest {
        PurgeRequest {
            scope: PurgeScope::Everything,
            soft: false,
        }
    }

    /// The same purge, soft.
    pub fn soft(mut self) -> PurgeRequest {
        self.soft = true;
        self
    }
}

/// What a provider acknowledged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PurgeReceipt {
    /// The provider.
    pub provider: ProviderId,
    /// The vendor's purge ids, where it returns them.
    pub purge_ids: Vec<String>,
    /// How many items were purged.
    pub items: usize,
    /// How many requests the purge took (batches).
    pub requests: u32,
    /// How many attempts, retries included.
    pub attempts: u32,
    /// From the first send to the last acknowledgement.
    #[serde(with = "crate::policy::units::duration_ms")]
    pub acknowledged_in: Duration,
}

impl PurgeReceipt {
    /// A receipt.
    pub fn new(
        provider: ProviderId,
        purge_ids: Vec<String>,
        items: usize,
        requests: u32,
        attempts: u32,
        acknowledged_in: Duration,
    ) -> PurgeReceipt {
        PurgeReceipt {
            provider,
            purge_ids,
            items,
            requests,
            attempts,
            acknowledged_in,
        }
    }
}

/// [`Purger`] sends one purge to one provider and returns its receipt. Batching to the
/// provider's limits, pacing and retries happen inside; a purge that did not complete is an
/// error, never a warning.
///
/// A purger also says what it accepts and how it is paced, so a fan-out can refuse a purge
/// some provider cannot do before anything is sent to anyone, batch items to each provider's
/// limit, and feed large purges through at the slowest provider's documented rate. A purger of
/// its own (a third CDN, an in-house cache) need only implement [`Purger::provider`] and
/// [`Purger::purge`]: the defaults say it takes every kind, [`DEFAULT_ITEMS_PER_REQUEST`] items
/// a request, paces itself, and has no soft purge.
///
/// [`DEFAULT_ITEMS_PER_REQUEST`]: super::DEFAULT_ITEMS_PER_REQUEST
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait Purger: fmt::Debug + Send + Sync {
    /// The provider this purger talks to.
    fn provider(&self) -> &ProviderId;
    /// Purges, and returns once every batch is acknowledged.
    async fn purge(&self, request: &PurgeRequest) -> Result<PurgeReceipt, Error>;
    /// What it can purge, how many items a request carries, and which vendor budgets each
    /// request spends. Default: [`Pacing::third_party`].
    fn pacing(&self) -> Pacing {
        Pacing::third_party()
    }
    /// Checks `request` without sending anything: the kind and soft flag are supported (by
    /// [`Purger::pacing`]) and every item is well formed for this vendor. [`Purger::purge`]
    /// does this first; a fan-out does it for every provider before sending to any. Default:
    /// the kind check only.
    fn validate(&self, request: &PurgeRequest) -> Result<(), Error> {
        self.pacing()
            .check(request)
            .map_err(|feature| Error::Unsupported {
                provider: self.provider().clone(),
                feature,
            })
    }
}

#[async_trait]
impl<T: Purger + ?Sized> Purger for Arc<T> {
    fn provider(&self) -> &ProviderId {
        (**self).provider()
    }
    async fn purge(&self, request: &PurgeRequest) -> Result<PurgeReceipt, Error> {
        (**self).purge(request).await
    }
    fn pacing(&self) -> Pacing {
        (**self).pacing()
    }
    fn validate(&self, request: &PurgeRequest) -> Result<(), Error> {
        (**self).validate(request)
    }
}
