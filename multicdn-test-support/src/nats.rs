//! A real `nats-server -js` on loopback, for the tests that need JetStream: its own free port
//! and store directory, stopped when dropped, and stoppable and restartable (same port, same
//! store) in the middle of a test.
//!
//! The binary is `$NATS_SERVER`, else `nats-server` on `PATH`, else `/usr/sbin/nats-server`
//! (Debian's `nats-server` package). [`NatsServer::start`] returns `Ok(None)` when none is
//! installed, so a test can say it is skipped (or fail in CI).

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(20);

/// A running `nats-server -js`.
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
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

    /// Starts a server with JetStream on 127.0.0.1 and waits until it accepts connections;
    /// `Ok(None)` when no `nats-server` is installed.
    pub fn start() -> Result<Option<NatsServer>, String> {
        let Some(binary) = binary() else {
            return Ok(None);
        };
        let port = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let dir = std::env::temp_dir().join(format!("multicdn-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut server = NatsServer {
            binary,
            port,
            dir,
            child: None,
        };
        server.run()?;
        Ok(Some(server))
    }

    fn run(&mut self) -> Result<(), String> {
        let child = Command::new(&self.binary)
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("-sd")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        // 10 s in steps of POLL.
        for _ in 0..500 {
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("nats-server exited at start: {status}"));
            }
            std::thread::sleep(POLL);
        }
        Err(format!(
            "nats-server did not listen on 127.0.0.1:{} within 10 s",
            self.port
        ))
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
        self.run()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
