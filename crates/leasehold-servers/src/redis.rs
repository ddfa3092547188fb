//! `redis-server` of one's own: one on its own ([`RedisServer`]), or a node of a
//! [`SentinelGroup`](crate::SentinelGroup) or [`RedisCluster`](crate::RedisCluster); and
//! `redis-cli` against any of them.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::dir::{ServerDir, Stop};
use crate::error::{Error, Result};
use crate::port::free_port;
use crate::process::{Process, wait_until};

/// How long a redis-server may take to answer after it starts.
const READY_LIMIT: Duration = Duration::from_secs(10);

/// When a redis-server counts as started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Readiness {
    /// It answers `PING` on its port (`+PONG`, or `-NOAUTH` from a server that wants a
    /// password: it reads commands either way).
    #[default]
    Ping,
    /// It accepts connections on its port: for a port that speaks only TLS.
    Accepting,
}

/// `redis-cli -h 127.0.0.1 -p PORT [-a PASSWORD] ARGS…`: its standard output. An error if
/// `redis-cli` cannot run.
pub fn redis_cli(port: u16, password: Option<&str>, args: &[&str]) -> Result<String> {
    let mut command = Command::new("redis-cli");
    command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(password) = password {
        command.args(["--no-auth-warning", "-a", password]);
    }
    let out = command
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| Error::spawn("redis-cli", " (is Redis installed?)", e))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`redis_cli`] for a poll: empty if `redis-cli` cannot run (the wait then times out).
pub(crate) fn cli(port: u16, password: Option<&str>, args: &[&str]) -> String {
    redis_cli(port, password, args).unwrap_or_default()
}

/// Whether the server on `port` is ready by `readiness`.
fn ready(port: u16, readiness: Readiness) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let limit = Duration::from_millis(500);
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, limit) else {
        return false;
    };
    if readiness == Readiness::Accepting {
        return true;
    }
    let mut reply = [0u8; 7];
    let answered = stream.set_read_timeout(Some(limit)).is_ok()
        && stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok();
    answered && (&reply == b"+PONG\r\n" || &reply == b"-NOAUTH")
}

/// How to start one redis-server.
#[derive(Debug, Clone)]
pub(crate) struct NodeSpec {
    pub(crate) program: PathBuf,
    pub(crate) port: u16,
    /// Its working directory (`--dir`).
    pub(crate) work: PathBuf,
    pub(crate) log: PathBuf,
    /// Before the defaults: a sentinel's config file and `--sentinel`.
    pub(crate) leading: Vec<String>,
    /// After the defaults, so they may override them.
    pub(crate) args: Vec<String>,
    pub(crate) readiness: Readiness,
}

/// One redis-server, listening on loopback only, persisting nothing; SIGKILLed on drop. Its
/// owner holds the [`ServerDir`] it is listed in.
#[derive(Debug)]
pub(crate) struct RedisNode {
    process: Process,
    spec: NodeSpec,
}

impl RedisNode {
    /// Starts it and waits until it is ready.
    pub(crate) fn start(spec: NodeSpec, dir: &ServerDir) -> Result<Self> {
        let mut node = Self {
            process: Process::new("redis-server", spec.log.clone()),
            spec,
        };
        node.spawn(dir)?;
        Ok(node)
    }

