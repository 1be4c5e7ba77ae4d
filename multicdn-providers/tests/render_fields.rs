//! Every cache-policy field changes the rendering in the expected place, and only there; the
//! identity header reads back as the right provider; unsupported features are reported.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use multicdn_core::policy::{CacheMode, CachePolicy, CloudflarePlan, Dur, Site};
use multicdn_core::{Policy, served_by};
use multicdn_providers::render::cloudflare_rules::{
    CloudflareRendering, CloudflareTarget, render_cloudflare,
};
use multicdn_providers::render::fastly_vcl::{FastlyRendering, render_fastly};
use multicdn_providers::render::{RenderError, RenderMode, WarningKind};
use serde_json::json;

fn seed_policy() -> Policy {
    Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap()
}

fn seed() -> CachePolicy {
    seed_policy().cache
}

/// The seed's site, `www.example.com`.
fn site() -> Site {
    seed_policy().site
}

fn fastly(c: &CachePolicy) -> FastlyRendering {
    render_fastly(&site(), c, RenderMode::Lenient).unwrap()
}

fn cloudflare(c: &CachePolicy) -> CloudflareRendering {
    cloudflare_for(&site(), c).unwrap()
}

/// Pro plan, lenient.
fn cloudflare_for(site: &Site, c: &CachePolicy) -> Result<CloudflareRendering, RenderError> {
    render_cloudflare(
        site,
        c,
        CloudflareTarget::new(CloudflarePlan::Pro),
        RenderMode::Lenient,
    )
}

/// The snippets whose presence or content differs.
fn fastly_changes(a: &FastlyRendering, b: &FastlyRendering) -> BTreeSet<String> {
    let names: BTreeSet<&str> = a
        .snippets
        .iter()
        .chain(&b.snippets)
        .map(|s| s.name.as_str())
        .collect();
    names
        .into_iter()
        .filter(|n| a.snippet(n) != b.snippet(n))
        .map(str::to_owned)
        .collect()
}

/// The rules (by ref) whose presence or content differs, and `warnings` if those differ.
fn cloudflare_changes(a: &CloudflareRendering, b: &CloudflareRendering) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (ra, rb) in a.rulesets().into_iter().zip(b.rulesets()) {
        let refs: BTreeSet<&str> = ra
            .rules
            .iter()
            .chain(&rb.rules)
            .map(|r| r.reference.as_str())
            .collect();
        for r in refs {
            if ra.rule(r) != rb.rule(r) {
                out.insert(r.to_owned());
            }
        }
    }
    if a.warnings != b.warnings {
        out.insert("warnings".to_owned());
    }
    out
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

type Mutation = fn(&mut CachePolicy);

