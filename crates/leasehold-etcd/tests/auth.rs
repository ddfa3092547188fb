//! User and password: on a cluster with etcd's authentication on, the right password works, a
//! wrong or missing one is refused at connect and by every operation of a lazily connecting
//! store (a refusal, never an outage), and no error shows the password.

use leasehold::{HolderId, LeaseName, Store, StoreError};
use leasehold_etcd::testing::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_checked_and_never_shown() {
    let cluster = tokio::task::spawn_blocking(|| {
        let cluster = EtcdCluster::start(1);
        cluster.etcdctl(None, &["user", "add", "root:r00t-Secret"]);
        cluster.etcdctl(None, &["user", "grant-role", "root", "root"]);
        cluster.etcdctl(None, &["auth", "enable"]);
        cluster
    })
    .await
    .unwrap();
    let endpoints = cluster.endpoints().join(",");

    let store = leasehold_etcd::connect(&format!("etcd://root:r00t-Secret@{endpoints}"))
        .await
        .expect("the right password connects");
    assert_eq!(store.describe(), format!("etcd://root@{endpoints}"));
    let (name, holder) = (LeaseName::new("auth").unwrap(), HolderId::new("h").unwrap());
    leasehold_testkit::acquire_free(&store, &name, &holder).await;

    for url in [
        format!("etcd://root:wrong-Secret@{endpoints}"),
        format!("etcd://{endpoints}"),
    ] {
        let err = leasehold_etcd::connect(&url).await.unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("Secret"), "{shown}");
        match err {
            leasehold_etcd::Error::Connect { source, .. } => assert!(
                matches!(source, StoreError::Rejected { .. }),
                "a refusal, not an outage: {source}"
            ),
            other => panic!("{other}"),
        }
        // A store that connects in the background is refused by every operation, from the
        // first on: a refusal a scheduler gives up on, never an outage it may fail open on.
        let lazy = leasehold_etcd::connect_lazy(&url).unwrap();
        for _ in 0..3 {
            let err = lazy
                .acquire(&name, &holder, std::time::Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(matches!(err, StoreError::Rejected { .. }), "{err:?}");
            assert!(!format!("{err} {err:?}").contains("Secret"));
        }
    }
}
