//! Fast Purge v3 on the wire: paths, bodies cut to the size limit, the 201 answer and the
//! problem-details error envelope. Pure functions.
//!
//! - `POST /ccu/v3/{invalidate|delete}/{url|tag|cpcode}/{staging|production}` with
//!   `{"objects": [...]}` (URLs and tags as strings, CP codes as numbers).
//! - Accepted: `201 {"httpStatus": 201, "detail": "Request accepted", "estimatedSeconds": 5,
//!   "purgeId": "...", "supportId": "..."}`.
//! - Refused: `application/problem+json` (RFC 7807) with `type`, `title`, `detail`,
//!   `httpStatus` (Fast Purge) or `status` (the API gateway, which refuses signatures), and
//!   `supportId`, `describedBy`, `instance` when given.

use serde::Deserialize;

/// The accepted answer.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Accepted {
    pub(crate) http_status: Option<u16>,
    pub(crate) purge_id: Option<String>,
    #[serde(default)]
    pub(crate) estimated_seconds: Option<u64>,
}

/// A problem-details error.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Problem {
    #[serde(rename = "type")]
    kind: Option<String>,
    title: Option<String>,
    detail: Option<String>,
    support_id: Option<String>,
}

/// The purge id of a 201 answer; `Err` says what was wrong with it.
pub(crate) fn read_accepted(body: &[u8]) -> Result<(String, Option<u64>), String> {
    let a: Accepted = serde_json::from_slice(body).map_err(|e| {
        format!("expected {{\"httpStatus\":201,\"purgeId\":...}}, could not read it: {e}")
    })?;
    match a.http_status {
        Some(201) | None => {}
        Some(other) => return Err(format!("httpStatus is {other}, expected 201")),
    }
    let id = a
        .purge_id
        .filter(|id| !id.is_empty())
        .ok_or_else(|| "the field \"purgeId\" is missing".to_owned())?;
    Ok((id, a.estimated_seconds))
}

/// An error answer's code (the last segment of `type`, else the title) and message
/// (`title: detail (supportId ...)`), or the body's start when it is not a problem.
pub(crate) fn problem(body: &[u8]) -> (Option<String>, String) {
    let Ok(p) = serde_json::from_slice::<Problem>(body) else {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        let message = if text.is_empty() {
            "(empty body)".to_owned()
        } else {
            text.chars().take(300).collect()
        };
        return (None, message);
    };
    let code = p
        .kind
        .as_deref()
        .and_then(|t| t.trim_end_matches('/').rsplit('/').next())
        .filter(|c| !c.is_empty() && *c != "-")
        .map(str::to_owned)
        .or_else(|| p.title.clone());
    let mut message = match (p.title, p.detail) {
        (Some(t), Some(d)) if !d.is_empty() => format!("{t}: {d}"),
        (Some(t), _) => t,
        (None, Some(d)) => d,
        (None, None) => "(a problem without title or detail)".to_owned(),
    };
    if let Some(id) = p.support_id {
        message.push_str(&format!(" (supportId {id})"));
    }
    (code, message)
}

/// Splits `objects` into request bodies of at most `max_body` bytes and `max_objects`
/// objects, in order. Each body is `{"objects":[...]}` as `serde_json` writes it. `Err`
/// names an object too large for any body.
pub(crate) fn bodies(
    objects: &[serde_json::Value],
    max_body: usize,
    max_objects: usize,
) -> Result<Vec<Vec<serde_json::Value>>, String> {
    // `{"objects":[` + `]}`.
    const FRAME: usize = 14;
    let mut out: Vec<Vec<serde_json::Value>> = Vec::new();
    let mut current: Vec<serde_json::Value> = Vec::new();
    let mut size = FRAME;
    for o in objects {
        let len = o.to_string().len();
        if FRAME + len > max_body {
            let shown: String = o.to_string().chars().take(80).collect();
            return Err(format!(
                "the object {shown}... is {len} bytes, more than a {max_body}-byte request body holds"
            ));
        }
        let extra = len + usize::from(!current.is_empty());
        if !current.is_empty() && (size + extra > max_body || current.len() >= max_objects.max(1)) {
            out.push(std::mem::take(&mut current));
            size = FRAME;
        }
        size += len + usize::from(!current.is_empty());
        current.push(o.clone());
    }
    if !current.is_empty() {
        out.push(current);
    }
    Ok(out)
}

