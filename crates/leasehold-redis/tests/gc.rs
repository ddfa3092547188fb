//! Garbage collection on the real server: fencing counters expire a retention after their last
//! acquisition, so 100,000 names used once leave nothing behind, and a name seen again starts
//! above its old tokens.

mod common;

use std::time::{Duration, Instant};

use leasehold::{HolderId, LeaseName, Release, Store, store::Acquisition};
use leasehold_redis::RedisConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_of_names_used_once_expire_and_tokens_stay_ahead() {
    let prefix = common::test_prefix();
    let store = RedisConfig::new(common::redis_url())
        .prefix(&prefix)
        .retention(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    let holder = HolderId::new("gc").unwrap();
    let ttl = Duration::from_millis(500);
    // 100,000 jobs, each with its own lease, taken and released.
    let started = Instant::now();
    let mut first_token = None;
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in 0..100 {
        let (store, holder) = (store.clone(), holder.clone());
        tasks.spawn(async move {
            let mut first = None;
            for i in 0..1000 {
                let name = LeaseName::new(format!("job:{}", chunk * 1000 + i)).unwrap();
                let Acquisition::Acquired { token } =
                    store.acquire(&name, &holder, ttl).await.unwrap()
                else {
                    panic!("busy");
                };
                first.get_or_insert(token);
                assert_eq!(
                    store.release(&name, &holder, token).await.unwrap(),
                    Release::Released
                );
            }
            first
        });
    }
    while let Some(first) = tasks.join_next().await {
        first_token = first_token.or(first.unwrap());
    }
    println!("100,000 acquire+release in {:?}", started.elapsed());
    let mut conn = store.connection();
    let pattern = format!("{prefix}:*");
    let count = |conn: &mut leasehold_redis::RedisConnection| {
        let pattern = pattern.clone();
        let mut conn = conn.clone();
        async move {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut conn)
                .await
                .unwrap();
            // The store's release record (`{#meta}:release`) is kept for good.
            keys.iter().filter(|k| !k.contains(":{#meta}:")).count()
        }
    };
    // The last counters still exist, each expiring within the retention.
    let last_fence = store.fence_key(&LeaseName::new("job:99999").unwrap());
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&last_fence)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 3000, "counter expiry {pttl} ms");
    let done = Instant::now();
    loop {
        let left = count(&mut conn).await;
        if left == 0 {
            break;
        }
        assert!(
            done.elapsed() < Duration::from_secs(6),
            "{left} keys left after the retention"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("all keys gone {:?} after the last release", done.elapsed());
    // A name used again starts from the clock, above the tokens it had.
    let name = LeaseName::new("job:0").unwrap();
    let Acquisition::Acquired { token } = store.acquire(&name, &holder, ttl).await.unwrap() else {
        panic!("busy");
    };
    assert!(
        token > first_token.unwrap(),
        "{token} after {first_token:?}"
    );
}

/// A counter set back (what a failover to a replica that missed the last acquisition leaves, or a
/// restart that lost it) still hands out a token above every earlier one: tokens never fall below
/// the server's clock. And a counter expires a retention after the name's last acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_set_back_or_expired_still_hands_out_higher_tokens() {
    let prefix = common::test_prefix();
    let retention = Duration::from_millis(1000);
    let store = RedisConfig::new(common::redis_url())
        .prefix(&prefix)
        .retention(retention)
        .connect()
        .await
        .unwrap();
    let (holder, ttl) = (HolderId::new("busy").unwrap(), Duration::from_millis(200));
    let name = LeaseName::new("set-back").unwrap();
    let mut conn = store.connection();
    let fence = store.fence_key(&name);
    let acquire = async || {
        let Acquisition::Acquired { token } = store.acquire(&name, &holder, ttl).await.unwrap()
        else {
            panic!("busy");
        };
        assert_eq!(
            store.release(&name, &holder, token).await.unwrap(),
            Release::Released
        );
        token
    };
    let first = acquire().await;
    let second = acquire().await;
    assert!(second > first);
    // The increment that handed out `second` is lost: the counter is back at `first`.
    let () = redis::cmd("SET")
        .arg(&fence)
        .arg(first.get().to_string())
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
    let third = acquire().await;
    assert!(
        third > second,
        "{third} after {second} (counter set back to {first})"
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&fence)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((1..=1000).contains(&pttl), "counter expiry {pttl} ms");
    // Gone a retention after the last acquisition; the next token is still higher.
    tokio::time::sleep(retention + Duration::from_millis(100)).await;
    let exists: bool = redis::cmd("EXISTS")
        .arg(&fence)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists, "the counter outlived its retention");
    let fourth = acquire().await;
    assert!(fourth > third, "{fourth} after {third}");
}
