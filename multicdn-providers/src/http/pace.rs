//! Client-side pacing: a `governor` token bucket that waits with tokio and leaves a small
//! margin once it is throttling, so a vendor's bucket (started a little later than ours, on a
//! clock we do not share) is never asked for a token it has not refilled yet.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::Clock as _;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::RateLimit;

/// The default margin added to a wait once the bucket is empty.
pub const DEFAULT_PACE_MARGIN: Duration = Duration::from_millis(20);

/// A shared token bucket. Clones share one bucket, so purgers that spend one vendor budget (one
/// Cloudflare account, one Fastly token) can be handed the same `Pacer`.
#[derive(Clone)]
pub struct Pacer {
    name: &'static str,
    limit: RateLimit,
    margin: Duration,
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .field("margin", &self.margin)
            .finish()
    }
}

impl Pacer {
    /// A full bucket for `limit`; `name` says which vendor budget it models (for logs).
    pub fn new(name: &'static str, limit: RateLimit) -> Pacer {
        Pacer {
            name,
            limit,
            margin: DEFAULT_PACE_MARGIN,
            limiter: Arc::new(limiter(limit)),
        }
    }

    /// Sets the margin added to each wait once the bucket is empty (default 20 ms).
    pub fn with_margin(mut self, margin: Duration) -> Pacer {
        self.margin = margin;
        self
    }

    /// The limit modelled.
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// The budget's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Waits until `cost` tokens are available and takes them; returns how long it waited.
    /// A cost above the bucket size is clamped to the bucket size (it could never pass
    /// otherwise); a cost of zero takes nothing.
    pub async fn acquire(&self, cost: u32) -> Duration {
        let cost = cost.min(self.limit.burst.max(1));
        let Some(n) = NonZeroU32::new(cost) else {
            return Duration::ZERO;
        };
        let mut waited = Duration::ZERO;
        loop {
            match self.limiter.check_n(n) {
                Ok(Ok(())) => return waited,
                Ok(Err(not_until)) => {
                    let wait = not_until.wait_time_from(self.limiter.clock().now()) + self.margin;
                    tracing::trace!(budget = self.name, ?wait, "pacing");
                    tokio::time::sleep(wait).await;
                    waited += wait;
                }
                // Unreachable after the clamp above; treated as "take what there is".
                Err(_) => return waited,
            }
        }
    }
}

fn limiter(limit: RateLimit) -> DefaultDirectRateLimiter {
    let per_second = if limit.per_second.is_finite() && limit.per_second > 0.0 {
        limit.per_second
    } else {
        1.0
    };
    let period = Duration::from_secs_f64(1.0 / per_second).max(Duration::from_nanos(1));
    let burst = NonZeroU32::new(limit.burst.max(1)).unwrap_or(NonZeroU32::MIN);
    let quota = Quota::with_period(period)
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
        .allow_burst(burst);
    RateLimiter::direct(quota)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_bucket_passes_its_burst_without_waiting() {
        let p = Pacer::new("test", RateLimit::new(1.0, 3));
        for _ in 0..3 {
            assert_eq!(p.acquire(1).await, Duration::ZERO);
        }
    }

    #[tokio::test]
    async fn an_empty_bucket_waits_one_period_plus_the_margin() {
        let p = Pacer::new("test", RateLimit::new(100.0, 1)).with_margin(Duration::from_millis(1));
        assert_eq!(p.acquire(1).await, Duration::ZERO);
        let waited = p.acquire(1).await;
        assert!(waited >= Duration::from_millis(9), "{waited:?}");
        assert!(waited <= Duration::from_millis(40), "{waited:?}");
    }

    #[tokio::test]
    async fn costs_above_the_bucket_are_clamped_and_zero_costs_nothing() {
        let p = Pacer::new("test", RateLimit::new(1.0, 2));
        assert_eq!(p.acquire(0).await, Duration::ZERO);
        assert_eq!(p.acquire(500).await, Duration::ZERO);
    }
}
