//! The files the service serves: the browser script, configured from the policy, and the
//! dashboard page.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::Service;

const RUM_JS: &str = include_str!("assets/rum.js");
const DASHBOARD_HTML: &str = include_str!("assets/dashboard.html");
const DASHBOARD_JS: &str = include_str!("assets/dashboard.js");
const DASHBOARD_CSS: &str = include_str!("assets/dashboard.css");
/// The hls.js snippet that follows `CMSD-Dynamic` (`multicdnCmsdHls(hls, Hls)`).
pub const CMSD_HLS_JS: &str = include_str!("assets/cmsd-hls.js");

/// The token in `rum.js` the configuration replaces.
const CONFIG_TOKEN: &str = "__MULTICDN_CONFIG__";

fn file(body: impl IntoResponse, content_type: &'static str, cache: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// The base URL browsers reach the service at: the configured one, or `http://<Host>` when
/// the `Host` header is a plain host[:port].
fn base_url(service: &Service, headers: &HeaderMap) -> String {
    if let Some(u) = &service.inner.config.public_url {
        return u.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        })
        .unwrap_or("localhost");
    format!("http://{host}")
}

/// The script's configuration, as JSON.
pub(crate) fn script_config(service: &Service, base: &str) -> serde_json::Value {
    let probe = &service.inner.controller.policy().steering.rum.probe;
    serde_json::json!({
        "nav": format!("{base}/rum/nav"),
        "cdn": format!("{base}/rum/cdn"),
        "sample": probe.sample.fraction(),
        "probes": probe.objects.iter().map(|(p, u)| (p.to_string(), serde_json::Value::String(u.clone()))).collect::<serde_json::Map<_, _>>(),
        "verdict_ttl_ms": 6 * 3600 * 1000,
        "verdict_key": "multicdn_pick",
    })
}

pub(crate) async fn script(State(s): State<Service>, headers: HeaderMap) -> Response {
    let base = base_url(&s, &headers);
    let config = script_config(&s, &base).to_string();
    file(
        RUM_JS.replacen(CONFIG_TOKEN, &config, 1),
        "text/javascript; charset=utf-8",
        "public, max-age=300",
    )
}

pub(crate) async fn cmsd_hls() -> Response {
    file(
        CMSD_HLS_JS,
        "text/javascript; charset=utf-8",
        "public, max-age=300",
    )
}

pub(crate) async fn dashboard_redirect() -> Redirect {
    Redirect::permanent("/dashboard/")
}

pub(crate) async fn dashboard_html() -> Response {
    file(DASHBOARD_HTML, "text/html; charset=utf-8", "no-cache")
}

pub(crate) async fn dashboard_js() -> Response {
    file(DASHBOARD_JS, "text/javascript; charset=utf-8", "no-cache")
}

pub(crate) async fn dashboard_css() -> Response {
    file(DASHBOARD_CSS, "text/css; charset=utf-8", "no-cache")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_script_has_exactly_one_configuration_token() {
        assert_eq!(super::RUM_JS.matches(super::CONFIG_TOKEN).count(), 1);
    }
}
