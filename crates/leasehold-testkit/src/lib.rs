//! Helpers the workspace's tests share (a dev-dependency only, never published): loopback
//! ports, a redis-server of a test's own ([`redis`]), Sentinel groups and Redis Clusters
//! ([`ha`]), a MariaDB server of a test's own ([`mariadb`]), TLS certificates made with the
//! `openssl` tool ([`tls`]), a PostgreSQL stand-in that refuses passwords ([`postgres`]), and
//! the store conformance suite run all at once on one deployment ([`conformance`]), the fleet
//! catalog's shared checks ([`catalog`]), the SQL stores' integer bounds ([`sql`]), and errors
//! as a user meets them ([`errors`]).
//!
//! The servers are `leasehold-servers`'s launchers, which `leasehold chaos` uses too: killed when
//! their value is dropped (or by a watchdog, should the test process die first), their data
//! directories under the system temp dir going with them. Failures panic with the launcher's
//! message (what is missing, the end of the server's log), as test helpers do.

pub mod catalog;
pub mod conformance;
pub mod errors;
pub mod ha;
pub mod mariadb;
pub mod postgres;
pub mod redis;
pub mod sql;
pub mod tls;

use std::time::{Duration, Instant};

use leasehold::{FencingToken, HolderId, LeaseName, Store, store::Acquisition};

/// A loopback port nobody listens on right now, below the kernel's ephemeral range where it
/// leaves room (see [`leasehold_servers::free_ports`]).
pub fn free_port() -> u16 {
    leasehold_servers::free_port().unwrap_or_else(|e| panic!("{e}"))
}

/// `n` distinct loopback ports nobody listens on right now.
pub fn free_ports(n: usize) -> Vec<u16> {
    leasehold_servers::free_ports(n).unwrap_or_else(|e| panic!("{e}"))
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