/// Why `tag` cannot be a cache tag, if it cannot: empty, whitespace or a comma (Akamai's
/// `Edge-Cache-Tag` is comma-separated), longer than 128 characters.
pub(crate) fn invalid_tag(tag: &str) -> Option<String> {
    if tag.is_empty() {
        Some("an empty cache tag".to_owned())
    } else if tag
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == ',')
    {
        Some(format!(
            "cache tag {tag:?} contains whitespace, control characters or a comma"
        ))
    } else if tag.chars().count() > 128 {
        Some(format!(
            "a cache tag of {} characters (at most 128)",
            tag.chars().count()
        ))
    } else {
        None
    }
}

/// Why `url` cannot be purged, if it cannot: Fast Purge takes full http(s) URLs.
pub(crate) fn invalid_url(url: &str) -> Option<String> {
    let ok = url::Url::parse(url)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
    (!ok).then(|| format!("{url:?} is not a full URL; write https://www.example.com/path"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies_stay_within_the_size_and_count() {
        let objects: Vec<_> = (0..100)
            .map(|i| json!(format!("https://www.example.com/{i:0>90}")))
            .collect();
        let got = bodies(&objects, 1_000, 1_000).unwrap();
        let flat: Vec<_> = got.iter().flatten().cloned().collect();
        assert_eq!(flat, objects);
        for b in &got {
            let body = json!({ "objects": b }).to_string();
            assert!(body.len() <= 1_000, "{}", body.len());
        }
        // Full bodies: one more object would pass the limit.
        let first = json!({ "objects": got[0] }).to_string().len();
        assert!(first + 1 + objects[0].to_string().len() > 1_000);
        assert_eq!(bodies(&objects, 50_000, 30).unwrap().len(), 4);
        let e = bodies(&[json!("x".repeat(2_000))], 1_000, 10).unwrap_err();
        assert!(e.contains("1000-byte"), "{e}");
        let cp = bodies(&[json!(12345), json!(67890)], 50_000, 300).unwrap();
        assert_eq!(
            json!({ "objects": cp[0] }).to_string(),
            r#"{"objects":[12345,67890]}"#
        );
    }

    #[test]
    fn reads_the_accepted_answer() {
        let body = br#"{"httpStatus":201,"detail":"Request accepted","estimatedSeconds":5,"purgeId":"e535071c-26b2-11e7-94d7-276f2f54d938","supportId":"17PY1492793544958045-219026624"}"#;
        assert_eq!(
            read_accepted(body).unwrap(),
            ("e535071c-26b2-11e7-94d7-276f2f54d938".to_owned(), Some(5))
        );
        assert!(
            read_accepted(br#"{"httpStatus":201}"#)
                .unwrap_err()
                .contains("purgeId")
        );
        assert!(read_accepted(b"<html>").is_err());
    }

    #[test]
    fn problems_give_a_code_and_the_detail() {
        let (code, msg) = problem(
            br#"{"type":"https://problems.luna.akamaiapis.net/-/pep-authn/deny","title":"Not authorized","status":401,"detail":"The signature does not match","instance":"https://akab-x.luna.akamaiapis.net/ccu/v3/delete/url/production"}"#,
        );
        assert_eq!(code.as_deref(), Some("deny"));
        assert_eq!(msg, "Not authorized: The signature does not match");
        let (code, msg) = problem(
            br#"{"supportId":"17PY1321286429616716-211907680","title":"Bad request","httpStatus":400,"detail":"Invalid object","describedBy":"https://api.ccu.akamai.com/ccu/v2/errors/bad-request"}"#,
        );
        assert_eq!(code.as_deref(), Some("Bad request"));
        assert_eq!(
            msg,
            "Bad request: Invalid object (supportId 17PY1321286429616716-211907680)"
        );
        assert_eq!(problem(b""), (None, "(empty body)".to_owned()));
    }

    #[test]
    fn tags_and_urls_are_checked() {
        assert!(invalid_tag("product-1").is_none());
        assert!(invalid_tag("a,b").is_some());
        assert!(invalid_tag(&"t".repeat(129)).is_some());
        assert!(invalid_url("https://www.example.com/a").is_none());
        assert!(invalid_url("www.example.com/a").is_some());
    }
}
