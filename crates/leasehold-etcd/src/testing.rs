//! Throwaway etcd clusters on loopback for tests (feature `testing`): members are `etcd`
//! processes of Debian's `etcd-server` package (`scripts/stores.sh` installs it) on free
//! loopback ports, with data on disk in a directory of their own under the system temp dir
//! (`leasehold-etcd-PID-…`, PID = the owning test process; never `/dev/shm`: each member
//! preallocates 64 MB write-ahead log files, which would sit in memory there).
//!
//! Cleanup, whatever way the test ends:
//! - dropping the [`EtcdCluster`] (a failing test unwinds through the drop too) kills the members
//!   and removes the directory;
//! - a cluster that is never dropped (kept in a static) or whose process dies without unwinding
//!   (exit, SIGKILL, `abort`) is cleaned up by its watchdog: a shell in a process group of its
//!   own that waits for EOF on a pipe only the test process holds, then kills the members and
//!   removes the directory;
//! - should the watchdog die too, the next cluster started removes the directories whose owning
//!   process is gone, and kills members still running in them.

// Test support: a failed expectation here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd cluster of its own.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    /// The watchdog and the write end of its pipe (closed when this process dies).
    watchdog: Option<(Child, ChildStdin)>,
    dir: tempfile::TempDir,
    /// `--initial-cluster` and `--initial-cluster-token`, for (re)starting members.
    initial_cluster: String,
    cluster_token: String,
    /// Serving clients over TLS with these files (the peers still talk plain HTTP).
    tls: Option<TlsFiles>,
}

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
    child: Option<Child>,
}

/// Every cluster directory is named `leasehold-etcd-PID-…`.
const DIR_PREFIX: &str = "leasehold-etcd-";
/// The file in a cluster directory listing its members' pids, one per line.
const PIDS_FILE: &str = "pids";

