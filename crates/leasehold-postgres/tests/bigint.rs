//! Values beyond a `bigint` column: refused, or answered as matching nothing.

mod common;

#[tokio::test]
async fn values_beyond_bigint_are_refused_or_match_nothing() {
    let store = common::store().await;
    leasehold_testkit::sql::values_beyond_bigint(&store, "bigint", i64::MAX as u64).await;
}
