//! Errors from connecting and configuring; store operations report [`leasehold::StoreError`].

use leasehold::StoreError;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`RedisStore`](crate::RedisStore) could not be set up. URLs in messages have their
/// password removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not a Redis URL the driver accepts.
    #[error("invalid redis url {url}: {reason}")]
    InvalidUrl {
        /// The URL, password removed.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value is out of range.
    #[error("invalid redis store configuration: {0}")]
    Config(String),
    /// The server could not be reached, timed out, or refused the connection or credentials
    /// (the source says which: [`StoreError::is_transient`] tells an outage from a refusal).
    #[error("could not connect to {url}")]
    Connect {
        /// The URL, password removed.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
    /// The keys are in use by a newer release that does not let this one write to them
    /// (the `{#meta}:release` hash's `min_writer`, see [`leasehold::skew`]). Nothing was
    /// written.
    #[error("{url}")]
    TooOld {
        /// The URL, password removed.
        url: String,
        /// The release the keys need.
        #[source]
        source: leasehold::skew::TooOld,
    },
}

impl Error {
    /// Whether retrying later may succeed: the server could not be reached or did not answer in
    /// time. A refusal (credentials, permissions) and a bad URL or setting are not transient.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Connect { source, .. } if source.is_transient())
    }
}
