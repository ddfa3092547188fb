//! The lease layer's conformance checks: a [`Lease`] guard on a real store. They are among the
//! checks [`conformance_tests!`](crate::conformance_tests) runs against every store (the others,
//! of the store's own operations, are in the store layer's `conformance`).

// Test support: a failed expectation here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::lease::config::LeaseConfig;
use crate::lease::guard::{Lease, TryAcquire};
use crate::store::answers::Release;
use crate::store::conformance::{LONG_TTL, SHORT_TTL, unique_name};
use crate::store::traits::{Catalog, Membership, Purge, Slots};

/// Dropping a guard and at once acquiring again through the same [`Lease`]: the new guard's
/// tenure survives the dropped guard's background release, and a second instance stays out.
pub async fn drop_then_reacquire_keeps_the_new_tenure<S: Slots + Purge + Membership + Catalog>(
    store: S,
) {
    let name = unique_name("drop-reacquire");
    let config = LeaseConfig::new(LONG_TTL);
    let lease = Lease::new(store.clone(), name.clone(), config).unwrap();
    let other = Lease::new(store.clone(), name.clone(), config).unwrap();
    for round in 0..5 {
        let TryAcquire::Acquired(old) = lease.try_acquire().await.unwrap() else {
            panic!("round {round}: free lease not acquired");
        };
        let old_token = old.token();
        drop(old);
        let TryAcquire::Acquired(new) = lease.try_acquire().await.unwrap() else {
            panic!("round {round}: re-acquire after drop was busy");
        };
        assert!(
            new.token() > old_token,
            "round {round}: new tenure, new token"
        );
        // Let the dropped guard's release reach the store.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let state = store.inspect(&name).await.unwrap().unwrap();
        assert_eq!(state.token, new.token(), "round {round}: {state:?}");
        assert_eq!(state.holder.as_ref(), Some(lease.holder()), "round {round}");
        assert!(new.is_held(), "round {round}");
        assert!(
            matches!(other.try_acquire().await.unwrap(), TryAcquire::Busy { .. }),
            "round {round}: a second instance acquired a lease that is held"
        );
        assert_eq!(new.release().await.unwrap(), Release::Released);
    }
}

/// A [`Lease`] guard on this store keeps its lease across several ttls, then hands it over on
/// release; a waiting [`Lease::acquire`] takes it.
pub async fn guard_renews_and_hands_over<S: Slots + Purge + Membership + Catalog>(store: S) {
    let name = unique_name("guard");
    let config = LeaseConfig::new(SHORT_TTL);
    let first = Lease::new(store.clone(), name.clone(), config).unwrap();
    let second = Lease::new(store.clone(), name.clone(), config).unwrap();
    let TryAcquire::Acquired(guard) = first.try_acquire().await.unwrap() else {
        panic!("free lease not acquired");
    };
    tokio::time::sleep(SHORT_TTL * 3).await;
    assert!(guard.is_held(), "renewed across three ttls");
    assert!(matches!(
        second.try_acquire().await.unwrap(),
        TryAcquire::Busy { .. }
    ));
    let waiter = tokio::spawn(async move { second.acquire().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let token = guard.token();
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    let next = tokio::time::timeout(SHORT_TTL * 4, waiter)
        .await
        .expect("waiter took over")
        .unwrap();
    assert!(next.token() > token);
    next.release().await.unwrap();
}
