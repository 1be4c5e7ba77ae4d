//! Purging the origin shield: the Varnish cache rendered by
//! [`render_shield`](crate::render::shield_vcl::render_shield), purged through the `PURGE`
//! requests its VCL accepts from its ACL. Tags go in one `xkey-purge` header per request
//! (the `xkey` vmod removes every object carrying one of them), as many as fit in a header
//! Varnish accepts; URLs are purged one request each, under the URL's own `Host` (the shield's
//! cache key includes the host). Requests go through the shared HTTP layer: timeouts, and
//! retries with backoff for a 5xx, a 429 or a connection that failed.
//!
//! In a [`PurgeFanout`](crate::fanout::PurgeFanout) the shield is a member of its own
//! ([`PurgeFanout::with_shield`](crate::fanout::PurgeFanout::with_shield)): it is purged first,
//! and the CDNs only once it has acknowledged, since a CDN purged before the shield refills
//! from the shield's stale copy.

use async_trait::async_trait;
use futures::StreamExt;
use multicdn_core::policy::ShieldSpec;
use multicdn_core::traits::{KindPacing, Pacing, PurgeReceipt, PurgeRequest, PurgeScope, Purger};
use multicdn_core::{Error, ProviderId, Stopwatch};
use reqwest::Method;
use url::Url;

use crate::http::{Answer, HttpSettings, VendorHttp};
use crate::render::shield_vcl::ShieldTarget;

/// The longest `xkey-purge` header sent, in bytes: well inside Varnish's default
/// `http_req_hdr_len` (8 KiB), so a long list of tags is split rather than refused.
pub const MAX_TAG_HEADER_BYTES: usize = 4096;

/// Most tags in one [`PurgeFanout`](crate::fanout::PurgeFanout) chunk sent to the shield
/// (each chunk is then split by [`MAX_TAG_HEADER_BYTES`]).
pub const TAGS_PER_CHUNK: usize = 256;

/// URL purges in flight at once within one call.
const URLS_IN_FLIGHT: usize = 8;

/// The id a shield built from the policy has in purge reports and events.
pub const SHIELD_ID: &str = ShieldSpec::ID;

/// Purges the shield at a base URL (`http://10.0.0.5:6081/`).
#[derive(Debug, Clone)]
pub struct ShieldPurger {
    http: VendorHttp,
}

impl ShieldPurger {
    /// A purger for the shield listening at `base`. The shield authenticates by address (its
    /// `purgers` ACL) and is sent no credential, so plain HTTP is allowed to any host.
    pub fn new(id: ProviderId, base: &str, settings: HttpSettings) -> Result<ShieldPurger, Error> {
        Ok(ShieldPurger {
            http: VendorHttp::without_credentials(id, base, settings)?,
        })
    }

    /// The purger for the policy's `shield` section; `base` overrides the section's `url` (a
    /// test, or a tunnel). [`SHIELD_ID`] is the conventional id.
    pub fn from_spec(
        id: ProviderId,
        spec: &ShieldSpec,
        base: Option<&str>,
        settings: HttpSettings,
    ) -> Result<ShieldPurger, Error> {
        ShieldPurger::new(id, base.unwrap_or(&spec.url), settings)
    }

    fn invalid(&self, message: String) -> Error {
        Error::InvalidRequest {
            provider: self.http.provider().clone(),
            message,
        }
    }

    /// One `PURGE` of `path`; `host` is the `Host` the object was cached under (the shield's
    /// hash includes it), `keys` the tags for an `xkey` purge. Returns the attempts made.
    async fn send(&self, path: &str, host: Option<&str>, keys: Option<&str>) -> Result<u32, Error> {
        let label = match keys {
            Some(k) => format!("PURGE {path} ({} tags)", k.split(' ').count()),
            None => format!("PURGE {path}"),
        };
        let method = Method::from_bytes(b"PURGE").map_err(|e| self.invalid(e.to_string()))?;
        let sent = self
            .http
            .send(
                &label,
                || {
                    let mut rb = self.http.request(method.clone(), path);
                    if let Some(h) = host {
                        rb = rb.header(reqwest::header::HOST, h);
                    }
                    if let Some(k) = keys {
                        rb = rb.header("xkey-purge", k);
                    }
                    rb
                },
                |answer| self.read(&label, answer),
            )
            .await?;
        Ok(sent.attempts)
    }

    /// The shield's answer: `200` purged; `405` the ACL refused this address (the VCL's
    /// answer to a purger it does not know); anything else the HTTP layer's reading.
    fn read(&self, label: &str, answer: &Answer) -> Result<(), Error> {
        let status = answer.status.as_u16();
        if status == 200 {
            return Ok(());
        }
        let message = answer.text();
        if status == 405 {
            return Err(Error::Auth {
                provider: self.http.provider().clone(),
                request: label.to_owned(),
                status,
                message: format!(
                    "the shield's purge ACL refused this address (add it to shield.purgers and deploy the shield's VCL): {}",
                    message.trim()
                ),
            });
        }
        Err(self.http.status_error(label, answer, None, message))
    }

