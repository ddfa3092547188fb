//! etcd clusters of one's own: members are `etcd` processes (Debian's `etcd-server`;
//! `scripts/stores.sh` installs it, and `etcdctl` from `etcd-client`) on free loopback ports,
//! with their data on disk in the cluster's directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::dir::{ServerDir, Stop};
use crate::error::{Error, Result};
use crate::port::free_ports;
use crate::process::{Process, wait_until};

const SERVER: &str = "etcd";
/// How long a new cluster may take to elect a leader.
const HEALTHY_WITHIN: Duration = Duration::from_secs(30);

/// PEM files for a cluster that serves clients over TLS ([`EtcdCluster::start_tls`]).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The members' certificate (valid for `127.0.0.1`).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA that signed it: what `etcdctl` and [`EtcdCluster::url`] trust.
    pub ca: PathBuf,
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Process,
}

/// A running etcd cluster of one's own; its members are killed and its directory removed on
/// drop.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    /// `--initial-cluster` and `--initial-cluster-token`, for (re)starting members.
    initial_cluster: String,
    cluster_token: String,
    /// Serving clients over TLS with these files (the peers still talk plain HTTP).
    tls: Option<TlsFiles>,
    // Last: removed once the members are stopped.
    dir: ServerDir,
}

/// `Ok` if `program` is an executable file in a directory of `path` (a `PATH` value), else what
/// is missing and where to get it.
fn find_program(
    program: &str,
    package: &str,
    path: Option<std::ffi::OsString>,
) -> std::result::Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let found = path.iter().flat_map(std::env::split_paths).any(|dir| {
        std::fs::metadata(dir.join(program))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    });
    if found {
        return Ok(());
    }
    Err(format!(
        "{program} is not on PATH: etcd test clusters need etcd and etcdctl (Debian packages \
         etcd-server and etcd-client; scripts/stores.sh installs them, or \
         `apt-get install {package}`)"
    ))
}

/// `etcdctl` against `endpoints` (`127.0.0.1:PORT`), trusting the CA of a TLS cluster.
fn etcdctl_at(tls: Option<&TlsFiles>, endpoints: &[String]) -> Command {
    let mut command = Command::new("etcdctl");
    command.env("ETCDCTL_API", "3");
    let scheme = match tls {
        None => "http",
        Some(tls) => {
            command.arg(format!("--cacert={}", tls.ca.display()));
            "https"
        }
    };
    let endpoints: Vec<String> = endpoints
        .iter()
        .map(|e| format!("{scheme}://{e}"))
        .collect();
    command.arg(format!("--endpoints={}", endpoints.join(",")));
    command
}

