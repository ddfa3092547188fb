//! The catalog beside release 0.1.0 (commit 24f6cbf), whose migration creates nothing when its
//! four tables exist and whose statements touch only those; and the catalog's statements under
//! concurrent callers.

mod common;

use std::time::Duration;

use leasehold::catalog::{CATALOG_RETENTION, Registration};
use leasehold::{Catalog, HolderId, LeaseName, Slots};
use leasehold_postgres::PgConfig;
use leasehold_postgres::tokio_postgres::Client;

/// The tables exactly as release 0.1.0's migration creates them (schema `{schema}`).
const RELEASE_0_1_0_TABLES: &str = "
CREATE SCHEMA IF NOT EXISTS \"{schema}\";
CREATE TABLE IF NOT EXISTS \"{schema}\".\"leases\" (
  name text PRIMARY KEY,
  holder text NULL,
  token bigint NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS \"{schema}\".\"slots\" (
  task text PRIMARY KEY,
  last_slot bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS \"{schema}\".\"history\" (
  task text NOT NULL,
  key bigint NOT NULL,
  entry text NOT NULL,
  PRIMARY KEY (task, key)
);
CREATE TABLE IF NOT EXISTS \"{schema}\".\"members\" (
  group_name text NOT NULL,
  member text NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (group_name, member)
);";

const RELEASE_0_1_0_TABLE_NAMES: [&str; 4] = ["leases", "slots", "history", "members"];

/// Every column of every table in `schema`: `table.column type nullable`, sorted.
async fn columns(client: &Client, schema: &str) -> Vec<String> {
    client
        .query(
            "SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable
               FROM information_schema.columns WHERE table_schema = $1 ORDER BY 1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// What release 0.1.0's migration checks before creating anything: how many of its tables
/// exist.
async fn release_0_1_0_tables_present(client: &Client, schema: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_tables
              WHERE schemaname = $1 AND tablename = ANY($2)",
            &[&schema, &&RELEASE_0_1_0_TABLE_NAMES[..]],
        )
        .await
        .unwrap()
        .get(0)
}

fn registration<'a>(task: &'a LeaseName, instance: &'a HolderId) -> Registration<'a> {
    Registration {
        task,
        definition: "{\"schedule\":\"every 1m\"}",
        instance,
        about: "{\"version\":\"test\"}",
        ttl: Duration::from_secs(60),
        forget_after: CATALOG_RETENTION,
    }
}

/// A heartbeat that is over, and forgotten, a millisecond after it is written.
fn fleeting<'a>(task: &'a LeaseName, instance: &'a HolderId) -> Registration<'a> {
    Registration {
        ttl: Duration::from_millis(1),
        forget_after: Duration::from_millis(1),
        ..registration(task, instance)
    }
}

/// A schema as release 0.1.0 left it, with its rows: connecting adds the catalog's two tables
/// and the meta table and nothing else, release 0.1.0's tables and rows stay as they were (so its migration still
/// finds all four and creates nothing), and the catalog works; connecting again is a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_0_1_0_schema_gains_the_catalog_and_nothing_else() {
    let schema = common::fresh_schema();
    let admin = common::raw().await;
    admin
        .batch_execute(&RELEASE_0_1_0_TABLES.replace("{schema}", &schema))
        .await
        .unwrap();
    admin
        .batch_execute(&format!(
            "INSERT INTO \"{schema}\".slots VALUES ('old-task', 42);
             INSERT INTO \"{schema}\".leases VALUES ('old-lease', NULL, 7, clock_timestamp());"
        ))
        .await
        .unwrap();
    let before = columns(&admin, &schema).await;

    let body = {
        let schema = schema.clone();
        async move {
            let store = PgConfig::new(common::url())
                .schema(&schema)
                .connect()
                .await
                .unwrap();
            let after = columns(&admin, &schema).await;
            let old: Vec<&String> = after
                .iter()
                .filter(|c| {
                    !c.starts_with("tasks.")
                        && !c.starts_with("task_instances.")
                        && !c.starts_with("meta.")
                })
                .collect();
            assert_eq!(
                old,
                before.iter().collect::<Vec<_>>(),
                "release 0.1.0's tables are untouched"
            );
            assert!(after.len() > before.len(), "{after:?}");
            assert_eq!(release_0_1_0_tables_present(&admin, &schema).await, 4);

            let task = LeaseName::new("new-task").unwrap();
            let me = HolderId::new("me").unwrap();
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
            assert_eq!(leases[0].name.as_str(), "old-lease");
            assert_eq!(leases[0].state.token.get(), 7);
            drop(store);

            let again = PgConfig::new(common::url())
                .schema(&schema)
                .connect()
                .await
                .unwrap();
            assert_eq!(columns(&admin, &schema).await, after);
            assert_eq!(
                again.control(&task).await.unwrap().control.unwrap().version,
                1
            );
        }
    };
    let outcome = tokio::spawn(body).await;
    common::drop_schema(&schema).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Racing writers of one control record: exactly one of those expecting the same version wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_control_writers_one_winner_per_version() {
    const RACERS: usize = 8;
    let store = common::store().await;
    let task = LeaseName::new(format!("cas-race-{:08x}", fastrand::u32(..))).unwrap();
    let mut expected = None;
    for round in 1..=5u64 {
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let (store, task) = (store.clone(), task.clone());
                tokio::spawn(async move {
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
    let record = store.control(&task).await.unwrap().control.unwrap();
    assert_eq!(record.version, 5);
    assert!(record.value.starts_with("5-"), "{record:?}");
}

/// Many instances registering one task with heartbeats over at once, while others list the
/// catalog forgetting them as fast: registrations and both kinds of forgetting (a registration's
/// of the task's other instances, a listing's of every instance and of the task) meet on the
/// same rows, and no statement waits on another in a cycle (PostgreSQL would abort one as a
/// deadlock, and the store answer `Unavailable`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_registrations_and_listings_all_succeed() {
    const INSTANCES: usize = 6;
    const BEATS: usize = 40;
    let store = common::store().await;
    let task = LeaseName::new(format!("busy-task-{:08x}", fastrand::u32(..))).unwrap();
    let mut workers = Vec::new();
    for i in 0..INSTANCES {
        let (beating, task) = (store.clone(), task.clone());
        workers.push(tokio::spawn(async move {
            let store = beating;
            let me = HolderId::new(format!("instance-{i}")).unwrap();
            for _ in 0..BEATS {
                store.register(&fleeting(&task, &me)).await.unwrap();
            }
            store.register(&registration(&task, &me)).await.unwrap();
        }));
        let store = store.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..BEATS {
                store.tasks(Duration::from_millis(1)).await.unwrap();
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let listed = store.tasks(CATALOG_RETENTION).await.unwrap();
    let record = listed.iter().find(|t| t.task == task).expect("listed");
    assert_eq!(
        record.definition.as_deref(),
        Some("{\"schedule\":\"every 1m\"}")
    );
    assert_eq!(record.instances.len(), INSTANCES, "{record:?}");
    for i in 0..INSTANCES {
        let me = HolderId::new(format!("instance-{i}")).unwrap();
        store.unregister(&task, &me).await.unwrap();
    }
}
