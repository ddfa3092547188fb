//! What can stop a benchmark.

use leasehold::StoreError;
use leasehold::store::BoxError;

/// A result of the bench.
pub(crate) type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Why a store could not be measured, or a run could not start.
///
/// A store that fails is reported with its error chain (`what: cause: cause…`) and the run goes
/// on with the next store; a bad flag, a failed in-process measurement (memory per lease,
/// placement) or a report that cannot be written stops the run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A flag the run cannot use (`--rounds 0`, an etcd URL the floors cannot reach).
    #[error("{0}")]
    Usage(String),
    /// The store (or the floor's own client) could not connect to its server.
    #[error("connect to {target}")]
    Connect {
        /// The server, without credentials.
        target: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// A store operation failed.
    #[error("{what}")]
    Store {
        /// The operation and the lease it was for.
        what: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A lease (`Lease`, `LeaseSession`, `Scheduler`) could not be set up or taken.
    #[error("{what}")]
    Lease {
        /// What was asked.
        what: String,
        /// The library's error.
        #[source]
        source: BoxError,
    },
    /// A floor's request (the driver beside the store, or the peer crate) failed.
    #[error("{what}")]
    Floor {
        /// The request.
        what: String,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// Reading `/proc` failed.
    #[error("{what}")]
    Io {
        /// What was read.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A store or a measurement answered what the benchmark cannot go on from (a lease that
    /// should be free is busy, a held lease was lost, a waiter never took over).
    #[error("{0}")]
    Unexpected(String),
    /// The JSON report could not be written.
    #[error("cannot write the JSON report")]
    Json(#[source] serde_json::Error),
}

impl BenchError {
    /// A store operation's failure.
    pub(crate) fn store(what: impl Into<String>, source: StoreError) -> Self {
        Self::Store {
            what: what.into(),
            source,
        }
    }

    /// A lease's failure: a [`leasehold::LeaseError`], or an invalid lease name, config or schedule.
    pub(crate) fn lease(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Lease {
            what: what.into(),
            source: source.into(),
        }
    }

    /// A floor request's failure.
    pub(crate) fn floor(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Floor {
            what: what.into(),
            source: source.into(),
        }
    }

    /// A connection's failure.
    pub(crate) fn connect(target: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Connect {
            target: target.into(),
            source: source.into(),
        }
    }

    /// The error and its causes on one line, `: ` apart.
    pub(crate) fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(e) = cause {
            out.push_str(": ");
            out.push_str(&e.to_string());
            cause = e.source();
        }
        out.replace('\n', " ")
    }
}
