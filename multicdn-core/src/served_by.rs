//! Which provider served a response: one normalised value from `Server-Timing` or, failing
//! that, the vendors' own headers.
//!
//! Both edges are configured to emit `Server-Timing: cdn;desc="fastly", pop;desc="LHR",
//! cache;desc="HIT"`. When that is missing, Fastly's `x-served-by` / `x-cache` and Cloudflare's
//! `cf-ray` / `cf-cache-status`, and Akamai's `Akamai-Cache-Status`, `X-Cache` (`TCP_HIT from
//! a23-45-67-89.deploy.akamaitechnologies.com`), `Server: AkamaiGHost`, `X-Akamai-Request-ID`
//! and `Server-Timing: cdn-cache;desc=HIT` are read. Akamai's headers name an edge server, not a
//! PoP, so an Akamai answer identified by them has no `pop`. Malformed headers give `None` or an error value; no
//! input makes this module panic.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Read access to a response's headers, by case-insensitive name.
pub trait HeaderLookup {
    /// Every value of the header `name` (lowercase), in order.
    fn header_values(&self, name: &str) -> Vec<&str>;
}

impl HeaderLookup for http::HeaderMap {
    fn header_values(&self, name: &str) -> Vec<&str> {
        self.get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> HeaderLookup for [(K, V)] {
    fn header_values(&self, name: &str) -> Vec<&str> {
        self.iter()
            .filter(|(k, _)| k.as_ref().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
            .collect()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> HeaderLookup for Vec<(K, V)> {
    fn header_values(&self, name: &str) -> Vec<&str> {
        self.as_slice().header_values(name)
    }
}

/// A cache's verdict on one request, normalised across vendors.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum CacheStatus {
    /// Served from cache.
    Hit,
    /// Fetched from the origin.
    Miss,
    /// Was in cache but stale; refetched.
    Expired,
    /// Served stale (while revalidating, or on error).
    Stale,
    /// Not cacheable by rule (Cloudflare `BYPASS`, Fastly `PASS`).
    Bypass,
    /// Not eligible for cache (Cloudflare `DYNAMIC`).
    Dynamic,
    /// Revalidated with the origin.
    Revalidated,
    /// Being refreshed in the background.
    Updating,
    /// A value this library does not know, kept as written.
    Other(String),
}

impl CacheStatus {
    /// Reads a vendor's cache word (any case).
    pub fn parse(s: &str) -> CacheStatus {
        match s.trim().to_ascii_uppercase().as_str() {
            "HIT" | "HIT-STALE" | "HIT-CLUSTER" => CacheStatus::Hit,
            "MISS" => CacheStatus::Miss,
            "EXPIRED" => CacheStatus::Expired,
            "STALE" => CacheStatus::Stale,
            "BYPASS" | "PASS" => CacheStatus::Bypass,
            "DYNAMIC" => CacheStatus::Dynamic,
            "REVALIDATED" => CacheStatus::Revalidated,
            "UPDATING" => CacheStatus::Updating,
            other => CacheStatus::Other(other.to_owned()),
        }
    }

    /// True for the verdicts that did not go to the origin.
    pub fn is_hit(&self) -> bool {
        matches!(
            self,
            CacheStatus::Hit | CacheStatus::Stale | CacheStatus::Updating
        )
    }
}

impl fmt::Display for CacheStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Expired => "EXPIRED",
            CacheStatus::Stale => "STALE",
            CacheStatus::Bypass => "BYPASS",
            CacheStatus::Dynamic => "DYNAMIC",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Updating => "UPDATING",
            CacheStatus::Other(s) => s,
        };
        f.write_str(s)
    }
}

/// Where a response came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedBy {
    /// The provider, lowercase as the edge names itself (`fastly`, `cloudflare`).
    pub provider: String,
    /// The point of presence, uppercase (`LHR`), when known.
    pub pop: Option<String>,
    /// The cache verdict, when known.
    pub cache: Option<CacheStatus>,
}

