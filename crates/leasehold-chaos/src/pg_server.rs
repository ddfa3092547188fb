//! A PostgreSQL server the harness starts itself (so it can crash and restart it): `initdb` into a
//! temporary directory, `postgres` on a free loopback port with fsync on, trust auth, one
//! database.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User};
use tokio::process::{Child, Command};

use crate::error::{ChaosError, Result};
use crate::pg_url::PgTarget;
use crate::procs::{self, Watchdog, epoch_ms, free_port};

/// The database the harness creates (and the replicas use).
const DATABASE: &str = "chaos";

/// The superuser `initdb` creates, whoever runs it.
const SUPERUSER: &str = "postgres";

/// How long a start (crash recovery included) may take before the run fails.
const READY_LIMIT: Duration = Duration::from_secs(60);

/// Environment variables of libpq and the server tools that must not redirect them.
const PG_ENV: [&str; 8] = [
    "PGDATA",
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGUSER",
    "PGDATABASE",
    "PGOPTIONS",
    "PGSERVICE",
];

/// The programs the harness runs.
const PROGRAMS: [&str; 5] = ["initdb", "postgres", "pg_ctl", "pg_isready", "createdb"];

/// The directory of PostgreSQL's programs ([`PROGRAMS`]): `explicit` if given, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian, Ubuntu), else `pg_config --bindir`, else the
/// directory of the `initdb` on `PATH`.
pub fn find_bindir(explicit: Option<&Path>) -> Result<PathBuf> {
    let complete = |dir: &Path| PROGRAMS.iter().all(|t| dir.join(t).is_file());
    if let Some(dir) = explicit {
        if complete(dir) {
            return Ok(dir.to_owned());
        }
        return Err(ChaosError::Usage(format!(
            "{} lacks one of {} (--postgres-bin)",
            dir.display(),
            PROGRAMS.join(", ")
        )));
    }
    let mut versions: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let version = name
                .split('.')
                .map(|p| p.parse::<u32>().ok())
                .collect::<Option<Vec<_>>>()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| complete(bin))
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    if let Ok(out) = std::process::Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && complete(&dir) {
            return Ok(dir);
        }
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("initdb"))
        .find(|p| p.is_file())
        .and_then(|p| p.canonicalize().ok())
        .and_then(|p| p.parent().map(Path::to_owned))
        .filter(|d| complete(d));
    on_path.ok_or_else(|| {
        ChaosError::server(
            "postgres",
            format!(
                "cannot find PostgreSQL's programs ({}) in /usr/lib/postgresql/*/bin, pg_config \
                 --bindir or PATH; install PostgreSQL, pass --postgres-bin DIR, or pass \
                 --postgres-url to use a running server",
                PROGRAMS.join(", ")
            ),
        )
    })
}

/// The harness's own PostgreSQL server. Dropping it stops the server (SIGQUIT: an immediate
/// shutdown that ends every server process, then SIGKILL if needed) and removes its directory.
#[derive(Debug)]
pub struct PgServer {
    bin: PathBuf,
    // Removed on drop, after the server has stopped (see Drop).
    dir: Option<tempfile::TempDir>,
    data: PathBuf,
    port: u16,
    log: PathBuf,
    group: i32,
    max_connections: usize,
    /// The `postgres` OS user when the harness runs as root (PostgreSQL refuses root).
    owner: Option<(Uid, Gid)>,
    /// The watchdog's file of servers to stop should the harness die (see [`Watchdog`]).
    servers: PathBuf,
    child: Option<Child>,
}

