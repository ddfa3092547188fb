//! The catalog on the real server: its keys lapse with their retention (a control record keeps
//! its task for good), leases are listed by scanning this prefix's keys only, whatever glob
//! characters the prefix holds, and keys of another shape are typed refusals.

mod common;

use std::time::Duration;

use leasehold::catalog::Registration;
use leasehold::{Catalog, HolderId, LeaseName, Store, StoreError, store::Acquisition};
use leasehold_redis::{RedisConfig, RedisStore};

async fn store_with_prefix(prefix: &str) -> RedisStore {
    RedisConfig::new(common::redis_url())
        .prefix(prefix)
        .connect()
        .await
        .unwrap()
}

async fn query<T: redis::FromRedisValue>(store: &RedisStore, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(&mut store.connection()).await.unwrap()
}

fn registration<'a>(
    task: &'a LeaseName,
    instance: &'a HolderId,
    ttl: Duration,
    forget_after: Duration,
) -> Registration<'a> {
    Registration {
        task,
        definition: "{\"schedule\":\"every 1s\"}",
        instance,
        about: "{\"version\":\"test\"}",
        ttl,
        forget_after,
    }
}

/// A task's keys and its index entry last the heartbeat's ttl plus the retention, then are gone
/// without anyone deleting them; a control record keeps the task's record and index entry for
/// good (and the instances still lapse).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_keys_lapse_unless_a_control_record_keeps_them() {
    let store = store_with_prefix(&common::test_prefix()).await;
    let (plain, controlled) = (
        LeaseName::new("plain").unwrap(),
        LeaseName::new("controlled").unwrap(),
    );
    let who = HolderId::new("a").unwrap();
    let (ttl, forget) = (Duration::from_millis(300), Duration::from_millis(400));
    let index = store.catalog_index_key();
    for task in [&plain, &controlled] {
        store
            .register(&registration(task, &who, ttl, forget))
            .await
            .unwrap();
    }
    for key in [store.task_key(&plain), store.instances_key(&plain)] {
        let pttl: i64 = query(&store, &["PTTL", &key]).await;
        assert!(
            pttl > 0 && pttl <= 700,
            "{key} lapses with the retention: {pttl}"
        );
    }
    let now = store.now_millis().await.unwrap();
    let score: f64 = query(&store, &["ZSCORE", &index, plain.as_str()]).await;
    assert!(
        score > now as f64 && score <= (now + 700) as f64,
        "index entry lapses with the task: {score} vs now {now}"
    );

    assert_eq!(
        store.set_control(&controlled, None, "{}").await.unwrap(),
        Some(1)
    );
    let pttl: i64 = query(&store, &["PTTL", &store.task_key(&controlled)]).await;
    assert_eq!(pttl, -1, "a controlled task's record is kept");
    let score: String = query(&store, &["ZSCORE", &index, controlled.as_str()]).await;
    assert_eq!(score, "inf", "and listed for good");
    // A later registration does not put an expiry back.
    store
        .register(&registration(&controlled, &who, ttl, forget))
        .await
        .unwrap();
    let pttl: i64 = query(&store, &["PTTL", &store.task_key(&controlled)]).await;
    assert_eq!(pttl, -1);

    tokio::time::sleep(ttl + forget + Duration::from_millis(200)).await;
    for key in [
        store.task_key(&plain),
        store.instances_key(&plain),
        store.instances_key(&controlled),
    ] {
        let exists: i64 = query(&store, &["EXISTS", &key]).await;
        assert_eq!(exists, 0, "{key} lapsed");
    }
    let tasks = store.tasks(forget).await.unwrap();
    let listed: Vec<&LeaseName> = tasks.iter().map(|t| &t.task).collect();
    assert_eq!(listed, vec![&controlled], "{tasks:?}");
    assert!(tasks[0].instances.is_empty());
    assert!(
        tasks[0].definition.is_some(),
        "the definition is kept with the control"
    );
    let entries: Vec<String> = query(&store, &["ZRANGE", &index, "0", "-1"]).await;
    assert_eq!(
        entries,
        vec![controlled.to_string()],
        "the lapsed entry is dropped"
    );
    let _: () = query(&store, &["DEL", &store.task_key(&controlled), &index]).await;
}

