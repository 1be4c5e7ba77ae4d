//! The origin shield: one Varnish cache between both CDNs and the origin, rendered as a whole
//! VCL 4.1 file from the same cache policy as the edges (seed 000, sections 10 and 19).
//!
//! | policy | shield VCL |
//! |---|---|
//! | `cache: never` routes | `return(pass)` in `vcl_recv`, first match wins as on the edges |
//! | `cache_key` | the same query and cookie allowlists and `Accept-Encoding` normalisation; allowlisted cookies vary the hash |
//! | `ttl_edge` | `beresp.ttl` per route |
//! | `stale_while_revalidate`, `stale_if_error` | `beresp.grace` = the larger of the two; a background fetch that fails (5xx or no answer) is abandoned, so the stale object keeps being served |
//! | `surrogate_keys_from_origin` | the origin's `Surrogate-Key` copied into the `xkey` header the `xkey` vmod indexes; removed on other routes |
//!
//! Purges come in as `PURGE` requests, accepted only from [`ShieldTarget::purgers`]: with an
//! `xkey-purge: <keys>` header every object tagged with one of the keys is removed (the answer
//! is `200 Invalidated <n>`), without it the URL's object is.

use std::fmt::Write as _;
use std::net::IpAddr;

use multicdn_core::policy::{CachePolicy, escape_control};

use super::{
    CACHEABLE_STATUSES, Findings, RenderError, RenderMode, RenderWarning, ResolvedRoute,
    exclusions, is_vcl_name, resolve, route_patterns,
};

/// Where the shield sits: the origin it fetches from and who may purge it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShieldTarget {
    /// The origin's host (a name or an address).
    pub origin_host: String,
    /// The origin's port.
    pub origin_port: u16,
    /// Addresses allowed to send `PURGE` (the controller's).
    pub purgers: Vec<IpAddr>,
}

/// The policy rendered for the shield.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShieldRendering {
    /// The whole VCL file.
    pub vcl: String,
    /// What could not be expressed as written.
    pub warnings: Vec<RenderWarning>,
}

