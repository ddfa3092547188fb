//! Child processes: replicas, the harness's own Redis, the watchdog, and what runs under them.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// Milliseconds since the Unix epoch.
pub fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A free loopback port for a server the harness starts (and restarts on the same port): bound
/// and released. It is picked below the kernel's ephemeral range where possible, so that no
/// outgoing connection takes it as its source port while the server is down for a restart (a
/// port from the ephemeral range could be, and the server could not bind it again).
pub fn free_port() -> Result<u16> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if low > 20_000 {
        for _ in 0..100 {
            let port = fastrand::u16(10_000..low);
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("cannot find a free port")?;
    Ok(l.local_addr()?.port())
}

fn pid(raw: u32) -> Pid {
    Pid::from_raw(i32::try_from(raw).unwrap_or(i32::MAX))
}

/// Sends `sig` to a process; false if it is gone.
pub fn signal(raw: u32, sig: Signal) -> bool {
    kill(pid(raw), sig).is_ok()
}

/// Whether a process exists (signal 0).
pub fn signal_exists(raw: u32) -> bool {
    kill(pid(raw), None).is_ok()
}

/// Sends `sig` to the process group led by `raw` (the runner starts each command as the leader
/// of its own group); false if it is gone.
pub fn signal_group(raw: u32, sig: Signal) -> bool {
    killpg(pid(raw), sig).is_ok()
}

/// The direct children of a process, from `/proc/<pid>/task/*/children`, or by scanning
/// `/proc/*/stat` where the kernel has no such file.
pub fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut found_file = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                found_file = true;
                out.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    if found_file {
        return out;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(child) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if parent_of(child) == Some(parent) {
            out.push(child);
        }
    }
    out
}

/// The parent pid from `/proc/<pid>/stat`.
fn parent_of(raw: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{raw}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may contain spaces, so split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a process is a zombie or gone (its state in `/proc/<pid>/stat`).
pub fn finished(raw: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{raw}/stat")) else {
        return true;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_owned));
    matches!(state.as_deref(), None | Some("Z") | Some("X"))
}

/// How many threads a process has (`Threads:` in `/proc/<pid>/status`); 0 if it is gone.
pub fn threads_of(raw: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{raw}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One variable of a process's environment.
pub fn env_of(raw: u32, key: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{raw}/environ")).ok()?;
    let prefix = format!("{key}=");
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        kv.strip_prefix(&prefix).map(str::to_owned)
    })
}

/// A replica: one `leasehold run` process.
#[derive(Debug)]
pub struct Replica {
    /// Its row in the timeline (a replacement takes the row of the replica it replaces).
    pub row: usize,
    /// How many replicas had this row before it.
    pub generation: usize,
    /// Its holder id (`r<row>.<generation>`).
    pub holder: String,
    /// Its pid.
    pub pid: u32,
    /// When it started, ms since the Unix epoch.
    pub started_ms: u64,
    /// When it was seen to exit, ms since the Unix epoch.
    pub ended_ms: Option<u64>,
    /// Its exit status, once it exited.
    pub exit: Option<String>,
    child: Child,
}

impl Replica {
    /// The holder id of a replica in `row`, generation `generation`.
    pub fn holder_id(row: usize, generation: usize) -> String {
        format!("r{row}.{generation}")
    }

    /// The timeline row of a holder id made by [`holder_id`](Self::holder_id).
    pub fn row_of(holder: &str) -> Option<usize> {
        holder.strip_prefix('r')?.split('.').next()?.parse().ok()
    }

    /// Starts `program args…`, with `env` added to its environment, and its stdout and stderr
    /// appended to `log`.
    pub fn spawn(
        row: usize,
        generation: usize,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
        group: i32,
    ) -> Result<Self> {
        let out = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env("LEASEHOLD_LOG", "info")
            .envs(env.iter().copied())
            .process_group(group)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let pid = child.id().context("replica exited at once")?;
        Ok(Self {
            row,
            generation,
            holder: Self::holder_id(row, generation),
            pid,
            started_ms: epoch_ms(),
            ended_ms: None,
            exit: None,
            child,
        })
    }

