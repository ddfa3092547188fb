//! `?prefix=` in the URL (issue 43): two stores on one Redis database, opened from URLs alone
//! (as `leasehold --store` and an environment variable give them), keep apart by prefix; the
//! same prefix shares leases. On the shared local Redis.

mod common;

use std::time::Duration;

use common::{redis_url, test_prefix};
use leasehold::{HolderId, LeaseName, Store, store::Acquisition};

/// `redis_url()` with `?prefix=PREFIX` (or `&prefix=` after a query it already has).
fn with_prefix(prefix: &str) -> String {
    let url = redis_url();
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}prefix={prefix}")
}

#[tokio::test]
async fn two_url_prefixes_on_one_database_are_two_applications() {
    let (one, two) = (test_prefix(), test_prefix());
    let app1 = leasehold_redis::connect(&with_prefix(&one)).await.unwrap();
    let app2 = leasehold_redis::connect(&with_prefix(&two)).await.unwrap();
    let app1_again = leasehold_redis::connect_lazy(&with_prefix(&one)).unwrap();
    assert_eq!((app1.prefix(), app2.prefix()), (one.as_str(), two.as_str()));
    assert!(
        app1.describe().ends_with(&format!("(prefix {one})")),
        "{}",
        app1.describe()
    );

    let name = LeaseName::new("nightly").unwrap();
    let ttl = Duration::from_secs(30);
    let (a, b) = (HolderId::new("a").unwrap(), HolderId::new("b").unwrap());
    let first = app1.acquire(&name, &a, ttl).await.unwrap();
    assert!(matches!(first, Acquisition::Acquired { .. }), "{first:?}");
    // Another prefix: another lease of the same name.
    let other = app2.acquire(&name, &b, ttl).await.unwrap();
    assert!(matches!(other, Acquisition::Acquired { .. }), "{other:?}");
    // The same prefix: the same lease, held by `a`.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let same = loop {
        match app1_again.acquire(&name, &b, ttl).await {
            Err(e) if e.is_transient() && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answer => break answer.unwrap(),
        }
    };
    assert!(matches!(same, Acquisition::Busy { .. }), "{same:?}");

    // The keys are under each prefix, none under the default.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for prefix in [&one, &two] {
        let key = format!("{prefix}:{{nightly}}:lease");
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(exists, "{key}");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}