#[test]
fn every_cache_policy_field_changes_the_output_in_the_expected_place() {
    let cases: Vec<(&str, Mutation, &[&str], &[&str])> = vec![
        (
            "defaults.ttl_edge",
            |c| c.defaults.ttl_edge = Dur::secs(7200),
            &["multicdn-fetch-ttl"],
            &["multicdn-cache-defaults"],
        ),
        (
            "defaults.ttl_browser",
            |c| c.defaults.ttl_browser = Dur::secs(120),
            &["multicdn-fetch-ttl"],
            // Under Pro's 1 h browser-TTL minimum: carried by the Cache-Control rules.
            &[
                "multicdn-cache-control-route-2",
                "multicdn-cache-control-defaults",
                "warnings",
            ],
        ),
        (
            "defaults.stale_while_revalidate",
            |c| c.defaults.stale_while_revalidate = Dur::secs(172_800),
            &["multicdn-fetch-ttl"],
            &[
                "multicdn-cache-control-route-2",
                "multicdn-cache-control-route-3",
                "multicdn-cache-control-defaults",
                "warnings",
            ],
        ),
        (
            "defaults.stale_if_error",
            |c| c.defaults.stale_if_error = Dur::secs(86_400),
            &["multicdn-fetch-ttl"],
            &[
                "multicdn-cache-control-route-2",
                "multicdn-cache-control-route-3",
                "multicdn-cache-control-defaults",
                "warnings",
            ],
        ),
        (
            "cache_key.query_allowlist",
            |c| c.cache_key.query_allowlist.push("q".into()),
            &["multicdn-recv-cache-key"],
            &["warnings"],
        ),
        (
            "cache_key.cookie_allowlist",
            |c| c.cache_key.cookie_allowlist.push("lang".into()),
            &["multicdn-recv-cache-key", "multicdn-hash-cache-key"],
            &["multicdn-cache-cookie-bypass", "warnings"],
        ),
        (
            "cache_key.normalise_accept_encoding",
            |c| c.cache_key.normalise_accept_encoding = false,
            &["multicdn-recv-cache-key"],
            &["warnings"],
        ),
        (
            "routes[2].match",
            |c| c.routes[2].pattern = "^/p/".into(),
            &["multicdn-fetch-ttl"],
            &[
                "multicdn-cache-route-2",
                "multicdn-cache-route-3",
                "multicdn-cache-control-route-2",
                "multicdn-cache-control-route-3",
                "multicdn-cache-control-defaults",
            ],
        ),
        (
            "routes[2].cache",
            |c| {
                let r = &mut c.routes[2];
                r.cache = CacheMode::Never;
                r.ttl_edge = None;
                r.surrogate_keys_from_origin = false;
            },
            &["multicdn-recv-routes", "multicdn-fetch-ttl"],
            &[
                "multicdn-cache-route-2",
                "multicdn-cache-control-route-2",
                "warnings",
            ],
        ),
        (
            "routes[2].ttl_edge",
            |c| c.routes[2].ttl_edge = Some(Dur::secs(7200)),
            &["multicdn-fetch-ttl"],
            &["multicdn-cache-route-2"],
        ),
        (
            "routes[3].ttl_browser",
            |c| c.routes[3].ttl_browser = Some(Dur(Duration::from_secs(30 * 86_400))),
            &["multicdn-fetch-ttl"],
            &["multicdn-cache-route-3", "multicdn-cache-control-route-3"],
        ),
        (
            "routes[2].headers",
            |c| {
                c.routes[2]
                    .headers
                    .insert("X-Frame-Options".into(), "DENY".into());
            },
            &["multicdn-deliver-headers"],
            &["multicdn-headers-route-2"],
        ),
        (
            "routes[3].surrogate_keys_from_origin",
            |c| c.routes[3].surrogate_keys_from_origin = true,
            &["multicdn-fetch-ttl"],
            &["warnings"],
        ),
        (
            "routes[3].immutable",
            |c| c.routes[3].immutable = false,
            &["multicdn-fetch-ttl"],
            &["multicdn-cache-control-route-3"],
        ),
    ];
    let base = seed();
    let (f0, c0) = (fastly(&base), cloudflare(&base));
    for (field, mutate, on_fastly, on_cloudflare) in cases {
        let mut changed = base.clone();
        mutate(&mut changed);
        assert_ne!(changed, base, "{field}: the mutation changed nothing");
        let (f1, c1) = (fastly(&changed), cloudflare(&changed));
        assert_eq!(
            fastly_changes(&f0, &f1),
            set(on_fastly),
            "{field} on Fastly"
        );
        assert_eq!(
            cloudflare_changes(&c0, &c1),
            set(on_cloudflare),
            "{field} on Cloudflare"
        );
    }
}

#[test]
fn a_mutated_field_shows_up_with_its_new_value() {
    let mut c = seed();
    c.defaults.ttl_edge = Dur::secs(7200);
    c.routes[2]
        .headers
        .insert("X-Frame-Options".into(), "DENY".into());
    let f = fastly(&c);
    let fetch = &f.snippet("multicdn-fetch-ttl").unwrap().content;
    assert!(fetch.contains("set beresp.ttl = 7200s;"), "{fetch}");
    let deliver = &f.snippet("multicdn-deliver-headers").unwrap().content;
    assert!(
        deliver.contains(
            "if (req.url.path ~ \"^/products/\") {\n  set resp.http.X-Frame-Options = \"DENY\";"
        ),
        "{deliver}"
    );
    let cf = cloudflare(&c);
    let defaults = cf.cache_rules.rule("multicdn-cache-defaults").unwrap();
    assert_eq!(defaults.action_parameters["edge_ttl"]["default"], 7200);
    let headers = cf.header_rules.rule("multicdn-headers-route-2").unwrap();
    assert_eq!(
        headers.action_parameters["headers"]["X-Frame-Options"]["value"],
        "DENY"
    );
}

