//! The example programs as a team runs them: every one answers `--help`, the quickstart plays
//! its whole story, and the tools do their job against emulated edges and purge APIs on
//! loopback (never the internet).
//!
//! The binaries are the ones cargo builds before running this package's tests:
//! `target/<profile>/examples/<name>`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Output};

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, Uri};
use axum::routing::any;
use multicdn_test_support::{EdgeMode, EdgeServer, Ns1Api, PurgeApi};
use tokio::runtime::Runtime;

const ALL_EXAMPLES: [&str; 14] = [
    "serve",
    "policy",
    "quickstart",
    "probe",
    "drift",
    "purge",
    "warm",
    "steer",
    "deploy",
    "scoreboard",
    "beacongen",
    "cascade",
    "content-steering",
    "case",
];

/// `target/<profile>/examples/<name>`, from this test's own path
/// (`target/<profile>/deps/tools-<hash>`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: cargo builds examples before the tests",
        path.display()
    );
    path
}

fn policy() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/policy.yaml").to_owned()
}

/// A unique scratch path for this test.
fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("multicdn-tools-{}-{name}", std::process::id()))
}

/// Runs an example with `args`, with no vendor credentials in its environment unless `env`
/// gives them.
fn run(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(example(name));
    cmd.args(args);
    for var in [
        "FASTLY_API_TOKEN",
        "CLOUDFLARE_API_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "NS1_API_KEY",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Both emulated edges, healthy, serving the policy's health object.
fn edges(rt: &Runtime) -> (EdgeServer, EdgeServer) {
    rt.block_on(async {
        (
            EdgeServer::start("fastly", "LHR", "healthy-v3")
                .await
                .unwrap(),
            EdgeServer::start("cloudflare", "SYD", "healthy-v3")
                .await
                .unwrap(),
        )
    })
}

fn edge_args(fastly: &str, cloudflare: &str) -> [String; 4] {
    [
        "--edge".into(),
        format!("fastly={fastly}"),
        "--edge".into(),
        format!("cloudflare={cloudflare}"),
    ]
}

#[test]
fn every_example_answers_help() {
    for name in ALL_EXAMPLES {
        let out = run(name, &["--help"], &[]);
        assert_eq!(code(&out), 0, "{name} --help: {}", stderr(&out));
        assert!(
            stdout(&out).lines().any(|l| l.starts_with("Usage:")),
            "{name} --help has no Usage line:\n{}",
            stdout(&out)
        );
    }
}

#[test]
fn a_reader_that_stops_early_ends_a_tool_quietly() {
    // `policy render ... | head -0`: the reader is gone before the tool writes.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(example("policy"))
        .args(["render", &policy()])
        .stdout(writer)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code(&out), 141, "{err}");
}

#[test]
fn quickstart_plays_the_whole_story() {
    let out = run("quickstart", &[], &[]);
    let text = stdout(&out);
    assert_eq!(code(&out), 0, "{text}\n{}", stderr(&out));
    for check in [
        "AS1221 moved to fastly in damped steps",
        "fastly was demoted in steps",
        "the missed purge demoted cloudflare",
        "fastly recovered after the hysteresis rounds",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("ok   ") && l.contains(check)),
            "no `ok` line for {check:?}:\n{text}"
        );
    }
    let failover = |at: &str, what: &str| {
        text.lines()
            .any(|l| l.starts_with(at) && l.contains(" failover ") && l.contains(what))
    };
    assert!(
        failover("03:00:30", "50% of its share moved"),
        "no first failover step at 03:00:30:\n{text}"
    );
    assert!(
        failover("03:02:00", "fastly 0%"),
        "no second failover step reaching fastly 0% at 03:02:00:\n{text}"
    );
}

