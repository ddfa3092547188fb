//! A MariaDB server of one's own (Debian's `mariadb-server`: `mariadb-install-db` and
//! `mariadbd`): a data directory of its own, root without a password from 127.0.0.1, one
//! database, InnoDB's durable commit. A crash is a SIGKILL; the start after it runs InnoDB's
//! crash recovery.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::unistd::Uid;

use crate::dir::{ServerDir, Stop};
use crate::error::{Error, Result};
use crate::port::free_port;
use crate::process::{Process, append_to, run_within, see_log, wait_until};

const SERVER: &str = "mariadb";
/// How long a start (crash recovery included), or the data directory's creation, may take.
const READY_LIMIT: Duration = Duration::from_secs(60);
/// What the log says each time the server accepts connections.
const READY_LINE: &str = "ready for connections";
/// The programs, each under its MariaDB name or its MySQL-compatible alias.
const MARIADBD: [&str; 2] = ["mariadbd", "mysqld"];
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

/// `--user=root` when run as root (the server refuses root otherwise); anyone else runs it as
/// themselves.
fn user_args() -> Vec<String> {
    if Uid::effective().is_root() {
        vec!["--user=root".to_owned()]
    } else {
        Vec::new()
    }
}

/// How to start a [`MariaDb`]: `MariaDb::builder().start()`.
#[derive(Debug, Clone)]
pub struct MariaDbBuilder {
    database: String,
    log: Option<PathBuf>,
    max_connections: Option<usize>,
    args: Vec<String>,
}

impl Default for MariaDbBuilder {
    fn default() -> Self {
        Self {
            database: "test".into(),
            log: None,
            max_connections: None,
            args: Vec::new(),
        }
    }
}

impl MariaDbBuilder {
    /// The database it creates [default: `test`].
    pub fn database(mut self, name: impl Into<String>) -> Self {
        self.database = name.into();
        self
    }

    /// Its error log and the tools' output, appended [default: `mariadb.log` in its
    /// directory].
    pub fn log(mut self, log: impl Into<PathBuf>) -> Self {
        self.log = Some(log.into());
        self
    }

    /// `--max-connections` [default: the server's, 151].
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = Some(n);
        self
    }

    /// Options after the defaults (`--ssl-cert=…`).
    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Creates the data directory, starts the server on a free loopback port and waits until
    /// it accepts connections.
    pub fn start(self) -> Result<MariaDb> {
        let missing = || {
            Error::server(
                SERVER,
                "cannot find mariadbd and mariadb-install-db in /usr/sbin, /usr/bin or PATH; \
                 install mariadb-server (scripts/stores.sh does)",
            )
        };
        let program = find(&MARIADBD).ok_or_else(missing)?;
        let install_db = find(&INSTALL_DB).ok_or_else(missing)?;
        let dir = ServerDir::new(SERVER)?;
        let log = self.log.unwrap_or_else(|| dir.path().join("mariadb.log"));
        let mut server = MariaDb {
            process: Process::new(SERVER, log),
            program,
            port: free_port()?,
            database: self.database,
            max_connections: self.max_connections,
            args: self.args,
            dir,
        };
        server.install_db(&install_db)?;
        // Run at every start, before connections are accepted: root from the loopback address
        // (the data directory's root logs in by socket only) and the database.
        let init = format!(
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';\n\
             GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n\
             CREATE DATABASE IF NOT EXISTS `{}`;\n",
            server.database
        );
        let init_file = server.dir().join("init.sql");
        std::fs::write(&init_file, init)
            .map_err(|e| Error::io(format!("cannot write {}", init_file.display()), e))?;
        server.start_again()?;
        Ok(server)
    }
}

/// A loopback `mariadbd` of one's own with its data in a directory of its own under the system
/// temp dir; SIGKILLed on drop, its directory removed.
#[derive(Debug)]
pub struct MariaDb {
    process: Process,
    program: PathBuf,
    port: u16,
    database: String,
    max_connections: Option<usize>,
    args: Vec<String>,
    // Last: removed once the server is stopped.
    dir: ServerDir,
}

