//! A store created while its server is unreachable (issue 12): `connect_lazy` returns at once,
//! every operation answers `Unavailable` until the server can be reached, then the tables are
//! migrated and the store works, without a restart.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leasehold::{HolderId, LeaseName, Store, StoreError, store::Acquisition};
use leasehold_postgres::PgConfig;
use tokio::net::{TcpListener, TcpStream};

/// Forwards every connection on `listener` to the shared test server.
async fn forward(listener: TcpListener, server: SocketAddr) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            if let Ok(mut outbound) = TcpStream::connect(server).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_store_works_once_its_server_can_be_reached() {
    // A loopback port with nothing behind it (yet).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let schema = common::fresh_schema();
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    let started = Instant::now();
    let store = PgConfig::new(&url)
        .schema(schema.clone())
        .connect_lazy()
        .expect("settings are fine");
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "returned at once"
    );
    let name = LeaseName::new("lazy").unwrap();
    let me = HolderId::new("me").unwrap();
    for _ in 0..3 {
        let err = store
            .acquire(&name, &me, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
        assert!(err.is_transient());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let server: SocketAddr = "127.0.0.1:5432".parse().unwrap();
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let proxy = tokio::spawn(forward(listener, server));
    let deadline = Instant::now() + Duration::from_secs(15);
    let got = loop {
        match store.acquire(&name, &me, Duration::from_secs(10)).await {
            Ok(a) => break a,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the store did not come up: {e}"),
        }
    };
    assert!(matches!(got, Acquisition::Acquired { .. }), "{got:?}");
    assert!(store.inspect(&name).await.unwrap().is_some());
    drop(store);
    proxy.abort();
    common::drop_schema(&schema).await;
}

#[tokio::test]
async fn bad_settings_fail_at_once() {
    let err = PgConfig::new("postgres://postgres@127.0.0.1:1/test")
        .schema("no such; schema")
        .connect_lazy()
        .unwrap_err();
    assert!(err.to_string().contains("schema"), "{err}");
}

#[test]
fn outside_a_runtime_is_an_error_not_a_panic() {
    let err = PgConfig::new("postgres://postgres@127.0.0.1:1/test")
        .connect_lazy()
        .unwrap_err();
    assert!(err.to_string().contains("Tokio runtime"), "{err}");
}
