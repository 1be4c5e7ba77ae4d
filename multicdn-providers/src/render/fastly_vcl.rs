//! Fastly: the cache policy as VCL snippets, one per subroutine, named and prioritised.
//!
//! | snippet | type | priority | what it does |
//! |---|---|---|---|
//! | `multicdn-recv-routes` | recv | 10 | `return(pass)` for never-cached routes (before any rewrite, so the origin sees the full request) |
//! | `multicdn-recv-cache-key` | recv | 20 | query allowlist (`querystring.filter_except`), cookie allowlist, `Accept-Encoding` to `br`/`gzip`/nothing |
//! | `multicdn-hash-cache-key` | hash | 10 | the allowlisted cookies vary the cache (only with a cookie allowlist) |
//! | `multicdn-fetch-ttl` | fetch | 10 | per route, first match wins: edge TTL, `stale_while_revalidate`, `stale_if_error`, the browser `Cache-Control`, `Surrogate-Key` kept or removed |
//! | `multicdn-deliver-headers` | deliver | 10 | the identity `Server-Timing` and `Timing-Allow-Origin` (at the edge node only), route headers |
//!
//! Strings are VCL short strings (`"..."`) where they can be, long strings (`{"..."}`) where
//! they contain `"` or `%`; a value that fits neither (it contains `"}` or a control
//! character) cannot be written in VCL and is reported.

use std::fmt::Write as _;

use multicdn_core::policy::{CachePolicy, Site, escape_control};
use serde::{Deserialize, Serialize};

use super::plan::PlanItem;
pub use super::vcl_string;
use super::{
    CACHEABLE_STATUSES, Defaults, Findings, RenderError, RenderMode, RenderWarning, ResolvedRoute,
    cache_control, exclusions, is_vcl_name, resolve, route_patterns, site_origin,
};

/// A Fastly VCL snippet type (the subroutine it is inserted into).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnippetKind {
    /// `vcl_init` (outside any subroutine).
    Init,
    /// `vcl_recv`.
    Recv,
    /// `vcl_hash`.
    Hash,
    /// `vcl_hit`.
    Hit,
    /// `vcl_miss`.
    Miss,
    /// `vcl_pass`.
    Pass,
    /// `vcl_fetch`.
    Fetch,
    /// `vcl_error`.
    Error,
    /// `vcl_deliver`.
    Deliver,
    /// `vcl_log`.
    Log,
    /// Not inserted anywhere.
    None,
}

impl SnippetKind {
    /// The API's name for the type.
    pub fn as_str(self) -> &'static str {
        match self {
            SnippetKind::Init => "init",
            SnippetKind::Recv => "recv",
            SnippetKind::Hash => "hash",
            SnippetKind::Hit => "hit",
            SnippetKind::Miss => "miss",
            SnippetKind::Pass => "pass",
            SnippetKind::Fetch => "fetch",
            SnippetKind::Error => "error",
            SnippetKind::Deliver => "deliver",
            SnippetKind::Log => "log",
            SnippetKind::None => "none",
        }
    }

    /// Reads the API's name for a type.
    pub fn parse(s: &str) -> Option<SnippetKind> {
        Some(match s {
            "init" => SnippetKind::Init,
            "recv" => SnippetKind::Recv,
            "hash" => SnippetKind::Hash,
            "hit" => SnippetKind::Hit,
            "miss" => SnippetKind::Miss,
            "pass" => SnippetKind::Pass,
            "fetch" => SnippetKind::Fetch,
            "error" => SnippetKind::Error,
            "deliver" => SnippetKind::Deliver,
            "log" => SnippetKind::Log,
            "none" => SnippetKind::None,
            _ => return None,
        })
    }
}

impl std::fmt::Display for SnippetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One VCL snippet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snippet {
    /// Unique within the service version (`multicdn-recv-routes`).
    pub name: String,
    /// The subroutine.
    #[serde(rename = "type")]
    pub kind: SnippetKind,
    /// Lower runs first within the subroutine (Fastly's default is 100).
    pub priority: u32,
    /// The VCL.
    pub content: String,
}

/// Every snippet the renderer owns is named with this prefix; others are left alone.
pub const SNIPPET_PREFIX: &str = "multicdn-";

/// The policy rendered for Fastly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastlyRendering {
    /// The snippets, in a fixed order (recv, hash, fetch, deliver; then priority).
    pub snippets: Vec<Snippet>,
    /// What could not be expressed as written.
    pub warnings: Vec<RenderWarning>,
}