#[test]
fn policy_render_prints_both_renderings_and_strict_refuses_what_cloudflare_cannot_express() {
    let out = run("policy", &["render", &policy()], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("==> fastly.vcl <=="), "{text}");
    assert!(text.contains("==> cloudflare.json <=="), "{text}");
    assert!(text.contains("multicdn-deliver-headers"), "{text}");
    assert!(
        stderr(&out).contains("warning: cloudflare: cache.routes[2].surrogate_keys_from_origin"),
        "{}",
        stderr(&out)
    );
    // Deterministic: the same policy gives the same bytes.
    assert_eq!(stdout(&run("policy", &["render", &policy()], &[])), text);

    let dir = scratch("rendered");
    let written = run(
        "policy",
        &["render", &policy(), "--out", dir.to_str().unwrap()],
        &[],
    );
    assert_eq!(code(&written), 0, "{}", stderr(&written));
    let vcl = std::fs::read_to_string(dir.join("fastly.vcl")).unwrap();
    let json = std::fs::read_to_string(dir.join("cloudflare.json")).unwrap();
    assert!(text.contains(&vcl) && text.contains(&json));
    serde_json::from_str::<serde_json::Value>(&json).unwrap();
    let _ = std::fs::remove_dir_all(dir);

    let strict = run("policy", &["render", &policy(), "--strict"], &[]);
    assert_eq!(code(&strict), 2);
    assert!(stderr(&strict).contains("surrogate_keys_from_origin"));
    let fastly_only = run(
        "policy",
        &["render", &policy(), "--provider", "fastly", "--strict"],
        &[],
    );
    assert_eq!(code(&fastly_only), 0, "{}", stderr(&fastly_only));
}

#[test]
fn probe_exits_0_on_healthy_edges_and_1_when_one_serves_an_error_page() {
    let rt = Runtime::new().unwrap();
    let (fastly, cloudflare) = edges(&rt);
    let edges = edge_args(&fastly.base_url(), &cloudflare.base_url());
    let mut args = vec!["--policy".to_owned(), policy()];
    args.extend(edges);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let healthy = run("probe", &args, &[]);
    let text = stdout(&healthy);
    assert_eq!(code(&healthy), 0, "{text}{}", stderr(&healthy));
    assert!(
        text.contains("verdict: fastly up: 5 of 5 runners pass"),
        "{text}"
    );
    assert!(text.contains("verdict: cloudflare up"), "{text}");
    assert!(text.contains("fastly LHR"), "served-by is shown:\n{text}");

    cloudflare.set_mode(EdgeMode::ErrorPage);
    let down = run("probe", &args, &[]);
    let text = stdout(&down);
    assert_eq!(code(&down), 1, "{text}{}", stderr(&down));
    assert!(
        text.contains("verdict: cloudflare DOWN: 5 of 5 runners"),
        "{text}"
    );
    assert!(text.contains("content mismatch"), "{text}");
    assert!(text.contains("verdict: fastly up"), "{text}");

    let mut json_args = args.clone();
    json_args.push("--json");
    let json = run("probe", &json_args, &[]);
    assert_eq!(code(&json), 1);
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["down"], serde_json::json!(["cloudflare"]));
}

#[test]
fn probe_refuses_an_edge_override_for_a_provider_the_policy_does_not_name() {
    let out = run(
        "probe",
        &[
            "--policy",
            &policy(),
            "--edge",
            "fastlly=http://127.0.0.1:1",
        ],
        &[],
    );
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("fastlly"), "{}", stderr(&out));
}

#[test]
fn drift_flags_the_tag_headers_and_passes_once_they_are_allowed() {
    let rt = Runtime::new().unwrap();
    let (fastly, cloudflare) = edges(&rt);
    let mut args = vec![
        "--policy".to_owned(),
        policy(),
        "--path".into(),
        "/products/1".into(),
        "--path".into(),
        "/".into(),
    ];
    args.extend(edge_args(&fastly.base_url(), &cloudflare.base_url()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let out = run("drift", &args, &[]);
    let text = stdout(&out);
    assert_eq!(code(&out), 1, "{text}{}", stderr(&out));
    assert!(
        text.contains(
            "DRIFT /products/1 [surrogate-key]: cloudflare=(absent) fastly=\"products-1\""
        ),
        "{text}"
    );

    let mut allowed = args.clone();
    allowed.extend(["--allow", "surrogate-key", "--allow", "cache-tag"]);
    let out = run("drift", &allowed, &[]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("no drift"));
}

/// An edge that serves what the emulated Cloudflare edge serves, except a different
/// `Cache-Control`: the kind of drift a console edit makes.
async fn drifted_edge() -> (String, tokio::sync::oneshot::Sender<()>) {
    async fn page(uri: Uri) -> (HeaderMap, String) {
        let path = uri.path().to_owned();
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("text/html"));
        h.insert(
            "cache-control",
            HeaderValue::from_static("public, max-age=300"),
        );
        let tag = path.trim_start_matches('/').replace('/', "-");
        h.insert("cache-tag", HeaderValue::from_str(&tag).unwrap());
        (h, multicdn_test_support::page(&path, None))
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let app = Router::new().fallback(any(page));
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    });
    (format!("http://{addr}"), stop)
}

