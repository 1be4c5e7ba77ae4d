//! Base URLs: configurable for tests and proxies, HTTPS everywhere but loopback.

use std::net::IpAddr;

use multicdn_core::{Error, ProviderId};

/// Parses `base`, refusing plain HTTP except to a loopback address (`127.0.0.0/8`, `::1`,
/// `localhost`), so a credential never crosses a network unencrypted.
pub fn check_base_url(provider: &ProviderId, base: &str) -> Result<url::Url, Error> {
    let invalid = |message: String| Error::InvalidRequest {
        provider: provider.clone(),
        message,
    };
    let url = url::Url::parse(base)
        .map_err(|e| invalid(format!("base URL {base:?} is not a URL ({e})")))?;
    let host = url.host_str().unwrap_or_default();
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match url.scheme() {
        "https" => Ok(url),
        "http" if loopback => Ok(url),
        "http" => Err(invalid(format!(
            "base URL {base:?} uses plain HTTP; use https:// (plain http is allowed on loopback only)"
        ))),
        other => Err(invalid(format!(
            "base URL {base:?} has scheme {other:?}; use https://"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_everywhere_http_on_loopback_only() {
        let p = ProviderId::new("fastly").unwrap();
        assert!(check_base_url(&p, "https://api.fastly.com").is_ok());
        assert!(check_base_url(&p, "http://127.0.0.1:8080").is_ok());
        assert!(check_base_url(&p, "http://[::1]:8080").is_ok());
        assert!(check_base_url(&p, "http://localhost:1").is_ok());
        let e = check_base_url(&p, "http://api.fastly.com").unwrap_err();
        assert!(e.to_string().contains("plain HTTP"), "{e}");
        assert!(check_base_url(&p, "ftp://x").is_err());
        assert!(check_base_url(&p, "not a url").is_err());
    }
}
