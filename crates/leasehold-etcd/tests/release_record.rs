//! The keys record their schema version and the oldest release that may still write to them
//! (`PREFIX meta/schema_version`, `PREFIX meta/min_writer`, see `leasehold::skew`); a release
//! older than that refuses them and writes nothing, eagerly (`connect`) or lazily (every
//! operation is refused).

mod common;

use leasehold::skew;
use leasehold::{HolderId, LeaseName, Store};
use leasehold_etcd::Error;

/// Every key and value under `prefix`, as etcdctl prints them (key line, value line).
fn contents(prefix: &str) -> String {
    common::shared_cluster().etcdctl(None, &["get", "--prefix", prefix])
}

fn put(key: &str, value: &str) {
    common::shared_cluster().etcdctl(None, &["put", key, value]);
}

async fn url(prefix: &str) -> String {
    let cluster = tokio::task::spawn_blocking(common::shared_cluster)
        .await
        .unwrap();
    format!("{}/?prefix={prefix}", cluster.url())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_record_their_version_and_the_oldest_writer_and_never_lower_it() {
    let prefix = format!("lh-test-{:08x}/", fastrand::u32(..));
    let url = url(&prefix).await;
    drop(leasehold_etcd::connect(&url).await.unwrap());
    let record = |min: &str, version: &str| {
        format!("{prefix}meta/min_writer\n{min}\n{prefix}meta/schema_version\n{version}\n")
    };
    assert_eq!(contents(&prefix), record(skew::OLDEST_WRITER, "2"));
    put(&format!("{prefix}meta/min_writer"), skew::THIS_RELEASE);
    put(&format!("{prefix}meta/schema_version"), "3");
    drop(leasehold_etcd::connect(&url).await.unwrap());
    assert_eq!(contents(&prefix), record(skew::THIS_RELEASE, "3"));
    put(&format!("{prefix}meta/min_writer"), "0.0.1");
    drop(leasehold_etcd::connect(&url).await.unwrap());
    assert_eq!(contents(&prefix), record(skew::OLDEST_WRITER, "3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_need_a_newer_release_are_refused_and_left_as_they_were() {
    let prefix = format!("lh-test-{:08x}/", fastrand::u32(..));
    let url = url(&prefix).await;
    drop(leasehold_etcd::connect(&url).await.unwrap());
    put(&format!("{prefix}meta/min_writer"), "99.0.0");
    let before = contents(&prefix);

    let err = leasehold_etcd::connect(&url).await.expect_err("too old");
    let Error::TooOld { source, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(source.required, "99.0.0");
    assert!(!err.is_transient());

    let lazy = leasehold_etcd::connect_lazy(&url).unwrap();
    let (name, who) = (
        LeaseName::new("job").unwrap(),
        HolderId::new("old").unwrap(),
    );
    let refused = lazy
        .acquire(&name, &who, std::time::Duration::from_secs(5))
        .await
        .expect_err("refused");
    assert!(!refused.is_transient(), "{refused:?}");
    assert!(
        refused
            .to_string()
            .contains("upgrade leasehold to at least 99.0.0"),
        "{refused}"
    );
    drop(lazy);
    assert_eq!(contents(&prefix), before);
}
