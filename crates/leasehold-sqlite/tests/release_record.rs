//! The file records its schema version and the oldest release that may still write to it
//! (`meta`, see `leasehold::skew`); a release older than that refuses the file and writes nothing.

use std::path::Path;

use leasehold::skew;
use leasehold_sqlite::{Error, SqliteConfig, SqliteStore};

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("release-record-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
}

fn meta(path: &Path, key: &str) -> Option<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .ok()
}

/// Everything the file holds, logically: `user_version`, every table's SQL and rows (bytes on
/// disk may change without a write, when the last connection checkpoints the WAL).
fn contents(path: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    let mut out = vec![format!("user_version {version}")];
    let tables: Vec<(String, String)> = conn
        .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    for (name, sql) in tables {
        out.push(sql);
        let mut rows = conn
            .prepare(&format!("SELECT * FROM \"{name}\" ORDER BY 1"))
            .unwrap();
        let columns = rows.column_count();
        let rows: Vec<String> = rows
            .query_map([], |r| {
                (0..columns)
                    .map(|i| {
                        r.get::<_, rusqlite::types::Value>(i)
                            .map(|v| format!("{v:?}"))
                    })
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .unwrap()
            .map(|row| format!("{name}: {}", row.unwrap().join(", ")))
            .collect();
        out.extend(rows);
    }
    out
}

fn set_meta(path: &Path, key: &str, value: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
        [key, value],
    )
    .unwrap();
}

#[tokio::test]
async fn a_new_file_records_its_schema_and_the_oldest_writer_at_user_version_4() {
    let dir = temp_dir();
    let path = dir.path().join("leases.db");
    drop(
        SqliteStore::open(&path, SqliteConfig::default())
            .await
            .unwrap(),
    );
    assert_eq!(meta(&path, "schema_version").as_deref(), Some("5"));
    assert_eq!(
        meta(&path, "min_writer").as_deref(),
        Some(skew::OLDEST_WRITER)
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 4, "release 0.1.0 refuses any other version");
}

#[tokio::test]
async fn a_lower_record_is_raised_and_a_higher_one_this_release_may_use_is_kept() {
    let dir = temp_dir();
    let path = dir.path().join("leases.db");
    drop(
        SqliteStore::open(&path, SqliteConfig::default())
            .await
            .unwrap(),
    );
    set_meta(&path, "min_writer", "0.0.1");
    set_meta(&path, "schema_version", "3");
    drop(
        SqliteStore::open(&path, SqliteConfig::default())
            .await
            .unwrap(),
    );
    assert_eq!(
        meta(&path, "min_writer").as_deref(),
        Some(skew::OLDEST_WRITER)
    );
    assert_eq!(meta(&path, "schema_version").as_deref(), Some("5"));

    set_meta(&path, "min_writer", skew::THIS_RELEASE);
    set_meta(&path, "schema_version", "6");
    drop(
        SqliteStore::open(&path, SqliteConfig::default())
            .await
            .unwrap(),
    );
    assert_eq!(
        meta(&path, "min_writer").as_deref(),
        Some(skew::THIS_RELEASE)
    );
    assert_eq!(meta(&path, "schema_version").as_deref(), Some("6"));
}

#[tokio::test]
async fn a_file_that_needs_a_newer_release_is_refused_and_left_as_it_was() {
    let dir = temp_dir();
    let path = dir.path().join("leases.db");
    drop(
        SqliteStore::open(&path, SqliteConfig::default())
            .await
            .unwrap(),
    );
    set_meta(&path, "min_writer", "99.0.0");
    // What a newer release may have changed, which this one must not undo.
    set_meta(&path, "boot_id", "a boot of the newer release");
    let before = contents(&path);

    let err = SqliteStore::open(&path, SqliteConfig::default())
        .await
        .expect_err("a release below the file's oldest writer");
    let Error::TooOld { source, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(source.required, "99.0.0");
    assert!(!err.is_transient());
    let message = format!("{err}: {source}");
    assert!(
        message.contains("upgrade leasehold to at least 99.0.0"),
        "{message}"
    );
    assert_eq!(contents(&path), before, "nothing written");
    assert_eq!(
        meta(&path, "boot_id").as_deref(),
        Some("a boot of the newer release")
    );
}
