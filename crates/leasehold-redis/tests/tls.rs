//! `rediss://` against a TLS redis-server of the test's own, with a CA made for the test
//! (`leasehold_testkit::tls`).

mod common;

use std::time::Duration;

use leasehold::{HolderId, LeaseName, Store, StoreError};
use leasehold_redis::{Error, RedisConfig};
use leasehold_testkit::redis::OwnRedis;
use leasehold_testkit::tls::TestCerts;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_urls_connect_over_tls() {
    let certs = TestCerts::new();
    let file = |f: std::path::PathBuf| f.display().to_string();
    let server = OwnRedis::start(&[
        "--port",
        "0",
        "--tls-port",
        "{port}",
        "--tls-cert-file",
        &file(certs.cert()),
        "--tls-key-file",
        &file(certs.key()),
        "--tls-ca-cert-file",
        &file(certs.ca()),
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let ca = std::fs::read(certs.ca()).unwrap();
    let store = RedisConfig::new(&url)
        .tls_ca_pem(ca)
        .connect()
        .await
        .unwrap();
    let name = LeaseName::new("tls/check").unwrap();
    let who = HolderId::new("tls-holder").unwrap();
    let token = leasehold_testkit::acquire_free(&store, &name, &who).await;
    // Release notifications travel over TLS too.
    let mut sub = store.subscribe_releases().unwrap();
    tokio::time::timeout(Duration::from_secs(5), sub.live())
        .await
        .expect("release listener live");
    store.release(&name, &who, token).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), sub.released(&name))
        .await
        .unwrap();

    // Without the test CA the server's certificate is not trusted: a clear connect error.
    let err = leasehold_redis::connect(&url).await.unwrap_err();
    println!("untrusted: {err}");
    assert!(
        matches!(
            err,
            Error::Connect {
                source: StoreError::Unavailable { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn rediss_to_a_plain_port_fails_cleanly() {
    let err = RedisConfig::new(common::redis_url().replacen("redis://", "rediss://", 1))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    println!("{err}");
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
}