impl FastlyRendering {
    /// The snippet called `name`.
    pub fn snippet(&self, name: &str) -> Option<&Snippet> {
        self.snippets.iter().find(|s| s.name == name)
    }

    /// Every snippet in one reviewable file, each under a header naming it, its type and its
    /// priority (the golden file's format).
    pub fn to_vcl_file(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# Fastly VCL snippets rendered by multicdn from the policy's cache section.\n",
        );
        out.push_str("# Each is a regular (versioned) snippet; do not edit on the console.\n");
        if self.warnings.is_empty() {
            out.push_str("# warnings: none\n");
        } else {
            out.push_str("# warnings:\n");
            for w in &self.warnings {
                let _ = writeln!(out, "#   - {}", escape_control(&w.to_string()));
            }
        }
        for s in &self.snippets {
            let _ = writeln!(
                out,
                "\n# ---- snippet {}: type {}, priority {} ----",
                s.name, s.kind, s.priority
            );
            out.push_str(&s.content);
        }
        out
    }
}

/// Renders the cache policy as Fastly snippets, for the site whose pages may read the edge's
/// timings (`Timing-Allow-Origin: https://<site.host>`).
pub fn render_fastly(
    site: &Site,
    cache: &CachePolicy,
    mode: RenderMode,
) -> Result<FastlyRendering, RenderError> {
    let mut findings = Findings::new("fastly");
    let origin = site_origin(site, &findings)?;
    let (defaults, routes) = resolve(cache, &mut findings);
    let patterns = route_patterns(&routes, &findings)?;
    let cond = |i: usize| route_condition(&routes, &patterns, i);

    let mut snippets = Vec::new();
    if let Some(s) = recv_routes(&routes, &cond) {
        snippets.push(s);
    }
    if let Some(s) = recv_cache_key(cache, &mut findings) {
        snippets.push(s);
    }
    if let Some(s) = hash_cache_key(cache, &mut findings) {
        snippets.push(s);
    }
    snippets.push(fetch_ttl(&routes, &patterns, &defaults, &mut findings));
    snippets.push(deliver_headers(&origin, &routes, &cond, &mut findings));
    let warnings = findings.finish(mode)?;
    Ok(FastlyRendering { snippets, warnings })
}

/// `req.url.path ~ "<pattern>"` and not any earlier route it could overlap.
fn route_condition(routes: &[ResolvedRoute], patterns: &[String], i: usize) -> String {
    let mut c = format!("req.url.path ~ {}", patterns[i]);
    for earlier in exclusions(routes, i) {
        let _ = write!(c, " && !(req.url.path ~ {})", patterns[earlier.index]);
    }
    c
}

fn describe(r: &ResolvedRoute) -> String {
    format!("# {} match {}", r.at(), escape_control(&r.pattern))
}

fn recv_routes(routes: &[ResolvedRoute], cond: &dyn Fn(usize) -> String) -> Option<Snippet> {
    let mut out = String::new();
    for r in routes.iter().filter(|r| r.never) {
        let _ = writeln!(out, "{}: never cached", describe(r));
        let _ = writeln!(out, "if ({}) {{\n  return(pass);\n}}", cond(r.index));
    }
    (!out.is_empty()).then(|| Snippet {
        name: "multicdn-recv-routes".into(),
        kind: SnippetKind::Recv,
        priority: 10,
        content: out,
    })
}

