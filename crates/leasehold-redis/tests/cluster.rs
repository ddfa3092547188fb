//! `redis+cluster://` against a six-node Redis Cluster of the test's own (three primaries, one
//! replica each): the conformance suite, slot placement of a lease's keys, renewals and release
//! notifications across nodes. One cluster serves the whole file, owned by one test function so
//! it is torn down when the test ends.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use leasehold::{
    Catalog, FencingToken, HolderId, Lease, LeaseConfig, LeaseName, Release, Store, TryAcquire,
    store::{Acquisition, Renewal},
};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::acquire_free;
use leasehold_testkit::ha::Cluster;
use leasehold_testkit::redis::cli;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_passes_the_suite_and_keeps_each_lease_on_its_slot() {
    let cluster = Cluster::start();
    let store = RedisConfig::new(cluster.url())
        .prefix(common::test_prefix())
        .connect()
        .await
        .expect("connect to the cluster");
    assert_eq!(
        Store::describe(&store),
        format!("{} (prefix {})", cluster.url(), store.prefix())
    );
    leasehold_testkit::conformance::run_all(|_| std::future::ready(store.clone())).await;
    common::lazy_store_connects(&cluster.url()).await;
    keys_of_a_lease_share_its_slot(&cluster, &store).await;
    renewals_and_releases_span_nodes(&cluster, &store).await;
    catalog_spans_nodes(&cluster, &store).await;
}

/// Every key a script touches carries the name as its hash tag, so all of a lease's keys are in
/// one slot and its scripts run on the node that owns it.
async fn keys_of_a_lease_share_its_slot(cluster: &Cluster, store: &RedisStore) {
    let name = LeaseName::new("jobs:7").unwrap();
    let slot = cluster.slot(&store.lease_key(&name));
    for key in [
        store.fence_key(&name),
        store.slot_key(&name),
        store.history_key(&name),
        store.task_key(&name),
        store.instances_key(&name),
    ] {
        assert_eq!(cluster.slot(&key), slot, "{key}");
    }
    let who = HolderId::new("placement").unwrap();
    let token = acquire_free(store, &name, &who).await;
    let holders = cluster.nodes_holding(&store.lease_key(&name));
    assert_eq!(
        holders.len(),
        1,
        "one node serves the lease key: {holders:?}"
    );
    assert_eq!(
        cluster.nodes_holding(&store.fence_key(&name)),
        holders,
        "the fence counter is on the same node"
    );
    store.release(&name, &who, token).await.unwrap();
}

/// Leases on every primary: listed together, renewed in one `renew_many`, and each release
/// heard by a listener subscribed on one seed node.
async fn renewals_and_releases_span_nodes(cluster: &Cluster, store: &RedisStore) {
    let who = HolderId::new("spread").unwrap();
    let mut leases = Vec::new();
    let mut owners = BTreeSet::new();
    for i in 0..12 {
        let name = LeaseName::new(format!("spread/{i}")).unwrap();
        let token = acquire_free(store, &name, &who).await;
        owners.extend(cluster.nodes_holding(&store.lease_key(&name)));
        leases.push((name, token));
    }
    assert_eq!(owners.len(), 3, "leases on all three primaries: {owners:?}");
    // Listed from every primary's keys, in name order.
    let listed: Vec<LeaseName> = store
        .leases(usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .filter(|name| name.as_str().starts_with("spread/"))
        .collect();
    let mut expected: Vec<LeaseName> = leases.iter().map(|(name, _)| name.clone()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    let mut stale = leases.clone();
    stale[5].1 = FencingToken(stale[5].1.get() - 1);
    let renewals = store
        .renew_many(&who, &stale, Duration::from_secs(30))
        .await
        .unwrap();
    let expected: Vec<Renewal> = (0..12)
        .map(|i| {
            if i == 5 {
                Renewal::Lost
            } else {
                Renewal::Renewed
            }
        })
        .collect();
    assert_eq!(renewals, expected);
    let mut released = store.subscribe_releases().expect("notifications on");
    tokio::time::timeout(Duration::from_secs(5), released.live())
        .await
        .expect("release listener live");
    for (name, token) in &leases {
        assert_eq!(
            store.release(name, &who, *token).await.unwrap(),
            Release::Released
        );
        tokio::time::timeout(Duration::from_secs(2), released.released(name))
            .await
            .unwrap_or_else(|_| panic!("release of {name} heard"));
    }
}

/// Tasks on every primary, with the index of their names on one: all listed, in name order,
/// with a control record written through the index's node and the task's.
async fn catalog_spans_nodes(cluster: &Cluster, store: &RedisStore) {
    let who = HolderId::new("catalog").unwrap();
    let mut tasks = Vec::new();
    let mut owners = BTreeSet::new();
    for i in 0..12 {
        let task = LeaseName::new(format!("spread-task/{i:02}")).unwrap();
        let registration = leasehold::catalog::Registration {
            task: &task,
            definition: "{}",
            instance: &who,
            about: "{}",
            ttl: Duration::from_secs(30),
            forget_after: Duration::from_secs(60),
        };
        assert_eq!(store.register(&registration).await.unwrap(), None);
        owners.extend(cluster.nodes_holding(&store.task_key(&task)));
        tasks.push(task);
    }
    assert_eq!(owners.len(), 3, "tasks on all three primaries: {owners:?}");
    assert_eq!(cluster.nodes_holding(&store.catalog_index_key()).len(), 1);
    assert_eq!(
        store.set_control(&tasks[3], None, "{}").await.unwrap(),
        Some(1)
    );
    let listed = store.tasks(Duration::from_secs(60)).await.unwrap();
    let listed: Vec<(&LeaseName, usize, bool)> = listed
        .iter()
        .filter(|t| t.task.as_str().starts_with("spread-task/"))
        .map(|t| (&t.task, t.instances.len(), t.control.is_some()))
        .collect();
    let expected: Vec<(&LeaseName, usize, bool)> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t, 1, i == 3))
        .collect();
    assert_eq!(listed, expected);
    for task in &tasks {
        store.unregister(task, &who).await.unwrap();
    }
}

