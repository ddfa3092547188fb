//! Shared test helpers: the local Redis URL, per-run key prefixes, and checks of stores on
//! deployments a test started itself (servers of its own come from `leasehold-testkit`).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use leasehold_redis::{RedisConfig, RedisStore};

/// The shared local Redis: `LEASEHOLD_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A key prefix no other test run uses.
pub fn test_prefix() -> String {
    format!("leasehold-test-{:012x}", fastrand::u64(..) >> 16)
}

/// A store on the shared local Redis, with a prefix of its own.
pub async fn make_store() -> RedisStore {
    RedisConfig::new(redis_url())
        .prefix(test_prefix())
        .connect()
        .await
        .expect("connect to the local redis (set LEASEHOLD_TEST_REDIS_URL)")
}

/// The local Valkey (`LEASEHOLD_TEST_VALKEY_URL`, set by the test command; see
/// `scripts/valkey.sh`), or `None` with a note when it is not set.
pub fn valkey_url() -> Option<String> {
    let url = std::env::var("LEASEHOLD_TEST_VALKEY_URL")
        .ok()
        .filter(|u| !u.is_empty());
    if url.is_none() {
        eprintln!("LEASEHOLD_TEST_VALKEY_URL is not set: skipped (scripts/test.sh sets it)");
    }
    url
}

/// A store on the local Valkey with a prefix of its own, if one is configured.
pub async fn make_valkey_store() -> Option<RedisStore> {
    let url = valkey_url()?;
    Some(
        RedisConfig::new(url)
            .prefix(test_prefix())
            .connect()
            .await
            .expect("connect to the local valkey (LEASEHOLD_TEST_VALKEY_URL)"),
    )
}

/// A store from `connect_lazy` on `url` answers once it has connected in the background: the
/// first acquisition of a fresh name succeeds within 10 s (transient errors until then).
pub async fn lazy_store_connects(url: &str) {
    use leasehold::{HolderId, LeaseName, Store, store::Acquisition};
    let store = RedisConfig::new(url)
        .prefix(test_prefix())
        .connect_lazy()
        .expect("a valid url");
    let (name, who) = (
        LeaseName::new("lazy").unwrap(),
        HolderId::new("lazy").unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.acquire(&name, &who, Duration::from_secs(5)).await {
            Ok(Acquisition::Acquired { .. }) => return,
            Ok(busy) => panic!("fresh name busy: {busy:?}"),
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("lazy store never answered: {e}"),
        }
    }
}

/// Asks for `name` until the store answers (a failover in progress fails as transient), and
/// returns the answer and when it came, from `since`. Fails after 30 s.
pub async fn first_answer_after(
    since: Instant,
    store: &RedisStore,
    name: &leasehold::LeaseName,
    who: &leasehold::HolderId,
    ttl: Duration,
) -> (leasehold::store::Acquisition, Duration) {
    use leasehold::Store;
    loop {
        match store.acquire(name, who, ttl).await {
            Ok(answer) => return (answer, since.elapsed()),
            Err(e) => {
                assert!(e.is_transient(), "failover error is transient: {e}");
                assert!(
                    since.elapsed() < Duration::from_secs(30),
                    "no answer 30 s after the kill: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
