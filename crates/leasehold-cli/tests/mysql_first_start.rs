//! Issue 43 item 6: a scheduled `leasehold run` on a fresh MariaDB database logs no warning
//! at its first start. Its store connects in the background and creates its tables; the
//! release poller used to read them before they existed ("release poller lost its connection
//! … Table '…leasehold_leases' doesn't exist").

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use mysql_async::prelude::Queryable;

fn mysql_url() -> String {
    std::env::var("LEASEHOLD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// Runs `sql` on the test server's URL.
fn exec(sql: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut conn = mysql_async::Conn::from_url(mysql_url()).await.unwrap();
        conn.query_drop(sql).await.unwrap();
        conn.disconnect().await.unwrap();
    });
}

#[test]
fn a_fresh_database_logs_no_warning_at_first_start() {
    let database = format!("lh_fresh_{}", std::process::id());
    exec(&format!("DROP DATABASE IF EXISTS `{database}`"));
    exec(&format!("CREATE DATABASE `{database}`"));
    let (server, _) = mysql_url()
        .rsplit_once('/')
        .map(|(s, d)| (s.to_owned(), d.to_owned()))
        .unwrap();
    let store = format!("{server}/{database}");
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let child = Command::new(BIN)
        .args([
            "run", "--store", &store, "--lease", "fresh", "--every", "500ms", "--",
        ])
        .args(witness(&ledger, "10ms"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    exec(&format!("DROP DATABASE `{database}`"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!read_ledger(&ledger).is_empty(), "nothing ran: {stderr}");
    assert!(!stderr.contains(" WARN "), "{stderr}");
    assert!(!stderr.contains("doesn't exist"), "{stderr}");
}
