//! What a purger accepts and how it is paced: which purge kinds it can do, how many items one
//! request carries, and which vendor budgets each request spends. [`Purger::pacing`] returns
//! it, so a fan-out can batch and pace any purger, the library's or a team's own, without
//! knowing the vendor. Pure values.
//!
//! [`Purger::pacing`]: super::Purger::pacing

use std::time::Duration;

use super::purge::{PurgeRequest, PurgeScope};

/// Items one request carries in [`Pacing::third_party`], the default of [`Purger::pacing`].
///
/// [`Purger::pacing`]: super::Purger::pacing
pub const DEFAULT_ITEMS_PER_REQUEST: usize = 100;

/// A client-side rate limit: `per_second` requests a second, bursts of `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained rate, requests a second (may be fractional: Cloudflare Free is 5 a minute).
    pub per_second: f64,
    /// Bucket size.
    pub burst: u32,
}

impl RateLimit {
    /// A token bucket refilling `per_second`, holding `burst`.
    pub fn new(per_second: f64, burst: u32) -> RateLimit {
        RateLimit { per_second, burst }
    }

    /// The time `requests` take under this limit from a full bucket.
    pub fn ideal_time(&self, requests: u32) -> Duration {
        let beyond = requests.saturating_sub(self.burst);
        if beyond == 0 || self.per_second <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(f64::from(beyond) / self.per_second)
    }
}

/// How a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// One token a request (Cloudflare's purge bucket, Fastly's non-read limit).
    Request,
    /// One token an item (Fastly counts every purged URL and key).
    Item,
}

/// One vendor budget a purge request draws from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// What it models (`cloudflare-purge`, `fastly-purges`).
    pub name: &'static str,
    /// The bucket.
    pub limit: RateLimit,
    /// What a token pays for.
    pub unit: Unit,
}

impl Budget {
    /// A budget of `limit`, counted per `unit`.
    pub fn new(name: &'static str, limit: RateLimit, unit: Unit) -> Budget {
        Budget { name, limit, unit }
    }

    /// Tokens a request of `items` items spends.
    pub fn cost(&self, items: usize) -> u32 {
        match self.unit {
            Unit::Request => 1,
            Unit::Item => u32::try_from(items.max(1)).unwrap_or(u32::MAX),
        }
    }
}

/// How one purge kind is batched and paced.
#[derive(Debug, Clone, PartialEq)]
pub struct KindPacing {
    /// Most items one request may carry (1 where the vendor takes one item a request).
    pub per_request: usize,
    /// The budgets every request of this kind spends.
    pub budgets: Vec<Budget>,
}

impl KindPacing {
    /// `per_request` items a request, spending `budgets`.
    pub fn new(per_request: usize, budgets: Vec<Budget>) -> KindPacing {
        KindPacing {
            per_request: per_request.max(1),
            budgets,
        }
    }

    /// Requests needed for `items` items (at least one: purging everything is one request).
    pub fn requests_for(&self, items: usize) -> usize {
        items.div_ceil(self.per_request).max(1)
    }

    /// The least time the budgets allow for `items` items, from full buckets: the request that
    /// waits longest, over every budget.
    pub fn ideal_time(&self, items: usize) -> Duration {
        let requests = self.requests_for(items);
        self.budgets
            .iter()
            .map(|b| {
                let tokens = match b.unit {
                    Unit::Request => requests,
                    Unit::Item => items.max(1),
                };
                b.limit
                    .ideal_time(u32::try_from(tokens).unwrap_or(u32::MAX))
            })
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

/// What a provider can purge and at what pace. `None` means the kind is not supported.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct Pacing {
    /// Purge by URL.
    pub urls: Option<KindPacing>,
    /// Purge by tag.
    pub tags: Option<KindPacing>,
    /// Purge by hostname.
    pub hosts: Option<KindPacing>,
    /// Purge by prefix.
    pub prefixes: Option<KindPacing>,
    /// Purge everything.
    pub everything: Option<KindPacing>,
    /// Soft purge of URLs, tags, hosts and prefixes.
    pub soft_items: bool,
    /// Soft purge of everything.
    pub soft_everything: bool,
}

impl Pacing {
    /// What [`Purger::pacing`] assumes of a purger that does not say: every kind,
    /// [`DEFAULT_ITEMS_PER_REQUEST`] items a request, no budgets (it paces itself), no soft
    /// purge.
    ///
    /// [`Purger::pacing`]: super::Purger::pacing
    pub fn third_party() -> Pacing {
        Pacing::unlimited(DEFAULT_ITEMS_PER_REQUEST)
    }

