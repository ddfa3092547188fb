#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod config;
mod conninfo;
mod error;
mod fence;
mod listener;
mod store;

pub use config::{
    DEFAULT_APPLICATION_NAME, DEFAULT_FENCE_TABLE, DEFAULT_HISTORY_TABLE, DEFAULT_INSTANCES_TABLE,
    DEFAULT_LEASE_TABLE, DEFAULT_MEMBERS_TABLE, DEFAULT_META_TABLE, DEFAULT_OP_TIMEOUT,
    DEFAULT_SCHEMA, DEFAULT_SLOT_TABLE, DEFAULT_TASKS_TABLE, PgConfig,
};
pub use error::{Error, PgSetupError, Result};
pub use fence::{Fence, FenceError};
pub use leasehold_sql::SqlStore;
pub use store::{PgStore, Postgres, Statements};

/// The PostgreSQL driver this crate is built on, so users need one dependency.
pub use tokio_postgres;

/// The connection pool behind [`PgStore::pool`](Postgres::pool).
pub use deadpool_postgres;

/// Connects to the PostgreSQL server at `url` with the default [`PgConfig`]: tables in the
/// schema `leasehold` (created if missing), 2 s per operation, release notifications on.
///
/// Accepted forms: `postgres://[user[:password]@]host[:port]/dbname[?param=value&...]`
/// (`postgresql://` too) or a `key=value` connection string. `sslmode=require`, `verify-ca` or
/// `verify-full` turn on TLS; `disable`, `prefer` or no `sslmode` connect without it. Fails with
/// [`Error::Connect`] if the server cannot be reached or refuses the credentials; the password
/// never appears in the error.
pub async fn connect(url: &str) -> Result<PgStore> {
    PgConfig::new(url).connect().await
}

/// Like [`connect`], but returns at once and connects in the background: operations answer
/// [`StoreError::Unavailable`](leasehold::StoreError::Unavailable) until the server answers
/// (see [`PgConfig::connect_lazy`]). Fails only on a URL or settings that can never work.
pub fn connect_lazy(url: &str) -> Result<PgStore> {
    PgConfig::new(url).connect_lazy()
}
