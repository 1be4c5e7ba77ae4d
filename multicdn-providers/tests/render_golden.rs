//! The seed's policy (`examples/policy.yaml`) rendered for both CDNs, compared byte for byte
//! with the reviewed golden files. `UPDATE_GOLDEN=1 cargo test -p multicdn-providers --test
//! render_golden` rewrites them; review the diff before committing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use multicdn_core::Policy;
use multicdn_core::policy::CloudflarePlan;
use multicdn_providers::render::cloudflare_rules::{CloudflareTarget, render_cloudflare};
use multicdn_providers::render::fastly_vcl::render_fastly;
use multicdn_providers::render::{RenderError, RenderMode, WarningKind};

fn policy() -> Policy {
    Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap()
}

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

fn compare(name: &str, rendered: &str) {
    let path = golden(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, rendered).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    if expected != rendered {
        let line = expected
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .map_or("the end".to_owned(), |i| format!("line {}", i + 1));
        panic!(
            "{name} differs from the rendering at {line}; if the change is intended, rerun with UPDATE_GOLDEN=1 and review the diff\n--- rendered ---\n{rendered}"
        );
    }
}

#[test]
fn fastly_rendering_of_the_seed_policy_matches_its_golden_file() {
    let p = policy();
    let r = render_fastly(&p.site, &p.cache, RenderMode::Lenient).unwrap();
    compare("policy.fastly.vcl", &r.to_vcl_file());
}

#[test]
fn cloudflare_rendering_of_the_seed_policy_matches_its_golden_file() {
    let p = policy();
    let spec = &p.providers[&multicdn_core::ProviderId::new("cloudflare").unwrap()];
    let r = render_cloudflare(
        &p.site,
        &p.cache,
        CloudflareTarget::from_spec(spec),
        RenderMode::Lenient,
    )
    .unwrap();
    compare("policy.cloudflare.json", &r.to_json_file());
}

#[test]
fn cloudflare_enterprise_rendering_of_the_seed_policy_matches_its_golden_file() {
    let r = render_cloudflare(
        &policy().site,
        &policy().cache,
        CloudflareTarget::new(CloudflarePlan::Enterprise),
        RenderMode::Lenient,
    )
    .unwrap();
    compare("policy.cloudflare-enterprise.json", &r.to_json_file());
}

#[test]
fn rendering_is_deterministic() {
    let p = policy();
    let target = CloudflareTarget::new(CloudflarePlan::Pro);
    for _ in 0..3 {
        assert_eq!(
            render_fastly(&p.site, &p.cache, RenderMode::Strict)
                .unwrap()
                .to_vcl_file(),
            render_fastly(&p.site, &p.cache, RenderMode::Strict)
                .unwrap()
                .to_vcl_file()
        );
        assert_eq!(
            render_cloudflare(&p.site, &p.cache, target, RenderMode::Lenient)
                .unwrap()
                .to_json_file(),
            render_cloudflare(&p.site, &p.cache, target, RenderMode::Lenient)
                .unwrap()
                .to_json_file()
        );
    }
}

#[test]
fn the_seed_policy_renders_strictly_on_fastly_with_no_warnings() {
    let r = render_fastly(&policy().site, &policy().cache, RenderMode::Strict).unwrap();
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn strict_cloudflare_rendering_refuses_surrogate_keys_and_names_the_route() {
    let err = render_cloudflare(
        &policy().site,
        &policy().cache,
        CloudflareTarget::new(CloudflarePlan::Pro),
        RenderMode::Strict,
    )
    .unwrap_err();
    let RenderError::Strict {
        provider,
        unsupported,
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!(*provider, "cloudflare");
    let features: Vec<_> = unsupported.iter().map(|w| w.feature.as_str()).collect();
    assert_eq!(
        features,
        [
            "cache.cache_key.query_allowlist",
            "cache.routes[2].surrogate_keys_from_origin"
        ]
    );
    assert!(err.to_string().contains("Cache-Tag"), "{err}");
}

#[test]
fn lenient_cloudflare_rendering_names_every_approximation() {
    let r = render_cloudflare(
        &policy().site,
        &policy().cache,
        CloudflareTarget::new(CloudflarePlan::Pro),
        RenderMode::Lenient,
    )
    .unwrap();
    let mut features: Vec<_> = r
        .warnings
        .iter()
        .map(|w| (w.feature.as_str(), w.kind))
        .collect();
    features.sort();
    assert_eq!(
        features,
        [
            (
                "cache.cache_key.cookie_allowlist",
                WarningKind::Approximated
            ),
            ("cache.cache_key.query_allowlist", WarningKind::Unsupported),
            ("cache.defaults.stale_if_error", WarningKind::Approximated),
            (
                "cache.defaults.stale_while_revalidate",
                WarningKind::Approximated
            ),
            ("cache.defaults.ttl_browser", WarningKind::Approximated),
            (
                "cache.routes[2].surrogate_keys_from_origin",
                WarningKind::Unsupported
            ),
            ("identity.pop", WarningKind::Approximated),
        ]
    );
}
