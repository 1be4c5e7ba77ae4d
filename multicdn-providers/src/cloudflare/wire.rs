//! Cloudflare's envelope, `{"success","errors":[{"code","message"}],"messages","result"}`, read
//! into a purge id or a classified failure. Pure functions.
//!
//! A `success:false` answer is classified by its codes:
//! - **971** ("Please wait and consider throttling your request speed", Cloudflare's API rate
//!   limit code) is a rate limit: retried, honouring `Retry-After`;
//! - **10000** ("Authentication error") and **9109** ("Invalid access token" / "Unauthorized to
//!   access requested resource") are refused credentials: never retried;
//! - every other code is the request's fault: not retried, and reported with every code and
//!   message Cloudflare gave.

use serde::Deserialize;

/// Codes read as a rate limit.
pub(crate) const RATE_LIMIT_CODES: &[i64] = &[971];
/// Codes read as refused credentials.
pub(crate) const AUTH_CODES: &[i64] = &[10000, 9109];

/// The envelope.
#[derive(Debug, Deserialize)]
pub(crate) struct Envelope {
    pub(crate) success: bool,
    #[serde(default)]
    pub(crate) errors: Vec<Message>,
    #[serde(default)]
    pub(crate) result: Option<serde_json::Value>,
}

/// One entry of `errors`.
#[derive(Debug, Deserialize)]
pub(crate) struct Message {
    #[serde(default)]
    pub(crate) code: Option<i64>,
    #[serde(default)]
    pub(crate) message: String,
}

/// How a failed envelope reads.
#[derive(Debug, PartialEq)]
pub(crate) enum Class {
    /// Rate limited: retry after the vendor's delay.
    RateLimited,
    /// Credentials refused.
    Auth,
    /// The request was refused for itself.
    Refused,
}

/// A failure's codes and messages: the first code (for `Error::Vendor::code`) and every
/// `code: message` joined.
#[derive(Debug, PartialEq)]
pub(crate) struct Failure {
    pub(crate) class: Class,
    pub(crate) code: Option<String>,
    pub(crate) message: String,
}

/// Parses the envelope; `Err` says why it is not one.
pub(crate) fn read_envelope(body: &[u8]) -> Result<Envelope, String> {
    serde_json::from_slice(body).map_err(|e| {
        let start: String = String::from_utf8_lossy(body).chars().take(200).collect();
        format!("expected the envelope {{\"success\":..,\"errors\":[..],\"result\":..}} ({e}); got {start:?}")
    })
}

/// The purge id of a successful envelope (`result.id`), if it has one.
pub(crate) fn purge_id(envelope: &Envelope) -> Option<String> {
    envelope
        .result
        .as_ref()?
        .get("id")?
        .as_str()
        .map(str::to_owned)
}

/// Classifies and describes a failed envelope's errors.
pub(crate) fn failure(errors: &[Message]) -> Failure {
    let codes: Vec<i64> = errors.iter().filter_map(|e| e.code).collect();
    let class = if codes.iter().any(|c| RATE_LIMIT_CODES.contains(c)) {
        Class::RateLimited
    } else if codes.iter().any(|c| AUTH_CODES.contains(c)) {
        Class::Auth
    } else {
        Class::Refused
    };
    let message = if errors.is_empty() {
        "success is false and no errors were given".to_owned()
    } else {
        errors
            .iter()
            .map(|e| match e.code {
                Some(c) => format!("{c}: {}", e.message),
                None => e.message.clone(),
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    Failure {
        class,
        code: codes.first().map(i64::to_string),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_successful_purge() {
        let e = read_envelope(
            br#"{"success":true,"errors":[],"messages":[],"result":{"id":"9a7806061c88ada191ed06f989cc3dac"}}"#,
        )
        .unwrap();
        assert!(e.success);
        assert_eq!(
            purge_id(&e).as_deref(),
            Some("9a7806061c88ada191ed06f989cc3dac")
        );
    }

    #[test]
    fn describes_every_code_and_classifies_by_code() {
        let e = read_envelope(
            br#"{"success":false,"errors":[{"code":1012,"message":"Request must contain one of purge_everything, files, tags"},{"code":1013,"message":"other"}],"messages":[],"result":null}"#,
        )
        .unwrap();
        let f = failure(&e.errors);
        assert_eq!(f.class, Class::Refused);
        assert_eq!(f.code.as_deref(), Some("1012"));
        assert!(f.message.contains("1012: Request must") && f.message.contains("1013: other"));
        let rl = failure(&[Message {
            code: Some(971),
            message: "Please wait".into(),
        }]);
        assert_eq!(rl.class, Class::RateLimited);
        let auth = failure(&[Message {
            code: Some(10000),
            message: "Authentication error".into(),
        }]);
        assert_eq!(auth.class, Class::Auth);
        assert_eq!(failure(&[]).class, Class::Refused);
    }

    #[test]
    fn a_body_that_is_not_an_envelope_is_named() {
        let e = read_envelope(b"<html>bad gateway</html>").unwrap_err();
        assert!(e.contains("envelope") && e.contains("bad gateway"), "{e}");
        assert!(
            read_envelope(br#"{"errors":[]}"#)
                .unwrap_err()
                .contains("success")
        );
    }
}
