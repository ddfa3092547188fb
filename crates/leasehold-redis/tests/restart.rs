//! Against a redis-server of the test's own: restarts without persistence, dropped
//! connections, a server that goes away.

mod common;

use std::time::{Duration, Instant};

use leasehold::{
    FencingToken, HolderId, Lease, LeaseConfig, LeaseName, LossReason, Release, Store, StoreError,
    TryAcquire, store::Acquisition,
};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::OwnRedis;

fn name(tag: &str) -> LeaseName {
    LeaseName::new(format!("{tag}/{:08x}", fastrand::u32(..))).unwrap()
}

fn holder(tag: &str) -> HolderId {
    HolderId::new(format!("{tag}-{:08x}", fastrand::u32(..))).unwrap()
}

async fn connect(server: &OwnRedis) -> RedisStore {
    RedisConfig::new(server.url()).connect().await.unwrap()
}

/// Acquires, retrying while the store is unreachable (the connection is re-established).
async fn acquire_retrying(store: &RedisStore, name: &LeaseName, who: &HolderId) -> FencingToken {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.acquire(name, who, Duration::from_secs(30)).await {
            Ok(Acquisition::Acquired { token }) => return token,
            Ok(busy) => panic!("{busy:?}"),
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("acquire failed: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_a_restart_without_persistence() {
    let mut server = OwnRedis::start(&[]);
    let store = connect(&server).await;
    let (lease, who) = (name("restart"), holder("a"));
    let mut last = FencingToken(0);
    for _ in 0..5 {
        let token = acquire_retrying(&store, &lease, &who).await;
        assert!(token > last);
        last = token;
        assert_eq!(
            store.release(&lease, &who, token).await.unwrap(),
            Release::Released
        );
    }
    server.restart();
    assert_eq!(
        server.cli(&["DBSIZE"]).trim(),
        "0",
        "the restart lost the data"
    );
    let after = acquire_retrying(&store, &lease, &who).await;
    println!("token before restart {last}, after {after}");
    assert!(
        after > last,
        "token after restart {after} must exceed {last}"
    );
    // And again: the re-seeded counter goes on increasing.
    store.release(&lease, &who, after).await.unwrap();
    let again = acquire_retrying(&store, &lease, &who).await;
    assert!(again > after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_keeps_the_lease_across_a_killed_connection() {
    let server = OwnRedis::start(&[]);
    let store = connect(&server).await;
    let lease = Lease::new(
        store.clone(),
        name("killed-conn"),
        LeaseConfig::new(Duration::from_secs(1)),
    )
    .unwrap();
    let TryAcquire::Acquired(guard) = lease.try_acquire().await.unwrap() else {
        panic!("free lease not acquired");
    };
    for _ in 0..3 {
        let killed = server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
        assert_ne!(killed.trim(), "0", "killed our connection");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        guard.is_held(),
        "renewed on a fresh connection: {:?}",
        guard.loss_reason()
    );
    let state = store.inspect(lease.name()).await.unwrap().unwrap();
    assert_eq!(state.holder.as_ref(), Some(lease.holder()));
    assert_eq!(state.token, guard.token());
    assert_eq!(guard.release().await.unwrap(), Release::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_reports_loss_when_the_server_goes_away() {
    let mut server = OwnRedis::start(&[]);
    let store = connect(&server).await;
    let ttl = Duration::from_secs(1);
    let lease = Lease::new(store.clone(), name("gone"), LeaseConfig::new(ttl)).unwrap();
    let TryAcquire::Acquired(guard) = lease.try_acquire().await.unwrap() else {
        panic!("free lease not acquired");
    };
    server.kill();
    let killed_at = Instant::now();
    let reason = tokio::time::timeout(ttl * 3, guard.lost())
        .await
        .expect("loss reported within the ttl");
    assert_eq!(reason, Some(LossReason::Expired));
    assert!(killed_at.elapsed() <= ttl + Duration::from_millis(100));
    // Acquisitions fail as unavailable, quickly (not after the operation timeout).
    let started = Instant::now();
    match store.acquire(lease.name(), &holder("b"), ttl).await {
        Err(e @ StoreError::Unavailable { .. }) => println!("while down: {e}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_come_back_after_the_pubsub_connection_drops() {
    let server = OwnRedis::start(&[]);
    let store = connect(&server).await;
    let channel = store.release_channel().to_owned();
    // The listener subscribes while a waiter waits.
    let mut sub = store.subscribe_releases().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.cli(&["PUBSUB", "NUMSUB", &channel]).ends_with("1\n") {
        assert!(Instant::now() < deadline, "listener did not subscribe");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed = server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed.trim(), "1", "killed the listener's connection");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.cli(&["PUBSUB", "NUMSUB", &channel]).ends_with("1\n") {
        assert!(Instant::now() < deadline, "listener did not resubscribe");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (lease, who) = (name("resub"), holder("a"));
    let token = acquire_retrying(&store, &lease, &who).await;
    store.release(&lease, &who, token).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), sub.released(&lease))
        .await
        .expect("notification after the listener reconnected");
}

/// Waits up to `within` until `channel` has `count` subscribers on `server`.
async fn subscribers_become(server: &OwnRedis, channel: &str, count: usize, within: Duration) {
    let deadline = Instant::now() + within;
    let want = format!("{count}\n");
    while !server.cli(&["PUBSUB", "NUMSUB", channel]).ends_with(&want) {
        assert!(
            Instant::now() < deadline,
            "{channel} did not get {count} subscribers within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A store subscribes to releases only while one of its waiters waits: not after connecting,
/// while a lease is held and renewed, or once the last waiter has stopped waiting (after the
/// listener's linger of 5 to 10 s); a waiter then hears the release that ends its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_subscribes_only_while_someone_waits() {
    let server = OwnRedis::start(&[]);
    let (holder_store, waiter_store) = (connect(&server).await, connect(&server).await);
    let channel = holder_store.release_channel().to_owned();
    let (lease, a, b) = (name("on-demand"), holder("a"), holder("b"));
    let token = acquire_retrying(&holder_store, &lease, &a).await;
    holder_store
        .renew(&lease, &a, token, Duration::from_secs(30))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        server.cli(&["PUBSUB", "NUMSUB", &channel]).ends_with("0\n"),
        "nobody waits, nobody subscribes"
    );

    let waiter = Lease::new(
        waiter_store.clone(),
        lease.clone(),
        LeaseConfig::new(Duration::from_secs(30)),
    )
    .unwrap()
    .with_holder(b);
    let waiting = tokio::spawn(async move { waiter.acquire().await.map(|g| g.token()) });
    subscribers_become(&server, &channel, 1, Duration::from_secs(5)).await;
    assert_eq!(
        holder_store.release(&lease, &a, token).await.unwrap(),
        Release::Released
    );
    let taken = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter heard the release, long before the 30 s lease expired")
        .unwrap()
        .unwrap();
    assert!(taken > token);
    subscribers_become(&server, &channel, 0, Duration::from_secs(15)).await;
}
