//! The keys record their schema version and the oldest release that may still write to them
//! (`PREFIX:{#meta}:release`, see `leasehold::skew`); a release older than that refuses them and
//! writes nothing, eagerly (`connect`) or lazily (every operation is refused).

mod common;

use std::collections::HashMap;

use leasehold::Store;
use leasehold::skew;
use leasehold_redis::{Error, RedisConfig};

async fn conn() -> redis::aio::MultiplexedConnection {
    redis::Client::open(common::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn record(prefix: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(format!("{prefix}:{{#meta}}:release"))
        .query_async(&mut conn().await)
        .await
        .unwrap()
}

async fn set(prefix: &str, field: &str, value: &str) {
    redis::cmd("HSET")
        .arg(format!("{prefix}:{{#meta}}:release"))
        .arg(field)
        .arg(value)
        .query_async::<i64>(&mut conn().await)
        .await
        .unwrap();
}

async fn keys(prefix: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn().await)
        .await
        .unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn keys_record_their_version_and_the_oldest_writer_and_never_lower_it() {
    let prefix = common::test_prefix();
    let config = || RedisConfig::new(common::redis_url()).prefix(&prefix);
    drop(config().connect().await.unwrap());
    let record_is = |min: &str, version: &str| {
        HashMap::from([
            ("min_writer".to_owned(), min.to_owned()),
            ("schema_version".to_owned(), version.to_owned()),
        ])
    };
    assert_eq!(record(&prefix).await, record_is(skew::OLDEST_WRITER, "2"));
    set(&prefix, "min_writer", skew::THIS_RELEASE).await;
    set(&prefix, "schema_version", "3").await;
    drop(config().connect().await.unwrap());
    assert_eq!(record(&prefix).await, record_is(skew::THIS_RELEASE, "3"));
    set(&prefix, "min_writer", "0.0.1").await;
    drop(config().connect().await.unwrap());
    assert_eq!(record(&prefix).await, record_is(skew::OLDEST_WRITER, "3"));
}

#[tokio::test]
async fn keys_that_need_a_newer_release_are_refused_and_left_as_they_were() {
    let prefix = common::test_prefix();
    let config = || RedisConfig::new(common::redis_url()).prefix(&prefix);
    drop(config().connect().await.unwrap());
    set(&prefix, "min_writer", "99.0.0").await;
    let before = (record(&prefix).await, keys(&prefix).await);

    let err = config().connect().await.expect_err("too old");
    let Error::TooOld { source, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(source.required, "99.0.0");
    assert!(!err.is_transient());

    let lazy = config().connect_lazy().unwrap();
    leasehold_testkit::errors::refuses_as_too_old(&lazy, "99.0.0").await;
    assert!(lazy.now_millis().await.is_err());
    drop(lazy);
    assert_eq!((record(&prefix).await, keys(&prefix).await), before);
    redis::cmd("DEL")
        .arg(format!("{prefix}:{{#meta}}:release"))
        .query_async::<i64>(&mut conn().await)
        .await
        .unwrap();
}
