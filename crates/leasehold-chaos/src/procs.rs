//! Child processes: the harness's own Redis and the watchdog; the replicas and the signals and
//! `/proc` readings on what runs under them are leasehold-witness's.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub use leasehold_witness::procs::{
    Replica, children_of, env_of, epoch_ms, finished, signal, signal_group, threads_of,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::error::{ChaosError, Result};

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
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ChaosError::io("cannot find a free port", e))
}

/// The watchdog: a shell that leads the process group of every replica and server the harness
/// starts. Should the harness die without cleaning up (SIGKILL), it kills that group, and the
/// process groups of paused commands listed in its file; it first stops a PostgreSQL or MariaDB
/// server listed in its servers file (SIGQUIT: the postmaster ends its children, which lead
/// sessions of their own and would otherwise outlive the group; then SIGKILL) and removes that
/// server's directory.
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
    case $d in */leasehold-chaos-pg-*|*/leasehold-chaos-mariadb-*) rm -rf "$d";; esac
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
            .map_err(|e| ChaosError::spawn("the watchdog shell (sh)", "", e))?;
        let group = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| {
                let gone = std::io::Error::other("it exited at once");
                ChaosError::spawn("the watchdog shell (sh)", "", gone)
            })?;
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
            .and_then(|f| Ok((f.try_clone()?, f)))
            .map_err(|e| ChaosError::io(format!("cannot open {}", self.log.display()), e))?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdin(Stdio::null())
            .stdout(out.0)
            .stderr(out.1)
            .process_group(self.group)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ChaosError::spawn(&self.program, " (is Redis installed?)", e))?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10)).await
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(ChaosError::server(
                    "redis-server",
                    format!("exited with {status}; see {}", self.log.display()),
                ));
            }
            if ping(self.addr()).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(ChaosError::ServerTimeout {
            what: format!("redis-server on {} answering PING", self.addr()),
            waited: limit,
            log: Some(format!("see {}", self.log.display())),
        })
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
            return Err(ChaosError::timeout(what, limit));
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

/// Waits until `accepting` says the database server `child` (`what`: `postgres`, `mariadb`)
/// accepts connections on `addr`, asking every 20 ms: an error quoting its `log` if the
/// process exits first or `limit` passes.
pub(crate) async fn wait_accepting(
    what: &'static str,
    child: &mut Option<Child>,
    addr: SocketAddr,
    log: &Path,
    limit: Duration,
    mut accepting: impl AsyncFnMut() -> bool,
) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(child) = child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            let problem = format!("exited with {status}; {}", see_log(log));
            return Err(ChaosError::server(what, problem));
        }
        if accepting().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(ChaosError::ServerTimeout {
        what: format!("{what} on {addr} accepting connections"),
        waited: limit,
        log: Some(see_log(log)),
    })
}

/// Sends `sig` to the server process `pid` and waits (blocking, for a `Drop`) up to 5 s for it
/// to end; whether it did.
pub(crate) fn signal_and_wait(pid: u32, sig: nix::sys::signal::Signal) -> bool {
    signal(pid, sig);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !finished(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    finished(pid)
}

/// Where a server's log is, and its last lines (on one line: this ends up in an error message).
pub(crate) fn see_log(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    format!("see {} (last lines: {tail})", log.display())
}

/// Tells the watchdog, through its `servers` file, which server process (if one runs now) to
/// stop and which directory to remove, should the harness die without stopping them.
pub(crate) fn note_server(servers: &Path, pid: Option<u32>, dir: &Path) {
    let pid = pid.map_or("-".to_owned(), |p| p.to_string());
    let _ = std::fs::write(servers, format!("{pid} {}\n", dir.display()));
}

/// Tells the watchdog there is nothing left to clean up.
pub(crate) fn forget_servers(servers: &Path) {
    let _ = std::fs::write(servers, "");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A picked port is free when picked, not reserved: between the pick and a bind, another
    /// test (this crate's tests run side by side under `cargo test`, starting servers on ports
    /// they picked) or another process may take it, and the harness's servers live with that
    /// window too. So a port that is taken by then is not a failure; a pick that is never
    /// bindable is. Listeners are held until the end, so no two rounds check the same port.
    #[test]
    fn free_ports_are_bindable_and_outside_the_ephemeral_range() {
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        let mut held = Vec::new();
        for _ in 0..20 {
            let bound = (0..3).find_map(|_| {
                let port = free_port().unwrap();
                assert!(low <= 20_000 || port < low, "{port}");
                TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok()
            });
            held.push(bound.expect("three picks in a row were taken before they could be bound"));
        }
    }
}

/// What the tests of the harness's own database servers share.
#[cfg(test)]
pub(crate) mod testing {
    use std::time::Duration;

    use leasehold::{HolderId, LeaseName, Store, store::Acquisition};

    /// Takes a lease on `store`, runs `crash` (a crash and restart of its server), and checks
    /// that once the store has reconnected the lease is there as it was.
    pub(crate) async fn a_lease_survives(store: &impl Store, crash: impl AsyncFnOnce()) {
        let (name, holder) = (
            LeaseName::new("crash").unwrap(),
            HolderId::new("h").unwrap(),
        );
        let ttl = Duration::from_secs(600);
        let Acquisition::Acquired { token } = store.acquire(&name, &holder, ttl).await.unwrap()
        else {
            panic!("a fresh lease is free");
        };
        crash().await;
        // The store's pooled connections broke with the crash; a retry gets a new one.
        let mut state = None;
        for _ in 0..50 {
            if let Ok(s) = store.inspect(&name).await {
                state = s;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let state = state.expect("the lease survived the crash");
        assert_eq!(state.token, token);
        assert_eq!(state.holder.as_ref(), Some(&holder));
    }
}
