//! The `now()` trap (ShedLock #3577/#3682): `now()` is the start of the transaction, so a lease
//! written as `now() + ttl` from a transaction that began a while ago is born expired, and a
//! second holder gets in within the same second. The store times everything with
//! `clock_timestamp()`; these tests run its acquire statement inside old transactions of their
//! own and check that the lease lasts its full ttl from the moment it was written, and that a
//! lease expired by the clock (though not by the transaction's start) is handed over.

mod common;

use std::time::Duration;

use leasehold::catalog::CATALOG_RETENTION;
use leasehold::{
    Catalog, FencingToken, HolderId, LeaseName, Release, Store,
    store::{Acquisition, Renewal},
};
use leasehold_postgres::PgStore;
use leasehold_postgres::tokio_postgres::GenericClient;

fn lease_name(tag: &str) -> LeaseName {
    LeaseName::new(format!("now-trap-{tag}-{:08x}", fastrand::u32(..))).unwrap()
}

fn holder(tag: &str) -> HolderId {
    HolderId::new(format!("{tag}-{:08x}", fastrand::u32(..))).unwrap()
}

/// Runs the store's acquire statement on `client` (a raw transaction); the token if acquired.
async fn raw_acquire(
    client: &impl GenericClient,
    store: &PgStore,
    name: &LeaseName,
    holder: &HolderId,
    ttl_ms: i64,
) -> Option<i64> {
    let rows = client
        .query(
            &store.sql().acquire,
            &[&name.as_str(), &holder.as_str(), &ttl_ms],
        )
        .await
        .expect("acquire statement runs");
    rows.first().and_then(|row| row.get::<_, Option<i64>>(0))
}