    /// Whether it is still running (reaps it and records its status if not).
    pub fn alive(&mut self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                self.exited(status.to_string());
                false
            }
            Err(e) => {
                self.exited(format!("unknown ({e})"));
                false
            }
        }
    }

    fn exited(&mut self, status: String) {
        self.exit = Some(status);
        self.ended_ms = Some(epoch_ms());
    }

    /// The process groups of the commands it is running right now: `leasehold run` starts each
    /// command under a supervisor that leads the command's group.
    pub fn command_groups(&self) -> Vec<u32> {
        if self.exit.is_some() {
            return Vec::new();
        }
        children_of(self.pid)
    }

    /// SIGKILL of its commands' process groups and of the replica itself.
    pub fn kill_all(&mut self) {
        for g in self.command_groups() {
            signal_group(g, Signal::SIGKILL);
        }
        let _ = self.child.start_kill();
    }

    /// Waits for it to exit, up to `limit`; true if it did.
    pub async fn wait(&mut self, limit: Duration) -> bool {
        if self.exit.is_some() {
            return true;
        }
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.exited(status.to_string());
                true
            }
            Ok(Err(e)) => {
                self.exited(format!("unknown ({e})"));
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.exit.is_none() {
            // Commands first: they are in their own process groups and would outlive us.
            for c in children_of(self.pid) {
                signal_group(c, Signal::SIGCONT);
                signal_group(c, Signal::SIGKILL);
            }
            let _ = self.child.start_kill();
        }
    }
}

/// The watchdog: a shell that leads the process group of every replica and server the harness
/// starts. Should the harness die without cleaning up (SIGKILL), it kills that group, and the
/// process groups of paused commands listed in its file; it first stops a PostgreSQL server
/// listed in its servers file (SIGQUIT: the postmaster ends its children, which lead sessions of
/// their own and would otherwise outlive the group) and removes that server's directory.
#[derive(Debug)]
pub struct Watchdog {
    child: Child,
    group: i32,
    paused: PathBuf,
    servers: PathBuf,
}

impl Watchdog {
    /// Starts the watchdog of this process; `paused` is the file of paused process groups,
    /// `servers` the file of `PID DIR` lines of servers to stop (`-` while a server is down).
    pub fn start(paused: &Path, servers: &Path) -> Result<Self> {
        const SCRIPT: &str = r#"h=$1; f=$2; s=$3
while kill -0 "$h" 2>/dev/null; do sleep 0.5; done
for g in $(cat "$f" 2>/dev/null); do kill -CONT -"$g"; kill -KILL -"$g"; done 2>/dev/null
if [ -s "$s" ]; then
  while read -r p d; do case $p in ''|*[!0-9]*) ;; *) kill -QUIT "$p";; esac; done <"$s" 2>/dev/null
  sleep 2
  while read -r p d; do
    case $p in ''|*[!0-9]*) ;; *) kill -KILL "$p";; esac
    case $d in */leasehold-chaos-pg-*) rm -rf "$d";; esac
  done <"$s" 2>/dev/null
fi
kill -KILL 0"#;
        let child = Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("leasehold-chaos-watchdog")
            .arg(std::process::id().to_string())
            .arg(paused)
            .arg(servers)
            // Its `sleep` outlives a killed shell by up to half a second: it must not hold the
            // harness's stdout or stderr open.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the watchdog shell")?;
        let group = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .context("the watchdog exited at once")?;
        Ok(Self {
            child,
            group,
            paused: paused.to_owned(),
            servers: servers.to_owned(),
        })
    }

    /// The file of servers the watchdog stops (`PID DIR` lines), for a server to note itself in.
    pub fn servers_file(&self) -> &Path {
        &self.servers
    }

    /// The process group children join.
    pub fn group(&self) -> i32 {
        self.group
    }

    /// Records a process group about to be paused, so the watchdog can end it.
    pub fn note_paused(&self, group: u32) {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.paused)
        {
            let _ = writeln!(f, "{group}");
        }
    }

    /// Forgets the paused groups (they were resumed; their ids may be reused).
    pub fn clear_paused(&self) {
        let _ = std::fs::write(&self.paused, "");
    }

    /// Stops the watchdog (its group's members are left alone).
    pub fn stop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A `redis-server` the harness started itself (so it can restart it), with no persistence.