/// Renders the cache policy as the shield's VCL.
pub fn render_shield(
    cache: &CachePolicy,
    target: &ShieldTarget,
    mode: RenderMode,
) -> Result<ShieldRendering, RenderError> {
    let mut findings = Findings::new("shield");
    let host_ok = !target.origin_host.is_empty()
        && target
            .origin_host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b));
    if !host_ok {
        return Err(findings.unrepresentable(
            "shield.origin_host",
            format!(
                "{:?} is not a host name or address Varnish can connect to",
                target.origin_host
            ),
        ));
    }
    if target.purgers.is_empty() {
        return Err(findings.unrepresentable(
            "shield.purgers",
            "no address may purge: a shield nobody can purge serves stale content until its TTL runs out; name the controller's address",
        ));
    }
    let (defaults, routes) = resolve(cache, &mut findings);
    let patterns = route_patterns(&routes, &findings)?;
    if defaults.sie != defaults.swr {
        findings.approximated(
            "cache.defaults.stale_if_error",
            format!(
                "Varnish has one grace period: objects are kept and served stale for {}s (the larger of stale_while_revalidate and stale_if_error), whether the origin is failing or only slow to revalidate",
                defaults.swr.max(defaults.sie)
            ),
        );
    }
    let grace = defaults.swr.max(defaults.sie);
    let cond = |i: usize, var: &str| {
        let mut c = format!("{var} ~ {}", patterns[i]);
        for e in exclusions(&routes, i) {
            let _ = write!(c, " && !({var} ~ {})", patterns[e.index]);
        }
        c
    };

    let mut v = String::new();
    v.push_str("vcl 4.1;\n# The origin shield, rendered by multicdn from the policy's cache section.\n\nimport xkey;\n\n");
    let _ = writeln!(
        v,
        "backend origin {{\n  .host = \"{}\";\n  .port = \"{}\";\n  .connect_timeout = 2s;\n  .first_byte_timeout = 10s;\n}}\n",
        target.origin_host, target.origin_port
    );
    v.push_str("acl purgers {\n");
    for a in &target.purgers {
        let _ = writeln!(v, "  \"{a}\";");
    }
    v.push_str("}\n\n");

    // vcl_recv
    v.push_str("sub vcl_recv {\n  if (req.method == \"PURGE\") {\n    if (client.ip !~ purgers) {\n      return (synth(405, \"Not allowed\"));\n    }\n    if (req.http.xkey-purge) {\n      set req.http.n-gone = xkey.purge(req.http.xkey-purge);\n      return (synth(200, \"Invalidated \" + req.http.n-gone));\n    }\n    return (purge);\n  }\n");
    v.push_str("  if (req.method != \"GET\" && req.method != \"HEAD\") {\n    return (pass);\n  }\n  if (req.http.Authorization) {\n    return (pass);\n  }\n");
    for r in routes.iter().filter(|r| r.never) {
        let _ = writeln!(
            v,
            "  # {} match {}: never cached\n  if ({}) {{\n    return (pass);\n  }}",
            r.at(),
            escape_control(&r.pattern),
            cond(r.index, "regsub(req.url, \"\\?.*$\", \"\")")
        );
    }
    recv_cache_key(cache, &mut findings, &mut v);
    v.push_str("  return (hash);\n}\n\n");

    // vcl_hash
    let cookies = names(
        &cache.cache_key.cookie_allowlist,
        "cache.cache_key.cookie_allowlist",
        &mut findings,
    );
    v.push_str("sub vcl_hash {\n  hash_data(req.url);\n  if (req.http.host) {\n    hash_data(req.http.host);\n  }\n");
    if cache.cache_key.normalise_accept_encoding {
        v.push_str(
            "  if (req.http.Accept-Encoding) {\n    hash_data(req.http.Accept-Encoding);\n  }\n",
        );
    }
    for c in &cookies {
        let _ = writeln!(
            v,
            "  hash_data(\"cookie:{c}=\" + regsub(req.http.Cookie, \"^(?:.*; )?{c}=([^;]*).*$|^.*$\", \"\\1\"));"
        );
    }
    v.push_str("  return (lookup);\n}\n\n");

    // vcl_backend_response
    let statuses: Vec<String> = CACHEABLE_STATUSES
        .iter()
        .map(|s| format!("beresp.status == {s}"))
        .collect();
    v.push_str("sub vcl_backend_response {\n  if (bereq.is_bgfetch && beresp.status >= 500) {\n    # A failing origin: keep serving the stale object.\n    return (abandon);\n  }\n");
    let _ = writeln!(
        v,
        "  if (!({}) || beresp.http.Set-Cookie) {{\n    set beresp.ttl = 120s;\n    set beresp.uncacheable = true;\n    return (deliver);\n  }}",
        statuses.join(" || ")
    );
    let _ = writeln!(v, "  set beresp.grace = {grace}s;");
    let mut first = true;
    for r in routes.iter().filter(|r| !r.never) {
        let kw = if first { "if" } else { "} elsif" };
        first = false;
        let _ = writeln!(
            v,
            "  # {} match {}\n  {kw} ({}) {{",
            r.at(),
            escape_control(&r.pattern),
            cond(r.index, "regsub(bereq.url, \"\\?.*$\", \"\")")
        );
        route_fetch(&mut v, r);
    }
    if first {
        let _ = writeln!(
            v,
            "  set beresp.ttl = {}s;\n  unset beresp.http.xkey;\n  unset beresp.http.Surrogate-Key;",
            defaults.ttl_edge
        );
    } else {
        let _ = writeln!(
            v,
            "  }} else {{\n    set beresp.ttl = {}s;\n    unset beresp.http.xkey;\n    unset beresp.http.Surrogate-Key;\n  }}",
            defaults.ttl_edge
        );
    }
    v.push_str("  return (deliver);\n}\n\n");
    v.push_str(
        "sub vcl_backend_error {\n  if (bereq.is_bgfetch) {\n    return (abandon);\n  }\n}\n\n",
    );
    v.push_str("sub vcl_deliver {\n  unset resp.http.xkey;\n  if (obj.uncacheable) {\n    set resp.http.X-Shield-Cache = \"PASS\";\n  } elsif (obj.hits > 0) {\n    set resp.http.X-Shield-Cache = \"HIT\";\n  } else {\n    set resp.http.X-Shield-Cache = \"MISS\";\n  }\n}\n");
    let warnings = findings.finish(mode)?;
    Ok(ShieldRendering { vcl: v, warnings })
}

