//! The shield VCL against a real `varnishd` on loopback: it compiles, routes cache as the
//! policy says, a failing origin is covered by stale content, a tag purge clears exactly the
//! tagged objects. Skipped (with the reason printed) when `varnishd` is absent, unless
//! `CI=true`, where its absence fails.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use multicdn_core::Policy;
use multicdn_core::policy::Dur;
use multicdn_providers::render::RenderMode;
use multicdn_providers::render::shield_vcl::{ShieldTarget, render_shield};

const VARNISHD: &str = "/usr/sbin/varnishd";

fn varnishd_present() -> bool {
    if std::path::Path::new(VARNISHD).exists() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{VARNISHD} is missing and CI=true: .ci/run installs varnish and varnish-modules"
    );
    eprintln!("skipped: {VARNISHD} is not installed (apt-get install varnish varnish-modules)");
    false
}

/// An origin on loopback: counts requests per path, can be switched to answer 503, and tags
/// `/products/<x>` with `Surrogate-Key: product-<x> all-products`.
struct Origin {
    port: u16,
    hits: Arc<std::sync::Mutex<Vec<String>>>,
    failing: Arc<AtomicBool>,
}

impl Origin {
    fn start() -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(std::sync::Mutex::new(Vec::new()));
        let failing = Arc::new(AtomicBool::new(false));
        let (h, f) = (hits.clone(), failing.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let mut buf = Vec::new();
                let mut b = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                }
                let req = String::from_utf8_lossy(&buf).to_string();
                let target = req.split(' ').nth(1).unwrap_or("").to_owned();
                h.lock().unwrap().push(target.clone());
                let path = target.split('?').next().unwrap_or("").to_owned();
                let (status, extra) = if f.load(Ordering::SeqCst) {
                    ("503 Service Unavailable", String::new())
                } else if let Some(p) = path.strip_prefix("/products/") {
                    (
                        "200 OK",
                        format!("Surrogate-Key: product-{p} all-products\r\n"),
                    )
                } else {
                    ("200 OK", String::new())
                };
                let body = format!("{status} {target}");
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Origin {
            port,
            hits,
            failing,
        }
    }

    fn hits(&self, target: &str) -> usize {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|t| *t == target)
            .count()
    }
}

