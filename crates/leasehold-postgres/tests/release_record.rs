//! The tables record their schema version and the oldest release that may still write to them
//! (the meta table, see `leasehold::skew`); a release older than that refuses them and writes
//! nothing, eagerly (`connect`) or lazily (every operation is refused).

mod common;

use leasehold::skew;
use leasehold_postgres::Error;

async fn meta(schema: &str) -> Vec<(String, String)> {
    common::raw()
        .await
        .query(
            &format!("SELECT key, value FROM \"{schema}\".meta ORDER BY key"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

async fn exec(sql: &str) {
    common::raw().await.batch_execute(sql).await.unwrap();
}

#[tokio::test]
async fn tables_record_their_version_and_the_oldest_writer_and_never_lower_it() {
    let schema = common::fresh_schema();
    let config = || common::config().schema(&schema);
    drop(config().connect().await.unwrap());
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(
        meta(&schema).await,
        [
            pair("min_writer", skew::OLDEST_WRITER),
            pair("schema_version", "2")
        ]
    );
    exec(&format!(
        "UPDATE \"{schema}\".meta SET value = '{}' WHERE key = 'min_writer';
         UPDATE \"{schema}\".meta SET value = '3' WHERE key = 'schema_version'",
        skew::THIS_RELEASE
    ))
    .await;
    drop(config().connect().await.unwrap());
    assert_eq!(
        meta(&schema).await,
        [
            pair("min_writer", skew::THIS_RELEASE),
            pair("schema_version", "3")
        ]
    );
    // Release 0.1.0's tables (no meta table) gain the record.
    exec(&format!("DROP TABLE \"{schema}\".meta")).await;
    drop(config().connect().await.unwrap());
    assert_eq!(
        meta(&schema).await,
        [
            pair("min_writer", skew::OLDEST_WRITER),
            pair("schema_version", "2")
        ]
    );
    common::drop_schema(&schema).await;
}

#[tokio::test]
async fn tables_that_need_a_newer_release_are_refused_and_left_as_they_were() {
    let schema = common::fresh_schema();
    let config = || common::config().schema(&schema);
    drop(config().connect().await.unwrap());
    // A newer release's record, and a table it dropped that this one would create again.
    exec(&format!(
        "UPDATE \"{schema}\".meta SET value = '99.0.0' WHERE key = 'min_writer';
         DROP TABLE \"{schema}\".tasks"
    ))
    .await;
    let before = meta(&schema).await;

    let err = config().connect().await.expect_err("too old");
    let Error::TooOld { source, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(source.required, "99.0.0");
    assert!(!err.is_transient());
    assert!(
        source
            .to_string()
            .contains("upgrade leasehold to at least 99.0.0")
    );

    let lazy = config().connect_lazy().unwrap();
    leasehold_testkit::errors::refuses_as_too_old(&lazy, "99.0.0").await;
    drop(lazy);

    assert_eq!(meta(&schema).await, before);
    let tasks = common::raw()
        .await
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'tasks'",
            &[&schema],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(tasks, 0, "the refused release created nothing");
    common::drop_schema(&schema).await;
}
