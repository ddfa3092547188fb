//! TLS against a MariaDB of the test's own with certificates of its own: each `ssl-mode` checks
//! what MySQL's client checks, and a refusal is one line.

use std::time::Duration;

use leasehold::{HolderId, LeaseName, Store, store::Acquisition};
use leasehold_mysql::mysql_async::Row;
use leasehold_mysql::mysql_async::prelude::Queryable;
use leasehold_mysql::{Error, MySqlConfig, MySqlStore};
use leasehold_testkit::errors::one_line;
use leasehold_testkit::mariadb::OwnMariaDb;
use leasehold_testkit::tls::TestCerts;

async fn connect(url: &str) -> Result<MySqlStore, Error> {
    MySqlConfig::new(url)
        .notifications(false)
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
}

/// The cipher of a pooled connection, as the server sees it: empty without TLS.
async fn cipher(store: &MySqlStore) -> String {
    let mut conn = store.pool().get_conn().await.unwrap();
    let row: Row = conn
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .await
        .unwrap()
        .unwrap();
    row.get::<String, usize>(1).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_ssl_mode_checks_what_it_says() {
    let certs = TestCerts::new();
    let server = OwnMariaDb::start(&[
        format!("--ssl-cert={}", certs.cert().display()),
        format!("--ssl-key={}", certs.key().display()),
        format!("--ssl-ca={}", certs.ca().display()),
    ]);
    let ca = certs.ca().display().to_string();
    let other = certs.other_ca().display().to_string();

    // The CA and the host name (the certificate is for IP 127.0.0.1): encrypted, and it works.
    let url = server.url(
        "127.0.0.1",
        &format!("?ssl-mode=verify-identity&ssl-ca={ca}"),
    );
    let store = connect(&url).await.unwrap();
    assert!(
        !cipher(&store).await.is_empty(),
        "the connection is encrypted"
    );
    let (name, who) = (LeaseName::new("tls").unwrap(), HolderId::new("h").unwrap());
    assert!(matches!(
        store
            .acquire(&name, &who, Duration::from_secs(5))
            .await
            .unwrap(),
        Acquisition::Acquired { .. }
    ));
    assert!(
        store.describe().contains("?ssl-mode=verify-identity"),
        "{}",
        store.describe()
    );

    // A CA that signed nothing here: refused, in one line.
    for mode in ["verify-ca", "verify-identity"] {
        let url = server.url("127.0.0.1", &format!("?ssl-mode={mode}&ssl-ca={other}"));
        let err = connect(&url)
            .await
            .expect_err("an untrusted certificate is refused");
        assert!(matches!(err, Error::Connect { .. }), "{mode}: {err:?}");
        assert!(!err.to_string().contains('\n'), "{err}");
    }

    // Another name than the certificate's: refused by verify-identity, and by verify-ca too
    // (stricter than MySQL's client: the driver cannot leave the name out).
    for mode in ["verify-ca", "verify-identity"] {
        let url = server.url("localhost", &format!("?ssl-mode={mode}&ssl-ca={ca}"));
        let err = connect(&url).await.expect_err("the name is checked");
        assert!(
            one_line(&err).contains("not valid for name"),
            "{mode}: {err:?}"
        );
        assert!(
            !err.is_transient(),
            "a refused certificate is not retried: {err:?}"
        );
    }
    // Given the CA and the certificate's name, verify-ca connects.
    let url = server.url("127.0.0.1", &format!("?ssl-mode=verify-ca&ssl-ca={ca}"));
    let store = connect(&url).await.unwrap();
    assert!(!cipher(&store).await.is_empty());

    // `required` encrypts without checking the certificate (MySQL's REQUIRED).
    let store = connect(&server.url("127.0.0.1", "?ssl-mode=required"))
        .await
        .unwrap();
    assert!(!cipher(&store).await.is_empty());
    // No ssl-mode: plain text.
    let store = connect(&server.url("127.0.0.1", "")).await.unwrap();
    assert!(cipher(&store).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tls_against_a_server_without_it_is_refused() {
    let server = OwnMariaDb::start(&[]);
    let err = connect(&server.url("127.0.0.1", "?ssl-mode=required"))
        .await
        .expect_err("no TLS to be had");
    let line = one_line(&err);
    assert!(!line.contains('\n'), "{line}");
    assert!(line.contains("SSL"), "{line}");
    assert!(!err.is_transient(), "{err:?}");
}
