//! A store created while its server is down (issue 12): `connect_lazy` returns at once, every
//! operation is `Unavailable` until the server answers, then the store works without being
//! recreated.

mod common;

use std::time::{Duration, Instant};

use leasehold::{HolderId, LeaseName, Store, StoreError, store::Acquisition};
use leasehold_redis::{Error, RedisConfig, RedisSetupError, RedisStore};
use leasehold_testkit::redis::OwnRedis;

fn name(tag: &str) -> LeaseName {
    LeaseName::new(format!("{tag}/{:08x}", fastrand::u32(..))).unwrap()
}

/// Retries `acquire` until it succeeds, failing the test after `within`.
async fn acquire_within(store: &RedisStore, lease: &LeaseName, within: Duration) {
    let who = HolderId::new("lazy-holder").unwrap();
    let deadline = Instant::now() + within;
    loop {
        match store.acquire(lease, &who, Duration::from_secs(10)).await {
            Ok(Acquisition::Acquired { .. }) => return,
            Ok(busy) => panic!("{busy:?}"),
            Err(e) => assert!(Instant::now() < deadline, "still failing: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_created_while_the_server_is_down_works_once_it_is_up() {
    let port = leasehold_testkit::free_port();
    let started = Instant::now();
    let store = leasehold_redis::connect_lazy(&format!("redis://127.0.0.1:{port}")).unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "connect_lazy returned after {:?}",
        started.elapsed()
    );
    let (lease, who) = (name("lazy"), HolderId::new("lazy-holder").unwrap());
    for _ in 0..3 {
        let err = store
            .acquire(&lease, &who, Duration::from_secs(10))
            .await
            .expect_err("nothing listens yet");
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
        let err = store.now_millis().await.expect_err("nothing listens yet");
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut server = OwnRedis::start_on(port, &[]);
    acquire_within(&store, &lease, Duration::from_secs(5)).await;
    let state = store.inspect(&lease).await.unwrap().unwrap();
    assert_eq!(state.holder, Some(who));
    // Later outages are the connection manager's business as with `connect`.
    server.kill();
    let err = store.inspect(&lease).await.expect_err("server gone");
    assert!(err.is_transient(), "{err:?}");
    server.restart();
    acquire_within(&store, &name("lazy-again"), Duration::from_secs(5)).await;
    server.kill();
}

/// A first connection refused for a reason other than I/O (here a wrong password) does not stick:
/// once the server accepts the credentials, the store works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_first_connection_is_retried_until_accepted() {
    let mut server = OwnRedis::start(&["--requirepass", "old-password"]);
    let mut config = RedisConfig::new(format!("redis://:new-password@127.0.0.1:{}", server.port));
    config.max_reconnect_delay = Duration::from_millis(500);
    let store = config.connect_lazy().unwrap();
    let lease = name("lazy-auth");
    let err = store
        .acquire(
            &lease,
            &HolderId::new("h").unwrap(),
            Duration::from_secs(10),
        )
        .await
        .expect_err("wrong password");
    assert!(
        matches!(err, StoreError::Rejected { .. }),
        "refused credentials: {err:?}"
    );
    assert!(!err.to_string().contains("new-password"), "{err}");
    let ok = server.cli(&[
        "-a",
        "old-password",
        "--no-auth-warning",
        "CONFIG",
        "SET",
        "requirepass",
        "new-password",
    ]);
    assert_eq!(ok.trim(), "OK");
    acquire_within(&store, &lease, Duration::from_secs(5)).await;
    server.kill();
}

#[tokio::test]
async fn bad_urls_and_settings_fail_at_once() {
    let err = leasehold_redis::connect_lazy("http://127.0.0.1:6379").unwrap_err();
    assert!(
        matches!(err, Error::Store(RedisSetupError::InvalidUrl { .. })),
        "{err:?}"
    );
    let err = RedisConfig::new(common::redis_url())
        .prefix("")
        .connect_lazy()
        .unwrap_err();
    assert!(
        matches!(err, Error::Store(RedisSetupError::Config(_))),
        "{err:?}"
    );
}

#[test]
fn outside_a_runtime_is_a_config_error_not_a_panic() {
    let err = leasehold_redis::connect_lazy(&common::redis_url()).unwrap_err();
    assert!(
        matches!(err, Error::Store(RedisSetupError::Config(_))),
        "{err:?}"
    );
}
