//! [`SqliteConfig`]: the settings of a [`SqliteStore`](crate::SqliteStore), and the URL form.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result, SqliteSetupError};

/// Default time limit of one store operation.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time SQLite waits for another process's write lock before giving up.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Default interval at which the release poller checks the file for other processes' commits.
pub const DEFAULT_NOTIFY_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Settings of a SQLite store. Start from [`SqliteConfig::default`], adjust the fields, then
/// [`open`](SqliteConfig::open) a file.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteConfig {
    /// Time limit of each store operation (waiting for this handle's connection, SQLite's own
    /// lock wait and the statements), after which it fails with
    /// [`StoreError::Timeout`](leasehold::StoreError::Timeout). Default [`DEFAULT_OP_TIMEOUT`]
    /// (2 s). Must be above zero.
    pub op_timeout: Duration,
    /// How long SQLite retries when another process holds the write lock
    /// (`sqlite3_busy_timeout`); past it an operation fails with
    /// [`StoreError::Unavailable`](leasehold::StoreError::Unavailable). Default
    /// [`DEFAULT_BUSY_TIMEOUT`] (5 s). When it is longer than `op_timeout`, a contended
    /// operation reports `Timeout` first.
    pub busy_timeout: Duration,
    /// Whether to publish release notifications, so waiters take over right after a graceful
    /// release (made by any process on the file). Without them waiters retry at the lease's
    /// expiry. Default `true`.
    pub notifications: bool,
    /// How often the release poller checks `PRAGMA data_version` for commits by other
    /// connections. Default [`DEFAULT_NOTIFY_POLL_INTERVAL`] (20 ms). Must be above zero.
    pub notify_poll_interval: Duration,
    /// `PRAGMA synchronous = FULL` (`true`) or `NORMAL` (`false`). In WAL mode `NORMAL` never
    /// corrupts the file and survives a process crash, but the last commits may be lost on power
    /// failure or an OS crash, which could hand out a fencing token twice. Default `true`.
    pub durable: bool,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            op_timeout: DEFAULT_OP_TIMEOUT,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            notifications: true,
            notify_poll_interval: DEFAULT_NOTIFY_POLL_INTERVAL,
            durable: true,
        }
    }
}

impl SqliteConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`op_timeout`](Self::op_timeout).
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// Sets [`busy_timeout`](Self::busy_timeout).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets [`notifications`](Self::notifications).
    pub fn notifications(mut self, on: bool) -> Self {
        self.notifications = on;
        self
    }

    /// Sets [`notify_poll_interval`](Self::notify_poll_interval).
    pub fn notify_poll_interval(mut self, interval: Duration) -> Self {
        self.notify_poll_interval = interval;
        self
    }

    /// Sets [`durable`](Self::durable).
    pub fn durable(mut self, on: bool) -> Self {
        self.durable = on;
        self
    }

    /// Checks the values, without touching any file.
    pub fn validate(&self) -> Result<()> {
        leasehold::store::check_nonzero(&[
            ("op_timeout", self.op_timeout),
            ("notify_poll_interval", self.notify_poll_interval),
        ])
        .map_err(|e| SqliteSetupError::Config(e.to_string()))?;
        if i32::try_from(self.busy_timeout.as_millis()).is_err() {
            return Err(SqliteSetupError::Config("busy_timeout is too long".to_owned()).into());
        }
        Ok(())
    }
}

/// The file path in a store URL: `sqlite:relative/path.db`, `sqlite:/abs/path.db` or
/// `sqlite:///abs/path.db`. A host part (`sqlite://host/…`), `sqlite::memory:`, an empty path
/// or a query string are refused with [`SqliteSetupError::InvalidUrl`].
pub fn parse_url(url: &str) -> Result<PathBuf> {
    let invalid = |reason: &str| {
        Error::from(SqliteSetupError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        })
    };
    let Some(rest) = url.strip_prefix("sqlite:") else {
        return Err(invalid("expected sqlite:PATH"));
    };
    let path = match rest.strip_prefix("//") {
        Some(after) if after.starts_with('/') => after,
        Some(_) => {
            return Err(invalid(
                "sqlite urls take a file path (sqlite:PATH or sqlite:///ABSOLUTE/PATH), not a host",
            ));
        }
        None => rest,
    };
    if path.is_empty() {
        return Err(invalid("the path is empty"));
    }
    if path.starts_with(':') {
        return Err(invalid(
            "in-memory databases are not supported (use leasehold::MemoryStore)",
        ));
    }
    if path.contains(['?', '#']) {
        return Err(invalid("query strings and fragments are not supported"));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn url_forms() {
        assert_eq!(
            parse_url("sqlite:leases.db").unwrap(),
            Path::new("leases.db")
        );
        assert_eq!(parse_url("sqlite:./a/b.db").unwrap(), Path::new("./a/b.db"));
        assert_eq!(
            parse_url("sqlite:/tmp/x.db").unwrap(),
            Path::new("/tmp/x.db")
        );
        assert_eq!(
            parse_url("sqlite:///tmp/x.db").unwrap(),
            Path::new("/tmp/x.db")
        );
        for bad in [
            "sqlite:",
            "sqlite://",
            "sqlite://host/x.db",
            "sqlite::memory:",
            "sqlite:x.db?mode=ro",
            "postgres://db/x",
            "leases.db",
        ] {
            assert!(
                matches!(
                    parse_url(bad),
                    Err(Error::Store(SqliteSetupError::InvalidUrl { .. }))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn validation() {
        assert!(SqliteConfig::default().validate().is_ok());
        assert!(
            SqliteConfig::default()
                .op_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(
            SqliteConfig::default()
                .notify_poll_interval(Duration::ZERO)
                .validate()
                .is_err()
        );
    }
}
