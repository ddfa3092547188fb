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

    // Checking a password is slow on purpose (bcrypt): a refusal is answered from memory, and
    // the password tried again in the background, so no operation waits for a check and times
    // out, which would look like an outage. With a 30 ms operation timeout, once the first
    // check has ended, every operation is refused, none times out.
    let url = format!("etcd://root:wrong-Secret@{endpoints}?timeout_ms=30");
    let lazy = leasehold_etcd::connect_lazy(&url).unwrap();
    let started = std::time::Instant::now();
    while lazy
        .acquire(&name, &holder, std::time::Duration::from_secs(5))
        .await
        .unwrap_err()
        .is_transient()
    {
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    println!("first refusal known after {:?}", started.elapsed());
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut refused = 0;
    while std::time::Instant::now() < until {
        let err = lazy
            .acquire(&name, &holder, std::time::Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Rejected { .. }), "{err:?}");
        refused += 1;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    println!("{refused} operations refused in 3 s, none timed out");

    // Credentials the cluster comes to accept are picked up without a restart: a user added
    // after the store started.
    let url = format!("etcd://late:l4te-Secret@{endpoints}");
    let lazy = leasehold_etcd::connect_lazy(&url).unwrap();
    let err = lazy
        .acquire(&name, &holder, std::time::Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Rejected { .. }), "{err:?}");
    cluster.etcdctl(Some("r00t-Secret"), &["user", "add", "late:l4te-Secret"]);
    cluster.etcdctl(Some("r00t-Secret"), &["user", "grant-role", "late", "root"]);
    let fixed = std::time::Instant::now();
    let late = LeaseName::new("auth-late").unwrap();
    loop {
        match lazy
            .acquire(&late, &holder, std::time::Duration::from_secs(5))
            .await
        {
            Ok(_) => break,
            Err(e) => assert!(
                fixed.elapsed() < std::time::Duration::from_secs(10),
                "still refused: {e}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    println!("accepted {:?} after the user was added", fixed.elapsed());
}
