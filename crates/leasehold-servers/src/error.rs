//! What can go wrong starting a server of one's own, waiting for it, or driving it.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// A result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a server of one's own could not be started, got nowhere, or could not be driven.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A program (a server, a tool that sets one up, the watchdog shell) could not be started.
    #[error("cannot start {}{note}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// A hint at what is missing (` (is Redis installed?)`), or empty.
        note: String,
        /// Why it could not be started.
        #[source]
        source: io::Error,
    },
    /// A server or a tool that sets one up failed: it exited, reported a failure, answered what
    /// cannot be gone on from, or is not installed.
    #[error("{server}: {problem}")]
    Server {
        /// Which server: `redis-server`, `redis-sentinel`, `redis-cluster`, `postgres`,
        /// `mariadb`, `etcd`.
        server: &'static str,
        /// What went wrong, with where its log is if it has one.
        problem: String,
    },
    /// A server did not get where it was waited for (answering, in sync, promoted, healthy) in
    /// time.
    #[error("{what} did not happen within {waited:?}{}", see(.log))]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
        /// Where the server's log is, and its last lines, if it has one.
        log: Option<String>,
    },
    /// A file, directory or port the servers need.
    #[error("{what}")]
    Io {
        /// What was done, with its path if it has one.
        what: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// `; see LOG (last lines: …)`, or nothing.
fn see(log: &Option<String>) -> String {
    log.as_ref().map_or_else(String::new, |l| format!("; {l}"))
}

impl Error {
    pub(crate) fn server(server: &'static str, problem: impl Into<String>) -> Self {
        Self::Server {
            server,
            problem: problem.into(),
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }

    /// A program that could not be started; `note` is appended to its name (` (is Redis
    /// installed?)`, or empty). Public for harnesses that start programs of their own.
    pub fn spawn(program: impl Into<PathBuf>, note: impl Into<String>, source: io::Error) -> Self {
        Self::Spawn {
            program: program.into(),
            note: note.into(),
            source,
        }
    }
}