#[test]
fn drift_names_the_differing_header_with_both_values() {
    let rt = Runtime::new().unwrap();
    let (fastly, _cloudflare) = edges(&rt);
    let (drifted, _stop) = rt.block_on(drifted_edge());
    let mut args = vec![
        "--policy".to_owned(),
        policy(),
        "--path".into(),
        "/products/7".into(),
        "--allow".into(),
        "surrogate-key".into(),
        "--allow".into(),
        "cache-tag".into(),
    ];
    args.extend(edge_args(&fastly.base_url(), &drifted));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("drift", &args, &[]);
    let text = stdout(&out);
    assert_eq!(code(&out), 1, "{text}{}", stderr(&out));
    assert!(
        text.contains(
            "DRIFT /products/7 [cache-control]: cloudflare=\"public, max-age=300\" fastly=\"public, max-age=60, stale-if-error=604800\""
        ),
        "{text}"
    );
    assert!(text.contains("1 difference(s)"), "{text}");
}

/// `--policy P --fastly-api A --cloudflare-api B` for the emulated purge APIs.
fn purge_args(api: &PurgeApi, rest: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--policy".to_owned(),
        policy(),
        "--fastly-api".into(),
        api.fastly_base(),
        "--cloudflare-api".into(),
        api.cloudflare_base(),
        "--timeout".into(),
        "5s".into(),
    ];
    args.extend(rest.iter().map(|s| (*s).to_owned()));
    args
}

const TOKENS: [(&str, &str); 2] = [
    ("FASTLY_API_TOKEN", "test-fastly-token"),
    ("CLOUDFLARE_API_TOKEN", "test-cloudflare-token"),
];

#[test]
fn purge_dry_run_sends_nothing_and_prints_each_providers_batches() {
    let rt = Runtime::new().unwrap();
    let api = rt.block_on(PurgeApi::start()).unwrap();
    let tags: Vec<String> = (0..300).map(|i| format!("product-{i}")).collect();
    let mut rest = vec!["--dry-run"];
    for t in &tags {
        rest.extend(["--tag", t.as_str()]);
    }
    let args = purge_args(&api, &rest);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("purge", &args, &TOKENS);
    let text = stdout(&out);
    assert_eq!(code(&out), 0, "{text}{}", stderr(&out));
    assert!(
        text.contains("fastly       2 batch(es) of up to 256 item(s)"),
        "{text}"
    );
    assert!(
        text.contains("cloudflare   3 batch(es) of up to 100 item(s)"),
        "{text}"
    );
    assert!(text.contains("nothing was sent"), "{text}");
    assert!(api.purged().is_empty(), "a dry run sent {:?}", api.purged());
    assert!(!text.contains("test-fastly-token") && !stderr(&out).contains("test-"));
}

#[test]
fn purge_of_4000_tags_prints_the_count_and_the_first_few_unless_verbose() {
    let rt = Runtime::new().unwrap();
    let api = rt.block_on(PurgeApi::start()).unwrap();
    let tags: Vec<String> = (0..4000).map(|i| format!("tag-{i:04}")).collect();
    let mut rest = vec!["--dry-run"];
    for t in &tags {
        rest.extend(["--tag", t.as_str()]);
    }
    let args = purge_args(&api, &rest);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("purge", &args, &TOKENS);
    let text = stdout(&out);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        "purge tags, dry run: 4000 item(s): tag-0000, tag-0001, tag-0002, tag-0003, tag-0004, ... and 3995 more (--verbose lists them all)"
    );
    assert!(
        !text.contains("tag-3999"),
        "{}",
        &text[..300.min(text.len())]
    );

    let mut verbose = args.clone();
    verbose.push("--verbose");
    let out = run("purge", &verbose, &TOKENS);
    let first = stdout(&out).lines().next().unwrap().to_owned();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        first.ends_with("tag-3998, tag-3999"),
        "{}",
        &first[first.len() - 80..]
    );
    assert!(!first.contains("more (--verbose"));
}

