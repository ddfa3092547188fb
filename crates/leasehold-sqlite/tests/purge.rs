//! Garbage collection: 100,000 free lease records of distinct names (a lease per job) are
//! purged; live leases and recent records stay; a purged name's next token is still above its
//! old one.

use leasehold::Purge;
use std::time::{Duration, Instant};

use leasehold::{HolderId, LeaseName, Release, Store, store::Acquisition};

#[tokio::test]
async fn a_hundred_thousand_free_records_are_purged_and_tokens_stay_ahead() {
    let dir = tempfile::Builder::new()
        .prefix("purge-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let path = dir.path().join("gc.db");
    let store = leasehold_sqlite::connect(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    let holder = HolderId::new("gc").unwrap();
    let live = LeaseName::new("job:live").unwrap();
    store
        .acquire(&live, &holder, Duration::from_secs(60))
        .await
        .unwrap();
    let recent = LeaseName::new("job:recent").unwrap();
    let Acquisition::Acquired {
        token: recent_token,
    } = store
        .acquire(&recent, &holder, Duration::from_secs(60))
        .await
        .unwrap()
    else {
        panic!("busy")
    };
    assert_eq!(
        store.release(&recent, &holder, recent_token).await.unwrap(),
        Release::Released
    );
    // The records of 100k finished jobs, free since long before the retention (expiry 0 on the
    // boot-time clock), with tokens from an hour ago.
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let old_token = (wall_ms - 3_600_000) * 1000 + 7;
    {
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        let tx = conn.transaction().unwrap();
        {
            let mut insert = tx
                .prepare("INSERT INTO leases (name, holder, token, expires_at_ms) VALUES (?1, NULL, ?2, 0)")
                .unwrap();
            for i in 0..100_000 {
                insert
                    .execute(rusqlite::params![format!("job:{i}"), old_token])
                    .unwrap();
            }
        }
        tx.commit().unwrap();
    }
    let started = Instant::now();
    let purged = store.purge(Duration::from_secs(1)).await.unwrap();
    println!("purged {purged} records in {:?}", started.elapsed());
    assert_eq!(purged, 100_000);
    assert!(
        store
            .inspect(&live)
            .await
            .unwrap()
            .unwrap()
            .holder
            .is_some()
    );
    assert!(
        store.inspect(&recent).await.unwrap().is_some(),
        "released a moment ago: kept"
    );
    let name = LeaseName::new("job:42").unwrap();
    match store
        .acquire(&name, &holder, Duration::from_secs(5))
        .await
        .unwrap()
    {
        Acquisition::Acquired { token } => assert!(token.get() > old_token as u64),
        busy => panic!("{busy:?}"),
    }
}
