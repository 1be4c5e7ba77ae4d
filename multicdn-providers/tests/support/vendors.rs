//! Purgers pointed at a loopback server, with fast retries.

use std::time::Duration;

use multicdn_core::{ProviderId, Secret};
use multicdn_providers::cloudflare::{CloudflareLimits, CloudflarePurger};
use multicdn_providers::fastly::FastlyPurger;
use multicdn_providers::http::HttpSettings;

/// The Fastly token used in tests (asserted never to leak).
pub const FASTLY_TOKEN: &str = "fastly-tok-9f8e7d6c5b4a";
/// The Cloudflare token used in tests (asserted never to leak).
pub const CLOUDFLARE_TOKEN: &str = "cf-tok-1a2b3c4d5e6f";
/// The Fastly service id used in tests.
pub const SERVICE: &str = "SU1Z0isxPaozGVKXdv0eY";
/// The Cloudflare zone id used in tests.
pub const ZONE: &str = "023e105f4ecef8ad9ca31a8372d0c353";

/// A provider id.
pub fn pid(name: &str) -> ProviderId {
    ProviderId::new(name).unwrap()
}

/// Millisecond backoffs, a short request deadline, `attempts` attempts.
pub fn fast(attempts: u32) -> HttpSettings {
    HttpSettings::default()
        .with_request_timeout(Duration::from_secs(2))
        .with_max_attempts(attempts)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
}

/// A Fastly purger at `base`.
pub fn fastly(base: &str, settings: HttpSettings) -> FastlyPurger {
    FastlyPurger::new(
        pid("fastly"),
        "example.map.fastly.net",
        SERVICE,
        Secret::new(FASTLY_TOKEN),
        base,
        settings,
    )
    .unwrap()
}

/// A Cloudflare purger at `base` with `limits`.
pub fn cloudflare(
    base: &str,
    limits: CloudflareLimits,
    settings: HttpSettings,
) -> CloudflarePurger {
    CloudflarePurger::new(
        pid("cloudflare"),
        "www.example.com.cdn.cloudflare.net",
        ZONE,
        Secret::new(CLOUDFLARE_TOKEN),
        limits,
        base,
        settings,
    )
    .unwrap()
}

/// `n` tags: `tag-0000` ...
pub fn tags(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("tag-{i:04}")).collect()
}
