//! A PostgreSQL server of one's own: `initdb` into a directory of its own, `postgres` on a free
//! loopback port with fsync on, trust authentication, one database. A crash is `pg_ctl stop -m
//! immediate` (no checkpoint); the start after it replays the WAL.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User};

use crate::dir::{ServerDir, Stop};
use crate::error::{Error, Result};
use crate::pid::signal;
use crate::port::free_port;
use crate::process::{Process, append_to, run_within, see_log, wait_until};

const SERVER: &str = "postgres";
/// The superuser `initdb` creates, whoever runs it.
const SUPERUSER: &str = "postgres";
/// How long a start (crash recovery included) may take.
const READY_LIMIT: Duration = Duration::from_secs(60);
/// How long a postmaster told to quit may take before it and its backends are killed.
const QUIT_GRACE: Duration = Duration::from_secs(10);

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

/// The programs a [`Postgres`] runs, all in one directory.
pub const POSTGRES_PROGRAMS: [&str; 5] = ["initdb", "postgres", "pg_ctl", "pg_isready", "createdb"];

/// Whether `dir` holds every one of [`POSTGRES_PROGRAMS`].
pub fn is_postgres_bindir(dir: &Path) -> bool {
    POSTGRES_PROGRAMS.iter().all(|t| dir.join(t).is_file())
}

/// The directory of PostgreSQL's programs: the newest `/usr/lib/postgresql/VERSION/bin`
/// (Debian, Ubuntu), else `pg_config --bindir`, else the directory of the `initdb` on `PATH`.
pub fn find_postgres_bindir() -> Result<PathBuf> {
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
        .filter(|(_, bin)| is_postgres_bindir(bin))
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    if let Ok(out) = Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && is_postgres_bindir(&dir) {
            return Ok(dir);
        }
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("initdb"))
        .find(|p| p.is_file())
        .and_then(|p| p.canonicalize().ok())
        .and_then(|p| p.parent().map(Path::to_owned))
        .filter(|d| is_postgres_bindir(d))
        .ok_or_else(|| {
            Error::server(
                SERVER,
                format!(
                    "cannot find PostgreSQL's programs ({}) in /usr/lib/postgresql/*/bin, \
                     pg_config --bindir or PATH; install PostgreSQL",
                    POSTGRES_PROGRAMS.join(", ")
                ),
            )
        })
}

/// How to start a [`Postgres`]: `Postgres::builder().start()`.
#[derive(Debug, Clone)]
pub struct PostgresBuilder {
    bin: Option<PathBuf>,
    database: String,
    max_connections: usize,
    log: Option<PathBuf>,
}

impl Default for PostgresBuilder {
    fn default() -> Self {
        Self {
            bin: None,
            database: "test".into(),
            max_connections: 100,
            log: None,
        }
    }
}

impl PostgresBuilder {
    /// The directory of [`POSTGRES_PROGRAMS`] [default: [`find_postgres_bindir`]].
    pub fn bin(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin = Some(dir.into());
        self
    }

    /// The database it creates [default: `test`].
    pub fn database(mut self, name: impl Into<String>) -> Self {
        self.database = name.into();
        self
    }

    /// `max_connections` [default: 100].
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// The server's and the tools' output, appended [default: `postgres.log` in its
    /// directory].
    pub fn log(mut self, log: impl Into<PathBuf>) -> Self {
        self.log = Some(log.into());
        self
    }