impl MariaDb {
    /// How to start one.
    pub fn builder() -> MariaDbBuilder {
        MariaDbBuilder::default()
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The database it created.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// `mysql://root@ADDR/DATABASE`, `addr` being its own address or a proxy's.
    pub fn url_at(&self, addr: SocketAddr) -> String {
        format!("mysql://root@{addr}/{}", self.database)
    }

    /// Its directory (data, socket, init file; its log unless given elsewhere).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its log.
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// Its pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// A program in the server's directory, its output appended to the log, with no
    /// `MYSQL_*` variable of this process redirecting it.
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        c.current_dir(self.dir()).env("LC_ALL", "C");
        for key in [
            "MYSQL_HOST",
            "MYSQL_TCP_PORT",
            "MYSQL_UNIX_PORT",
            "MYSQL_PWD",
        ] {
            c.env_remove(key);
        }
        c
    }

    fn install_db(&self, program: &Path) -> Result<()> {
        // Once more on a failure (seen once in CI, within a second, while other servers
        // started): a fresh data directory each time.
        self.install_db_once(program).or_else(|first| {
            let _ = std::fs::remove_dir_all(self.dir().join("data"));
            self.install_db_once(program).map_err(|_| first)
        })
    }

    fn install_db_once(&self, program: &Path) -> Result<()> {
        let (out, err) = append_to(self.log())?;
        let mut c = self.command(program);
        // First: no option file of the machine's (its datadir, port, socket) applies.
        c.arg("--no-defaults")
            .arg(format!("--datadir={}", self.dir().join("data").display()))
            .args(user_args())
            .args(["--skip-test-db", "--auth-root-authentication-method=normal"])
            .stdout(out)
            .stderr(err);
        match run_within(&mut c, READY_LIMIT, "")? {
            Some(status) if status.success() => Ok(()),
            status => {
                let ended = status.map_or_else(|| "timed out".to_owned(), |s| s.to_string());
                let problem = format!(
                    "mariadb-install-db failed ({ended}); {}",
                    see_log(self.log())
                );
                Err(Error::server(SERVER, problem))
            }
        }
    }

    /// Starts the server (again, after [`crash`](Self::crash): InnoDB's crash recovery) and
    /// waits until it accepts connections.
    pub fn start_again(&mut self) -> Result<()> {
        let before = ready_lines(self.log());
        let dir = self.dir().to_owned();
        let mut c = self.command(&self.program);
        c.arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .arg(format!("--init-file={}", dir.join("init.sql").display()))
            .arg(format!("--log-error={}", self.log().display()))
            .arg(format!("--port={}", self.port))
            .args(user_args())
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                // Durable: a crash must not lose a committed write.
                "--innodb-flush-log-at-trx-commit=1",
                "--innodb-doublewrite=1",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--skip-log-bin",
                "--character-set-server=utf8mb4",
            ]);
        if let Some(n) = self.max_connections {
            c.arg(format!("--max-connections={n}"));
        }
        c.args(&self.args);
        self.process.spawn(c, &self.dir, Stop::Kill, "")?;
        let log = self.log().to_owned();
        let what = format!("mariadb on {} accepting connections", self.addr());
        wait_until(
            &what,
            READY_LIMIT,
            Duration::from_millis(20),
            &mut [&mut self.process],
            || ready_lines(&log) > before,
        )
    }

    /// Crashes it: SIGKILL, no shutdown, no checkpoint.
    pub fn crash(&mut self) {
        self.process.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pid::finished;

    /// Needs MariaDB's server programs (scripts/stores.sh installs them). It starts, says so in
    /// its log each time, comes back after a crash on its port, and leaves nothing behind.
    #[test]
    fn a_server_comes_back_after_a_crash_and_leaves_nothing_behind() {
        let mut server = MariaDb::builder()
            .database("crash_test")
            .max_connections(20)
            .start()
            .unwrap();
        let dir = server.dir().to_owned();
        let first = server.pid().unwrap();
        server.crash();
        assert!(finished(first));
        server.start_again().unwrap();
        let text = std::fs::read_to_string(server.log()).unwrap();
        assert_eq!(text.matches(READY_LINE).count(), 2, "{text}");
        assert_eq!(
            server.url_at(server.addr()),
            format!("mysql://root@127.0.0.1:{}/crash_test", server.port())
        );
        let pid = server.pid().unwrap();
        drop(server);
        assert!(finished(pid));
        assert!(!dir.exists());
    }
}
