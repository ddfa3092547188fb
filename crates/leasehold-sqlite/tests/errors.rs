//! Unusable paths and URLs, lock contention and timeouts.

use leasehold::Slots;
use std::time::Duration;

use leasehold::{HolderId, LeaseName, Store, StoreError};
use leasehold_sqlite::{Error, SqliteConfig, SqliteSetupError, SqliteStore, connect};

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("errors-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
}

#[tokio::test]
async fn url_forms_open_the_file() {
    let dir = temp_dir();
    let abs = dir.path().join("abs.db");
    let store = connect(&format!("sqlite://{}", abs.display()))
        .await
        .unwrap();
    assert_eq!(store.path(), abs);
    assert_eq!(store.describe(), format!("sqlite:{}", abs.display()));
    let store = connect(&format!("sqlite:{}", abs.display())).await.unwrap();
    store.now_millis().await.unwrap();
    for bad in [
        "sqlite::memory:",
        "sqlite://host/x.db",
        "redis://localhost",
        "sqlite:",
    ] {
        assert!(
            matches!(
                connect(bad).await,
                Err(Error::Store(SqliteSetupError::InvalidUrl { .. }))
            ),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn missing_directory_is_a_clear_error() {
    let dir = temp_dir();
    let path = dir.path().join("no-such-dir").join("leases.db");
    let err = connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Store(SqliteSetupError::MissingDirectory { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[tokio::test]
async fn a_directory_is_not_a_database() {
    let dir = temp_dir();
    let err = SqliteStore::open(dir.path(), SqliteConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Store(SqliteSetupError::NotAFile { .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_foreign_file_is_refused() {
    let dir = temp_dir();
    let path = dir.path().join("notes.txt");
    std::fs::write(
        &path,
        "this is not a sqlite database, just text ".repeat(50),
    )
    .unwrap();
    let err = SqliteStore::open(&path, SqliteConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Store(SqliteSetupError::Open { .. })),
        "{err:?}"
    );
    assert!(!err.is_transient(), "a refusal: {err:?}");
}

#[tokio::test]
async fn permission_denied_is_a_clear_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir();
    let path = dir.path().join("locked.db");
    std::fs::write(&path, "").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    if std::fs::OpenOptions::new().write(true).open(&path).is_ok() {
        // Running as root: permissions are not enforced.
        return;
    }
    let err = SqliteStore::open(&path, SqliteConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Store(SqliteSetupError::Io { .. })),
        "{err:?}"
    );
    assert!(!err.is_transient(), "a refusal: {err:?}");
    // The message names the file, its source why.
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(cause.to_lowercase().contains("permission"), "{cause}");
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = temp_dir();
    let path = dir.path().join("future.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let err = SqliteStore::open(&path, SqliteConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store(SqliteSetupError::SchemaTooNew { found: 99, .. })
        ),
        "{err:?}"
    );
    assert!(!err.is_transient());
}

#[tokio::test]
async fn bad_settings_are_refused() {
    let dir = temp_dir();
    let err = SqliteStore::open(
        dir.path().join("x.db"),
        SqliteConfig::default().op_timeout(Duration::ZERO),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::Store(SqliteSetupError::Config(_))),
        "{err:?}"
    );
}

/// Another process holding the write lock: past the busy timeout the store is unavailable;
/// past the op timeout (when shorter) it timed out. Reads still work in WAL mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_lock_held_elsewhere() {
    let dir = temp_dir();
    let path = dir.path().join("busy.db");
    let name = LeaseName::new("busy").unwrap();
    let who = HolderId::generate();
    let busy = SqliteStore::open(
        &path,
        SqliteConfig::default().busy_timeout(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let slow = SqliteStore::open(
        &path,
        SqliteConfig::default()
            .busy_timeout(Duration::from_secs(5))
            .op_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();

    let err = busy
        .acquire(&name, &who, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(err.is_transient());

    let err = slow.claim_slot(&name, 1).await.unwrap_err();
    assert!(matches!(err, StoreError::Timeout(_)), "{err:?}");

    assert_eq!(
        busy.inspect(&name).await.unwrap(),
        None,
        "reads do not wait"
    );

    blocker.execute_batch("COMMIT").unwrap();
    // The timed-out claim may still land once the lock is free; either way the store works.
    busy.acquire(&name, &who, Duration::from_secs(10))
        .await
        .unwrap();
}
