//! `--store redis-sentinel`: a primary, a replica and three sentinels (quorum 2) the harness runs
//! itself. Its store-restart fault is a failover: the primary is SIGKILLed, the sentinels promote
//! the replica, and the killed server comes back as the new primary's replica.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{ChaosError, Result};
use crate::procs::{RedisServer, epoch_ms, free_port, redis_cli as cli, wait_until};

/// The name the sentinels monitor the primary under.
const MASTER: &str = "leasehold-chaos";

/// How long a primary may not answer before the sentinels fail over. Not shorter: on a loaded
/// machine (a CI run building and testing beside the harness) a live primary can stall for half
/// a second, and a failover away from a live primary is a split brain in which both accept
/// writes until the sentinels reconfigure the old one, far beyond the window the harness excuses
/// (a 500 ms setting once produced 9 s of it, every slot run twice with equal tokens).
const DOWN_AFTER_MS: u32 = 2000;

/// The group's processes; they are in the watchdog's process group, so a killed harness does
/// not leave them behind.
#[derive(Debug)]
pub struct SentinelGroup {
    /// The two data servers; `primary` indexes the current primary.
    nodes: [RedisServer; 2],
    /// Their working directories (a replica writes the snapshot it receives in its own).
    dirs: [PathBuf; 2],
    primary: usize,
    sentinels: Vec<RedisServer>,
}

/// The arguments of a data server working in `dir`, the replica of `primary` if given.
fn node_args(dir: &Path, primary: Option<u16>) -> Vec<String> {
    let mut args = vec!["--dir".into(), dir.display().to_string()];
    if let Some(port) = primary {
        args.extend(["--replicaof".into(), "127.0.0.1".into(), port.to_string()]);
    }
    args
}

impl SentinelGroup {
    /// Starts the group, its files (logs, sentinel configs) in `dir`, and waits until the
    /// sentinels know the replica and each other, so a failover can happen.
    pub async fn start(program: &Path, dir: &Path, group: i32) -> Result<Self> {
        let log = |name: &str| dir.join(format!("{name}.log"));
        let dirs = [dir.join("redis-a"), dir.join("redis-b")];
        for d in &dirs {
            std::fs::create_dir_all(d)
                .map_err(|e| ChaosError::io(format!("cannot create {}", d.display()), e))?;
        }
        let primary = RedisServer::start_with(
            program,
            &log("redis-a"),
            group,
            free_port()?,
            node_args(&dirs[0], None),
        )
        .await?;
        let replica = RedisServer::start_with(
            program,
            &log("redis-b"),
            group,
            free_port()?,
            node_args(&dirs[1], Some(primary.port())),
        )
        .await?;
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port()?;
            let conf: PathBuf = dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "sentinel monitor {MASTER} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n\
                     sentinel failover-timeout {MASTER} 5000\n",
                    primary.port()
                ),
            )
            .map_err(|e| ChaosError::io(format!("cannot write {}", conf.display()), e))?;
            let args = vec![
                conf.display().to_string(),
                "--sentinel".into(),
                "--dir".into(),
                dir.display().to_string(),
            ];
            sentinels.push(
                RedisServer::start_with(program, &log(&format!("sentinel-{i}")), group, port, args)
                    .await?,
            );
        }
        let me = Self {
            nodes: [primary, replica],
            dirs,
            primary: 0,
            sentinels,
        };
        me.wait_ready().await?;
        Ok(me)
    }

    /// The replica is in sync and every sentinel knows it and the two other sentinels.
    async fn wait_ready(&self) -> Result<()> {
        let replica = self.nodes[1 - self.primary].port();
        wait_until(
            "redis-sentinel group: replica sync",
            Duration::from_secs(20),
            || async move {
                cli(replica, &["INFO", "replication"])
                    .await
                    .contains("master_link_status:up")
            },
        )
        .await?;
        let ports: Vec<u16> = self.sentinels.iter().map(RedisServer::port).collect();
        wait_until(
            "redis-sentinel group: sentinel discovery",
            Duration::from_secs(20),
            || {
                let ports = ports.clone();
                async move {
                    for port in ports {
                        let info = cli(port, &["SENTINEL", "MASTER", MASTER]).await;
                        let lines: Vec<&str> = info.lines().collect();
                        let field = |name: &str| {
                            lines
                                .iter()
                                .position(|l| *l == name)
                                .and_then(|i| lines.get(i + 1).copied())
                        };
                        if field("num-slaves") != Some("1")
                            || field("num-other-sentinels") != Some("2")
                            || field("flags") != Some("master")
                        {
                            return false;
                        }
                    }
                    true
                }
            },
        )
        .await
    }

    /// The store URL.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// SIGKILLs the primary, waits until a sentinel names the replica as primary and it answers
    /// as one, then restarts the killed server as its replica and waits until the group could
    /// fail over again. Returns (killed at, promoted at), ms since the Unix epoch.
    pub async fn fail_over(&mut self) -> Result<(u64, u64)> {
        let old = self.primary;
        let new = 1 - old;
        let new_port = self.nodes[new].port();
        let killed = epoch_ms();
        self.nodes[old].stop().await;
        let sentinel = self.sentinels[0].port();
        wait_until(
            "redis-sentinel group: promotion",
            Duration::from_secs(30),
            || async move {
                let named = cli(sentinel, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]).await;
                named.lines().nth(1).map(str::trim) == Some(&new_port.to_string())
                    && cli(new_port, &["ROLE"]).await.starts_with("master")
            },
        )
        .await?;
        let promoted = epoch_ms();
        self.primary = new;
        let args = node_args(&self.dirs[old], Some(new_port));
        self.nodes[old].respawn_with(args).await?;
        self.wait_ready().await?;
        Ok((killed, promoted))
    }

    /// Stops every process.
    pub async fn stop(&mut self) {
        for s in self.sentinels.iter_mut().chain(self.nodes.iter_mut()) {
            s.stop().await;
        }
    }
}
