//! Errors from connecting and configuring; store operations report [`leasehold::StoreError`].

use leasehold::store::{SetupError, StoreSetupError};

/// Why a [`RedisStore`](crate::RedisStore) could not be set up: the server unreachable or
/// refusing ([`Connect`](SetupError::Connect)), keys a newer release uses
/// ([`TooOld`](SetupError::TooOld)), or one of [`RedisSetupError`]. URLs in messages have their
/// password removed. Keys need no migration, so [`Migrate`](SetupError::Migrate) never happens
/// here.
pub type Error = SetupError<RedisSetupError>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The Redis store's own setup errors: settings that can never work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisSetupError {
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
}

impl StoreSetupError for RedisSetupError {
    fn is_transient(&self) -> bool {
        false
    }

    fn is_invalid(&self) -> bool {
        true
    }
}
