//! Values beyond a `BIGINT` column: refused, or answered as matching nothing. A refused slot
//! claim answers `last + 1`, so the highest slot is one below `i64::MAX`.

mod common;

#[tokio::test]
async fn values_beyond_bigint_are_refused_or_match_nothing() {
    let store = common::store().await;
    leasehold_testkit::sql::values_beyond_bigint(&store, "BIGINT", i64::MAX as u64 - 1).await;
}
