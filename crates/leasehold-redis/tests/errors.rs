//! Clear errors, and no password in any of them.

mod common;

use leasehold::{Catalog, Membership, Slots};
use std::time::Duration;

use leasehold::{
    FencingToken, HolderId, LeaseName, Release, Store, StoreError, store::Acquisition,
};
use leasehold_redis::{Error, RedisConfig, RedisSetupError};
use leasehold_testkit::errors::everything_about;
use leasehold_testkit::redis::OwnRedis;

const SECRET: &str = "s3cret-Pa55word";

fn name(tag: &str) -> LeaseName {
    LeaseName::new(format!("{tag}/{:08x}", fastrand::u32(..))).unwrap()
}

fn holder() -> HolderId {
    HolderId::new(format!("h-{:08x}", fastrand::u32(..))).unwrap()
}

/// Runs a raw command on `conn` (setting keys up for a test, removing them afterwards).
async fn raw(conn: &mut impl redis::aio::ConnectionLike, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let _: () = cmd.query_async(conn).await.unwrap();
}

fn assert_no_secret(text: &str) {
    assert!(!text.contains(SECRET), "password leaked: {text}");
}

#[tokio::test]
async fn password_never_appears_when_the_server_is_unreachable() {
    let port = leasehold_testkit::free_port();
    for url in [
        format!("redis://app:{SECRET}@127.0.0.1:{port}"),
        format!("redis://:{SECRET}@127.0.0.1:{port}/0"),
        format!("rediss://app:{SECRET}@127.0.0.1:{port}"),
    ] {
        let config = RedisConfig::new(&url).connect_timeout(Duration::from_millis(500));
        assert_no_secret(&format!("{config:?}"));
        let err = config.connect().await.expect_err("nothing listens there");
        let text = everything_about(&err);
        println!("{text}");
        assert_no_secret(&text);
        assert!(
            text.contains("@127.0.0.1:") || text.contains("//127.0.0.1:"),
            "the parsed server is shown: {text}"
        );
        match err {
            Error::Connect {
                source: StoreError::Unavailable { .. } | StoreError::Timeout(_),
                ..
            } => {}
            other => panic!("expected an unavailable store, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn password_never_appears_with_a_wrong_or_right_password() {
    let server = OwnRedis::start(&[]);
    server.cli(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        &format!(">{SECRET}"),
        "~*",
        "&*",
        "+@all",
    ]);
    // Wrong password: the server refuses.
    let wrong = format!("redis://app:{SECRET}x@127.0.0.1:{}", server.port);
    let err = leasehold_redis::connect(&wrong)
        .await
        .expect_err("wrong password");
    let text = everything_about(&err);
    println!("{text}");
    assert!(
        !text.contains(&format!("{SECRET}x")),
        "password leaked: {text}"
    );
    assert!(
        matches!(
            err,
            Error::Connect {
                source: StoreError::Rejected { .. },
                ..
            }
        ),
        "{err:?}"
    );
    // Right password: describe() and Debug hide it.
    let right = format!("redis://app:{SECRET}@127.0.0.1:{}", server.port);
    let store = leasehold_redis::connect(&right).await.unwrap();
    let shown = format!("{}\n{store:?}", store.describe());
    println!("{shown}");
    assert_no_secret(&shown);
    assert!(
        store.describe().contains("redis://app@127.0.0.1:"),
        "{shown}"
    );
    store.now_millis().await.unwrap();
}

#[tokio::test]
async fn a_key_of_another_type_is_rejected_naming_the_key() {
    let store = common::make_store().await;
    let lease = name("wrongtype");
    let key = store.lease_key(&lease);
    let mut conn = store.connection();
    raw(&mut conn, &["HSET", &key, "field", "value"]).await;
    let who = holder();
    let errors = [
        store
            .acquire(&lease, &who, Duration::from_secs(5))
            .await
            .map(drop),
        store
            .renew(&lease, &who, FencingToken(1), Duration::from_secs(5))
            .await
            .map(drop),
        store.release(&lease, &who, FencingToken(1)).await.map(drop),
        store.inspect(&lease).await.map(drop),
    ];
    for result in errors {
        let err = result.expect_err("wrong type refused");
        println!("{err}");
        match &err {
            StoreError::Rejected { message, .. } => {
                assert!(message.contains(&key), "names the key: {message}");
                assert!(message.contains("hash"), "{message}");
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
    }
    // The fencing counter and the slot key are checked too.
    let other = name("wrongtype-fence");
    raw(&mut conn, &["LPUSH", &store.fence_key(&other), "x"]).await;
    let err = store
        .acquire(&other, &who, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&store.fence_key(&other)), "{err}");
    let task = name("wrongtype-slot");
    raw(&mut conn, &["SADD", &store.slot_key(&task), "x"]).await;
    let err = store.claim_slot(&task, 1).await.unwrap_err();
    assert!(err.to_string().contains(&store.slot_key(&task)), "{err}");
    let err = store.last_slot(&task).await.unwrap_err();
    assert!(err.to_string().contains(&store.slot_key(&task)), "{err}");
    // So is the run history (a sorted set): a string there is refused by both operations.
    raw(&mut conn, &["SET", &store.history_key(&task), "x"]).await;
    for result in [
        store.record_history(&task, 1, "x", 5).await.map(drop),
        store.history(&task, 5).await.map(drop),
    ] {
        match result.expect_err("wrong type refused") {
            StoreError::Rejected { message, .. } => {
                assert!(message.contains(&store.history_key(&task)), "{message}");
                assert!(message.contains("string"), "{message}");
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
    }
    for k in [
        key,
        store.fence_key(&other),
        store.slot_key(&task),
        store.history_key(&task),
    ] {
        raw(&mut conn, &["DEL", &k]).await;
    }
}

#[tokio::test]
async fn a_corrupt_value_is_reported_as_corrupt() {
    let store = common::make_store().await;
    let lease = name("corrupt");
    let mut conn = store.connection();
    raw(
        &mut conn,
        &["SET", &store.lease_key(&lease), "garbage", "PX", "10000"],
    )
    .await;
    let err = store
        .acquire(&lease, &holder(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    raw(&mut conn, &["DEL", &store.lease_key(&lease)]).await;
}

#[tokio::test]
async fn scripts_denied_by_acl_are_rejected_clearly() {
    let server = OwnRedis::start(&[]);
    // No scripting at all, and a user that may EVALSHA but not EVAL (so NOSCRIPT cannot be
    // recovered from on a server that has not seen the scripts).
    server.cli(&[
        "ACL",
        "SETUSER",
        "noscript",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-@scripting",
    ]);
    server.cli(&[
        "ACL", "SETUSER", "shaonly", "on", ">pw", "~*", "&*", "+@all", "-eval",
    ]);
    for user in ["noscript", "shaonly"] {
        let url = format!("redis://{user}:pw@127.0.0.1:{}", server.port);
        let store = leasehold_redis::connect(&url).await.unwrap();
        let err = store
            .acquire(&name("acl"), &holder(), Duration::from_secs(5))
            .await
            .expect_err("scripts denied");
        println!("{user}: {err}");
        match &err {
            StoreError::Rejected { message, .. } => {
                assert!(message.contains("scripting"), "{message}");
                assert!(!message.contains("pw@"), "{message}");
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
        assert!(!err.is_transient());
    }
}

#[tokio::test]
async fn a_stalled_server_times_out() {
    let server = OwnRedis::start(&["--enable-debug-command", "yes"]);
    let store = RedisConfig::new(server.url())
        .op_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let port = server.port.to_string();
    let sleeper = std::thread::spawn(move || {
        std::process::Command::new("redis-cli")
            .args(["-p", &port, "DEBUG", "SLEEP", "1.5"])
            .output()
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = store
        .acquire(&name("stalled"), &holder(), Duration::from_secs(5))
        .await
        .expect_err("no answer in time");
    assert!(
        matches!(err, StoreError::Timeout(d) if d == Duration::from_millis(300)),
        "{err:?}"
    );
    sleeper.join().unwrap();
    // The connection is still good afterwards.
    store.now_millis().await.unwrap();
}

#[tokio::test]
async fn bad_urls_and_settings_are_refused() {
    let err = leasehold_redis::connect("http://127.0.0.1:6379")
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Store(RedisSetupError::InvalidUrl { .. })),
        "{err:?}"
    );
    let err = leasehold_redis::connect(&format!("redis://u:{SECRET}@[::1"))
        .await
        .unwrap_err();
    assert_no_secret(&everything_about(&err));
    let err = RedisConfig::new(common::redis_url())
        .prefix("a{b}")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Store(RedisSetupError::Config(_))),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_least_privilege_acl_user_works() {
    let server = OwnRedis::start(&[]);
    // The ACL line of the README, word for word.
    let readme = include_str!("../README.md");
    let line = readme
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ACL SETUSER leasehold "))
        .expect("the README has the ACL line");
    let words: Vec<&str> = line.split_whitespace().collect();
    let ok = server.cli(&words);
    assert_eq!(ok.trim(), "OK", "{line}");
    let url = format!("redis://leasehold:PASSWORD@127.0.0.1:{}", server.port);
    let store = leasehold_redis::connect(&url).await.unwrap();
    let mut sub = store.subscribe_releases().unwrap();
    tokio::time::timeout(Duration::from_secs(5), sub.live())
        .await
        .expect("release listener live");
    let (lease, who) = (name("acl-ok"), holder());
    let leasehold::store::Acquisition::Acquired { token } = store
        .acquire(&lease, &who, Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("free lease not acquired");
    };
    store
        .renew(&lease, &who, token, Duration::from_secs(5))
        .await
        .unwrap();
    store.inspect(&lease).await.unwrap().unwrap();
    store.claim_slot(&lease, 1).await.unwrap();
    assert_eq!(store.last_slot(&lease).await.unwrap(), Some(1));
    store.record_history(&lease, 1, "run", 3).await.unwrap();
    assert_eq!(store.history(&lease, 3).await.unwrap(), ["run"]);
    store.now_millis().await.unwrap();
    store
        .members(&lease, &who, Duration::from_secs(5))
        .await
        .unwrap();
    store.leave(&lease, &who).await.unwrap();
    let registration = leasehold::catalog::Registration {
        task: &lease,
        definition: "{}",
        instance: &who,
        about: "{}",
        ttl: Duration::from_secs(5),
        forget_after: Duration::from_secs(5),
    };
    store.register(&registration).await.unwrap();
    assert_eq!(
        store.set_control(&lease, None, "{}").await.unwrap(),
        Some(1)
    );
    assert!(store.control(&lease).await.unwrap().control.is_some());
    assert_eq!(store.tasks(Duration::from_secs(5)).await.unwrap().len(), 1);
    store.unregister(&lease, &who).await.unwrap();
    assert_eq!(store.leases(10).await.unwrap().len(), 1);
    store.release(&lease, &who, token).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), sub.released(&lease))
        .await
        .expect("notification with the least-privilege user");
}

/// A slot or history member this crate did not write is `Corrupt`, not a panic or a guess.
#[tokio::test]
async fn foreign_slots_and_history_members_are_corrupt() {
    let store = common::make_store().await;
    let task = name("corrupt-history");
    let mut conn = store.connection();
    raw(&mut conn, &["SET", &store.slot_key(&task), "soon"]).await;
    let err = store.last_slot(&task).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    raw(
        &mut conn,
        &["ZADD", &store.history_key(&task), "0", "not-a-key"],
    )
    .await;
    let err = store.history(&task, 5).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    for k in [store.slot_key(&task), store.history_key(&task)] {
        raw(&mut conn, &["DEL", &k]).await;
    }
}

/// History keys at the ends of the u64 range keep their order, `keep` 0 keeps one entry, and
/// any `limit` (0, `usize::MAX`) is answered.
#[tokio::test]
async fn history_covers_the_whole_key_range_and_extreme_bounds() {
    let store = common::make_store().await;
    let task = name("history-range");
    for key in [u64::MAX, 0, u64::MAX - 1, 1 << 53, (1 << 53) + 1] {
        store
            .record_history(&task, key, &format!("k{key}"), 10)
            .await
            .unwrap();
    }
    let expected: Vec<String> = [u64::MAX, u64::MAX - 1, (1 << 53) + 1, 1 << 53, 0]
        .iter()
        .map(|k| format!("k{k}"))
        .collect();
    assert_eq!(store.history(&task, usize::MAX).await.unwrap(), expected);
    assert!(store.history(&task, 0).await.unwrap().is_empty());
    // An entry may itself look like a member (digits and a colon): only the prefix is the key.
    let tricky = "00000000000000000001:x";
    store.record_history(&task, 0, tricky, 10).await.unwrap();
    assert_eq!(store.history(&task, 10).await.unwrap()[4], tricky);
    // `keep` 0 counts as 1: the highest key stays.
    store.record_history(&task, 5, "last", 0).await.unwrap();
    assert_eq!(
        store.history(&task, 10).await.unwrap(),
        vec![format!("k{}", u64::MAX)]
    );
}

/// Tokens are exact across the whole u64 range: below 2^53 the script formats INCR's reply (a
/// Lua double), at and above it reads the counter back as a string.
#[tokio::test]
async fn tokens_stay_exact_around_and_beyond_2_pow_53() {
    let store = common::make_store().await;
    let mut conn = redis::Client::open(common::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let who = HolderId::new("exact").unwrap();
    for start in [
        (1u64 << 53) - 3,
        (1u64 << 53) - 1,
        (1u64 << 53) + 1,
        u64::MAX / 2 - 7,
    ] {
        let lease = name(&format!("exact-{start}"));
        raw(
            &mut conn,
            &["SET", &store.fence_key(&lease), &start.to_string()],
        )
        .await;
        for step in 1..=3u64 {
            match store.acquire(&lease, &who, Duration::from_secs(5)).await {
                Ok(Acquisition::Acquired { token }) => assert_eq!(token.get(), start + step),
                other => panic!("{other:?}"),
            }
            let released = store
                .release(&lease, &who, FencingToken(start + step))
                .await
                .unwrap();
            assert_eq!(released, Release::Released);
        }
        raw(&mut conn, &["DEL", &store.fence_key(&lease)]).await;
    }
}
