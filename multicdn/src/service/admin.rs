//! The admin router: the operator's switches behind a bearer token.
//!
//! Every route needs `Authorization: Bearer <token>` (compared in constant time); without a
//! configured token every switch is refused. Every body names `who` and `why`; each use goes
//! through [`Controller::operate`](crate::Controller::operate), which records it and applies
//! it from the next round.
//!
//! | route | body |
//! |---|---|
//! | `POST /admin/static` | `{"on": true, "who": "alice", "why": "vendor incident"}` |
//! | `POST /admin/pins` | `{"network": "AS7922", "weights": {"fastly": "50%", "cloudflare": "50%"}, "until": "2026-12-24T00:00:00Z", "who": .., "why": ..}` |
//! | `DELETE /admin/pins/{network}` | `{"who": .., "why": ..}` |
//! | `POST /admin/drain` | `{"provider": "fastly", "on": true, "who": .., "why": ..}` |
//! | `POST /admin/dry-run` | `{"on": true, "who": .., "why": ..}` |
//! | `GET /admin/log` | the switches used, newest last |

use std::collections::BTreeMap;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use multicdn_core::policy::Share;
use multicdn_core::secret::Secret;
use multicdn_core::{NetworkKey, ProviderId, Timestamp};
use serde::Deserialize;

use super::Service;
use crate::controller::ControllerError;
use crate::operator::{Command, Operator};

/// Constant-time equality of two byte strings (the length is not secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

/// Checks `Authorization: Bearer <token>` against `token` (in constant time): `None` when it
/// matches, else the answer to send (403 without a configured token, 401 with
/// `WWW-Authenticate` otherwise).
pub(crate) fn check_bearer(
    token: Option<&Secret>,
    headers: &axum::http::HeaderMap,
    realm: &'static str,
    off: &str,
) -> Option<Response> {
    let Some(token) = token else {
        return Some(error(StatusCode::FORBIDDEN, off));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(g) if same(g.as_bytes(), token.expose().as_bytes()) => None,
        _ => {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "send Authorization: Bearer <the admin token>",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(realm));
            Some(r)
        }
    }
}

async fn authorize(State(s): State<Service>, req: Request, next: Next) -> Response {
    match check_bearer(
        s.inner.config.admin_token.as_ref(),
        req.headers(),
        "Bearer realm=\"multicdn-admin\"",
        "the admin switches are off: this service has no admin token",
    ) {
        None => next.run(req).await,
        Some(r) => r,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Switch {
    on: bool,
    who: String,
    why: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PinBody {
    network: NetworkKey,
    weights: BTreeMap<ProviderId, Share>,
    until: Timestamp,
    who: String,
    why: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainBody {
    provider: ProviderId,
    on: bool,
    who: String,
    why: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reason {
    who: String,
    why: String,
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, (StatusCode, String)> {
    b.map(|Json(t)| t).map_err(|e| (e.status(), e.body_text()))
}

async fn operate(s: &Service, who: String, why: String, command: Command) -> Response {
    let label = match &command {
        Command::Static { .. } => "static",
        Command::Pin { .. } => "pin",
        Command::Unpin { .. } => "unpin",
        Command::Drain { .. } => "drain",
        Command::DryRun { .. } => "dry_run",
    };
    match s
        .inner
        .controller
        .operate(Operator::new(who, why), command)
        .await
    {
        Ok(record) => {
            s.inner.metrics.operator(label);
            (
                StatusCode::OK,
                Json(serde_json::json!({
                    "done": record.command.to_string(),
                    "at": record.at,
                    "from_round": record.from_round,
                })),
            )
                .into_response()
        }
        Err(ControllerError::Operator(e)) => error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn set_static(State(s): State<Service>, b: Result<Json<Switch>, JsonRejection>) -> Response {
    match body(b) {
        Ok(b) => operate(&s, b.who, b.why, Command::Static { on: b.on }).await,
        Err((status, msg)) => error(status, msg),
    }
}

async fn set_dry_run(State(s): State<Service>, b: Result<Json<Switch>, JsonRejection>) -> Response {
    match body(b) {
        Ok(b) => operate(&s, b.who, b.why, Command::DryRun { on: b.on }).await,
        Err((status, msg)) => error(status, msg),
    }
}

async fn pin(State(s): State<Service>, b: Result<Json<PinBody>, JsonRejection>) -> Response {
    match body(b) {
        Ok(b) => {
            let command = Command::Pin {
                network: b.network,
                weights: b.weights,
                until: b.until,
            };
            operate(&s, b.who, b.why, command).await
        }
        Err((status, msg)) => error(status, msg),
    }
}

async fn unpin(
    State(s): State<Service>,
    Path(network): Path<String>,
    b: Result<Json<Reason>, JsonRejection>,
) -> Response {
    let network = match network.to_uppercase().parse::<NetworkKey>() {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{network:?}: {e}")),
    };
    match body(b) {
        Ok(b) => operate(&s, b.who, b.why, Command::Unpin { network }).await,
        Err((status, msg)) => error(status, msg),
    }
}

async fn drain(State(s): State<Service>, b: Result<Json<DrainBody>, JsonRejection>) -> Response {
    match body(b) {
        Ok(b) => {
            let command = Command::Drain {
                provider: b.provider,
                on: b.on,
            };
            operate(&s, b.who, b.why, command).await
        }
        Err((status, msg)) => error(status, msg),
    }
}

async fn log(State(s): State<Service>) -> Response {
    Json(s.inner.controller.operator_log().await).into_response()
}

pub(crate) fn router(service: Service) -> Router {
    Router::new()
        .route("/admin/static", post(set_static))
        .route("/admin/dry-run", post(set_dry_run))
        .route("/admin/pins", post(pin))
        .route("/admin/pins/{network}", delete(unpin))
        .route("/admin/drain", post(drain))
        .route("/admin/log", get(log))
        .layer(DefaultBodyLimit::max(16 * 1024))
        .route_layer(middleware::from_fn_with_state(service.clone(), authorize))
        .with_state(service)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_whole() {
        assert!(super::same(b"secret", b"secret"));
        assert!(!super::same(b"secret", b"secreT"));
        assert!(!super::same(b"secret", b"secret2"));
        assert!(!super::same(b"", b"x"));
    }
}
