//! The cache warmer: the top URLs through each edge, so a failover does not land on an empty
//! cache (seed 000, section 11).
//!
//! Requests go to each provider's edge with the site's `Host` and `Accept-Encoding: br, gzip`
//! (the variant real browsers ask for). Providers are warmed one after another, never together,
//! each with bounded concurrency and an optional rate limit, because warming doubles origin load
//! at the worst moment if it is not staggered. A provider that health says is down is refused:
//! warming through a broken edge floods the origin. Progress goes to a callback so a program
//! can draw a progress bar.

use std::time::Duration;

use futures::StreamExt;
use multicdn_core::{ProviderId, Stopwatch};
use reqwest::header::{ACCEPT_ENCODING, HeaderValue};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tokio::time::{Interval, MissedTickBehavior};

use crate::edges::Edge;
use crate::error::HealthError;
use crate::http;

/// Where a warm run is, after each request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WarmProgress {
    /// The provider being warmed.
    pub provider: ProviderId,
    /// Which provider this is (0-based) ...
    pub provider_index: usize,
    /// ... of how many.
    pub providers: usize,
    /// Requests finished for this provider.
    pub done: usize,
    /// Requests this provider will get.
    pub total: usize,
}

/// One provider's figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WarmStats {
    /// Requests sent.
    pub requests: usize,
    /// Answers outside 2xx.
    pub non_2xx: usize,
    /// Requests with no answer (timeout, connect, TLS).
    pub failed: usize,
    /// Mean time per request, to the last byte (a failed request counts its time to failure).
    pub mean: Duration,
    /// 90th percentile of the same (nearest rank).
    pub p90: Duration,
}

/// What happened to one provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WarmOutcome {
    /// Warmed, with figures.
    Warmed(WarmStats),
    /// Not warmed: health says it is down.
    SkippedDown,
}

/// One provider's line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProviderWarm {
    /// The provider.
    pub provider: ProviderId,
    /// What happened.
    pub outcome: WarmOutcome,
}

/// The result of a warm run, one line per provider in the order warmed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WarmReport {
    /// Each provider.
    pub providers: Vec<ProviderWarm>,
}

impl WarmReport {
    /// A provider's outcome.
    pub fn get(&self, provider: &ProviderId) -> Option<&WarmOutcome> {
        self.providers
            .iter()
            .find(|p| &p.provider == provider)
            .map(|p| &p.outcome)
    }
}

/// Spaces requests at least `1 / rate` apart, on `tokio::time` (so paused time drives it).
#[derive(Debug)]
struct Pacer {
    interval: Mutex<Interval>,
}

impl Pacer {
    fn new(per_second: u32) -> Pacer {
        let period = Duration::from_secs(1) / per_second.max(1);
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Pacer {
            interval: Mutex::new(interval),
        }
    }

    async fn wait(&self) {
        self.interval.lock().await.tick().await;
    }
}

/// Warms edges. Build with [`Warmer::builder`].
#[derive(Debug, Clone)]
pub struct Warmer {
    client: reqwest::Client,
    edges: Vec<Edge>,
    host: Option<HeaderValue>,
    concurrency: usize,
    rate_per_second: Option<u32>,
    timeout: Duration,
}

impl Warmer {
    /// A warmer over `edges`, warmed in this order.
    pub fn builder(edges: Vec<Edge>) -> WarmerBuilder {
        WarmerBuilder {
            edges,
            host: None,
            concurrency: 8,
            rate_per_second: None,
            timeout: Duration::from_secs(10),
        }
    }

    async fn warm_one(
        &self,
        edge: &Edge,
        path: &str,
        pacer: Option<&Pacer>,
    ) -> (Duration, Option<u16>) {
        if let Some(p) = pacer {
            p.wait().await;
        }
        let watch = Stopwatch::start();
        let req = http::with_host(self.client.get(edge.url_for(path)), self.host.as_ref())
            .header(ACCEPT_ENCODING, HeaderValue::from_static("br, gzip"));
        let fetch = async {
            let mut resp = req.send().await.ok()?;
            // The edge has to send the whole object for it to be cached; so do we read it.
            http::drain(&mut resp).await.ok()?;
            Some(resp.status().as_u16())
        };
        match tokio::time::timeout(self.timeout, fetch).await {
            Ok(status) => (watch.elapsed(), status),
            Err(_) => (self.timeout, None),
        }
    }

