//! The `deploy` tool against stateful Fastly and Cloudflare stubs on loopback (wiremock): every
//! route checks method, path, the auth header and the body's shape, and keeps the service's
//! versions and the zone's rulesets, so `apply` then `drift` reads back what was written, and a
//! console edit made between two runs is seen by the next.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use multicdn_test_support::config::{Service, Zone, cloudflare_rulesets, fastly_config};
use tokio::runtime::Runtime;
use wiremock::MockServer;

const SID: &str = "SU1Z0isxPaozGVKXdv0eY";
const ZONE: &str = "023e105f4ecef8ad9ca31a8372d0c353";
const FASTLY_TOKEN: &str = "fastly-secret-token-0123";
const CLOUDFLARE_TOKEN: &str = "cloudflare-secret-token-4567";

/// `target/<profile>/examples/deploy`, beside this test's `target/<profile>/deps/`.
fn deploy_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|d| d.parent()).unwrap();
    profile
        .join("examples")
        .join(format!("deploy{}", std::env::consts::EXE_SUFFIX))
}

struct Stubs {
    fastly: MockServer,
    cloudflare: MockServer,
    service: Arc<Mutex<Service>>,
    zone: Arc<Mutex<Zone>>,
}

impl Stubs {
    /// Runs `deploy <args> --policy examples/policy.yaml` against both stubs.
    fn deploy(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(deploy_binary());
        cmd.args(args)
            .args([
                "--policy",
                concat!(env!("CARGO_MANIFEST_DIR"), "/policy.yaml"),
            ])
            .args(["--fastly-endpoint", &self.fastly.uri()])
            .args(["--cloudflare-endpoint", &self.cloudflare.uri()])
            .env("FASTLY_API_TOKEN", FASTLY_TOKEN)
            .env("CLOUDFLARE_API_TOKEN", CLOUDFLARE_TOKEN);
        let out = cmd.output().unwrap();
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            !all.contains(FASTLY_TOKEN) && !all.contains(CLOUDFLARE_TOKEN),
            "a token was printed:\n{all}"
        );
        out
    }

    /// How many requests each stub has received so far.
    fn mark(&self, rt: &Runtime) -> [usize; 2] {
        [&self.cloudflare, &self.fastly]
            .map(|server| rt.block_on(server.received_requests()).unwrap().len())
    }

    /// Every request the stubs received after `mark`, as `METHOD /path`, Cloudflare's first
    /// (the tool goes through the policy's providers in name order).
    fn since(&self, rt: &Runtime, mark: [usize; 2]) -> Vec<String> {
        let mut out = Vec::new();
        for (server, from) in [&self.cloudflare, &self.fastly].into_iter().zip(mark) {
            for r in &rt.block_on(server.received_requests()).unwrap()[from..] {
                out.push(format!("{} {}", r.method, r.url.path()));
            }
        }
        out
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// What the plan and diff read; anything else is a write (or Fastly's validation).
fn is_read(call: &str) -> bool {
    call.starts_with("GET ")
        && (call.ends_with("/version")
            || call.ends_with("/snippet")
            || call.ends_with("/entrypoint"))
}

/// A Fastly service with one active, empty version and a zone without entry points.
fn stubs(rt: &Runtime) -> Stubs {
    let service = Arc::new(Mutex::new(Service {
        versions: vec![(1, true, Vec::new())],
    }));
    let zone = Arc::new(Mutex::new(Zone::default()));
    let (fastly, cloudflare) = rt.block_on(async {
        (
            fastly_config(&service, SID, FASTLY_TOKEN).await,
            cloudflare_rulesets(&zone, ZONE, CLOUDFLARE_TOKEN).await,
        )
    });
    Stubs {
        fastly,
        cloudflare,
        service,
        zone,
    }
}

/// The writes `plan` lists (`    METHOD /path  [body]` lines), as `METHOD /path`.
fn planned_writes(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|l| {
            ["PUT ", "POST ", "DELETE ", "GET "]
                .iter()
                .any(|m| l.starts_with(m))
        })
        .map(|l| l.split("  [").next().unwrap().to_owned())
        .collect()
}

