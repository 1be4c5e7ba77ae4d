//! Renderers on arbitrary cache policies: they never panic, they are deterministic, every route
//! is rendered or reported, and every cacheable branch carries stale-if-error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use multicdn_core::policy::{CachePolicy, CloudflarePlan, Site};
use multicdn_providers::render::cloudflare_rules::{CloudflareTarget, render_cloudflare};
use multicdn_providers::render::fastly_vcl::render_fastly;
use multicdn_providers::render::{RenderError, RenderMode};
use proptest::prelude::*;
use serde_json::json;

fn pattern() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\^/[a-z]{1,6}/?".prop_map(|s| s),
        "\\\\\\.(js|css|png)\\$".prop_map(|s| s),
        "\\^/[a-z]{1,4}\\|\\^/[a-z]{1,4}".prop_map(|s| s),
        "\\^/[a-z]{1,4}/\\[0-9\\]\\+\\$".prop_map(|s| s),
        "/[a-z]{1,5}".prop_map(|s| s),
    ]
}

fn route() -> impl Strategy<Value = serde_json::Value> {
    (
        pattern(),
        any::<bool>(),
        proptest::option::of(0u64..100_000_000),
        proptest::option::of(0u64..100_000_000),
        proptest::collection::btree_map("[A-Z][a-z]{0,5}(-[A-Z][a-z]{0,5})?", "[ -~]{0,20}", 0..3),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(m, never, edge, browser, headers, keys, immutable)| {
            if never {
                json!({"match": m, "cache": "never", "headers": headers})
            } else {
                json!({
                    "match": m, "ttl_edge": edge, "ttl_browser": browser, "headers": headers,
                    "surrogate_keys_from_origin": keys, "immutable": immutable
                })
            }
        })
}

fn site() -> Site {
    serde_json::from_value(json!({"host": "www.example.com"})).unwrap()
}

fn policy() -> impl Strategy<Value = CachePolicy> {
    (
        (0u64..10_000_000, 0u64..10_000_000, 0u64..10_000_000, 0u64..10_000_000),
        proptest::collection::vec("[a-z_]{1,8}", 0..4),
        proptest::collection::vec("[a-z_-]{1,8}", 0..3),
        any::<bool>(),
        proptest::collection::vec(route(), 0..6),
    )
        .prop_map(|((edge, browser, swr, sie), q, c, ae, routes)| {
            serde_json::from_value(json!({
                "defaults": {"ttl_edge": edge, "ttl_browser": browser, "stale_while_revalidate": swr, "stale_if_error": sie},
                "cache_key": {"query_allowlist": q, "cookie_allowlist": c, "normalise_accept_encoding": ae},
                "routes": routes,
            }))
            .unwrap()
        })
}

fn plan() -> impl Strategy<Value = CloudflarePlan> {
    prop_oneof![
        Just(CloudflarePlan::Free),
        Just(CloudflarePlan::Pro),
        Just(CloudflarePlan::Business),
        Just(CloudflarePlan::Enterprise),
    ]
}

proptest! {
    #[test]
    fn fastly_renders_every_route_deterministically_with_stale_if_error(cache in policy()) {
        let a = render_fastly(&site(), &cache, RenderMode::Lenient);
        let b = render_fastly(&site(), &cache, RenderMode::Lenient);
        prop_assert_eq!(&a, &b);
        let r = a.unwrap();
        let fetch = &r.snippet("multicdn-fetch-ttl").unwrap().content;
        for route in &cache.routes {
            let needle = format!("req.url.path ~ \"{}\"", route.pattern);
            prop_assert!(fetch.contains(&needle), "{}", needle);
        }
        let sie = format!("set beresp.stale_if_error = {}s;", cache.defaults.stale_if_error.get().as_secs());
        let cacheable = cache.routes.iter().filter(|r| r.cache != multicdn_core::policy::CacheMode::Never).count();
        prop_assert_eq!(fetch.matches(&sie).count(), cacheable + 1);
        // Strict mode fails exactly when lenient mode reports something unsupported.
        let unsupported = r.warnings.iter().any(|w| w.kind == multicdn_providers::render::WarningKind::Unsupported);
        prop_assert_eq!(render_fastly(&site(), &cache, RenderMode::Strict).is_err(), unsupported);
    }

    #[test]
    fn cloudflare_renders_or_reports_every_route(cache in policy(), plan in plan()) {
        let target = CloudflareTarget::new(plan);
        let a = render_cloudflare(&site(), &cache, target, RenderMode::Lenient);
        prop_assert_eq!(&a, &render_cloudflare(&site(), &cache, target, RenderMode::Lenient));
        match a {
            Ok(r) => {
                prop_assert_eq!(r.to_json_file(), render_cloudflare(&site(), &cache, target, RenderMode::Lenient).unwrap().to_json_file());
                for (i, route) in cache.routes.iter().enumerate() {
                    let rendered = r.cache_rules.rule(&format!("multicdn-cache-route-{i}")).is_some();
                    let reported = r.warnings.iter().any(|w| w.feature == format!("cache.routes[{i}].match"));
                    prop_assert!(rendered != reported, "route {} {:?}", i, route.pattern);
                }
                for rule in r.header_rules.rules.iter().filter(|x| x.reference.starts_with("multicdn-cache-control-")) {
                    let v = rule.action_parameters["headers"]["Cache-Control"]["value"].as_str().unwrap();
                    if cache.defaults.stale_if_error.get().as_secs() > 0 {
                        prop_assert!(v.contains("stale-if-error="), "{}", v);
                    }
                }
            }
            Err(RenderError::Unrepresentable { feature, .. }) => {
                // Only a never-cached route the plan cannot match.
                let i: usize = feature.trim_start_matches("cache.routes[").split(']').next().unwrap().parse().unwrap();
                prop_assert_eq!(cache.routes[i].cache, multicdn_core::policy::CacheMode::Never);
                prop_assert!(!matches!(plan, CloudflarePlan::Business | CloudflarePlan::Enterprise));
            }
            Err(other) => prop_assert!(false, "{}", other),
        }
    }
}
