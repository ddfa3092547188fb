//! Errors from connecting and configuring; store operations report [`leasehold::StoreError`],
//! fence checks report [`FenceError`](crate::FenceError).

use leasehold::store::{SetupError, StoreSetupError};

/// Why a [`PgStore`](crate::PgStore) or [`Fence`](crate::Fence) could not be set up: the
/// errors every store shares ([`Connect`](SetupError::Connect),
/// [`Migrate`](SetupError::Migrate), [`TooOld`](SetupError::TooOld)), or one of
/// [`PgSetupError`]. Messages show the server as parsed
/// ([`PgConfig::describe`](crate::PgConfig::describe)), never the URL text, so never its
/// password.
pub type Error = SetupError<PgSetupError>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The PostgreSQL store's own setup errors: settings that can never work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgSetupError {
    /// The URL is not a PostgreSQL URL (or `key=value` connection string) the driver accepts.
    /// The message quotes none of the URL (it could not be read, so any part of it might be
    /// a password).
    #[error("invalid postgres url: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// A schema, table or channel name is not a plain identifier.
    #[error(
        "invalid {what} {value:?}: use 1 to 63 ASCII letters, digits and underscores, not starting with a digit"
    )]
    InvalidIdentifier {
        /// Which setting (`schema`, `lease_table`, ...).
        what: &'static str,
        /// The rejected value.
        value: String,
    },
    /// A configuration value is out of range.
    #[error("invalid postgres store configuration: {0}")]
    Config(String),
    /// The TLS settings could not be used (no root certificates, a bad PEM file).
    #[error("tls setup failed: {0}")]
    Tls(String),
}

impl StoreSetupError for PgSetupError {
    fn is_transient(&self) -> bool {
        false
    }

    fn is_invalid(&self) -> bool {
        true
    }
}
