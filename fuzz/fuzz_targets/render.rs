//! The renderers: any policy that validates renders to Fastly VCL and Cloudflare rules in
//! which no byte of a policy string stands outside a quoted, escaped context.
//!
//! The input drives a cache section (patterns, header names and values, allowlists, TTLs)
//! spliced into the example policy; whatever validates is rendered in both modes and the
//! output is tokenised: outside comments and string literals only the renderers' own words
//! (learnt from rendering the example policy) and header or cookie names VCL can address may
//! appear, and every Cloudflare expression must hold the same.
#![no_main]

use std::collections::BTreeSet;
use std::fmt::Write;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use multicdn_core::Policy;
use multicdn_core::policy::CloudflarePlan;
use multicdn_providers::render::RenderMode;
use multicdn_providers::render::cloudflare_rules::{CloudflareTarget, render_cloudflare};
use multicdn_providers::render::fastly_vcl::render_fastly;

const EXAMPLE: &str = include_str!("../../examples/policy.yaml");

#[derive(Debug, Arbitrary)]
struct Cache {
    ttls: [u64; 4],
    query: Vec<String>,
    cookies: Vec<String>,
    normalise: bool,
    routes: Vec<FuzzRoute>,
    plan: u8,
}

#[derive(Debug, Arbitrary)]
struct FuzzRoute {
    pattern: String,
    never: bool,
    ttl_edge: Option<u64>,
    ttl_browser: Option<u64>,
    headers: Vec<(String, String)>,
    surrogate: bool,
    immutable: bool,
}

fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn yaml(c: &Cache) -> String {
    let mut y = String::new();
    let _ = writeln!(
        y,
        "cache:\n  defaults: {{ttl_edge: {}, ttl_browser: {}, stale_while_revalidate: {}, stale_if_error: {}}}",
        c.ttls[0] % 100_000_000,
        c.ttls[1] % 100_000_000,
        c.ttls[2] % 100_000_000,
        c.ttls[3] % 100_000_000
    );
    let list = |v: &[String]| {
        v.iter()
            .take(6)
            .map(|s| q(s))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        y,
        "  cache_key: {{query_allowlist: [{}], cookie_allowlist: [{}], normalise_accept_encoding: {}}}",
        list(&c.query),
        list(&c.cookies),
        c.normalise
    );
    y.push_str("  routes:\n");
    for r in c.routes.iter().take(6) {
        let _ = writeln!(y, "    - match: {}", q(&r.pattern));
        let _ = writeln!(
            y,
            "      cache: {}",
            if r.never { "never" } else { "default" }
        );
        if let Some(t) = r.ttl_edge {
            let _ = writeln!(y, "      ttl_edge: {}", t % 100_000_000);
        }
        if let Some(t) = r.ttl_browser {
            let _ = writeln!(y, "      ttl_browser: {}", t % 100_000_000);
        }
        let headers: Vec<String> = r
            .headers
            .iter()
            .take(4)
            .map(|(k, v)| format!("{}: {}", q(k), q(v)))
            .collect();
        let _ = writeln!(y, "      headers: {{{}}}", headers.join(", "));
        let _ = writeln!(y, "      surrogate_keys_from_origin: {}", r.surrogate);
        let _ = writeln!(y, "      immutable: {}", r.immutable);
    }
    y
}

fn policy_with(cache: &str, plan: &str) -> String {
    let start = EXAMPLE.find("\ncache:").unwrap_or(EXAMPLE.len());
    let end = EXAMPLE.find("\nhealth:").unwrap_or(EXAMPLE.len());
    let head = EXAMPLE[..start].replace("plan: pro", &format!("plan: {plan}"));
    format!("{head}\n{cache}{}", &EXAMPLE[end..])
}

/// A VCL token: a comment, a string literal, a word, or one punctuation byte.
#[derive(Debug, PartialEq)]
enum Tok<'a> {
    Word(&'a str),
    Punct(u8),
}

/// Splits VCL into tokens outside comments and string literals; `Err` on anything else.
fn vcl_tokens(src: &str) -> Result<Vec<Tok<'_>>, String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b' ' | b'\n' => i += 1,
            b'"' => {
                let end = src[i + 1..].find('"').ok_or("an unterminated string")?;
                if src[i + 1..i + 1 + end].contains(['\n', '\r']) {
                    return Err(format!("a line break inside a string at byte {i}"));
                }
                i += end + 2;
            }
            b'{' if b.get(i + 1) == Some(&b'"') => {
                let end = src[i + 2..]
                    .find("\"}")
                    .ok_or("an unterminated long string")?;
                if src[i + 2..i + 2 + end].chars().any(char::is_control) {
                    return Err(format!(
                        "a control character inside a long string at byte {i}"
                    ));
                }
                i += end + 4;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' => {
                let start = i;
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'.' | b'-' | b':'))
                {
                    i += 1;
                }
                out.push(Tok::Word(&src[start..i]));
            }
            c if b"(){};=!&|~+,<>".contains(&c) => {
                out.push(Tok::Punct(c));
                i += 1;
            }
            c => return Err(format!("byte {c:#04x} outside a string or comment at {i}")),
        }
    }
    Ok(out)
}

/// Cloudflare expression tokens outside string literals.
fn cf_tokens(src: &str) -> Result<Vec<Tok<'_>>, String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b' ' => i += 1,
            b'"' => {
                i += 1;
                loop {
                    match b.get(i) {
                        None => return Err("an unterminated string".into()),
                        Some(b'\\') => i += 2,
                        Some(b'"') => break,
                        Some(_) => i += 1,
                    }
                }
                i += 1;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'.')) {
                    i += 1;
                }
                out.push(Tok::Word(&src[start..i]));
            }
            c if b"(){}[]*=!,".contains(&c) => {
                out.push(Tok::Punct(c));
                i += 1;
            }
            c => return Err(format!("byte {c:#04x} outside a string at {i}")),
        }
    }
    Ok(out)
}