fn recv_cache_key(cache: &CachePolicy, findings: &mut Findings) -> Option<Snippet> {
    let key = &cache.cache_key;
    let mut out = String::new();
    let params: Vec<String> = key
        .query_allowlist
        .iter()
        .filter_map(|p| {
            let lit = vcl_string(p).filter(|_| !p.is_empty() && !p.contains(['&', '=']));
            if lit.is_none() {
                findings.unsupported(
                    "cache.cache_key.query_allowlist",
                    format!(
                        "{p:?} is not a query parameter name VCL can filter on; it is left out"
                    ),
                );
            }
            lit
        })
        .collect();
    if !params.is_empty() {
        out.push_str(
            "# cache.cache_key.query_allowlist: only these parameters reach the cache key and the origin\n",
        );
        let _ = writeln!(
            out,
            "set req.url = querystring.filter_except(req.url, {});",
            params.join(" querystring.filtersep() ")
        );
    }
    let cookies = cookie_names(&key.cookie_allowlist, findings);
    if !cookies.is_empty() {
        out.push_str(
            "# cache.cache_key.cookie_allowlist: only these cookies reach the cache key and the origin\n",
        );
        out.push_str("if (req.http.Cookie) {\n");
        out.push_str("  set req.http.Cookie = \";\" req.http.Cookie;\n");
        out.push_str("  set req.http.Cookie = regsuball(req.http.Cookie, \"; +\", \";\");\n");
        let _ = writeln!(
            out,
            "  set req.http.Cookie = regsuball(req.http.Cookie, \";({})=\", \"; \\1=\");",
            cookies.join("|")
        );
        out.push_str("  set req.http.Cookie = regsuball(req.http.Cookie, \";[^ ][^;]*\", \"\");\n");
        out.push_str(
            "  set req.http.Cookie = regsuball(req.http.Cookie, \"^[; ]+|[; ]+$\", \"\");\n",
        );
        out.push_str("  if (req.http.Cookie == \"\") {\n    unset req.http.Cookie;\n  }\n}\n");
    }
    if key.normalise_accept_encoding {
        out.push_str("# cache.cache_key.normalise_accept_encoding: br, gzip or nothing\n");
        out.push_str("if (req.http.Accept-Encoding) {\n");
        out.push_str("  if (req.http.Accept-Encoding ~ \"\\bbr\\b\") {\n");
        out.push_str("    set req.http.Accept-Encoding = \"br\";\n");
        out.push_str("  } elsif (req.http.Accept-Encoding ~ \"\\bgzip\\b\") {\n");
        out.push_str("    set req.http.Accept-Encoding = \"gzip\";\n");
        out.push_str("  } else {\n    unset req.http.Accept-Encoding;\n  }\n}\n");
    }
    (!out.is_empty()).then(|| Snippet {
        name: "multicdn-recv-cache-key".into(),
        kind: SnippetKind::Recv,
        priority: 20,
        content: out,
    })
}

/// Cookie names VCL can address as `req.http.Cookie:<name>` and match in a regex unescaped.
fn cookie_names(names: &[String], findings: &mut Findings) -> Vec<String> {
    names
        .iter()
        .filter(|n| {
            let ok = is_vcl_name(n);
            if !ok {
                findings.unsupported(
                    "cache.cache_key.cookie_allowlist",
                    format!("{n:?} is not a cookie name VCL can address (letters, digits, - and _); it is left out"),
                );
            }
            ok
        })
        .cloned()
        .collect()
}

fn hash_cache_key(cache: &CachePolicy, findings: &mut Findings) -> Option<Snippet> {
    let cookies = cookie_names(&cache.cache_key.cookie_allowlist, findings);
    if cookies.is_empty() {
        return None;
    }
    let mut out = String::from(
        "# cache.cache_key.cookie_allowlist: the allowlisted cookies vary the cache\n",
    );
    for c in cookies {
        let _ = writeln!(out, "set req.hash += \"cookie:{c}=\" req.http.Cookie:{c};");
    }
    Some(Snippet {
        name: "multicdn-hash-cache-key".into(),
        kind: SnippetKind::Hash,
        priority: 10,
        content: out,
    })
}

fn cacheable_guard() -> String {
    let statuses: Vec<String> = CACHEABLE_STATUSES
        .iter()
        .map(|s| format!("beresp.status == {s}"))
        .collect();
    format!("!beresp.http.Set-Cookie && ({})", statuses.join(" || "))
}

fn fetch_ttl(
    routes: &[ResolvedRoute],
    patterns: &[String],
    defaults: &Defaults,
    findings: &mut Findings,
) -> Snippet {
    let mut out = String::new();
    for (i, r) in routes.iter().enumerate() {
        let keyword = if i == 0 { "if" } else { "} elsif" };
        let _ = writeln!(out, "{keyword} (req.url.path ~ {}) {{", patterns[i]);
        if r.never {
            let _ = writeln!(out, "  {}: never cached", describe(r));
            out.push_str("  set beresp.cacheable = false;\n  set beresp.ttl = 0s;\n");
        } else {
            let _ = writeln!(out, "  {}", describe(r));
            let cc = (!r.sets_cache_control())
                .then(|| cache_control(r.ttl_browser, defaults, r.immutable));
            cacheable_body(
                &mut out,
                "  ",
                r.ttl_edge,
                defaults,
                cc.as_deref(),
                findings,
            );
            surrogate_keys(&mut out, "  ", r.surrogate_keys_from_origin);
        }
    }
    let indent = if routes.is_empty() { "" } else { "  " };
    if !routes.is_empty() {
        out.push_str("} else {\n");
    }
    let _ = writeln!(out, "{indent}# cache.defaults");
    let cc = cache_control(defaults.ttl_browser, defaults, false);
    cacheable_body(
        &mut out,
        indent,
        defaults.ttl_edge,
        defaults,
        Some(&cc),
        findings,
    );
    surrogate_keys(&mut out, indent, false);
    if !routes.is_empty() {
        out.push_str("}\n");
    }
    Snippet {
        name: "multicdn-fetch-ttl".into(),
        kind: SnippetKind::Fetch,
        priority: 10,
        content: out,
    }
}

