#![doc = include_str!("../README.md")]

mod call;
mod config;
mod error;
mod listener;
mod scripts;
mod store;

pub use config::{DEFAULT_OP_TIMEOUT, DEFAULT_PREFIX, RedisConfig};
pub use error::{Error, Result};
pub use store::RedisStore;

/// The Redis driver this crate is built on, so users need one dependency.
pub use redis;

/// Connects to the Redis server at `url` with the default [`RedisConfig`].
///
/// Accepted forms: `redis://[[user]:password@]host[:port][/db]`, `rediss://…` for TLS,
/// `redis+unix:///path/to/socket` / `unix:///path`. Fails with [`Error::Connect`] if the server
/// cannot be reached or refuses the credentials; the password never appears in the error.
pub async fn connect(url: &str) -> Result<RedisStore> {
    RedisConfig::new(url).connect().await
}
