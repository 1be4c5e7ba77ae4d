//! Keeping credentials out of every text the library surfaces. A vendor's error body may
//! echo the request's headers back (`Authorization: Bearer ...`, `"Fastly-Key": "..."`); the
//! HTTP layer passes every error it returns through [`redact_error`], with the credential
//! values of the request that failed, so neither the values nor any credential header's value
//! reaches an error message, a log line or a tool's output.

use std::sync::LazyLock;

use multicdn_core::Error;
use regex::Regex;

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Headers (and AWS query parameters) whose values are credentials.
const NAMES: &str = "authorization|proxy-authorization|fastly-key|x-nsone-key|x-auth-key|x-auth-email|x-api-key|x-amz-security-token|x-amz-signature|x-amz-credential|cookie|set-cookie";

/// A secret shorter than this is not searched for in free text (it would match ordinary
/// words); its header is still redacted by name.
const MIN_SECRET_LEN: usize = 6;

static PATTERNS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    [
        // JSON: "Fastly-Key": "value", and "Authorization": ["Bearer value"].
        (
            format!(r#"(?i)("(?:{NAMES})"\s*:\s*\[?\s*")((?:[^"\\]|\\.)*)(")"#),
            "${1}[redacted]${3}",
        ),
        // Header or query form: Fastly-Key: value, X-Amz-Signature=value.
        (
            format!(r#"(?im)\b((?:{NAMES})\s*[:=]\s*)([^\r\n"&]+)"#),
            "${1}[redacted]",
        ),
        // A SigV4 signature wherever it appears (inside Authorization, a URL, a message).
        (
            r"(?i)(signature=)([0-9a-f]{16,})".to_owned(),
            "${1}[redacted]",
        ),
    ]
    .into_iter()
    .filter_map(|(p, with)| Regex::new(&p).ok().map(|r| (r, with)))
    .collect()
});

/// `text` with every value in `secrets` and every credential header's value replaced by
/// `[redacted]`.
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    let mut secrets: Vec<&String> = secrets
        .iter()
        .filter(|s| s.len() >= MIN_SECRET_LEN)
        .collect();
    // The longest first, so "Bearer abc" goes before "abc".
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for s in secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), REDACTED);
        }
    }
    for (pattern, with) in PATTERNS.iter() {
        if let std::borrow::Cow::Owned(replaced) = pattern.replace_all(&out, *with) {
            out = replaced;
        }
    }
    out
}

/// The credential values a request carries: every header marked sensitive or named as a
/// credential, whole and (for `Scheme value` forms such as `Bearer ...`) its last word.
pub fn request_secrets(headers: &http::HeaderMap) -> Vec<String> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let credential = value.is_sensitive()
            || NAMES
                .split('|')
                .any(|n| name.as_str().eq_ignore_ascii_case(n));
        let Ok(v) = value.to_str() else {
            continue;
        };
        if !credential {
            continue;
        }
        out.push(v.to_owned());
        if let Some((_, last)) = v.rsplit_once(' ') {
            out.push(last.to_owned());
        }
    }
    out
}

/// `err` with every message it carries redacted (see [`redact`]).
pub fn redact_error(err: Error, secrets: &[String]) -> Error {
    let r = |m: String| redact(&m, secrets);
    match err {
        Error::Vendor {
            provider,
            request,
            status,
            code,
            message,
            retryable,
            retry_after,
        } => Error::Vendor {
            provider,
            request,
            status,
            code: code.map(r),
            message: r(message),
            retryable,
            retry_after,
        },
        Error::Auth {
            provider,
            request,
            status,
            message,
        } => Error::Auth {
            provider,
            request,
            status,
            message: r(message),
        },
        Error::Connect {
            provider,
            request,
            message,
        } => Error::Connect {
            provider,
            request,
            message: r(message),
        },
        Error::Transport {
            provider,
            request,
            message,
        } => Error::Transport {
            provider,
            request,
            message: r(message),
        },
        Error::UnexpectedResponse {
            provider,
            request,
            message,
        } => Error::UnexpectedResponse {
            provider,
            request,
            message: r(message),
        },
        Error::InvalidRequest { provider, message } => Error::InvalidRequest {
            provider,
            message: r(message),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_compiles() {
        assert_eq!(PATTERNS.len(), 3);
    }

    #[test]
    fn header_lines_json_fields_and_signatures_are_redacted() {
        let echo = "you sent:\nAuthorization: Bearer cf-abcdef\r\nfastly-key: fk-123456\nX-NSONE-Key: ns1-7890\nAccept: */*\n\
                    {\"headers\": {\"X-Amz-Security-Token\": \"IQoJb3JpZ2luX2VjE\", \"Fastly-Key\": [\"fk-123456\"], \"Host\": \"api\"}}\n\
                    AWS4-HMAC-SHA256 Credential=AKID/20261202/us-east-1/route53/aws4_request, SignedHeaders=host, Signature=0123456789abcdef0123";
        let out = redact(echo, &[]);
        for secret in [
            "cf-abcdef",
            "fk-123456",
            "ns1-7890",
            "IQoJb3JpZ2luX2VjE",
            "0123456789abcdef0123",
        ] {
            assert!(!out.contains(secret), "{secret} in {out}");
        }
        assert!(out.contains("Accept: */*"), "{out}");
        assert!(out.contains("\"Host\": \"api\""), "{out}");
        assert!(out.contains("X-NSONE-Key: [redacted]"), "{out}");
    }

    #[test]
    fn the_secret_itself_is_redacted_anywhere() {
        let secrets = vec![
            "Bearer tok-0123456789".to_owned(),
            "tok-0123456789".to_owned(),
        ];
        let out = redact(
            "invalid token 'tok-0123456789' (Bearer tok-0123456789)",
            &secrets,
        );
        assert_eq!(out, "invalid token '[redacted]' ([redacted])");
        // Short values are left to the header patterns.
        assert_eq!(redact("a b c", &["b".to_owned()]), "a b c");
    }

    #[test]
    fn a_requests_credentials_are_its_sensitive_and_named_headers() {
        let mut h = http::HeaderMap::new();
        let mut v = http::HeaderValue::from_static("Bearer tok-0123456789");
        v.set_sensitive(true);
        h.insert("authorization", v);
        h.insert(
            "x-nsone-key",
            http::HeaderValue::from_static("ns1-key-value"),
        );
        h.insert("accept", http::HeaderValue::from_static("application/json"));
        let s = request_secrets(&h);
        assert!(s.contains(&"tok-0123456789".to_owned()), "{s:?}");
        assert!(s.contains(&"ns1-key-value".to_owned()), "{s:?}");
        assert!(!s.iter().any(|x| x.contains("json")), "{s:?}");
    }
}
