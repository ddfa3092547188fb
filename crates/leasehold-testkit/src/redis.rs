//! A redis-server of a test's own, and `redis-cli` against any port.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_for};

/// `redis-cli -h 127.0.0.1 -p port args…`, its standard output.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli on PATH (scripts/stores.sh installs it)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The arguments of a loopback redis-server on `port` with its files in `dir`, persisting
/// nothing.
pub(crate) fn server_args(port: u16, dir: &str) -> Vec<String> {
    let port = port.to_string();
    [
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--dir",
        dir,
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(String::from)
    .to_vec()
}

/// Starts `redis-server args…` and waits until `port` accepts connections.
pub(crate) fn spawn_server(port: u16, args: &[String]) -> Child {
    let child = Command::new("redis-server")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on PATH (scripts/stores.sh installs it)");
    wait_for(
        "redis-server accepting connections",
        Duration::from_secs(10),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
    child
}

/// A redis-server of the test's own on loopback, persisting nothing, its working directory a
/// temp dir of its own; killed on drop.
pub struct OwnRedis {
    /// The port it listens on (its TLS port, when the extra arguments say so).
    pub port: u16,
    extra: Vec<String>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnRedis {
    /// Starts one on a free port, with `extra` arguments after the defaults (`{port}` in them
    /// stands for the chosen port).
    pub fn start(extra: &[&str]) -> Self {
        Self::start_on(free_port(), extra)
    }

    /// [`start`](Self::start) on a given port.
    pub fn start_on(port: u16, extra: &[&str]) -> Self {
        let mut me = Self {
            port,
            extra: extra
                .iter()
                .map(|s| s.replace("{port}", &port.to_string()))
                .collect(),
            dir: tempfile::Builder::new()
                .prefix("leasehold-redis-")
                .tempdir()
                .expect("a temporary directory"),
            child: None,
        };
        me.spawn();
        me
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let dir = self.dir.path().display().to_string();
        let mut args = server_args(self.port, &dir);
        args.extend(self.extra.iter().cloned());
        self.child = Some(spawn_server(self.port, &args));
    }

    /// Kills the server (SIGKILL, so nothing is saved) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills it and starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs `redis-cli` against it and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
