//! Helpers the workspace's tests share (a dev-dependency only, never published): loopback
//! ports, a redis-server of a test's own ([`redis`]), Sentinel groups and Redis Clusters
//! ([`ha`]), a MariaDB server of a test's own ([`mariadb`]), TLS certificates made with the
//! `openssl` tool ([`tls`]), a PostgreSQL stand-in that refuses passwords ([`postgres`]), and
//! the store conformance suite run all at once on one deployment ([`conformance`]), the fleet
//! catalog's shared checks ([`catalog`]), and errors as a user meets them ([`errors`]).
//!
//! Servers are killed when their value is dropped; their data directories live under the
//! system temp dir and go with them. Failures panic with a message naming what is missing, as
//! test helpers do.

pub mod catalog;
pub mod conformance;
pub mod errors;
pub mod ha;
pub mod mariadb;
pub mod postgres;
pub mod redis;
pub mod tls;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use leasehold::{FencingToken, HolderId, LeaseName, Store, store::Acquisition};

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct loopback ports nobody listens on right now.
pub fn free_ports(n: usize) -> Vec<u16> {
    // Every listener is held until all are chosen, so no port is handed out twice.
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("a bound listener's address").port())
        .collect()
}

/// Polls `ready` every 20 ms and panics with `what` if it is not true within `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Acquires the free lease `name` for `who` (ttl 30 s) and returns its token; panics with the
/// store's answer if it did not grant it.
pub async fn acquire_free(store: &impl Store, name: &LeaseName, who: &HolderId) -> FencingToken {
    match store.acquire(name, who, Duration::from_secs(30)).await {
        Ok(Acquisition::Acquired { token }) => token,
        other => panic!("free lease {name} not acquired: {other:?}"),
    }
}