    /// Creates a cluster in a new directory with `initdb`, starts it on a free loopback port,
    /// waits until it accepts connections and creates the database. Run as root, the server
    /// runs as the `postgres` OS user (PostgreSQL refuses root).
    pub fn start(self) -> Result<Postgres> {
        let bin = match self.bin {
            Some(bin) if is_postgres_bindir(&bin) => bin,
            Some(bin) => {
                let problem = format!(
                    "{} lacks one of {}",
                    bin.display(),
                    POSTGRES_PROGRAMS.join(", ")
                );
                return Err(Error::server(SERVER, problem));
            }
            None => find_postgres_bindir()?,
        };
        let owner = if Uid::effective().is_root() {
            let user = User::from_name(SUPERUSER)
                .map_err(|e| Error::io("cannot look up the postgres OS user", e.into()))?
                .ok_or_else(|| {
                    Error::server(
                        SERVER,
                        "PostgreSQL refuses to run as root and there is no `postgres` OS user \
                         to run it as; create one",
                    )
                })?;
            Some((user.uid, user.gid))
        } else {
            None
        };
        let dir = ServerDir::new(SERVER)?;
        if let Some((uid, gid)) = owner {
            nix::unistd::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| {
                Error::io(
                    format!("cannot hand {} to postgres", dir.path().display()),
                    e.into(),
                )
            })?;
        }
        let log = self.log.unwrap_or_else(|| dir.path().join("postgres.log"));
        let mut server = Postgres {
            process: Process::new(SERVER, log),
            bin,
            port: free_port()?,
            database: self.database,
            max_connections: self.max_connections,
            owner,
            dir,
        };
        server.initdb()?;
        server.start_again()?;
        let port = server.port.to_string();
        let mut createdb = server.tool("createdb")?;
        createdb
            .args(["-h", "127.0.0.1", "-p", &port, "-U", SUPERUSER])
            .arg(&server.database);
        server.run_tool(&mut createdb, "createdb")?;
        Ok(server)
    }
}

/// A loopback PostgreSQL server of one's own (fsync on, trust authentication) with its data in
/// a directory of its own under the system temp dir. Dropping it stops the server (SIGQUIT: an
/// immediate shutdown that ends every server process; SIGKILL if needed) and removes the
/// directory.
#[derive(Debug)]
pub struct Postgres {
    process: Process,
    bin: PathBuf,
    port: u16,
    database: String,
    max_connections: usize,
    /// The `postgres` OS user when run as root.
    owner: Option<(Uid, Gid)>,
    // Last: removed once the server is stopped.
    dir: ServerDir,
}

impl Postgres {
    /// How to start one.
    pub fn builder() -> PostgresBuilder {
        PostgresBuilder::default()
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The superuser, who needs no password.
    pub fn user(&self) -> &str {
        SUPERUSER
    }

    /// The database it created.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self) -> String {
        format!("postgres://{SUPERUSER}@{}/{}", self.addr(), self.database)
    }

