//! The run history table beyond the conformance check: the trim keeps exactly the `keep`
//! highest keys even when the entry written is older than all of them, and keys above
//! `i64::MAX` are refused, not wrapped.

mod common;

use leasehold::Slots;
use leasehold::{LeaseName, StoreError};

fn task(prefix: &str) -> LeaseName {
    LeaseName::new(format!("{prefix}-{:08x}", fastrand::u32(..))).unwrap()
}

#[tokio::test]
async fn an_entry_older_than_all_kept_ones_is_not_kept() {
    let store = common::store().await;
    let task = task("old-entry");
    for key in [5u64, 6, 7] {
        store
            .record_history(&task, key, &key.to_string(), 3)
            .await
            .unwrap();
    }
    store.record_history(&task, 1, "1", 3).await.unwrap();
    assert_eq!(store.history(&task, 10).await.unwrap(), ["7", "6", "5"]);
    // Replacing a kept key keeps the count; a lower keep trims the rest.
    store.record_history(&task, 5, "five", 3).await.unwrap();
    assert_eq!(store.history(&task, 10).await.unwrap(), ["7", "6", "five"]);
    store.record_history(&task, 8, "8", 2).await.unwrap();
    assert_eq!(store.history(&task, 10).await.unwrap(), ["8", "7"]);
}

#[tokio::test]
async fn keys_above_i64_max_are_refused() {
    let store = common::store().await;
    let task = task("big-key");
    let key = i64::MAX as u64;
    store.record_history(&task, key, "max", 3).await.unwrap();
    let err = store
        .record_history(&task, key + 1, "beyond", 3)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Rejected { .. }), "{err:?}");
    assert!(err.to_string().contains("does not fit"), "{err}");
    assert_eq!(store.history(&task, 10).await.unwrap(), ["max"]);
}