#[test]
fn purge_acknowledged_everywhere_exits_0_with_ids_and_the_worst_case() {
    let rt = Runtime::new().unwrap();
    let api = rt.block_on(PurgeApi::start()).unwrap();
    let args = purge_args(&api, &["--tag", "product-123", "--tag", "price-list"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("purge", &args, &TOKENS);
    let text = stdout(&out);
    assert_eq!(code(&out), 0, "{text}{}", stderr(&out));
    assert!(text.contains("fastly       ok: 2 item(s)"), "{text}");
    assert!(text.contains("cloudflare   ok: 2 item(s)"), "{text}");
    assert!(text.contains("worst case:"), "{text}");
    let purged = api.purged();
    assert!(purged.iter().any(|(v, _)| v == "fastly"), "{purged:?}");
    assert!(purged.iter().any(|(v, _)| v == "cloudflare"), "{purged:?}");
    assert!(!text.contains("test-fastly-token") && !text.contains("test-cloudflare-token"));
}

#[test]
fn purge_exits_1_naming_cloudflare_and_its_items_when_its_token_is_refused() {
    let rt = Runtime::new().unwrap();
    let api = rt.block_on(PurgeApi::start()).unwrap();
    api.refuse_tokens("cloudflare", true);
    let args = purge_args(&api, &["--tag", "product-123", "--tag", "price-list"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("purge", &args, &TOKENS);
    let text = stdout(&out);
    assert_eq!(code(&out), 1, "{text}{}", stderr(&out));
    assert!(text.contains("cloudflare   MISSED 2 tags"), "{text}");
    assert!(
        text.contains("not purged: product-123, price-list"),
        "{text}"
    );
    assert!(text.contains("fastly       ok: 2 item(s)"), "{text}");
    assert!(stderr(&out).contains("purge missed on cloudflare"));
    assert!(
        !text.contains("test-cloudflare-token") && !stderr(&out).contains("test-cloudflare-token")
    );
}

#[test]
fn purge_without_a_token_names_the_variable_and_exits_2() {
    let rt = Runtime::new().unwrap();
    let api = rt.block_on(PurgeApi::start()).unwrap();
    let args = purge_args(&api, &["--tag", "product-123"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("purge", &args, &[("FASTLY_API_TOKEN", "t")]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("CLOUDFLARE_API_TOKEN (providers.cloudflare.token_env)"),
        "{}",
        stderr(&out)
    );
    assert!(api.purged().is_empty());
}

#[test]
fn purge_by_host_is_refused_before_anything_is_sent() {
    let rt = Runtime::new().unwrap();
    let api = rt.block_on(PurgeApi::start()).unwrap();
    let args = purge_args(&api, &["--host", "www.example.com"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("purge", &args, &TOKENS);
    assert_eq!(code(&out), 2, "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("fastly"), "{}", stderr(&out));
    assert!(api.purged().is_empty());
}

#[test]
fn warm_warms_every_edge_and_skips_one_that_health_says_is_down() {
    let rt = Runtime::new().unwrap();
    let (fastly, cloudflare) = edges(&rt);
    let urls = scratch("urls.txt");
    std::fs::write(
        &urls,
        "# top pages\n/\n/products/1\nhttps://www.example.com/products/2?colour=oak\n/css/site.css\n",
    )
    .unwrap();
    let mut args = vec![
        "--policy".to_owned(),
        policy(),
        "--urls".into(),
        urls.display().to_string(),
        "--concurrency".into(),
        "2".into(),
    ];
    args.extend(edge_args(&fastly.base_url(), &cloudflare.base_url()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let out = run("warm", &args, &[]);
    let text = stdout(&out);
    assert_eq!(code(&out), 0, "{text}{}", stderr(&out));
    let row = |p: &str| {
        text.lines()
            .find(|l| l.starts_with(p))
            .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>())
    };
    assert_eq!(
        row("fastly "),
        Some(vec!["fastly", "4", "0", "0"]),
        "{text}"
    );
    assert_eq!(
        row("cloudflare "),
        Some(vec!["cloudflare", "4", "0", "0"]),
        "{text}"
    );

    cloudflare.set_mode(EdgeMode::Unavailable);
    let before = cloudflare.request_count();
    let out = run("warm", &args, &[]);
    let text = stdout(&out);
    assert_eq!(code(&out), 1, "{text}{}", stderr(&out));
    assert!(text.contains("health: cloudflare is down"), "{text}");
    assert!(text.contains("cloudflare   SKIPPED"), "{text}");
    // Only the five health probes reached the broken edge; no page was warmed through it.
    assert_eq!(cloudflare.request_count() - before, 5);
    let _ = std::fs::remove_file(urls);
}

#[test]
fn scoreboard_prints_the_dashboard_of_the_sample_beacons() {
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/data/beacons.ndjson");
    let out = run("scoreboard", &[sample], &[]);
    let text = stdout(&out);
    assert_eq!(code(&out), 0, "{text}{}", stderr(&out));
    assert!(text.contains("304 lines: 300 beacons"), "{text}");
    for reason in [
        "not a JSON object",
        "an unknown provider",
        "an implausible time",
        "no `at` time",
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("1  ") && l.ends_with(reason)),
            "bad lines counted by reason ({reason}):\n{text}"
        );
    }
    assert!(
        text.contains("== dashboard: p75 TTFB by provider by country"),
        "{text}"
    );
    let au = text
        .lines()
        .find(|l| l.starts_with("AU "))
        .expect("an AU row");
    assert!(au.contains("(90%)") && au.contains("(10%)"), "{au}");
    assert!(text.lines().any(|l| l.starts_with("all ")), "{text}");
}

#[test]
fn scoreboard_counts_a_beacon_past_year_9999_instead_of_panicking() {
    let input = scratch("year-10000.ndjson");
    std::fs::write(
        &input,
        "{\"at\":18446744073709551615,\"asn\":1,\"country\":\"GB\",\"ttfb\":66.5,\"provider\":\"cloudflare\"}\n",
    )
    .unwrap();
    for args in [
        vec!["--at", "2026-12-01T09:00:00Z", input.to_str().unwrap()],
        vec![input.to_str().unwrap()],
    ] {
        let out = run("scoreboard", &args, &[]);
        let text = stdout(&out);
        assert_eq!(code(&out), 1, "{text}{}", stderr(&out));
        assert!(text.contains("dated after the receive time"), "{text}");
    }
    let _ = std::fs::remove_file(input);
}

#[test]
fn scoreboard_keeps_a_cells_history_when_one_beacon_is_dated_2100() {
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/data/beacons.ndjson");
    let gb = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("GB "))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no GB row:\n{text}"))
    };
    let before = stdout(&run("scoreboard", &[sample], &[]));
    let input = scratch("beacons-2100.ndjson");
    let mut lines = std::fs::read_to_string(sample).unwrap();
    lines.push_str("{\"at\":4102444800000,\"asn\":2856,\"country\":\"GB\",\"ttfb\":66.5,\"provider\":\"cloudflare\"}\n");
    std::fs::write(&input, lines).unwrap();
    let out = run("scoreboard", &[input.to_str().unwrap()], &[]);
    let after = stdout(&out);
    assert_eq!(code(&out), 0, "{after}");
    assert_eq!(gb(&after), gb(&before));
    assert!(after.contains("dated after the receive time"), "{after}");
    let _ = std::fs::remove_file(input);
}

#[test]
fn scoreboard_output_stays_bounded_whatever_the_provider_names() {
    let input = scratch("providers.ndjson");
    let at = "1796112602323";
    let mut text = format!(
        "{{\"at\":{at},\"asn\":1,\"country\":\"GB\",\"ttfb\":66.5,\"provider\":\"{}\"}}\n",
        "p".repeat(1 << 20)
    );
    let names: Vec<String> = (0..2000).map(|i| format!("\"cdn{i}\":50")).collect();
    text.push_str(&format!(
        "{{\"at\":{at},\"asn\":1,\"country\":\"GB\",\"times\":{{{}}}}}\n",
        names.join(",")
    ));
    text.push_str(&format!(
        "{{\"at\":{at},\"asn\":1,\"country\":\"GB\",\"ttfb\":66.5,\"provider\":\"fastly\"}}\n"
    ));
    std::fs::write(&input, text).unwrap();
    let out = run(
        "scoreboard",
        &["--min-samples", "1", input.to_str().unwrap()],
        &[],
    );
    let text = stdout(&out);
    assert_eq!(
        code(&out),
        0,
        "{}{}",
        &text[..text.len().min(2000)],
        stderr(&out)
    );
    for line in text.lines() {
        assert!(
            line.len() < 400,
            "a line of {} bytes: {}",
            line.len(),
            &line[..200]
        );
    }
    assert!(
        stderr(&out).contains("counted as unknown providers"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_file(input);
}

#[test]
fn scoreboard_exits_1_without_a_valid_beacon() {
    let junk = scratch("junk.ndjson");
    std::fs::write(&junk, "not json\n{\"ttfb\": 3}\n").unwrap();
    let out = run("scoreboard", &[junk.to_str().unwrap()], &[]);
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("skipped 2 line(s)"),
        "{}",
        stdout(&out)
    );
    let _ = std::fs::remove_file(junk);
}

#[test]
fn steer_plan_prints_the_route53_sets_and_diff_without_credentials_exits_2() {
    let out = run(
        "steer",
        &["plan", "--policy", &policy(), "--vendor", "route53"],
        &[],
    );
    let text = stdout(&out);
    assert_eq!(code(&out), 0, "{text}{}", stderr(&out));
    assert!(text.contains("23 record sets:"), "{text}");
    assert!(
        text.contains("europe._steer.www.example.com CNAME [europe-fastly] weight 229 ttl 30 -> example.map.fastly.net"),
        "{text}"
    );
    let ns1 = run(
        "steer",
        &["plan", "--policy", &policy(), "--vendor", "ns1"],
        &[],
    );
    assert_eq!(code(&ns1), 0, "{}", stderr(&ns1));
    let record: serde_json::Value =
        serde_json::from_str(stdout(&ns1).split_once('\n').map(|(_, json)| json).unwrap()).unwrap();
    assert_eq!(record["domain"], "www.example.com");

    let diff = run(
        "steer",
        &[
            "diff",
            "--policy",
            &policy(),
            "--vendor",
            "route53",
            "--zone-id",
            "Z1",
            "--endpoint",
            "http://127.0.0.1:1",
        ],
        &[],
    );
    assert_eq!(code(&diff), 2);
    assert!(
        stderr(&diff).contains("AWS_ACCESS_KEY_ID"),
        "{}",
        stderr(&diff)
    );
}

/// A loopback NS1 (`multicdn-test-support`) with the example policy's zone, answering 401 to
/// any key but `test-ns1-key`.
async fn fake_ns1() -> (String, Ns1Api) {
    let api = Ns1Api::start("test-ns1-key").await.unwrap();
    api.create_zone("example.com");
    (api.base_url(), api)
}

#[test]
fn steer_diff_exits_1_until_applied_and_a_big_change_needs_force() {
    let rt = Runtime::new().unwrap();
    let (endpoint, ns1) = rt.block_on(fake_ns1());
    let stored = || ns1.record("example.com", "www.example.com", "CNAME");
    let key = [("NS1_API_KEY", "test-ns1-key")];
    let steer = |action: &str, policy: &str, extra: &[&str]| {
        let mut args = vec![
            action,
            "--policy",
            policy,
            "--vendor",
            "ns1",
            "--endpoint",
            &endpoint,
        ];
        args.extend(extra);
        run("steer", &args, &key)
    };
    let policy = policy();

    let diff = steer("diff", &policy, &[]);
    assert_eq!(code(&diff), 1, "{}{}", stdout(&diff), stderr(&diff));
    assert!(
        stdout(&diff).contains("create www.example.com CNAME"),
        "{}",
        stdout(&diff)
    );
    assert!(stored().is_none(), "diff wrote the record");

    assert!(
        stdout(&diff).contains("monitors (multicdn www.example.com) missing"),
        "{}",
        stdout(&diff)
    );

    let apply = steer("apply", &policy, &[]);
    assert_eq!(code(&apply), 0, "{}{}", stdout(&apply), stderr(&apply));
    assert!(
        stdout(&apply).contains("monitor for fastly: feed "),
        "{}",
        stdout(&apply)
    );
    assert_eq!(
        stored().map(|r| r["domain"].clone()),
        Some(serde_json::json!("www.example.com"))
    );
    {
        // The primary answers' up follows the monitors' feeds; up is first in the chain.
        let record = stored().unwrap();
        assert_eq!(record["filters"][0]["filter"], "up");
        let primary = record["answers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["meta"]["priority"] == 1)
            .unwrap();
        assert!(primary["meta"]["up"]["feed"].is_string(), "{primary}");
    }
    let diff = steer("diff", &policy, &[]);
    assert_eq!(code(&diff), 0, "{}{}", stdout(&diff), stderr(&diff));
    assert!(stdout(&diff).contains("no changes"), "{}", stdout(&diff));

    // Three of four regions change weights: more than guardrails.max_touched_per_apply (30%).
    let moved = scratch("moved-policy.yaml");
    let text = std::fs::read_to_string(&policy)
        .unwrap()
        .replace(
            "{ fastly: 90%, cloudflare: 10% }",
            "{ fastly: 70%, cloudflare: 30% }",
        )
        .replace(
            "{ fastly: 85%, cloudflare: 15% }",
            "{ fastly: 60%, cloudflare: 40% }",
        )
        .replace(
            "{ cloudflare: 90%, fastly: 10% }",
            "{ cloudflare: 60%, fastly: 40% }",
        );
    std::fs::write(&moved, text).unwrap();
    let moved = moved.to_str().unwrap();
    let refused = steer("apply", moved, &[]);
    assert_eq!(
        code(&refused),
        2,
        "{}{}",
        stdout(&refused),
        stderr(&refused)
    );
    assert!(
        stderr(&refused).contains("max_touched_per_apply"),
        "{}",
        stderr(&refused)
    );
    let forced = steer("apply", moved, &["--force"]);
    assert_eq!(code(&forced), 0, "{}{}", stdout(&forced), stderr(&forced));
    assert!(
        stdout(&forced).contains("3 cohort(s) changed weights"),
        "{}",
        stdout(&forced)
    );
    assert_eq!(code(&steer("diff", moved, &[])), 0);

    let wrong_key = run(
        "steer",
        &[
            "diff",
            "--policy",
            &policy,
            "--vendor",
            "ns1",
            "--endpoint",
            &endpoint,
        ],
        &[("NS1_API_KEY", "expired")],
    );
    assert_eq!(code(&wrong_key), 2);
    assert!(
        !stderr(&wrong_key).contains("expired"),
        "the key is never printed"
    );
    let _ = std::fs::remove_file(moved);
}

#[test]
fn serve_runs_the_whole_service_on_loopback_with_no_flags_and_stops_cleanly() {
    let o = run(
        "serve",
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--users",
            "40",
            "--run-for",
            "4s",
        ],
        &[("MULTICDN_ADMIN_TOKEN", "")],
    );
    let out = stdout(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("/dashboard/"), "{out}");
    assert!(out.contains("admin token"), "{out}");
    assert!(
        out.contains("a page through fastly: http://127.0.0.1:"),
        "{out}"
    );
    let last = out.lines().last().unwrap_or_default();
    let navs: u64 = last
        .strip_prefix("served ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary line: {out}"));
    assert!(
        navs >= 40,
        "the synthetic users' beacons reached the receiver: {last}"
    );
}

#[test]
fn serve_names_the_policy_file_it_cannot_read_and_refuses_route53_without_a_zone() {
    let o = run(
        "serve",
        &[
            "--policy",
            "/nonexistent/policy.yaml",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/policy.yaml"));
    let o = run(
        "serve",
        &[
            "--policy",
            &policy(),
            "--dns",
            "route53",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[("FASTLY_API_TOKEN", "x"), ("CLOUDFLARE_API_TOKEN", "y")],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--zone-id"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn scoreboard_reads_a_generated_log_alike_on_one_thread_and_two() {
    let log = scratch("generated.ndjson");
    let table = scratch("generated-prefixes.txt");
    let out = run(
        "beacongen",
        &[
            "--lines",
            "120000",
            "--asns",
            "2000",
            "--v4-prefixes",
            "20000",
            "--v6-prefixes",
            "4000",
            "--out",
            log.to_str().unwrap(),
            "--prefixes",
            table.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // A line too long to hold (an upload gone wrong) as the second line.
    let mut bytes = std::fs::read(&log).unwrap();
    let cut = bytes.iter().position(|b| *b == b'\n').unwrap() + 1;
    let mut long = vec![b'z'; 200_000];
    long.push(b'\n');
    bytes.splice(cut..cut, long);
    std::fs::write(&log, &bytes).unwrap();
    let args = |threads: &'static str| {
        run(
            "scoreboard",
            &[
                "--threads",
                threads,
                "--prefixes",
                table.to_str().unwrap(),
                log.to_str().unwrap(),
            ],
            &[],
        )
    };
    let (one, two) = (args("1"), args("2"));
    assert_eq!(code(&one), 0, "{}", stderr(&one));
    // The same, apart from the scoreboard's size: the merged shards' index grew differently.
    let same = |o: &Output| {
        stdout(o)
            .lines()
            .filter(|l| !l.starts_with("scoreboard: "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(same(&one), same(&two));
    let text = stdout(&one);
    assert!(text.starts_with("120001 lines: "), "{text}");
    assert!(
        text.contains("line 2: not a JSON object: a line longer than 65536 bytes"),
        "{text}"
    );
    // Three providers learnt from the lines, a dashboard row per country.
    for p in ["fastly", "cloudflare", "akamai"] {
        assert!(text.contains(p), "{text}");
    }
    let _ = std::fs::remove_file(log);
    let _ = std::fs::remove_file(table);
}

#[test]
fn policy_check_summarises_the_standby_its_fallback_and_its_drill() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/policy-standby.yaml");
    let out = run("policy", &["check", path], &[]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "cloudflare edge example.cdn.cloudflare.net (standby: 0% until a failover or a drill)"
        ),
        "{text}"
    );
    assert!(
        text.contains("europe         [GB, IE, DE, FR, NL, ES, IT] -> cloudflare 0%, fastly 100%"),
        "{text}"
    );
    assert!(
        text.contains("fallback when every provider is down: catalogue.example-static.net"),
        "{text}"
    );
    assert!(
        text.contains("drill q1-standby: 100% to cloudflare at 2027-01-12T10:00:00Z, held 1h"),
        "{text}"
    );
}

#[test]
fn the_shield_is_rendered_from_the_policy_and_a_shield_that_misses_holds_the_cdns_back() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/policy-standby.yaml");
    let out = run("policy", &["check", path], &[]);
    assert!(
        stdout(&out).contains(
            "shield: Varnish in front of the origin origin.internal.example.com:8080, purged first at http://shield.internal.example.com:6081/ from 10.20.0.5, 10.20.0.6"
        ),
        "{}",
        stdout(&out)
    );
    let out = run("policy", &["render", path, "--provider", "shield"], &[]);
    let vcl = stdout(&out);
    assert_eq!(code(&out), 0, "{vcl}{}", stderr(&out));
    assert!(vcl.starts_with("vcl 4.1;"), "{vcl}");
    assert!(
        vcl.contains(".host = \"origin.internal.example.com\";"),
        "{vcl}"
    );
    assert!(
        vcl.contains("\"10.20.0.5\";") && vcl.contains("\"10.20.0.6\";"),
        "{vcl}"
    );
    // The grace approximation is said, not hidden.
    assert!(
        stderr(&out).contains("warning: shield:"),
        "{}",
        stderr(&out)
    );
    let out = run(
        "policy",
        &["render", &policy(), "--provider", "shield"],
        &[],
    );
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("no shield section"),
        "{}",
        stderr(&out)
    );

    // The shield not answering: the CDNs are sent nothing, and the purge exits 1.
    let rt = Runtime::new().unwrap();
    let api = rt.block_on(PurgeApi::start()).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://127.0.0.1:{}/", closed.local_addr().unwrap().port());
    drop(closed);
    let args = [
        "--policy",
        path,
        "--fastly-api",
        &api.fastly_base(),
        "--cloudflare-api",
        &api.cloudflare_base(),
        "--shield-api",
        &dead,
        "--timeout",
        "2s",
        "--tag",
        "product-1",
    ];
    let out = run("purge", &args, &TOKENS);
    let text = stdout(&out);
    assert_eq!(code(&out), 1, "{text}{}", stderr(&out));
    assert!(text.contains("shield       MISSED 1 tags"), "{text}");
    assert!(text.contains("fastly       HELD"), "{text}");
    assert!(text.contains("cloudflare   HELD"), "{text}");
    assert!(
        stderr(&out).contains("the origin shield missed the purge"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("demote"), "{}", stderr(&out));
    assert!(
        api.purged().is_empty(),
        "a CDN was purged past the shield: {:?}",
        api.purged()
    );

    // A dry run lists the shield first.
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let out = run("purge", &dry, &TOKENS);
    let text = stdout(&out);
    assert_eq!(code(&out), 0, "{text}");
    let shield_at = text.find("shield       1 batch").unwrap();
    assert!(
        shield_at < text.find("fastly       1 batch").unwrap(),
        "{text}"
    );
    assert!(text.contains("after the shield"), "{text}");
}
