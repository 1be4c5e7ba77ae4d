//! Reading when a vendor says to come back. Malformed headers read as `None`, never a panic.

use std::time::Duration;

use multicdn_core::Timestamp;

/// `Retry-After`: delay seconds, or an HTTP date (compared with nothing: treated as the
/// minimum sensible wait of one second, since the server's clock is not ours).
pub fn parse_retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("retry-after")?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Ok(secs) = value.parse::<f64>()
        && secs.is_finite()
        && (0.0..1e9).contains(&secs)
    {
        return Some(Duration::from_secs_f64(secs));
    }
    httpdate_like(value).then_some(Duration::from_secs(1))
}

fn httpdate_like(v: &str) -> bool {
    v.len() >= 20 && v.ends_with("GMT")
}

/// `Fastly-RateLimit-Reset`: UTC epoch seconds when the limit resets, as a wait from `now`.
pub fn parse_fastly_reset(headers: &http::HeaderMap, now: Timestamp) -> Option<Duration> {
    let value = headers.get("fastly-ratelimit-reset")?.to_str().ok()?.trim();
    let reset = value.parse::<u64>().ok()?;
    let reset_ms = reset.checked_mul(1000)?;
    Some(Duration::from_millis(
        reset_ms.saturating_sub(now.as_millis()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &'static str, value: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(name, value.parse().unwrap());
        h
    }

    #[test]
    fn reads_seconds_and_tolerates_garbage() {
        assert_eq!(
            parse_retry_after(&headers("retry-after", "7")),
            Some(Duration::from_secs(7))
        );
        assert_eq!(parse_retry_after(&headers("retry-after", "soon")), None);
        assert_eq!(parse_retry_after(&headers("retry-after", "-3")), None);
        assert_eq!(
            parse_retry_after(&headers("retry-after", "Wed, 21 Oct 2026 07:28:00 GMT")),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn reads_fastly_reset_relative_to_now() {
        let now = Timestamp::from_secs(1_000);
        assert_eq!(
            parse_fastly_reset(&headers("fastly-ratelimit-reset", "1030"), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_fastly_reset(&headers("fastly-ratelimit-reset", "900"), now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_fastly_reset(
                &headers("fastly-ratelimit-reset", "99999999999999999999"),
                now
            ),
            None
        );
        assert_eq!(
            parse_fastly_reset(&headers("fastly-ratelimit-reset", "x"), now),
            None
        );
    }
}
