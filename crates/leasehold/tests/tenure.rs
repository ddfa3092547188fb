//! A token names one tenure: call orders that used to let an old guard's release or renewal
//! touch a newer tenure (issue 11, cases 1, 2 and 5), on a paused clock.

mod support;

use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::{
    HolderId, Leader, LeaderState, Lease, LeaseConfig, LeaseName, LossReason, Release, Store,
    TryAcquire,
};
use std::sync::atomic::Ordering;

const SEC: Duration = Duration::from_secs(1);

fn lease(store: &FaultyStore, holder: &str) -> Lease<FaultyStore> {
    Lease::new(
        store.clone(),
        LeaseName::new("job").unwrap(),
        LeaseConfig::new(SEC * 3),
    )
    .unwrap()
    .with_holder(HolderId::new(holder).unwrap())
}

async fn acquired(lease: &Lease<FaultyStore>) -> leasehold::LeaseGuard {
    match lease.try_acquire().await.unwrap() {
        TryAcquire::Acquired(guard) => guard,
        busy => panic!("expected to acquire, got {busy:?}"),
    }
}

/// Case 1: `drop(guard)` and at once `try_acquire()` on the same `Lease`, with the dropped
/// guard's release reaching the store late.
#[tokio::test(start_paused = true)]
async fn drop_then_reacquire_survives_the_late_release_of_the_dropped_guard() {
    let store = FaultyStore::new();
    store.faults.release_delay_ms.store(500, Ordering::SeqCst);
    let ours = lease(&store, "a");
    let other = lease(&store, "b");
    let old = acquired(&ours).await;
    let old_token = old.token();
    drop(old);
    let new = acquired(&ours).await;
    assert!(new.token() > old_token, "a new tenure has a new token");
    // The dropped guard's release lands now, after the new acquisition.
    tokio::time::sleep(SEC).await;
    let state = store.inner.inspect(ours.name()).await.unwrap().unwrap();
    assert_eq!(state.token, new.token(), "{state:?}");
    assert_eq!(state.holder.as_ref(), Some(ours.holder()));
    assert!(
        matches!(other.try_acquire().await.unwrap(), TryAcquire::Busy { .. }),
        "a second instance acquired a lease the first one holds"
    );
    // The new guard keeps renewing its own tenure.
    tokio::time::sleep(SEC * 10).await;
    assert!(new.is_held());
    assert_eq!(new.loss_reason(), None);
}

/// Acquiring again through a handle that still holds a guard ends that guard's tenure at once,
/// so two guards of one handle never both believe they hold the lease.
#[tokio::test(start_paused = true)]
async fn acquiring_again_ends_the_previous_guard_of_the_handle() {
    let store = FaultyStore::new();
    let ours = lease(&store, "a");
    let first = acquired(&ours).await;
    let second = acquired(&ours).await;
    assert_eq!(first.loss_reason(), Some(LossReason::Superseded));
    assert!(!first.is_held());
    assert!(first.lost_token().is_cancelled());
    assert!(second.token() > first.token());
    // The superseded guard's release cannot free the new tenure.
    assert_eq!(first.release().await.unwrap(), Release::NotHeld);
    tokio::time::sleep(SEC * 10).await;
    assert!(second.is_held());
    let state = store.inner.inspect(ours.name()).await.unwrap().unwrap();
    assert_eq!(state.token, second.token());
}

/// Case 2: renewals stall past the local deadline while the store still lists the holder; the
/// election campaigns again with the same holder id. The new term must have a new token that
/// the old term's (late) release cannot free, and no other instance may be elected meanwhile.
#[tokio::test(start_paused = true)]
async fn re_election_after_a_local_expiry_is_a_new_term_the_old_release_cannot_free() {
    let store = FaultyStore::new();
    store.faults.release_delay_ms.store(300, Ordering::SeqCst);
    let a = Leader::new(lease(&store, "a")).start(std::future::pending());
    let (first, term) = a.elected().await.unwrap();
    let b = Leader::new(lease(&store, "b")).start(std::future::pending());
    store.set(|f| &f.renew_hangs, true);
    term.cancelled().await;
    // The store still lists "a" (its ttl runs from the last renewal, the local deadline from
    // before it was sent); "a" campaigns again at once.
    let (second, _) = a.elected().await.unwrap();
    store.set(|f| &f.renew_hangs, false);
    assert!(second > first, "a repeated token: {second} after {first}");
    tokio::time::sleep(SEC * 10).await;
    let state = store.inner.inspect(a.group()).await.unwrap().unwrap();
    assert_eq!(state.holder.as_ref(), Some(a.holder()), "{state:?}");
    assert_eq!(state.token, second);
    assert!(a.is_leader());
    assert!(!b.is_leader(), "two leaders");
}

