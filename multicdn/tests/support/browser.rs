//! Driving Chromium through `tests/browser/drive.mjs`, for the browser tests (`browser.rs`,
//! `players.rs`).

#![allow(clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// The driver script, or why the test cannot run here (a failure in CI).
pub(crate) fn driver() -> Option<PathBuf> {
    let why = match std::env::var_os("MULTICDN_BROWSER_DRIVER") {
        None => "MULTICDN_BROWSER_DRIVER is not set (see .ci/run: npm ci in multicdn/tests/browser, then export it)".to_owned(),
        Some(path) => {
            let path = PathBuf::from(path);
            let chromium = std::env::var_os("CHROMIUM")
                .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
            let node = Command::new("node").arg("--version").output();
            let modules = path
                .parent()
                .map(|d| d.join("node_modules/playwright-core"));
            if !path.is_file() {
                format!("MULTICDN_BROWSER_DRIVER={} is not a file", path.display())
            } else if !modules.as_deref().is_some_and(Path::is_dir) {
                format!(
                    "playwright-core is not installed beside {} (run npm ci there)",
                    path.display()
                )
            } else if !node.is_ok_and(|o| o.status.success()) {
                "node is not on PATH".to_owned()
            } else if !chromium.is_file() {
                format!(
                    "no Chromium at {} (install Debian's chromium, or set CHROMIUM)",
                    chromium.display()
                )
            } else {
                return Some(path);
            }
        }
    };
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
        panic!("the browser test cannot run in CI: {why}");
    }
    // Written past the test harness's capture, so the skip shows in a plain `cargo test`.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
    None
}

/// Runs one driver job; its JSON result, or a panic with the driver's own account.
pub(crate) async fn drive(driver: &Path, job: Value) -> Value {
    let driver = driver.to_owned();
    let job = job.to_string();
    let run = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(&driver)
            .arg(&job)
            .output()
            .unwrap()
    });
    // The driver stops itself after the job's timeout_ms; this is the backstop.
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser driver did not finish in 120 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser driver failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "the browser driver's output is not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The values of the job's `eval` steps, in order.
pub(crate) fn evals(result: &Value) -> Vec<&Value> {
    result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s.get("eval").is_some())
        .map(|s| &s["value"])
        .collect()
}
