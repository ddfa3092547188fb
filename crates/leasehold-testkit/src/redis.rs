//! A redis-server of a test's own (`leasehold_servers::RedisServer`), and `redis-cli` against
//! any port.

use leasehold_servers::{Readiness, RedisServer};

/// `redis-cli -h 127.0.0.1 -p port args…`, its standard output.
pub fn cli(port: u16, args: &[&str]) -> String {
    leasehold_servers::redis_cli(port, None, args).unwrap_or_else(|e| panic!("{e}"))
}

/// A redis-server of the test's own on loopback, persisting nothing, its working directory a
/// temp dir of its own; killed on drop.
pub struct OwnRedis {
    /// The port it listens on (its TLS port, when the extra arguments say so).
    pub port: u16,
    server: RedisServer,
}

impl OwnRedis {
    /// Starts one on a free port, with `extra` arguments after the defaults (`{port}` in them
    /// stands for the chosen port).
    pub fn start(extra: &[&str]) -> Self {
        Self::start_on(crate::free_port(), extra)
    }

    /// [`start`](Self::start) on a given port. A server given `--tls-port` counts as started
    /// once it accepts connections (its port speaks only TLS), any other once it answers PING.
    pub fn start_on(port: u16, extra: &[&str]) -> Self {
        let readiness = if extra.contains(&"--tls-port") {
            Readiness::Accepting
        } else {
            Readiness::Ping
        };
        let server = RedisServer::builder()
            .port(port)
            .args(extra.iter().map(|s| s.replace("{port}", &port.to_string())))
            .readiness(readiness)
            .start()
            .unwrap_or_else(|e| panic!("{e}"));
        Self { port, server }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Kills the server (SIGKILL, so nothing is saved) and waits for it to exit.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Kills it and starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.server.restart().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Runs `redis-cli` against it and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}
