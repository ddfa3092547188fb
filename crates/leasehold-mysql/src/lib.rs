#![doc = include_str!("../README.md")]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod config;
mod error;
mod poller;
mod schema;
mod store;

pub use config::{
    DEFAULT_NOTIFY_POLL_INTERVAL, DEFAULT_OP_TIMEOUT, DEFAULT_TABLE_PREFIX, MySqlConfig,
};
pub use error::{Error, MySqlSetupError, Result};
pub use leasehold_sql::SqlStore;
pub use schema::{SCHEMA_VERSION, Statements};
pub use store::{MySql, MySqlStore};

/// The MySQL driver this crate is built on, so users need one dependency.
pub use mysql_async;

/// Connects to the MySQL or MariaDB database at `url` with the default [`MySqlConfig`]: tables
/// `leasehold_leases`, `leasehold_slots`, `leasehold_history`, `leasehold_members`,
/// `leasehold_tasks`, `leasehold_task_instances` and `leasehold_schema` (created if missing),
/// 2 s per operation, release polling every 50 ms.
///
/// Accepted form: `mysql://[user[:password]@]host[:port]/database[?ssl-mode=MODE&ssl-ca=PATH]`
/// (`mariadb://` too), MODE one of `disabled`, `required`, `verify-ca`, `verify-identity`.
/// Fails with [`Error::Connect`] if the server cannot be reached or refuses the credentials or
/// the database, [`MySqlSetupError::Schema`] if a table at one of the names is not the store's,
/// [`MySqlSetupError::NotWritable`] for a read-only user; the password never appears in the error.
pub async fn connect(url: &str) -> Result<MySqlStore> {
    MySqlConfig::new(url).connect().await
}

/// Like [`connect`], but returns at once and connects in the background: operations answer
/// [`StoreError::Unavailable`](leasehold::StoreError::Unavailable) until the server answers
/// (see [`MySqlConfig::connect_lazy`]). Fails only on a URL or settings that can never work.
pub fn connect_lazy(url: &str) -> Result<MySqlStore> {
    MySqlConfig::new(url).connect_lazy()
}
