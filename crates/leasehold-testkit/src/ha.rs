//! Replicated Redis deployments of a test's own, on loopback: a Sentinel group (primary, one
//! replica, three sentinels) and a six-node Redis Cluster. Data directories live under the
//! system temp dir; everything is killed and removed on drop, and a watchdog process does the
//! same if the test binary dies without dropping them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::redis::{cli, server_args, spawn_server};
use crate::{free_ports, wait_for};

/// Name the sentinels monitor the primary under.
pub const MASTER: &str = "leasemaster";

/// Server processes and their directory, both gone on drop.
struct Processes {
    dir: PathBuf,
    children: Vec<(u16, Child)>,
    watchdog: Option<Child>,
}

impl Processes {
    fn new(kind: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-{kind}-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).expect("a directory under the system temp dir");
        Self {
            dir,
            children: Vec::new(),
            watchdog: None,
        }
    }

    /// Starts `redis-server args…` listening on `port` and waits until it accepts connections.
    fn start(&mut self, port: u16, args: &[String]) {
        self.children.push((port, spawn_server(port, args)));
    }

    /// A shell that waits for this test process to end, then kills the servers and removes the
    /// directory: the cleanup for a test binary killed before its values were dropped.
    fn arm_watchdog(&mut self) {
        if let Some(mut old) = self.watchdog.take() {
            let _ = old.kill();
            let _ = old.wait();
        }
        let pids: Vec<String> = self
            .children
            .iter()
            .map(|(_, c)| c.id().to_string())
            .collect();
        let script = format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; kill -9 {} 2>/dev/null; rm -rf '{}'",
            std::process::id(),
            pids.join(" "),
            self.dir.display()
        );
        self.watchdog = Some(
            Command::new("sh")
                .args(["-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("sh"),
        );
    }

    /// SIGKILLs the server on `port`.
    fn kill(&mut self, port: u16) {
        if let Some((_, child)) = self.children.iter_mut().find(|(p, _)| *p == port) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server on `port`.
    fn signal(&self, port: u16, signal: &str) {
        let (_, child) = self
            .children
            .iter()
            .find(|(p, _)| *p == port)
            .expect("a server on that port");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal}");
    }

    fn subdir(&self, name: &str) -> String {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).expect("a server's directory");
        dir.display().to_string()
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A primary, one replica and three sentinels (quorum 2, primary down after 500 ms).
pub struct SentinelGroup {
    /// The port of the primary it started with.
    pub primary: u16,
    /// The port of the replica.
    pub replica: u16,
    /// The ports of the three sentinels.
    pub sentinels: Vec<u16>,
    /// The sentinels' `requirepass`, if any.
    sentinel_password: Option<String>,
    processes: Processes,
}

/// `-a PASSWORD` for redis-cli (without its warning), or nothing.
fn auth(password: Option<&str>) -> Vec<&str> {
    password.map_or_else(Vec::new, |pw| vec!["--no-auth-warning", "-a", pw])
}

/// `redis-cli` on `port`, authenticating with `password` if given.
fn cli_as(port: u16, password: Option<&str>, args: &[&str]) -> String {
    let mut all = auth(password);
    all.extend(args);
    cli(port, &all)
}

impl SentinelGroup {
    /// Starts a group whose sentinels need no password, and waits until the replica is in
    /// sync and the sentinels know it and each other.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A group whose sentinels require `password` (`requirepass`, and `sentinel sentinel-pass`
    /// so they can still talk to each other).
    pub fn start_with(sentinel_password: Option<&str>) -> Self {
        Self::start_with_passwords(sentinel_password, None)
    }

    /// A group whose sentinels require `sentinel_password` and whose primary and replica
    /// require `data_password` (`requirepass` and `masterauth`; the sentinels are told it with
    /// `sentinel auth-pass`).
    pub fn start_with_passwords(
        sentinel_password: Option<&str>,
        data_password: Option<&str>,
    ) -> Self {
        let ports = free_ports(5);
        let (primary, replica, sentinels) = (ports[0], ports[1], ports[2..].to_vec());
        let mut processes = Processes::new("sentinel");
        let data_auth: Vec<String> = data_password.map_or_else(Vec::new, |pw| {
            ["--requirepass", pw, "--masterauth", pw]
                .map(String::from)
                .to_vec()
        });
        let dir = processes.subdir("primary");
        let mut args = server_args(primary, &dir);
        args.extend(data_auth.iter().cloned());
        processes.start(primary, &args);
        let dir = processes.subdir("replica");
        let mut args = server_args(replica, &dir);
        args.extend(["--replicaof", "127.0.0.1", &primary.to_string()].map(String::from));
        args.extend(data_auth);
        processes.start(replica, &args);
        for &port in &sentinels {
            let dir = processes.subdir(&format!("sentinel-{port}"));
            let conf = Path::new(&dir).join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {MASTER} 500\n\
                     sentinel failover-timeout {MASTER} 5000\n\
                     sentinel parallel-syncs {MASTER} 1\n{}{}",
                    sentinel_password.map_or(String::new(), |pw| format!(
                        "requirepass {pw}\nsentinel sentinel-pass {pw}\n"
                    )),
                    data_password.map_or(String::new(), |pw| format!(
                        "sentinel auth-pass {MASTER} {pw}\n"
                    ))
                ),
            )
            .expect("the sentinel's config file");
            processes.start(port, &[conf.display().to_string(), "--sentinel".into()]);
        }
        processes.arm_watchdog();
        wait_for("the replica in sync", Duration::from_secs(10), || {
            cli_as(replica, data_password, &["INFO", "replication"])
                .contains("master_link_status:up")
        });
        // A failover needs the sentinels to know the replica and each other (hello messages
        // go out every 2 s).
        wait_for(
            "the sentinels to see the replica and each other",
            Duration::from_secs(15),
            || {
                sentinels.iter().all(|&s| {
                    let info = cli_as(s, sentinel_password, &["SENTINEL", "MASTER", MASTER]);
                    let lines: Vec<&str> = info.lines().collect();
                    let field = |name: &str| {
                        lines
                            .iter()
                            .position(|l| *l == name)
                            .and_then(|i| lines.get(i + 1).copied())
                    };
                    field("num-slaves") == Some("1") && field("num-other-sentinels") == Some("2")
                })
            },
        );
        Self {
            primary,
            replica,
            sentinels,
            sentinel_password: sentinel_password.map(str::to_owned),
            processes,
        }
    }

    /// `redis+sentinel://` URL naming every sentinel.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// SIGKILLs the primary.
    pub fn kill_primary(&mut self) {
        let primary = self.primary;
        self.processes.kill(primary);
    }

    /// Freezes the replica (SIGSTOP), so it stops receiving the primary's writes.
    pub fn freeze_replica(&self) {
        self.processes.signal(self.replica, "STOP");
    }

    /// Lets the frozen replica run again (SIGCONT).
    pub fn thaw_replica(&self) {
        self.processes.signal(self.replica, "CONT");
    }

    /// The port of the primary a sentinel names now.
    pub fn named_primary(&self) -> Option<u16> {
        let args = ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER];
        self.sentinels.iter().find_map(|&s| {
            cli_as(s, self.sentinel_password.as_deref(), &args)
                .lines()
                .nth(1)
                .and_then(|p| p.trim().parse().ok())
        })
    }
}

