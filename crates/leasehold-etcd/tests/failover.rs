//! Killing the etcd leader mid-way: leases held before the kill are renewed after the new
//! election, stay exclusive, hand over with a higher token, slot claims stay forward-only, and
//! the release watch moves to a live member.

use leasehold::Slots;
use std::time::{Duration, Instant};

use leasehold::{
    HolderId, Lease, LeaseConfig, LeaseName, Release, Store, TryAcquire,
    store::{Acquisition, Renewal, SlotClaim},
};
use leasehold_etcd::testing::EtcdCluster;

fn name(prefix: &str) -> LeaseName {
    LeaseName::new(format!("{prefix}-{:08x}", fastrand::u32(..))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_killing_the_leader() {
    let mut cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(3))
        .await
        .unwrap();
    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .expect("a leader");
    // The client talks to the leader first, so the kill breaks its connections and its watch.
    let store = leasehold_etcd::connect(&cluster.url_starting_at(leader))
        .await
        .unwrap();
    let ttl = Duration::from_secs(6);
    let (lease_name, task) = (name("failover"), name("failover-task"));
    let (a, b) = (HolderId::new("a").unwrap(), HolderId::new("b").unwrap());
    let Acquisition::Acquired { token: first } = store.acquire(&lease_name, &a, ttl).await.unwrap()
    else {
        panic!("free lease not acquired");
    };
    assert_eq!(
        store.claim_slot(&task, 1).await.unwrap(),
        SlotClaim::Claimed
    );
    // A guard of the core's, renewing every ttl/3 on its own across the election.
    let guarded = Lease::new(store.clone(), name("failover-guard"), LeaseConfig::new(ttl)).unwrap();
    let TryAcquire::Acquired(guard) = guarded.try_acquire().await.unwrap() else {
        panic!("guard not acquired");
    };
    let mut released = store.subscribe_releases().expect("watch notifications");

    let killed = Instant::now();
    cluster.kill(leader);
    let mut errors = 0;
    let renewed_after = loop {
        match store.renew(&lease_name, &a, first, ttl).await {
            Ok(Renewal::Renewed) => break killed.elapsed(),
            Ok(Renewal::Lost) => panic!("lease lost across the election"),
            Err(e) => {
                assert!(e.is_transient(), "an election is a transient failure: {e}");
                errors += 1;
            }
        }
        assert!(
            killed.elapsed() < ttl,
            "no renewal within the ttl after the kill"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let new_leader = tokio::task::spawn_blocking(move || {
        let leader = cluster.wait_for_leader(Duration::from_secs(10));
        (cluster, leader)
    })
    .await
    .unwrap();
    let (cluster, new_leader) = new_leader;
    let new_leader = new_leader.expect("a new leader among the two left");
    assert_ne!(new_leader, leader);
    eprintln!(
        "leader m{leader} killed; renewed on the new leader m{new_leader} after {renewed_after:?} ({errors} transient errors)"
    );

    // Still exclusive after the election.
    match store.acquire(&lease_name, &b, ttl).await.unwrap() {
        Acquisition::Busy { holder, .. } => assert_eq!(holder, a),
        other => panic!("b got {other:?} while a holds the lease"),
    }
    // The release is announced through the watch, re-established on a live member.
    assert_eq!(
        store.release(&lease_name, &a, first).await.unwrap(),
        Release::Released
    );
    tokio::time::timeout(Duration::from_secs(5), released.released(&lease_name))
        .await
        .expect("release notification after the failover");
    let Acquisition::Acquired { token: second } =
        store.acquire(&lease_name, &b, ttl).await.unwrap()
    else {
        panic!("released lease not acquired");
    };
    assert!(second > first, "{second} after {first}");
    // Slot claims still only move forward.
    assert_eq!(
        store.claim_slot(&task, 1).await.unwrap(),
        SlotClaim::AlreadyRun { last: 1 }
    );
    assert_eq!(
        store.claim_slot(&task, 2).await.unwrap(),
        SlotClaim::Claimed
    );
    // The guard kept its lease through the election.
    assert!(guard.is_held(), "guard lost its lease across the election");
    let guard_token = guard.token();
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    let TryAcquire::Acquired(next) = guarded.try_acquire().await.unwrap() else {
        panic!("released guard lease not acquired");
    };
    assert!(next.token() > guard_token);
    next.release().await.unwrap();

    // The killed member restarts on its data and catches up: read through it alone, the lease
    // has the token handed out while it was down.
    let mut cluster = cluster;
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.restart(leader);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cluster.healthy() {
            assert!(Instant::now() < deadline, "restarted member not healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    })
    .await
    .unwrap();
    let alone = leasehold_etcd::connect(&format!("etcd://{}", cluster.endpoints()[leader]))
        .await
        .unwrap();
    let state = alone.inspect(&lease_name).await.unwrap().unwrap();
    assert_eq!(state.token.get(), second.get());
    drop(cluster);
}

/// A process that never saw a lease record before waits a full ttl from its first sight before
/// it takes the lease over: expiry is measured on its own monotonic clock, never by comparing
/// wall clocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_observer_waits_a_full_ttl_from_its_first_sight() {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .unwrap();
    let first = leasehold_etcd::connect(&cluster.url()).await.unwrap();
    let lease_name = name("observer");
    let (a, b) = (HolderId::new("a").unwrap(), HolderId::new("b").unwrap());
    let ttl = Duration::from_millis(800);
    let Acquisition::Acquired { token } = first.acquire(&lease_name, &a, ttl).await.unwrap() else {
        panic!("not acquired");
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A second process (a store handle of its own) sees the record for the first time now.
    let second = leasehold_etcd::connect(&cluster.url()).await.unwrap();
    let seen = Instant::now();
    let Acquisition::Busy { remaining, .. } = second.acquire(&lease_name, &b, ttl).await.unwrap()
    else {
        panic!("a lease seen for the first time was taken at once");
    };
    assert!(
        remaining > ttl - Duration::from_millis(200),
        "{remaining:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The writer's view: expired (1000 ms since its write). The new observer's: 500 ms left.
    assert_eq!(
        first.inspect(&lease_name).await.unwrap().unwrap().holder,
        None
    );
    assert!(matches!(
        second.acquire(&lease_name, &b, ttl).await.unwrap(),
        Acquisition::Busy { .. }
    ));
    let taken = loop {
        if let Acquisition::Acquired { token: next } =
            second.acquire(&lease_name, &b, ttl).await.unwrap()
        {
            assert!(next > token);
            break seen.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(taken >= ttl, "taken over {taken:?} after first sight");
    assert!(taken < ttl + Duration::from_secs(2), "{taken:?}");
    // The old holder's renewal fails: the record moved on.
    assert_eq!(
        first.renew(&lease_name, &a, token, ttl).await.unwrap(),
        Renewal::Lost
    );
}

/// A process whose release watch was running when the holder renewed times expiry from that
/// renewal, not from its own later read: after the holder stops renewing (a crash), it takes
/// over one ttl after the last renewal, as with a store that keeps time itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_process_times_expiry_from_the_renewals_it_saw() {
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .unwrap();
    let holder = leasehold_etcd::connect(&cluster.url()).await.unwrap();
    // Connected (and its watch established) before the renewal below.
    let watcher = leasehold_etcd::connect(&cluster.url()).await.unwrap();
    let lease_name = name("watched");
    let (a, b) = (HolderId::new("a").unwrap(), HolderId::new("b").unwrap());
    let ttl = Duration::from_millis(1500);
    let Acquisition::Acquired { token } = holder.acquire(&lease_name, &a, ttl).await.unwrap()
    else {
        panic!("not acquired");
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        holder.renew(&lease_name, &a, token, ttl).await.unwrap(),
        Renewal::Renewed
    );
    let renewed = Instant::now();
    // The holder "crashes": no more renewals. The watcher looks for the first time 800 ms on.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let Acquisition::Busy { remaining, .. } = watcher.acquire(&lease_name, &b, ttl).await.unwrap()
    else {
        panic!("taken over before a ttl had passed since the renewal");
    };
    assert!(
        remaining < ttl - Duration::from_millis(600),
        "counted from its own read, not from the renewal it watched: {remaining:?} left"
    );
    let taken = loop {
        if let Acquisition::Acquired { token: next } =
            watcher.acquire(&lease_name, &b, ttl).await.unwrap()
        {
            assert!(next > token);
            break renewed.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(taken >= ttl, "taken over {taken:?} after the renewal");
    assert!(
        taken < ttl + Duration::from_millis(500),
        "took {taken:?} after the last renewal"
    );
}