    pub(crate) fn port(&self) -> u16 {
        self.spec.port
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    pub(crate) fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    fn spawn(&mut self, dir: &ServerDir) -> Result<()> {
        let s = &self.spec;
        let mut command = Command::new(&s.program);
        command
            .args(&s.leading)
            .args(["--port", &s.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&s.work)
            .args(["--save", "", "--appendonly", "no"])
            .args(&s.args)
            .current_dir(&s.work);
        self.process
            .spawn(command, dir, Stop::Kill, " (is Redis installed?)")?;
        let (port, readiness) = (s.port, s.readiness);
        let what = match readiness {
            Readiness::Ping => format!("redis-server on 127.0.0.1:{port} answering PING"),
            Readiness::Accepting => {
                format!("redis-server on 127.0.0.1:{port} accepting connections")
            }
        };
        wait_until(
            &what,
            READY_LIMIT,
            Duration::from_millis(20),
            &mut [&mut self.process],
            || ready(port, readiness),
        )
    }

    /// SIGKILL: it forgets everything.
    pub(crate) fn kill(&mut self) {
        self.process.kill();
    }

    /// Sends `sig` (`SIGSTOP`, `SIGCONT`).
    pub(crate) fn signal(&self, sig: Signal) -> bool {
        self.process.signal(sig)
    }

    /// Kills it (if it runs) and starts it again on its port, with `args` instead of its former
    /// further arguments if given.
    pub(crate) fn respawn(&mut self, dir: &ServerDir, args: Option<Vec<String>>) -> Result<()> {
        self.kill();
        if let Some(args) = args {
            self.spec.args = args;
        }
        self.spawn(dir)
    }
}

/// A redis-server of one's own on a loopback port, persisting nothing, its working directory
/// (and its log, unless given elsewhere) in a directory of its own under the system temp dir;
/// SIGKILLed on drop (or by the directory's watchdog, should this process die first).
#[derive(Debug)]
pub struct RedisServer {
    node: RedisNode,
    // Last: removed once the server is stopped.
    dir: ServerDir,
}

/// How to start a [`RedisServer`]: `RedisServer::builder().args([…]).start()`.
#[derive(Debug, Clone, Default)]
pub struct RedisBuilder {
    program: Option<PathBuf>,
    port: Option<u16>,
    args: Vec<String>,
    log: Option<PathBuf>,
    readiness: Readiness,
}

impl RedisBuilder {
    /// The server program [default: `redis-server` on `PATH`].
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = Some(program.into());
        self
    }

    /// Its port [default: a [free one](crate::free_port)].
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Arguments after the defaults (`--port P --bind 127.0.0.1 --dir D --save "" --appendonly
    /// no`), which they may override.
    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Where its output goes, appended [default: `redis-server.log` in its directory].
    pub fn log(mut self, log: impl Into<PathBuf>) -> Self {
        self.log = Some(log.into());
        self
    }

    /// When it counts as started [default: [`Readiness::Ping`]].
    pub fn readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// Starts it and waits until it is ready.
    pub fn start(self) -> Result<RedisServer> {
        let dir = ServerDir::new("redis")?;
        let spec = NodeSpec {
            program: self.program.unwrap_or_else(|| "redis-server".into()),
            port: match self.port {
                Some(port) => port,
                None => free_port()?,
            },
            work: dir.path().to_owned(),
            log: self
                .log
                .unwrap_or_else(|| dir.path().join("redis-server.log")),
            leading: Vec::new(),
            args: self.args,
            readiness: self.readiness,
        };
        let node = RedisNode::start(spec, &dir)?;
        Ok(RedisServer { node, dir })
    }
}

impl RedisServer {
    /// How to start one.
    pub fn builder() -> RedisBuilder {
        RedisBuilder::default()
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.node.port()
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port()))
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// Its pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.node.pid()
    }

    /// Its directory (its working directory, and its log unless given elsewhere).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGKILLs it (nothing is saved) and waits for it to end.
    pub fn kill(&mut self) {
        self.node.kill();
    }

    /// Kills it if it runs and starts it again on the same port, empty.
    pub fn restart(&mut self) -> Result<()> {
        self.node.respawn(&self.dir, None)
    }

    /// `redis-cli` against it: its output.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        redis_cli(self.port(), None, args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pid::finished;

    /// Needs redis-server and redis-cli (scripts/stores.sh installs them).
    #[test]
    fn a_server_restarts_empty_on_its_port_and_leaves_nothing_behind() {
        let mut server = RedisServer::builder()
            .args(["--requirepass", "pw"])
            .start()
            .unwrap();
        let port = server.port();
        let auth = |args: &[&str]| redis_cli(port, Some("pw"), args).unwrap();
        assert_eq!(auth(&["SET", "k", "v"]).trim(), "OK");
        let first = server.pid().unwrap();
        server.restart().unwrap();
        assert!(finished(first));
        assert_eq!(server.port(), port);
        assert_eq!(auth(&["EXISTS", "k"]).trim(), "0");
        let dir = server.dir().to_owned();
        let pids = std::fs::read_to_string(dir.join("pids")).unwrap();
        assert_eq!(pids.lines().count(), 2, "{pids}");
        assert!(dir.join("redis-server.log").exists());
        let pid = server.pid().unwrap();
        drop(server);
        assert!(finished(pid));
        assert!(!dir.exists());
    }

    /// A server that cannot start says why, quoting its log, at once.
    #[test]
    fn a_server_that_exits_is_reported_with_its_log() {
        let err = RedisServer::builder()
            .args(["--no-such-option", "x"])
            .start()
            .unwrap_err();
        let said = err.to_string();
        assert!(said.starts_with("redis-server: exited with"), "{said}");
        assert!(said.contains("no-such-option"), "{said}");
    }
}