struct Varnish {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Varnish {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn vcl_for(origin_port: u16, edge_ttl: u64) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/policy.yaml");
    let mut policy = Policy::load(path).unwrap();
    policy.cache.defaults.ttl_edge = Dur::secs(edge_ttl);
    let target = ShieldTarget {
        origin_host: "127.0.0.1".into(),
        origin_port,
        purgers: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    };
    render_shield(&policy.cache, &target, RenderMode::Lenient)
        .unwrap()
        .vcl
}

fn start_varnish(vcl: &str) -> Varnish {
    let dir = tempfile::tempdir().unwrap();
    let file: PathBuf = dir.path().join("shield.vcl");
    std::fs::write(&file, vcl).unwrap();
    let port = free_port();
    let child = Command::new(VARNISHD)
        .args(["-F", "-a"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-f")
        .arg(&file)
        .arg("-n")
        .arg(dir.path().join("n"))
        .args(["-s", "malloc,32m", "-T", "none", "-p", "default_grace=0s"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let v = Varnish {
        child,
        port,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "varnishd did not listen within 10s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The manager listens before the cache process serves: until it does, a connection is
    // reset. Wait for a whole answer (to a path no test counts).
    let ready = |port: u16| -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let sent = s.write_all(
            b"GET /__multicdn_ready HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n",
        );
        let mut out = String::new();
        sent.is_ok() && s.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.1 ")
    };
    while !ready(port) {
        assert!(
            Instant::now() < deadline,
            "varnishd did not answer within 10s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    v
}

/// (status, headers, body) of one request.
fn request(
    port: u16,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req =
        format!("{method} {target} HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

#[test]
fn rendered_vcl_compiles() {
    if !varnishd_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shield.vcl");
    std::fs::write(&file, vcl_for(8080, 3600)).unwrap();
    let out = Command::new(VARNISHD)
        .arg("-C")
        .arg("-f")
        .arg(&file)
        .arg("-n")
        .arg(dir.path().join("n"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "varnishd -C refused the VCL:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn routes_cache_key_stale_and_tag_purge_behave_as_the_policy_says() {
    if !varnishd_present() {
        return;
    }
    let origin = Origin::start();
    let v = start_varnish(&vcl_for(origin.port, 1));
    let p = v.port;

    // A cached route: the origin sees one request for two.
    for _ in 0..2 {
        assert_eq!(request(p, "GET", "/products/a", &[]).0, 200);
    }
    assert_eq!(
        origin.hits("/products/a"),
        1,
        "cached route reached the origin twice"
    );
    // A never-cached route passes every time.
    for _ in 0..2 {
        assert_eq!(request(p, "GET", "/checkout", &[]).0, 200);
    }
    assert_eq!(origin.hits("/checkout"), 2, "never-cached route was cached");
    // The cache key: parameters outside the allowlist are dropped, allowlisted ones vary it.
    request(p, "GET", "/products/q?page=2&utm_source=x", &[]);
    request(p, "GET", "/products/q?page=2&utm_source=y", &[]);
    assert_eq!(origin.hits("/products/q?page=2"), 1);
    request(p, "GET", "/products/q?page=3", &[]);
    assert_eq!(origin.hits("/products/q?page=3"), 1);

    // A tag purge clears exactly the tagged objects.
    request(p, "GET", "/products/b", &[]);
    let (status, _, body) = request(p, "PURGE", "/", &[("xkey-purge", "product-a")]);
    assert_eq!(status, 200, "{body}");
    request(p, "GET", "/products/a", &[]);
    request(p, "GET", "/products/b", &[]);
    assert_eq!(
        origin.hits("/products/a"),
        2,
        "the tagged object was not purged"
    );
    assert_eq!(
        origin.hits("/products/b"),
        1,
        "an untagged object was purged"
    );

    // The same through the shield purger: a tag, then a URL.
    let purger = multicdn_providers::shield::ShieldPurger::new(
        multicdn_core::ProviderId::new("shield").unwrap(),
        &format!("http://127.0.0.1:{p}/"),
        multicdn_providers::http::HttpSettings::default(),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    use multicdn_core::traits::{PurgeRequest, Purger};
    let receipt = rt
        .block_on(purger.purge(&PurgeRequest::tags(["product-b"])))
        .unwrap();
    assert_eq!((receipt.items, receipt.requests), (1, 1));
    rt.block_on(purger.purge(&PurgeRequest::urls(["https://www.example.com/products/a"])))
        .unwrap();
    request(p, "GET", "/products/a", &[]);
    request(p, "GET", "/products/b", &[]);
    request(p, "GET", "/products/q?page=3", &[]);
    assert_eq!(origin.hits("/products/a"), 3, "the URL purge missed");
    assert_eq!(origin.hits("/products/b"), 2, "the tag purge missed");
    assert_eq!(
        origin.hits("/products/q?page=3"),
        1,
        "an untagged object was purged"
    );

    // A failing origin is covered by stale content within grace (default TTL is 1s here).
    let (_, _, fresh) = request(p, "GET", "/about", &[]);
    origin.failing.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..2 {
        let (status, _, body) = request(p, "GET", "/about", &[]);
        assert_eq!(
            (status, body.as_str()),
            (200, fresh.as_str()),
            "stale content was not served"
        );
    }
    // The revalidation is a background fetch: it reaches the origin after the stale answer.
    let deadline = Instant::now() + Duration::from_secs(5);
    while origin.hits("/about") < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        origin.hits("/about") >= 2,
        "the origin was not asked to revalidate"
    );
    // Without a cached copy the failure shows.
    assert_eq!(request(p, "GET", "/never-seen", &[]).0, 503);
}

#[test]
fn a_fanout_purges_the_real_shield_first_and_holds_the_cdns_while_it_is_down() {
    if !varnishd_present() {
        return;
    }
    use multicdn_core::traits::PurgeRequest;
    use multicdn_providers::fanout::{FanoutError, FanoutMember, PurgeFanout};
    use multicdn_providers::http::HttpSettings;

    let origin = Origin::start();
    let mut v = start_varnish(&vcl_for(origin.port, 3600));
    let p = v.port;
    request(p, "GET", "/products/a", &[]);
    request(p, "GET", "/products/b", &[]);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cdns = rt
        .block_on(multicdn_test_support::PurgeApi::start())
        .unwrap();
    let fast = HttpSettings::default()
        .with_max_attempts(2)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5));
    let shield = multicdn_providers::shield::ShieldPurger::new(
        multicdn_core::ProviderId::new("shield").unwrap(),
        &format!("http://127.0.0.1:{p}/"),
        fast.clone(),
    )
    .unwrap();
    let fastly = multicdn_providers::fastly::FastlyPurger::new(
        multicdn_core::ProviderId::new("fastly").unwrap(),
        "example.map.fastly.net",
        "SU1Z0isxPaozGVKXdv0eY",
        multicdn_core::Secret::new("fastly-test-token"),
        &cdns.fastly_base(),
        fast.clone(),
    )
    .unwrap();
    let fanout = PurgeFanout::new([FanoutMember::new(Arc::new(fastly))])
        .with_shield(FanoutMember::new(Arc::new(shield)));

    let report = rt
        .block_on(fanout.purge(&PurgeRequest::tags(["product-a"])))
        .unwrap();
    assert_eq!(report.receipts.len(), 2);
    request(p, "GET", "/products/a", &[]);
    request(p, "GET", "/products/b", &[]);
    assert_eq!(
        origin.hits("/products/a"),
        2,
        "the shield kept the tagged object"
    );
    assert_eq!(
        origin.hits("/products/b"),
        1,
        "the shield lost an untagged object"
    );
    assert_eq!(
        cdns.purged().len(),
        1,
        "the CDN was not purged after the shield"
    );

    // The shield down: nothing reaches the CDN, and the miss is the shield's.
    let _ = v.child.kill();
    let _ = v.child.wait();
    // The cache process outlives its manager for a moment: wait until the port is closed.
    let closed = (0..200).any(|_| {
        let refused = std::net::TcpStream::connect(("127.0.0.1", p)).is_err();
        if !refused {
            std::thread::sleep(Duration::from_millis(50));
        }
        refused
    });
    assert!(
        closed,
        "varnishd still listens on {p} 10 s after it was killed"
    );
    let err = rt
        .block_on(fanout.purge(&PurgeRequest::tags(["product-b"])))
        .unwrap_err();
    let FanoutError::Missed { failures, held, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].provider.as_str(), "shield");
    assert!(
        matches!(failures[0].error, multicdn_core::Error::Connect { .. }),
        "{err}"
    );
    assert_eq!(held.len(), 1);
    assert_eq!(
        cdns.purged().len(),
        1,
        "a CDN was purged past a shield that was down"
    );
}
