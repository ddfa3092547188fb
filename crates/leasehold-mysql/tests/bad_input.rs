//! Bad input, each a typed error in one line that shows no password, with nothing written: a
//! wrong password, a missing database, tables of another shape (the catalog's too) or a newer
//! schema at the configured names, a read-only user, an unreachable server. Refusals are `Rejected` (never
//! retried as transient); an unreachable server is transient.

mod common;

use std::time::{Duration, Instant};

use leasehold::StoreError;
use leasehold_mysql::mysql_async::prelude::Queryable;
use leasehold_mysql::{Error, MySqlConfig, MySqlSetupError};
use leasehold_testkit::errors;

const SECRET: &str = "s3kr1t-pw";

/// One line, no password anywhere in it or its sources; returns the line as the `leasehold`
/// command prints it.
fn one_clear_line(e: &Error) -> String {
    let line = errors::one_line(e);
    assert!(!line.contains('\n') && !line.is_empty(), "{line:?}");
    let all = errors::everything_about(e);
    assert!(!all.contains(SECRET), "{all}");
    line
}

/// Why connecting with `config` fails, and the line the `leasehold` command prints for it.
async fn refusal(config: MySqlConfig) -> (Error, String) {
    let err = config.connect().await.expect_err("refused");
    let line = one_clear_line(&err);
    (err, line)
}

/// The refusal inside a connect, migrate or write-check error.
fn source(e: &Error) -> &StoreError {
    match e {
        Error::Connect { source, .. }
        | Error::Migrate { source, .. }
        | Error::MissingDatabase { source, .. }
        | Error::Store(MySqlSetupError::NotWritable { source, .. }) => source,
        other => panic!("no store error in {other:?}"),
    }
}