    /// Every kind, `per_request` items a request, no budgets, no soft purge: for purgers that
    /// pace themselves (and for tests).
    pub fn unlimited(per_request: usize) -> Pacing {
        let k = Some(KindPacing::new(per_request, Vec::new()));
        Pacing {
            urls: k.clone(),
            tags: k.clone(),
            hosts: k.clone(),
            prefixes: k.clone(),
            everything: Some(KindPacing::new(1, Vec::new())),
            soft_items: false,
            soft_everything: false,
        }
    }

    /// Sets the pacing of one kind (`None`: unsupported).
    pub fn with_kind(mut self, scope: &PurgeScope, pacing: Option<KindPacing>) -> Pacing {
        match scope {
            PurgeScope::Urls(_) => self.urls = pacing,
            PurgeScope::Tags(_) => self.tags = pacing,
            PurgeScope::Hosts(_) => self.hosts = pacing,
            PurgeScope::Prefixes(_) => self.prefixes = pacing,
            _ => self.everything = pacing,
        }
        self
    }

    /// Sets soft-purge support.
    pub fn with_soft(mut self, items: bool, everything: bool) -> Pacing {
        self.soft_items = items;
        self.soft_everything = everything;
        self
    }

    /// The pacing of the scope's kind, if supported.
    pub fn for_scope(&self, scope: &PurgeScope) -> Option<&KindPacing> {
        match scope {
            PurgeScope::Urls(_) => self.urls.as_ref(),
            PurgeScope::Tags(_) => self.tags.as_ref(),
            PurgeScope::Hosts(_) => self.hosts.as_ref(),
            PurgeScope::Prefixes(_) => self.prefixes.as_ref(),
            _ => self.everything.as_ref(),
        }
    }

    /// Why the provider cannot do `request`, if it cannot (the feature, as a phrase).
    pub fn unsupported(&self, request: &PurgeRequest) -> Option<String> {
        let kind = request.scope.kind();
        self.for_scope(&request.scope)?;
        let everything = matches!(request.scope, PurgeScope::Everything);
        let soft_ok = if everything {
            self.soft_everything
        } else {
            self.soft_items
        };
        (request.soft && !soft_ok).then(|| format!("soft purge of {kind}"))
    }

    /// Whether the provider can do `request`; the feature it lacks otherwise.
    pub fn check(&self, request: &PurgeRequest) -> Result<(), String> {
        if self.for_scope(&request.scope).is_none() {
            return Err(format!("purge by {}", request.scope.kind()));
        }
        match self.unsupported(request) {
            Some(feature) => Err(feature),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cloudflare_pro() -> KindPacing {
        KindPacing::new(
            100,
            vec![
                Budget::new("purge", RateLimit::new(5.0, 25), Unit::Request),
                Budget::new("global", RateLimit::new(4.0, 1200), Unit::Request),
            ],
        )
    }

    #[test]
    fn ideal_time_is_the_tightest_budget() {
        // 4,000 tags: 40 requests; the purge bucket absorbs 25, then 15 at 5/s.
        assert_eq!(cloudflare_pro().ideal_time(4000), Duration::from_secs(3));
        assert_eq!(cloudflare_pro().requests_for(4000), 40);
        assert_eq!(cloudflare_pro().requests_for(0), 1);
        let items = KindPacing::new(
            256,
            vec![Budget::new("purges", RateLimit::new(10.0, 100), Unit::Item)],
        );
        assert_eq!(items.ideal_time(200), Duration::from_secs(10));
    }

    #[test]
    fn unsupported_kinds_and_soft_purges_are_named() {
        let p = Pacing::unlimited(100)
            .with_kind(&PurgeScope::Hosts(vec![]), None)
            .with_soft(true, false);
        assert_eq!(
            p.check(&PurgeRequest {
                scope: PurgeScope::Hosts(vec!["a".into()]),
                soft: false
            }),
            Err("purge by hosts".into())
        );
        assert_eq!(
            p.check(&PurgeRequest::everything().soft()),
            Err("soft purge of everything".into())
        );
        assert!(p.check(&PurgeRequest::tags(["a"]).soft()).is_ok());
    }
}