/// A free loopback port, below the kernel's ephemeral range where it can tell: a member that is
/// killed and restarted binds its ports again, and an ephemeral port may meanwhile have become
/// the source port of some outgoing connection.
fn free_port() -> u16 {
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(0);
    (0..50)
        .filter(|_| ephemeral_from > 20_000)
        .map(|_| fastrand::u16(15_000..ephemeral_from))
        .chain(std::iter::once(0))
        .find_map(|port| TcpListener::bind(("127.0.0.1", port)).ok())
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `Ok` if `program` is an executable file in a directory of `path` (a `PATH` value), else what
/// is missing and where to get it.
fn find_program(
    program: &str,
    package: &str,
    path: Option<std::ffi::OsString>,
) -> Result<(), String> {
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

/// Whether process `pid` runs `etcd` with `dir` on its command line (a recorded pid may have
/// been reused by another process since).
fn is_member_of(pid: &str, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let needle = dir.as_os_str().as_encoded_bytes();
    cmdline.windows(needle.len()).any(|w| w == needle)
}

/// Removes the cluster directories under `base` whose owning process is gone, after killing
/// members still running there. Only where `/proc` tells which processes live.
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    if !Path::new("/proc/self").exists() {
        return;
    }
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        let dir = entry.path();
        let pids = std::fs::read_to_string(dir.join(PIDS_FILE)).unwrap_or_default();
        for pid in pids.lines().filter(|p| is_member_of(p, &dir)) {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

impl EtcdCluster {
    /// Starts `size` members (1 or 3 are usual) and waits until every member answers a
    /// linearizable read (a leader is elected). Panics if they do not within 30 s.
    pub fn start(size: usize) -> Self {
        Self::start_with(size, None)
    }

    /// [`start`](Self::start), the members serving clients over TLS only (`https://`, with
    /// `--cert-file` and `--key-file`); [`url`](Self::url) is then an `etcds://` URL trusting
    /// `tls.ca`.
    pub fn start_tls(size: usize, tls: TlsFiles) -> Self {
        Self::start_with(size, Some(tls))
    }

    fn start_with(size: usize, tls: Option<TlsFiles>) -> Self {
        // Without etcdctl the health check below could only time out after 30 s.
        for (program, package) in [("etcd", "etcd-server"), ("etcdctl", "etcd-client")] {
            if let Err(missing) = find_program(program, package, std::env::var_os("PATH")) {
                panic!("{missing}");
            }
        }
        let base = std::env::temp_dir();
        remove_stale(&base);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir_in(&base)
            .expect("a temporary directory");
        let peers: Vec<(String, u16, u16)> = (0..size)
            .map(|i| (format!("m{i}"), free_port(), free_port()))
            .collect();
        let initial: Vec<String> = peers
            .iter()
            .map(|(name, _, peer)| format!("{name}=http://127.0.0.1:{peer}"))
            .collect();
        let mut cluster = Self {
            members: peers
                .into_iter()
                .map(|(name, client_port, peer_port)| Member {
                    name,
                    client_port,
                    peer_port,
                    child: None,
                })
                .collect(),
            watchdog: None,
            dir,
            initial_cluster: initial.join(","),
            cluster_token: format!("lh-{:016x}", fastrand::u64(..)),
            tls,
        };
        for index in 0..size {
            cluster.restart(index);
        }
        cluster.arm_watchdog();
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
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
        let n = endpoints.len();
        endpoints.rotate_left(first % n);
        self.url_of(&endpoints)
    }

    fn url_of(&self, endpoints: &[String]) -> String {
        match &self.tls {
            None => format!("etcd://{}", endpoints.join(",")),
            Some(tls) => format!("etcds://{}?ca={}", endpoints.join(","), tls.ca.display()),
        }
    }

    /// `etcdctl` against `endpoints` (`127.0.0.1:PORT`), trusting the CA of a TLS cluster.
    fn etcdctl_at(&self, endpoints: &[String]) -> Command {
        let mut command = Command::new("etcdctl");
        command.env("ETCDCTL_API", "3");
        let scheme = match &self.tls {
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

    /// The index of the member that is the raft leader now, asked with `etcdctl endpoint
    /// status`; `None` when the live members report no leader.
    pub fn leader(&self) -> Option<usize> {
        let live: Vec<(usize, String)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.child.is_some())
            .map(|(i, m)| (i, format!("127.0.0.1:{}", m.client_port)))
            .collect();
        let joined: Vec<String> = live.iter().map(|(_, e)| e.clone()).collect();
        let out = self
            .etcdctl_at(&joined)
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

    /// Runs `etcdctl` with `args` against every member, as root when `root_password` is given,
    /// and panics with its output if it fails.
    pub fn etcdctl(&self, root_password: Option<&str>, args: &[&str]) -> String {
        let mut command = self.etcdctl_at(&self.endpoints());
        command.args(["--dial-timeout=2s", "--command-timeout=5s"]);
        if let Some(password) = root_password {
            command.arg(format!("--user=root:{password}"));
        }
        let out = command.args(args).output().expect("etcdctl runs");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
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

    /// Kills member `index` with SIGKILL (as a crash would).
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `index` (again, after [`kill`](Self::kill)) on its ports and its data
    /// directory: a restarted member rejoins with what it had written. Does nothing if it runs.
    pub fn restart(&mut self, index: usize) {
        if self.members[index].child.is_some() {
            return;
        }
        let child = self.spawn_member(&self.members[index]);
        self.note_pid(child.id());
        self.members[index].child = Some(child);
    }

    /// Whether every member answers etcd's health check (a leader is elected and commits).
    pub fn healthy(&self) -> bool {
        self.etcdctl_at(&self.endpoints())
            .args(["--dial-timeout=1s", "--command-timeout=2s"])
            .args(["endpoint", "health"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The member's log file.
    pub fn log(&self, index: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[index].name))
    }

    fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.healthy() {
                return;
            }
            for (i, m) in self.members.iter().enumerate() {
                assert!(m.child.is_some(), "member {i} gone");
            }
            assert!(
                Instant::now() < deadline,
                "etcd cluster not healthy within {within:?}; logs in {}",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Appends a member's pid to the directory's pid file, which the watchdog and a later run's
    /// stale-directory removal read.
    fn note_pid(&self, pid: u32) {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(PIDS_FILE))
            .expect("the cluster's pid file");
        writeln!(file, "{pid}").expect("the cluster's pid file");
    }

    /// Starts the watchdog: once its stdin reaches EOF (this process closed the pipe by dying),
    /// it kills the members listed in the pid file and removes the directory. Its own process
    /// group keeps it alive when a test runner kills the test's group.
    fn arm_watchdog(&mut self) {
        const SCRIPT: &str = r#"d=$1
read -r _
for p in $(cat "$d/pids" 2>/dev/null); do
  grep -qF -- "$d" "/proc/$p/cmdline" 2>/dev/null && kill -9 "$p"
done
rm -rf "$d" 2>/dev/null || { sleep 1; rm -rf "$d"; }"#;
        let mut child = Command::new("sh")
            .args(["-c", SCRIPT, "leasehold-etcd-watchdog"])
            .arg(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("the watchdog shell starts");
        let pipe = child.stdin.take().expect("the watchdog's stdin");
        self.watchdog = Some((child, pipe));
    }
}

impl EtcdCluster {
    fn spawn_member(&self, member: &Member) -> Child {
        let dir = self.dir.path();
        let name = &member.name;
        // Appended to: a restarted member's log follows its earlier life.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))
            .expect("member log file");
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
            .arg(format!("--data-dir={}", dir.join(name).display()))
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
            // Small: a test writes kilobytes. Fewer raft entries kept in memory between snapshots,
            // one snapshot and one spare WAL file on disk, and an alarm rather than growth past 64 MB.
            .arg("--snapshot-count=1000")
            .arg("--max-snapshots=1")
            .arg("--max-wals=1")
            .arg("--quota-backend-bytes=67108864")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd runs (Debian's etcd-server package; scripts/stores.sh installs it)")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        // The members are gone: the watchdog is not needed, and the directory goes with `dir`.
        if let Some((mut watchdog, _pipe)) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::find_program;

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
}
