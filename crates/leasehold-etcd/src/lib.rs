#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod config;
mod error;
mod gateway;
mod observed;
mod record;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod watch;
mod wire;

pub use config::{
    DEFAULT_OP_TIMEOUT, DEFAULT_PORT, DEFAULT_PREFIX, Endpoint, EtcdConfig, Password,
};
pub use error::{Error, EtcdSetupError, RequestError, Result};
pub use store::EtcdStore;

/// Connects to the etcd cluster at `url` with the default [`EtcdConfig`]:
/// `etcd://[user[:password]@]host[:port][,host[:port]…][/?options]`, `etcds://…` for TLS.
/// Fails with [`Error::Connect`] if no member answers or the credentials are refused; the
/// password never appears in an error.
pub async fn connect(url: &str) -> Result<EtcdStore> {
    EtcdConfig::from_url(url)?.connect().await
}

/// [`EtcdConfig::connect_lazy`] for `url`: the store at once, connecting on first use. Call it
/// within a tokio runtime.
pub fn connect_lazy(url: &str) -> Result<EtcdStore> {
    EtcdConfig::from_url(url)?.connect_lazy()
}
