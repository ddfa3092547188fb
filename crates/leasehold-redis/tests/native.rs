//! Native compare-and-set commands on the local Valkey 9 (`LEASEHOLD_TEST_VALKEY_URL`, set by
//! the test command): renew is `SET … IFEQ … PX` and release `DELIFEQ`, and a server that refuses
//! them (here: an ACL without `DELIFEQ`) gets the scripts instead, with the same answers.

mod common;

use std::time::Duration;

use leasehold::store::Acquisition;
use leasehold::{HolderId, LeaseName, Release, Store, store::Renewal};
use leasehold_redis::RedisConfig;
use redis::AsyncCommands as _;

/// `calls=` of `cmdstat_<command>` in the server's INFO commandstats.
async fn calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

fn names() -> (LeaseName, HolderId) {
    (
        LeaseName::new("native").unwrap(),
        HolderId::new("h-1").unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_renews_with_set_ifeq_and_releases_with_delifeq() {
    let Some(url) = common::valkey_url() else {
        return;
    };
    let store = common::make_valkey_store().await.unwrap();
    let mut admin = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (name, who) = names();
    let ttl = Duration::from_secs(5);
    let Acquisition::Acquired { token } = store.acquire(&name, &who, ttl).await.unwrap() else {
        panic!("fresh name busy")
    };
    let (sets, deletes) = (
        calls(&mut admin, "set").await,
        calls(&mut admin, "delifeq").await,
    );
    for _ in 0..20 {
        assert_eq!(
            store.renew(&name, &who, token, ttl).await.unwrap(),
            Renewal::Renewed
        );
    }
    let pttl: i64 = admin.pttl(store.lease_key(&name)).await.unwrap();
    assert!(pttl > 4_000 && pttl <= 5_000, "renewed to the ttl: {pttl}");
    let other = leasehold::FencingToken(token.get() + 1);
    assert_eq!(
        store.renew(&name, &who, other, ttl).await.unwrap(),
        Renewal::Lost
    );
    assert_eq!(
        store.release(&name, &who, other).await.unwrap(),
        Release::NotHeld
    );
    assert_eq!(
        store.release(&name, &who, token).await.unwrap(),
        Release::Released
    );
    assert!(
        calls(&mut admin, "set").await >= sets + 21,
        "each renewal was a SET"
    );
    assert!(
        calls(&mut admin, "delifeq").await >= deletes + 2,
        "each release was a DELIFEQ"
    );
    let exists: bool = admin.exists(store.lease_key(&name)).await.unwrap();
    assert!(!exists, "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_delifeq_releases_with_the_script() {
    let Some(url) = common::valkey_url() else {
        return;
    };
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let user = format!("nodel{:08x}", fastrand::u32(..));
    let () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", &user, "on", ">pw", "~*", "&*", "+@all", "-delifeq",
            ][..],
        )
        .query_async(&mut admin)
        .await
        .unwrap();
    let limited = url.replacen("redis://", &format!("redis://{user}:pw@"), 1);
    let store = RedisConfig::new(limited)
        .prefix(common::test_prefix())
        .connect()
        .await
        .unwrap();
    let (name, who) = names();
    let ttl = Duration::from_secs(5);
    for _ in 0..2 {
        let Acquisition::Acquired { token } = store.acquire(&name, &who, ttl).await.unwrap() else {
            panic!("free name busy")
        };
        assert_eq!(
            store.renew(&name, &who, token, ttl).await.unwrap(),
            Renewal::Renewed
        );
        assert_eq!(
            store.release(&name, &who, token).await.unwrap(),
            Release::Released,
            "released by the script after DELIFEQ was refused"
        );
    }
    let () = redis::cmd("ACL")
        .arg(&["DELUSER", &user][..])
        .query_async(&mut admin)
        .await
        .unwrap();
}
