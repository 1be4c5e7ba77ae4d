//! The thin HTTP shell shared by the probe, the drift checker and the warmer: one client shape
//! (no redirects followed, a pool wide enough for the concurrency), bounded body reads, and the
//! mapping of transport errors to a [`FailReason`].

use std::error::Error as StdError;
use std::time::Duration;

use multicdn_core::FailReason;
use reqwest::header::{HOST, HeaderValue};

use crate::error::HealthError;

/// A client that never follows redirects (a redirect is an answer to compare, not to chase)
/// and keeps up to `idle_per_host` idle connections per edge, so a round at concurrency N
/// reuses N warm connections.
pub(crate) fn client(
    idle_per_host: usize,
    user_agent: &str,
) -> Result<reqwest::Client, HealthError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(idle_per_host)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .user_agent(user_agent)
        .build()
        .map_err(HealthError::Client)
}

/// `Host: host`, when there is a host, as a header value (or why it cannot be one).
pub(crate) fn host_header(host: Option<&str>) -> Result<Option<HeaderValue>, String> {
    host.map(|h| {
        HeaderValue::from_str(h).map_err(|_| format!("host {h:?} is not a valid Host header value"))
    })
    .transpose()
}

/// Adds `Host` to a request when given.
pub(crate) fn with_host(
    req: reqwest::RequestBuilder,
    host: Option<&HeaderValue>,
) -> reqwest::RequestBuilder {
    match host {
        Some(h) => req.header(HOST, h.clone()),
        None => req,
    }
}

/// Why a request failed, from the error and its source chain.
pub(crate) fn classify(err: &reqwest::Error) -> FailReason {
    if err.is_timeout() {
        return FailReason::Timeout;
    }
    if let Some(tls) = tls_cause(err) {
        return FailReason::Tls {
            detail: tls.to_string(),
        };
    }
    if err.is_body() || err.is_decode() {
        return FailReason::Body { detail: cause(err) };
    }
    FailReason::Connect { detail: cause(err) }
}

/// The rustls error somewhere in the chain, if the failure was in the TLS layer. rustls errors
/// travel inside (possibly nested) `std::io::Error`s, whose `source()` skips the error they
/// wrap, so each io error is opened with `get_ref`.
fn tls_cause(err: &reqwest::Error) -> Option<&rustls::Error> {
    let mut next: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = next {
        let mut inner: Option<&(dyn StdError + 'static)> = Some(e);
        while let Some(i) = inner {
            if let Some(tls) = i.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            inner = i
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|b| b as &(dyn StdError + 'static));
        }
        next = e.source();
    }
    None
}

/// The most specific messages in the chain (`tcp connect error: Connection refused`), without
/// reqwest's own wrapper, which repeats the URL.
fn cause(err: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    let mut next = err.source();
    while let Some(e) = next {
        let s = e.to_string();
        if !s.is_empty() && parts.last() != Some(&s) {
            parts.push(s);
        }
        next = e.source();
    }
    if parts.is_empty() {
        return err.to_string();
    }
    let keep = parts.len().saturating_sub(2);
    parts.split_off(keep).join(": ")
}

/// Reads at most `limit` bytes of the body and says whether `needle` is among them. A small
/// body is read to its end, so its connection goes back to the pool; a larger one is dropped at
/// the limit. Returns the bytes read and whether the needle was found.
pub(crate) async fn read_prefix(
    resp: &mut reqwest::Response,
    limit: usize,
    needle: &[u8],
) -> Result<(usize, bool), reqwest::Error> {
    let mut buf: Vec<u8> = Vec::with_capacity(limit.min(16 * 1024));
    let mut found = needle.is_empty();
    while buf.len() < limit {
        let Some(chunk) = resp.chunk().await? else {
            break;
        };
        // Only the new bytes (and the needle's length before them) can hold a new match.
        let from = buf.len().saturating_sub(needle.len().saturating_sub(1));
        let take = chunk.len().min(limit - buf.len());
        buf.extend_from_slice(&chunk[..take]);
        found = found || contains(&buf[from..], needle);
    }
    Ok((buf.len(), found))
}

/// Reads the whole body and throws it away; returns its length.
pub(crate) async fn drain(resp: &mut reqwest::Response) -> Result<u64, reqwest::Error> {
    let mut n = 0u64;
    while let Some(chunk) = resp.chunk().await? {
        n += chunk.len() as u64;
    }
    Ok(n)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_needles_anywhere_including_the_edges() {
        assert!(contains(b"healthy-v3", b"healthy-v3"));
        assert!(contains(b"xx healthy-v3", b"healthy-v3"));
        assert!(!contains(b"healthy-v", b"healthy-v3"));
        assert!(contains(b"", b""));
    }

    #[test]
    fn host_headers_must_be_header_values() {
        assert!(host_header(Some("www.example.com")).unwrap().is_some());
        assert!(host_header(None).unwrap().is_none());
        assert!(
            host_header(Some("bad\nhost"))
                .unwrap_err()
                .contains("not a valid Host")
        );
    }
}
