//! Akamai's Fast Purge v3 API behind its API gateway, as strict as the vendor:
//!
//! - `POST /ccu/v3/{invalidate|delete}/{url|tag|cpcode}[/{staging|production}]`; any other
//!   path a 404, any other method a 405;
//! - the gateway checks `Authorization: EG1-HMAC-SHA256 ...` against the API client's
//!   credentials, recomputing the signature (method, scheme, `Host`, path, the content hash of
//!   at most 128 KiB of the body) and refusing a nonce seen before: 401 in the gateway's
//!   problem envelope (`type`, `title`, `status`, `detail`, `instance`);
//! - `Content-Type: application/json` (else 415), a body of at most 50,000 bytes (else 413),
//!   `{"objects": [...]}` non-empty, strings for URLs (full http(s) URLs) and tags, positive
//!   integers for CP codes (else 400 in Fast Purge's envelope: `supportId`, `title`,
//!   `httpStatus`, `detail`, `describedBy`);
//! - accepted: 201 `{"httpStatus", "detail", "estimatedSeconds", "purgeId", "supportId"}`;
//! - [`Fault::RateLimited`] answers 429 with Akamai's `X-Ratelimit-*` headers and
//!   `Retry-After`, then clears.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use crate::purge::{Fault, hang};
use crate::serve::serve;

/// The largest body Fast Purge accepts.
pub const AKAMAI_MAX_BODY: usize = 50_000;
/// The body prefix the gateway hashes.
const GATEWAY_MAX_BODY: usize = 131_072;

/// One accepted purge: action, object type, network, objects.
pub type AkamaiPurge = (String, String, String, Vec<Value>);

#[derive(Debug, Default)]
struct Inner {
    purges: Vec<AkamaiPurge>,
    nonces: HashSet<String>,
    refused: Vec<(u16, String)>,
    fault: Option<Fault>,
    max_body: Option<usize>,
    next: u64,
}

#[derive(Debug)]
struct Shared {
    client_token: String,
    client_secret: String,
    access_token: String,
    inner: Mutex<Inner>,
}

/// A running Fast Purge stub; stops when dropped.
#[derive(Debug)]
pub struct AkamaiApi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: oneshot::Sender<()>,
}

impl AkamaiApi {
    /// Starts a stub accepting the API client with these credentials.
    pub async fn start(
        client_token: &str,
        client_secret: &str,
        access_token: &str,
    ) -> std::io::Result<AkamaiApi> {
        let shared = Arc::new(Shared {
            client_token: client_token.to_owned(),
            client_secret: client_secret.to_owned(),
            access_token: access_token.to_owned(),
            inner: Mutex::new(Inner::default()),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let (addr, stop) = serve(app).await?;
        Ok(AkamaiApi {
            addr,
            shared,
            _stop: stop,
        })
    }

    /// The base URL (`http://127.0.0.1:port`).
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Injects `fault` into the next answers ([`Fault::RateLimited`] clears after one).
    pub fn set_fault(&self, fault: Fault) {
        self.lock().fault = Some(fault);
    }

    /// Lowers the body limit (to provoke a 413 from a client cutting at 50,000).
    pub fn set_max_body(&self, n: usize) {
        self.lock().max_body = Some(n);
    }

    /// The purges accepted, in order.
    pub fn purged(&self) -> Vec<AkamaiPurge> {
        self.lock().purges.clone()
    }

    /// The requests refused: status and why.
    pub fn refused(&self) -> Vec<(u16, String)> {
        self.lock().refused.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn problem(status: StatusCode, body: Value, extra: &[(&str, String)]) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/problem+json"),
    );
    for (k, v) in extra {
        if let (Ok(k), Ok(v)) = (
            axum::http::HeaderName::from_bytes(k.as_bytes()),
            axum::http::HeaderValue::from_str(v),
        ) {
            r.headers_mut().insert(k, v);
        }
    }
    r
}

/// Fast Purge's own envelope.
fn purge_problem(status: StatusCode, title: &str, detail: String) -> Response {
    let body = json!({
        "supportId": "17PY1700000000000000-000000000",
        "title": title,
        "httpStatus": status.as_u16(),
        "detail": detail,
        "describedBy": format!("https://techdocs.akamai.com/purge-cache/reference/{}", status.as_u16()),
    });
    problem(status, body, &[])
}

/// The API gateway's envelope (authentication).
fn gateway_problem(uri: &Uri, detail: &str) -> Response {
    let body = json!({
        "type": "https://problems.luna.akamaiapis.net/-/pep-authn/deny",
        "title": "Not authorized",
        "status": 401,
        "detail": detail,
        "instance": format!("/ccu{}", uri.path().trim_start_matches("/ccu")),
        "method": "POST",
    });
    problem(StatusCode::UNAUTHORIZED, body, &[])
}

fn hmac_b64(key: &[u8], data: &[u8]) -> String {
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut m) => {
            m.update(data);
            B64.encode(m.finalize().into_bytes())
        }
        Err(_) => String::new(),
    }
}

