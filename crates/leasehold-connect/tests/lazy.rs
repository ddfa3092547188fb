//! Starting while the store is down (issue 31): every server store opens lazily the same way, a
//! free `connect_lazy(url)` beside `connect(url)` and a `connect_lazy()` on its config, each
//! returning the store at once; its operations answer a transient error until the server is up.
#![cfg(all(feature = "redis", feature = "postgres", feature = "etcd"))]

use std::time::{Duration, Instant};

use leasehold::{BoxStore, HolderId, LeaseName, Store};

#[tokio::test]
async fn every_server_store_connects_lazily_under_one_name() {
    // Nothing listens on this port.
    let port = leasehold_testkit::free_port();
    let (redis, postgres, etcd) = (
        format!("redis://127.0.0.1:{port}"),
        format!("postgres://app@127.0.0.1:{port}/app"),
        format!("etcd://127.0.0.1:{port}"),
    );
    let started = Instant::now();
    let stores = [
        BoxStore::new(leasehold_redis::connect_lazy(&redis).unwrap()),
        BoxStore::new(
            leasehold_redis::RedisConfig::new(&redis)
                .connect_lazy()
                .unwrap(),
        ),
        BoxStore::new(leasehold_postgres::connect_lazy(&postgres).unwrap()),
        BoxStore::new(
            leasehold_postgres::PgConfig::new(&postgres)
                .connect_lazy()
                .unwrap(),
        ),
        BoxStore::new(leasehold_etcd::connect_lazy(&etcd).unwrap()),
        BoxStore::new(
            leasehold_etcd::EtcdConfig::from_url(&etcd)
                .unwrap()
                .connect_lazy()
                .unwrap(),
        ),
        leasehold_connect::open_store_lazy(&redis).await.unwrap(),
        leasehold_connect::open_store_lazy(&postgres).await.unwrap(),
        leasehold_connect::open_store_lazy(&etcd).await.unwrap(),
    ];
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the lazy stores took {:?} to return",
        started.elapsed()
    );
    let (name, holder) = (
        LeaseName::new("connect-lazy-names").unwrap(),
        HolderId::new("h").unwrap(),
    );
    for store in &stores {
        let err = store
            .acquire(&name, &holder, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(err.is_transient(), "{}: {err}", store.describe());
    }
}
