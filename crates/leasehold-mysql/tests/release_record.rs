//! The tables record the oldest release that may still write to them (row 3 of
//! `{prefix}schema`, see `leasehold::skew`); a release older than that refuses them and writes
//! nothing, eagerly (`connect`) or lazily (every operation is refused).

mod common;

use leasehold::skew::{self, Version};
use leasehold_mysql::Error;
use leasehold_mysql::mysql_async::prelude::Queryable;

async fn rows(prefix: &str) -> Vec<(i64, i64)> {
    common::raw()
        .await
        .query(format!(
            "SELECT id, version FROM `{prefix}schema` ORDER BY id"
        ))
        .await
        .unwrap()
}

fn number(version: &str) -> i64 {
    i64::try_from(Version::parse(version).unwrap().number()).unwrap()
}

#[tokio::test]
async fn tables_record_the_oldest_writer_and_never_lower_it() {
    let prefix = common::fresh_prefix();
    let config = || common::config_on(&common::url(), &prefix);
    drop(config().connect().await.unwrap());
    let oldest = number(skew::OLDEST_WRITER);
    assert_eq!(rows(&prefix).await, [(1, 1), (2, 2), (3, oldest)]);
    // Tables from before the row gain it; a higher one this release may use is kept.
    let mut conn = common::raw().await;
    conn.query_drop(format!("DELETE FROM `{prefix}schema` WHERE id = 3"))
        .await
        .unwrap();
    drop(config().connect().await.unwrap());
    assert_eq!(rows(&prefix).await, [(1, 1), (2, 2), (3, oldest)]);
    let this = number(skew::THIS_RELEASE);
    conn.query_drop(format!(
        "UPDATE `{prefix}schema` SET version = {this} WHERE id = 3"
    ))
    .await
    .unwrap();
    drop(config().connect().await.unwrap());
    assert_eq!(rows(&prefix).await, [(1, 1), (2, 2), (3, this)]);
    common::drop_prefix(&prefix).await;
}

#[tokio::test]
async fn tables_that_need_a_newer_release_are_refused_and_left_as_they_were() {
    let prefix = common::fresh_prefix();
    let config = || common::config_on(&common::url(), &prefix);
    drop(config().connect().await.unwrap());
    let mut conn = common::raw().await;
    let needed = number("99.0.0");
    conn.query_drop(format!(
        "UPDATE `{prefix}schema` SET version = {needed} WHERE id = 3"
    ))
    .await
    .unwrap();
    // A table a newer release dropped, which this one would create again.
    conn.query_drop(format!("DROP TABLE `{prefix}task_instances`"))
        .await
        .unwrap();
    let before = (rows(&prefix).await, common::tables(&prefix).await);

    let err = config().connect().await.expect_err("too old");
    let Error::TooOld { source, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(source.required, "99.0.0");
    assert!(!err.is_transient());

    let lazy = config().connect_lazy().unwrap();
    leasehold_testkit::errors::refuses_as_too_old(&lazy, "99.0.0").await;
    drop(lazy);
    assert_eq!((rows(&prefix).await, common::tables(&prefix).await), before);
    common::drop_prefix(&prefix).await;
}
