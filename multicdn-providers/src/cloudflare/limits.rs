//! Cloudflare's documented purge limits, per plan, as client-side budgets.
//!
//! - Purges by tag, host, prefix and everything share a token bucket per account: Free 5
//!   requests a minute (bucket 25), Pro 5 a second (25), Business 10 a second (50), Enterprise
//!   50 a second (500).
//! - Purges by URL (single-file purges) have their own per-account limit in URLs a second:
//!   Free 800, Pro and Business 1,500, Enterprise 3,000. They spend that budget (a token a URL,
//!   bursts of one second's worth), not the tag/host/prefix bucket, so URL purges on Free do
//!   not crawl at 5 requests a minute and never starve tag purges.
//! - At most 100 items a request; URL purges 500 a request on Enterprise.
//! - Every request also spends the global API limit, 1,200 requests per 5 minutes per token,
//!   modelled as a bucket of 1,200 refilling 4 a second.

use multicdn_core::policy::CloudflarePlan;

use crate::http::RateLimit;
use multicdn_core::{Budget, Unit};

/// Items per request on every plan.
pub const MAX_ITEMS_PER_REQUEST: usize = 100;
/// URLs per request on Enterprise.
pub const MAX_URLS_PER_REQUEST_ENTERPRISE: usize = 500;

/// Cloudflare's purge budgets. Configurable, so tests can make them tight.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct CloudflareLimits {
    /// The plan's purge bucket, a token a request.
    pub purge: RateLimit,
    /// The global API limit per token, a token a request.
    pub global: RateLimit,
    /// The single-file (URL) purge limit, a token a URL.
    pub urls: RateLimit,
    /// Tags, hosts, prefixes a request.
    pub items_per_request: usize,
    /// URLs a request.
    pub urls_per_request: usize,
}

impl CloudflareLimits {
    /// The documented limits of `plan`.
    pub fn for_plan(plan: CloudflarePlan) -> CloudflareLimits {
        let (purge, urls, url_rate) = match plan {
            CloudflarePlan::Free => (RateLimit::new(5.0 / 60.0, 25), MAX_ITEMS_PER_REQUEST, 800),
            CloudflarePlan::Pro => (RateLimit::new(5.0, 25), MAX_ITEMS_PER_REQUEST, 1_500),
            CloudflarePlan::Business => (RateLimit::new(10.0, 50), MAX_ITEMS_PER_REQUEST, 1_500),
            CloudflarePlan::Enterprise => (
                RateLimit::new(50.0, 500),
                MAX_URLS_PER_REQUEST_ENTERPRISE,
                3_000,
            ),
        };
        CloudflareLimits {
            purge,
            urls: RateLimit::new(f64::from(url_rate), url_rate),
            global: RateLimit::new(1200.0 / 300.0, 1200),
            items_per_request: MAX_ITEMS_PER_REQUEST,
            urls_per_request: urls,
        }
    }

    /// Sets the purge bucket.
    pub fn with_purge(mut self, limit: RateLimit) -> CloudflareLimits {
        self.purge = limit;
        self
    }

    /// Sets the global limit.
    pub fn with_global(mut self, limit: RateLimit) -> CloudflareLimits {
        self.global = limit;
        self
    }

    /// Sets the items (and URLs) a request, clamped to what the plan allows.
    pub fn with_items_per_request(mut self, n: usize) -> CloudflareLimits {
        self.items_per_request = n.clamp(1, MAX_ITEMS_PER_REQUEST);
        self.urls_per_request = n.clamp(1, self.urls_per_request);
        self
    }

    /// Sets the URL (single-file) purge limit.
    pub fn with_urls(mut self, limit: RateLimit) -> CloudflareLimits {
        self.urls = limit;
        self
    }

    /// The budgets a URL purge request spends: the URL limit (a token a URL) and the global
    /// limit, never the tag/host/prefix bucket.
    pub(crate) fn url_budgets(&self) -> Vec<Budget> {
        vec![
            Budget::new("cloudflare-urls", self.urls, Unit::Item),
            Budget::new("cloudflare-global", self.global, Unit::Request),
        ]
    }

    pub(crate) fn budgets(&self) -> Vec<Budget> {
        vec![
            Budget::new("cloudflare-purge", self.purge, Unit::Request),
            Budget::new("cloudflare-global", self.global, Unit::Request),
        ]
    }
}

impl Default for CloudflareLimits {
    fn default() -> CloudflareLimits {
        CloudflareLimits::for_plan(CloudflarePlan::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_plan_has_its_documented_bucket() {
        let free = CloudflareLimits::for_plan(CloudflarePlan::Free);
        assert_eq!(free.purge.burst, 25);
        assert_eq!(free.purge.ideal_time(26), Duration::from_secs(12));
        let pro = CloudflareLimits::for_plan(CloudflarePlan::Pro);
        assert_eq!((pro.purge.per_second, pro.purge.burst), (5.0, 25));
        let biz = CloudflareLimits::for_plan(CloudflarePlan::Business);
        assert_eq!((biz.purge.per_second, biz.purge.burst), (10.0, 50));
        let ent = CloudflareLimits::for_plan(CloudflarePlan::Enterprise);
        assert_eq!((ent.purge.per_second, ent.purge.burst), (50.0, 500));
        assert_eq!((ent.items_per_request, ent.urls_per_request), (100, 500));
        assert_eq!(pro.urls_per_request, 100);
        assert_eq!(pro.global.ideal_time(1_204), Duration::from_secs(1));
        assert_eq!(free.urls.per_second, 800.0);
        assert_eq!(
            (pro.urls.per_second, biz.urls.per_second),
            (1_500.0, 1_500.0)
        );
        assert_eq!(ent.urls.per_second, 3_000.0);
    }

    #[test]
    fn url_purges_on_free_are_paced_by_urls_a_second_not_the_tag_bucket() {
        use multicdn_core::KindPacing;
        let free = CloudflareLimits::for_plan(CloudflarePlan::Free);
        // 10,000 URLs: 100 requests. The tag bucket (5 a minute beyond 25) would take 15
        // minutes; 800 URLs a second take 11.5 s.
        let urls = KindPacing::new(free.urls_per_request, free.url_budgets());
        let t = urls.ideal_time(10_000);
        assert!(
            t < Duration::from_secs(12) && t > Duration::from_secs(11),
            "{t:?}"
        );
        assert!(urls.budgets.iter().all(|b| b.name != "cloudflare-purge"));
        let tags = KindPacing::new(free.items_per_request, free.budgets());
        assert!(tags.budgets.iter().all(|b| b.name != "cloudflare-urls"));
    }
}