fn cacheable_body(
    out: &mut String,
    indent: &str,
    ttl_edge: u64,
    d: &Defaults,
    cache_control: Option<&str>,
    findings: &mut Findings,
) {
    let _ = writeln!(out, "{indent}if ({}) {{", cacheable_guard());
    let _ = writeln!(out, "{indent}  set beresp.ttl = {ttl_edge}s;");
    let _ = writeln!(
        out,
        "{indent}  set beresp.stale_while_revalidate = {}s;",
        d.swr
    );
    let _ = writeln!(out, "{indent}  set beresp.stale_if_error = {}s;", d.sie);
    if let Some(cc) = cache_control {
        match vcl_string(cc) {
            Some(lit) => {
                let _ = writeln!(out, "{indent}  set beresp.http.Cache-Control = {lit};");
            }
            None => {
                findings.unsupported("cache.defaults", format!("{cc:?} cannot be written in VCL"))
            }
        }
    }
    let _ = writeln!(out, "{indent}}}");
}

fn surrogate_keys(out: &mut String, indent: &str, from_origin: bool) {
    if from_origin {
        let _ = writeln!(
            out,
            "{indent}# surrogate_keys_from_origin: Fastly reads the origin's Surrogate-Key natively"
        );
    } else {
        let _ = writeln!(out, "{indent}unset beresp.http.Surrogate-Key;");
    }
}

fn deliver_headers(
    origin: &str,
    routes: &[ResolvedRoute],
    cond: &dyn Fn(usize) -> String,
    findings: &mut Findings,
) -> Snippet {
    let mut out = String::from(
        "# identity (seed 000 section 14): which CDN, which PoP, which cache verdict;\n\
         # added once, at the edge node that answers the client (not at a shield);\n\
         # Timing-Allow-Origin lets the site's pages read it, and Resource Timing, cross-origin\n\
         declare local var.multicdn_cache STRING;\n\
         if (fastly.ff.visits_this_service == 0) {\n\
         \x20 if (fastly_info.state ~ \"PASS\") {\n\
         \x20   set var.multicdn_cache = \"PASS\";\n\
         \x20 } elsif (fastly_info.state ~ \"^HIT-STALE\") {\n\
         \x20   set var.multicdn_cache = \"STALE\";\n\
         \x20 } elsif (fastly_info.state ~ \"^HIT\") {\n\
         \x20   set var.multicdn_cache = \"HIT\";\n\
         \x20 } elsif (fastly_info.state ~ \"^MISS\") {\n\
         \x20   set var.multicdn_cache = \"MISS\";\n\
         \x20 } else {\n\
         \x20   set var.multicdn_cache = fastly_info.state;\n\
         \x20 }\n\
         \x20 add resp.http.Server-Timing = {\"cdn;desc=\"fastly\", pop;desc=\"\"} server.datacenter {\"\", cache;desc=\"\"} var.multicdn_cache {\"\"\"};\n",
    );
    // The origin is a hostname behind https:// (site_origin): a plain VCL string.
    let _ = writeln!(
        out,
        "  set resp.http.Timing-Allow-Origin = \"{origin}\";\n}}"
    );
    // A quality cap set upstream (the shield's or the origin's CMSD layer) reaches the player,
    // readable cross-origin (dash.js and the hls.js snippet read it from segment responses).
    out.push_str(
        "if (resp.http.CMSD-Dynamic) {\n\
         \x20 add resp.http.Access-Control-Expose-Headers = \"CMSD-Dynamic\";\n\
         }\n",
    );
    for r in routes.iter().filter(|r| !r.headers.is_empty()) {
        let mut body = String::new();
        for (name, value) in &r.headers {
            let feature = format!("{}.headers.{name}", r.at());
            if !is_vcl_name(name) {
                findings.unsupported(
                    feature,
                    format!("{name:?} is not a header name VCL can set (letters, digits, - and _)"),
                );
                continue;
            }
            match vcl_string(value) {
                Some(lit) => {
                    let _ = writeln!(body, "  set resp.http.{name} = {lit};");
                }
                None => findings.unsupported(
                    feature,
                    format!("{value:?} cannot be written as a VCL string"),
                ),
            }
        }
        if !body.is_empty() {
            let _ = writeln!(out, "{}: headers", describe(r));
            let _ = write!(out, "if ({}) {{\n{body}}}\n", cond(r.index));
        }
    }
    Snippet {
        name: "multicdn-deliver-headers".into(),
        kind: SnippetKind::Deliver,
        priority: 10,
        content: out,
    }
}

