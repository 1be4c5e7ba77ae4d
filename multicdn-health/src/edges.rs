//! Where each provider's edge is, and the probe targets a policy implies.
//!
//! Requests go to each provider's edge hostname (`https://example.map.fastly.net`) with the
//! site's `Host`, so a specific edge answers with the site's configuration rather than whatever
//! DNS picks (seed 000, section 11). A base URL can be overridden per provider, which is how
//! tests and the quickstart point edges at `http://127.0.0.1:PORT`.

use std::collections::BTreeMap;

use multicdn_core::{Policy, ProviderId, Target};

use crate::error::HealthError;

/// One provider's edge: the base URL requests for it are sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The provider.
    pub provider: ProviderId,
    base_url: String,
}

impl Edge {
    /// An edge at `base_url` (`https://example.map.fastly.net`, `http://127.0.0.1:8080`): http
    /// or https, with a host, and no query or fragment.
    pub fn new(provider: ProviderId, base_url: &str) -> Result<Edge, HealthError> {
        let bad = |message: &str| HealthError::EdgeUrl {
            provider: provider.clone(),
            url: base_url.to_owned(),
            message: message.to_owned(),
        };
        let url = reqwest::Url::parse(base_url).map_err(|e| {
            bad(&format!(
                "{e}; write https://edge.example.net or http://127.0.0.1:8080"
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("the scheme must be http or https"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("it has no host"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("a base URL takes no query or fragment"));
        }
        Ok(Edge {
            base_url: base_url.trim_end_matches('/').to_owned(),
            provider,
        })
    }

    /// The base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The URL of `path` through this edge. A path without a leading `/` gets one.
    pub fn url_for(&self, path: &str) -> String {
        if path.starts_with('/') {
            format!("{}{path}", self.base_url)
        } else {
            format!("{}/{path}", self.base_url)
        }
    }
}

/// Every provider's edge from the policy: `https://{edge_host}`, unless `overrides` gives a
/// base URL for it. An override for a provider the policy does not name is an error (a typo
/// would otherwise probe the real edge).
pub fn edges_from_policy(
    policy: &Policy,
    overrides: &BTreeMap<ProviderId, String>,
) -> Result<Vec<Edge>, HealthError> {
    if let Some(unknown) = overrides
        .keys()
        .find(|p| !policy.providers.contains_key(*p))
    {
        return Err(HealthError::UnknownProvider {
            provider: unknown.clone(),
            known: policy
                .providers
                .keys()
                .map(ProviderId::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    policy
        .providers
        .iter()
        .map(|(id, spec)| match overrides.get(id) {
            Some(url) => Edge::new(id.clone(), url),
            None => Edge::new(id.clone(), &format!("https://{}", spec.edge_host)),
        })
        .collect()
}

/// One probe target per provider from the policy's health section: the health object through
/// each edge, with the site's `Host`, the expected content and statuses, and the deadline.
pub fn targets_from_policy(
    policy: &Policy,
    overrides: &BTreeMap<ProviderId, String>,
) -> Result<Vec<Target>, HealthError> {
    let health = &policy.health;
    Ok(edges_from_policy(policy, overrides)?
        .into_iter()
        .map(|edge| {
            Target::new(
                edge.provider.clone(),
                edge.url_for(&health.path),
                health.expect.clone(),
            )
            .with_host(policy.site.host.clone())
            .with_expect_status(health.expect_status.clone())
            .with_timeout(health.timeout.get())
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn policy() -> Policy {
        Policy::load(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/policy.yaml"
        ))
        .unwrap()
    }

    fn id(s: &str) -> ProviderId {
        ProviderId::new(s).unwrap()
    }

    #[test]
    fn targets_fetch_the_health_object_through_every_edge() {
        let t = targets_from_policy(&policy(), &BTreeMap::new()).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].provider, id("cloudflare"));
        assert_eq!(
            t[0].url,
            "https://example.cdn.cloudflare.net/_health/v3.txt"
        );
        assert_eq!(t[1].url, "https://example.map.fastly.net/_health/v3.txt");
        for target in &t {
            assert_eq!(target.host.as_deref(), Some("www.example.com"));
            assert_eq!(target.expect_body, "healthy-v3");
            assert_eq!(target.expect_status, vec![200]);
            assert_eq!(target.timeout, Duration::from_secs(3));
        }
    }

    #[test]
    fn overrides_point_edges_at_loopback() {
        let o = BTreeMap::from([(id("fastly"), "http://127.0.0.1:8080/".to_owned())]);
        let t = targets_from_policy(&policy(), &o).unwrap();
        assert_eq!(t[1].url, "http://127.0.0.1:8080/_health/v3.txt");
        assert_eq!(
            t[0].url,
            "https://example.cdn.cloudflare.net/_health/v3.txt"
        );
    }

    #[test]
    fn overrides_for_unknown_providers_or_bad_urls_are_refused() {
        let o = BTreeMap::from([(id("fastlly"), "http://127.0.0.1:1".to_owned())]);
        let e = targets_from_policy(&policy(), &o).unwrap_err().to_string();
        assert!(
            e.contains("fastlly") && e.contains("cloudflare, fastly"),
            "{e}"
        );
        for bad in ["127.0.0.1:8080", "ftp://x", "http://x/?a=1", "not a url"] {
            let e = Edge::new(id("fastly"), bad).unwrap_err().to_string();
            assert!(e.starts_with("fastly: edge base URL"), "{e}");
        }
    }

    #[test]
    fn paths_join_with_exactly_one_slash() {
        let e = Edge::new(id("fastly"), "http://127.0.0.1:8080/").unwrap();
        assert_eq!(e.url_for("/a"), "http://127.0.0.1:8080/a");
        assert_eq!(e.url_for("a"), "http://127.0.0.1:8080/a");
    }
}
