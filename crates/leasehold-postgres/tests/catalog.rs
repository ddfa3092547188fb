//! The catalog beside release 0.1.0 (commit 24f6cbf), whose migration creates nothing when its
//! four tables exist and whose statements touch only those; and the catalog's statements under
//! concurrent callers.

mod common;

use leasehold::{Catalog, LeaseName};
use leasehold_postgres::PgConfig;
use leasehold_postgres::tokio_postgres::Client;
use leasehold_testkit::catalog;

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

            let task = catalog::upgraded_tables_keep_their_rows(&store).await;
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
    let store = common::store().await;
    let task = LeaseName::new(format!("cas-race-{:08x}", fastrand::u32(..))).unwrap();
    catalog::racing_control_writers(&[store], &task).await;
}

/// Many instances registering one task with heartbeats over at once, while others list the
/// catalog forgetting them as fast: registrations and both kinds of forgetting (a registration's
/// of the task's other instances, a listing's of every instance and of the task) meet on the
/// same rows, and no statement waits on another in a cycle (PostgreSQL would abort one as a
/// deadlock, and the store answer `Unavailable`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_registrations_and_listings_all_succeed() {
    let store = common::store().await;
    let task = LeaseName::new(format!("busy-task-{:08x}", fastrand::u32(..))).unwrap();
    catalog::register_and_list_at_once(&[store], &task).await;
}
