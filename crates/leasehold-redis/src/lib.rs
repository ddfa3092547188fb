#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod call;
mod config;
mod conn;
mod error;
mod listener;
mod native;
mod scripts;
mod store;
mod url;

pub use config::{DEFAULT_OP_TIMEOUT, DEFAULT_PREFIX, RedisConfig};
pub use conn::RedisConnection;
pub use error::{Error, RedisSetupError, Result};
pub use store::RedisStore;
pub use url::{CLUSTER_SCHEME, ClusterUrl, SENTINEL_SCHEME, SentinelUrl};

/// The Redis driver this crate is built on, so users need one dependency.
pub use redis;

/// Connects to the Redis server at `url` with the default [`RedisConfig`].
///
/// Accepted forms: `redis://[[user]:password@]host[:port][/db]`, `rediss://…` for TLS,
/// `redis+unix:///path/to/socket` / `unix:///path`, a primary behind Sentinel
/// ([`SentinelUrl`]: `redis+sentinel://host:26379[,host:26379…]/MASTER`) and a Redis Cluster
/// ([`ClusterUrl`]: `redis+cluster://host:port[,host:port…]`). Fails with [`Error::Connect`] if the server
/// cannot be reached or refuses the credentials; the password never appears in the error.
pub async fn connect(url: &str) -> Result<RedisStore> {
    RedisConfig::new(url).connect().await
}

/// Like [`connect`], but returns at once and connects in the background, so a service starts
/// while Redis is down: every operation answers
/// [`StoreError::Unavailable`](leasehold::StoreError::Unavailable) until the server answers (see
/// [`RedisConfig::connect_lazy`]). Fails only on a URL or settings that can never work, or
/// outside a Tokio runtime.
pub fn connect_lazy(url: &str) -> Result<RedisStore> {
    RedisConfig::new(url).connect_lazy()
}
