//! Fastly's documented API limits, as client-side budgets.
//!
//! - **Purges** (each purged URL and each surrogate key, so a batch of 256 keys counts 256):
//!   about 100,000 an hour per token, outside the general limit.
//! - **Non-read requests**: 1,000 an hour per token; `purge_all` counts here, URL and key
//!   purges do not.
//!
//! An hourly cap is modelled as a token bucket holding the whole hour's allowance and
//! refilling at a 3,600th of it a second: a burst the vendor would accept is sent at once,
//! and a sustained stream never outruns the hourly rate.

use crate::http::RateLimit;
use multicdn_core::{Budget, Unit};

/// Most surrogate keys one batch purge may carry.
pub const MAX_KEYS_PER_BATCH: usize = 256;

/// Fastly's purge budgets. Configurable, so tests can make them tight.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct FastlyLimits {
    /// URL and key purges, counted per URL and per key.
    pub purges: RateLimit,
    /// Non-read requests (`purge_all` among them), counted per request.
    pub non_read: RateLimit,
    /// Keys per batch request (at most [`MAX_KEYS_PER_BATCH`]).
    pub keys_per_batch: usize,
}

impl Default for FastlyLimits {
    fn default() -> FastlyLimits {
        FastlyLimits {
            purges: hourly(100_000),
            non_read: hourly(1_000),
            keys_per_batch: MAX_KEYS_PER_BATCH,
        }
    }
}

impl FastlyLimits {
    /// Sets the purge budget.
    pub fn with_purges(mut self, limit: RateLimit) -> FastlyLimits {
        self.purges = limit;
        self
    }

    /// Sets the non-read budget.
    pub fn with_non_read(mut self, limit: RateLimit) -> FastlyLimits {
        self.non_read = limit;
        self
    }

    /// Sets the keys per batch (clamped to 1..=256).
    pub fn with_keys_per_batch(mut self, n: usize) -> FastlyLimits {
        self.keys_per_batch = n.clamp(1, MAX_KEYS_PER_BATCH);
        self
    }

    pub(crate) fn purge_budget(&self) -> Budget {
        Budget::new("fastly-purges", self.purges, Unit::Item)
    }

    pub(crate) fn non_read_budget(&self) -> Budget {
        Budget::new("fastly-non-read", self.non_read, Unit::Request)
    }
}

/// `n` an hour, the whole hour's allowance available at once.
pub fn hourly(n: u32) -> RateLimit {
    RateLimit::new(f64::from(n) / 3600.0, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_documented_hourly_caps() {
        let l = FastlyLimits::default();
        assert_eq!(l.purges.burst, 100_000);
        assert_eq!(l.non_read.burst, 1_000);
        // 4,000 keys fit the hourly purge allowance: nothing to wait for.
        assert_eq!(l.purges.ideal_time(4_000), Duration::ZERO);
        // One purge_all past the 1,000 waits 3.6 s.
        assert_eq!(l.non_read.ideal_time(1_001), Duration::from_secs_f64(3.6));
        assert_eq!(l.with_keys_per_batch(1_000).keys_per_batch, 256);
    }
}
