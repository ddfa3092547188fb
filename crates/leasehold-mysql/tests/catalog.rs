//! The catalog beside tables of schema version 1 (the store as merged at 007f56a) and of a later
//! version that only adds; its statements under concurrent callers (no deadlock, one winner per
//! control version, no task lost to a listing's delete); byte order; a least-privileged user.

mod common;

use std::time::Duration;

use leasehold::catalog::CATALOG_RETENTION;
use leasehold::{Catalog, HolderId, LeaseName, Store, store::Acquisition};
use leasehold_mysql::mysql_async::prelude::Queryable;
use leasehold_mysql::mysql_async::{self, Conn, Row};
use leasehold_mysql::{MySqlConfig, MySqlStore};
use leasehold_testkit::catalog::{self, fleeting, registration};
use leasehold_testkit::mariadb::OwnMariaDb;

/// The tables exactly as schema version 1 creates them (prefix `{p}`), with its version row.
const VERSION_1_TABLES: [&str; 6] = [
    "CREATE TABLE `{p}leases` (
  name VARBINARY(128) NOT NULL,
  holder VARBINARY(255) NULL,
  token BIGINT NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  released_at DATETIME(6) NULL,
  PRIMARY KEY (name),
  KEY released_at (released_at)
) ENGINE=InnoDB",
    "CREATE TABLE `{p}slots` (
  task VARBINARY(128) NOT NULL,
  last_slot BIGINT NOT NULL,
  PRIMARY KEY (task)
) ENGINE=InnoDB",
    "CREATE TABLE `{p}history` (
  task VARBINARY(128) NOT NULL,
  entry_key BIGINT NOT NULL,
  entry MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  PRIMARY KEY (task, entry_key)
) ENGINE=InnoDB",
    "CREATE TABLE `{p}members` (
  group_name VARBINARY(128) NOT NULL,
  member VARBINARY(255) NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  PRIMARY KEY (group_name, member)
) ENGINE=InnoDB",
    "CREATE TABLE `{p}schema` (
  id TINYINT NOT NULL,
  version INT NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB",
    "INSERT INTO `{p}schema` (id, version) VALUES (1, 1)",
];

/// Every column of the tables starting with `prefix`: `table.column type nullable`, sorted.
async fn columns(conn: &mut Conn, prefix: &str) -> Vec<String> {
    let rows: Vec<Row> = conn
        .exec(
            "SELECT CONCAT(TABLE_NAME, '.', COLUMN_NAME, ' ', COLUMN_TYPE, ' ', IS_NULLABLE)
               FROM information_schema.COLUMNS
              WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE CONCAT(?, '%') ORDER BY 1",
            (prefix.replace('_', "\\_"),),
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.get::<String, usize>(0).unwrap())
        .collect()
}

/// The rows of `{prefix}schema`: `(id, version)`.
async fn schema_rows(conn: &mut Conn, prefix: &str) -> Vec<(i64, i64)> {
    conn.query(format!(
        "SELECT id, version FROM `{prefix}schema` ORDER BY id"
    ))
    .await
    .unwrap()
}

fn unique(prefix: &str) -> LeaseName {
    LeaseName::new(format!("{prefix}-{:08x}", fastrand::u32(..))).unwrap()
}

async fn store_on(prefix: &str) -> MySqlStore {
    common::config_on(&common::url(), prefix)
        .connect()
        .await
        .unwrap()
}

/// Tables of schema version 1, with rows: with the migration off, connecting names the missing
/// catalog tables and creates nothing; with it on, it adds the catalog's two tables and nothing
/// else, the old tables and rows stay as they were, row 1 of the schema table still says 1 (so
/// a version 1 build, which reads only that row, keeps working beside this one) and row 2 says
/// 2; the catalog works; connecting again, even with the migration off, writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_1_tables_gain_the_catalog_and_nothing_else() {
    let prefix = common::fresh_prefix();
    let mut admin = common::raw().await;
    for statement in VERSION_1_TABLES {
        admin
            .query_drop(statement.replace("{p}", &prefix))
            .await
            .unwrap();
    }
    admin
        .query_drop(format!(
            "INSERT INTO `{prefix}slots` VALUES ('old-task', 42);
             INSERT INTO `{prefix}leases` VALUES ('old-lease', NULL, 7, SYSDATE(6), NULL)"
        ))
        .await
        .unwrap();
    let before = columns(&mut admin, &prefix).await;

    // With the migration off, the missing catalog is named and nothing is created.
    let err = common::config_on(&common::url(), &prefix)
        .migrate(false)
        .connect()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "missing {prefix}tasks, {prefix}task_instances, and migrate is off"
        )),
        "{err}"
    );
    assert_eq!(columns(&mut admin, &prefix).await, before);

    let store = store_on(&prefix).await;
    let after = columns(&mut admin, &prefix).await;
    let old: Vec<&String> = after
        .iter()
        .filter(|c| !c.contains("tasks.") && !c.contains("task_instances."))
        .collect();
    assert_eq!(
        old,
        before.iter().collect::<Vec<_>>(),
        "old tables untouched"
    );
    let mut tables = common::tables(&prefix).await;
    tables.sort();
    let expected: Vec<String> = [
        "history",
        "leases",
        "members",
        "schema",
        "slots",
        "task_instances",
        "tasks",
    ]
    .iter()
    .map(|t| format!("{prefix}{t}"))
    .collect();
    assert_eq!(tables, expected);
    assert_eq!(
        schema_rows(&mut admin, &prefix).await,
        vec![(1, 1), (2, 2), (3, 1000)]
    );

    let task = catalog::upgraded_tables_keep_their_rows(&store).await;
    drop(store);

    let again = common::config_on(&common::url(), &prefix)
        .migrate(false)
        .connect()
        .await
        .unwrap();
    assert_eq!(columns(&mut admin, &prefix).await, after);
    assert_eq!(
        schema_rows(&mut admin, &prefix).await,
        vec![(1, 1), (2, 2), (3, 1000)]
    );
    assert_eq!(
        again.control(&task).await.unwrap().control.unwrap().version,
        1
    );
    common::drop_prefix(&prefix).await;
}