/// Evaluates the VCL concatenation `{"..."} ident {"..."}` with values for the identifiers.
fn eval_vcl_concat(expr: &str, vars: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut rest = expr.trim();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("{\"") {
            let end = after.find("\"}").unwrap();
            out.push_str(&after[..end]);
            rest = after[end + 2..].trim_start();
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            let ident = &rest[..end];
            out.push_str(vars.iter().find(|(k, _)| *k == ident).unwrap().1);
            rest = rest[end..].trim_start();
        }
    }
    out
}

#[test]
fn fastly_identity_header_reads_back_as_fastly_with_pop_and_cache() {
    let f = fastly(&seed());
    let deliver = &f.snippet("multicdn-deliver-headers").unwrap().content;
    let line = deliver
        .lines()
        .find_map(|l| l.trim().strip_prefix("add resp.http.Server-Timing = "))
        .unwrap();
    let value = eval_vcl_concat(
        line.strip_suffix(';').unwrap(),
        &[("server.datacenter", "LHR"), ("var.multicdn_cache", "HIT")],
    );
    assert_eq!(
        value,
        r#"cdn;desc="fastly", pop;desc="LHR", cache;desc="HIT""#
    );
    let s = served_by(&vec![("Server-Timing", value.as_str())]).unwrap();
    assert_eq!(
        (s.provider.as_str(), s.pop.as_deref()),
        ("fastly", Some("LHR"))
    );
    assert!(s.cache.unwrap().is_hit());
}

