//! Errors from connecting and configuring; store operations report [`leasehold::StoreError`].

use leasehold::StoreError;
use leasehold::store::{SetupError, StoreSetupError};

/// Why a [`MySqlStore`](crate::MySqlStore) could not be set up: the errors every store shares
/// ([`Connect`](SetupError::Connect), [`Migrate`](SetupError::Migrate),
/// [`TooOld`](SetupError::TooOld)), or one of [`MySqlSetupError`]. Messages show the server as
/// parsed ([`MySqlConfig::describe`](crate::MySqlConfig::describe)), never the URL text, so
/// never its password; each is one line, and leaves its cause to its source.
pub type Error = SetupError<MySqlSetupError>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The MySQL store's own setup errors: settings that can never work, tables it cannot use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MySqlSetupError {
    /// The URL is not one this store reads. The message quotes none of the URL (it could not be
    /// read, so any part of it might be a password), only the name of an unknown parameter.
    #[error("invalid mysql url: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// The table prefix is not 1 to 40 ASCII letters, digits and underscores.
    #[error("invalid table_prefix {0:?}: use 1 to 40 ASCII letters, digits and underscores")]
    InvalidPrefix(String),
    /// A configuration value is out of range.
    #[error("invalid mysql store configuration: {0}")]
    Config(String),
    /// The TLS settings could not be used (an unreadable CA file, no certificate in it).
    #[error("tls setup failed: {0}")]
    Tls(String),
    /// A table at one of the store's names is not the store's (other columns, another engine),
    /// or a table is missing while [`migrate`](crate::MySqlConfig::migrate) is off, or the
    /// tables are of a newer schema version than this build knows. Nothing was written.
    #[error("unusable lease tables on {url}: {problem}")]
    Schema {
        /// The server, as [`MySqlConfig::describe`](crate::MySqlConfig::describe) shows it.
        url: String,
        /// What is wrong, naming the table.
        problem: String,
    },
    /// The user cannot write the lease table (a read-only user, or a server in read-only mode
    /// such as a replica). Checked at connect with statements that match no row, so nothing was
    /// written.
    #[error("cannot write the lease tables on {url}")]
    NotWritable {
        /// The server, as [`MySqlConfig::describe`](crate::MySqlConfig::describe) shows it.
        url: String,
        /// What the server said.
        #[source]
        source: StoreError,
    },
}

impl StoreSetupError for MySqlSetupError {
    /// A read-only server may be a replica about to be promoted.
    fn is_transient(&self) -> bool {
        matches!(self, Self::NotWritable { source, .. } if source.is_transient())
    }

    fn is_invalid(&self) -> bool {
        matches!(
            self,
            Self::InvalidUrl { .. } | Self::InvalidPrefix(_) | Self::Config(_) | Self::Tls(_)
        )
    }
}