impl fmt::Display for ServedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.provider)?;
        if let Some(pop) = &self.pop {
            write!(f, " {pop}")?;
        }
        if let Some(cache) = &self.cache {
            write!(f, " {cache}")?;
        }
        Ok(())
    }
}

/// One `Server-Timing` metric: a name, an optional `dur` and an optional `desc`.
#[derive(Debug, Clone, PartialEq)]
pub struct TimingEntry {
    /// The metric's name (`cdn`, `pop`, `cache`).
    pub name: String,
    /// `dur`, in milliseconds.
    pub duration_ms: Option<f64>,
    /// `desc`, unquoted.
    pub description: Option<String>,
}

/// Why a `Server-Timing` value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed Server-Timing at byte {at}: {why}")]
pub struct ServerTimingError {
    /// Byte offset of the problem.
    pub at: usize,
    /// What was wrong.
    pub why: &'static str,
}

/// Parses a `Server-Timing` header value (RFC-style `name;dur=1.2;desc="text", ...`).
pub fn parse_server_timing(value: &str) -> Result<Vec<TimingEntry>, ServerTimingError> {
    let mut entries = Vec::new();
    let mut p = Cursor { s: value, i: 0 };
    loop {
        p.skip_ws();
        if p.done() {
            break;
        }
        let name = p.token();
        if name.is_empty() {
            return Err(p.err("expected a metric name"));
        }
        let mut entry = TimingEntry {
            name: name.to_owned(),
            duration_ms: None,
            description: None,
        };
        loop {
            p.skip_ws();
            if !p.eat(';') {
                break;
            }
            p.skip_ws();
            let key = p.token().to_ascii_lowercase();
            if key.is_empty() {
                return Err(p.err("expected a parameter name after ';'"));
            }
            p.skip_ws();
            let val = if p.eat('=') {
                p.skip_ws();
                Some(p.value()?)
            } else {
                None
            };
            match (key.as_str(), val) {
                ("dur", Some(v)) => {
                    entry.duration_ms = Some(v.parse().map_err(|_| p.err("dur is not a number"))?)
                }
                ("desc", Some(v)) => entry.description = Some(v),
                _ => {}
            }
        }
        entries.push(entry);
        p.skip_ws();
        if p.done() {
            break;
        }
        if !p.eat(',') {
            return Err(p.err("expected ',' between metrics"));
        }
    }
    Ok(entries)
}

struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Cursor<'a> {
    fn done(&self) -> bool {
        self.i >= self.s.len()
    }
    fn peek(&self) -> Option<char> {
        self.s[self.i..].chars().next()
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.i += c.len_utf8();
            true
        } else {
            false
        }
    }
    fn skip_ws(&mut self) {
        while let Some(c) = self.peek().filter(|c| *c == ' ' || *c == '\t') {
            self.i += c.len_utf8();
        }
    }
    fn token(&mut self) -> &'a str {
        let start = self.i;
        while let Some(c) = self
            .peek()
            .filter(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(*c))
        {
            self.i += c.len_utf8();
        }
        &self.s[start..self.i]
    }
    fn value(&mut self) -> Result<String, ServerTimingError> {
        if !self.eat('"') {
            return Ok(self.token().to_owned());
        }
        let mut out = String::new();
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated quoted string")),
                Some('"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some('\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(c) => {
                            out.push(c);
                            self.i += c.len_utf8();
                        }
                        None => return Err(self.err("unterminated escape")),
                    }
                }
                Some(c) => {
                    out.push(c);
                    self.i += c.len_utf8();
                }
            }
        }
    }
    fn err(&self, why: &'static str) -> ServerTimingError {
        ServerTimingError { at: self.i, why }
    }
}

