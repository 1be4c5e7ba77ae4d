//! A real `nats-server -js` on loopback, for the tests that need JetStream: its own free port
//! and store directory, stopped when dropped, and stoppable and restartable (same port, same
//! store) in the middle of a test.
//!
//! The binary is `$NATS_SERVER`, else `nats-server` on `PATH`, else `/usr/sbin/nats-server`
//! (Debian's `nats-server` package). [`NatsServer::start`] returns `Ok(None)` when none is
//! installed, so a test can say it is skipped (or fail in CI).

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(20);

/// Servers started by this process, for their unique names.
static SERVERS: AtomicU64 = AtomicU64::new(0);

/// Why a start did not succeed.
enum Start {
    /// The port was taken before the server bound it: another port may do.
    PortTaken(String),
    /// Anything else.
    Failed(String),
}

/// A port nothing listens on now.
fn free_port() -> Result<u16, String> {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// The `INFO` line the server on `port` greets a client with, if one answers within a second.
fn info(port: u16) -> Option<String> {
    let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    line.starts_with("INFO ").then_some(line)
}

/// A running `nats-server -js`.
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    /// The server's name, unique to this test process: its `INFO` proves it is ours.
    name: String,
    dir: PathBuf,
    child: Option<Child>,
}

fn binary() -> Option<PathBuf> {
    let candidates = std::env::var_os("NATS_SERVER")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nats-server"))
                .collect::<Vec<_>>()
        }))
        .chain([PathBuf::from("/usr/sbin/nats-server")]);
    candidates.into_iter().find(|p| p.is_file())
}

impl NatsServer {
    /// As [`NatsServer::start`] for a test named `tests`: without `nats-server` it says on
    /// stderr that they are skipped (`Ok(None)`), except in CI (`CI` set), where its absence is
    /// an error.
    pub fn start_or_skip(tests: &str) -> Result<Option<NatsServer>, String> {
        let server = NatsServer::start()?;
        if server.is_none() {
            let why = "nats-server is not installed (apt-get install nats-server; .ci/run does)";
            if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
                return Err(format!("{tests} cannot run in CI: {why}"));
            }
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "skipped {tests}: {why}");
        }
        Ok(server)
    }

    /// Starts a server with JetStream on 127.0.0.1 and waits until it answers under its own
    /// name; `Ok(None)` when no `nats-server` is installed.
    pub fn start() -> Result<Option<NatsServer>, String> {
        let Some(binary) = binary() else {
            return Ok(None);
        };
        let mut server = NatsServer {
            binary,
            port: 0,
            name: String::new(),
            dir: PathBuf::new(),
            child: None,
        };
        // A port found free can be taken by another process (another test's server, or a
        // connection's local port) before this server binds it: then try another.
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port()?;
            server.name = format!(
                "multicdn-test-{}-{}-{}",
                std::process::id(),
                server.port,
                SERVERS.fetch_add(1, Ordering::Relaxed)
            );
            server.dir = std::env::temp_dir().join(&server.name);
            std::fs::create_dir_all(&server.dir)
                .map_err(|e| format!("{}: {e}", server.dir.display()))?;
            match server.run() {
                Ok(()) => return Ok(Some(server)),
                Err(Start::PortTaken(why)) => {
                    let _ = std::fs::remove_dir_all(&server.dir);
                    last = why;
                }
                Err(Start::Failed(why)) => return Err(why),
            }
        }
        Err(format!("nats-server found no free port in 5 tries: {last}"))
    }

    /// Spawns the server on `self.port` and waits (up to 10 s) until the server answering
    /// there is this one: its `INFO` names it.
    fn run(&mut self) -> Result<(), Start> {
        let child = Command::new(&self.binary)
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("--server_name")
            .arg(&self.name)
            .arg("-sd")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Start::Failed(format!("starting {}: {e}", self.binary.display())))?;
        self.child = Some(child);
        let wanted = format!("\"server_name\":\"{}\"", self.name);
        // 10 s in steps of POLL.
        for _ in 0..500 {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(Start::PortTaken(format!(
                    "nats-server exited at start on port {}: {status}",
                    self.port
                )));
            }
            match info(self.port) {
                Some(info) if info.contains(&wanted) => return Ok(()),
                Some(_) => {
                    self.stop();
                    return Err(Start::PortTaken(format!(
                        "another nats-server answers on port {}",
                        self.port
                    )));
                }
                None => std::thread::sleep(POLL),
            }
        }
        self.stop();
        Err(Start::Failed(format!(
            "nats-server did not answer on 127.0.0.1:{} within 10 s",
            self.port
        )))
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server (its store stays) and waits until the port is closed.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Up to 5 s in steps of POLL.
        for _ in 0..250 {
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_err() {
                break;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.run().map_err(|e| match e {
            Start::PortTaken(why) | Start::Failed(why) => why,
        })
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
