//! Errors from connecting and configuring; store operations report [`leasehold::StoreError`].

use leasehold::StoreError;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`MySqlStore`](crate::MySqlStore) could not be set up. Messages show the server as
/// parsed ([`MySqlConfig::describe`](crate::MySqlConfig::describe)), never the URL text, so
/// never its password; each is one line, and leaves its cause to its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// The server could not be reached, timed out, or refused the credentials or the database.
    #[error("could not connect to {url}")]
    Connect {
        /// The server, as [`MySqlConfig::describe`](crate::MySqlConfig::describe) shows it.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
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
    /// The tables are in use by a newer release that does not let this one write to them
    /// (row 3 of `{prefix}schema`, see [`leasehold::skew`]). Nothing was written.
    #[error("{url}")]
    TooOld {
        /// The server, as [`MySqlConfig::describe`](crate::MySqlConfig::describe) shows it.
        url: String,
        /// The release the tables need.
        #[source]
        source: leasehold::skew::TooOld,
    },
    /// Creating the tables failed (for example: no permission to create tables).
    #[error("could not create the lease tables on {url}")]
    Migrate {
        /// The server, as [`MySqlConfig::describe`](crate::MySqlConfig::describe) shows it.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
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

impl Error {
    /// Whether connecting again later may succeed (the server was unreachable, slow or
    /// read-only, not refusing).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { source, .. }
            | Self::Migrate { source, .. }
            | Self::NotWritable { source, .. } => source.is_transient(),
            _ => false,
        }
    }
}