/// Tables a later version migrated by only adding (a table, a nullable column; row 2 = 3, row 1
/// still 1): this build uses them and leaves them as they are. Once row 1 says 3 it refuses them
/// with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_version_that_only_adds_is_used_and_left_alone() {
    let prefix = common::fresh_prefix();
    drop(store_on(&prefix).await);
    let mut admin = common::raw().await;
    admin
        .query_drop(format!(
            "CREATE TABLE `{prefix}later` (id INT PRIMARY KEY) ENGINE=InnoDB;
             ALTER TABLE `{prefix}tasks` ADD COLUMN colour VARCHAR(10) NULL;
             UPDATE `{prefix}schema` SET version = 3 WHERE id = 2"
        ))
        .await
        .unwrap();
    let columns_then = columns(&mut admin, &prefix).await;

    let store = store_on(&prefix).await;
    let (task, me) = (unique("later"), HolderId::new("me").unwrap());
    store.register(&registration(&task, &me)).await.unwrap();
    assert_eq!(store.set_control(&task, None, "{}").await.unwrap(), Some(1));
    assert_eq!(store.tasks(CATALOG_RETENTION).await.unwrap().len(), 1);
    assert_eq!(
        schema_rows(&mut admin, &prefix).await,
        vec![(1, 1), (2, 3), (3, 1000)]
    );
    assert_eq!(columns(&mut admin, &prefix).await, columns_then);
    drop(store);

    admin
        .query_drop(format!(
            "UPDATE `{prefix}schema` SET version = 3 WHERE id = 1"
        ))
        .await
        .unwrap();
    let err = common::config_on(&common::url(), &prefix)
        .connect()
        .await
        .unwrap_err();
    let line = err.to_string();
    assert!(
        line.contains("need a build of version 3") && line.contains("upgrade leasehold"),
        "{line}"
    );
    assert_eq!(
        schema_rows(&mut admin, &prefix).await,
        vec![(1, 3), (2, 3), (3, 1000)]
    );
    common::drop_prefix(&prefix).await;
}

/// Racing writers of one control record on separate handles: exactly one of those expecting
/// the same version wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_control_writers_one_winner_per_version() {
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(
            common::config()
                .notifications(false)
                .connect()
                .await
                .unwrap(),
        );
    }
    catalog::racing_control_writers(&stores, &unique("cas-race")).await;
}

/// Instances registering one task with heartbeats over at once, while others list the catalog
/// forgetting them as fast, on separate handles: registrations and both kinds of forgetting
/// (a registration's of the task's other instances, a listing's of every instance) meet on the
/// same rows, and the listing's deletion of tasks reads the task's row. On a server of the
/// test's own, which counts deadlocks: none (the store would run a deadlock victim again, so
/// success alone would not show one). The task has a control record, so its row stays: see
/// `registrations_recreating_a_forgotten_task_all_succeed` for a row deleted under them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_registrations_and_listings_never_deadlock() {
    let server = OwnMariaDb::start(&[]);
    let url = server.url("127.0.0.1", "");
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(
            MySqlConfig::new(&url)
                .notifications(false)
                .connect()
                .await
                .unwrap(),
        );
    }
    let task = unique("busy-task");
    stores[0].set_control(&task, None, "{}").await.unwrap();
    catalog::register_and_list_at_once(&stores, &task).await;

    let mut conn = Conn::new(mysql_async::Opts::from_url(&url).unwrap())
        .await
        .unwrap();
    let deadlocks: Option<(String, u64)> = conn
        .query_first("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        .await
        .unwrap();
    let status: Option<(String, String, String)> =
        conn.query_first("SHOW ENGINE INNODB STATUS").await.unwrap();
    let status = status.map(|s| s.2).unwrap_or_default();
    let latest = status
        .split("LATEST DETECTED DEADLOCK")
        .nth(1)
        .and_then(|s| s.split("\nTRANSACTIONS\n").next())
        .unwrap_or("");
    assert_eq!(deadlocks.map(|d| d.1), Some(0), "{latest}");
}

