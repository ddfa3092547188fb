//! The lease engine's timing on a paused tokio clock: renewal schedule, the local deadline,
//! cancellation on loss, late replies, handoff.

mod support;

use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::store::Acquisition;
use leasehold::{
    HolderId, Lease, LeaseConfig, LeaseError, LeaseName, LossReason, Release, Store, StoreError,
    TryAcquire,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(3);
const MS: Duration = Duration::from_millis(1);

fn lease(store: &FaultyStore) -> Lease<FaultyStore> {
    Lease::new(
        store.clone(),
        LeaseName::new("job").unwrap(),
        LeaseConfig::new(TTL),
    )
    .unwrap()
}

async fn held(lease: &Lease<FaultyStore>) -> leasehold::LeaseGuard {
    match lease.try_acquire().await.unwrap() {
        TryAcquire::Acquired(guard) => guard,
        TryAcquire::Busy { holder, .. } => panic!("busy, held by {holder}"),
    }
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl() {
    let store = FaultyStore::new();
    let start = Instant::now();
    let guard = held(&lease(&store)).await;
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let offsets: Vec<Duration> = store.renewal_times().iter().map(|t| *t - start).collect();
    assert_eq!(offsets, vec![MS * 1000, MS * 2000, MS * 3000, MS * 4000]);
    assert!(guard.is_held());
    assert_eq!(
        guard.deadline() - start,
        MS * 4000 + TTL - LeaseConfig::new(TTL).drift_margin
    );
}

#[tokio::test(start_paused = true)]
async fn unconfirmed_renewals_cancel_at_the_local_deadline() {
    let store = FaultyStore::new();
    let start = Instant::now();
    let guard = held(&lease(&store)).await;
    store.set(|f| &f.renew_hangs, true);
    let token = guard.lost_token();
    token.cancelled().await;
    let drift = LeaseConfig::new(TTL).drift_margin;
    // Measured from when the acquire was sent, minus the drift margin: before the store's expiry.
    assert_eq!(Instant::now() - start, TTL - drift);
    assert_eq!(guard.loss_reason(), Some(LossReason::Expired));
    assert!(!guard.is_held());
    // The store still lists us until its own ttl runs out: the local view ends first.
    let state = store.inner.inspect(guard.name()).await.unwrap().unwrap();
    assert_eq!(state.holder.as_ref(), Some(guard.holder()));
    assert_eq!(state.remaining, drift);
}

#[tokio::test(start_paused = true)]
async fn store_answer_lost_cancels_at_once() {
    let store = FaultyStore::new();
    let start = Instant::now();
    let guard = held(&lease(&store)).await;
    store.set(|f| &f.renew_lost, true);
    assert_eq!(guard.lost().await, Some(LossReason::TakenOver));
    assert_eq!(Instant::now() - start, MS * 1000, "at the first renewal");
}

#[tokio::test(start_paused = true)]
async fn errors_are_retried_and_a_recovery_keeps_the_lease() {
    let store = FaultyStore::new();
    let l = lease(&store);
    let guard = held(&l).await;
    let token = guard.token();
    store.set(|f| &f.down, true);
    tokio::time::sleep(MS * 2_100).await;
    store.set(|f| &f.down, false);
    tokio::time::sleep(MS * 300).await;
    // First attempt at 1 s, then every retry interval (200 ms) until the outage ends at 2.1 s.
    let attempts = store.renewal_times().len();
    assert_eq!(attempts, 7, "1.0 1.2 1.4 1.6 1.8 2.0 2.2");
    assert!(guard.is_held());
    assert_eq!(guard.token(), token);
    assert_eq!(guard.loss_reason(), None);
}

#[tokio::test(start_paused = true)]
async fn a_long_outage_loses_the_lease_before_the_store_expires_it() {
    let store = FaultyStore::new();
    let start = Instant::now();
    let guard = held(&lease(&store)).await;
    store.set(|f| &f.down, true);
    assert_eq!(guard.lost().await, Some(LossReason::Expired));
    assert!(Instant::now() - start < TTL);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_reply_after_the_deadline_is_not_trusted() {
    let store = FaultyStore::new();
    let start = Instant::now();
    let guard = held(&lease(&store)).await;
    // The store renews, but its answer takes longer than the lease has left.
    store
        .faults
        .renew_delay_ms
        .store(2_500, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(guard.lost().await, Some(LossReason::Expired));
    assert_eq!(
        Instant::now() - start,
        TTL - LeaseConfig::new(TTL).drift_margin
    );
}

#[tokio::test(start_paused = true)]
async fn an_acquire_reply_after_the_deadline_is_not_a_lease() {
    let store = FaultyStore::new();
    let l = lease(&store);
    store
        .faults
        .acquire_delay_ms
        .store(3_000, std::sync::atomic::Ordering::SeqCst);
    match l.try_acquire().await {
        Err(LeaseError::LateReply { elapsed }) => assert_eq!(elapsed, TTL),
        other => panic!("expected a late reply, got {other:?}"),
    }
    store
        .faults
        .acquire_delay_ms
        .store(0, std::sync::atomic::Ordering::SeqCst);
    // The late grant is handed back rather than left to expire.
    tokio::task::yield_now().await;
    let state = store.inner.inspect(l.name()).await.unwrap().unwrap();
    assert_eq!(state.holder, None);
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_is_an_error_not_busy() {
    let store = FaultyStore::new();
    store.set(|f| &f.down, true);
    let l = lease(&store);
    assert!(matches!(
        l.try_acquire().await,
        Err(LeaseError::Store(StoreError::Unavailable { .. }))
    ));
}

#[tokio::test(start_paused = true)]
async fn release_hands_over_to_a_waiter_at_once() {
    let store = FaultyStore::new();
    let first = held(&lease(&store)).await;
    let second = lease(&store);
    let waiter = tokio::spawn(async move { second.acquire().await.unwrap() });
    tokio::time::sleep(MS * 500).await;
    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), Release::Released);
    let next = waiter.await.unwrap();
    assert_eq!(
        Instant::now(),
        released_at,
        "woken by the notification, no poll"
    );
    assert!(next.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_waiter_takes_over_right_when_a_crashed_holder_expires() {
    let store = FaultyStore::new();
    let name = LeaseName::new("job").unwrap();
    // A holder that crashed: it acquired and then never renewed.
    let crashed = HolderId::new("crashed").unwrap();
    let Acquisition::Acquired {
        token: crashed_token,
    } = store.inner.acquire(&name, &crashed, TTL).await.unwrap()
    else {
        panic!("free lease busy");
    };
    let start = Instant::now();
    let guard = lease(&store).acquire().await.unwrap();
    let waited = Instant::now() - start;
    assert!(waited > TTL && waited <= TTL + MS * 12, "{waited:?}");
    assert_eq!(guard.token().get(), crashed_token.get() + 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_guard_releases_best_effort() {
    let store = FaultyStore::new();
    let l = lease(&store);
    let guard = held(&l).await;
    let token = guard.lost_token();
    drop(guard);
    token.cancelled().await;
    tokio::time::sleep(MS).await;
    let state = store.inner.inspect(l.name()).await.unwrap().unwrap();
    assert_eq!(state.holder, None);
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_callers_token_does_not_touch_the_guard() {
    let store = FaultyStore::new();
    let guard = held(&lease(&store)).await;
    guard.lost_token().cancel();
    tokio::time::sleep(MS * 5_000).await;
    assert!(guard.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_renewal_still_tells_the_work_to_stop_at_the_stop_margin() {
    let store = FaultyStore::new();
    let start = Instant::now();
    let guard = held(&lease(&store)).await;
    store.set(|f| &f.renew_hangs, true);
    guard.cancelled().await;
    let config = LeaseConfig::new(TTL);
    // The renewal sent at 1 s never answers: the work is told to stop a stop margin before the
    // local deadline, not at it.
    assert_eq!(
        Instant::now() - start,
        TTL - config.drift_margin - config.stop_margin
    );
    assert!(
        guard.loss_reason().is_none(),
        "not lost yet: only told to stop"
    );
}

/// The expiring signal is made only when asked for: a token asked for before the stop margin
/// fires with it, and a guard asked for the first time after the margin passed answers with a
/// token already cancelled (and `expiring()` returns at once), while neither lease is lost yet.
#[tokio::test(start_paused = true)]
async fn the_expiring_signal_reaches_tokens_asked_for_before_and_after_it() {
    let store = FaultyStore::new();
    let start = Instant::now();
    let config = LeaseConfig::new(TTL);
    let early = held(&lease(&store)).await;
    let late = Lease::new(store.clone(), LeaseName::new("other").unwrap(), config).unwrap();
    let late = held(&late).await;
    let asked_early = early.cancellation_token();
    store.set(|f| &f.renew_hangs, true);
    asked_early.cancelled().await;
    assert_eq!(
        Instant::now() - start,
        TTL - config.drift_margin - config.stop_margin
    );
    // Let the other guard's renewer pass the same instant.
    tokio::time::sleep(MS).await;
    assert!(late.loss_reason().is_none() && early.loss_reason().is_none());
    assert!(late.cancellation_token().is_cancelled());
    tokio::time::timeout(MS, late.cancelled())
        .await
        .expect("expiring() returns at once once warned");
    assert!(!late.lost_token().is_cancelled());
}

/// The loss signal is made only when asked for, as the expiring one: a token asked for before
/// the loss fires with it, one asked for after it is already cancelled, `lost()` then returns at
/// once, and `is_held` turns false with it.
#[tokio::test(start_paused = true)]
async fn the_loss_signal_reaches_tokens_asked_for_before_and_after_it() {
    let store = FaultyStore::new();
    let config = LeaseConfig::new(TTL);
    let early = held(&lease(&store)).await;
    let late = Lease::new(store.clone(), LeaseName::new("other").unwrap(), config).unwrap();
    let late = held(&late).await;
    let asked_early = early.lost_token();
    store.set(|f| &f.renew_hangs, true);
    asked_early.cancelled().await;
    assert_eq!(early.loss_reason(), Some(LossReason::Expired));
    assert!(!early.is_held());
    // Let the other guard's renewer pass the same instant.
    tokio::time::sleep(MS).await;
    assert_eq!(late.loss_reason(), Some(LossReason::Expired));
    assert!(!late.is_held());
    assert!(late.lost_token().is_cancelled());
    let reason = tokio::time::timeout(MS, late.lost())
        .await
        .expect("lost() returns at once once lost");
    assert_eq!(reason, Some(LossReason::Expired));
}

#[tokio::test(start_paused = true)]
async fn deadline_updates_follow_each_confirmed_renewal_only() {
    let store = FaultyStore::new();
    let start = Instant::now();
    let guard = held(&lease(&store)).await;
    let drift = LeaseConfig::new(TTL).drift_margin;
    let mut updates = guard.deadline_updates();
    assert_eq!(*updates.borrow_and_update() - start, TTL - drift);
    updates.changed().await.unwrap();
    // The first renewal, sent at a third of the ttl.
    assert_eq!(Instant::now() - start, MS * 1000);
    assert_eq!(
        *updates.borrow_and_update() - start,
        MS * 1000 + TTL - drift
    );
    // A subscriber that comes later starts from the current deadline.
    assert_eq!(*guard.deadline_updates().borrow(), guard.deadline());
    // Unconfirmed renewals move nothing: the next change is the guard going away.
    store.set(|f| &f.renew_hangs, true);
    guard.lost_token().cancelled().await;
    assert!(!updates.has_changed().unwrap());
    assert_eq!(*updates.borrow() - start, MS * 1000 + TTL - drift);
}

/// The README's pattern, renewals hanging: a job that stops on `cancellation_token()` and takes
/// a little while to wind down has ended before the lease expires in the store, so before any
/// other instance can acquire it. (On the loss signal, `lost_token()`, it would still be running
/// when the other instance gets the lease.)
#[tokio::test(start_paused = true)]
async fn a_job_stopping_on_the_cancellation_token_ends_before_the_store_frees_the_lease() {
    let store = FaultyStore::new();
    let config = LeaseConfig::new(TTL);
    let guard = held(&lease(&store)).await;
    let acquired_at = Instant::now();
    store.set(|f| &f.renew_hangs, true);
    let stop = guard.cancellation_token();
    let wind_down = config.stop_margin / 2;
    let job = tokio::spawn(async move {
        stop.cancelled().await;
        tokio::time::sleep(wind_down).await; // flushing, closing files
        Instant::now()
    });
    // Another instance tries every 10 ms until the store lets it in.
    let other = Lease::new(store.inner.clone(), LeaseName::new("job").unwrap(), config)
        .unwrap()
        .with_holder(HolderId::new("other").unwrap());
    let taken_at = loop {
        if let TryAcquire::Acquired(_) = other.try_acquire().await.unwrap() {
            break Instant::now();
        }
        tokio::time::sleep(MS * 10).await;
    };
    let ended_at = job.await.unwrap();
    assert!(
        ended_at < taken_at,
        "the job ended {:?} after acquisition, the other instance got the lease at {:?}",
        ended_at - acquired_at,
        taken_at - acquired_at
    );
    assert_eq!(guard.loss_reason(), Some(LossReason::Expired));
}

/// The order of a lease lost here first (no renewal confirmed by the local deadline), then
/// released: the store still lists the holder until its own expiry, and the release frees it
/// there, so a waiting instance takes over at once. (A session's guard does the same.)
#[tokio::test(start_paused = true)]
async fn a_release_after_a_local_loss_still_frees_the_lease_in_the_store() {
    let store = FaultyStore::new();
    let l = lease(&store);
    let guard = held(&l).await;
    store.set(|f| &f.renew_hangs, true);
    assert_eq!(guard.lost().await, Some(LossReason::Expired));
    let state = store.inner.inspect(l.name()).await.unwrap().unwrap();
    assert_eq!(state.holder.as_ref(), Some(l.holder()), "still listed");
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    let other = Lease::new(store.inner.clone(), l.name().clone(), LeaseConfig::new(TTL))
        .unwrap()
        .with_holder(HolderId::new("other").unwrap());
    assert!(matches!(
        other.try_acquire().await.unwrap(),
        TryAcquire::Acquired(_)
    ));
}
