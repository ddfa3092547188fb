//! Checks the SQL stores' tests share: values beyond the 64-bit integer columns, which no
//! statement can hold, answered the same on every dialect.

use std::time::Duration;

use leasehold::store::{Acquisition, Renewal, SlotClaim};
use leasehold::{Catalog, FencingToken, HolderId, LeaseName, Release, Slots, StoreError};

/// Panics unless `store` refuses a slot above `max_slot` and a history key above `i64::MAX`,
/// saying they do not fit a `bigint` (the dialect's spelling), claims `max_slot` itself, answers
/// a control record version or a token above `i64::MAX` as not matching, and renews the leases
/// of a batch that it holds beside one whose token is above `i64::MAX`.
pub async fn values_beyond_bigint<S: Slots + Catalog>(store: &S, bigint: &str, max_slot: u64) {
    let task = LeaseName::new(format!("bigint-{:08x}", fastrand::u32(..))).expect("a name");
    let beyond = i64::MAX as u64 + 1;
    let refused = |result: Result<(), StoreError>, what: &str, value: u64| {
        let message = match result {
            Err(StoreError::Rejected { message, .. }) => message,
            other => panic!("{what} {value}: expected a refusal, got {other:?}"),
        };
        assert!(
            message.ends_with(&format!(
                "of {task}: {what} {value} does not fit a {bigint}"
            )),
            "{message}"
        );
    };

    assert_eq!(
        store.claim_slot(&task, max_slot).await.unwrap(),
        SlotClaim::Claimed
    );
    assert_eq!(
        store.claim_slot(&task, max_slot).await.unwrap(),
        SlotClaim::AlreadyRun { last: max_slot }
    );
    refused(
        store.claim_slot(&task, max_slot + 1).await.map(drop),
        "slot",
        max_slot + 1,
    );
    assert_eq!(store.last_slot(&task).await.unwrap(), Some(max_slot));

    refused(
        store.record_history(&task, beyond, "x", 3).await,
        "history key",
        beyond,
    );
    assert!(store.history(&task, 3).await.unwrap().is_empty());

    assert_eq!(store.set_control(&task, None, "{}").await.unwrap(), Some(1));
    assert_eq!(
        store.set_control(&task, Some(beyond), "{}").await.unwrap(),
        None
    );
    assert_eq!(
        store
            .control(&task)
            .await
            .unwrap()
            .control
            .map(|c| c.version),
        Some(1)
    );

    let holder = HolderId::new("bigint:1:a").expect("a holder id");
    let ttl = Duration::from_secs(30);
    let Acquisition::Acquired { token } = store.acquire(&task, &holder, ttl).await.unwrap() else {
        panic!("a fresh lease is free");
    };
    let huge = FencingToken(beyond);
    assert_eq!(
        store.renew(&task, &holder, huge, ttl).await.unwrap(),
        Renewal::Lost
    );
    assert_eq!(
        store.release(&task, &holder, huge).await.unwrap(),
        Release::NotHeld
    );
    let batch = [(task.clone(), token), (task.clone(), huge)];
    assert_eq!(
        store.renew_many(&holder, &batch, ttl).await.unwrap(),
        [Renewal::Renewed, Renewal::Lost]
    );
    assert_eq!(
        store.release(&task, &holder, token).await.unwrap(),
        Release::Released
    );
}
