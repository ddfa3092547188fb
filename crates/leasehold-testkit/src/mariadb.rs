//! A MariaDB server of a test's own (Debian's `mariadb-server`: `mariadb-install-db` and
//! `mariadbd`), for what the shared server cannot show: TLS with certificates of the test's
//! own, a server without TLS.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// The first of `names` in `/usr/sbin`, `/usr/bin` or on `PATH`.
fn program(names: &[&str]) -> PathBuf {
    let mut dirs = vec![PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    names
        .iter()
        .flat_map(|n| dirs.iter().map(move |d| d.join(n)))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{} not found (scripts/stores.sh installs mariadb-server)",
                names[0]
            )
        })
}

/// Runs as root only when told to (the server refuses root otherwise).
fn user_args() -> Vec<String> {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        vec!["--user=root".to_owned()]
    } else {
        Vec::new()
    }
}

/// A loopback `mariadbd` with a data directory of its own in a temp dir, root without a
/// password from 127.0.0.1 and a database `test`; killed on drop.
pub struct OwnMariaDb {
    /// The port it listens on.
    pub port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl OwnMariaDb {
    /// Creates the data directory and starts the server with `extra` options (`--ssl-cert=…`),
    /// waiting until it accepts connections.
    pub fn start(extra: &[String]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-test-mariadb-")
            .tempdir()
            .expect("a temporary directory");
        let path = dir.path();
        let log = path.join("mariadb.log");
        let out = Command::new(program(&["mariadb-install-db", "mysql_install_db"]))
            .arg("--no-defaults")
            .arg(format!("--datadir={}", path.join("data").display()))
            .args(user_args())
            .args(["--skip-test-db", "--auth-root-authentication-method=normal"])
            .output()
            .expect("mariadb-install-db runs");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(
            path.join("init.sql"),
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';\n\
             GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n\
             CREATE DATABASE IF NOT EXISTS test;\n",
        )
        .expect("the init file");
        let port = free_port();
        let child = Command::new(program(&["mariadbd", "mysqld"]))
            .arg("--no-defaults")
            .arg(format!("--datadir={}", path.join("data").display()))
            .arg(format!("--socket={}", path.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", path.join("mysqld.pid").display()))
            .arg(format!("--init-file={}", path.join("init.sql").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--port={port}"))
            .args(user_args())
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd starts");
        let mut server = Self { port, child, dir };
        server.wait_ready(&log);
        server
    }

    fn wait_ready(&mut self, log: &Path) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if text.contains("ready for connections") {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("mariadbd exited with {status}: {text}");
            }
            assert!(
                Instant::now() < deadline,
                "mariadbd not ready within 60 s: {text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `mysql://root@HOST:PORT/test` plus `query` (`?ssl-mode=…`), `host` being `127.0.0.1` or
    /// `localhost`.
    pub fn url(&self, host: &str, query: &str) -> String {
        format!("mysql://root@{host}:{}/test{query}", self.port)
    }

    /// The server's directory (its log is `mariadb.log` there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for OwnMariaDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