impl PlanItem for Snippet {
    fn summary(&self) -> String {
        format!(
            "type {}, priority {}, {} line(s)",
            self.kind,
            self.priority,
            self.content.lines().count()
        )
    }

    fn differences(&self, deployed: &Snippet) -> Vec<String> {
        let mut out = Vec::new();
        if self.kind != deployed.kind {
            out.push(format!("type: {} -> {}", deployed.kind, self.kind));
        }
        if self.priority != deployed.priority {
            out.push(format!(
                "priority: {} -> {}",
                deployed.priority, self.priority
            ));
        }
        if self.content != deployed.content {
            let old: Vec<&str> = deployed.content.lines().collect();
            let new: Vec<&str> = self.content.lines().collect();
            let first = old
                .iter()
                .zip(&new)
                .position(|(a, b)| a != b)
                .unwrap_or(old.len().min(new.len()));
            out.push(format!(
                "content: {} line(s) -> {} line(s), first difference at line {}",
                old.len(),
                new.len(),
                first + 1
            ));
            if let Some(l) = old.get(first) {
                out.push(format!("  deployed: {}", l.trim()));
            }
            if let Some(l) = new.get(first) {
                out.push(format!("  expected: {}", l.trim()));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_pick_the_literal_form_vcl_can_read() {
        assert_eq!(vcl_string("^/checkout").as_deref(), Some("\"^/checkout\""));
        assert_eq!(vcl_string("a\"b").as_deref(), Some("{\"a\"b\"}"));
        assert_eq!(vcl_string("100%").as_deref(), Some("{\"100%\"}"));
        assert_eq!(vcl_string("x\"}y"), None);
        assert_eq!(vcl_string("a\nb"), None);
    }

    #[test]
    fn a_line_break_in_a_warning_stays_inside_its_comment() {
        let rendering = FastlyRendering {
            snippets: Vec::new(),
            warnings: vec![RenderWarning {
                feature: "cache.routes[0].headers.X\nset req.http.Evil = \"1\";".into(),
                kind: crate::render::WarningKind::Unsupported,
                why: "not a header name".into(),
            }],
        };
        let file = rendering.to_vcl_file();
        assert!(
            file.lines().all(|l| l.is_empty() || l.starts_with('#')),
            "{file}"
        );
        assert!(file.contains("X\\nset req.http.Evil"), "{file}");
    }

    #[test]
    fn a_header_name_with_a_line_break_never_becomes_live_vcl() {
        // What `policy render` did with a name validation let through: the warning's comment
        // ended at the line break and the rest was VCL.
        let cache: CachePolicy = serde_json::from_value(serde_json::json!({
            "routes": [{"match": "^/a", "headers": {"X\nset req.http.Evil = \"1\";\n#": "v"}}]
        }))
        .unwrap();
        let site: Site =
            serde_json::from_value(serde_json::json!({"host": "www.example.com"})).unwrap();
        let file = render_fastly(&site, &cache, RenderMode::Lenient)
            .unwrap()
            .to_vcl_file();
        assert!(
            !file
                .lines()
                .any(|l| l.trim_start().starts_with("set req.http.Evil")),
            "{file}"
        );
        assert!(render_fastly(&site, &cache, RenderMode::Strict).is_err());
    }

    #[test]
    fn snippet_kinds_round_trip() {
        for k in [
            SnippetKind::Recv,
            SnippetKind::Hash,
            SnippetKind::Fetch,
            SnippetKind::Deliver,
        ] {
            assert_eq!(SnippetKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(SnippetKind::parse("vcl_recv"), None);
    }
}
