//! `leasehold serve` processes for tests, and one-shot HTTP/1.1 exchanges with them.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_testkit::free_port;
use serde_json::Value;

use super::BIN;

/// A `leasehold serve` process on a free port, killed when dropped.
pub struct Sidecar {
    pub child: Child,
    pub port: u16,
}

impl Sidecar {
    /// Starts `leasehold serve --store STORE --holder HOLDER` and waits until it listens.
    pub fn start(store: &str, holder: &str) -> Self {
        Self::start_with(store, holder, &[])
    }

    /// [`start`](Self::start) with more flags.
    pub fn start_with(store: &str, holder: &str, flags: &[&str]) -> Self {
        let port = free_port();
        let child = Command::new(BIN)
            .args(["serve", "--store", store, "--holder", holder])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start leasehold serve");
        let sidecar = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "sidecar did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        sidecar
    }

    /// A POST with a JSON body: the status and the JSON answer.
    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        http(self.port, "POST", path, Some(body))
    }

    pub fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// Waits (at most `limit`) for the process to exit; its status.
    pub fn wait(&mut self, limit: Duration) -> i32 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "sidecar did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange with `Connection: close` naming `host`: the status and the JSON body.
pub fn exchange(
    mut stream: impl Read + Write,
    host: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// One exchange on a new TCP connection to `port`.
pub fn http(port: u16, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    exchange(
        TcpStream::connect(("127.0.0.1", port)).unwrap(),
        &format!("127.0.0.1:{port}"),
        method,
        path,
        body,
    )
}
