//! `rediss://` against a TLS redis-server of the test's own, with a CA made for the test.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::OwnRedis;
use leasehold::{HolderId, LeaseName, Store, StoreError, store::Acquisition};
use leasehold_redis::{Error, RedisConfig};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1, made with the openssl tool (scripts/stores.sh
/// installs it).
fn make_certs() -> TempDir {
    let dir = std::env::temp_dir().join(format!("leasehold-tls-{:016x}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = TempDir(dir);
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &dir.0,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "1",
                "-subj",
                "/CN=leasehold test ca",
            ],
        ]
        .concat(),
    );
    openssl(
        &dir.0,
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(dir.0.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        &dir.0,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        ],
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_urls_connect_over_tls() {
    let certs = make_certs();
    let file = |f: &str| certs.0.join(f).display().to_string();
    let server = OwnRedis::start(&[
        "--port",
        "0",
        "--tls-port",
        "{port}",
        "--tls-cert-file",
        &file("server.crt"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let ca = std::fs::read(certs.0.join("ca.crt")).unwrap();
    let store = RedisConfig::new(&url)
        .tls_ca_pem(ca)
        .connect()
        .await
        .unwrap();
    let name = LeaseName::new("tls/check").unwrap();
    let who = HolderId::new("tls-holder").unwrap();
    let got = store
        .acquire(&name, &who, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(matches!(got, Acquisition::Acquired { .. }), "{got:?}");
    // Release notifications travel over TLS too.
    let mut sub = store.subscribe_releases().unwrap();
    let Acquisition::Acquired { token } = got else {
        unreachable!()
    };
    store.release(&name, &who, token).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), sub.released(&name))
        .await
        .unwrap();

    // Without the test CA the server's certificate is not trusted: a clear connect error.
    let err = leasehold_redis::connect(&url).await.unwrap_err();
    println!("untrusted: {err}");
    assert!(
        matches!(
            err,
            Error::Connect {
                source: StoreError::Unavailable { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn rediss_to_a_plain_port_fails_cleanly() {
    let err = RedisConfig::new(common::redis_url().replacen("redis://", "rediss://", 1))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    println!("{err}");
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
}