fn route_fetch(v: &mut String, r: &ResolvedRoute) {
    let _ = writeln!(v, "    set beresp.ttl = {}s;", r.ttl_edge);
    if r.surrogate_keys_from_origin {
        v.push_str("    if (beresp.http.Surrogate-Key) {\n      set beresp.http.xkey = beresp.http.Surrogate-Key;\n    }\n");
    } else {
        v.push_str("    unset beresp.http.xkey;\n    unset beresp.http.Surrogate-Key;\n");
    }
}

fn names(list: &[String], feature: &str, findings: &mut Findings) -> Vec<String> {
    list.iter()
        .filter(|n| {
            let ok = is_vcl_name(n);
            if !ok {
                findings.unsupported(
                    feature,
                    format!("{n:?} is not a name the shield VCL can match (letters, digits, - and _); it is left out"),
                );
            }
            ok
        })
        .cloned()
        .collect()
}

fn recv_cache_key(cache: &CachePolicy, findings: &mut Findings, v: &mut String) {
    let key = &cache.cache_key;
    let params = names(
        &key.query_allowlist,
        "cache.cache_key.query_allowlist",
        findings,
    );
    if !params.is_empty() {
        let _ = writeln!(
            v,
            "  # cache.cache_key.query_allowlist: only these parameters reach the cache key and the origin\n  if (req.url ~ \"\\?\") {{\n    set req.http.x-q = \"&\" + regsub(req.url, \"^[^?]*\\?\", \"\");\n    set req.http.x-q = regsuball(req.http.x-q, \"&(?!(?:{})(?:=|&|$))[^&]*\", \"\");\n    set req.url = regsub(req.url, \"\\?.*$\", \"\") + regsub(req.http.x-q, \"^&\", \"?\");\n    unset req.http.x-q;\n  }}",
            params.join("|")
        );
    }
    let cookies = names(
        &key.cookie_allowlist,
        "cache.cache_key.cookie_allowlist",
        findings,
    );
    if !cookies.is_empty() {
        let _ = writeln!(
            v,
            "  # cache.cache_key.cookie_allowlist: only these cookies reach the cache key and the origin\n  if (req.http.Cookie) {{\n    set req.http.Cookie = \";\" + req.http.Cookie;\n    set req.http.Cookie = regsuball(req.http.Cookie, \"; +\", \";\");\n    set req.http.Cookie = regsuball(req.http.Cookie, \";({})=\", \"; \\1=\");\n    set req.http.Cookie = regsuball(req.http.Cookie, \";[^ ][^;]*\", \"\");\n    set req.http.Cookie = regsuball(req.http.Cookie, \"^[; ]+|[; ]+$\", \"\");\n    if (req.http.Cookie == \"\") {{\n      unset req.http.Cookie;\n    }}\n  }}",
            cookies.join("|")
        );
    }
    if key.normalise_accept_encoding {
        v.push_str("  # cache.cache_key.normalise_accept_encoding: br, gzip or nothing\n  if (req.http.Accept-Encoding) {\n    if (req.http.Accept-Encoding ~ \"\\bbr\\b\") {\n      set req.http.Accept-Encoding = \"br\";\n    } elsif (req.http.Accept-Encoding ~ \"\\bgzip\\b\") {\n      set req.http.Accept-Encoding = \"gzip\";\n    } else {\n      unset req.http.Accept-Encoding;\n    }\n  }\n");
    }
}