/// Case 5: starting and stepping down leaves no task behind.
#[tokio::test(start_paused = true)]
async fn step_down_leaves_no_task_behind() {
    let store = FaultyStore::new();
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    for _ in 0..50 {
        let leader = Leader::new(lease(&store, "a")).start(std::future::pending());
        leader.elected().await.unwrap();
        leader.step_down().await.unwrap();
    }
    // Let released renewers and the shutdown watchers finish.
    tokio::time::sleep(SEC).await;
    let after = metrics.num_alive_tasks();
    assert!(after <= before + 1, "{before} tasks before, {after} after");
}

/// A refusal that retrying cannot fix ends the election after a bounded number of tries, in a
/// state that says why, instead of an idle campaign.
#[tokio::test(start_paused = true)]
async fn repeated_refusals_end_the_election_with_a_reason() {
    let store = FaultyStore::new();
    store.set(|f| &f.refuse, true);
    let a = Leader::new(lease(&store, "a")).start(std::future::pending());
    let mut watch = a.watch();
    let failed = tokio::time::timeout(SEC * 60, async {
        loop {
            if let LeaderState::Failed { error } = &*watch.borrow_and_update() {
                return error.clone();
            }
            watch.changed().await.unwrap();
        }
    })
    .await
    .expect("the election gave up");
    assert!(failed.contains("refused"), "{failed}");
    assert!(a.elected().await.is_none());
}

/// Two tasks acquire through clones of one handle at the same moment: they take turns, the
/// second ends the first's tenure, and never do two guards both report held.
#[tokio::test(start_paused = true)]
async fn concurrent_acquires_through_clones_leave_one_guard_held() {
    let store = FaultyStore::new();
    // Every acquire takes a while to reach the store, so the two overlap in flight.
    store.faults.acquire_wait_ms.store(50, Ordering::SeqCst);
    let lease = Lease::new(
        store.clone(),
        LeaseName::new("clones").unwrap(),
        LeaseConfig::new(Duration::from_secs(10)),
    )
    .unwrap();
    for _ in 0..20 {
        let (a, b) = (lease.clone(), lease.clone());
        let (x, y) = tokio::join!(
            tokio::spawn(async move { a.try_acquire().await }),
            tokio::spawn(async move { b.try_acquire().await })
        );
        let guards: Vec<_> = [x.unwrap().unwrap(), y.unwrap().unwrap()]
            .into_iter()
            .filter_map(|t| match t {
                TryAcquire::Acquired(g) => Some(g),
                TryAcquire::Busy { .. } => None,
            })
            .collect();
        let held = guards.iter().filter(|g| g.is_held()).count();
        assert_eq!(held, 1, "{guards:?}");
        let newest = guards.iter().map(|g| g.token()).max().unwrap();
        let live = guards.iter().find(|g| g.is_held()).unwrap();
        assert_eq!(live.token(), newest, "the newer tenure is the one held");
        let state = store.inspect(lease.name()).await.unwrap().unwrap();
        assert_eq!(state.token, newest, "the store agrees");
    }
}

/// A ttl no clock can hold is refused when the lease is made, not a panic later.
#[test]
fn a_ttl_beyond_a_year_is_a_config_error() {
    let err = Lease::new(
        leasehold::MemoryStore::new(),
        LeaseName::new("forever").unwrap(),
        LeaseConfig::new(Duration::MAX),
    )
    .unwrap_err();
    assert!(err.to_string().contains("too long"), "{err}");
}