/// Reads `Server-Timing` first, then the vendors' headers. `None` when nothing identifies a
/// provider (or the only identifying header is malformed).
pub fn served_by(headers: &(impl HeaderLookup + ?Sized)) -> Option<ServedBy> {
    let vendor = || {
        from_fastly(headers)
            .or_else(|| from_cloudflare(headers))
            .or_else(|| from_akamai(headers))
    };
    match from_server_timing(headers) {
        // An edge that names itself but not its PoP or cache verdict (Cloudflare's rules
        // language cannot read the PoP) is completed from its own vendor headers.
        Some(mut timing) if timing.pop.is_none() || timing.cache.is_none() => {
            if let Some(v) = vendor().filter(|v| v.provider == timing.provider) {
                timing.pop = timing.pop.or(v.pop);
                timing.cache = timing.cache.or(v.cache);
            }
            Some(timing)
        }
        Some(timing) => Some(timing),
        None => vendor(),
    }
}

fn from_server_timing(headers: &(impl HeaderLookup + ?Sized)) -> Option<ServedBy> {
    let mut provider = None;
    let mut pop = None;
    let mut cache = None;
    for value in headers.header_values("server-timing") {
        // A malformed Server-Timing is skipped; the vendor headers may still answer.
        let Ok(entries) = parse_server_timing(value) else {
            continue;
        };
        for e in entries {
            let Some(desc) = e.description.filter(|d| !d.is_empty()) else {
                continue;
            };
            match e.name.to_ascii_lowercase().as_str() {
                "cdn" => provider = Some(desc.to_ascii_lowercase()),
                "pop" => pop = Some(desc.to_ascii_uppercase()),
                "cache" => cache = Some(CacheStatus::parse(&desc)),
                _ => {}
            }
        }
    }
    provider.map(|provider| ServedBy {
        provider,
        pop,
        cache,
    })
}

fn last_listed(value: &str) -> Option<&str> {
    value.rsplit(',').map(str::trim).find(|s| !s.is_empty())
}

fn from_fastly(headers: &(impl HeaderLookup + ?Sized)) -> Option<ServedBy> {
    let served = headers.header_values("x-served-by");
    let served = served.last().and_then(|v| last_listed(v))?;
    // `cache-lhr7361-LHR`: the node name, then the PoP after the last dash.
    if !served.starts_with("cache-") {
        return None;
    }
    let pop = served
        .rsplit('-')
        .next()
        .filter(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphabetic()))
        .map(str::to_ascii_uppercase);
    let cache = headers
        .header_values("x-cache")
        .last()
        .and_then(|v| last_listed(v))
        .map(CacheStatus::parse);
    Some(ServedBy {
        provider: "fastly".to_owned(),
        pop,
        cache,
    })
}

fn from_cloudflare(headers: &(impl HeaderLookup + ?Sized)) -> Option<ServedBy> {
    let rays = headers.header_values("cf-ray");
    let ray = rays.first()?.trim();
    // `7d1c2a3b4c5d6e7f-LHR`: a hex id, a dash, the PoP.
    let (id, pop) = ray.split_once('-')?;
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let pop = Some(pop.trim())
        .filter(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphabetic()))
        .map(str::to_ascii_uppercase);
    let cache = headers
        .header_values("cf-cache-status")
        .first()
        .map(|v| CacheStatus::parse(v));
    Some(ServedBy {
        provider: "cloudflare".to_owned(),
        pop,
        cache,
    })
}

/// Akamai's cache word of `X-Cache` (`TCP_HIT`, `TCP_MEM_HIT`, `TCP_REFRESH_MISS`, ...).
fn akamai_x_cache(word: &str) -> CacheStatus {
    match word.trim().to_ascii_uppercase().as_str() {
        "TCP_HIT" | "TCP_MEM_HIT" | "TCP_IMS_HIT" | "TCP_NEGATIVE_HIT" => CacheStatus::Hit,
        "TCP_REFRESH_HIT" | "TCP_REFRESH_FAIL_HIT" => CacheStatus::Revalidated,
        "TCP_REFRESH_MISS" => CacheStatus::Expired,
        "TCP_MISS" => CacheStatus::Miss,
        "TCP_DENIED" | "TCP_COOKIE_DENY" => CacheStatus::Bypass,
        other => CacheStatus::Other(other.to_owned()),
    }
}

