#![doc = include_str!("../README.md")]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod config;
mod error;
mod host_clock;
mod poller;
#[macro_use]
mod schema;
mod store;

pub use config::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_NOTIFY_POLL_INTERVAL, DEFAULT_OP_TIMEOUT, SqliteConfig, parse_url,
};
pub use error::{Error, FileContents, Result, SqliteSetupError};
pub use store::SqliteStore;

/// The SQLite driver this crate is built on (with SQLite bundled), so users need one dependency.
pub use rusqlite;

/// Opens the database file named by `url` with the default [`SqliteConfig`].
///
/// Accepted forms: `sqlite:relative/path.db`, `sqlite:/absolute/path.db` and
/// `sqlite:///absolute/path.db`. The file is created if missing; its directory must exist.
/// Fails with [`SqliteSetupError::InvalidUrl`] for other forms and with the errors of
/// [`SqliteStore::open`] for an unusable file.
pub async fn connect(url: &str) -> Result<SqliteStore> {
    connect_with(url, SqliteConfig::default()).await
}

/// Opens the leasehold store in the file named by `url` (forms as for [`connect`]), never
/// creating one: for a program that only reads or controls a store others run on (a status
/// command), where a mistyped path must fail rather than answer from a new, empty store. Fails
/// with [`SqliteSetupError::NotFound`] when there is no file and [`SqliteSetupError::NotAStore`] for a file leasehold
/// did not make; see [`SqliteStore::open_existing`].
pub async fn connect_existing(url: &str) -> Result<SqliteStore> {
    SqliteStore::open_existing(parse_url(url)?, SqliteConfig::default()).await
}

/// [`connect`] with the given settings.
pub async fn connect_with(url: &str, config: SqliteConfig) -> Result<SqliteStore> {
    SqliteStore::open(parse_url(url)?, config).await
}
