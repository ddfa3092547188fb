//! A Sentinel group of one's own: a primary, a replica and three sentinels (quorum 2), and its
//! failover.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;

use crate::dir::ServerDir;
use crate::error::{Error, Result};
use crate::port::free_ports;
use crate::process::{Process, wait_until};
use crate::redis::{NodeSpec, Readiness, RedisNode, cli};

/// How long a group may take to get in sync, or to promote its replica.
const LIMIT: Duration = Duration::from_secs(30);
/// How often the waits ask (each question is a `redis-cli` run).
const EVERY: Duration = Duration::from_millis(50);

/// How to start a [`SentinelGroup`]: `SentinelGroup::builder().start()`.
#[derive(Debug, Clone)]
pub struct SentinelBuilder {
    program: PathBuf,
    master: String,
    down_after: Duration,
    sentinel_password: Option<String>,
    data_password: Option<String>,
    files: Option<PathBuf>,
}

impl Default for SentinelBuilder {
    fn default() -> Self {
        Self {
            program: "redis-server".into(),
            master: "leasemaster".into(),
            down_after: Duration::from_secs(2),
            sentinel_password: None,
            data_password: None,
            files: None,
        }
    }
}

impl SentinelBuilder {
    /// The server program; the sentinels run it with `--sentinel` [default: `redis-server` on
    /// `PATH`].
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = program.into();
        self
    }

    /// The name the sentinels monitor the primary under [default: `leasemaster`].
    pub fn master(mut self, name: impl Into<String>) -> Self {
        self.master = name.into();
        self
    }

    /// How long a primary may not answer before the sentinels fail over
    /// (`down-after-milliseconds`) [default: 2 s]. Short settings fail over a live primary
    /// that stalls on a loaded machine: a split brain in which both accept writes until the
    /// sentinels reconfigure the old one.
    pub fn down_after(mut self, down_after: Duration) -> Self {
        self.down_after = down_after;
        self
    }

    /// The sentinels' `requirepass` (and `sentinel sentinel-pass`, so they still talk to each
    /// other).
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_password = Some(password.into());
        self
    }

    /// The primary's and the replica's `requirepass` and `masterauth` (the sentinels are told
    /// it with `sentinel auth-pass`).
    pub fn data_password(mut self, password: impl Into<String>) -> Self {
        self.data_password = Some(password.into());
        self
    }

    /// Where the servers' working directories, the sentinels' config files and the logs go,
    /// to be kept [default: the group's directory under the system temp dir, removed with it].
    pub fn files_in(mut self, dir: impl Into<PathBuf>) -> Self {
        self.files = Some(dir.into());
        self
    }

    /// Starts the group and waits until the replica is in sync and every sentinel knows it and
    /// the two other sentinels, so a failover can happen.
    pub fn start(self) -> Result<SentinelGroup> {
        let dir = ServerDir::new("sentinel")?;
        let files = self.files.clone().unwrap_or_else(|| dir.path().to_owned());
        let ports = free_ports(5)?;
        let data_auth = data_auth(self.data_password.as_deref());
        let spec = |name: &str, port: u16, args: Vec<String>| -> Result<NodeSpec> {
            Ok(NodeSpec {
                program: self.program.clone(),
                port,
                work: dir.subdir(Some(&files), name)?,
                log: files.join(format!("{name}.log")),
                leading: Vec::new(),
                args,
                readiness: Readiness::Ping,
            })
        };
        let primary = RedisNode::start(spec("redis-a", ports[0], data_auth.clone())?, &dir)?;
        let mut replica_args = replica_of(ports[0]);
        replica_args.extend(data_auth.iter().cloned());
        let replica = RedisNode::start(spec("redis-b", ports[1], replica_args)?, &dir)?;
        let mut sentinels = Vec::new();
        for (i, &port) in ports[2..].iter().enumerate() {
            let conf = files.join(format!("sentinel-{i}.conf"));
            std::fs::write(&conf, self.sentinel_conf(ports[0]))
                .map_err(|e| Error::io(format!("cannot write {}", conf.display()), e))?;
            let mut spec = spec(&format!("sentinel-{i}"), port, Vec::new())?;
            spec.leading = vec![conf.display().to_string(), "--sentinel".into()];
            sentinels.push(RedisNode::start(spec, &dir)?);
        }
        let mut group = SentinelGroup {
            nodes: [primary, replica],
            primary: 0,
            sentinels,
            master: self.master,
            sentinel_password: self.sentinel_password,
            data_password: self.data_password,
            dir,
        };
        group.wait_ready()?;
        Ok(group)
    }

    fn sentinel_conf(&self, primary: u16) -> String {
        let m = &self.master;
        let mut conf = format!(
            "sentinel monitor {m} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {m} {}\n\
             sentinel failover-timeout {m} 5000\n\
             sentinel parallel-syncs {m} 1\n",
            self.down_after.as_millis()
        );
        if let Some(pw) = &self.sentinel_password {
            conf += &format!("requirepass {pw}\nsentinel sentinel-pass {pw}\n");
        }
        if let Some(pw) = &self.data_password {
            conf += &format!("sentinel auth-pass {m} {pw}\n");
        }
        conf
    }
}

