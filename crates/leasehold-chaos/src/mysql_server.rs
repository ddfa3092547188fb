//! A MariaDB server the harness starts itself (so it can crash and restart it):
//! `mariadb-install-db` into a temporary directory, `mariadbd` on a free loopback port with
//! InnoDB's durable commit (`innodb_flush_log_at_trx_commit=1`), root without a password from
//! 127.0.0.1, one database. A crash is a SIGKILL; the start after it runs InnoDB's crash recovery.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Uid;
use tokio::process::{Child, Command};

use crate::error::{ChaosError, Result};
use crate::procs::{self, Watchdog, epoch_ms, free_port};

/// The database the harness creates (and the replicas use).
const DATABASE: &str = "chaos";

/// How long a start (crash recovery included) may take before the run fails.
const READY_LIMIT: Duration = Duration::from_secs(60);

/// What the log says each time the server accepts connections.
const READY_LINE: &str = "ready for connections";

/// The programs the harness runs, each under its MariaDB name or its MySQL-compatible alias.
const SERVER: [&str; 2] = ["mariadbd", "mysqld"];
const INSTALL_DB: [&str; 2] = ["mariadb-install-db", "mysql_install_db"];

/// The first of `names` found in `/usr/sbin`, `/usr/bin` or on `PATH`.
fn find(names: &[&str]) -> Option<PathBuf> {
    let mut dirs = vec![PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    names
        .iter()
        .flat_map(|n| dirs.iter().map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

/// How many times the log says the server accepted connections.
fn ready_lines(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|t| t.matches(READY_LINE).count())
        .unwrap_or(0)
}

/// The harness's own MariaDB server. Dropping it kills the server and removes its directory.
#[derive(Debug)]
pub struct MySqlServer {
    server: PathBuf,
    // Removed on drop, after the server has stopped (see Drop).
    dir: Option<tempfile::TempDir>,
    port: u16,
    log: PathBuf,
    group: i32,
    max_connections: usize,
    /// The watchdog's file of servers to stop should the harness die (see [`Watchdog`]).
    servers: PathBuf,
    child: Option<Child>,
}

impl MySqlServer {
    /// Creates a data directory in a new temporary directory, starts the server on a free
    /// loopback port and waits until it accepts connections.
    pub async fn start(log: &Path, watchdog: &Watchdog, max_connections: usize) -> Result<Self> {
        let missing = || {
            ChaosError::server(
                "mariadb",
                "cannot find mariadbd and mariadb-install-db in /usr/sbin, /usr/bin or PATH; \
                 install mariadb-server",
            )
        };
        let server = find(&SERVER).ok_or_else(missing)?;
        let install_db = find(&INSTALL_DB).ok_or_else(missing)?;
        let dir = tempfile::Builder::new()
            .prefix("leasehold-chaos-mariadb-")
            .tempdir()
            .map_err(|e| ChaosError::io("cannot create a temporary directory for MariaDB", e))?;
        let mut s = Self {
            server,
            dir: Some(dir),
            port: free_port()?,
            log: log.to_owned(),
            group: watchdog.group(),
            max_connections,
            servers: watchdog.servers_file().to_owned(),
            child: None,
        };
        s.note_for_watchdog(None);
        s.install_db(&install_db).await?;
        // Run at every start, before connections are accepted: root from the loopback address
        // (the data directory's root logs in by socket only) and the database.
        let init = format!(
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';\n\
             GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n\
             CREATE DATABASE IF NOT EXISTS {DATABASE};\n"
        );
        std::fs::write(s.dir().join("init.sql"), init)
            .map_err(|e| ChaosError::io("cannot write MariaDB's init file", e))?;
        s.spawn().await?;
        Ok(s)
    }

    /// The URL of its database at `addr` (the server's own address, or the proxy's).
    pub fn url_at(addr: SocketAddr) -> String {
        format!("mysql://root@{addr}/{DATABASE}")
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

    fn data(&self) -> PathBuf {
        self.dir().join("data")
    }

    /// The OS user the server runs as: `--user=root` says it may run as root (it refuses
    /// otherwise); anyone else runs it as themselves.
    fn user_args(&self) -> Vec<String> {
        if Uid::effective().is_root() {
            vec!["--user=root".to_owned()]
        } else {
            Vec::new()
        }
    }

    /// A program, output appended to the log, in the watchdog's process group.
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        c.current_dir(self.dir())
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .process_group(self.group)
            .kill_on_drop(true);
        for key in [
            "MYSQL_HOST",
            "MYSQL_TCP_PORT",
            "MYSQL_UNIX_PORT",
            "MYSQL_PWD",
        ] {
            c.env_remove(key);
        }
        if let Ok(out) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            && let Ok(err) = out.try_clone()
        {
            c.stdout(out).stderr(err);
        }
        c
    }

    async fn install_db(&self, program: &Path) -> Result<()> {
        let status = self
            .command(program)
            // First: no option file of the machine's (its datadir, port, socket) applies.
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data().display()))
            .args(self.user_args())
            .args(["--skip-test-db", "--auth-root-authentication-method=normal"])
            .status()
            .await
            .map_err(|e| ChaosError::spawn(program, "", e))?;
        if !status.success() {
            let problem = format!("mariadb-install-db failed ({status}); {}", self.see_log());
            return Err(ChaosError::server("mariadb", problem));
        }
        Ok(())
    }

    async fn spawn(&mut self) -> Result<()> {
        let before = ready_lines(&self.log);
        let dir = self.dir().to_owned();
        let mut c = self.command(&self.server);
        c.arg("--no-defaults")
            .arg(format!("--datadir={}", self.data().display()))
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .arg(format!("--init-file={}", dir.join("init.sql").display()))
            .arg(format!("--log-error={}", self.log.display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--max-connections={}", self.max_connections))
            .args(self.user_args())
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                // Durable: a crash must not lose a committed lease or slot.
                "--innodb-flush-log-at-trx-commit=1",
                "--innodb-doublewrite=1",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--skip-log-bin",
                "--character-set-server=utf8mb4",
            ]);
        let child = c
            .spawn()
            .map_err(|e| ChaosError::spawn(&self.server, "", e))?;
        self.note_for_watchdog(child.id());
        self.child = Some(child);
        self.wait_ready(before, READY_LIMIT).await
    }

    async fn wait_ready(&mut self, before: usize, limit: Duration) -> Result<()> {
        let accepting = async || ready_lines(&self.log) > before;
        let (addr, log) = (self.addr(), &self.log);
        procs::wait_accepting("mariadb", &mut self.child, addr, log, limit, accepting).await
    }

    /// Where the log is, and its last lines.
    fn see_log(&self) -> String {
        procs::see_log(&self.log)
    }

    /// Crashes the server (SIGKILL: no shutdown, no checkpoint), leaves it down for `down`, and
    /// starts it again on the same port; the start runs InnoDB's crash recovery. Returns
    /// (killed at, accepting connections again at), ms since the Unix epoch.
    pub async fn restart(&mut self, down: Duration) -> Result<(u64, u64)> {
        let killed = epoch_ms();
        self.kill().await;
        tokio::time::sleep(down).await;
        self.spawn().await?;
        Ok((killed, epoch_ms()))
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                procs::signal(pid, Signal::SIGKILL);
            }
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        }
        self.note_for_watchdog(None);
    }

    /// Stops the server (its data is thrown away with its directory).
    pub async fn stop(&mut self) {
        self.kill().await;
        self.forget_for_watchdog();
    }

    /// Tells the watchdog which server to stop and which directory to remove, should the
    /// harness die without stopping them.
    fn note_for_watchdog(&self, pid: Option<u32>) {
        procs::note_server(&self.servers, pid, self.dir());
    }

    fn forget_for_watchdog(&self) {
        procs::forget_servers(&self.servers);
    }
}