    /// The directory of the programs it runs.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Its directory (data, socket; its log unless given elsewhere).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its log.
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// The postmaster's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    fn data(&self) -> PathBuf {
        self.dir().join("data")
    }

    /// A PostgreSQL program, run as the server's owner in the server's directory (the tools
    /// want to read their working directory), with no `PG*` variable of this process
    /// redirecting it.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        c.current_dir(self.dir())
            .env("HOME", self.dir())
            .env("LC_ALL", "C");
        for key in PG_ENV {
            c.env_remove(key);
        }
        if let Some((uid, gid)) = self.owner {
            use std::os::unix::process::CommandExt;
            c.uid(uid.as_raw()).gid(gid.as_raw());
        }
        c
    }

    /// [`command`](Self::command) with its output appended to the log.
    fn tool(&self, program: &str) -> Result<Command> {
        let (out, err) = append_to(self.log())?;
        let mut c = self.command(program);
        c.stdin(Stdio::null()).stdout(out).stderr(err);
        Ok(c)
    }

    /// Runs a tool to its end: an error quoting the log if it fails.
    fn run_tool(&self, command: &mut Command, name: &str) -> Result<()> {
        match run_within(command, READY_LIMIT, "")? {
            Some(status) if status.success() => Ok(()),
            status => {
                let ended = status.map_or_else(|| "timed out".to_owned(), |s| s.to_string());
                let problem = format!("{name} failed ({ended}); {}", see_log(self.log()));
                Err(Error::server(SERVER, problem))
            }
        }
    }

    fn initdb(&self) -> Result<()> {
        let mut c = self.tool("initdb")?;
        c.arg("-D")
            .arg(self.data())
            .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"])
            // Only a crash of the machine could lose what initdb wrote unsynced; a crash of
            // the server cannot. The server itself runs with fsync on.
            .arg("--no-sync");
        self.run_tool(&mut c, "initdb")
    }

    /// Starts the server (again, after [`crash`](Self::crash): the start replays the WAL) and
    /// waits until it accepts connections.
    pub fn start_again(&mut self) -> Result<()> {
        let mut c = self.command("postgres");
        c.arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir());
        for setting in [
            "listen_addresses=127.0.0.1".to_owned(),
            format!("max_connections={}", self.max_connections),
            "shared_buffers=16MB".to_owned(),
            // Durable: a crash must not lose a committed write.
            "fsync=on".to_owned(),
            "synchronous_commit=on".to_owned(),
            "full_page_writes=on".to_owned(),
            "logging_collector=off".to_owned(),
        ] {
            c.args(["-c", &setting]);
        }
        self.process.spawn(c, &self.dir, Stop::Quit, "")?;
        let port = self.port.to_string();
        let mut probe = self.command("pg_isready");
        probe
            .args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", SUPERUSER])
            .args(["-d", "postgres", "-t", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let what = format!("postgres on {} accepting connections", self.addr());
        wait_until(
            &what,
            READY_LIMIT,
            Duration::from_millis(20),
            &mut [&mut self.process],
            || probe.status().is_ok_and(|s| s.success()),
        )
    }

    /// Crashes the server: `pg_ctl stop -m immediate` (every server process quits at once, no
    /// checkpoint; SIGQUIT to the postmaster should pg_ctl not manage), and waits until every
    /// server process is gone.
    pub fn crash(&mut self) {
        if self.process.pid().is_none() {
            return;
        }
        let stopped = self.tool("pg_ctl").is_ok_and(|mut pg_ctl| {
            pg_ctl.arg("stop").arg("-D").arg(self.data()).args([
                "-m",
                "immediate",
                "-w",
                "-t",
                "10",
            ]);
            matches!(
                run_within(&mut pg_ctl, Duration::from_secs(15), ""),
                Ok(Some(s)) if s.success()
            )
        });
        // What pg_ctl would have sent.
        self.stop_with((!stopped).then_some(Signal::SIGQUIT));
    }

    /// Sends `sig` (if any) to the postmaster and waits for it to end; kills it and its
    /// backends should it not within [`QUIT_GRACE`].
    fn stop_with(&mut self, sig: Option<Signal>) {
        let Some(pid) = self.process.pid() else {
            return;
        };
        let backends = children_of(pid);
        if let Some(sig) = sig {
            self.process.signal(sig);
        }
        if !self.process.wait_for_exit(QUIT_GRACE) {
            for backend in backends {
                signal(backend, Signal::SIGKILL);
            }
        }
    }

    /// Stops the server: an immediate shutdown (its data goes with its directory).
    pub fn stop(&mut self) {
        self.stop_with(Some(Signal::SIGQUIT));
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGQUIT makes the postmaster end its backends, which lead sessions of their own
        // (SIGKILL would leave them behind for a while).
        self.stop();
    }
}

/// The direct children of a single-threaded process (a postmaster).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pid::finished;

    #[test]
    fn a_directory_without_the_programs_is_refused() {
        let empty = tempfile::tempdir().unwrap();
        let err = Postgres::builder().bin(empty.path()).start().unwrap_err();
        assert!(err.to_string().contains("lacks one of initdb"), "{err}");
    }

    /// Needs PostgreSQL's server programs (scripts/stores.sh installs them). A crash is an
    /// immediate shutdown, the start after it a recovery, on the same port; dropping the server
    /// leaves no process and no directory behind.
    #[test]
    fn a_server_recovers_from_a_crash_and_leaves_nothing_behind() {
        let mut server = Postgres::builder()
            .database("crash_test")
            .max_connections(20)
            .start()
            .unwrap();
        assert_eq!(
            server.url(),
            format!("postgres://postgres@127.0.0.1:{}/crash_test", server.port())
        );
        let dir = server.dir().to_owned();
        let postmaster = server.pid().unwrap();
        let backends = children_of(postmaster);
        assert!(!backends.is_empty());
        server.crash();
        assert!(finished(postmaster));
        assert!(backends.iter().all(|&b| finished(b)));
        server.start_again().unwrap();
        let text = std::fs::read_to_string(server.log()).unwrap();
        assert!(text.contains("immediate shutdown"), "{text}");
        assert!(text.contains("automatic recovery"), "{text}");
        let postmaster = server.pid().unwrap();
        let backends = children_of(postmaster);
        drop(server);
        assert!(finished(postmaster));
        assert!(backends.iter().all(|&b| finished(b)));
        assert!(!dir.exists());
    }
}
