//! A `LeaseSession` renews all its leases in one store call per 1,000 per interval, while each
//! guard keeps its own deadline, stop signal and loss.

use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::store::Acquisition;
use leasehold::{
    FencingToken, HolderId, LeaseConfig, LeaseGuard, LeaseName, LeaseSession, LossReason, Release,
    Store, TryAcquire,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(3);

fn session(store: &FaultyStore) -> LeaseSession<FaultyStore> {
    LeaseSession::with_holder(
        store.clone(),
        LeaseConfig::new(TTL),
        HolderId::new("worker-1").unwrap(),
    )
    .unwrap()
}

async fn take(session: &LeaseSession<FaultyStore>, name: &str) -> LeaseGuard {
    match session
        .try_acquire(LeaseName::new(name).unwrap())
        .await
        .unwrap()
    {
        TryAcquire::Acquired(guard) => guard,
        TryAcquire::Busy { holder, .. } => panic!("{name} busy, held by {holder}"),
    }
}

#[tokio::test(start_paused = true)]
async fn thousands_of_leases_take_one_call_per_thousand_per_interval() {
    let store = FaultyStore::new();
    let s = session(&store);
    let mut guards = Vec::new();
    for i in 0..2_500 {
        guards.push(take(&s, &format!("job:{i}")).await);
    }
    assert_eq!(s.len(), 2_500);
    // Ten renewal intervals (1 s each at ttl 3 s), well past the ttl.
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    let batches = store.batches.lock().unwrap().clone();
    assert_eq!(batches.len(), 30, "3 calls per interval: {batches:?}");
    assert!(batches.iter().all(|&n| n <= 1_000));
    assert_eq!(batches.iter().sum::<usize>(), 25_000);
    assert!(guards.iter().all(LeaseGuard::is_held));
    // Each guard's deadline moved with the renewals.
    assert!(guards[0].deadline() > Instant::now() + Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn one_lost_lease_is_lost_alone() {
    let store = FaultyStore::new();
    let s = session(&store);
    let a = take(&s, "a").await;
    let b = take(&s, "b").await;
    // The store drops a's tenure (as if it expired there and someone else came and went).
    let released = store
        .inner
        .release(a.name(), a.holder(), a.token())
        .await
        .unwrap();
    assert_eq!(released, Release::Released);
    assert_eq!(a.lost().await, Some(LossReason::TakenOver));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(b.is_held(), "b is renewed on");
    assert_eq!(s.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_stops_every_lease_at_its_stop_margin_then_its_deadline() {
    let store = FaultyStore::new();
    let s = session(&store);
    let start = Instant::now();
    let a = take(&s, "a").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = take(&s, "b").await;
    store.set(|f| &f.renew_hangs, true);
    let config = LeaseConfig::new(TTL);
    a.cancelled().await;
    assert_eq!(
        Instant::now() - start,
        TTL - config.drift_margin - config.stop_margin
    );
    assert!(a.loss_reason().is_none() && b.is_held(), "b joined later");
    assert_eq!(a.lost().await, Some(LossReason::Expired));
    assert_eq!(Instant::now() - start, TTL - config.drift_margin);
    assert_eq!(b.lost().await, Some(LossReason::Expired));
    assert_eq!(
        Instant::now() - start,
        Duration::from_millis(500) + TTL - config.drift_margin
    );
}

#[tokio::test(start_paused = true)]
async fn release_and_drop_free_the_lease_and_leave_the_others() {
    let store = FaultyStore::new();
    let s = session(&store);
    let a = take(&s, "a").await;
    let b = take(&s, "b").await;
    let c = take(&s, "c").await;
    let (a_name, b_name) = (a.name().clone(), b.name().clone());
    assert_eq!(a.release().await.unwrap(), Release::Released);
    drop(b);
    tokio::time::sleep(Duration::from_millis(10)).await;
    for name in [&a_name, &b_name] {
        let state = store.inner.inspect(name).await.unwrap().unwrap();
        assert_eq!(state.holder, None, "{name} freed");
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(c.is_held());
    assert_eq!(s.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_name_the_session_holds_is_busy_until_released() {
    let store = FaultyStore::new();
    let s = session(&store);
    let first = take(&s, "x").await;
    let name = first.name().clone();
    match s.try_acquire(name.clone()).await.unwrap() {
        TryAcquire::Busy { holder, .. } => assert_eq!(&holder, s.holder()),
        TryAcquire::Acquired(_) => panic!("two guards of one session on one lease"),
    }
    assert!(first.is_held(), "the holder's guard is untouched");
    let old = first.token();
    assert_eq!(first.release().await.unwrap(), Release::Released);
    let second = take(&s, "x").await;
    assert!(second.token() > old);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(second.is_held());
    let state = store.inner.inspect(&name).await.unwrap().unwrap();
    assert_eq!(state.token, second.token());
    assert_ne!(state.token, FencingToken(0));
}

#[tokio::test(start_paused = true)]
async fn a_session_purges_records_free_for_longer_than_the_retention() {
    let store = FaultyStore::new();
    let s = session(&store);
    s.purge_after(Some(Duration::from_secs(2 * 3600)));
    let done = take(&s, "job:done").await;
    let kept = take(&s, "job:running").await;
    let name = done.name().clone();
    tokio::time::sleep(Duration::from_secs(1800)).await;
    done.release().await.unwrap();
    // Purges run hourly from the session's start; at 2 h the record has been free for 1.5 h
    // (kept), at 3 h for 2.5 h (purged).
    tokio::time::sleep(Duration::from_secs(5400 + 60)).await;
    assert!(
        store.inner.inspect(&name).await.unwrap().is_some(),
        "kept within the retention"
    );
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(
        store.inner.inspect(&name).await.unwrap().is_none(),
        "purged after it"
    );
    assert!(kept.is_held());
    assert!(store.inner.inspect(kept.name()).await.unwrap().is_some());
}

/// A lease lost here first (no renewal confirmed by its local deadline) is still listed in the
/// store until the store's own expiry. Releasing or dropping its guard frees it there, as a
/// `Lease` guard's release does, so another holder need not wait for that expiry.
#[tokio::test(start_paused = true)]
async fn a_lease_lost_here_is_still_freed_in_the_store_by_its_release_or_drop() {
    let store = FaultyStore::new();
    let s = session(&store);
    let released = take(&s, "released").await;
    let dropped = take(&s, "dropped").await;
    store.set(|f| &f.renew_hangs, true);
    assert_eq!(released.lost().await, Some(LossReason::Expired));
    assert_eq!(dropped.loss_reason(), Some(LossReason::Expired));
    assert_eq!(s.len(), 0, "lost leases are not held");
    let names = [released.name().clone(), dropped.name().clone()];
    for name in &names {
        let state = store.inner.inspect(name).await.unwrap().unwrap();
        assert_eq!(
            state.holder.as_ref(),
            Some(s.holder()),
            "still listed in the store"
        );
    }
    assert_eq!(released.release().await.unwrap(), Release::Released);
    drop(dropped);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let other = HolderId::new("worker-2").unwrap();
    for name in &names {
        let state = store.inner.inspect(name).await.unwrap().unwrap();
        assert_eq!(state.holder, None, "{name} freed before the store's expiry");
        let answer = store.inner.acquire(name, &other, TTL).await.unwrap();
        assert!(matches!(answer, Acquisition::Acquired { .. }), "{answer:?}");
    }
}

/// A name lost here can be taken again at once; the old guard's late release carries the old
/// token, so it cannot free the new tenure.
#[tokio::test(start_paused = true)]
async fn the_release_of_a_lost_lease_cannot_free_the_name_taken_again() {
    let store = FaultyStore::new();
    let s = session(&store);
    let old = take(&s, "x").await;
    store.set(|f| &f.renew_hangs, true);
    assert_eq!(old.lost().await, Some(LossReason::Expired));
    store.set(|f| &f.renew_hangs, false);
    let new = take(&s, "x").await;
    assert!(new.token() > old.token());
    assert_eq!(old.release().await.unwrap(), Release::NotHeld);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(new.is_held());
    assert_eq!(s.len(), 1);
    let state = store.inner.inspect(new.name()).await.unwrap().unwrap();
    assert_eq!(state.token, new.token());
    assert_eq!(state.holder.as_ref(), Some(s.holder()));
}

/// A session's first renewal comes a renewal interval after its first lease's acquire was
/// sent, as a `Lease` guard's does: the lease's deadline is measured from that instant, so a
/// slow acquire does not eat into the margin before it.
#[tokio::test(start_paused = true)]
async fn the_first_renewal_is_a_renewal_interval_after_the_acquire_was_sent() {
    let store = FaultyStore::new();
    store
        .faults
        .acquire_wait_ms
        .store(500, std::sync::atomic::Ordering::SeqCst);
    let s = session(&store);
    let start = Instant::now();
    let guard = take(&s, "slow").await;
    assert_eq!(Instant::now() - start, Duration::from_millis(500));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let offsets: Vec<Duration> = store.renewal_times().iter().map(|t| *t - start).collect();
    assert_eq!(
        offsets,
        vec![Duration::from_secs(1), Duration::from_secs(2)],
        "renewals sent at"
    );
    assert!(guard.is_held());
}

/// Counts the WARN events whose message is `message`, on this thread.
struct WarnCounter {
    message: &'static str,
    seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarnCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if *event.metadata().level() == tracing::Level::WARN && message.0 == self.message {
            self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// A store that stops answering while a session holds 14 leases: renewals are retried every
/// retry interval (100 ms here: dozens of rounds in 7 s), and that is said once at the first
/// failure and then once per 5 s, not once per round.
#[tokio::test(start_paused = true)]
async fn renewals_failing_for_seconds_are_said_once_per_five_seconds() {
    use tracing_subscriber::layer::SubscriberExt;
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = WarnCounter {
        message: "renewal failed; retrying",
        seen: seen.clone(),
    };
    let _said = tracing::subscriber::set_default(tracing_subscriber::registry().with(counter));
    let store = FaultyStore::new();
    let config =
        LeaseConfig::new(Duration::from_secs(15)).retry_interval(Duration::from_millis(100));
    let s = LeaseSession::with_holder(store.clone(), config, HolderId::new("worker-1").unwrap())
        .unwrap();
    let mut guards = Vec::new();
    for i in 0..14 {
        guards.push(take(&s, &format!("lease-{i}")).await);
    }
    store.set(|f| &f.down, true);
    // The first renewal is due at 5 s (a third of the ttl); they fail until 12 s.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let renewals = store.renewal_times().len();
    assert!(
        renewals >= 30,
        "renewal rounds tried while down: {renewals}"
    );
    // The first failure (at 5 s), then one 5 s later, where each round used to be said.
    let warned = seen.load(std::sync::atomic::Ordering::SeqCst);
    assert!((2..=3).contains(&warned), "{warned} warnings");
    store.set(|f| &f.down, false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(guards.iter().all(LeaseGuard::is_held));
}
