//! Fleet-catalog checks the SQL stores' tests share: registrations, racing control writers,
//! registrations meeting listings, and the rows an upgrade must keep.

use std::sync::Arc;
use std::time::Duration;

use leasehold::catalog::{CATALOG_RETENTION, Registration};
use leasehold::{Catalog, HolderId, LeaseName, Slots};
use tokio::sync::Barrier;

/// The definition [`registration`] writes.
pub const DEFINITION: &str = "{\"schedule\":\"every 1m\"}";

/// `instance`'s registration of `task`: a minute's heartbeat, forgotten after the default
/// retention.
pub fn registration<'a>(task: &'a LeaseName, instance: &'a HolderId) -> Registration<'a> {
    Registration {
        task,
        definition: DEFINITION,
        instance,
        about: "{\"version\":\"test\"}",
        ttl: Duration::from_secs(60),
        forget_after: CATALOG_RETENTION,
    }
}

/// A heartbeat that is over, and forgotten, a millisecond after it is written.
pub fn fleeting<'a>(task: &'a LeaseName, instance: &'a HolderId) -> Registration<'a> {
    Registration {
        ttl: Duration::from_millis(1),
        forget_after: Duration::from_millis(1),
        ..registration(task, instance)
    }
}

/// Five rounds of 8 writers of `task`'s control record, released at once and spread over
/// `stores` (handles on one database): exactly one of those expecting the same version wins.
pub async fn racing_control_writers<S: Catalog>(stores: &[S], task: &LeaseName) {
    const RACERS: usize = 8;
    let mut expected = None;
    for round in 1..=5u64 {
        let barrier = Arc::new(Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let (store, task, barrier) = (
                    stores[i % stores.len()].clone(),
                    task.clone(),
                    barrier.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .set_control(&task, expected, &format!("{round}-{i}"))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut won = Vec::new();
        for racer in racers {
            won.extend(racer.await.unwrap());
        }
        assert_eq!(won, vec![round], "round {round}");
        expected = Some(round);
    }
    let record = stores[0].control(task).await.unwrap().control.unwrap();
    assert_eq!(record.version, 5);
    assert!(record.value.starts_with("5-"), "{record:?}");
}

/// Six instances registering `task` with heartbeats over at once, while as many listings
/// forget them as fast, spread over `stores`: every call succeeds, and the task is left with
/// its definition and its six instances (unregistered at the end).
pub async fn register_and_list_at_once<S: Catalog>(stores: &[S], task: &LeaseName) {
    const INSTANCES: usize = 6;
    const BEATS: usize = 40;
    let mut workers = Vec::new();
    for i in 0..INSTANCES {
        let (store, task) = (stores[i % stores.len()].clone(), task.clone());
        workers.push(tokio::spawn(async move {
            let me = HolderId::new(format!("instance-{i}")).unwrap();
            for _ in 0..BEATS {
                store.register(&fleeting(&task, &me)).await.unwrap();
            }
            store.register(&registration(&task, &me)).await.unwrap();
        }));
        let store = stores[(i + 1) % stores.len()].clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..BEATS {
                store.tasks(Duration::from_millis(1)).await.unwrap();
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let listed = stores[0].tasks(CATALOG_RETENTION).await.unwrap();
    let record = listed.iter().find(|t| &t.task == task).expect("listed");
    assert_eq!(record.definition.as_deref(), Some(DEFINITION));
    assert_eq!(record.instances.len(), INSTANCES, "{record:?}");
    for i in 0..INSTANCES {
        let me = HolderId::new(format!("instance-{i}")).unwrap();
        stores[0].unregister(task, &me).await.unwrap();
    }
}

/// On tables of an earlier release holding lease `old-lease` (token 7) and task `old-task`'s
/// slot 42, upgraded by opening `store`: the catalog works (task `new-task` registered, then
/// paused) and the old rows read as they were. Returns `new-task`.
pub async fn upgraded_tables_keep_their_rows<S: Catalog + Slots>(store: &S) -> LeaseName {
    let (task, me) = (
        LeaseName::new("new-task").unwrap(),
        HolderId::new("me").unwrap(),
    );
    assert_eq!(
        store.register(&registration(&task, &me)).await.unwrap(),
        None
    );
    assert_eq!(
        store.set_control(&task, None, "paused").await.unwrap(),
        Some(1)
    );
    let listed = store.tasks(CATALOG_RETENTION).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].instances[0].instance, me);
    let old_task = LeaseName::new("old-task").unwrap();
    assert_eq!(store.last_slot(&old_task).await.unwrap(), Some(42));
    let leases = store.leases(10).await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(
        (leases[0].name.as_str(), leases[0].state.token.get()),
        ("old-lease", 7)
    );
    task
}
