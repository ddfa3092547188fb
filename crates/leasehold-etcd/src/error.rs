//! Errors: [`Error`] from configuring and connecting, [`RequestError`] as the source of a
//! failed store operation's [`leasehold::StoreError`].

use leasehold::StoreError;
use leasehold::store::{SetupError, StoreSetupError};

/// Why an [`EtcdStore`](crate::EtcdStore) could not be set up: no member answered or the
/// cluster refused the credentials ([`Connect`](SetupError::Connect)), keys a newer release uses
/// ([`TooOld`](SetupError::TooOld)), or one of [`EtcdSetupError`]. No variant carries the URL's
/// text or a password. Keys need no migration, so [`Migrate`](SetupError::Migrate) never
/// happens here.
pub type Error = SetupError<EtcdSetupError>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The etcd store's own setup errors: settings that can never work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdSetupError {
    /// The URL is not an `etcd://` URL this crate accepts.
    #[error("invalid etcd url: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value is out of range, or a file it names cannot be read.
    #[error("invalid etcd store configuration: {0}")]
    Config(String),
}

impl StoreSetupError for EtcdSetupError {
    fn is_transient(&self) -> bool {
        false
    }

    fn is_invalid(&self) -> bool {
        true
    }
}

/// What went wrong talking to etcd: the source of a [`StoreError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// No connection could be opened to any member.
    #[error("no member reachable: {0}")]
    Connect(String),
    /// The connection broke while the request was in flight; it may or may not have been applied.
    #[error("connection to {endpoint} failed: {message}")]
    Transport {
        /// The member, `host:port`.
        endpoint: String,
        /// The transport's error.
        message: String,
    },
    /// etcd answered with a gRPC status other than OK.
    #[error("etcd answered {code} ({}): {message}", code_name(*.code))]
    Status {
        /// The gRPC status code (14 unavailable, 7 permission denied, 16 unauthenticated, ...).
        code: i32,
        /// etcd's message (`etcdserver: no leader`, ...).
        message: String,
    },
    /// etcd's answer could not be read.
    #[error("unreadable answer from etcd: {0}")]
    Decode(String),
    /// No member could be reached, and one at least because its TLS certificate did not verify
    /// (a CA other than `?ca=`, or the system's roots, signed it; a host name it is not for) or
    /// it refused this client: a configuration to fix, which retrying does not.
    #[error("no member reachable over TLS, certificate refused: {0}")]
    Certificate(String),
}

impl RequestError {
    /// Whether retrying later may succeed: connection failures (but a refused certificate) and
    /// the statuses etcd gives while it has no leader, is overloaded or timed out a proposal.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect(_) | Self::Transport { .. } => true,
            // CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, UNAVAILABLE.
            Self::Status { code, .. } => matches!(code, 1 | 4 | 8 | 10 | 14),
            Self::Decode(_) | Self::Certificate(_) => false,
        }
    }

    /// This error as a [`StoreError`] for `what`: transient ones as
    /// [`StoreError::Unavailable`], refusals as [`StoreError::Rejected`].
    pub(crate) fn into_store_error(self, what: impl std::fmt::Display) -> StoreError {
        if self.is_transient() {
            StoreError::unavailable(format!("{what}: {self}"), self)
        } else if let Self::Decode(message) = self {
            StoreError::Corrupt(format!("{what}: {message}"))
        } else {
            StoreError::rejected(format!("{what}: {self}"), self)
        }
    }
}

fn code_name(code: i32) -> &'static str {
    match code {
        1 => "cancelled",
        2 => "unknown",
        3 => "invalid argument",
        4 => "deadline exceeded",
        5 => "not found",
        6 => "already exists",
        7 => "permission denied",
        8 => "resource exhausted",
        9 => "failed precondition",
        10 => "aborted",
        11 => "out of range",
        12 => "unimplemented",
        13 => "internal",
        14 => "unavailable",
        15 => "data loss",
        16 => "unauthenticated",
        _ => "unknown code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_leader_is_transient_and_permission_denied_is_not() {
        let no_leader = RequestError::Status {
            code: 14,
            message: "etcdserver: no leader".into(),
        };
        assert!(no_leader.is_transient());
        assert!(no_leader.into_store_error("acquire").is_transient());
        let denied = RequestError::Status {
            code: 7,
            message: "etcdserver: permission denied".into(),
        };
        let err = denied.into_store_error("acquire of x");
        assert!(matches!(err, StoreError::Rejected { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "store refused the operation: acquire of x: etcd answered 7 (permission denied): etcdserver: permission denied"
        );
    }
}
