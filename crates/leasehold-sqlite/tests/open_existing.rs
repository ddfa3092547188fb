//! `SqliteStore::open_existing` / `connect_existing` (issue 36, item 9): a path with no file, or
//! a file that is not a leasehold store, is refused with a typed error and left as it was; a
//! store made by `open` is opened and read.

use std::path::Path;
use std::time::Duration;

use leasehold::{HolderId, LeaseName, Store};
use leasehold_sqlite::rusqlite::Connection;
use leasehold_sqlite::{
    Error, FileContents, SqliteConfig, SqliteSetupError, SqliteStore, connect, connect_existing,
};

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("existing-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
}

/// The names in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_missing_file_is_not_found_and_not_created() {
    let dir = temp_dir();
    for path in [
        dir.path().join("typo.db"),
        dir.path().join("no-such-dir").join("leases.db"),
    ] {
        let err = SqliteStore::open_existing(&path, SqliteConfig::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Store(SqliteSetupError::NotFound { path: p }) if p == &path),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("sqlite database {} does not exist", path.display())
        );
        assert!(!err.is_transient());
        assert!(
            files_in(dir.path()).is_empty(),
            "{:?}",
            files_in(dir.path())
        );
    }
}

/// A relative path is named from the root, so the message says where it was looked for.
#[tokio::test]
async fn a_relative_path_is_named_from_the_root() {
    let err = connect_existing("sqlite:no-such-leasehold-store.db")
        .await
        .unwrap_err();
    let cwd = std::env::current_dir().unwrap();
    match err {
        Error::Store(SqliteSetupError::NotFound { path }) => {
            assert_eq!(path, cwd.join("no-such-leasehold-store.db"))
        }
        other => panic!("{other:?}"),
    }
    assert!(!cwd.join("no-such-leasehold-store.db").exists());
}

#[tokio::test]
async fn a_store_made_by_open_is_opened_and_read() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", dir.path().join("leases.db").display());
    let writer = connect(&url).await.unwrap();
    let name = LeaseName::new("sweep").unwrap();
    let holder = HolderId::new("writer").unwrap();
    writer
        .acquire(&name, &holder, Duration::from_secs(30))
        .await
        .unwrap();
    let reader = connect_existing(&url).await.unwrap();
    let state = reader.inspect(&name).await.unwrap().unwrap();
    assert_eq!(state.holder, Some(holder));
}

/// A file another process has just created, and not yet made a store, is waited for: a
/// `status` started right after the first `run` reads the store rather than calling it empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_being_created_is_waited_for() {
    let dir = temp_dir();
    let path = dir.path().join("new.db");
    std::fs::write(&path, b"").unwrap();
    let url = format!("sqlite:{}", path.display());
    let creator = {
        let url = url.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            connect(&url).await.unwrap()
        })
    };
    let started = std::time::Instant::now();
    let reader = connect_existing(&url).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
    reader.now_millis().await.unwrap();
    drop(creator.await.unwrap());
}

/// Each kind of file that is not a leasehold store, and what it holds before and after: the
/// same bytes, nothing beside it (no `-wal`, `-shm`).
#[tokio::test]
async fn files_that_are_not_stores_are_refused_and_left_unchanged() {
    let dir = temp_dir();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let other = dir.path().join("other.db");
    Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me');")
        .unwrap();
    // Another application's table that happens to be called `leases`.
    let rentals = dir.path().join("rentals.db");
    Connection::open(&rentals)
        .unwrap()
        .execute_batch("CREATE TABLE leases (flat TEXT, tenant TEXT, rent INTEGER);")
        .unwrap();
    let tableless = dir.path().join("tableless.db");
    Connection::open(&tableless)
        .unwrap()
        .pragma_update(None, "user_version", 7)
        .unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a database at all ".repeat(50)).unwrap();
    let before = files_in(dir.path());

    for (path, found) in [
        (&empty, FileContents::Empty),
        (&other, FileContents::OtherDatabase),
        (&rentals, FileContents::OtherDatabase),
        (&tableless, FileContents::Empty),
        (&text, FileContents::NotSqlite),
    ] {
        let bytes = std::fs::read(path).unwrap();
        let err = connect_existing(&format!("sqlite:{}", path.display()))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Store(SqliteSetupError::NotAStore { path: p, found: f }) if p == path && *f == found),
            "{}: {err:?}",
            path.display()
        );
        assert!(
            err.to_string()
                .starts_with(&format!("{} is not a leasehold store: ", path.display())),
            "{err}"
        );
        assert!(!err.is_transient());
        assert_eq!(std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
    assert_eq!(files_in(dir.path()), before);
}