fn from_akamai(headers: &(impl HeaderLookup + ?Sized)) -> Option<ServedBy> {
    let x_cache = headers
        .header_values("x-cache")
        .into_iter()
        .find(|v| v.contains("akamaitechnologies.com") || v.contains("AkamaiGHost"));
    // `Hit from child`, `Miss from child, Miss from parent`: the edge's verdict comes first.
    let status = headers
        .header_values("akamai-cache-status")
        .first()
        .and_then(|v| v.split_whitespace().next())
        .map(CacheStatus::parse);
    let ghost = headers
        .header_values("server")
        .iter()
        .any(|v| v.trim_start().starts_with("AkamaiGHost"));
    let request_id = !headers.header_values("x-akamai-request-id").is_empty();
    if x_cache.is_none() && status.is_none() && !ghost && !request_id {
        return None;
    }
    let timing = || {
        headers
            .header_values("server-timing")
            .into_iter()
            .filter_map(|v| parse_server_timing(v).ok())
            .flatten()
            .find(|e| e.name.eq_ignore_ascii_case("cdn-cache"))
            .and_then(|e| e.description)
            .map(|d| CacheStatus::parse(&d))
    };
    let cache = status
        .or_else(|| {
            x_cache
                .and_then(|v| v.split_whitespace().next())
                .map(akamai_x_cache)
        })
        .or_else(timing);
    Some(ServedBy {
        provider: "akamai".to_owned(),
        pop: None,
        cache,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_the_configured_server_timing() {
        let h = vec![(
            "Server-Timing",
            r#"cdn;desc="fastly", pop;desc="LHR", cache;desc="HIT""#,
        )];
        let s = served_by(&h).unwrap();
        assert_eq!(s.provider, "fastly");
        assert_eq!(s.pop.as_deref(), Some("LHR"));
        assert_eq!(s.cache, Some(CacheStatus::Hit));
    }

    #[test]
    fn server_timing_entries_keep_dur_and_escapes() {
        let e = parse_server_timing(r#"db;dur=53.2, cdn;desc="a \"b\"", miss"#).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].duration_ms, Some(53.2));
        assert_eq!(e[1].description.as_deref(), Some(r#"a "b""#));
        assert_eq!(e[2].name, "miss");
    }

    #[test]
    fn falls_back_to_fastly_headers_taking_the_edge_not_the_shield() {
        let h = vec![
            ("x-served-by", "cache-iad-kiad7000-IAD, cache-lhr7361-LHR"),
            ("x-cache", "MISS, HIT"),
        ];
        let s = served_by(&h).unwrap();
        assert_eq!(
            (s.provider.as_str(), s.pop.as_deref()),
            ("fastly", Some("LHR"))
        );
        assert_eq!(s.cache, Some(CacheStatus::Hit));
    }

    #[test]
    fn falls_back_to_cloudflare_headers() {
        let h = vec![
            ("cf-ray", "7d1c2a3b4c5d6e7f-LHR"),
            ("cf-cache-status", "DYNAMIC"),
        ];
        let s = served_by(&h).unwrap();
        assert_eq!(
            (s.provider.as_str(), s.pop.as_deref()),
            ("cloudflare", Some("LHR"))
        );
        assert_eq!(s.cache, Some(CacheStatus::Dynamic));
    }

    #[test]
    fn falls_back_to_akamai_headers() {
        let h = vec![
            (
                "x-cache",
                "TCP_MEM_HIT from a23-45-67-89.deploy.akamaitechnologies.com (AkamaiGHost/10.2.0-51210853) (-)",
            ),
            ("x-akamai-request-id", "2f4e8a1.4b3c2d"),
        ];
        let s = served_by(&h).unwrap();
        assert_eq!((s.provider.as_str(), s.pop), ("akamai", None));
        assert_eq!(s.cache, Some(CacheStatus::Hit));
        // Akamai-Cache-Status wins over X-Cache; the edge's verdict is the first.
        let h = vec![
            ("akamai-cache-status", "Miss from child, Hit from parent"),
            (
                "x-cache",
                "TCP_HIT from a1-2-3-4.deploy.akamaitechnologies.com",
            ),
        ];
        assert_eq!(served_by(&h).unwrap().cache, Some(CacheStatus::Miss));
        let h = vec![(
            "x-cache",
            "TCP_REFRESH_MISS from a1-2-3-4.deploy.akamaitechnologies.com",
        )];
        assert_eq!(served_by(&h).unwrap().cache, Some(CacheStatus::Expired));
        // Server: AkamaiGHost with Akamai's own Server-Timing entries.
        let h = vec![
            ("server", "AkamaiGHost"),
            ("server-timing", "cdn-cache; desc=HIT, edge; dur=1"),
        ];
        let s = served_by(&h).unwrap();
        assert_eq!(s.provider, "akamai");
        assert_eq!(s.cache, Some(CacheStatus::Hit));
        // An Akamai-served answer naming itself in the configured Server-Timing is completed
        // with the cache verdict from Akamai's headers.
        let h = vec![
            ("server-timing", r#"cdn;desc="akamai", pop;desc="FRA""#),
            ("akamai-cache-status", "Hit from child"),
        ];
        let s = served_by(&h).unwrap();
        assert_eq!(
            (s.provider.as_str(), s.pop.as_deref(), s.cache),
            ("akamai", Some("FRA"), Some(CacheStatus::Hit))
        );
        // A plain X-Cache that is neither Fastly's nor Akamai's identifies nobody.
        let h = vec![("x-cache", "HIT"), ("server", "nginx")];
        assert_eq!(served_by(&h), None);
    }

    #[test]
    fn malformed_headers_give_none_or_errors() {
        assert!(parse_server_timing(r#"cdn;desc="unterminated"#).is_err());
        assert!(parse_server_timing("cdn;dur=fast").is_err());
        assert!(parse_server_timing(";;;").is_err());
        let h = vec![
            ("server-timing", r#"cdn;desc="#),
            ("cf-ray", "not-hex-LHR"),
            ("x-served-by", "varnish"),
        ];
        assert_eq!(served_by(&h), None);
        let none: Vec<(&str, &str)> = vec![];
        assert_eq!(served_by(&none), None);
    }

    #[test]
    fn completes_a_server_timing_without_pop_from_the_vendor_headers() {
        let h = vec![
            (
                "server-timing",
                r#"cdn;desc="cloudflare", cache;desc="HIT""#,
            ),
            ("cf-ray", "7d1c2a3b4c5d6e7f-SYD"),
        ];
        let s = served_by(&h).unwrap();
        assert_eq!(s.pop.as_deref(), Some("SYD"));
        assert_eq!(s.cache, Some(CacheStatus::Hit));
        // Another vendor's headers never fill in the gap.
        let h = vec![
            ("server-timing", r#"cdn;desc="cloudflare""#),
            ("x-served-by", "cache-lhr7361-LHR"),
        ];
        assert_eq!(served_by(&h).unwrap().pop, None);
    }

    #[test]
    fn reads_http_header_maps() {
        let mut map = http::HeaderMap::new();
        map.insert(
            "server-timing",
            r#"cdn;desc="cloudflare", pop;desc="sin""#.parse().unwrap(),
        );
        let s = served_by(&map).unwrap();
        assert_eq!(
            (s.provider.as_str(), s.pop.as_deref()),
            ("cloudflare", Some("SIN"))
        );
    }

    proptest! {
        #[test]
        fn never_panics_on_any_header(st in "\\PC{0,40}", ray in "\\PC{0,20}", xs in "\\PC{0,30}") {
            let h = vec![("server-timing", st.as_str()), ("cf-ray", ray.as_str()), ("x-served-by", xs.as_str())];
            let _ = served_by(&h);
            let _ = parse_server_timing(&st);
        }
    }
}