#[derive(Debug)]
pub struct RedisServer {
    program: PathBuf,
    port: u16,
    log: PathBuf,
    group: i32,
    /// Further arguments (a sentinel's config file, `--replicaof`).
    args: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts `program` on a free loopback port and waits until it answers PING.
    pub async fn start(program: &Path, log: &Path, group: i32) -> Result<Self> {
        Self::start_with(program, log, group, free_port()?, Vec::new()).await
    }

    /// [`start`](Self::start) on `port`, with further arguments.
    pub async fn start_with(
        program: &Path,
        log: &Path,
        group: i32,
        port: u16,
        args: Vec<String>,
    ) -> Result<Self> {
        let mut s = Self {
            program: program.to_owned(),
            port,
            log: log.to_owned(),
            group,
            args,
            child: None,
        };
        s.spawn().await?;
        Ok(s)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    async fn spawn(&mut self) -> Result<()> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(self.group)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "cannot start {} (is Redis installed?)",
                    self.program.display()
                )
            })?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10)).await
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!(
                    "redis-server exited with {status}; see {}",
                    self.log.display()
                );
            }
            if ping(self.addr()).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!(
            "redis-server did not answer on {} within {limit:?}",
            self.addr()
        )
    }

    /// Kills the server (SIGKILL: it forgets everything) and starts it again on the same port.
    /// Returns (killed at, answering again at), ms since the Unix epoch.
    pub async fn restart(&mut self) -> Result<(u64, u64)> {
        let killed = epoch_ms();
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
        self.spawn().await?;
        Ok((killed, epoch_ms()))
    }

    /// Starts it again with `args` instead of its former further arguments.
    pub async fn respawn_with(&mut self, args: Vec<String>) -> Result<()> {
        self.stop().await;
        self.args = args;
        self.spawn().await
    }

    /// Stops the server (SIGKILL).
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
    }
}

/// `redis-cli -h 127.0.0.1 -p PORT ARGS…`: its standard output, empty if it could not run.
pub async fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await;
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Polls `ready` every 50 ms until it is true; an error naming `what` after `limit`.
pub async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut ready: impl FnMut() -> F,
) -> Result<()> {
    let start = Instant::now();
    while !ready().await {
        if start.elapsed() > limit {
            bail!("{what} did not happen within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn ping(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).await.ok()?;
        (&buf == b"+PONG\r\n").then_some(())
    };
    tokio::time::timeout(Duration::from_millis(500), attempt)
        .await
        .ok()
        .flatten()
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_bindable_and_outside_the_ephemeral_range() {
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        for _ in 0..20 {
            let port = free_port().unwrap();
            assert!(low <= 20_000 || port < low, "{port}");
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        }
    }

    #[test]
    fn holder_ids_name_their_row() {
        let h = Replica::holder_id(3, 2);
        assert_eq!(h, "r3.2");
        assert_eq!(Replica::row_of(&h), Some(3));
        assert_eq!(Replica::row_of("host:1:abc"), None);
    }

    #[tokio::test]
    async fn children_and_environment_are_read_from_proc() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 5 & wait"])
            .env("CHAOS_PROBE", "42")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        // The parent can resume before exec has set up the new environment in /proc.
        let mut probe = None;
        for _ in 0..100 {
            probe = env_of(pid, "CHAOS_PROBE");
            if probe.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(probe.as_deref(), Some("42"));
        let mut kids = Vec::new();
        for _ in 0..100 {
            kids = children_of(pid);
            if !kids.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(kids.len(), 1);
        assert_eq!(parent_of(kids[0]), Some(pid));
        assert!(!finished(pid));
        assert_eq!(threads_of(pid), 1);
        for k in kids {
            signal(k, Signal::SIGKILL);
        }
        child.wait().await.unwrap();
        assert!(finished(pid));
    }
}
