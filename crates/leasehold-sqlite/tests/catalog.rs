//! The catalog beside release 0.1.0 (commit 24f6cbf), which shares files with this one during a
//! rolling deploy: it refuses a file whose `user_version` is above 4 and migrates one whose
//! version differs from 4, so the catalog's tables are added at version 4 without touching
//! anything 0.1.0 reads.

use std::path::Path;
use std::time::Duration;

use leasehold::catalog::{CATALOG_RETENTION, Registration, Versioned};
use leasehold::store::Acquisition;
use leasehold::{Catalog, HolderId, LeaseName, Store};
use leasehold_sqlite::{SqliteConfig, SqliteStore};

/// The schema exactly as release 0.1.0 creates it (its `schema::SCHEMA`), at its version.
const RELEASE_0_1_0_SCHEMA: &str = "
PRAGMA journal_mode = WAL;
CREATE TABLE IF NOT EXISTS leases (
    name          TEXT PRIMARY KEY NOT NULL,
    holder        TEXT NULL,
    token         INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS slots (
    task      TEXT PRIMARY KEY NOT NULL,
    last_slot INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS history (
    task  TEXT NOT NULL,
    key   INTEGER NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (task, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
    group_name    TEXT NOT NULL,
    member        TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (group_name, member)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS releases (
    seq   INTEGER PRIMARY KEY AUTOINCREMENT,
    name  TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);
PRAGMA user_version = 4;
";

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("catalog-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
}

async fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, SqliteConfig::default())
        .await
        .expect("open sqlite store")
}

/// `user_version`, and every table with its SQL, as release 0.1.0's open path would read them.
fn layout(path: &Path) -> (i64, Vec<(String, String)>) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let version = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    let tables = conn
        .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    (version, tables)
}

fn registration<'a>(
    task: &'a LeaseName,
    instance: &'a HolderId,
    ttl: Duration,
) -> Registration<'a> {
    Registration {
        task,
        definition: "{\"schedule\":\"every 1m\"}",
        instance,
        about: "{\"version\":\"test\"}",
        ttl,
        forget_after: CATALOG_RETENTION,
    }
}

/// A file as release 0.1.0 left it gains the catalog on open; the file stays at version 4 with
/// 0.1.0's tables and rows as they were, so 0.1.0 opens it again without migrating (and so
/// without refusing it), while the catalog works from every handle and survives reopening.
#[tokio::test]
async fn a_release_0_1_0_file_gains_the_catalog_and_stays_at_version_4() {
    let dir = temp_dir();
    let path = dir.path().join("leases.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(RELEASE_0_1_0_SCHEMA).unwrap();
    conn.execute_batch(
        "INSERT INTO slots VALUES ('old-task', 42);
         INSERT INTO leases VALUES ('old-lease', NULL, 7, 0);",
    )
    .unwrap();
    drop(conn);
    let (_, before) = layout(&path);

    let (one, two) = (open(&path).await, open(&path).await);
    let (version, after) = layout(&path);
    assert_eq!(version, 4, "release 0.1.0 refuses a file above version 4");
    let old: Vec<_> = after
        .iter()
        .filter(|(name, _)| !["tasks", "task_instances"].contains(&name.as_str()))
        .cloned()
        .collect();
    assert_eq!(old, before, "release 0.1.0's tables are untouched");
    assert_eq!(after.len(), before.len() + 2, "{after:?}");

    let task = LeaseName::new("new-task").unwrap();
    let me = HolderId::new("me").unwrap();
    assert_eq!(
        one.register(&registration(&task, &me, Duration::from_secs(60)))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        two.set_control(&task, None, "paused").await.unwrap(),
        Some(1)
    );
    let listed = two.tasks(CATALOG_RETENTION).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].instances[0].instance, me);
    let old_lease = LeaseName::new("old-lease").unwrap();
    let leases = one.leases(10).await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(
        (&leases[0].name, leases[0].state.token.get()),
        (&old_lease, 7)
    );
    let someone = HolderId::new("someone").unwrap();
    let Acquisition::Acquired { token } = one
        .acquire(&old_lease, &someone, Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("the old lease is free");
    };
    assert_eq!(token.get(), 8, "the old token counter goes on");
    drop((one, two));

    // Opening again (as the next replica would) changes nothing and keeps the catalog.
    let again = open(&path).await;
    assert_eq!(layout(&path), (4, after));
    assert_eq!(
        again.control(&task).await.unwrap().control,
        Some(Versioned {
            version: 1,
            value: "paused".to_owned(),
        })
    );
}

/// After a reboot the catalog's heartbeats (on the host's boot-time clock, which restarted) are
/// over, even when a release without the catalog opened the file first and recorded the new
/// boot: the catalog keeps a boot id of its own.
#[tokio::test]
async fn instances_of_an_earlier_boot_have_expired() {
    let dir = temp_dir();
    let path = dir.path().join("leases.db");
    let task = LeaseName::new("rebooted").unwrap();
    let me = HolderId::new("me").unwrap();
    let store = open(&path).await;
    store
        .register(&registration(&task, &me, Duration::from_secs(3600)))
        .await
        .unwrap();
    drop(store);
    // What a reboot seen first by release 0.1.0 leaves: `boot_id` current (0.1.0 updated it),
    // the catalog's heartbeats written on the earlier boot's clock.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE meta SET value = 'an-earlier-boot' WHERE key = 'catalog_boot_id'",
            [],
        )
        .unwrap();

    let store = open(&path).await;
    let listed = store.tasks(CATALOG_RETENTION).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let seen: Vec<_> = listed[0]
        .instances
        .iter()
        .map(|i| (&i.instance, i.remaining))
        .collect();
    assert_eq!(seen, vec![(&me, Duration::ZERO)], "listed, expired");
    store
        .register(&registration(&task, &me, Duration::from_secs(60)))
        .await
        .unwrap();
    let listed = store.tasks(CATALOG_RETENTION).await.unwrap();
    assert!(listed[0].instances[0].remaining > Duration::ZERO);
}