fn is_number(w: &str) -> bool {
    let digits = w.strip_suffix('s').unwrap_or(w);
    !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit())
}

/// A header name VCL can address bare: letters, digits, `-` and `_`.
fn vcl_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
}

fn rfc9110_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
}

fn target_of(policy: &Policy) -> CloudflareTarget {
    policy
        .providers
        .values()
        .find(|p| p.plan.is_some())
        .map(CloudflareTarget::from_spec)
        .unwrap_or_else(|| CloudflareTarget::new(CloudflarePlan::Pro))
}

struct Vocab {
    vcl: BTreeSet<String>,
    cf: BTreeSet<String>,
}

fn vocab() -> &'static Vocab {
    static V: OnceLock<Vocab> = OnceLock::new();
    V.get_or_init(|| {
        let mut vcl = BTreeSet::new();
        let mut cf = BTreeSet::new();
        for plan in ["pro", "enterprise", "business"] {
            let Ok(policy) = Policy::from_yaml(
                &policy_with(
                    &EXAMPLE[EXAMPLE.find("cache:").unwrap_or(0)
                        ..EXAMPLE.find("\nhealth:").unwrap_or(0)],
                    plan,
                ),
                "example",
            ) else {
                panic!("the example policy does not load");
            };
            if let Ok(f) = render_fastly(&policy.site, &policy.cache, RenderMode::Lenient) {
                for t in vcl_tokens(&f.to_vcl_file()).unwrap_or_default() {
                    if let Tok::Word(w) = t {
                        vcl.insert(w.to_owned());
                    }
                }
            }
            if let Ok(c) = render_cloudflare(
                &policy.site,
                &policy.cache,
                target_of(&policy),
                RenderMode::Lenient,
            ) {
                let json: serde_json::Value =
                    serde_json::from_str(&c.to_json_file()).unwrap_or_default();
                for e in expressions(&json) {
                    for t in cf_tokens(e).unwrap_or_default() {
                        if let Tok::Word(w) = t {
                            cf.insert(w.to_owned());
                        }
                    }
                }
            }
        }
        // Words the example does not reach.
        for w in ["return", "pass"] {
            vcl.insert(w.to_owned());
        }
        Vocab { vcl, cf }
    })
}

fn check_vcl(vcl: &str, words: &BTreeSet<String>) {
    let toks = vcl_tokens(vcl).unwrap_or_else(|e| panic!("{e}\n{vcl}"));
    for t in toks {
        let Tok::Word(w) = t else { continue };
        if words.contains(w) || is_number(w) {
            continue;
        }
        let bare = ["resp.http.", "req.http.Cookie:"]
            .iter()
            .find_map(|p| w.strip_prefix(p));
        assert!(
            bare.is_some_and(vcl_name),
            "{w:?} stands outside any string or comment\n{vcl}"
        );
    }
}

/// Every `expression` string anywhere in a rendering.
fn expressions(v: &serde_json::Value) -> Vec<&str> {
    let mut out = Vec::new();
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match v.as_str() {
                        Some(e) if k == "expression" => out.push(e),
                        _ => stack.push(v),
                    }
                }
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    out
}

/// `regex`: whether the zone's plan offers regular expressions, the only way `matches`, a word
/// the example policy never renders, may appear.
fn check_cloudflare(json: &str, words: &BTreeSet<String>, regex: bool) {
    let value: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("not JSON ({e}):\n{json}"));
    let mut stack = vec![&value];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::Object(headers)) = map.get("headers") {
                    for name in headers.keys() {
                        assert!(rfc9110_token(name), "header name {name:?}");
                    }
                }
                for (k, v) in map {
                    if k == "expression"
                        && let Some(e) = v.as_str()
                    {
                        let toks = cf_tokens(e).unwrap_or_else(|err| panic!("{err}: {e}"));
                        for t in toks {
                            if let Tok::Word(w) = t {
                                if w == "matches" {
                                    assert!(
                                        regex,
                                        "`matches` on a plan without regular expressions: {e}"
                                    );
                                    continue;
                                }
                                assert!(
                                    words.contains(w) || is_number(w),
                                    "{w:?} stands outside any string in {e}"
                                );
                            }
                        }
                    }
                    stack.push(v);
                }
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(cache) = Cache::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let plan = ["free", "pro", "business", "enterprise"][usize::from(cache.plan % 4)];
    let text = policy_with(&yaml(&cache), plan);
    let Ok(policy) = Policy::from_yaml(&text, "fuzz.yaml") else {
        return;
    };
    let v = vocab();
    for mode in [RenderMode::Lenient, RenderMode::Strict] {
        if let Ok(f) = render_fastly(&policy.site, &policy.cache, mode) {
            check_vcl(&f.to_vcl_file(), &v.vcl);
            for s in &f.snippets {
                check_vcl(&s.content, &v.vcl);
            }
        }
        let target = target_of(&policy);
        if let Ok(c) = render_cloudflare(&policy.site, &policy.cache, target, mode) {
            let regex = matches!(
                target.plan,
                CloudflarePlan::Business | CloudflarePlan::Enterprise
            );
            check_cloudflare(&c.to_json_file(), &v.cf, regex);
        }
    }
});
