//! Throwaway etcd clusters on loopback for tests (feature `testing`): members are `etcd`
//! processes of Debian's `etcd-server` package (`scripts/stores.sh` installs it) on free
//! loopback ports, with data directories in a temporary directory.
//!
//! Members are killed when the [`EtcdCluster`] is dropped (a failing test unwinds through the
//! drop too), and a watchdog process kills them within a second if the test process dies
//! without unwinding (SIGKILL, `abort`), so no run leaves etcd processes behind.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd cluster of its own.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    watchdog: Option<Child>,
    dir: tempfile::TempDir,
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Removes `leasehold-etcd-*` directories under `base` untouched for ten minutes.
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(600));
        if stale
            && entry
                .file_name()
                .to_string_lossy()
                .starts_with("leasehold-etcd-")
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl EtcdCluster {
    /// Starts `size` members (1 or 3 are usual) and waits until every member answers a
    /// linearizable read (a leader is elected). Panics if they do not within 30 s.
    pub fn start(size: usize) -> Self {
        // /dev/shm where there is one: etcd fsyncs every commit on every member.
        let base = Path::new("/dev/shm");
        // A cluster kept for a whole test binary (a static) is never dropped, so its data stays
        // behind in memory: clear out what earlier runs left (no test lives ten minutes).
        remove_stale(base);
        let dir = if base.is_dir() {
            tempfile::Builder::new()
                .prefix("leasehold-etcd-")
                .tempdir_in(base)
        } else {
            tempfile::Builder::new().prefix("leasehold-etcd-").tempdir()
        }
        .expect("a temporary directory");
        let peers: Vec<(String, u16, u16)> = (0..size)
            .map(|i| (format!("m{i}"), free_port(), free_port()))
            .collect();
        let initial: Vec<String> = peers
            .iter()
            .map(|(name, _, peer)| format!("{name}=http://127.0.0.1:{peer}"))
            .collect();
        let token = format!("lh-{:016x}", fastrand_u64());
        let mut cluster = Self {
            members: Vec::new(),
            watchdog: None,
            dir,
        };
        for (name, client, peer) in &peers {
            let child = spawn_member(
                cluster.dir.path(),
                name,
                *client,
                *peer,
                &initial.join(","),
                &token,
            );
            cluster.members.push(Member {
                name: name.clone(),
                client_port: *client,
                child: Some(child),
            });
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

    /// `etcd://` URL of every member, in member order.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// `etcd://` URL with member `first` first (the client talks to it first).
    pub fn url_starting_at(&self, first: usize) -> String {
        let mut endpoints = self.endpoints();
        let n = endpoints.len();
        endpoints.rotate_left(first % n);
        format!("etcd://{}", endpoints.join(","))
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
        let joined: Vec<&str> = live.iter().map(|(_, e)| e.as_str()).collect();
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--dial-timeout=1s", "--command-timeout=2s"])
            .arg(format!("--endpoints={}", joined.join(",")))
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
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .args(["--dial-timeout=2s", "--command-timeout=5s"])
            .arg(format!("--endpoints={}", self.endpoints().join(",")));
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

    /// The member's log file.
    pub fn log(&self, index: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[index].name))
    }

    fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let healthy = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--dial-timeout=1s", "--command-timeout=2s"])
                .arg(format!("--endpoints={}", self.endpoints().join(",")))
                .args(["endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if healthy {
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

    /// A shell that kills the members once this process is gone.
    fn arm_watchdog(&mut self) {
        let pids: Vec<String> = self
            .members
            .iter()
            .filter_map(|m| m.child.as_ref().map(|c| c.id().to_string()))
            .collect();
        let script = format!(
            "while kill -0 {parent} 2>/dev/null; do sleep 1; done; kill -9 {pids} 2>/dev/null",
            parent = std::process::id(),
            pids = pids.join(" ")
        );
        self.watchdog = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
    }
}

fn spawn_member(
    dir: &Path,
    name: &str,
    client: u16,
    peer: u16,
    initial_cluster: &str,
    token: &str,
) -> Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("member log file");
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    Command::new("etcd")
        .arg(format!("--name={name}"))
        .arg(format!("--data-dir={}", dir.join(name).display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster={initial_cluster}"))
        .arg(format!("--initial-cluster-token={token}"))
        .arg("--initial-cluster-state=new")
        // Loopback: elect in about half a second rather than the default second or more.
        .arg("--heartbeat-interval=50")
        .arg("--election-timeout=500")
        .arg("--logger=zap")
        .arg("--log-outputs=stderr")
        .arg("--log-level=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("etcd runs (Debian's etcd-server package; scripts/stores.sh installs it)")
}

fn fastrand_u64() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}
