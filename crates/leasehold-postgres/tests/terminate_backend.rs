//! Connections killed under a held lease: `pg_terminate_backend` on every backend of one store
//! (its pool and its LISTEN connection), again and again. The guard must either keep renewing
//! on fresh connections or report the loss; it must never believe it holds a lease the store
//! does not show. The release listener must come back and wake waiters again.

mod common;

use std::time::{Duration, Instant};

use leasehold::{
    FencingToken, HolderId, Lease, LeaseConfig, LeaseName, Release, Store, TryAcquire,
};
use leasehold_postgres::PgStore;
use tokio::task::JoinHandle;

/// A store whose connections carry an `application_name` of their own, so this test kills only
/// them.
async fn store_with_own_name(notifications: bool) -> (PgStore, String) {
    let app = format!("lhtb{:08x}", fastrand::u32(..));
    let store = common::config()
        .application_name(&app)
        .notifications(notifications)
        .connect()
        .await
        .expect("connect to test postgres");
    (store, app)
}

fn lease_name(tag: &str) -> LeaseName {
    LeaseName::new(format!("terminate-{tag}-{:08x}", fastrand::u32(..))).unwrap()
}

/// Terminates the backends of `app` (pool) and `app-listen` (listener); how many.
async fn terminate(admin: &leasehold_postgres::tokio_postgres::Client, app: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE application_name IN ($1, $1 || '-listen') AND pid <> pg_backend_pid()",
            &[&app],
        )
        .await
        .unwrap()
        .get(0)
}

/// The pid of the listener's backend once it is LISTENing (its first statement, LISTEN, has
/// finished), other than `not`; waits up to `limit`.
async fn listener_pid(
    admin: &leasehold_postgres::tokio_postgres::Client,
    app: &str,
    not: Option<i32>,
    limit: Duration,
) -> i32 {
    let started = Instant::now();
    loop {
        let row = admin
            .query_opt(
                "SELECT pid FROM pg_stat_activity
                  WHERE application_name = $1 || '-listen' AND state = 'idle' AND query <> ''
                    AND pid IS DISTINCT FROM $2",
                &[&app, &not],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            return row.get(0);
        }
        assert!(
            started.elapsed() < limit,
            "listener of {app} did not come back within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kills the store's connections every 100–400 ms for longer than the ttl while checking, every
/// few tens of milliseconds, that "the guard says held" implies "the store shows us with our
/// token".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_renews_on_new_connections_or_reports_the_loss() {
    let (store, app) = store_with_own_name(true).await;
    let observer = common::store().await;
    let admin = common::raw().await;
    let name = lease_name("guard");
    let ttl = Duration::from_secs(2);
    let lease = Lease::new(store.clone(), name.clone(), LeaseConfig::new(ttl)).unwrap();
    let guard = match lease.try_acquire().await.unwrap() {
        TryAcquire::Acquired(guard) => guard,
        busy => panic!("fresh lease is busy: {busy:?}"),
    };
    let acquired_at = Instant::now();
    let cancelled = guard.lost_token();

    let stop = leasehold::CancellationToken::new();
    let killer = async {
        let mut killed = 0;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(fastrand::u64(100..400))).await;
            killed += terminate(&admin, &app).await;
        }
        stop.cancel();
        killed
    };
    let checker = async {
        let mut checks = 0;
        loop {
            let state = observer.inspect(&name).await.unwrap().unwrap();
            // Read after the store answered: if the guard still counts the lease as held now,
            // the store must have shown it held by us when it answered.
            if guard.is_held() {
                assert_eq!(state.holder.as_ref(), Some(lease.holder()), "{state:?}");
                assert_eq!(state.token, guard.token());
                assert!(state.remaining > Duration::ZERO, "{state:?}");
                checks += 1;
            }
            tokio::select! {
                () = cancelled.cancelled() => return (checks, true),
                () = stop.cancelled() => return (checks, false),
                () = tokio::time::sleep(Duration::from_millis(30)) => {}
            }
        }
    };
    let (killed, (checks, lost)) = tokio::join!(killer, checker);
    eprintln!("terminated {killed} backends, {checks} consistent checks, lost: {lost}");

    if lost || !guard.is_held() {
        // Reported, not silent: the guard knows why.
        tokio::time::timeout(Duration::from_secs(1), cancelled.cancelled())
            .await
            .expect("a guard that is not held has cancelled its token");
        let reason = guard.loss_reason().expect("the loss has a reason");
        eprintln!("guard lost the lease: {reason}");
        return;
    }

    assert!(killed >= 5, "only {killed} backends were terminated");
    // Still held well past the first ttl: renewals went through on new connections.
    assert!(acquired_at.elapsed() > ttl, "{:?}", acquired_at.elapsed());
    // Let one more renewal go through, then the store shows a fresh lease.
    tokio::time::sleep(LeaseConfig::new(ttl).renew_interval + Duration::from_millis(100)).await;
    let state = observer.inspect(&name).await.unwrap().unwrap();
    assert!(guard.is_held(), "lost after the killing stopped");
    assert_eq!(state.holder.as_ref(), Some(lease.holder()));
    assert_eq!(state.token, guard.token());
    assert!(
        state.remaining > ttl / 3,
        "remaining {:?} is not fresh",
        state.remaining
    );
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    assert_eq!(observer.inspect(&name).await.unwrap().unwrap().holder, None);
}

