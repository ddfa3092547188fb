//! A server that refuses the connection is a refusal, never an outage (issue 32): a wrong or
//! missing password, a role that does not exist or may not log in. `connect` fails with a
//! [`StoreError::Rejected`] source; a lazily connecting store answers every operation with
//! `Rejected` from its first one on (so a scheduler gives up rather than failing open), keeps
//! trying, and works once the server accepts it.
//!
//! The shared test server trusts every loopback connection, so it checks no password: the
//! password cases talk to a stand-in that speaks the start of PostgreSQL's protocol
//! ([`PasswordRefusingPostgres`]: asks for a password, then answers `28P01 invalid_password`).
//! The role cases use the real server (`28000 invalid_authorization_specification`).

mod common;

use std::time::{Duration, Instant};

use leasehold::{HolderId, LeaseName, Store, StoreError};
use leasehold_postgres::{Error, PgConfig};
use leasehold_testkit::postgres::PasswordRefusingPostgres;

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

fn quick(url: &str) -> PgConfig {
    PgConfig::new(url)
        .schema(common::schema())
        .connect_timeout(Duration::from_secs(2))
        .op_timeout(Duration::from_secs(2))
}

/// `url` is refused at connect, and by every operation of a lazy store from the first on.
async fn refused(what: &str, url: &str, expect: &str) {
    let err = quick(url).connect().await.expect_err("refused");
    let text = chain(&err);
    println!("{what}: connect: {text}");
    assert!(
        matches!(
            &err,
            Error::Connect {
                source: StoreError::Rejected { .. },
                ..
            }
        ),
        "{what}: a refusal, not an outage: {err:?}"
    );
    assert!(!err.is_transient(), "{what}");
    assert!(text.contains(expect), "{what}: {text}");
    assert!(!text.contains("Secret"), "{what}: {text}");

    let store = quick(url).connect_lazy().unwrap();
    let (name, who) = (
        LeaseName::new("refused").unwrap(),
        HolderId::new("h").unwrap(),
    );
    for attempt in 0..3 {
        let err = store
            .acquire(&name, &who, Duration::from_secs(5))
            .await
            .expect_err("refused");
        println!("{what}: lazy acquire {attempt}: {}", chain(&err));
        assert!(
            matches!(err, StoreError::Rejected { .. }),
            "{what}: attempt {attempt}: {err:?}"
        );
        assert!(!chain(&err).contains("Secret"));
        assert!(!store.now_millis().await.unwrap_err().is_transient());
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

#[tokio::test]
async fn a_wrong_or_missing_password_is_refused() {
    let server = PasswordRefusingPostgres::start();
    refused(
        "wrong password",
        &server.url("app", Some("wr0ng-Secret")),
        "28P01",
    )
    .await;
    refused("no password", &server.url("app", None), "password missing").await;
}

/// A role that does not exist, and one that may not log in, on the real server; the lazy
/// store starts working once the role may log in, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_nologin_roles_are_refused_until_fixed() {
    let admin = common::raw().await;
    let role = format!("lh_nologin_{:08x}", fastrand::u32(..));
    let server = common::url();
    let host = server.split_once('@').expect("a url with a user").1;
    refused(
        "unknown role",
        &format!(
            "postgres://lh_no_such_role_{:08x}@{host}",
            fastrand::u32(..)
        ),
        "28000",
    )
    .await;

    admin
        .batch_execute(&format!("CREATE ROLE {role} NOLOGIN SUPERUSER"))
        .await
        .unwrap();
    let url = format!("postgres://{role}@{host}");
    refused("role without LOGIN", &url, "28000").await;

    let mut config = quick(&url);
    config.max_reconnect_delay = Duration::from_millis(300);
    let store = config.connect_lazy().unwrap();
    let (name, who) = (
        LeaseName::new(format!("fixed-{:08x}", fastrand::u32(..))).unwrap(),
        HolderId::new("h").unwrap(),
    );
    let err = store
        .acquire(&name, &who, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Rejected { .. }), "{err:?}");
    admin
        .batch_execute(&format!("ALTER ROLE {role} LOGIN"))
        .await
        .unwrap();
    let fixed = Instant::now();
    loop {
        match store.acquire(&name, &who, Duration::from_secs(5)).await {
            Ok(_) => break,
            Err(e) => assert!(
                fixed.elapsed() < Duration::from_secs(10),
                "still refused after the fix: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("role fixed: works after {:?}", fixed.elapsed());
    drop(store);
    // Its connections close with the store's pool; until then the role cannot be dropped. What
    // it created (this test's schema) goes with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
    {
        assert!(Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
