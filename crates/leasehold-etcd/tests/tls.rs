//! `etcds://` against a member of the test's own that serves clients over TLS only
//! (`--cert-file`/`--key-file`), with a CA and a server certificate for 127.0.0.1 made by the
//! `openssl` tool (`scripts/stores.sh` installs it): the conformance suite over TLS with the CA
//! given as `?ca=`, and clear, typed refusals for a certificate from another CA, for the system's
//! roots (which do not know the test CA) and for plain `etcd://` to a TLS port.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use leasehold::{HolderId, LeaseName, Store, StoreError, store::Acquisition};
use leasehold_etcd::Error;
use leasehold_etcd::testing::{EtcdCluster, TlsFiles};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the openssl tool (scripts/stores.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA named `name` in `dir`: `name.crt`, `name.key`.
fn make_ca(dir: &Path, name: &str) {
    let (crt, key, subject) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("/CN=leasehold etcd test {name}"),
    );
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", &key, "-out",
            &crt, "-subj", &subject,
        ],
    );
}

/// The CA `ca`, a server certificate it signed for IP 127.0.0.1, and a second, unrelated CA
/// `other-ca`.
fn make_certs(dir: &Path) -> TlsFiles {
    make_ca(dir, "ca");
    make_ca(dir, "other-ca");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "member.key",
            "-out",
            "member.csr",
            "-subj",
            "/CN=etcd member",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "member.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            "member.crt",
        ],
    );
    TlsFiles {
        cert: dir.join("member.crt"),
        key: dir.join("member.key"),
        ca: dir.join("ca.crt"),
    }
}

/// Runs every check of the conformance suite on stores of `url` (a key prefix each), all at
/// once, and panics naming the ones that failed.
async fn conformance(url: &str) {
    use leasehold::conformance as c;
    let mut tasks = tokio::task::JoinSet::new();
    macro_rules! spawn_checks {
        ($($check:ident),* $(,)?) => {$(
            let store = leasehold_etcd::connect(&format!(
                "{url}&prefix=lh-tls-{}/", stringify!($check)
            ))
            .await
            .expect("a store over TLS");
            tasks.spawn(async move {
                (stringify!($check), tokio::spawn(c::$check(store)).await.is_ok())
            });
        )*};
    }
    // The checks of `leasehold::conformance_tests!`.
    spawn_checks!(
        acquire_then_busy,
        reacquire_by_holder_starts_a_new_tenure,
        new_names_start_tokens_from_the_clock,
        drop_then_reacquire_keeps_the_new_tenure,
        renew_only_by_holder_with_token,
        renew_many_answers_each_lease_in_order,
        purge_removes_only_long_free_records,
        release_only_by_holder_with_token,
        expiry_hands_over,
        renew_after_expiry_is_lost,
        tokens_strictly_increase,
        tokens_are_per_name,
        inspect_reports_state,
        slot_claims_move_forward,
        concurrent_racers_one_winner,
        clock_is_sane,
        names_round_trip,
        release_notifies_waiters,
        guard_renews_and_hands_over,
        last_slot_reads_the_highest_claim,
        history_is_bounded_keyed_and_exact,
        members_expire_refresh_and_leave,
    );
    let mut failed = Vec::new();
    let mut ran = 0;
    while let Some(done) = tasks.join_next().await {
        let (check, ok) = done.unwrap();
        ran += 1;
        if !ok {
            failed.push(check);
        }
    }
    assert_eq!(ran, 22);
    assert!(failed.is_empty(), "failed over TLS: {failed:?}");
}

/// Connecting with `url` fails at once (not after the op timeout) with a connect error whose
/// message contains `says`; returns that message.
async fn refused(url: &str, says: &str) -> String {
    let started = Instant::now();
    let err = leasehold_etcd::connect(url)
        .await
        .expect_err("no connection expected");
    let shown = format!("{err}");
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
    shown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_serves_the_suite_and_refuses_an_unknown_ca() {
    let certs = tempfile::tempdir().unwrap();
    let tls = make_certs(certs.path());
    let other_ca = certs.path().join("other-ca.crt");
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
    let Acquisition::Acquired { token } = store
        .acquire(&name, &holder, Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("a free lease");
    };
    assert_eq!(
        store
            .renew(&name, &holder, token, Duration::from_secs(5))
            .await
            .unwrap(),
        leasehold::store::Renewal::Renewed
    );
    store.release(&name, &holder, token).await.unwrap();
    conformance(&url).await;

    let wrong = refused(
        &format!("etcds://{endpoint}?ca={}", other_ca.display()),
        "certificate",
    )
    .await;
    println!("another CA: {wrong}");
    let system = refused(&format!("etcds://{endpoint}"), "certificate").await;
    println!("the system's roots: {system}");
    let plain = refused(&format!("etcd://{endpoint}"), &endpoint).await;
    println!("plain etcd:// to the TLS port: {plain}");
}