/// Waits for `name` with a lease of its own; the instant it acquired (then releases).
async fn wait_for_handoff(store: &PgStore, name: &LeaseName, ttl: Duration) -> Instant {
    let waiter = Lease::new(store.clone(), name.clone(), LeaseConfig::new(ttl)).unwrap();
    let guard = waiter.acquire().await.unwrap();
    let at = Instant::now();
    guard.release().await.unwrap();
    at
}

/// Takes `name` for `holder` and starts a waiter ([`wait_for_handoff`]) on the same store; returns
/// once the waiter has had time to see Busy and start waiting for the notification.
async fn held_with_waiter(
    store: &PgStore,
    name: &LeaseName,
    holder: &HolderId,
    ttl: Duration,
) -> (FencingToken, JoinHandle<Instant>) {
    let token = match store.acquire(name, holder, ttl).await.unwrap() {
        leasehold::store::Acquisition::Acquired { token } => token,
        busy => panic!("{busy:?}"),
    };
    let waiter = tokio::spawn({
        let store = store.clone();
        let name = name.clone();
        async move { wait_for_handoff(&store, &name, ttl).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    (token, waiter)
}

/// Releases the lease and returns how long after the release the waiter acquired it (it must
/// within the ttl).
async fn release_and_time_handoff(
    store: &PgStore,
    name: &LeaseName,
    holder: &HolderId,
    token: FencingToken,
    waiter: JoinHandle<Instant>,
    ttl: Duration,
) -> Duration {
    let released_at = Instant::now();
    assert_eq!(
        store.release(name, holder, token).await.unwrap(),
        Release::Released
    );
    let woke_at = tokio::time::timeout(ttl, waiter)
        .await
        .expect("waiter acquired before the ttl")
        .unwrap();
    woke_at.saturating_duration_since(released_at)
}

/// After its backend is terminated the listener reconnects and LISTENs again, so a graceful
/// release wakes a waiter at once rather than at the lease's expiry. Three rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_reconnects_and_wakes_waiters_again() {
    let (store, app) = store_with_own_name(true).await;
    let admin = common::raw().await;
    let ttl = Duration::from_secs(6);
    let mut pid = listener_pid(&admin, &app, None, Duration::from_secs(5)).await;
    for round in 0..3 {
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
        pid = listener_pid(&admin, &app, Some(pid), Duration::from_secs(10)).await;

        let name = lease_name(&format!("listen{round}"));
        let holder = HolderId::new(format!("holder-{round}")).unwrap();
        let (token, waiter) = held_with_waiter(&store, &name, &holder, ttl).await;
        let handoff = release_and_time_handoff(&store, &name, &holder, token, waiter, ttl).await;
        eprintln!("round {round}: handoff after {handoff:?}");
        assert!(
            handoff < Duration::from_millis(1500),
            "round {round}: waiter woke {handoff:?} after the release (ttl {ttl:?})"
        );
    }
}

/// A release that happens while the listener is down (between the kill and its reconnect) is
/// not lost for good: the waiter still takes over long before the holder's lease would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_while_the_listener_is_down_still_wakes_the_waiter() {
    let (store, app) = store_with_own_name(true).await;
    let admin = common::raw().await;
    let ttl = Duration::from_secs(6);
    let pid = listener_pid(&admin, &app, None, Duration::from_secs(5)).await;

    let name = lease_name("outage");
    let holder = HolderId::new("holder-outage").unwrap();
    let (token, waiter) = held_with_waiter(&store, &name, &holder, ttl).await;

    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    // Wait until the old backend is gone, then release before the listener is back.
    let gone = Instant::now();
    while admin
        .query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .is_some()
    {
        assert!(gone.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let handoff = release_and_time_handoff(&store, &name, &holder, token, waiter, ttl).await;
    eprintln!("handoff after {handoff:?} across a listener outage");
    assert!(
        handoff < Duration::from_secs(3),
        "waiter woke {handoff:?} after the release (ttl {ttl:?})"
    );
}

/// Without notifications, waiters poll: they take over at the holder's expiry.
#[tokio::test]
async fn without_notifications_waiters_take_over_at_expiry() {
    let (store, _app) = store_with_own_name(false).await;
    assert!(store.subscribe_releases().is_none());
    let name = lease_name("polling");
    let holder = HolderId::new("holder-polling").unwrap();
    let ttl = Duration::from_millis(1500);
    assert!(matches!(
        store.acquire(&name, &holder, ttl).await.unwrap(),
        leasehold::store::Acquisition::Acquired { .. }
    ));
    let started = Instant::now();
    let at = tokio::time::timeout(ttl * 4, wait_for_handoff(&store, &name, ttl))
        .await
        .expect("waiter takes over after the expiry");
    let waited = at - started;
    assert!(
        waited >= ttl - Duration::from_millis(300),
        "took over before the expiry: {waited:?}"
    );
}