impl Drop for MySqlServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Not stopped by `stop`: an error or a panic unwound past it.
            if let Some(pid) = child.id() {
                procs::signal_and_wait(pid, Signal::SIGKILL);
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

    /// Needs MariaDB's server programs (scripts/stores.sh installs them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_survives_a_crash_and_the_server_leaves_nothing_behind() {
        let work = tempfile::tempdir().unwrap();
        let watchdog =
            Watchdog::start(&work.path().join("paused"), &work.path().join("servers")).unwrap();
        let log = work.path().join("mariadb.log");
        let mut server = MySqlServer::start(&log, &watchdog, 50).await.unwrap();
        let dir = server.dir().to_owned();
        let servers = std::fs::read_to_string(watchdog.servers_file()).unwrap();
        assert!(
            servers.ends_with(&format!(" {}\n", dir.display())),
            "{servers}"
        );

        let url = MySqlServer::url_at(server.addr());
        let store = leasehold_connect::open_store(&url).await.unwrap();
        procs::testing::a_lease_survives(&store, async || {
            let pid = server.child.as_ref().and_then(Child::id).unwrap();
            server.restart(Duration::ZERO).await.unwrap();
            assert!(procs::finished(pid));
        })
        .await;
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text.matches(READY_LINE).count(), 2, "{text}");

        let pid = server.child.as_ref().and_then(Child::id).unwrap();
        drop(store);
        server.stop().await;
        drop(server);
        assert!(procs::finished(pid));
        assert!(!dir.exists());
        assert_eq!(
            std::fs::read_to_string(watchdog.servers_file()).unwrap(),
            ""
        );
    }
}