/// A user of the test's own, with `SECRET` as password, granted `grants` on the test database;
/// dropped by the returned guard.
async fn user_with(grants: &str) -> (String, common::DropUser) {
    let (user, drop) = common::user(SECRET).await;
    let mut conn = common::raw().await;
    conn.query_drop(format!(
        "GRANT {grants} ON `test`.* TO '{user}'@'127.0.0.1'"
    ))
    .await
    .unwrap();
    (user, drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_in_one_line() {
    let (user, _drop) = user_with("SELECT").await;
    let config = MySqlConfig::new(common::url_as(&user, "not-the-password-s3kr1t-pw"));
    let err = config.connect().await.unwrap_err();
    let line = one_clear_line(&err);
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(
        matches!(source(&err), StoreError::Rejected { .. }),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert!(
        line.contains("Access denied") && line.contains("(1045)"),
        "{line}"
    );
    assert!(!line.contains("not-the-password"), "{line}");

    // A store that connects in the background is refused by every operation from the first
    // on (issue 32): a refusal a scheduler gives up on, never an outage it may fail open on.
    let lazy = MySqlConfig::new(common::url_as(&user, "not-the-password-s3kr1t-pw"))
        .connect_lazy()
        .unwrap();
    let (name, who) = (
        leasehold::LeaseName::new("wrong-password").unwrap(),
        leasehold::HolderId::new("h").unwrap(),
    );
    for _ in 0..3 {
        let err = leasehold::Store::acquire(&lazy, &name, &who, std::time::Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Rejected { .. }), "{err:?}");
        assert!(!format!("{err} {err:?}").contains("s3kr1t"), "{err:?}");
        let clock = leasehold::Store::now_millis(&lazy).await.unwrap_err();
        assert!(!clock.is_transient(), "{clock:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_is_refused_in_one_line() {
    let url = common::url();
    let at = url.rfind('/').unwrap();
    let missing = format!(
        "{}/lh_no_such_database_{:08x}",
        &url[..at],
        fastrand::u32(..)
    );
    let err = MySqlConfig::new(missing).connect().await.unwrap_err();
    let line = one_clear_line(&err);
    assert!(
        matches!(source(&err), StoreError::Rejected { .. }),
        "{err:?}"
    );
    assert!(
        line.contains("Unknown database") && line.contains("(1049)"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_of_another_shape_are_refused_and_nothing_is_written() {
    let cases = [
        (
            "CREATE TABLE `{p}leases` (name VARCHAR(64) PRIMARY KEY, x INT) ENGINE=InnoDB",
            "column name is varchar, not varbinary",
        ),
        (
            "CREATE TABLE `{p}leases` (name VARBINARY(128) NOT NULL, holder VARBINARY(255), \
             token BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL, released_at DATETIME(6)) \
             ENGINE=InnoDB",
            "primary key (), not (name)",
        ),
        (
            "CREATE TABLE `{p}leases` (name VARBINARY(128) NOT NULL PRIMARY KEY, holder \
             VARBINARY(255), token BIGINT NOT NULL, expires_at TIMESTAMP(6) NOT NULL, \
             released_at DATETIME(6)) ENGINE=InnoDB",
            "column expires_at is timestamp, not datetime",
        ),
        (
            "CREATE TABLE `{p}slots` (task VARBINARY(128) NOT NULL PRIMARY KEY, last_slot \
             BIGINT NOT NULL) ENGINE=MyISAM",
            "engine MyISAM, not InnoDB",
        ),
        // The catalog's tables (schema version 2) are checked the same way.
        (
            "CREATE TABLE `{p}tasks` (task VARCHAR(128) NOT NULL PRIMARY KEY, definition TEXT) \
             ENGINE=InnoDB",
            "not a leasehold catalog task table (column task is varchar, not varbinary)",
        ),
        (
            "CREATE TABLE `{p}tasks` (task VARBINARY(128) NOT NULL PRIMARY KEY, definition \
             MEDIUMTEXT, seen_until DATETIME(6), control_version INT, control MEDIUMTEXT) \
             ENGINE=InnoDB",
            "column control_version is int, not bigint",
        ),
        (
            "CREATE TABLE `{p}task_instances` (task VARBINARY(128) NOT NULL, instance \
             VARBINARY(255) NOT NULL, about MEDIUMTEXT NOT NULL, expires_at DATETIME(6) NOT NULL, \
             PRIMARY KEY (instance, task)) ENGINE=InnoDB",
            "not a leasehold catalog instance table (primary key (instance, task), not (task, instance))",
        ),
    ];
    for (create, said) in cases {
        let prefix = common::fresh_prefix();
        let mut conn = common::raw().await;
        conn.query_drop(create.replace("{p}", &prefix))
            .await
            .unwrap();
        let before = common::tables(&prefix).await;
        let (err, line) = refusal(common::config_on(&common::url(), &prefix)).await;
        common::drop_prefix(&prefix).await;
        assert!(
            matches!(err, Error::Store(MySqlSetupError::Schema { .. })),
            "{err:?}"
        );
        assert!(line.contains(said), "{said}: {line}");
        assert!(line.contains(&format!("table `{prefix}")), "{line}");
        assert_eq!(before.len(), 1);
        // Nothing created beside the foreign table (it was read before any write).
        assert_eq!(common::tables(&prefix).await, Vec::<String>::new());
        assert!(!err.is_transient());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_left_alone() {
    let prefix = common::fresh_prefix();
    let store = common::config_on(&common::url(), &prefix)
        .connect()
        .await
        .unwrap();
    drop(store);
    let mut conn = common::raw().await;
    conn.query_drop(format!("UPDATE `{prefix}schema` SET version = 99"))
        .await
        .unwrap();
    let (err, line) = refusal(common::config_on(&common::url(), &prefix)).await;
    let version: Option<i64> = conn
        .query_first(format!("SELECT version FROM `{prefix}schema`"))
        .await
        .unwrap();
    common::drop_prefix(&prefix).await;
    assert!(
        matches!(err, Error::Store(MySqlSetupError::Schema { .. })),
        "{err:?}"
    );
    assert!(
        line.contains("schema version 99") && line.contains("upgrade"),
        "{line}"
    );
    assert_eq!(version, Some(99), "left as it was");

    // Missing tables with the migration off: named, nothing created.
    let prefix = common::fresh_prefix();
    let (_, line) = refusal(common::config_on(&common::url(), &prefix).migrate(false)).await;
    assert!(
        line.contains("migrate is off") && line.contains(&format!("{prefix}leases")),
        "{line}"
    );
    assert!(common::tables(&prefix).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_user_is_refused_at_connect_and_writes_nothing() {
    // The tables exist (made by the administrator): the check finds the user cannot write.
    let prefix = common::fresh_prefix();
    let admin = common::config_on(&common::url(), &prefix)
        .connect()
        .await
        .unwrap();
    drop(admin);
    let (user, _drop) = user_with("SELECT").await;
    let (err, line) = refusal(common::config_on(&common::url_as(&user, SECRET), &prefix)).await;
    assert!(
        matches!(err, Error::Store(MySqlSetupError::NotWritable { .. })),
        "{err:?}"
    );
    assert!(
        matches!(source(&err), StoreError::Rejected { .. }),
        "{err:?}"
    );
    assert!(
        line.contains("command denied") && line.contains("(1142)"),
        "{line}"
    );
    let mut conn = common::raw().await;
    let rows: Option<i64> = conn
        .query_first(format!("SELECT COUNT(*) FROM `{prefix}leases`"))
        .await
        .unwrap();
    assert_eq!(rows, Some(0));

    // Without the tables it may not create them: a refused migration, nothing created.
    let missing = common::fresh_prefix();
    let (err, line) = refusal(common::config_on(&common::url_as(&user, SECRET), &missing)).await;
    assert!(matches!(err, Error::Migrate { .. }), "{err:?}");
    assert!(
        matches!(source(&err), StoreError::Rejected { .. }),
        "{err:?}"
    );
    assert!(line.contains("CREATE command denied"), "{line}");
    assert!(common::tables(&missing).await.is_empty());

    // A lazy store on it refuses every operation instead of retrying forever.
    let lazy = MySqlConfig::new(common::url_as(&user, SECRET))
        .table_prefix(&prefix)
        .connect_lazy()
        .unwrap();
    let name = leasehold::LeaseName::new("ro/lazy").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let refusal = loop {
        match leasehold::Store::inspect(&lazy, &name).await {
            Err(e @ StoreError::Rejected { .. }) => break e,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("{other:?}"),
        }
    };
    assert!(refusal.to_string().contains("command denied"), "{refusal}");
    common::drop_prefix(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_transient_and_quick() {
    let started = Instant::now();
    let err = MySqlConfig::new(format!("mysql://u:{SECRET}@127.0.0.1:1/db"))
        .connect()
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(6));
    let line = one_clear_line(&err);
    assert!(err.is_transient(), "{err:?}");
    assert!(
        line.starts_with("could not connect to mysql://u@127.0.0.1:1/db"),
        "{line}"
    );
}
