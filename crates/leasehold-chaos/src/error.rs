//! What can stop a chaos run.
//!
//! A run whose guarantees did not hold is not an error: [`run`](crate::run) returns exit status 1
//! and the report says what failed. These are the runs that could not be carried out.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use leasehold::NameError;
use leasehold::store::BoxError;
use leasehold_connect::OpenError;

use crate::pg_url::PgUrlError;

/// A result of the harness.
pub(crate) type Result<T, E = ChaosError> = std::result::Result<T, E>;

/// Why a chaos run could not start or be carried out.
///
/// Each message says what failed; the causes, if any, are in the [`source`] chain
/// (`std::error::Error::source`), which the CLI prints after it.
///
/// [`source`]: std::error::Error::source
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChaosError {
    /// A flag the run cannot use (`--replicas 1`, a `--postgres-bin` without the programs).
    #[error("{0}")]
    Usage(String),
    /// `--postgres-url` cannot be used (a bad flag too; the message never shows the URL).
    #[error(transparent)]
    PostgresUrl(#[from] PgUrlError),
    /// One of the harness's own servers (Redis, the sentinel group, the Redis Cluster,
    /// PostgreSQL, etcd), or a tool that sets one up, failed: it exited, reported a failure,
    /// answered what the run cannot go on from, or cannot be run on this machine.
    #[error("{server}: {problem}")]
    Server {
        /// Which server: `redis-server`, `redis-cluster`, `postgres`, `etcd`, `mariadb`.
        server: &'static str,
        /// What went wrong, with where its log is if it has one.
        problem: String,
        /// The underlying error, if there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// A server of the harness's own did not get where the run needs it (answering, in sync,
    /// promoted, healthy) in time.
    #[error("{what} did not happen within {waited:?}{}", see(.log))]
    ServerTimeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
        /// Where the server's log is, and its last lines, if it has one.
        log: Option<String>,
    },
    /// No replica took the leader lease after the replicas started.
    #[error(
        "no replica acquired the lease within {waited:?} (last store error: {last_error:?}); see {}",
        logs.display()
    )]
    NoLeader {
        /// How long the harness waited.
        waited: Duration,
        /// The last error of the harness's own view of the lease, if it had one.
        last_error: Option<String>,
        /// The replicas' logs.
        logs: PathBuf,
    },
    /// A program (a replica, a server, a tool, the watchdog shell) could not be started: a
    /// [`leasehold_servers::Error::Spawn`], whose note is a hint at what is missing or where
    /// the program's log is.
    #[error(transparent)]
    Spawn(leasehold_servers::Error),
    /// A file, directory, port or system lookup the run needs failed.
    #[error("{what}")]
    Io {
        /// What was done, with its path if it has one.
        what: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The harness's own view of the lease could not open the store.
    #[error("cannot open the store to watch the lease")]
    Store(#[source] OpenError),
    /// The lease name the run made up is not a valid lease name.
    #[error("the run's lease name {name:?} is not valid")]
    LeaseName {
        /// The name.
        name: String,
        /// Why it is not valid.
        #[source]
        source: NameError,
    },
    /// The witnesses' ledger could not be read for the check.
    #[error("cannot read the ledger {}", path.display())]
    Ledger {
        /// The ledger file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// `report.json` or `timeline.svg` could not be written.
    #[error("cannot write {}", path.display())]
    Report {
        /// The file.
        path: PathBuf,
        /// The JSON or I/O error.
        #[source]
        source: BoxError,
    },
    /// The run was interrupted (Ctrl-C).
    #[error("interrupted")]
    Interrupted,
    /// The run failed after it started: its servers and replicas are stopped, its logs kept.
    #[error("chaos run failed; logs in {}", out.display())]
    Run {
        /// The run's directory (report, ledger, logs).
        out: PathBuf,
        /// What failed.
        #[source]
        source: Box<ChaosError>,
    },
}

/// `; see LOG (last lines: …)`, or nothing.
fn see(log: &Option<String>) -> String {
    log.as_ref().map_or_else(String::new, |l| format!("; {l}"))
}

impl ChaosError {
    /// A failure of one of the harness's own servers, without an underlying error.
    pub(crate) fn server(server: &'static str, problem: impl Into<String>) -> Self {
        Self::Server {
            server,
            problem: problem.into(),
            source: None,
        }
    }

    /// A wait for `what` that took longer than `waited`.
    pub(crate) fn timeout(what: impl Into<String>, waited: Duration) -> Self {
        Self::ServerTimeout {
            what: what.into(),
            waited,
            log: None,
        }
    }

    /// A program that could not be started; `note` is appended to its name (` (is Redis
    /// installed?)`, or empty).
    pub(crate) fn spawn(
        program: impl Into<PathBuf>,
        note: impl Into<String>,
        source: io::Error,
    ) -> Self {
        Self::Spawn(leasehold_servers::Error::spawn(program, note, source))
    }

    /// An I/O failure; `what` says what was done (`cannot create DIR`).
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error and its causes, `: ` apart, as the CLI prints them (through anyhow).
    fn chain(e: ChaosError) -> String {
        format!("{:#}", anyhow::Error::new(e))
    }

    #[test]
    fn messages_say_what_failed_and_keep_their_causes() {
        let failed = ChaosError::Run {
            out: "/tmp/run".into(),
            source: Box::new(ChaosError::spawn(
                "redis-server",
                " (is Redis installed?)",
                io::Error::from(io::ErrorKind::NotFound),
            )),
        };
        assert_eq!(
            chain(failed),
            "chaos run failed; logs in /tmp/run: cannot start redis-server (is Redis \
             installed?): entity not found"
        );
        let waited = ChaosError::ServerTimeout {
            what: "postgres on 127.0.0.1:5 accepting connections".into(),
            waited: Duration::from_secs(60),
            log: Some("see pg.log (last lines: x)".into()),
        };
        assert_eq!(
            chain(waited),
            "postgres on 127.0.0.1:5 accepting connections did not happen within 60s; see \
             pg.log (last lines: x)"
        );
        assert_eq!(
            chain(ChaosError::timeout(
                "redis-cluster: promotion",
                Duration::from_secs(30)
            )),
            "redis-cluster: promotion did not happen within 30s"
        );
        assert_eq!(
            chain(ChaosError::from(PgUrlError::NotTcp)),
            PgUrlError::NotTcp.to_string()
        );
        let etcd = ChaosError::Server {
            server: "etcd",
            problem: "cannot start a 3-member cluster".into(),
            source: Some("etcd not on PATH".into()),
        };
        assert_eq!(
            chain(etcd),
            "etcd: cannot start a 3-member cluster: etcd not on PATH"
        );
    }
}
