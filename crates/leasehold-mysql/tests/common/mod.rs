//! Shared helpers: the server URL, a table prefix of this run's own, raw connections.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use leasehold_mysql::mysql_async::prelude::Queryable;
use leasehold_mysql::mysql_async::{self, Conn, Row};
use leasehold_mysql::{MySqlConfig, MySqlStore};

/// The test server: `LEASEHOLD_TEST_MYSQL_URL`, default the local MariaDB as root.
pub fn url() -> String {
    std::env::var("LEASEHOLD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A table prefix no other test run uses: `lh_test_<unix secs>_<random>_`. The time stamp lets
/// a later run drop tables that crashed runs left behind.
pub fn fresh_prefix() -> String {
    format!("lh_test_{}_{:08x}_", unix_secs(), fastrand::u32(..))
}

/// This test binary's prefix (one per process).
pub fn prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(fresh_prefix)
}

/// A raw connection to the test server (UTC session).
pub async fn raw() -> Conn {
    let opts = mysql_async::Opts::from_url(&url()).expect("LEASEHOLD_TEST_MYSQL_URL parses");
    let mut conn = Conn::new(opts)
        .await
        .expect("test mysql reachable (set LEASEHOLD_TEST_MYSQL_URL)");
    conn.query_drop("SET time_zone = '+00:00'").await.unwrap();
    conn
}

/// The tables of the test server's database whose names start with `prefix`.
pub async fn tables(prefix: &str) -> Vec<String> {
    let mut conn = raw().await;
    let rows: Vec<Row> = conn
        .exec(
            "SELECT TABLE_NAME FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE CONCAT(?, '%')",
            (prefix.replace('_', "\\_"),),
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.get::<String, usize>(0).unwrap())
        .collect()
}

/// Drops every table whose name starts with `prefix`.
pub async fn drop_prefix(prefix: &str) {
    let mut conn = raw().await;
    for table in tables(prefix).await {
        conn.query_drop(format!("DROP TABLE IF EXISTS `{table}`"))
            .await
            .unwrap();
    }
}

/// Drops test tables older than an hour (from runs that did not clean up).
pub async fn drop_stale_tables() {
    let cutoff = unix_secs().saturating_sub(3600);
    let mut conn = raw().await;
    for table in tables("lh_test_").await {
        let stamp = table
            .strip_prefix("lh_test_")
            .and_then(|s| s.split('_').next())
            .and_then(|s| s.parse::<u64>().ok());
        if stamp.is_some_and(|t| t < cutoff) {
            let _ = conn
                .query_drop(format!("DROP TABLE IF EXISTS `{table}`"))
                .await;
        }
    }
}

/// Settings for the test server on this binary's prefix.
pub fn config() -> MySqlConfig {
    MySqlConfig::new(url()).table_prefix(prefix())
}

/// Settings for the server at `url` on tables of the test's own `prefix`, without the release
/// poller.
pub fn config_on(url: &str, prefix: &str) -> MySqlConfig {
    MySqlConfig::new(url)
        .table_prefix(prefix)
        .notifications(false)
}

/// A store on this binary's prefix.
pub async fn store() -> MySqlStore {
    static CLEANED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    CLEANED.get_or_init(drop_stale_tables).await;
    config().connect().await.expect("connect to test mysql")
}

/// The test server's URL as `user` with `password`.
pub fn url_as(user: &str, password: &str) -> String {
    let url = url();
    let rest = url.strip_prefix("mysql://").expect("a mysql:// test URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("mysql://{user}:{password}@{host}")
}

/// A user of the test's own with `password` and no privileges (grant them), connecting from
/// 127.0.0.1; dropped by the returned guard.
pub async fn user(password: &str) -> (String, DropUser) {
    let user = format!("lhro_{}_{:04x}", unix_secs(), fastrand::u16(..));
    let mut conn = raw().await;
    conn.query_drop(format!(
        "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'"
    ))
    .await
    .unwrap();
    (user.clone(), DropUser(user))
}

/// Drops its user.
pub struct DropUser(String);

impl Drop for DropUser {
    fn drop(&mut self) {
        let user = self.0.clone();
        let url = url();
        // Outside the test's runtime, which may be shutting down.
        std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let opts = mysql_async::Opts::from_url(&url).unwrap();
                if let Ok(mut conn) = Conn::new(opts).await {
                    let _ = conn
                        .query_drop(format!("DROP USER IF EXISTS '{user}'@'127.0.0.1'"))
                        .await;
                }
            });
        })
        .join()
        .ok();
    }
}