/// `--requirepass PW --masterauth PW` for a data server, or nothing.
fn data_auth(password: Option<&str>) -> Vec<String> {
    password.map_or_else(Vec::new, |pw| {
        ["--requirepass", pw, "--masterauth", pw]
            .map(String::from)
            .to_vec()
    })
}

/// `--replicaof 127.0.0.1 PORT`.
fn replica_of(port: u16) -> Vec<String> {
    vec!["--replicaof".into(), "127.0.0.1".into(), port.to_string()]
}

/// A primary, a replica and three sentinels (quorum 2) of one's own on loopback, persisting
/// nothing; killed on drop, their directory removed (see [`SentinelBuilder::files_in`]).
#[derive(Debug)]
pub struct SentinelGroup {
    /// The two data servers; `primary` indexes the current primary.
    nodes: [RedisNode; 2],
    primary: usize,
    sentinels: Vec<RedisNode>,
    master: String,
    sentinel_password: Option<String>,
    data_password: Option<String>,
    // Last: removed once the servers are stopped.
    dir: ServerDir,
}

impl SentinelGroup {
    /// How to start one.
    pub fn builder() -> SentinelBuilder {
        SentinelBuilder::default()
    }

    /// The `redis+sentinel://` URL naming every sentinel.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports()
            .iter()
            .map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, *p)).to_string())
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.master)
    }

    /// The port of the current primary (as this group last made it).
    pub fn primary_port(&self) -> u16 {
        self.nodes[self.primary].port()
    }

    /// The port of the current replica.
    pub fn replica_port(&self) -> u16 {
        self.nodes[1 - self.primary].port()
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(RedisNode::port).collect()
    }

    /// The directory the group removes when dropped.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The replica is in sync and every sentinel monitors the primary as a primary, with the
    /// replica and the two other sentinels.
    fn wait_ready(&mut self) -> Result<()> {
        let replica = self.replica_port();
        let password = self.data_password.clone();
        let [a, b] = &mut self.nodes;
        wait_until(
            "redis-sentinel group: replica sync",
            LIMIT,
            EVERY,
            &mut [a.process(), b.process()],
            || {
                cli(replica, password.as_deref(), &["INFO", "replication"])
                    .contains("master_link_status:up")
            },
        )?;
        let ports = self.sentinel_ports();
        let (master, password) = (self.master.clone(), self.sentinel_password.clone());
        let mut watched: Vec<&mut Process> =
            self.sentinels.iter_mut().map(RedisNode::process).collect();
        wait_until(
            "redis-sentinel group: sentinel discovery",
            LIMIT,
            EVERY,
            &mut watched,
            || {
                ports.iter().all(|&port| {
                    let info = cli(port, password.as_deref(), &["SENTINEL", "MASTER", &master]);
                    let lines: Vec<&str> = info.lines().collect();
                    let field = |name: &str| {
                        let at = lines.iter().position(|l| *l == name)?;
                        lines.get(at + 1).copied()
                    };
                    field("num-slaves") == Some("1")
                        && field("num-other-sentinels") == Some("2")
                        && field("flags") == Some("master")
                })
            },
        )
    }

    /// The port of the primary a sentinel names now.
    pub fn named_primary(&self) -> Option<u16> {
        let args = ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master.as_str()];
        self.sentinel_ports().into_iter().find_map(|port| {
            cli(port, self.sentinel_password.as_deref(), &args)
                .lines()
                .nth(1)
                .and_then(|p| p.trim().parse().ok())
        })
    }

    /// SIGKILLs the primary (the sentinels then fail over; see [`fail_over`](Self::fail_over)
    /// for the whole of it).
    pub fn kill_primary(&mut self) {
        self.nodes[self.primary].kill();
    }

    /// Freezes the replica (SIGSTOP), so it stops receiving the primary's writes.
    pub fn freeze_replica(&self) {
        self.nodes[1 - self.primary].signal(Signal::SIGSTOP);
    }

    /// Lets the frozen replica run again (SIGCONT).
    pub fn thaw_replica(&self) {
        self.nodes[1 - self.primary].signal(Signal::SIGCONT);
    }

    /// SIGKILLs the primary, waits until a sentinel names the replica as primary and it answers
    /// as one, then restarts the killed server as its replica and waits until the group could
    /// fail over again. Returns when the primary was killed and when the replica was promoted.
    pub fn fail_over(&mut self) -> Result<(SystemTime, SystemTime)> {
        let old = self.primary;
        let new_port = self.nodes[1 - old].port();
        let killed = SystemTime::now();
        self.kill_primary();
        let (sentinel, password) = (self.sentinels[0].port(), self.sentinel_password.clone());
        let data_password = self.data_password.clone();
        let master = self.master.clone();
        wait_until(
            "redis-sentinel group: promotion",
            LIMIT,
            EVERY,
            &mut [self.sentinels[0].process()],
            || {
                let args = ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", master.as_str()];
                let named = cli(sentinel, password.as_deref(), &args);
                named.lines().nth(1).map(str::trim) == Some(&new_port.to_string())
                    && cli(new_port, data_password.as_deref(), &["ROLE"]).starts_with("master")
            },
        )?;
        let promoted = SystemTime::now();
        self.primary = 1 - old;
        let mut args = replica_of(new_port);
        args.extend(data_auth(self.data_password.as_deref()));
        self.nodes[old].respawn(&self.dir, Some(args))?;
        self.wait_ready()?;
        Ok((killed, promoted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs redis-server and redis-cli. A failover with passwords on both sides: the replica
    /// is promoted and the killed primary comes back as its replica.
    #[test]
    fn a_failover_promotes_the_replica_and_the_old_primary_rejoins() {
        let mut group = SentinelGroup::builder()
            .sentinel_password("s3ntinel")
            .data_password("d4ta")
            .start()
            .unwrap();
        let (first, second) = (group.primary_port(), group.replica_port());
        assert_eq!(group.named_primary(), Some(first));
        assert!(group.url().ends_with("/leasemaster"), "{}", group.url());
        let (killed, promoted) = group.fail_over().unwrap();
        assert!(killed <= promoted);
        assert_eq!(group.named_primary(), Some(second));
        assert_eq!(
            (group.primary_port(), group.replica_port()),
            (second, first)
        );
        let role = cli(first, Some("d4ta"), &["ROLE"]);
        assert!(role.starts_with("slave"), "{role}");
        let dir = group.dir().to_owned();
        drop(group);
        assert!(!dir.exists());
    }
}
