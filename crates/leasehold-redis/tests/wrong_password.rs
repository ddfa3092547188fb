//! A wrong or missing password is a refusal, never an outage (issue 32): on one server, a Redis
//! Cluster and behind Sentinel (the primary's password and the sentinels'), `connect` fails
//! with a [`StoreError::Rejected`] source and a lazily connecting store answers every
//! operation with `Rejected`, so a scheduler gives up instead of retrying (or failing open)
//! forever. No message shows the password.

mod common;

use std::time::Duration;

use leasehold::{HolderId, LeaseName, Store, StoreError};
use leasehold_redis::{Error, RedisConfig};
use leasehold_testkit::ha::{Cluster, SentinelGroup};
use leasehold_testkit::redis::OwnRedis;

const SECRET: &str = "r1ght-Secret";
const WRONG: &str = "wr0ng-Secret";

/// `url` with `password` in its authority, as `scheme://:PASSWORD@rest`.
fn with_password(url: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a url");
    format!("{scheme}://:{password}@{rest}")
}

/// The error and all its causes, as one text.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// `url` is refused at connect and on every operation of a lazy store, as `Rejected`.
async fn refused(what: &str, url: &str) {
    let err = RedisConfig::new(url)
        .prefix(common::test_prefix())
        .connect()
        .await
        .expect_err("a wrong password does not connect");
    let shown = format!("{} {err:?}", chain(&err));
    println!("{what}: connect: {}", chain(&err));
    assert!(!shown.contains("Secret"), "{what}: password shown: {shown}");
    match &err {
        Error::Connect { source, .. } => assert!(
            matches!(source, StoreError::Rejected { .. }),
            "{what}: a refusal, not an outage: {source:?}"
        ),
        other => panic!("{what}: {other:?}"),
    }
    assert!(!err.is_transient(), "{what}");

    let store = RedisConfig::new(url)
        .prefix(common::test_prefix())
        .connect_lazy()
        .expect("a valid url");
    let (name, who) = (
        LeaseName::new("wrong-password").unwrap(),
        HolderId::new("h").unwrap(),
    );
    for attempt in 0..3 {
        let err = store
            .acquire(&name, &who, Duration::from_secs(5))
            .await
            .expect_err("a wrong password acquires nothing");
        println!("{what}: lazy acquire {attempt}: {}", chain(&err));
        assert!(
            matches!(err, StoreError::Rejected { .. }),
            "{what}: attempt {attempt}: {err:?}"
        );
        assert!(!chain(&err).contains("Secret"));
        let clock = store.now_millis().await.expect_err("no clock either");
        assert!(!clock.is_transient(), "{what}: {clock:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server() {
    let redis = OwnRedis::start(&["--requirepass", SECRET]);
    refused("wrong password", &with_password(&redis.url(), WRONG)).await;
    refused("no password", &redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start_with(Some(SECRET)))
        .await
        .unwrap();
    let store = RedisConfig::new(with_password(&cluster.url(), SECRET))
        .prefix(common::test_prefix())
        .connect()
        .await
        .expect("the right password connects");
    leasehold_testkit::acquire_free(
        &store,
        &LeaseName::new("right").unwrap(),
        &HolderId::new("h").unwrap(),
    )
    .await;
    refused(
        "cluster, wrong password",
        &with_password(&cluster.url(), WRONG),
    )
    .await;
    refused("cluster, no password", &cluster.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel() {
    let group = tokio::task::spawn_blocking(|| {
        SentinelGroup::start_with_passwords(Some(SECRET), Some(SECRET))
    })
    .await
    .unwrap();
    let sentinels = format!("{}?sentinel_password={SECRET}", group.url());
    let store = RedisConfig::new(with_password(&sentinels, SECRET))
        .prefix(common::test_prefix())
        .connect()
        .await
        .expect("the right passwords connect");
    leasehold_testkit::acquire_free(
        &store,
        &LeaseName::new("right").unwrap(),
        &HolderId::new("h").unwrap(),
    )
    .await;
    refused(
        "sentinel, wrong primary password",
        &with_password(&sentinels, WRONG),
    )
    .await;
    refused("sentinel, no primary password", &sentinels).await;
    refused(
        "sentinel, wrong sentinel password",
        &with_password(
            &format!("{}?sentinel_password={WRONG}", group.url()),
            SECRET,
        ),
    )
    .await;
    refused(
        "sentinel, no sentinel password",
        &with_password(&group.url(), SECRET),
    )
    .await;
}