/// Seconds between the transaction's `now()` and the server's current clock.
async fn staleness(client: &impl GenericClient) -> f64 {
    client
        .query_one(
            "SELECT extract(epoch FROM clock_timestamp() - now())::float8",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

fn next_of(t: FencingToken) -> FencingToken {
    FencingToken(t.get() + 1)
}

fn token(a: Acquisition) -> FencingToken {
    match a {
        Acquisition::Acquired { token } => token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[tokio::test]
async fn lease_written_in_an_old_transaction_lasts_its_full_ttl() {
    let store = common::store().await;
    let name = lease_name("old-tx");
    let (a, b) = (holder("a"), holder("b"));

    let mut client = common::raw().await;
    let tx = client.transaction().await.unwrap();
    // Let the transaction's now() fall behind by more than the ttl.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(staleness(&tx).await > 1.0, "now() should be stale by now");
    let t = raw_acquire(&tx, &store, &name, &a, 1000)
        .await
        .expect("a free lease is acquired");
    tx.commit().await.unwrap();

    // With `now() + ttl` the lease would already have expired at commit and B would get in.
    match store
        .acquire(&name, &b, Duration::from_secs(1))
        .await
        .unwrap()
    {
        Acquisition::Busy { holder, remaining } => {
            assert_eq!(holder, a);
            assert!(remaining > Duration::from_millis(500), "{remaining:?}");
        }
        other => panic!("B got in within the ttl: {other:?}"),
    }
    let state = store.inspect(&name).await.unwrap().unwrap();
    assert_eq!(state.holder.as_ref(), Some(&a));
    assert_eq!(state.token, FencingToken(t as u64));
}

/// The control experiment: the same statement with `now()` in place of `clock_timestamp()`,
/// run from an old transaction, writes a lease that is already expired, and B gets in at once.
#[tokio::test]
async fn the_same_statement_on_now_would_let_a_second_holder_in() {
    let store = common::store().await;
    let name = lease_name("now-variant");
    let (a, b) = (holder("a"), holder("b"));
    let on_now = store.sql().acquire.replace("clock_timestamp()", "now()");
    assert_ne!(on_now, store.sql().acquire);

    let mut client = common::raw().await;
    let tx = client.transaction().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let rows = tx
        .query(&on_now, &[&name.as_str(), &a.as_str(), &1000_i64])
        .await
        .unwrap();
    let first = rows[0]
        .get::<_, Option<i64>>(0)
        .expect("a free lease is acquired");
    tx.commit().await.unwrap();

    // A believes it holds the lease for the next second, yet B acquires right away.
    let got = store
        .acquire(&name, &b, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        got,
        Acquisition::Acquired {
            token: FencingToken(first as u64 + 1)
        }
    );
}

/// Both transactions begin at the same moment (same `now()`, give or take a millisecond) and
/// sit idle past the ttl; then both run the acquire statement. Run twice: on a fresh name (both
/// insert) and on a lease that exists but has expired (both update).
#[tokio::test]
async fn transactions_started_together_cannot_both_acquire() {
    let store = common::store().await;
    for existing in [false, true] {
        let name = lease_name(if existing {
            "together-expired"
        } else {
            "together-new"
        });
        let (a, b) = (holder("a"), holder("b"));
        let mut next = FencingToken(1);
        if existing {
            let c = holder("c");
            let t = token(
                store
                    .acquire(&name, &c, Duration::from_millis(20))
                    .await
                    .unwrap(),
            );
            next = next_of(t);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let (mut ca, mut cb) = tokio::join!(common::raw(), common::raw());
        let (ta, tb) = tokio::join!(ca.transaction(), cb.transaction());
        let (ta, tb) = (ta.unwrap(), tb.unwrap());
        let starts: Vec<f64> = {
            let (x, y) = tokio::join!(
                ta.query_one("SELECT extract(epoch FROM now())::float8", &[]),
                tb.query_one("SELECT extract(epoch FROM now())::float8", &[]),
            );
            vec![x.unwrap().get(0), y.unwrap().get(0)]
        };
        assert!((starts[0] - starts[1]).abs() < 0.5, "{starts:?}");
        tokio::time::sleep(Duration::from_millis(1100)).await;

        // A acquires and has not committed; B's statement waits for A's row lock.
        let got_a = raw_acquire(&ta, &store, &name, &a, 1000)
            .await
            .expect("A acquires");
        if existing {
            assert_eq!(got_a, next.get() as i64);
        } else {
            // A new name's first token comes from the clock.
            next = FencingToken(got_a as u64);
        }
        let b_attempt = async {
            let got = raw_acquire(&tb, &store, &name, &b, 1000).await;
            tb.commit().await.unwrap();
            got
        };
        let a_commit = async {
            // Give B time to reach the lock before A commits.
            tokio::time::sleep(Duration::from_millis(300)).await;
            ta.commit().await.unwrap();
        };
        let (got_b, ()) = tokio::join!(b_attempt, a_commit);
        assert_eq!(got_b, None, "both acquired (existing={existing})");

        // And B once more after A's commit, still inside one second of it.
        let got_b = store
            .acquire(&name, &b, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(
            matches!(&got_b, Acquisition::Busy { holder, .. } if *holder == a),
            "{got_b:?}"
        );
        let state = store.inspect(&name).await.unwrap().unwrap();
        assert_eq!(state.holder.as_ref(), Some(&a));
        assert_eq!(state.token, next);
    }
}

/// B's transaction began before A acquired, so by B's `now()` A's lease is still live; by the
/// clock it has expired. The clock decides: B takes it with the next token, A's renew is lost.
#[tokio::test]
async fn lease_expired_by_the_clock_but_not_by_transaction_start_is_taken() {
    let store = common::store().await;
    let name = lease_name("expired-by-clock");
    let (a, b) = (holder("a"), holder("b"));

    let mut client = common::raw().await;
    let tx = client.transaction().await.unwrap();
    tx.query_one("SELECT now()", &[]).await.unwrap();
    let t = token(
        store
            .acquire(&name, &a, Duration::from_millis(300))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(700)).await;

    let row = tx
        .query_one(
            &format!(
                "SELECT expires_at <= clock_timestamp(), expires_at > now() FROM \"{}\".leases WHERE name = $1",
                store.schema()
            ),
            &[&name.as_str()],
        )
        .await
        .unwrap();
    let (expired_by_clock, live_by_now): (bool, bool) = (row.get(0), row.get(1));
    assert!(
        expired_by_clock && live_by_now,
        "{expired_by_clock} {live_by_now}"
    );

    let got = raw_acquire(&tx, &store, &name, &b, 1000).await;
    assert_eq!(got, Some(next_of(t).get() as i64));
    tx.commit().await.unwrap();

    assert_eq!(
        store
            .renew(&name, &a, t, Duration::from_secs(1))
            .await
            .unwrap(),
        Renewal::Lost
    );
    let state = store.inspect(&name).await.unwrap().unwrap();
    assert_eq!(state.holder.as_ref(), Some(&b));
    assert_eq!(state.token, next_of(t));
}

/// Different holders acquiring inside one second, at once and one after the other: exactly one
/// succeeds each time.
#[tokio::test]
async fn two_holders_within_one_second_never_both_acquire() {
    let store = common::store().await;
    for round in 0..20 {
        let name = lease_name(&format!("race{round}"));
        let (a, b) = (holder("a"), holder("b"));
        let ttl = Duration::from_secs(1);
        let (ra, rb) = tokio::join!(store.acquire(&name, &a, ttl), store.acquire(&name, &b, ttl));
        let won = [ra.unwrap(), rb.unwrap()]
            .iter()
            .filter(|r| matches!(r, Acquisition::Acquired { .. }))
            .count();
        assert_eq!(won, 1, "round {round}");
        // Sequentially, right after.
        let c = holder("c");
        let rc = store.acquire(&name, &c, ttl).await.unwrap();
        assert!(
            matches!(rc, Acquisition::Busy { .. }),
            "round {round}: {rc:?}"
        );
    }
}

#[tokio::test]
async fn expired_lease_goes_to_the_next_holder_with_the_next_token() {
    let store = common::store().await;
    let name = lease_name("expiry");
    let (a, b) = (holder("a"), holder("b"));
    let ttl = Duration::from_millis(800);
    let t = token(store.acquire(&name, &a, ttl).await.unwrap());

    // Busy until the store's clock passes the expiry, then B's.
    let started = std::time::Instant::now();
    let t_b = loop {
        match store.acquire(&name, &b, ttl).await.unwrap() {
            Acquisition::Acquired { token } => break token,
            Acquisition::Busy { holder, remaining } => {
                assert_eq!(holder, a);
                assert!(started.elapsed() < Duration::from_secs(5), "never expired");
                tokio::time::sleep(remaining.min(Duration::from_millis(100))).await;
            }
        }
    };
    assert!(
        started.elapsed() >= ttl - Duration::from_millis(100),
        "handed over early: {:?}",
        started.elapsed()
    );
    assert_eq!(t_b, next_of(t));
    assert_eq!(store.renew(&name, &a, t, ttl).await.unwrap(), Renewal::Lost);
    assert_eq!(store.release(&name, &a, t).await.unwrap(), Release::NotHeld);
    assert!(matches!(
        store.acquire(&name, &a, ttl).await.unwrap(),
        Acquisition::Busy { .. }
    ));
    assert_eq!(
        store.renew(&name, &b, t_b, ttl).await.unwrap(),
        Renewal::Renewed
    );
}

/// The catalog's statements run from an old transaction: a heartbeat lasts its full ttl from
/// the moment it is written, and the clock `control` answers is the statement's. The same
/// registration on `now()` is born expired.
#[tokio::test]
async fn catalog_statements_in_an_old_transaction_use_the_clock() {
    let store = common::store().await;
    let (task, on_now_task) = (lease_name("catalog"), lease_name("catalog-now"));
    let me = holder("a");
    let on_now = store.sql().register.replace("clock_timestamp()", "now()");
    assert_ne!(on_now, store.sql().register);

    let mut client = common::raw().await;
    let tx = client.transaction().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(staleness(&tx).await > 1.0, "now() should be stale by now");
    for (sql, task) in [(&store.sql().register, &task), (&on_now, &on_now_task)] {
        tx.query(
            sql,
            &[
                &task.as_str(),
                &"{}",
                &me.as_str(),
                &"{}",
                &1000_i64,
                &60_000_i64,
            ],
        )
        .await
        .expect("register statement runs");
    }
    let clock: i64 = tx
        .query_one(&store.sql().control, &[&task.as_str()])
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();

    let after = store.now_millis().await.unwrap() as i64;
    assert!(
        (after - clock).abs() < 500,
        "control's clock {clock} vs {after}: the transaction's start was 1.3 s before"
    );
    let listed = store.tasks(CATALOG_RETENTION).await.unwrap();
    let remaining = |name: &LeaseName| {
        let task = listed.iter().find(|t| &t.task == name).expect("listed");
        task.instances[0].remaining
    };
    assert!(remaining(&task) > Duration::from_millis(500), "{listed:?}");
    assert_eq!(
        remaining(&on_now_task),
        Duration::ZERO,
        "on now() the heartbeat is born expired"
    );
    for name in [&task, &on_now_task] {
        store.unregister(name, &me).await.unwrap();
    }
}
