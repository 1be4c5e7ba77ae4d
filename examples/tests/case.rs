//! The `case` tool on a generated probe file: the seed's section-17 figures, the commit
//! shortfalls, the regions where the performance argument holds, malformed lines counted.
//!
//! The binary is the one cargo builds before running this package's tests
//! (`cargo build -p multicdn-examples --examples` first).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} missing: build the examples first",
        path.display()
    );
    path
}

/// AU: Cloudflare 60 ms faster on every load; GB: 12 ms (not material); US: a coin toss;
/// NZ: 150 ms but only 20 loads. Plus two malformed lines and one navigation beacon.
fn probe_file() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let line = |country: &str, a: u32, b: u32| {
        format!(
            r#"{{"at":"2026-12-01T09:00:00Z","network":{{"asn":64500,"country":"{country}"}},"beacon":{{"times":{{"fastly":{a},"cloudflare":{b}}},"best":""}}}}"#
        )
    };
    for i in 0..400u32 {
        let j = i % 40;
        writeln!(f, "{}", line("AU", 260 + j, 200 + j)).unwrap();
        writeln!(f, "{}", line("GB", 52 + j, 40 + j)).unwrap();
        let (x, y) = if i % 2 == 0 { (50, 60) } else { (60, 50) };
        writeln!(f, "{}", line("US", x, y)).unwrap();
        if i < 20 {
            writeln!(f, "{}", line("NZ", 300, 150)).unwrap();
        }
    }
    writeln!(f, "{{truncated").unwrap();
    writeln!(f, "not json at all").unwrap();
    writeln!(f, r#"{{"at":"2026-12-01T09:00:00Z","network":{{}},"beacon":{{"path":"/","ttfb":90,"provider":"fastly","pop":"LHR","cache":"HIT"}}}}"#).unwrap();
    f
}

#[test]
fn prints_the_section_17_case() {
    let probes = probe_file();
    let costs = concat!(env!("CARGO_MANIFEST_DIR"), "/case.yaml");
    let out = Command::new(example("case"))
        .args(["--costs", costs])
        .arg(probes.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "1223 lines, 1220 probe beacons, 1 other beacons, 2 malformed",
        "expected annual outage loss:   £10,000",
        "multi-CDN over one CDN:        £4,000 / month, £48,000 / year",
        "multi-CDN net:                 -£38,000 / year",
        "fastly       usage £1,190 / month, commit £2,000, shortfall £810",
        "cloudflare   usage £210 / month, commit £2,000, shortfall £1,790",
        "the performance argument holds in: AU\n",
        "Verdict: a configured standby is cheaper",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
    let nz = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("NZ"))
        .unwrap();
    assert!(nz.ends_with("no claim"), "{nz}");
}

#[test]
fn bad_costs_name_file_line_field_and_no_beacons_fails() {
    let probes = probe_file();
    let mut costs = tempfile::NamedTempFile::new().unwrap();
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/case.yaml")).unwrap();
    costs
        .write_all(yaml.replace("share: 0.15", "share: 1.15").as_bytes())
        .unwrap();
    let out = Command::new(example("case"))
        .arg("--costs")
        .arg(costs.path())
        .arg(probes.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let want = format!("{}:14:1: providers[1].share", costs.path().display());
    assert!(stderr.contains(&want), "{stderr}");

    let mut junk = tempfile::NamedTempFile::new().unwrap();
    writeln!(junk, "junk\nmore junk").unwrap();
    let out = Command::new(example("case"))
        .args(["--costs", concat!(env!("CARGO_MANIFEST_DIR"), "/case.yaml")])
        .arg(junk.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no beacon line parsed (2 malformed)"),
        "{stderr}"
    );
}