    /// Purges each `(path, host)`, a few at a time; the attempts made, or the first error.
    async fn send_urls(&self, targets: Vec<(String, Option<String>)>) -> Result<u32, Error> {
        let results: Vec<Result<u32, Error>> = futures::stream::iter(targets)
            .map(|(path, host)| async move { self.send(&path, host.as_deref(), None).await })
            .buffer_unordered(URLS_IN_FLIGHT)
            .collect()
            .await;
        results.into_iter().sum()
    }

    /// The tags in `headers` of at most [`MAX_TAG_HEADER_BYTES`] each.
    fn tag_headers(tags: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for t in tags {
            match out.last_mut() {
                Some(h) if h.len() + 1 + t.len() <= MAX_TAG_HEADER_BYTES => {
                    h.push(' ');
                    h.push_str(t);
                }
                _ => out.push(t.clone()),
            }
        }
        out
    }

    /// The path (with query) and `Host` a URL item is purged as: a full URL under its own
    /// host, a bare path under the shield's.
    fn url_target(&self, item: &str) -> Result<(String, Option<String>), Error> {
        if item.starts_with('/') {
            return Ok((item.to_owned(), None));
        }
        let u = Url::parse(item).map_err(|e| {
            self.invalid(format!(
                "{item:?} is neither a URL nor a path starting with /: {e}"
            ))
        })?;
        let mut path = u.path().to_owned();
        if let Some(q) = u.query() {
            path.push('?');
            path.push_str(q);
        }
        let host = u.host_str().map(|h| match u.port() {
            Some(port) => format!("{h}:{port}"),
            None => h.to_owned(),
        });
        Ok((path, host))
    }
}

#[async_trait]
impl Purger for ShieldPurger {
    fn provider(&self) -> &ProviderId {
        self.http.provider()
    }

    /// Tags and URLs; the rendered VCL has no purge by host, prefix or everything, and no
    /// soft purge.
    fn pacing(&self) -> Pacing {
        let none = |scope: PurgeScope| (scope, None);
        [
            (
                PurgeScope::Urls(Vec::new()),
                Some(KindPacing::new(1, Vec::new())),
            ),
            (
                PurgeScope::Tags(Vec::new()),
                Some(KindPacing::new(TAGS_PER_CHUNK, Vec::new())),
            ),
            none(PurgeScope::Hosts(Vec::new())),
            none(PurgeScope::Prefixes(Vec::new())),
            none(PurgeScope::Everything),
        ]
        .into_iter()
        .fold(Pacing::unlimited(1), |p, (scope, k)| p.with_kind(&scope, k))
    }

    fn validate(&self, request: &PurgeRequest) -> Result<(), Error> {
        self.pacing()
            .check(request)
            .map_err(|feature| Error::Unsupported {
                provider: self.provider().clone(),
                feature: format!("{feature} on the shield"),
            })?;
        match &request.scope {
            PurgeScope::Tags(tags) => {
                if let Some(t) = tags.iter().find(|t| {
                    t.is_empty() || t.contains([' ', ',']) || t.len() > MAX_TAG_HEADER_BYTES
                }) {
                    return Err(self.invalid(format!(
                        "tag {t:?} is empty, contains a space or comma (which xkey reads as a separator), or is longer than {MAX_TAG_HEADER_BYTES} bytes; nothing was purged"
                    )));
                }
            }
            PurgeScope::Urls(urls) => {
                for u in urls {
                    self.url_target(u)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn purge(&self, request: &PurgeRequest) -> Result<PurgeReceipt, Error> {
        self.validate(request)?;
        let watch = Stopwatch::start();
        let items = request.scope.items();
        let (requests, attempts) = match &request.scope {
            PurgeScope::Tags(tags) => {
                let mut attempts = 0;
                let headers = ShieldPurger::tag_headers(tags);
                for h in &headers {
                    attempts += self.send("/", None, Some(h)).await?;
                }
                (headers.len(), attempts)
            }
            _ => {
                let targets = items
                    .iter()
                    .map(|u| self.url_target(u))
                    .collect::<Result<Vec<_>, Error>>()?;
                let n = targets.len();
                (n, self.send_urls(targets).await?)
            }
        };
        Ok(PurgeReceipt::new(
            self.provider().clone(),
            Vec::new(),
            items.len(),
            u32::try_from(requests).unwrap_or(u32::MAX),
            attempts,
            watch.elapsed(),
        ))
    }
}

impl ShieldTarget {
    /// The rendering target the policy's `shield` section describes.
    pub fn from_spec(spec: &ShieldSpec) -> ShieldTarget {
        ShieldTarget {
            origin_host: spec.origin_host.clone(),
            origin_port: spec.origin_port,
            purgers: spec.purgers.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_tag_lists_are_split_into_headers_varnish_accepts() {
        let tags: Vec<String> = (0..2000).map(|i| format!("product-{i:05}")).collect();
        let headers = ShieldPurger::tag_headers(&tags);
        assert!(headers.len() > 1);
        assert!(headers.iter().all(|h| h.len() <= MAX_TAG_HEADER_BYTES));
        let back: Vec<&str> = headers.iter().flat_map(|h| h.split(' ')).collect();
        assert_eq!(back.len(), tags.len());
        assert!(back.iter().zip(&tags).all(|(a, b)| a == b));
    }
}
