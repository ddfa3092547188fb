//! `etcd://` URLs open the etcd store, on a one-member cluster of the test's own.
#![cfg(feature = "etcd")]

use std::time::Duration;

use leasehold::{HolderId, LeaseName, Store};
use leasehold_connect::{OpenError, StoreKind, open_store, open_store_lazy};
use leasehold_etcd::testing::EtcdCluster;

#[tokio::test]
async fn etcd_urls_open_the_etcd_store() {
    assert_eq!(StoreKind::of("etcds://h").unwrap(), StoreKind::Etcd);
    let cluster = tokio::task::spawn_blocking(|| EtcdCluster::start(1))
        .await
        .unwrap();
    let store = open_store(&format!("{}/?prefix=connect-test/", cluster.url()))
        .await
        .unwrap();
    assert_eq!(
        store.describe(),
        format!("{}/?prefix=connect-test/", cluster.url())
    );
    let (name, holder) = (
        LeaseName::new("connect-etcd").unwrap(),
        HolderId::new("h").unwrap(),
    );
    leasehold_testkit::acquire_free(&store, &name, &holder).await;
}

#[tokio::test]
async fn an_unreachable_cluster_fails_without_the_password_and_lazily_answers_unavailable() {
    let url = format!(
        "etcd://app:SECRET@127.0.0.1:{}",
        leasehold_testkit::free_port()
    );
    let err = open_store(&url).await.unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(
        matches!(err, OpenError::Unavailable { store: "etcd", .. }),
        "{shown}"
    );
    assert!(!shown.contains("SECRET"), "{shown}");
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(cause.contains("etcd://app@127.0.0.1:"), "{cause}");

    let lazy = open_store_lazy(&url).await.unwrap();
    let name = LeaseName::new("connect-etcd-lazy").unwrap();
    let err = lazy
        .acquire(&name, &HolderId::new("h").unwrap(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(!format!("{err} {err:?}").contains("SECRET"));
}