impl PgServer {
    /// Creates a cluster in a new temporary directory with `bin`'s `initdb`, starts it on a free
    /// loopback port, waits until it accepts connections and creates the database.
    pub async fn start(
        bin: &Path,
        log: &Path,
        watchdog: &Watchdog,
        max_connections: usize,
    ) -> Result<Self> {
        let owner = if Uid::effective().is_root() {
            let user = User::from_name(SUPERUSER)
                .map_err(|e| ChaosError::io("cannot look up the postgres OS user", e.into()))?
                .ok_or_else(|| {
                    ChaosError::server(
                        "postgres",
                        "PostgreSQL refuses to run as root and there is no `postgres` OS user to \
                         run it as; create one, or pass --postgres-url to use a running server",
                    )
                })?;
            Some((user.uid, user.gid))
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("leasehold-chaos-pg-")
            .tempdir()
            .map_err(|e| ChaosError::io("cannot create a temporary directory for PostgreSQL", e))?;
        if let Some((uid, gid)) = owner {
            nix::unistd::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| {
                let what = format!("cannot hand {} to postgres", dir.path().display());
                ChaosError::io(what, e.into())
            })?;
        }
        let mut s = Self {
            bin: bin.to_owned(),
            data: dir.path().join("data"),
            dir: Some(dir),
            port: free_port()?,
            log: log.to_owned(),
            group: watchdog.group(),
            max_connections,
            owner,
            servers: watchdog.servers_file().to_owned(),
            child: None,
        };
        s.note_for_watchdog(None);
        s.initdb().await?;
        s.spawn().await?;
        let created = s
            .tool("createdb")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &s.port.to_string(),
                "-U",
                SUPERUSER,
            ])
            .arg(DATABASE)
            .status()
            .await
            .map_err(|e| ChaosError::spawn(s.bin.join("createdb"), "", e))?;
        if !created.success() {
            let problem = format!("createdb {DATABASE} failed ({created}); {}", s.see_log());
            return Err(ChaosError::server("postgres", problem));
        }
        Ok(s)
    }

    /// Its database, as a client config: address, user and database.
    pub fn target(&self) -> PgTarget {
        PgTarget::local(self.addr(), SUPERUSER, DATABASE)
    }

    /// The URL of its database.
    #[cfg(test)]
    pub fn url(&self) -> String {
        self.target().url_at(self.addr())
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or_else(|| Path::new("/nonexistent"), |d| d.path())
    }

    fn log_file(&self) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
    }

    /// A PostgreSQL program, run as the server's owner, in the server's directory (the tools
    /// want to read their working directory), output appended to the log, in the watchdog's
    /// process group.
    fn tool(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        c.current_dir(self.dir())
            .env("HOME", self.dir())
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .process_group(self.group)
            .kill_on_drop(true);
        for key in PG_ENV {
            c.env_remove(key);
        }
        if let Ok(out) = self.log_file()
            && let Ok(err) = out.try_clone()
        {
            c.stdout(out).stderr(err);
        }
        if let Some((uid, gid)) = self.owner {
            c.uid(uid.as_raw()).gid(gid.as_raw());
        }
        c
    }

    async fn initdb(&self) -> Result<()> {
        let status = self
            .tool("initdb")
            .arg("-D")
            .arg(&self.data)
            .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"])
            // Only a crash of the machine could lose what initdb wrote unsynced; the runs crash
            // the server, never the machine. The server itself runs with fsync on.
            .arg("--no-sync")
            .status()
            .await
            .map_err(|e| ChaosError::spawn(self.bin.join("initdb"), "", e))?;
        if !status.success() {
            let problem = format!("initdb failed ({status}); {}", self.see_log());
            return Err(ChaosError::server("postgres", problem));
        }
        Ok(())
    }

    async fn spawn(&mut self) -> Result<()> {
        let settings = [
            "listen_addresses=127.0.0.1".to_owned(),
            format!("max_connections={}", self.max_connections),
            "shared_buffers=16MB".to_owned(),
            // Durable: a crash must not lose a committed lease or slot.
            "fsync=on".to_owned(),
            "synchronous_commit=on".to_owned(),
            "full_page_writes=on".to_owned(),
            "logging_collector=off".to_owned(),
        ];
        let mut c = self.tool("postgres");
        c.arg("-D")
            .arg(&self.data)
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir());
        for s in &settings {
            c.args(["-c", s]);
        }
        let child = c
            .spawn()
            .map_err(|e| ChaosError::spawn(self.bin.join("postgres"), "", e))?;
        self.note_for_watchdog(child.id());
        self.child = Some(child);
        self.wait_ready(READY_LIMIT).await
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let port = self.port.to_string();
        let mut probe = self.tool("pg_isready");
        probe
            .args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", SUPERUSER])
            .args(["-d", "postgres", "-t", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let accepting = async || probe.status().await.is_ok_and(|s| s.success());
        let (addr, log) = (self.addr(), &self.log);
        procs::wait_accepting("postgres", &mut self.child, addr, log, limit, accepting).await
    }

    /// Where the log is, and its last lines.
    fn see_log(&self) -> String {
        procs::see_log(&self.log)
    }

    /// Crashes the server (`pg_ctl stop -m immediate`: every server process quits at once, no
    /// checkpoint), leaves it down for `down`, and starts it again on the same port; the start
    /// replays the WAL. Returns (stopped at, accepting connections again at), ms since the Unix
    /// epoch.
    pub async fn restart(&mut self, down: Duration) -> Result<(u64, u64)> {
        let stopped = epoch_ms();
        self.crash().await;
        tokio::time::sleep(down).await;
        self.spawn().await?;
        Ok((stopped, epoch_ms()))
    }

    async fn crash(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pg_ctl = self
            .tool("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "10"])
            .status();
        let stopped = matches!(
            tokio::time::timeout(Duration::from_secs(15), pg_ctl).await,
            Ok(Ok(s)) if s.success()
        );
        if !stopped && let Some(pid) = child.id() {
            // What pg_ctl would have sent.
            procs::signal(pid, Signal::SIGQUIT);
        }
        reap(&mut child).await;
        self.note_for_watchdog(None);
    }

    /// Stops the server (an immediate shutdown: its data is thrown away with its directory).
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                procs::signal(pid, Signal::SIGQUIT);
            }
            reap(&mut child).await;
        }
        self.forget_for_watchdog();
    }

    /// Tells the watchdog which postmaster to stop and which directory to remove, should the
    /// harness die without stopping them.
    fn note_for_watchdog(&self, pid: Option<u32>) {
        procs::note_server(&self.servers, pid, self.dir());
    }

    fn forget_for_watchdog(&self) {
        procs::forget_servers(&self.servers);
    }
}