/// Checks the EdgeGrid header; `Err` is the gateway's detail.
fn check_signature(
    s: &Shared,
    inner: &mut Inner,
    headers: &HeaderMap,
    uri: &Uri,
    body: &[u8],
) -> Result<(), &'static str> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or("The request has no Authorization header")?;
    let rest = auth
        .strip_prefix("EG1-HMAC-SHA256 ")
        .ok_or("The Authorization header is not EG1-HMAC-SHA256")?;
    let field = |name: &str| {
        rest.split(';')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
    };
    let (Some(ct), Some(at), Some(ts), Some(nonce), Some(sig)) = (
        field("client_token"),
        field("access_token"),
        field("timestamp"),
        field("nonce"),
        field("signature"),
    ) else {
        return Err("The Authorization header lacks a field");
    };
    if ct != s.client_token || at != s.access_token {
        return Err("Invalid client token or access token");
    }
    let ts_ok = ts.len() == 22 && ts.as_bytes().get(8) == Some(&b'T') && ts.ends_with("+0000");
    if !ts_ok {
        return Err("Invalid timestamp");
    }
    if nonce.is_empty() || !inner.nonces.insert(nonce.clone()) {
        return Err("Invalid nonce: used before");
    }
    let host = headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let hash = if body.is_empty() {
        String::new()
    } else {
        B64.encode(Sha256::digest(&body[..body.len().min(GATEWAY_MAX_BODY)]))
    };
    let unsigned = format!(
        "EG1-HMAC-SHA256 client_token={ct};access_token={at};timestamp={ts};nonce={nonce};"
    );
    let data = format!("POST\thttp\t{host}\t{path}\t\t{hash}\t{unsigned}");
    let key = hmac_b64(s.client_secret.as_bytes(), ts.as_bytes());
    if hmac_b64(key.as_bytes(), data.as_bytes()) != sig {
        return Err("The signature does not match");
    }
    Ok(())
}

async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let response = answer(&s, &method, &uri, &headers, &body).await;
    if !response.status().is_success() {
        let mut inner = s.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .refused
            .push((response.status().as_u16(), uri.path().to_owned()));
    }
    response
}

