//! Spread-group membership on the real server: entries expire on the server's clock, the key
//! itself goes once its last entry has expired, and a key of another type is a typed refusal.

mod common;

use leasehold::Membership;
use std::time::Duration;

use leasehold::{HolderId, LeaseName, StoreError};
use leasehold_redis::RedisConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_expire_and_their_key_with_them() {
    let store = RedisConfig::new(common::redis_url())
        .prefix(common::test_prefix())
        .connect()
        .await
        .unwrap();
    let group = LeaseName::new("spread").unwrap();
    let (a, b) = (HolderId::new("a").unwrap(), HolderId::new("b").unwrap());
    let ttl = Duration::from_millis(400);
    store.members(&group, &a, ttl).await.unwrap();
    assert_eq!(
        store.members(&group, &b, ttl * 3).await.unwrap(),
        vec![a.clone(), b.clone()]
    );
    let mut conn = store.connection();
    let key = store.members_key(&group);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        pttl > 400 && pttl <= 1200,
        "the key lives as long as b: {pttl}"
    );
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    assert_eq!(
        store.members(&group, &b, ttl).await.unwrap(),
        vec![b.clone()],
        "a expired on the server's clock"
    );
    tokio::time::sleep(ttl * 3 + Duration::from_millis(200)).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0, "no entry left, no key left");

    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = store.members(&group, &a, ttl).await.unwrap_err();
    assert!(matches!(err, StoreError::Rejected { .. }), "{err}");
    assert!(err.to_string().contains(&key), "{err}");
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
}
