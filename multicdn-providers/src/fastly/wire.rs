//! Fastly's purge requests and answers on the wire: paths built from outside data, and
//! answers read into purge ids or errors. Pure functions.

use std::collections::HashMap;

use serde::Deserialize;

use crate::http::encode_segment;

/// `{"status":"ok","id":"..."}` (URL and key purges; `purge_all` has no id).
#[derive(Debug, Deserialize)]
pub(crate) struct StatusAnswer {
    pub(crate) status: Option<String>,
    pub(crate) id: Option<String>,
}

/// `{"msg":"...","detail":"..."}`.
#[derive(Debug, Deserialize)]
struct ErrorAnswer {
    msg: Option<String>,
    detail: Option<String>,
}

/// The message of an error answer: `msg: detail`, or the body's start when it is not JSON.
pub(crate) fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorAnswer>(body) {
        Ok(ErrorAnswer {
            msg: Some(msg),
            detail: Some(detail),
        }) if !detail.is_empty() => format!("{msg}: {detail}"),
        Ok(ErrorAnswer { msg: Some(msg), .. }) => msg,
        Ok(ErrorAnswer {
            detail: Some(detail),
            ..
        }) => detail,
        _ => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                "(empty body)".to_owned()
            } else {
                text.chars().take(300).collect()
            }
        }
    }
}

/// Reads `{"status":"ok","id":...}`; `Err` says what was wrong. `want_id`: whether the answer
/// must carry a purge id.
pub(crate) fn read_status(body: &[u8], want_id: bool) -> Result<Option<String>, String> {
    let answer: StatusAnswer = serde_json::from_slice(body)
        .map_err(|e| format!("expected {{\"status\":\"ok\",...}}, could not read it: {e}"))?;
    match answer.status.as_deref() {
        Some("ok") => {}
        Some(other) => return Err(format!("status is {other:?}, expected \"ok\"")),
        None => return Err("the field \"status\" is missing".to_owned()),
    }
    match (answer.id, want_id) {
        (Some(id), _) => Ok(Some(id)),
        (None, false) => Ok(None),
        (None, true) => Err("the field \"id\" (the purge id) is missing".to_owned()),
    }
}

/// Reads a batch answer, a map key -> purge id, into the ids of `keys` in order. Every key
/// sent must be acknowledged: a key missing from the answer is an error naming it.
pub(crate) fn read_batch(body: &[u8], keys: &[String]) -> Result<Vec<String>, String> {
    let map: HashMap<String, String> = serde_json::from_slice(body).map_err(|e| {
        format!("expected a map of surrogate key to purge id, could not read it: {e}")
    })?;
    let mut missing = Vec::new();
    let mut ids = Vec::with_capacity(keys.len());
    for k in keys {
        match map.get(k) {
            Some(id) => ids.push(id.clone()),
            None => missing.push(k.as_str()),
        }
    }
    if missing.is_empty() {
        Ok(ids)
    } else {
        let shown: Vec<&str> = missing.iter().take(5).copied().collect();
        Err(format!(
            "{} of {} keys have no purge id in the answer (first: {})",
            missing.len(),
            keys.len(),
            shown.join(", ")
        ))
    }
}

/// `/purge/{host}/{path}` for a full URL (no scheme), and the label naming it in errors (the
/// path without its query). `Err` says why the URL cannot be purged.
pub(crate) fn url_purge_path(raw: &str) -> Result<(String, String), String> {
    let url = url::Url::parse(raw).map_err(|e| {
        format!("{raw:?} is not a full URL ({e}); write https://www.example.com/path")
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{raw:?} is not an http(s) URL"));
    }
    let host = url
        .host_str()
        .ok_or_else(|| format!("{raw:?} has no host"))?;
    let authority = match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    };
    let label = format!("/purge/{authority}{}", url.path());
    let path = match url.query() {
        Some(q) => format!("{label}?{q}"),
        None => label.clone(),
    };
    Ok((path, label))
}

/// `/service/{service_id}/purge/{key}`.
pub(crate) fn key_purge_path(service_id: &str, key: &str) -> String {
    format!(
        "/service/{}/purge/{}",
        encode_segment(service_id),
        encode_segment(key)
    )
}

/// Why `key` cannot be a surrogate key, if it cannot: empty, whitespace (keys are
/// space-separated in `Surrogate-Key`), or longer than Fastly's 1,024 bytes.
pub(crate) fn invalid_key(key: &str) -> Option<String> {
    if key.is_empty() {
        Some("an empty surrogate key".to_owned())
    } else if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some(format!(
            "surrogate key {key:?} contains whitespace or control characters (keys are space-separated)"
        ))
    } else if key.len() > 1024 {
        Some(format!(
            "a surrogate key of {} bytes (at most 1,024)",
            key.len()
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_paths_drop_the_scheme_and_keep_the_query() {
        assert_eq!(
            url_purge_path("https://www.example.com/css/a.css").unwrap(),
            (
                "/purge/www.example.com/css/a.css".to_owned(),
                "/purge/www.example.com/css/a.css".to_owned()
            )
        );
        let (path, label) = url_purge_path("http://shop.example:8080/p?id=1").unwrap();
        assert_eq!(path, "/purge/shop.example:8080/p?id=1");
        assert_eq!(label, "/purge/shop.example:8080/p");
        assert!(url_purge_path("www.example.com/a").is_err());
        assert!(url_purge_path("ftp://x/y").is_err());
    }

    #[test]
    fn key_paths_are_encoded() {
        assert_eq!(
            key_purge_path("SU1Z0isxPaozGVKXdv0eY", "a/b"),
            "/service/SU1Z0isxPaozGVKXdv0eY/purge/a%2Fb"
        );
    }

    #[test]
    fn answers_are_read_or_explained() {
        assert_eq!(
            read_status(br#"{"status":"ok","id":"1-2-3"}"#, true),
            Ok(Some("1-2-3".to_owned()))
        );
        assert_eq!(read_status(br#"{"status":"ok"}"#, false), Ok(None));
        assert!(
            read_status(br#"{"status":"ok"}"#, true)
                .unwrap_err()
                .contains("\"id\"")
        );
        assert!(read_status(br#"{"status":"fail"}"#, false).is_err());
        assert!(read_status(b"<html>", false).is_err());
        let keys = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(
            read_batch(br#"{"a":"1","b":"2"}"#, &keys),
            Ok(vec!["1".to_owned(), "2".to_owned()])
        );
        let e = read_batch(br#"{"a":"1"}"#, &keys).unwrap_err();
        assert!(e.contains("1 of 2") && e.contains('b'), "{e}");
    }

    #[test]
    fn error_messages_join_msg_and_detail() {
        assert_eq!(
            error_message(br#"{"msg":"Provided credentials are missing or invalid","detail":"token expired"}"#),
            "Provided credentials are missing or invalid: token expired"
        );
        assert_eq!(error_message(br#"{"msg":"Not found"}"#), "Not found");
        assert_eq!(error_message(b""), "(empty body)");
        assert_eq!(error_message(b"upstream down"), "upstream down");
    }

    #[test]
    fn keys_with_spaces_are_refused() {
        assert!(invalid_key("product-1").is_none());
        assert!(invalid_key("a b").is_some());
        assert!(invalid_key("").is_some());
        assert!(invalid_key(&"x".repeat(1025)).is_some());
    }
}
