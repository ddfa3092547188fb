//! Errors from connecting and configuring; store operations report [`leasehold::StoreError`],
//! fence checks report [`FenceError`](crate::FenceError).

use leasehold::StoreError;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`PgStore`](crate::PgStore) or [`Fence`](crate::Fence) could not be set up. URLs in
/// messages have their password removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not a PostgreSQL URL (or `key=value` connection string) the driver accepts.
    #[error("invalid postgres url {url}: {reason}")]
    InvalidUrl {
        /// The URL, password removed.
        url: String,
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
    /// The server could not be reached, timed out, or refused the connection or credentials.
    #[error("could not connect to {url}: {source}")]
    Connect {
        /// The URL, password removed.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
    /// Creating the tables failed (for example: no permission to create the schema).
    #[error("could not create the lease tables on {url}: {source}")]
    Migrate {
        /// The URL, password removed.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
}