#[test]
fn cloudflare_identity_header_reads_back_as_cloudflare_with_cache() {
    let cf = cloudflare(&seed());
    let rule = cf.header_rules.rule("multicdn-identity").unwrap();
    assert_eq!(rule.expression, "true");
    let st = &rule.action_parameters["headers"]["Server-Timing"];
    assert_eq!(st["operation"], "add");
    let expr = st["expression"].as_str().unwrap();
    // concat("<a>", <field>, "<b>"): evaluate with cf-cache-status = HIT.
    let inner = expr
        .strip_prefix("concat(")
        .and_then(|e| e.strip_suffix(')'))
        .unwrap();
    let field = "http.response.headers[\"cf-cache-status\"][0]";
    let (a, b) = inner.split_once(&format!(", {field}, ")).unwrap();
    let unquote = |s: &str| -> String {
        let s = s.strip_prefix('"').unwrap().strip_suffix('"').unwrap();
        s.replace("\\\"", "\"").replace("\\\\", "\\")
    };
    let value = format!("{}HIT{}", unquote(a), unquote(b));
    assert_eq!(value, r#"cdn;desc="cloudflare", cache;desc="HIT""#);
    let s = served_by(&vec![("Server-Timing", value.as_str())]).unwrap();
    assert_eq!(s.provider, "cloudflare");
    assert!(s.cache.unwrap().is_hit());
}

/// A site for the renderers that is not the seed's.
fn site_at(host: &str) -> Site {
    serde_json::from_value(json!({ "host": host })).unwrap()
}

#[test]
fn both_cdns_let_the_site_pages_read_their_timings_cross_origin() {
    // rum.js on https://shop.example.org reads Server-Timing and the probe's Resource Timing
    // from every edge hostname: both edges must name that origin, and the same way.
    let site = site_at("Shop.Example.org");
    let f = render_fastly(&site, &seed(), RenderMode::Lenient).unwrap();
    let deliver = &f.snippet("multicdn-deliver-headers").unwrap().content;
    let lines: Vec<&str> = deliver.lines().map(str::trim).collect();
    let tao = lines
        .iter()
        .position(|l| *l == r#"set resp.http.Timing-Allow-Origin = "https://shop.example.org";"#)
        .unwrap_or_else(|| panic!("no Timing-Allow-Origin in\n{deliver}"));
    // Inside the edge-node-only block, with the identity entry.
    let st = lines
        .iter()
        .position(|l| l.starts_with("add resp.http.Server-Timing"))
        .unwrap();
    assert_eq!(tao, st + 1, "{deliver}");
    assert_eq!(lines[tao + 1], "}", "{deliver}");

    let cf = cloudflare_for(&site, &seed()).unwrap();
    let rule = cf.header_rules.rule("multicdn-identity").unwrap();
    assert_eq!(rule.expression, "true");
    assert_eq!(
        rule.action_parameters["headers"]["Timing-Allow-Origin"],
        json!({"operation": "set", "value": "https://shop.example.org"})
    );
}

#[test]
fn a_site_host_that_is_not_a_hostname_is_refused_by_both_renderers() {
    for host in [
        "",
        "www.example.com\"; set req.http.X = \"1",
        "a b.example.com",
        "x..y",
    ] {
        let site = site_at(host);
        let err = render_fastly(&site, &seed(), RenderMode::Lenient).unwrap_err();
        assert!(
            matches!(&err, RenderError::Unrepresentable { feature, .. } if feature == "site.host"),
            "{host:?}: {err}"
        );
        let err = cloudflare_for(&site, &seed()).unwrap_err();
        assert!(err.to_string().contains("site.host"), "{host:?}: {err}");
    }
}

#[test]
fn every_cacheable_response_gets_stale_if_error_on_both_cdns() {
    let f = fastly(&seed());
    let fetch = &f.snippet("multicdn-fetch-ttl").unwrap().content;
    let cc: Vec<_> = fetch
        .lines()
        .filter(|l| l.contains("set beresp.http.Cache-Control"))
        .collect();
    // Two cacheable routes and the defaults.
    assert_eq!(cc.len(), 3, "{fetch}");
    assert!(cc.iter().all(|l| l.contains("stale-if-error=604800")));
    assert_eq!(
        fetch
            .matches("set beresp.stale_if_error = 604800s;")
            .count(),
        3
    );

    let cf = cloudflare(&seed());
    let rules: Vec<_> = cf
        .header_rules
        .rules
        .iter()
        .filter(|r| r.reference.starts_with("multicdn-cache-control-"))
        .collect();
    assert_eq!(rules.len(), 3);
    for r in rules {
        let v = r.action_parameters["headers"]["Cache-Control"]["value"]
            .as_str()
            .unwrap();
        assert!(v.contains("stale-if-error=604800"), "{}: {v}", r.reference);
    }
}

#[test]
fn later_routes_exclude_earlier_overlapping_ones_so_the_first_match_wins() {
    let cf = cloudflare(&seed());
    let assets = cf.cache_rules.rule("multicdn-cache-route-3").unwrap();
    assert!(
        assets
            .expression
            .contains("and not (starts_with(http.request.uri.path, \"/products/\"))"),
        "{}",
        assets.expression
    );
    // /customer and /checkout cannot overlap: no exclusion needed.
    let private = cf.cache_rules.rule("multicdn-cache-route-1").unwrap();
    assert!(
        !private.expression.contains("not"),
        "{}",
        private.expression
    );
}

#[test]
fn regex_routes_need_business_on_cloudflare_and_are_never_dropped_when_private() {
    let mut c = seed();
    c.routes[2].pattern = "^/products/[0-9]+$".into();
    c.routes[2].surrogate_keys_from_origin = false;
    // Pro: the cacheable route is left out and reported; strict mode refuses.
    let pro = cloudflare(&c);
    assert!(pro.cache_rules.rule("multicdn-cache-route-2").is_none());
    let w = pro
        .warnings
        .iter()
        .find(|w| w.feature == "cache.routes[2].match")
        .unwrap();
    assert_eq!(w.kind, WarningKind::Unsupported);
    assert!(w.why.contains("Business"), "{}", w.why);
    assert!(matches!(
        render_cloudflare(
            &site(),
            &c,
            CloudflareTarget::new(CloudflarePlan::Pro),
            RenderMode::Strict
        ),
        Err(RenderError::Strict { .. })
    ));
    // Business: rendered with `matches` (lenient: the query allowlist needs Enterprise).
    let biz = render_cloudflare(
        &site(),
        &c,
        CloudflareTarget::new(CloudflarePlan::Business),
        RenderMode::Lenient,
    )
    .unwrap();
    assert!(
        biz.warnings
            .iter()
            .all(|w| w.feature != "cache.routes[2].match")
    );
    assert_eq!(
        biz.cache_rules
            .rule("multicdn-cache-route-2")
            .unwrap()
            .expression,
        "(http.request.uri.path matches \"^/products/[0-9]+$\")"
    );
    // A never-cached regex route on Pro is an error even when lenient.
    c.routes[0].pattern = "^/check(out)?[0-9]*".into();
    let err = render_cloudflare(
        &site(),
        &c,
        CloudflareTarget::new(CloudflarePlan::Pro),
        RenderMode::Lenient,
    )
    .unwrap_err();
    assert!(
        matches!(&err, RenderError::Unrepresentable { feature, .. } if feature == "cache.routes[0].match"),
        "{err}"
    );
}

#[test]
fn a_pattern_vcl_cannot_hold_is_an_error_not_a_dropped_route() {
    let mut c = seed();
    c.routes[0].pattern = "^/a\"}b".into();
    let err = render_fastly(&site(), &c, RenderMode::Lenient).unwrap_err();
    assert!(err.to_string().contains("cache.routes[0].match"), "{err}");
}

#[test]
fn empty_allowlists_leave_queries_and_cookies_alone() {
    let mut c = seed();
    c.cache_key.query_allowlist.clear();
    c.cache_key.cookie_allowlist.clear();
    let f = fastly(&c);
    let recv = &f.snippet("multicdn-recv-cache-key").unwrap().content;
    assert!(
        !recv.contains("querystring") && !recv.contains("Cookie"),
        "{recv}"
    );
    assert!(f.snippet("multicdn-hash-cache-key").is_none());
    let cf = cloudflare(&c);
    let d = cf.cache_rules.rule("multicdn-cache-defaults").unwrap();
    assert!(d.action_parameters.get("cache_key").is_none());
}

#[test]
fn an_explicit_route_cache_control_replaces_the_derived_one() {
    let mut c = seed();
    c.routes[2]
        .headers
        .insert("Cache-Control".into(), "public, max-age=5".into());
    let f = fastly(&c);
    let fetch = &f.snippet("multicdn-fetch-ttl").unwrap().content;
    assert_eq!(fetch.matches("set beresp.http.Cache-Control").count(), 2);
    let cf = cloudflare(&c);
    assert!(
        cf.header_rules
            .rule("multicdn-cache-control-route-2")
            .is_none()
    );
    assert_eq!(
        cf.header_rules
            .rule("multicdn-headers-route-2")
            .unwrap()
            .action_parameters["headers"]["Cache-Control"]["value"],
        "public, max-age=5"
    );
}

#[test]
fn an_edge_ttl_under_the_plans_minimum_is_rendered_as_written_and_reported() {
    let mut c = seed();
    c.routes[2].ttl_edge = Some(Dur::secs(600));
    let pro = cloudflare(&c);
    assert_eq!(
        pro.cache_rules
            .rule("multicdn-cache-route-2")
            .unwrap()
            .action_parameters["edge_ttl"]["default"],
        600
    );
    let w = pro
        .warnings
        .iter()
        .find(|w| w.feature == "cache.routes[2].ttl_edge")
        .unwrap();
    assert!(w.why.contains("3600s"), "{}", w.why);
    let business = render_cloudflare(
        &site(),
        &c,
        CloudflareTarget::new(CloudflarePlan::Business),
        RenderMode::Lenient,
    )
    .unwrap();
    assert!(
        business
            .warnings
            .iter()
            .all(|w| w.feature != "cache.routes[2].ttl_edge")
    );
}

#[test]
fn on_enterprise_the_allowlists_become_the_custom_cache_key() {
    let mut c = seed();
    c.cache_key.query_allowlist.push("q".into());
    c.cache_key.cookie_allowlist.push("lang".into());
    let ent = render_cloudflare(
        &site(),
        &c,
        CloudflareTarget::new(CloudflarePlan::Enterprise),
        RenderMode::Lenient,
    )
    .unwrap();
    let key = &ent
        .cache_rules
        .rule("multicdn-cache-defaults")
        .unwrap()
        .action_parameters["cache_key"]["custom_key"];
    assert_eq!(
        key["query_string"]["include"]["list"],
        json!(["page", "sort", "colour", "size", "q"])
    );
    assert_eq!(
        key["cookie"]["include"],
        json!(["currency", "trade", "lang"])
    );
    assert!(
        ent.cache_rules
            .rule("multicdn-cache-cookie-bypass")
            .is_none()
    );
}

#[test]
fn below_enterprise_allowlisted_cookies_bypass_the_cache_as_the_last_rule() {
    let pro = cloudflare(&seed());
    let last = pro.cache_rules.rules.last().unwrap();
    assert_eq!(last.reference, "multicdn-cache-cookie-bypass");
    assert_eq!(last.action_parameters, json!({"cache": false}));
    assert_eq!(
        last.expression,
        "(http.cookie contains \"currency=\" or http.cookie contains \"trade=\")"
    );
    let defaults = pro.cache_rules.rule("multicdn-cache-defaults").unwrap();
    assert!(defaults.action_parameters.get("cache_key").is_none());
}

#[test]
fn more_cache_rules_than_the_plan_allows_is_reported() {
    let mut c = seed();
    for i in 0..10 {
        let mut r = c.routes[2].clone();
        r.pattern = format!("^/extra{i}/");
        r.surrogate_keys_from_origin = false;
        c.routes.push(r);
    }
    let free = render_cloudflare(
        &site(),
        &c,
        CloudflareTarget::new(CloudflarePlan::Free),
        RenderMode::Lenient,
    )
    .unwrap();
    let w = free
        .warnings
        .iter()
        .find(|w| w.feature == "cache.routes")
        .unwrap();
    assert!(w.why.contains("allows 10"), "{}", w.why);
    assert!(
        cloudflare(&c)
            .warnings
            .iter()
            .all(|w| w.feature != "cache.routes")
    );
}

#[test]
fn a_browser_ttl_under_the_plans_minimum_is_left_to_the_cache_control_rule_and_reported() {
    // The example policy's 60 s browser TTL on Pro (minimum 1 h): a cache rule overriding the
    // browser TTL with 60 s would be refused or clamped.
    let c = seed();
    let pro = cloudflare(&c);
    let defaults = pro.cache_rules.rule("multicdn-cache-defaults").unwrap();
    assert_eq!(
        defaults.action_parameters["browser_ttl"],
        json!({"mode": "respect_origin"})
    );
    let w = pro
        .warnings
        .iter()
        .find(|w| w.feature == "cache.defaults.ttl_browser")
        .unwrap();
    assert!(w.why.contains("3600s"), "{}", w.why);
    // The browser still gets the policy's 60 s through the response-header rule.
    let cc = pro
        .header_rules
        .rule("multicdn-cache-control-defaults")
        .unwrap();
    assert!(
        cc.action_parameters.to_string().contains("max-age=60"),
        "{}",
        cc.action_parameters
    );
    // A year-long browser TTL (routes[3]) is above the minimum and stays an override.
    assert_eq!(
        pro.cache_rules
            .rule("multicdn-cache-route-3")
            .unwrap()
            .action_parameters["browser_ttl"]["mode"],
        "override_origin"
    );
    // Business allows 1 s: the override is written as the policy says.
    let business = render_cloudflare(
        &site(),
        &c,
        CloudflareTarget::new(CloudflarePlan::Business),
        RenderMode::Lenient,
    )
    .unwrap();
    assert_eq!(
        business
            .cache_rules
            .rule("multicdn-cache-defaults")
            .unwrap()
            .action_parameters["browser_ttl"],
        json!({"mode": "override_origin", "default": 60})
    );
    assert!(
        business
            .warnings
            .iter()
            .all(|w| !w.feature.ends_with("ttl_browser"))
    );
}