#[test]
fn plan_shows_the_exact_calls_apply_sends_and_drift_then_finds_nothing() {
    let rt = Runtime::new().unwrap();
    let stubs = stubs(&rt);

    let plan = stubs.deploy(&["plan"]);
    let shown = text(&plan.stdout);
    assert_eq!(code(&plan), 0, "{shown}{}", text(&plan.stderr));
    let read = stubs.since(&rt, [0, 0]);
    assert!(read.iter().all(|c| is_read(c)), "plan wrote: {read:?}");
    let planned = planned_writes(&shown);
    let on = |api: &str| -> Vec<String> {
        planned
            .iter()
            .filter(|c| c.contains(api))
            .cloned()
            .collect()
    };
    let fastly = on("/service/");
    assert_eq!(fastly.len(), 8, "{shown}");
    assert_eq!(fastly[0], format!("PUT /service/{SID}/version/1/clone"));
    assert!(
        fastly[1..6]
            .iter()
            .all(|c| c == &format!("POST /service/{SID}/version/2/snippet")),
        "{shown}"
    );
    assert_eq!(
        fastly[6..],
        [
            format!("GET /service/{SID}/version/2/validate"),
            format!("PUT /service/{SID}/version/2/activate"),
        ]
    );
    assert!(
        shown.contains("form: name=multicdn-recv-routes, type=recv, priority=10"),
        "{shown}"
    );
    assert_eq!(
        on("/zones/"),
        [
            format!("PUT /zones/{ZONE}/rulesets/phases/http_request_cache_settings/entrypoint"),
            format!("PUT /zones/{ZONE}/rulesets/phases/http_response_headers_transform/entrypoint"),
        ]
    );
    assert!(
        shown.contains("rule(s) (multicdn-cache-defaults, "),
        "{shown}"
    );

    let before = stubs.mark(&rt);
    let apply = stubs.deploy(&["apply"]);
    assert_eq!(
        code(&apply),
        0,
        "{}{}",
        text(&apply.stdout),
        text(&apply.stderr)
    );
    assert!(text(&apply.stdout).contains("version 2 validated and activated (was 1)"));
    let sent: Vec<String> = stubs
        .since(&rt, before)
        .into_iter()
        .filter(|c| !is_read(c))
        .collect();
    assert_eq!(sent, planned, "apply sent other calls than the plan showed");

    let drift = stubs.deploy(&["drift"]);
    assert_eq!(
        code(&drift),
        0,
        "{}{}",
        text(&drift.stdout),
        text(&drift.stderr)
    );
    assert!(text(&drift.stdout).contains("no drift: every provider runs the policy's rendering"));
    let diff = stubs.deploy(&["diff", "--vendor", "cloudflare"]);
    assert_eq!(code(&diff), 0, "{}", text(&diff.stdout));
    assert!(text(&diff.stdout).contains("0 of 1 provider(s) would change"));
}

#[test]
fn a_console_edit_is_drift_and_apply_overwrites_it_only_with_force() {
    let rt = Runtime::new().unwrap();
    let stubs = stubs(&rt);
    assert_eq!(code(&stubs.deploy(&["apply"])), 0);
    stubs.service.lock().unwrap().console_edit(
        "multicdn-recv-routes",
        "return(pass)",
        "return(lookup)",
    );
    stubs
        .zone
        .lock()
        .unwrap()
        .console_rule("http_request_cache_settings");

    let drift = stubs.deploy(&["drift"]);
    assert_eq!(code(&drift), 1, "{}", text(&drift.stdout));
    assert!(
        text(&drift.stdout).contains("drift on 2 of 2 provider(s)"),
        "{}",
        text(&drift.stdout)
    );

    let before = stubs.mark(&rt);
    let refused = stubs.deploy(&["apply"]);
    let err = text(&refused.stderr);
    assert_eq!(code(&refused), 1, "{err}");
    assert!(
        err.contains("would overwrite 2 item(s) changed outside multicdn; nothing was sent"),
        "{err}"
    );
    assert!(
        err.contains("multicdn-recv-routes: edited since multicdn wrote it"),
        "{err}"
    );
    assert!(
        err.contains("http_request_cache_settings/c0ffee: added outside multicdn"),
        "{err}"
    );
    let after = stubs.since(&rt, before);
    assert!(
        after.iter().all(|c| is_read(c)),
        "refused apply wrote: {after:?}"
    );

    let forced = stubs.deploy(&["apply", "--force"]);
    assert_eq!(
        code(&forced),
        0,
        "{}{}",
        text(&forced.stdout),
        text(&forced.stderr)
    );
    assert_eq!(code(&stubs.deploy(&["drift"])), 0);
}

#[test]
fn an_unset_token_is_a_usage_error_named_by_its_variable() {
    let rt = Runtime::new().unwrap();
    let stubs = stubs(&rt);
    let out = Command::new(deploy_binary())
        .args(["plan", "--vendor", "fastly", "--policy"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/policy.yaml"))
        .args(["--fastly-endpoint", &stubs.fastly.uri()])
        .env_remove("FASTLY_API_TOKEN")
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    assert!(
        text(&out.stderr).contains("FASTLY_API_TOKEN (providers.fastly.token_env) is unset"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        rt.block_on(stubs.fastly.received_requests())
            .unwrap()
            .is_empty()
    );
}
