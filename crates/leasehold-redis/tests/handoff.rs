//! A graceful release wakes a waiter on another connection through pub/sub, long before the
//! lease would have expired.

mod common;

use std::time::{Duration, Instant};

use leasehold::{Lease, LeaseConfig, LeaseName, Release, TryAcquire};
use leasehold_redis::RedisConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_release_hands_over_within_50ms() {
    let prefix = common::test_prefix();
    let connect = || {
        RedisConfig::new(common::redis_url())
            .prefix(prefix.clone())
            .connect()
    };
    // Two stores, two connections: two instances of a service.
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let name = LeaseName::new(format!("handoff/{:08x}", fastrand::u32(..))).unwrap();
    // A ttl far above the bound, so only the notification can explain a fast takeover.
    let config = LeaseConfig::new(Duration::from_secs(30));
    let stores = [a, b];
    let first = Lease::new(stores[0].clone(), name.clone(), config).unwrap();
    let TryAcquire::Acquired(mut guard) = first.try_acquire().await.unwrap() else {
        panic!("free lease not acquired");
    };
    let mut figures = Vec::new();
    for round in 0..5 {
        // The instance that does not hold the lease waits for it.
        let waiter = Lease::new(stores[(round + 1) % 2].clone(), name.clone(), config).unwrap();
        let task = tokio::spawn(async move {
            let guard = waiter.acquire().await.unwrap();
            (guard, Instant::now())
        });
        // Let the waiter see Busy and start waiting on the notification.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = guard.token();
        let released_at = Instant::now();
        assert_eq!(guard.release().await.unwrap(), Release::Released);
        let (next, took_at) = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("waiter took over before the 30 s ttl")
            .unwrap();
        assert!(next.token() > before);
        figures.push(took_at - released_at);
        guard = next;
    }
    guard.release().await.unwrap();
    let max = figures.iter().max().copied().unwrap();
    println!("takeover after graceful release: {figures:?} (max {max:?})");
    assert!(
        max < Duration::from_millis(200),
        "takeover took {max:?}; expected about one notification round trip"
    );
}
