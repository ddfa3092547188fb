//! `etcds://` against a member of the test's own that serves clients over TLS only
//! (`--cert-file`/`--key-file`), with a CA and a server certificate for 127.0.0.1 made by the
//! `openssl` tool (`leasehold_testkit::tls`): the conformance suite over TLS with the CA
//! given as `?ca=`, and clear, typed refusals for a certificate from another CA, for the system's
//! roots (which do not know the test CA) and for plain `etcd://` to a TLS port.

use std::time::{Duration, Instant};

use leasehold::{HolderId, LeaseName, Store, StoreError};
use leasehold_etcd::Error;
use leasehold_etcd::testing::{EtcdCluster, TlsFiles};
use leasehold_testkit::tls::TestCerts;

/// Connecting with `url` fails at once (not after the op timeout) with a connect error whose
/// message contains `says`; returns that message and the error.
async fn refused(url: &str, says: &str) -> (String, Error) {
    let started = Instant::now();
    let err = leasehold_etcd::connect(url)
        .await
        .expect_err("no connection expected");
    // As the command prints it: the error, then its causes.
    let mut shown = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        shown.push_str(&format!(": {c}"));
        cause = c.source();
    }
    assert!(
        matches!(&err, Error::Connect { source, .. } if !matches!(source, StoreError::Timeout(_))),
        "a connect error naming the cause, not a timeout: {err:?}"
    );
    assert!(shown.contains(says), "{shown}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    (shown, err)
}

/// A certificate that does not verify is a configuration to fix: refused (not retried as an
/// outage), on connect and on every operation of a store opened without a first round trip.
async fn certificate_refused(url: &str) -> String {
    let (shown, err) = refused(url, "certificate").await;
    assert!(!err.is_transient(), "{shown}");
    assert!(
        matches!(
            &err,
            Error::Connect {
                source: StoreError::Rejected { .. },
                ..
            }
        ),
        "{err:?}"
    );
    let lazy = leasehold_etcd::connect_lazy(url).expect("a store without a first round trip");
    let op = lazy.inspect(&LeaseName::new("tls").unwrap()).await;
    assert!(
        matches!(&op, Err(StoreError::Rejected { .. })),
        "an operation over an unverified certificate: {op:?}"
    );
    shown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_serves_the_suite_and_refuses_an_unknown_ca() {
    let certs = TestCerts::new();
    let tls = TlsFiles {
        cert: certs.cert(),
        key: certs.key(),
        ca: certs.ca(),
    };
    let other_ca = certs.other_ca();
    let cluster = tokio::task::spawn_blocking(move || EtcdCluster::start_tls(1, tls))
        .await
        .unwrap();
    let url = cluster.url();
    assert!(url.starts_with("etcds://127.0.0.1:"), "{url}");
    let endpoint = cluster.endpoints().remove(0);

    let store = leasehold_etcd::connect(&url)
        .await
        .expect("etcds:// connects");
    assert!(
        store.describe().starts_with("etcds://"),
        "{}",
        store.describe()
    );
    let (name, holder) = (LeaseName::new("tls").unwrap(), HolderId::new("h").unwrap());
    let token = leasehold_testkit::acquire_free(&store, &name, &holder).await;
    assert_eq!(
        store
            .renew(&name, &holder, token, Duration::from_secs(5))
            .await
            .unwrap(),
        leasehold::store::Renewal::Renewed
    );
    store.release(&name, &holder, token).await.unwrap();
    // The whole suite over TLS, a key prefix per check.
    leasehold_testkit::conformance::run_all(|check| {
        let url = format!("{url}&prefix=lh-tls-{check}/");
        async move {
            leasehold_etcd::connect(&url)
                .await
                .expect("a store over TLS")
        }
    })
    .await;

    let wrong = certificate_refused(&format!("etcds://{endpoint}?ca={}", other_ca.display())).await;
    println!("another CA: {wrong}");
    let system = certificate_refused(&format!("etcds://{endpoint}")).await;
    println!("the system's roots: {system}");
    let (plain, _) = refused(&format!("etcd://{endpoint}"), &endpoint).await;
    println!("plain etcd:// to the TLS port: {plain}");
}