/// `leases` lists the leases of this prefix only: the prefix is matched literally even where it
/// holds glob characters, and a held lease whose fencing counter expired is listed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_lists_this_prefix_only_whatever_glob_characters_it_holds() {
    let base = common::test_prefix();
    // As a glob, the first prefix would also match the second.
    let (mine, other) = (
        store_with_prefix(&format!("{base}-*?[ab]")).await,
        store_with_prefix(&format!("{base}-xya")).await,
    );
    let who = HolderId::new("a").unwrap();
    let (held, theirs) = (
        LeaseName::new("held").unwrap(),
        LeaseName::new("theirs").unwrap(),
    );
    let ttl = Duration::from_secs(30);
    assert!(matches!(
        mine.acquire(&held, &who, ttl).await.unwrap(),
        Acquisition::Acquired { .. }
    ));
    assert!(matches!(
        other.acquire(&theirs, &who, ttl).await.unwrap(),
        Acquisition::Acquired { .. }
    ));
    let _: () = query(&mine, &["DEL", &mine.fence_key(&held)]).await;
    let listed = mine.leases(usize::MAX).await.unwrap();
    let names: Vec<&LeaseName> = listed.iter().map(|l| &l.name).collect();
    assert_eq!(names, vec![&held]);
    assert_eq!(listed[0].state.holder.as_ref(), Some(&who));
    let theirs_listed = other.leases(10).await.unwrap();
    assert_eq!(theirs_listed.len(), 1);
    assert_eq!(theirs_listed[0].name, theirs);
    for (store, name) in [(&mine, &held), (&other, &theirs)] {
        let _: () = query(
            store,
            &["DEL", &store.lease_key(name), &store.fence_key(name)],
        )
        .await;
    }
}

/// More leases than one batch of inspections: all listed in name order, and the limit cuts the
/// list across a batch boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_come_in_name_order_across_batches() {
    let store = store_with_prefix(&common::test_prefix()).await;
    let who = HolderId::new("a").unwrap();
    let names: Vec<LeaseName> = (0..520)
        .map(|i| LeaseName::new(format!("many/{i:04}")).unwrap())
        .collect();
    for name in names.iter().rev() {
        let acquired = store
            .acquire(name, &who, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(matches!(acquired, Acquisition::Acquired { .. }));
    }
    let all = store.leases(usize::MAX).await.unwrap();
    let listed: Vec<&LeaseName> = all.iter().map(|l| &l.name).collect();
    assert_eq!(listed, names.iter().collect::<Vec<_>>());
    let some = store.leases(510).await.unwrap();
    assert_eq!(some.len(), 510);
    assert_eq!(some[509].name, names[509]);
    for name in &names {
        let _: () = query(
            &store,
            &["DEL", &store.lease_key(name), &store.fence_key(name)],
        )
        .await;
    }
}

/// A catalog key of another type is refused naming the key; an instance entry this crate did
/// not write is `Corrupt`.
#[tokio::test]
async fn foreign_catalog_keys_are_refused_or_corrupt() {
    let store = common::make_store().await;
    let (task, who) = (
        LeaseName::new("foreign").unwrap(),
        HolderId::new("a").unwrap(),
    );
    let ttl = Duration::from_secs(5);
    let _: () = query(&store, &["SET", &store.task_key(&task), "x"]).await;
    for err in [
        store.control(&task).await.unwrap_err(),
        store
            .register(&registration(&task, &who, ttl, ttl))
            .await
            .unwrap_err(),
        store.set_control(&task, None, "{}").await.unwrap_err(),
    ] {
        assert!(
            matches!(&err, StoreError::Rejected { message, .. } if message.contains(&store.task_key(&task))),
            "{err:?}"
        );
    }
    let _: () = query(&store, &["DEL", &store.task_key(&task)]).await;
    let _: () = query(
        &store,
        &["HSET", &store.instances_key(&task), "b", "not-an-entry"],
    )
    .await;
    let err = store
        .register(&registration(&task, &who, ttl, ttl))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    let _: () = query(
        &store,
        &[
            "DEL",
            &store.task_key(&task),
            &store.instances_key(&task),
            &store.catalog_index_key(),
        ],
    )
    .await;
}
