//! Fast Purge v3's documented limits, as client-side budgets
//! (techdocs.akamai.com/purge-cache/reference/rate-limiting):
//!
//! - **Requests**: a bucket of 100, refilling 50 a second, per account (all API clients of the
//!   account together).
//! - **Objects**, each object of a request one token of its type's bucket: URLs/ARLs 10,000,
//!   refilling 12,000 a minute (200 a second); CP codes 300, refilling 30 a minute; cache
//!   tags 5,000, refilling 500 a minute.
//! - A request is refused (429) unless there is a request token and enough object tokens for
//!   the whole request, so a request never carries more objects than its bucket holds.
//! - A request body is at most 50 KB (a longer one is a 413): batches are cut by size too.

use multicdn_core::{Budget, RateLimit, Unit};

/// The largest request body Fast Purge accepts, in bytes.
pub const MAX_BODY_BYTES: usize = 50_000;

/// Fast Purge's budgets. Configurable, so tests can make them tight.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct AkamaiLimits {
    /// Requests, a token a request.
    pub requests: RateLimit,
    /// URL/ARL objects, a token a URL.
    pub urls: RateLimit,
    /// Cache tag objects, a token a tag.
    pub tags: RateLimit,
    /// CP code objects, a token a CP code.
    pub cp_codes: RateLimit,
    /// The largest request body sent (at most [`MAX_BODY_BYTES`]).
    pub max_body_bytes: usize,
}

impl Default for AkamaiLimits {
    fn default() -> AkamaiLimits {
        AkamaiLimits {
            requests: RateLimit::new(50.0, 100),
            urls: RateLimit::new(12_000.0 / 60.0, 10_000),
            tags: RateLimit::new(500.0 / 60.0, 5_000),
            cp_codes: RateLimit::new(30.0 / 60.0, 300),
            max_body_bytes: MAX_BODY_BYTES,
        }
    }
}

impl AkamaiLimits {
    /// Sets the request budget.
    pub fn with_requests(mut self, limit: RateLimit) -> AkamaiLimits {
        self.requests = limit;
        self
    }

    /// Sets the URL budget.
    pub fn with_urls(mut self, limit: RateLimit) -> AkamaiLimits {
        self.urls = limit;
        self
    }

    /// Sets the cache tag budget.
    pub fn with_tags(mut self, limit: RateLimit) -> AkamaiLimits {
        self.tags = limit;
        self
    }

    /// Sets the CP code budget.
    pub fn with_cp_codes(mut self, limit: RateLimit) -> AkamaiLimits {
        self.cp_codes = limit;
        self
    }

    /// Sets the largest body sent (clamped to 64..=50,000 bytes).
    pub fn with_max_body_bytes(mut self, n: usize) -> AkamaiLimits {
        self.max_body_bytes = n.clamp(64, MAX_BODY_BYTES);
        self
    }

    /// The budgets a purge of one object type spends.
    pub(crate) fn budgets(&self, objects: &'static str, limit: RateLimit) -> Vec<Budget> {
        vec![
            Budget::new("akamai-requests", self.requests, Unit::Request),
            Budget::new(objects, limit, Unit::Item),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_documented_buckets() {
        let l = AkamaiLimits::default();
        assert_eq!((l.requests.per_second, l.requests.burst), (50.0, 100));
        assert_eq!((l.urls.per_second, l.urls.burst), (200.0, 10_000));
        // 300 CP codes at once, then one every 2 s.
        assert_eq!(l.cp_codes.ideal_time(301), Duration::from_secs(2));
        // 5,000 tags at once, then 500 a minute.
        assert_eq!(l.tags.ideal_time(5_500), Duration::from_secs(60));
        assert_eq!(l.with_max_body_bytes(1_000_000).max_body_bytes, 50_000);
    }
}