/// Whether every one of `endpoints` answers etcd's health check (a leader is elected and
/// commits).
fn healthy(tls: Option<&TlsFiles>, endpoints: &[String]) -> bool {
    etcdctl_at(tls, endpoints)
        .args(["--dial-timeout=1s", "--command-timeout=2s"])
        .args(["endpoint", "health"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl EtcdCluster {
    /// Starts `size` members (1 or 3 are usual) and waits until every member answers a
    /// linearizable read (a leader is elected), for at most 30 s.
    pub fn start(size: usize) -> Result<Self> {
        Self::start_with(size, None)
    }

    /// [`start`](Self::start), the members serving clients over TLS only (`https://`, with
    /// `--cert-file` and `--key-file`); [`url`](Self::url) is then an `etcds://` URL trusting
    /// `tls.ca`.
    pub fn start_tls(size: usize, tls: TlsFiles) -> Result<Self> {
        Self::start_with(size, Some(tls))
    }

    fn start_with(size: usize, tls: Option<TlsFiles>) -> Result<Self> {
        // Without etcdctl the health check below could only time out after 30 s.
        for (program, package) in [("etcd", "etcd-server"), ("etcdctl", "etcd-client")] {
            find_program(program, package, std::env::var_os("PATH"))
                .map_err(|missing| Error::server(SERVER, missing))?;
        }
        let dir = ServerDir::new(SERVER)?;
        let ports = free_ports(size * 2)?;
        let members: Vec<Member> = ports
            .chunks(2)
            .enumerate()
            .map(|(i, pair)| {
                let name = format!("m{i}");
                Member {
                    process: Process::new(SERVER, dir.path().join(format!("{name}.log"))),
                    name,
                    client_port: pair[0],
                    peer_port: pair[1],
                }
            })
            .collect();
        let initial: Vec<String> = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let mut cluster = Self {
            members,
            initial_cluster: initial.join(","),
            cluster_token: format!("lh-{:016x}", fastrand::u64(..)),
            tls,
            dir,
        };
        for index in 0..size {
            cluster.restart(index)?;
        }
        let (tls, endpoints) = (cluster.tls.clone(), cluster.endpoints());
        let mut watched: Vec<&mut Process> =
            cluster.members.iter_mut().map(|m| &mut m.process).collect();
        wait_until(
            "etcd cluster healthy",
            HEALTHY_WITHIN,
            Duration::from_millis(100),
            &mut watched,
            || healthy(tls.as_ref(), &endpoints),
        )?;
        Ok(cluster)
    }

    /// Client endpoints, `127.0.0.1:PORT`, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// `etcd://` URL of every member, in member order (`etcds://…?ca=CA` for a TLS cluster).
    pub fn url(&self) -> String {
        self.url_of(&self.endpoints())
    }

    /// `etcd://` URL with member `first` first (the client talks to it first).
    pub fn url_starting_at(&self, first: usize) -> String {
        let mut endpoints = self.endpoints();
        let n = endpoints.len().max(1);
        endpoints.rotate_left(first % n);
        self.url_of(&endpoints)
    }

    fn url_of(&self, endpoints: &[String]) -> String {
        match &self.tls {
            None => format!("etcd://{}", endpoints.join(",")),
            Some(tls) => format!("etcds://{}?ca={}", endpoints.join(","), tls.ca.display()),
        }
    }

    /// The index of the member that is the raft leader now, asked with `etcdctl endpoint
    /// status`; `None` when the live members report no leader.
    pub fn leader(&self) -> Option<usize> {
        let live: Vec<(usize, String)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.process.pid().is_some())
            .map(|(i, m)| (i, format!("127.0.0.1:{}", m.client_port)))
            .collect();
        let joined: Vec<String> = live.iter().map(|(_, e)| e.clone()).collect();
        let out = etcdctl_at(self.tls.as_ref(), &joined)
            .args(["--dial-timeout=1s", "--command-timeout=2s"])
            .args(["endpoint", "status", "-w", "json"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let statuses: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        statuses.as_array()?.iter().find_map(|s| {
            let status = s.get("Status")?;
            let me = status.get("header")?.get("member_id")?.as_u64()?;
            let leader = status.get("leader")?.as_u64()?;
            let endpoint = s.get("Endpoint")?.as_str()?;
            (me == leader).then(|| {
                live.iter()
                    .find(|(_, e)| endpoint.ends_with(e.as_str()))
                    .map(|(i, _)| *i)
            })?
        })
    }

    /// Waits up to `within` for a leader among the live members.
    pub fn wait_for_leader(&self, within: Duration) -> Option<usize> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(leader) = self.leader() {
                return Some(leader);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `etcdctl` with `args` against every member, as root when `root_password` is given:
    /// its output, or an error with what it said if it failed.
    pub fn etcdctl(&self, root_password: Option<&str>, args: &[&str]) -> Result<String> {
        let mut command = etcdctl_at(self.tls.as_ref(), &self.endpoints());
        command.args(["--dial-timeout=2s", "--command-timeout=5s"]);
        if let Some(password) = root_password {
            command.arg(format!("--user=root:{password}"));
        }
        let out = command
            .args(args)
            .output()
            .map_err(|e| Error::spawn("etcdctl", " (is etcd-client installed?)", e))?;
        if !out.status.success() {
            let problem = format!(
                "etcdctl {} failed ({}): {}",
                args.first().unwrap_or(&""),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return Err(Error::server(SERVER, problem));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Kills member `index` with SIGKILL (as a crash would).
    pub fn kill(&mut self, index: usize) {
        if let Some(member) = self.members.get_mut(index) {
            member.process.kill();
        }
    }

    /// Starts member `index` (again, after [`kill`](Self::kill)) on its ports and its data
    /// directory: a restarted member rejoins with what it had written. Does nothing if it runs
    /// (or there is no such member).
    pub fn restart(&mut self, index: usize) -> Result<()> {
        let Some(member) = self.members.get(index) else {
            return Ok(());
        };
        if member.process.pid().is_some() {
            return Ok(());
        }
        let command = self.member_command(member);
        let member = &mut self.members[index];
        member.process.spawn(
            command,
            &self.dir,
            Stop::Kill,
            " (Debian's etcd-server package; scripts/stores.sh installs it)",
        )
    }

    /// Whether every member answers etcd's health check (a leader is elected and commits).
    pub fn healthy(&self) -> bool {
        healthy(self.tls.as_ref(), &self.endpoints())
    }

    /// Member `index`'s log file.
    pub fn log(&self, index: usize) -> PathBuf {
        self.dir.path().join(format!("m{index}.log"))
    }

    /// The cluster's directory (the members' data and logs), removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn member_command(&self, member: &Member) -> Command {
        let name = &member.name;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cert-file={}", tls.cert.display()))
                .arg(format!("--key-file={}", tls.key.display()));
        }
        command
            .arg(format!("--name={name}"))
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join(name).display()
            ))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg(format!("--initial-cluster-token={}", self.cluster_token))
            // Ignored by a member restarted on its data: it rejoins.
            .arg("--initial-cluster-state=new")
            // Loopback: elect in about half a second rather than the default second or more.
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=500")
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .arg("--log-level=warn")
            // Small: a test writes kilobytes. Fewer raft entries kept in memory between
            // snapshots, one snapshot and one spare WAL file on disk, and an alarm rather than
            // growth past 64 MB.
            .arg("--snapshot-count=1000")
            .arg("--max-snapshots=1")
            .arg("--max-wals=1")
            .arg("--quota-backend-bytes=67108864");
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pid::finished;

    /// A missing program is named with the package that has it, at once (issue 31: without
    /// etcdctl a cluster's start timed out after 30 s with "not healthy").
    #[test]
    fn a_missing_program_is_named_with_its_package() {
        let dir = tempfile::tempdir().unwrap();
        let err = find_program("etcdctl", "etcd-client", Some(dir.path().into())).unwrap_err();
        assert!(err.contains("etcdctl is not on PATH"), "{err}");
        assert!(err.contains("apt-get install etcd-client"), "{err}");
        assert!(err.contains("scripts/stores.sh"), "{err}");
        assert!(find_program("etcdctl", "etcd-client", None).is_err());
        // An executable file of that name is found; a plain file is not.
        let program = dir.path().join("etcdctl");
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        assert!(find_program("etcdctl", "etcd-client", Some(dir.path().into())).is_err());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths(["/nonexistent".into(), dir.path().to_owned()]).unwrap();
        assert_eq!(find_program("etcdctl", "etcd-client", Some(path)), Ok(()));
    }

    /// Needs etcd and etcdctl. A killed member restarts on its data and the cluster is healthy
    /// again; a failed etcdctl says why; dropping the cluster leaves nothing behind.
    #[test]
    fn a_member_restarts_on_its_data_and_the_cluster_leaves_nothing_behind() {
        let mut cluster = EtcdCluster::start(3).unwrap();
        cluster.etcdctl(None, &["put", "k", "v"]).unwrap();
        let leader = cluster.wait_for_leader(Duration::from_secs(10)).unwrap();
        let pid = cluster.members[leader].process.pid().unwrap();
        cluster.kill(leader);
        assert!(finished(pid));
        cluster.restart(leader).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.healthy() {
            assert!(Instant::now() < deadline, "not healthy again");
            std::thread::sleep(Duration::from_millis(100));
        }
        let got = cluster
            .etcdctl(None, &["get", "k", "--print-value-only"])
            .unwrap();
        assert_eq!(got.trim(), "v");
        let err = cluster.etcdctl(None, &["no-such-command"]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("etcd: etcdctl no-such-command failed"),
            "{err}"
        );
        let pids: Vec<u32> = cluster
            .members
            .iter()
            .filter_map(|m| m.process.pid())
            .collect();
        assert_eq!(pids.len(), 3);
        let dir = cluster.dir().to_owned();
        drop(cluster);
        assert!(pids.iter().all(|&p| finished(p)));
        assert!(!dir.exists());
    }
}
