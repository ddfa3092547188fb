//! Several independent store handles (separate connections, as separate processes would have)
//! on one file, and real child processes on one file.

use leasehold::{Membership, Slots};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::{
    FencingToken, HolderId, LeaseName, Release, Store,
    store::{Acquisition, SlotClaim},
};
use leasehold_sqlite::{SqliteConfig, SqliteStore};

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("multi-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temp dir")
}

async fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, SqliteConfig::default())
        .await
        .expect("open sqlite store")
}

fn holder(i: usize) -> HolderId {
    HolderId::new(format!("racer-{i}-{}", std::process::id())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_handles_one_winner_per_round_and_increasing_tokens() {
    const RACERS: usize = 8;
    const ROUNDS: usize = 50;
    let dir = temp_dir();
    let path = dir.path().join("race.db");
    let mut stores = Vec::new();
    for _ in 0..RACERS {
        stores.push(open(&path).await);
    }
    let name = LeaseName::new("race").unwrap();
    let task = LeaseName::new("race-task").unwrap();
    let holders: Vec<HolderId> = (0..RACERS).map(holder).collect();
    let mut last = FencingToken(0);
    for round in 0..ROUNDS {
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|i| {
                let (store, name, task, who, barrier) = (
                    stores[i].clone(),
                    name.clone(),
                    task.clone(),
                    holders[i].clone(),
                    barrier.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    let got = store
                        .acquire(&name, &who, Duration::from_secs(30))
                        .await
                        .expect("acquire answered");
                    let slot = store
                        .claim_slot(&task, round as u64 + 1)
                        .await
                        .expect("claim answered");
                    (i, got, slot)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut claims = 0;
        for r in racers {
            let (i, got, slot) = r.await.unwrap();
            if let Acquisition::Acquired { token } = got {
                winners.push((i, token));
            }
            if slot == SlotClaim::Claimed {
                claims += 1;
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        assert_eq!(claims, 1, "round {round}: one slot claim");
        let (i, token) = winners[0];
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        // Released through a different handle's view of the same row.
        assert_eq!(
            stores[(i + 1) % RACERS]
                .release(&name, &holders[i], token)
                .await
                .unwrap(),
            Release::Released
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_one_handle_wakes_subscriber_on_another() {
    let dir = temp_dir();
    let path = dir.path().join("notify.db");
    let (a, b) = (open(&path).await, open(&path).await);
    let name = LeaseName::new("handoff").unwrap();
    let who = holder(0);
    let Acquisition::Acquired { token } = a
        .acquire(&name, &who, Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("free lease not acquired");
    };
    let mut sub = b.subscribe_releases().expect("sqlite has notifications");
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        sub.released(&name).await;
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let name = LeaseName::new("handoff").unwrap();
    let released_at = Instant::now();
    assert_eq!(
        a.release(&name, &who, token).await.unwrap(),
        Release::Released
    );
    tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("subscriber on the other handle woke within 1 s")
        .unwrap();
    assert!(released_at.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn same_handle_release_is_published_once() {
    let dir = temp_dir();
    let store = open(&dir.path().join("once.db")).await;
    let name = LeaseName::new("once").unwrap();
    let other = LeaseName::new("other").unwrap();
    let who = holder(0);
    let mut sub = store.subscribe_releases().unwrap();
    let Acquisition::Acquired { token } = store
        .acquire(&name, &who, Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("not acquired");
    };
    store.release(&name, &who, token).await.unwrap();
    tokio::time::timeout(Duration::from_millis(10), sub.released(&name))
        .await
        .expect("published at once by the releasing handle");
    // The poller sees the same row; it must not announce it again.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let Acquisition::Acquired { token } = store
        .acquire(&other, &who, Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("not acquired");
    };
    store.release(&other, &who, token).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), sub.released(&name))
            .await
            .is_err(),
        "a duplicate notification for {name}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_opens_create_the_schema_once() {
    let dir = temp_dir();
    for attempt in 0..20 {
        let path = dir.path().join(format!("fresh-{attempt}.db"));
        let opens: Vec<_> = (0..12)
            .map(|_| {
                let path = path.clone();
                tokio::spawn(async move {
                    let store = SqliteStore::open(&path, SqliteConfig::default()).await?;
                    let name = LeaseName::new("fresh").unwrap();
                    store
                        .acquire(&name, &HolderId::generate(), Duration::from_secs(5))
                        .await
                        .expect("first operation on a fresh file");
                    Ok::<_, leasehold_sqlite::Error>(store)
                })
            })
            .collect();
        for o in opens {
            o.await.unwrap().expect("concurrent open succeeds");
        }
    }
}

#[tokio::test]
async fn tokens_and_slots_survive_reopening() {
    let dir = temp_dir();
    let path = dir.path().join("persist.db");
    let (name, who) = (LeaseName::new("persist").unwrap(), holder(0));
    let first = {
        let store = open(&path).await;
        let Acquisition::Acquired { token } = store
            .acquire(&name, &who, Duration::from_secs(30))
            .await
            .unwrap()
        else {
            panic!("not acquired");
        };
        store.release(&name, &who, token).await.unwrap();
        store.claim_slot(&name, 7).await.unwrap();
        token
    };
    let store = open(&path).await;
    assert_eq!(store.inspect(&name).await.unwrap().unwrap().token, first);
    let Acquisition::Acquired { token } = store
        .acquire(&name, &who, Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("not acquired");
    };
    assert!(token > first);
    assert_eq!(
        store.claim_slot(&name, 7).await.unwrap(),
        SlotClaim::AlreadyRun { last: 7 }
    );
}

#[tokio::test]
async fn poller_stops_when_last_handle_is_dropped() {
    // SQLite removes the `-wal` file when the last connection to the database closes, so the
    // file's disappearance shows that the poller's connection was closed too.
    let dir = temp_dir();
    let path = dir.path().join("stop.db");
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    let store = open(&path).await;
    let clone = store.clone();
    let _sub = store.subscribe_releases().unwrap();
    clone.now_millis().await.unwrap();
    assert!(wal.exists(), "WAL mode is on");
    drop(store);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(wal.exists(), "a clone keeps the store open");
    drop(clone);
    let deadline = Instant::now() + Duration::from_secs(2);
    while wal.exists() {
        assert!(
            Instant::now() < deadline,
            "poller connection still open after the last handle was dropped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Child side of [`child_processes_exclude_each_other`]: runs only when started by it.
#[tokio::test]
async fn child_process_worker() {
    let Ok(path) = std::env::var("LEASEHOLD_SQLITE_CHILD_DB") else {
        return;
    };
    let marker = PathBuf::from(std::env::var("LEASEHOLD_SQLITE_CHILD_MARKER").unwrap());
    let store = open(Path::new(&path)).await;
    let name = LeaseName::new("processes").unwrap();
    let who = HolderId::generate();
    let mut tokens = Vec::new();
    let mut attempts = 0;
    while tokens.len() < 20 && attempts < 5_000 {
        attempts += 1;
        match store
            .acquire(&name, &who, Duration::from_secs(30))
            .await
            .unwrap()
        {
            Acquisition::Acquired { token } => {
                // Exclusive creation fails if another process is inside too.
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&marker)
                    .expect("another process holds the lease at the same time");
                tokens.push(token.get());
                std::fs::remove_file(&marker).unwrap();
                assert_eq!(
                    store.release(&name, &who, token).await.unwrap(),
                    Release::Released
                );
            }
            Acquisition::Busy { .. } => tokio::task::yield_now().await,
        }
    }
    for t in tokens {
        println!("TOKEN {t}");
    }
}

#[test]
fn child_processes_exclude_each_other() {
    if std::env::var_os("LEASEHOLD_SQLITE_CHILD_DB").is_some() {
        return;
    }
    let dir = temp_dir();
    let db = dir.path().join("procs.db");
    let marker = dir.path().join("inside");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "child_process_worker",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("LEASEHOLD_SQLITE_CHILD_DB", &db)
                .env("LEASEHOLD_SQLITE_CHILD_MARKER", &marker)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut tokens = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mine: Vec<u64> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("TOKEN ")?.parse().ok())
            .collect();
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "tokens increase within a process"
        );
        tokens.extend(mine);
    }
    assert!(
        tokens.len() >= 20,
        "the children acquired: {}",
        tokens.len()
    );
    let count = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), count, "no token was handed out twice");
}

/// Tokens come from the store's clock for a name the file has never seen: deleting the
/// database file (an operator "resetting" leases) never hands out a token below one handed out
/// before, so a stale holder's write stays fenced off.
#[tokio::test]
async fn a_recreated_file_never_hands_out_a_lower_token() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("leases.db").display());
    let name = LeaseName::new("reset").unwrap();
    let me = HolderId::new("me").unwrap();
    let token = |a: Acquisition| match a {
        Acquisition::Acquired { token } => token,
        other => panic!("{other:?}"),
    };
    let store = leasehold_sqlite::connect(&url).await.unwrap();
    let mut before = token(
        store
            .acquire(&name, &me, Duration::from_secs(60))
            .await
            .unwrap(),
    );
    for _ in 0..3 {
        before = token(
            store
                .acquire(&name, &me, Duration::from_secs(60))
                .await
                .unwrap(),
        );
    }
    drop(store);
    for f in ["leases.db", "leases.db-wal", "leases.db-shm"] {
        let _ = std::fs::remove_file(dir.path().join(f));
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    let store = leasehold_sqlite::connect(&url).await.unwrap();
    let after = token(
        store
            .acquire(&name, &me, Duration::from_secs(60))
            .await
            .unwrap(),
    );
    assert!(after > before, "{after} after {before}");
}

/// A database file `file` in `dir` as an older version wrote it: `sql` makes its tables.
fn old_file(dir: &Path, file: &str, sql: &str) -> PathBuf {
    let path = dir.join(file);
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(sql)
        .unwrap();
    path
}

/// A file written by schema version 1 (no history table) is upgraded in place on open.
#[tokio::test]
async fn a_version_1_file_gains_the_history_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = old_file(
        dir.path(),
        "old.db",
        "PRAGMA journal_mode = WAL;
         CREATE TABLE leases (name TEXT PRIMARY KEY NOT NULL, holder TEXT NULL,
             token INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL);
         CREATE TABLE slots (task TEXT PRIMARY KEY NOT NULL, last_slot INTEGER NOT NULL);
         CREATE TABLE releases (seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,
             at_ms INTEGER NOT NULL);
         INSERT INTO slots VALUES ('t', 42);
         PRAGMA user_version = 1;",
    );
    let store = leasehold_sqlite::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    let task = LeaseName::new("t").unwrap();
    assert_eq!(store.last_slot(&task).await.unwrap(), Some(42));
    store.record_history(&task, 7, "{}", 10).await.unwrap();
    assert_eq!(
        store.history(&task, 10).await.unwrap(),
        vec!["{}".to_owned()]
    );
}

/// A file written by schema version 3 (no members table) gains it on open, and two handles on
/// the file (as two processes) see each other's membership.
#[tokio::test]
async fn a_version_3_file_gains_the_members_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = old_file(
        dir.path(),
        "v3.db",
        "PRAGMA journal_mode = WAL;
         CREATE TABLE leases (name TEXT PRIMARY KEY NOT NULL, holder TEXT NULL,
             token INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL);
         CREATE TABLE slots (task TEXT PRIMARY KEY NOT NULL, last_slot INTEGER NOT NULL);
         PRAGMA user_version = 3;",
    );
    let (one, two) = (open(&path).await, open(&path).await);
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 4);
    let group = LeaseName::new("spread").unwrap();
    let ttl = Duration::from_secs(30);
    one.members(&group, &holder(1), ttl).await.unwrap();
    assert_eq!(
        two.members(&group, &holder(2), ttl).await.unwrap(),
        vec![holder(1), holder(2)]
    );
    one.leave(&group, &holder(1)).await.unwrap();
    assert_eq!(
        two.members(&group, &holder(2), ttl).await.unwrap(),
        vec![holder(2)]
    );
}