/// As above, without a control record: listings delete the task's row while registrations
/// create it again. Every call succeeds (two registrations re-creating the row at once can
/// deadlock on InnoDB's duplicate-key locks; the victim is run again), and the task ends
/// listed with every instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registrations_recreating_a_forgotten_task_all_succeed() {
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(
            common::config()
                .notifications(false)
                .connect()
                .await
                .unwrap(),
        );
    }
    catalog::register_and_list_at_once(&stores, &unique("recreated")).await;
}

/// A registration racing listings that delete its task (every instance forgotten, no control
/// record): the task is deleted before the registration or kept by it, never lost after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_registration_racing_a_listing_keeps_its_task() {
    let (registering, listing) = (common::store().await, common::store().await);
    let me = HolderId::new("racer").unwrap();
    for round in 0..30 {
        let task = unique("raced");
        registering.register(&fleeting(&task, &me)).await.unwrap();
        // Forgotten (expired for longer than the listing's 1 ms) and due for deletion.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let lists: Vec<_> = (0..3)
            .map(|_| {
                let listing = listing.clone();
                tokio::spawn(async move { listing.tasks(Duration::from_millis(1)).await.unwrap() })
            })
            .collect();
        registering
            .register(&registration(&task, &me))
            .await
            .unwrap();
        for list in lists {
            list.await.unwrap();
        }
        let listed = listing.tasks(Duration::from_millis(1)).await.unwrap();
        let record = listed.iter().find(|t| t.task == task);
        let instances: Vec<&HolderId> = record
            .map(|t| t.instances.iter().map(|i| &i.instance).collect())
            .unwrap_or_default();
        assert_eq!(instances, vec![&me], "round {round}: {record:?}");
        registering.unregister(&task, &me).await.unwrap();
    }
}

/// Tasks, instances and leases come in byte order (upper case before lower case), as on every
/// other store, whatever the server's collation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_are_in_byte_order() {
    let prefix = common::fresh_prefix();
    let store = store_on(&prefix).await;
    let (upper, lower) = (
        LeaseName::new("Zed").unwrap(),
        LeaseName::new("abc").unwrap(),
    );
    let (b, a) = (HolderId::new("B-1").unwrap(), HolderId::new("a-1").unwrap());
    for task in [&lower, &upper] {
        for who in [&a, &b] {
            store.register(&registration(task, who)).await.unwrap();
        }
        match store
            .acquire(task, &a, Duration::from_secs(30))
            .await
            .unwrap()
        {
            Acquisition::Acquired { .. } => {}
            busy => panic!("{busy:?}"),
        }
    }
    let tasks = store.tasks(CATALOG_RETENTION).await.unwrap();
    let names: Vec<&str> = tasks.iter().map(|t| t.task.as_str()).collect();
    assert_eq!(names, vec!["Zed", "abc"]);
    let instances: Vec<&str> = tasks[0]
        .instances
        .iter()
        .map(|i| i.instance.as_str())
        .collect();
    assert_eq!(instances, vec!["B-1", "a-1"]);
    let leases = store.leases(10).await.unwrap();
    let names: Vec<&str> = leases.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, vec!["Zed", "abc"]);
    drop(store);
    common::drop_prefix(&prefix).await;
}

/// A user granted SELECT, INSERT, UPDATE and DELETE on the store's seven tables only (the
/// README's grants), the tables made by an administrator: connects with the migration on and
/// runs every catalog operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privileged_user_runs_the_catalog() {
    let prefix = common::fresh_prefix();
    drop(store_on(&prefix).await);
    let (user, _drop) = common::user("pw").await;
    let mut admin = common::raw().await;
    for table in common::tables(&prefix).await {
        admin
            .query_drop(format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON `test`.`{table}` TO '{user}'@'127.0.0.1'"
            ))
            .await
            .unwrap();
    }
    let store = MySqlConfig::new(common::url_as(&user, "pw"))
        .table_prefix(&prefix)
        .notifications(false)
        .connect()
        .await
        .unwrap();
    let (task, me) = (unique("least"), HolderId::new("me").unwrap());
    assert_eq!(
        store.register(&registration(&task, &me)).await.unwrap(),
        None
    );
    assert_eq!(store.set_control(&task, None, "p").await.unwrap(), Some(1));
    assert_eq!(
        store.set_control(&task, Some(1), "q").await.unwrap(),
        Some(2)
    );
    assert_eq!(
        store.control(&task).await.unwrap().control.unwrap().version,
        2
    );
    store.register(&fleeting(&task, &me)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let listed = store.tasks(Duration::from_millis(1)).await.unwrap();
    assert_eq!(listed.len(), 1, "kept by its control record");
    assert!(listed[0].instances.is_empty(), "{listed:?}");
    store.unregister(&task, &me).await.unwrap();
    store.leases(10).await.unwrap();
    drop(store);
    common::drop_prefix(&prefix).await;
}
