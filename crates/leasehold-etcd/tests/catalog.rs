//! The catalog on a real etcd: what is forgotten is deleted (by `register` for its task, by
//! `tasks` for all), a control record keeps its task, control versions are the key's etcd
//! version, and `leases` is one limited, ordered range.

mod common;

use std::time::Duration;

use leasehold::catalog::Registration;
use leasehold::{Catalog, HolderId, LeaseName, Store, store::Acquisition};
use leasehold_etcd::EtcdStore;

/// The keys under `prefix` (text up to the first NUL, which etcdctl cannot take), as etcdctl
/// lists them, NULs shown as `\0`; the store's release record (`meta/`) left out.
fn keys(prefix: &str) -> Vec<String> {
    common::shared_cluster()
        .etcdctl(None, &["get", "--prefix", "--keys-only", prefix])
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(&format!("{prefix}meta/")))
        .map(|l| l.replace('\0', "\\0"))
        .collect()
}

/// The store's key prefix, from one of its keys.
fn prefix_of(store: &EtcdStore) -> String {
    let key = String::from_utf8(store.task_key(&LeaseName::new("x").unwrap())).unwrap();
    key.strip_suffix("task/x").unwrap().to_owned()
}

async fn register(store: &EtcdStore, task: &LeaseName, who: &str, ttl: Duration) {
    let instance = HolderId::new(who).unwrap();
    store
        .register(&Registration {
            task,
            definition: "{}",
            instance: &instance,
            about: "{}",
            ttl,
            forget_after: Duration::from_millis(300),
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgotten_records_are_deleted_and_control_keeps_its_task() {
    let store = common::make_store().await;
    let prefix = prefix_of(&store);
    let (plain, controlled) = (
        LeaseName::new("plain").unwrap(),
        LeaseName::new("controlled").unwrap(),
    );
    let short = Duration::from_millis(200);
    register(&store, &plain, "a", short).await;
    register(&store, &plain, "b", short).await;
    register(&store, &controlled, "a", short).await;
    assert_eq!(
        store.set_control(&controlled, None, "{}").await.unwrap(),
        Some(1)
    );
    tokio::time::sleep(Duration::from_millis(700)).await;

    // A registration deletes its task's forgotten instances, not other tasks'.
    register(&store, &plain, "c", Duration::from_secs(30)).await;
    assert_eq!(
        keys(&format!("{prefix}instance/")),
        vec![
            format!("{prefix}instance/controlled\\0a"),
            format!("{prefix}instance/plain\\0c"),
        ]
    );
    store
        .unregister(&plain, &HolderId::new("c").unwrap())
        .await
        .unwrap();

    // Listing deletes every forgotten instance and the definition of a task it leaves out.
    let listed = store.tasks(Duration::from_millis(300)).await.unwrap();
    let names: Vec<&LeaseName> = listed.iter().map(|t| &t.task).collect();
    assert_eq!(names, vec![&controlled]);
    assert!(listed[0].instances.is_empty());
    assert_eq!(listed[0].definition.as_deref(), Some("{}"));
    assert_eq!(
        keys(&prefix),
        vec![
            format!("{prefix}control/controlled"),
            format!("{prefix}task/controlled"),
        ]
    );
}

/// Versions start at 1 and go up by one whatever was written before; no record has version 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_versions_are_the_keys_versions() {
    let store = common::make_store().await;
    let task = LeaseName::new("versions").unwrap();
    assert_eq!(
        store.set_control(&task, Some(0), "zero").await.unwrap(),
        None
    );
    assert_eq!(store.control(&task).await.unwrap().control, None);
    for version in 1..=3 {
        let expected = (version > 1).then(|| version - 1);
        assert_eq!(
            store.set_control(&task, expected, "v").await.unwrap(),
            Some(version)
        );
    }
    let read = store.control(&task).await.unwrap();
    assert_eq!(read.control.map(|c| c.version), Some(3));
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(read.now_ms.abs_diff(wall) < 1000, "the process's clock");
}

/// `leases` answers the first `limit` records in name order, and nothing for a limit of 0
/// (which etcd itself would read as "no limit").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_one_limited_ordered_range() {
    let store = common::make_store().await;
    let who = HolderId::new("a").unwrap();
    for name in ["c", "a", "b"] {
        let acquired = store
            .acquire(
                &LeaseName::new(name).unwrap(),
                &who,
                Duration::from_secs(30),
            )
            .await
            .unwrap();
        assert!(matches!(acquired, Acquisition::Acquired { .. }));
    }
    assert!(store.leases(0).await.unwrap().is_empty());
    let two: Vec<String> = store
        .leases(2)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name.to_string())
        .collect();
    assert_eq!(two, ["a", "b"]);
    assert_eq!(store.leases(usize::MAX).await.unwrap().len(), 3);
}