/// The primary owning a held lease's slot is SIGKILLed; its replica takes over (node timeout
/// 1 s). Measured: how long operations on that slot fail, and whether the guard keeps renewing
/// on the promoted replica; then a release is heard by listeners on the surviving nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_the_guard_renews_on_its_replica() {
    let mut cluster = Cluster::start();
    cluster.wait_for_replicas();
    let connect = || RedisConfig::new(cluster.url()).prefix("failover").connect();
    let (store_a, store_b) = (connect().await.unwrap(), connect().await.unwrap());
    // Each store's listener subscribes while someone waits: both wait for a release throughout.
    let _waiting_a = store_a.subscribe_releases().unwrap();
    let mut released = store_b.subscribe_releases().unwrap();
    let ttl = Duration::from_secs(5);
    let name = LeaseName::new("cluster/guarded").unwrap();
    let lease = Lease::new(store_a.clone(), name.clone(), LeaseConfig::new(ttl)).unwrap();
    let TryAcquire::Acquired(guard) = lease.try_acquire().await.unwrap() else {
        panic!("free lease not acquired");
    };
    let owner = cluster.nodes_holding(&store_a.lease_key(&name));
    assert_eq!(owner.len(), 1, "{owner:?}");
    // Let the write reach the replica before the kill.
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.kill(owner[0]);
    let killed = Instant::now();
    let contender = HolderId::new("contender").unwrap();
    let (answer, back_after) =
        common::first_answer_after(killed, &store_b, &name, &contender, ttl).await;
    println!("slot answered again {back_after:?} after its primary was killed: {answer:?}");
    match answer {
        Acquisition::Busy { holder, .. } => assert_eq!(&holder, lease.holder()),
        Acquisition::Acquired { token } => assert!(
            !guard.is_held(),
            "two holders: the contender got {token} while the guard held {}",
            guard.token()
        ),
    }
    // Renewed on the promoted replica: still held past a ttl after the kill.
    tokio::time::sleep((ttl + Duration::from_secs(1)).saturating_sub(killed.elapsed())).await;
    assert!(
        guard.is_held(),
        "guard kept its lease: {:?}",
        guard.loss_reason()
    );
    let state = store_b.inspect(&name).await.unwrap().unwrap();
    assert_eq!(state.token, guard.token());
    assert!(state.remaining > ttl / 2, "renewed: {:?}", state.remaining);

    // Both listeners are subscribed on live nodes (one of them may have been on the killed
    // node), and a release is heard.
    let channel = store_b.release_channel().to_owned();
    let live: Vec<u16> = cluster
        .ports
        .iter()
        .copied()
        .filter(|p| *p != owner[0])
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let subscribed: u32 = live
            .iter()
            .map(|&p| {
                let reply = cli(p, &["PUBSUB", "NUMSUB", &channel]);
                reply
                    .lines()
                    .nth(1)
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(0)
            })
            .sum();
        if subscribed >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "listeners resubscribed: {subscribed}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    tokio::time::timeout(Duration::from_secs(2), released.released(&name))
        .await
        .expect("release heard after the failover");
}
