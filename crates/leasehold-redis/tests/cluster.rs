//! `redis+cluster://` against a six-node Redis Cluster of the test's own (three primaries, one
//! replica each): the conformance suite, slot placement of a lease's keys, renewals and release
//! notifications across nodes. One cluster serves the whole file, owned by one test function so
//! it is torn down when the test ends.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::ha::Cluster;
use leasehold::{Acquisition, FencingToken, HolderId, LeaseName, Release, Renewal, Store};
use leasehold_redis::{RedisConfig, RedisStore};

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
    common::run_conformance(store.clone()).await;
    common::lazy_store_connects(&cluster.url()).await;
    keys_of_a_lease_share_its_slot(&cluster, &store).await;
    renewals_and_releases_span_nodes(&cluster, &store).await;
}

async fn acquire_free(store: &RedisStore, name: &LeaseName, who: &HolderId) -> FencingToken {
    match store.acquire(name, who, Duration::from_secs(30)).await {
        Ok(Acquisition::Acquired { token }) => token,
        other => panic!("free lease {name} not acquired: {other:?}"),
    }
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

/// Leases on every primary: renewed in one `renew_many`, and each release heard by a listener
/// subscribed on one seed node.
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
