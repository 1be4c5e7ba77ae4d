//! `steer apply --vendor route53` against the moto emulator, read back independently with
//! boto3 (`route53_readback.py`): the records at the name are geolocation aliases evaluating
//! their pool's health, the pools are weighted, and every weighted set carries a health check
//! that exists and is configured as the policy's health section says.
//!
//! Needs `MULTICDN_MOTO_ENDPOINT` (moto on loopback) and a Python with boto3
//! (`MULTICDN_PYTHON`, default `python3`); `.ci/run` provides both. Without them the test says
//! so and skips; in CI (`CI` set) their absence is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// Panics in CI, otherwise says why the test skips.
fn missing(what: &str) {
    if in_ci() {
        panic!("{what} in CI: .ci/run must provide it");
    }
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(format!("skipped: {what}\n").as_bytes());
}

fn endpoint() -> Option<String> {
    match std::env::var("MULTICDN_MOTO_ENDPOINT") {
        Ok(e) if !e.is_empty() => Some(e),
        _ => {
            missing("MULTICDN_MOTO_ENDPOINT is not set (start moto, see .ci/run)");
            None
        }
    }
}

fn python() -> Option<String> {
    let python = std::env::var("MULTICDN_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_owned());
    let ok = Command::new(&python)
        .args(["-c", "import boto3"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(python)
    } else {
        missing(&format!(
            "{python} cannot import boto3 (set MULTICDN_PYTHON to a Python with boto3)"
        ));
        None
    }
}

/// `target/<profile>/examples/steer`, from this test's own path.
fn steer_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    profile_dir
        .join("examples")
        .join(format!("steer{}", std::env::consts::EXE_SUFFIX))
}

fn steer(args: &[&str]) -> Output {
    Command::new(steer_binary())
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env_remove("AWS_SESSION_TOKEN")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The example policy on a zone and edge hosts no other run uses.
fn policy_file(tag: &str) -> (PathBuf, String, [(String, String); 2]) {
    let zone = format!("{tag}.example.com");
    let fastly = format!("fastly-{tag}.edge.example.net");
    let cloudflare = format!("cloudflare-{tag}.edge.example.net");
    let original =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/policy.yaml")).unwrap();
    let text = original
        .replace("record: www.example.com", &format!("record: www.{zone}"))
        .replace("zone: example.com", &format!("zone: {zone}"))
        .replace("example.map.fastly.net", &fastly)
        .replace("example.cdn.cloudflare.net", &cloudflare);
    assert_ne!(text, original);
    let path = std::env::temp_dir().join(format!("multicdn-{tag}-policy.yaml"));
    std::fs::write(&path, text).unwrap();
    (
        path,
        format!("www.{zone}"),
        [("fastly".into(), fastly), ("cloudflare".into(), cloudflare)],
    )
}

#[test]
fn steer_apply_leaves_alias_weighted_health_checked_records_that_boto3_reads_back() {
    let (Some(endpoint), Some(python)) = (endpoint(), python()) else {
        return;
    };
    let tag = format!("steer-readback-{}", std::process::id());
    let (policy, record, edges) = policy_file(&tag);
    let policy = policy.to_str().unwrap();

    let apply = steer(&[
        "apply",
        "--policy",
        policy,
        "--vendor",
        "route53",
        "--endpoint",
        &endpoint,
        "--create-zone",
    ]);
    assert!(apply.status.success(), "{}", text(&apply));
    let out = String::from_utf8_lossy(&apply.stdout).into_owned();
    let zone_id = out
        .lines()
        .find_map(|l| l.strip_prefix("created hosted zone "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no zone id in {out}"))
        .to_owned();
    let check_lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("health check for "))
        .collect();
    assert_eq!(check_lines.len(), 2, "{out}");

    // The independent read-back, with what the policy file says (examples/policy.yaml:
    // health.path, health.expect, interval 30s, down_after 2, and its five probe regions as
    // Route 53 checker regions).
    let mut cmd = Command::new(&python);
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/route53_readback.py"
    ))
    .args(["--endpoint", &endpoint, "--zone-id", &zone_id])
    .args(["--record", &record])
    .args(["--path", "/_health/v3.txt", "--search", "healthy-v3"])
    .args([
        "--regions",
        "eu-west-1,us-east-1,us-west-2,ap-southeast-1,sa-east-1",
    ])
    .args(["--interval", "30", "--threshold", "2"]);
    for (provider, host) in &edges {
        cmd.args(["--edge", &format!("{provider}={host}")]);
    }
    let readback = cmd.output().unwrap();
    assert!(readback.status.success(), "{}", text(&readback));
    let summary: serde_json::Value = serde_json::from_slice(&readback.stdout).unwrap();
    assert_eq!(summary["geolocation_aliases"], 15, "{summary}");
    assert_eq!(summary["pools"], 4, "{summary}");
    assert_eq!(summary["weighted"], 8, "{summary}");
    assert_eq!(summary["health_checks"].as_array().unwrap().len(), 2);

    // Idempotent: the checks are found, not made again, and nothing is left to write.
    let zone_args = [
        "--policy",
        policy,
        "--vendor",
        "route53",
        "--endpoint",
        &endpoint,
        "--zone-id",
        &zone_id,
    ];
    let diff = steer(&[&["diff"][..], &zone_args[..]].concat());
    assert_eq!(diff.status.code(), Some(0), "{}", text(&diff));
    assert!(
        String::from_utf8_lossy(&diff.stdout).contains("no changes"),
        "{}",
        text(&diff)
    );
    let again = steer(&[&["apply"][..], &zone_args[..]].concat());
    assert!(again.status.success(), "{}", text(&again));
    let again_out = String::from_utf8_lossy(&again.stdout).into_owned();
    assert!(again_out.contains("nothing to change"), "{again_out}");
    for line in check_lines {
        assert!(
            again_out.contains(line),
            "{line} changed on the second apply:\n{again_out}"
        );
    }
    let ids: Vec<String> = summary["health_checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    for id in ids {
        assert!(again_out.contains(&id), "{id} missing from {again_out}");
    }
}

#[test]
fn steer_plan_lists_the_health_checks_and_the_aliases_without_asking_route53() {
    let out = steer(&[
        "plan",
        "--policy",
        concat!(env!("CARGO_MANIFEST_DIR"), "/policy.yaml"),
        "--vendor",
        "route53",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        stdout.contains("2 health checks (made on apply unless they exist):"),
        "{stdout}"
    );
    assert!(
        stdout.contains("fastly: HTTPS_STR_MATCH example.map.fastly.net:443/_health/v3.txt contains \"healthy-v3\", every 30s, down after 2, from eu-west-1, us-east-1, us-west-2, ap-southeast-1, sa-east-1 [multicdn-"),
        "{stdout}"
    );
    assert!(
        stdout.contains("www.example.com CNAME [geo-DE] geo country DE alias -> europe._steer.www.example.com (evaluate target health)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("europe._steer.www.example.com CNAME [europe-fastly] weight 229 ttl 30 -> example.map.fastly.net (health check: fastly's)"),
        "{stdout}"
    );
}