    /// Warms `paths` through each edge in turn, skipping any provider for which `is_down` says
    /// true at the moment its turn comes (pass `|p| snapshot.is_down(p)`, or read a live
    /// [`Monitor::watch`](crate::Monitor::watch)). `progress` is called after every request.
    pub async fn warm<S, G, P>(&self, paths: &[S], is_down: G, mut progress: P) -> WarmReport
    where
        S: AsRef<str> + Sync,
        G: Fn(&ProviderId) -> bool,
        P: FnMut(&WarmProgress),
    {
        let mut report = WarmReport::default();
        let providers = self.edges.len();
        for (index, edge) in self.edges.iter().enumerate() {
            if is_down(&edge.provider) {
                tracing::warn!(provider = %edge.provider, "not warming: health says it is down");
                report.providers.push(ProviderWarm {
                    provider: edge.provider.clone(),
                    outcome: WarmOutcome::SkippedDown,
                });
                continue;
            }
            let pacer = self.rate_per_second.map(Pacer::new);
            let total = paths.len();
            let mut times = Vec::with_capacity(total);
            let (mut non_2xx, mut failed) = (0, 0);
            // A plain list of futures (no closures in the stream's type) keeps this `Send`.
            let requests: Vec<_> = paths
                .iter()
                .map(|p| self.warm_one(edge, p.as_ref(), pacer.as_ref()))
                .collect();
            let mut results = futures::stream::iter(requests).buffer_unordered(self.concurrency);
            while let Some((took, status)) = results.next().await {
                times.push(took);
                match status {
                    Some(s) if (200..300).contains(&s) => {}
                    Some(_) => non_2xx += 1,
                    None => failed += 1,
                }
                progress(&WarmProgress {
                    provider: edge.provider.clone(),
                    provider_index: index,
                    providers,
                    done: times.len(),
                    total,
                });
            }
            let (mean, p90) = mean_and_p90(&mut times);
            tracing::info!(provider = %edge.provider, requests = total, non_2xx, failed, ?mean, ?p90, "warmed");
            report.providers.push(ProviderWarm {
                provider: edge.provider.clone(),
                outcome: WarmOutcome::Warmed(WarmStats {
                    requests: total,
                    non_2xx,
                    failed,
                    mean,
                    p90,
                }),
            });
        }
        report
    }
}

/// Mean and nearest-rank 90th percentile; zero for no samples.
fn mean_and_p90(times: &mut [Duration]) -> (Duration, Duration) {
    if times.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    times.sort_unstable();
    let total: Duration = times.iter().sum();
    let mean = total / u32::try_from(times.len()).unwrap_or(u32::MAX);
    // Nearest rank: the ceil(0.9 n)-th smallest, 1-based.
    let rank = (times.len() * 9).div_ceil(10).max(1);
    (mean, times[rank - 1])
}

/// Settings for a [`Warmer`].
#[derive(Debug)]
pub struct WarmerBuilder {
    edges: Vec<Edge>,
    host: Option<String>,
    concurrency: usize,
    rate_per_second: Option<u32>,
    timeout: Duration,
}

impl WarmerBuilder {
    /// The site's hostname, sent as `Host`.
    pub fn host(mut self, host: impl Into<String>) -> WarmerBuilder {
        self.host = Some(host.into());
        self
    }

    /// Requests in flight at once per provider (default 8).
    pub fn concurrency(mut self, n: usize) -> WarmerBuilder {
        self.concurrency = n;
        self
    }

    /// At most this many requests a second per provider (default: no limit).
    pub fn rate_per_second(mut self, rate: u32) -> WarmerBuilder {
        self.rate_per_second = Some(rate);
        self
    }

    /// Each request's deadline (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> WarmerBuilder {
        self.timeout = timeout;
        self
    }

    /// The warmer.
    pub fn build(self) -> Result<Warmer, HealthError> {
        if self.edges.is_empty() {
            return Err(HealthError::config(
                "edges",
                "name at least one edge to warm",
            ));
        }
        if self.concurrency == 0 {
            return Err(HealthError::config(
                "concurrency",
                "must be at least 1 request in flight",
            ));
        }
        if self.rate_per_second == Some(0) {
            return Err(HealthError::config(
                "rate_per_second",
                "must be at least 1 request a second; leave it unset for no limit",
            ));
        }
        let host =
            http::host_header(self.host.as_deref()).map_err(|m| HealthError::config("host", m))?;
        Ok(Warmer {
            client: http::client(self.concurrency, "multicdn-health-warmer")?,
            edges: self.edges,
            host,
            concurrency: self.concurrency,
            rate_per_second: self.rate_per_second,
            timeout: self.timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|m| Duration::from_millis(*m)).collect()
    }

    #[test]
    fn p90_is_the_nearest_rank() {
        let mut t = ms(&[10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
        assert_eq!(
            mean_and_p90(&mut t),
            (Duration::from_millis(55), Duration::from_millis(90))
        );
        let mut one = ms(&[7]);
        assert_eq!(
            mean_and_p90(&mut one),
            (Duration::from_millis(7), Duration::from_millis(7))
        );
        assert_eq!(mean_and_p90(&mut []), (Duration::ZERO, Duration::ZERO));
        // The one slow request of eleven is above the 90th percentile; of nine it is not.
        let mut eleven = ms(&[500, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(mean_and_p90(&mut eleven).1, Duration::from_millis(1));
        let mut nine = ms(&[500, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(mean_and_p90(&mut nine).1, Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn the_pacer_holds_a_rate() {
        let pacer = Pacer::new(10);
        let mut n = 0;
        // In 1.05 s at 10/s: the first at once, then one every 100 ms.
        let _ = tokio::time::timeout(Duration::from_millis(1050), async {
            loop {
                pacer.wait().await;
                n += 1;
            }
        })
        .await;
        assert_eq!(n, 11);
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        let edge = Edge::new(ProviderId::new("fastly").unwrap(), "http://127.0.0.1:1").unwrap();
        assert!(Warmer::builder(vec![]).build().is_err());
        assert!(
            Warmer::builder(vec![edge.clone()])
                .concurrency(0)
                .build()
                .is_err()
        );
        let e = Warmer::builder(vec![edge])
            .rate_per_second(0)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("rate_per_second"), "{e}");
    }
}