/// Six nodes, three primaries with one replica each.
pub struct Cluster {
    /// The nodes' client ports.
    pub ports: Vec<u16>,
    /// The nodes' `requirepass`, if any.
    password: Option<String>,
    processes: Processes,
}

impl Cluster {
    /// Starts the nodes, creates the cluster with `redis-cli --cluster create` and waits until
    /// every node reports `cluster_state:ok`.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A cluster whose nodes require `password` (`requirepass`, and `masterauth` so replicas
    /// can sync).
    pub fn start_with(password: Option<&str>) -> Self {
        let all = free_ports(12);
        let (ports, bus) = (all[..6].to_vec(), all[6..].to_vec());
        let mut processes = Processes::new("cluster");
        for (&port, &bus) in ports.iter().zip(&bus) {
            let dir = processes.subdir(&format!("node-{port}"));
            let mut args = server_args(port, &dir);
            args.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus.to_string(),
                    "--cluster-config-file",
                    &format!("{dir}/nodes.conf"),
                    "--cluster-node-timeout",
                    "1000",
                ]
                .map(String::from),
            );
            if let Some(pw) = password {
                args.extend(["--requirepass", pw, "--masterauth", pw].map(String::from));
            }
            processes.start(port, &args);
        }
        processes.arm_watchdog();
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(auth(password))
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli on PATH");
        let log = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && log.contains("All 16384 slots covered"),
            "cluster create failed: {log}"
        );
        wait_for(
            "every node to report cluster_state:ok",
            Duration::from_secs(15),
            || {
                ports.iter().all(|&p| {
                    cli_as(p, password, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
                })
            },
        );
        Self {
            ports,
            password: password.map(str::to_owned),
            processes,
        }
    }

    fn cli(&self, port: u16, args: &[&str]) -> String {
        cli_as(port, self.password.as_deref(), args)
    }

    /// Waits until every replica has synced: one that never did refuses to fail over
    /// ("disconnected from master for longer than allowed").
    pub fn wait_for_replicas(&self) {
        wait_for("every replica in sync", Duration::from_secs(15), || {
            self.ports.iter().all(|&p| {
                let info = self.cli(p, &["INFO", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        });
    }

    /// `redis+cluster://` URL with two seed nodes.
    pub fn url(&self) -> String {
        // Two seeds are enough: the client learns the rest from them.
        format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
            self.ports[0], self.ports[3]
        )
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        self.processes.kill(port);
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &str) -> u16 {
        let slot = self.cli(self.ports[0], &["CLUSTER", "KEYSLOT", key]);
        slot.trim().parse().expect("a slot number")
    }

    /// The nodes that answer `GET key` with its value (the others redirect).
    pub fn nodes_holding(&self, key: &str) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|&p| {
                let reply = self.cli(p, &["GET", key]);
                !reply.trim().is_empty() && !reply.contains("MOVED")
            })
            .collect()
    }
}
