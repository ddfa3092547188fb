//! Garbage collection on the real server: 100,000 free lease records of distinct names (a lease
//! per job) are purged in one statement; live leases, recent records, slots stay; a purged
//! name's next token is still above its old one.

mod common;

use leasehold::Purge;
use std::time::{Duration, Instant};

use leasehold::{HolderId, LeaseName, Store, store::Acquisition};

#[tokio::test]
async fn a_hundred_thousand_free_records_are_purged_and_tokens_stay_ahead() {
    let schema = common::fresh_schema();
    let store = common::config().schema(&schema).connect().await.unwrap();
    let holder = HolderId::new("gc").unwrap();
    let live = LeaseName::new("job:live").unwrap();
    store
        .acquire(&live, &holder, Duration::from_secs(60))
        .await
        .unwrap();
    // The records of 100k finished jobs: released two hours ago, tokens from back then.
    let old_token: i64 = (chrono_free_now_ms() - 7_200_000) * 1000 + 7;
    let client = common::raw().await;
    client
        .execute(
            &format!(
                "INSERT INTO \"{schema}\".leases (name, holder, token, expires_at)
                 SELECT 'job:' || i, NULL, $1, clock_timestamp() - interval '2 hours'
                   FROM generate_series(1, 100000) AS i"
            ),
            &[&old_token],
        )
        .await
        .unwrap();
    let started = Instant::now();
    let purged = store.purge(Duration::from_secs(3600)).await.unwrap();
    let took = started.elapsed();
    println!("purged {purged} records in {took:?}");
    assert_eq!(purged, 100_000);
    let left: i64 = client
        .query_one(&format!("SELECT count(*) FROM \"{schema}\".leases"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 1, "only the live lease is left");
    assert!(
        store
            .inspect(&live)
            .await
            .unwrap()
            .unwrap()
            .holder
            .is_some()
    );
    // A purged name starts again from the clock: above the token it had.
    let name = LeaseName::new("job:42").unwrap();
    match store
        .acquire(&name, &holder, Duration::from_secs(5))
        .await
        .unwrap()
    {
        Acquisition::Acquired { token } => assert!(token.get() > old_token as u64),
        busy => panic!("{busy:?}"),
    }
    common::drop_schema(&schema).await;
}

fn chrono_free_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
