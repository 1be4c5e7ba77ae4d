//! Purging the origin shield: the Varnish cache rendered by
//! [`render_shield`](crate::render::shield_vcl::render_shield), purged through the `PURGE`
//! requests its VCL accepts from its ACL. Tags go in one `xkey-purge` header per request
//! (the `xkey` vmod removes every object carrying one of them); URLs are purged one request
//! each, under the URL's own `Host` (the shield's cache key includes the host).

use async_trait::async_trait;
use multicdn_core::traits::{PurgeReceipt, PurgeRequest, PurgeScope, Purger};
use multicdn_core::{Error, ProviderId, Stopwatch};
use url::Url;

/// Purges the shield at `base` (`http://127.0.0.1:6081/`).
#[derive(Debug, Clone)]
pub struct ShieldPurger {
    id: ProviderId,
    base: Url,
    client: reqwest::Client,
}

impl ShieldPurger {
    /// A purger for the shield listening at `base`.
    pub fn new(id: ProviderId, base: Url, client: reqwest::Client) -> ShieldPurger {
        ShieldPurger { id, base, client }
    }

    /// One `PURGE` of `path`; `host` is the `Host` the object was cached under (the shield's
    /// hash includes it), `keys` the tags for an `xkey` purge.
    async fn send(&self, path: &str, host: Option<&str>, keys: Option<&str>) -> Result<(), Error> {
        let request = format!("PURGE {path}");
        let url = self.base.join(path).map_err(|e| Error::InvalidRequest {
            provider: self.id.clone(),
            message: format!("{path:?} is not a path on the shield: {e}"),
        })?;
        let method = reqwest::Method::from_bytes(b"PURGE").map_err(|e| Error::InvalidRequest {
            provider: self.id.clone(),
            message: e.to_string(),
        })?;
        let mut rb = self.client.request(method, url);
        if let Some(h) = host {
            rb = rb.header(reqwest::header::HOST, h);
        }
        if let Some(k) = keys {
            rb = rb.header("xkey-purge", k);
        }
        let resp = rb.send().await.map_err(|e| {
            if e.is_connect() {
                Error::Connect {
                    provider: self.id.clone(),
                    request: request.clone(),
                    message: e.to_string(),
                }
            } else {
                Error::Transport {
                    provider: self.id.clone(),
                    request: request.clone(),
                    message: e.to_string(),
                }
            }
        })?;
        let status = resp.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        let message = resp.text().await.unwrap_or_default();
        if status == 405 {
            return Err(Error::Auth {
                provider: self.id.clone(),
                request,
                status,
                message: format!("the shield's purge ACL refused this address: {message}"),
            });
        }
        Err(Error::Vendor {
            provider: self.id.clone(),
            request,
            status,
            code: None,
            message,
            retryable: status >= 500,
            retry_after: None,
        })
    }
}

#[async_trait]
impl Purger for ShieldPurger {
    fn provider(&self) -> &ProviderId {
        &self.id
    }

    async fn purge(&self, request: &PurgeRequest) -> Result<PurgeReceipt, Error> {
        let watch = Stopwatch::start();
        let mut requests = 0;
        match &request.scope {
            PurgeScope::Tags(tags) => {
                if tags.iter().any(|t| t.is_empty() || t.contains([' ', ','])) {
                    return Err(Error::InvalidRequest {
                        provider: self.id.clone(),
                        message: "a tag is empty or contains a space or comma, which xkey reads as a separator".into(),
                    });
                }
                self.send("/", None, Some(&tags.join(" "))).await?;
                requests += 1;
            }
            PurgeScope::Urls(urls) => {
                for u in urls {
                    // A full URL is purged under its own host; a bare path under the
                    // shield's.
                    let (path, host) = match Url::parse(u) {
                        Ok(p) => {
                            let mut s = p.path().to_owned();
                            if let Some(q) = p.query() {
                                s.push('?');
                                s.push_str(q);
                            }
                            let host = p.host_str().map(|h| match p.port() {
                                Some(port) => format!("{h}:{port}"),
                                None => h.to_owned(),
                            });
                            (s, host)
                        }
                        Err(_) => (u.clone(), None),
                    };
                    self.send(&path, host.as_deref(), None).await?;
                    requests += 1;
                }
            }
            other => {
                return Err(Error::Unsupported {
                    provider: self.id.clone(),
                    feature: format!("purging {} on the shield", other.kind()),
                });
            }
        }
        Ok(PurgeReceipt::new(
            self.id.clone(),
            Vec::new(),
            request.scope.items().len(),
            requests,
            requests,
            watch.elapsed(),
        ))
    }
}
