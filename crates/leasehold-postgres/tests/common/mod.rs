//! Shared helpers: the server URL, a schema of this run's own, raw connections.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use leasehold_postgres::tokio_postgres::{self, Client, NoTls};
use leasehold_postgres::{PgConfig, PgStore};

/// The test server: `LEASEHOLD_TEST_POSTGRES_URL`, default the local server with trust auth.
pub fn url() -> String {
    std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A schema name no other test run uses: `lh_test_<unix secs>_<random>`. The time stamp lets a
/// later run drop schemas that crashed runs left behind.
pub fn fresh_schema() -> String {
    format!("lh_test_{}_{:08x}", unix_secs(), fastrand::u32(..))
}

/// This test binary's schema (one per process).
pub fn schema() -> &'static str {
    static SCHEMA: OnceLock<String> = OnceLock::new();
    SCHEMA.get_or_init(fresh_schema)
}

/// A raw connection to the test server, driven on a background task.
pub async fn raw() -> Client {
    let (client, connection) = tokio_postgres::connect(&url(), NoTls)
        .await
        .expect("test postgres reachable (set LEASEHOLD_TEST_POSTGRES_URL)");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Drops test schemas older than an hour (from runs that did not clean up).
pub async fn drop_stale_schemas() {
    let client = raw().await;
    let rows = client
        .query(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'lh\\_test\\_%'",
            &[],
        )
        .await
        .unwrap();
    let cutoff = unix_secs().saturating_sub(3600);
    for row in rows {
        let name: String = row.get(0);
        let stamp = name
            .strip_prefix("lh_test_")
            .and_then(|s| s.split('_').next())
            .and_then(|s| s.parse::<u64>().ok());
        if stamp.is_some_and(|t| t < cutoff) {
            let _ = client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                .await;
        }
    }
}

/// Drops `schema` and everything in it.
pub async fn drop_schema(schema: &str) {
    let client = raw().await;
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

/// Settings for the test server on this binary's schema.
pub fn config() -> PgConfig {
    PgConfig::new(url()).schema(schema())
}

/// A store on this binary's schema.
pub async fn store() -> PgStore {
    static CLEANED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    CLEANED.get_or_init(drop_stale_schemas).await;
    config().connect().await.expect("connect to test postgres")
}
