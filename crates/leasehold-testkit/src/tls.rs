//! TLS certificates for servers of a test's own, made with the `openssl` tool
//! (`scripts/stores.sh` installs it): a CA, a server certificate it signed for IP 127.0.0.1,
//! and a second CA that signed nothing, to show an untrusted certificate is refused.

use std::path::{Path, PathBuf};
use std::process::Command;

/// PEM files in a temp dir of their own, removed on drop. P-256 keys, valid for a day.
pub struct TestCerts {
    dir: tempfile::TempDir,
}

/// Arguments of `openssl req` for a new P-256 key, unencrypted.
const NEW_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

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

/// A self-signed CA in `dir`: `name.crt` and `name.key`.
fn make_ca(dir: &Path, name: &str) {
    let (crt, key, subject) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("/CN=leasehold test {name}"),
    );
    let mut args = vec!["req", "-x509", "-days", "1", "-subj", &subject];
    args.extend(NEW_KEY);
    args.extend(["-keyout", &key, "-out", &crt]);
    openssl(dir, &args);
}

impl TestCerts {
    /// Makes the CA (`ca.crt`), the server's certificate and key (`server.crt`, `server.key`,
    /// subjectAltName IP:127.0.0.1, for server authentication) and the unrelated CA
    /// (`other-ca.crt`).
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-tls-")
            .tempdir()
            .expect("a temporary directory");
        let path = dir.path();
        make_ca(path, "ca");
        make_ca(path, "other-ca");
        let mut args = vec!["req", "-subj", "/CN=127.0.0.1"];
        args.extend(NEW_KEY);
        args.extend(["-keyout", "server.key", "-out", "server.csr"]);
        openssl(path, &args);
        std::fs::write(
            path.join("server.ext"),
            "subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth\n",
        )
        .expect("the certificate's extension file");
        openssl(
            path,
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
                "-days",
                "1",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
        );
        Self { dir }
    }

    /// The CA that signed the server's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A CA that signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.path().join("other-ca.crt")
    }

    /// The server's certificate.
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server's private key.
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

impl Default for TestCerts {
    fn default() -> Self {
        Self::new()
    }
}
