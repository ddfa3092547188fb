//! Errors from connecting and configuring; store operations report [`leasehold::StoreError`],
//! fence checks report [`FenceError`](crate::FenceError).

use leasehold::StoreError;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`PgStore`](crate::PgStore) or [`Fence`](crate::Fence) could not be set up. Messages
/// show the server as parsed ([`PgConfig::describe`](crate::PgConfig::describe)), never the URL
/// text, so never its password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// The server could not be reached, timed out, or refused the connection or credentials
    /// (the source says which: [`StoreError::is_transient`] tells an outage from a refusal).
    #[error("could not connect to {url}")]
    Connect {
        /// The server, as [`PgConfig::describe`](crate::PgConfig::describe) shows it.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
    /// Creating the tables failed (for example: no permission to create the schema).
    #[error("could not create the lease tables on {url}")]
    Migrate {
        /// The server, as [`PgConfig::describe`](crate::PgConfig::describe) shows it.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
    /// The tables are in use by a newer release that does not let this one write to them
    /// (the meta table's `min_writer`, see [`leasehold::skew`]). Nothing was written.
    #[error("{url}")]
    TooOld {
        /// The server, as [`PgConfig::describe`](crate::PgConfig::describe) shows it.
        url: String,
        /// The release the tables need.
        #[source]
        source: leasehold::skew::TooOld,
    },
}

impl Error {
    /// Whether retrying later may succeed: the server could not be reached or did not answer in
    /// time. A refusal (credentials, permissions) and a bad URL or setting are not transient.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { source, .. } | Self::Migrate { source, .. } => source.is_transient(),
            _ => false,
        }
    }
}