/// Waits up to 10 s for a postmaster that was told to quit, then kills it and its children.
async fn reap(child: &mut Child) {
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        kill_tree(child.id());
        let _ = child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    }
}

/// SIGKILL of a postmaster and of its children (each of which leads its own session).
fn kill_tree(pid: Option<u32>) {
    let Some(pid) = pid else { return };
    let children = procs::children_of(pid);
    procs::signal(pid, Signal::SIGKILL);
    for c in children {
        procs::signal(c, Signal::SIGKILL);
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Not stopped by `stop`: an error or a panic unwound past it. SIGQUIT makes the
            // postmaster end its children (SIGKILL would leave them behind for a while).
            if let Some(pid) = child.id()
                && !procs::signal_and_wait(pid, Signal::SIGQUIT)
            {
                kill_tree(Some(pid));
            }
            let _ = child.start_kill();
            let _ = child.try_wait();
        }
        self.forget_for_watchdog();
        // The directory goes last, once no server process writes to it.
        drop(self.dir.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_the_programs_is_refused() {
        let empty = tempfile::tempdir().unwrap();
        let refused = find_bindir(Some(empty.path())).unwrap_err();
        assert!(
            matches!(&refused, ChaosError::Usage(m) if m.contains("--postgres-bin")),
            "{refused:?}"
        );
    }

    /// Needs PostgreSQL's server programs (scripts/stores.sh installs them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_survives_a_crash_and_the_server_leaves_nothing_behind() {
        let work = tempfile::tempdir().unwrap();
        let watchdog =
            Watchdog::start(&work.path().join("paused"), &work.path().join("servers")).unwrap();
        let bin = find_bindir(None).expect("PostgreSQL installed");
        let log = work.path().join("postgres.log");
        let mut server = PgServer::start(&bin, &log, &watchdog, 20).await.unwrap();
        let dir = server.dir().to_owned();
        let servers = std::fs::read_to_string(watchdog.servers_file()).unwrap();
        assert!(
            servers.ends_with(&format!(" {}\n", dir.display())),
            "{servers}"
        );

        let store = leasehold_connect::open_store(&server.url()).await.unwrap();
        procs::testing::a_lease_survives(&store, async || {
            let postmaster = server.child.as_ref().and_then(Child::id).unwrap();
            server.restart(Duration::ZERO).await.unwrap();
            assert!(procs::finished(postmaster));
        })
        .await;
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("immediate shutdown"), "{text}");
        assert!(text.contains("automatic recovery"), "{text}");

        let postmaster = server.child.as_ref().and_then(Child::id).unwrap();
        let backends = procs::children_of(postmaster);
        assert!(!backends.is_empty());
        drop(store);
        server.stop().await;
        drop(server);
        assert!(procs::finished(postmaster));
        assert!(backends.iter().all(|&b| procs::finished(b)));
        assert!(!dir.exists());
        assert_eq!(
            std::fs::read_to_string(watchdog.servers_file()).unwrap(),
            ""
        );
    }
}
