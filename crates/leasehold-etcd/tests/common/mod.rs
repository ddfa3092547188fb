//! The cluster the conformance checks share within one test process.
#![allow(dead_code)]

use std::sync::OnceLock;

use leasehold_etcd::EtcdStore;
use leasehold_etcd::testing::EtcdCluster;

/// One 3-member cluster per test process (nextest runs each test in a process of its own;
/// `cargo test` shares it across the binary), started on first use. A static is never dropped:
/// the cluster's watchdog kills its members and removes its directory once the process exits.
pub fn shared_cluster() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| EtcdCluster::start(3))
}

/// A store on the shared cluster, with a key prefix of its own.
pub async fn make_store() -> EtcdStore {
    let cluster = tokio::task::spawn_blocking(shared_cluster).await.unwrap();
    let url = format!(
        "{}/?prefix=lh-test-{:08x}/",
        cluster.url(),
        fastrand::u32(..)
    );
    leasehold_etcd::connect(&url)
        .await
        .expect("etcd store connects")
}
