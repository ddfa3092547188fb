//! Several store handles (separate pools, as separate processes would have) on one database:
//! races, the release poller's handoff, and the statement-level choices (matched rows, the
//! execution-time clock).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{
    FencingToken, HolderId, LeaseName, Release, Slots, Store,
    store::{Acquisition, Renewal, SlotClaim},
};
use leasehold_mysql::MySqlStore;
use leasehold_mysql::mysql_async::prelude::Queryable;

fn name(prefix: &str) -> LeaseName {
    LeaseName::new(format!("{prefix}/{:08x}", fastrand::u32(..))).unwrap()
}

fn holder(i: usize) -> HolderId {
    HolderId::new(format!("racer-{i}-{:08x}", fastrand::u32(..))).unwrap()
}

async fn acquired(
    store: &MySqlStore,
    name: &LeaseName,
    who: &HolderId,
    ttl: Duration,
) -> FencingToken {
    match store.acquire(name, who, ttl).await.unwrap() {
        Acquisition::Acquired { token } => token,
        busy => panic!("{name} not acquired: {busy:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_handles_one_winner_per_round_and_increasing_tokens() {
    const RACERS: usize = 8;
    const ROUNDS: usize = 30;
    let mut stores = Vec::new();
    for _ in 0..RACERS {
        stores.push(common::store().await);
    }
    let (lease, task) = (name("race"), name("race-task"));
    let holders: Vec<HolderId> = (0..RACERS).map(holder).collect();
    let mut last = FencingToken(0);
    for round in 0..ROUNDS {
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let (store, lease, task, who, barrier) = (
                    stores[i].clone(),
                    lease.clone(),
                    task.clone(),
                    holders[i].clone(),
                    barrier.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    let got = store
                        .acquire(&lease, &who, Duration::from_secs(30))
                        .await
                        .expect("acquire answered");
                    let slot = store
                        .claim_slot(&task, round as u64 + 1)
                        .await
                        .expect("claim answered");
                    (i, got, slot)
                })
            })
            .collect();
        let (mut winners, mut claims) = (Vec::new(), 0);
        for r in racers {
            let (i, got, slot) = r.await.unwrap();
            match got {
                Acquisition::Acquired { token } => winners.push((i, token)),
                Acquisition::Busy { holder, .. } => assert!(holders.contains(&holder)),
            }
            claims += usize::from(slot == SlotClaim::Claimed);
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        assert_eq!(claims, 1, "round {round}: one slot claim");
        let (i, token) = winners[0];
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        // Released through another handle.
        let other = &stores[(i + 1) % RACERS];
        assert_eq!(
            other.release(&lease, &holders[i], token).await.unwrap(),
            Release::Released
        );
    }
}

/// The poller on another handle hears a release; prints how long it took (one poll interval,
/// 50 ms by default, bounds it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_one_handle_wakes_a_subscriber_on_another() {
    let (a, b) = (common::store().await, common::store().await);
    let mut took = Vec::new();
    for _ in 0..10 {
        let (lease, who) = (name("handoff"), holder(0));
        let token = acquired(&a, &lease, &who, Duration::from_secs(30)).await;
        let mut sub = b.subscribe_releases().expect("notifications on");
        let waiting = {
            let lease = lease.clone();
            tokio::spawn(async move {
                sub.released(&lease).await;
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_millis(fastrand::u64(20..80))).await;
        let started = Instant::now();
        assert_eq!(
            a.release(&lease, &who, token).await.unwrap(),
            Release::Released
        );
        let heard = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("the other handle heard the release within 2 s")
            .unwrap();
        took.push(heard - started);
    }
    took.sort();
    println!(
        "release → other handle's subscriber: median {:?}, max {:?}",
        took[5], took[9]
    );
}

/// A handle announces its own release at once, and its poller does not announce it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_release_is_announced_once() {
    let store = common::store().await;
    let (lease, who) = (name("once"), holder(0));
    let mut sub = store.subscribe_releases().unwrap();
    let token = acquired(&store, &lease, &who, Duration::from_secs(30)).await;
    store.release(&lease, &who, token).await.unwrap();
    tokio::time::timeout(Duration::from_millis(10), sub.released(&lease))
        .await
        .expect("announced at once by the releasing handle");
    assert!(
        tokio::time::timeout(Duration::from_millis(400), sub.released(&lease))
            .await
            .is_err(),
        "announced twice"
    );
}

/// The pool's connections count matched rows: a write of the values a row already has is one
/// row, so a renewal that happens to store the same expiry is not read as a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_write_counts_as_matched() {
    let store = common::store().await;
    let (lease, who) = (name("found-rows"), holder(0));
    acquired(&store, &lease, &who, Duration::from_secs(30)).await;
    let mut conn = store.pool().get_conn().await.unwrap();
    conn.exec_drop(
        format!(
            "UPDATE `{}leases` SET token = token, expires_at = expires_at WHERE name = ?",
            store.table_prefix()
        ),
        (lease.as_str(),),
    )
    .await
    .unwrap();
    assert_eq!(conn.affected_rows(), 1);
}

/// The clock is the time a statement runs (`SYSDATE(6)`), not the time it started (`NOW(6)`):
/// a renewal that waited on a row lock until after the lease's expiry answers `Lost`. On
/// `NOW(6)` it would have seen the lease live as of its start and renewed it, writing an expiry
/// already past.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_waited_past_the_expiry_is_lost() {
    let store = common::store().await;
    let (lease, who) = (name("lock-wait"), holder(0));
    let ttl = Duration::from_millis(600);
    let token = acquired(&store, &lease, &who, ttl).await;
    // Another session locks the row for longer than the lease has left.
    let mut locker = common::raw().await;
    locker.query_drop("START TRANSACTION").await.unwrap();
    locker
        .exec_drop(
            format!(
                "SELECT name FROM `{}leases` WHERE name = ? FOR UPDATE",
                store.table_prefix()
            ),
            (lease.as_str(),),
        )
        .await
        .unwrap();
    let renewing = {
        let (store, lease, who) = (store.clone(), lease.clone(), who.clone());
        tokio::spawn(async move {
            let sent = Instant::now();
            let answer = store
                .renew(&lease, &who, token, Duration::from_secs(30))
                .await;
            (sent, answer)
        })
    };
    // The renewal is sent while the lease is live, and waits for the lock past the expiry.
    tokio::time::sleep(ttl + Duration::from_millis(400)).await;
    locker.query_drop("COMMIT").await.unwrap();
    let (sent, answer) = renewing.await.unwrap();
    assert!(sent.elapsed() > ttl, "the renewal waited on the lock");
    assert_eq!(answer.unwrap(), Renewal::Lost);
    let state = store.inspect(&lease).await.unwrap().unwrap();
    assert_eq!(state.holder, None, "{state:?}");
}