async fn answer(
    s: &Shared,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let segments: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    let (action, kind, network) = match segments.as_slice() {
        ["ccu", "v3", a, k] => (*a, *k, "production"),
        ["ccu", "v3", a, k, n] => (*a, *k, *n),
        _ => {
            return purge_problem(
                StatusCode::NOT_FOUND,
                "Not found",
                format!("{} is not a Fast Purge resource", uri.path()),
            );
        }
    };
    if !matches!(action, "invalidate" | "delete")
        || !matches!(kind, "url" | "tag" | "cpcode")
        || !matches!(network, "staging" | "production")
    {
        return purge_problem(
            StatusCode::NOT_FOUND,
            "Not found",
            format!("{} is not a Fast Purge resource", uri.path()),
        );
    }
    if method != Method::POST {
        return purge_problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
            format!("{method} is not allowed; use POST"),
        );
    }
    let fault = {
        let mut inner = s.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(detail) = check_signature(s, &mut inner, headers, uri, body) {
            return gateway_problem(uri, detail);
        }
        let f = inner.fault.unwrap_or(Fault::None);
        if f == Fault::RateLimited {
            inner.fault = None;
        }
        f
    };
    hang(fault).await;
    match fault {
        Fault::RefuseTokens => return gateway_problem(uri, "The API client is disabled"),
        Fault::Unavailable => {
            return purge_problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service unavailable",
                "Fast Purge is unavailable".into(),
            );
        }
        Fault::RateLimited => {
            let body = json!({
                "supportId": "17PY1552425241133633-211776704",
                "title": "Rate Limit exceeded",
                "httpStatus": 429,
                "describedBy": "https://techdocs.akamai.com/purge-cache/reference/429",
                "rateLimit": 100,
                "rateLimitCurrentRequestSize": 1,
                "rateLimitRemaining": 0,
            });
            return problem(
                StatusCode::TOO_MANY_REQUESTS,
                body,
                &[
                    ("retry-after", "0.2".to_owned()),
                    ("x-ratelimit-remaining", "0".to_owned()),
                    ("x-ratelimit-limit", "100".to_owned()),
                    ("x-ratelimit-limit-per-second", "50.00".to_owned()),
                    ("x-ratelimit-remaining-objects", "9904".to_owned()),
                    ("x-ratelimit-limit-objects", "10000".to_owned()),
                    ("x-ratelimit-limit-per-second-objects", "200.00".to_owned()),
                ],
            );
        }
        _ => {}
    }
    let is_json = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !is_json {
        return purge_problem(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported media type",
            "send Content-Type: application/json".into(),
        );
    }
    let limit = {
        let inner = s.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.max_body.unwrap_or(AKAMAI_MAX_BODY)
    };
    if body.len() > limit {
        return purge_problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request entity too large",
            format!("the body is {} bytes; at most {limit}", body.len()),
        );
    }
    let objects = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) if m.len() == 1 => match m.get("objects") {
            Some(Value::Array(o)) if !o.is_empty() => o.clone(),
            _ => {
                return purge_problem(
                    StatusCode::BAD_REQUEST,
                    "Bad request",
                    "objects must be a non-empty array".into(),
                );
            }
        },
        _ => {
            return purge_problem(
                StatusCode::BAD_REQUEST,
                "Bad request",
                "expected {\"objects\": [...]} and nothing else".into(),
            );
        }
    };
    let bad = objects.iter().find(|o| match kind {
        "cpcode" => o.as_u64().is_none_or(|c| c == 0),
        "url" => o.as_str().is_none_or(|u| {
            !(u.starts_with("https://") || u.starts_with("http://")) || u.len() < 9
        }),
        _ => o.as_str().is_none_or(str::is_empty),
    });
    if let Some(bad) = bad {
        return purge_problem(
            StatusCode::BAD_REQUEST,
            "Bad request",
            format!("invalid {kind} object {bad}"),
        );
    }
    let mut inner = s.inner.lock().unwrap_or_else(PoisonError::into_inner);
    inner.next += 1;
    let id = format!("e535071c-26b2-11e7-94d7-{:012x}", inner.next);
    inner.purges.push((
        action.to_owned(),
        kind.to_owned(),
        network.to_owned(),
        objects,
    ));
    let body = json!({
        "httpStatus": 201,
        "detail": "Request accepted",
        "estimatedSeconds": 5,
        "purgeId": id,
        "supportId": "17PY1492793544958045-219026624",
    });
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}
