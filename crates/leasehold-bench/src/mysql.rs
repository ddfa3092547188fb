//! The MySQL/MariaDB store, next to a one-row `UPDATE` of a scratch table run the way the store
//! runs its statements: a connection from the store's own pool (mysql_async), the statement from
//! the connection's prepared-statement cache, autocommit.

use leasehold_mysql::mysql_async::prelude::Queryable;
use leasehold_mysql::mysql_async::{Conn, Row};
use leasehold_mysql::{MySqlConfig, MySqlStore};

use crate::common::{self, HeldPlan};
use crate::error::{BenchError, Result};
use crate::plan::{Plan, StoreKind};
use crate::report::Report;
use crate::sql::{self, FloorStore, SqlRounds};

/// The store's release poll interval, which bounds the graceful takeover.
const POLL_MS: f64 = 50.0;

pub(crate) async fn bench(plan: &Plan, report: &mut Report) -> Result<()> {
    let url = MySqlConfig::new(plan.mysql_url.clone()).describe();
    // Tables of this run's own (a prefix), created by the store's migration and dropped at the
    // end: the lease table starts empty and the release poller reads only this run's releases.
    let prefix = format!("lhbench_{}_", plan.run_id);
    let config = MySqlConfig::new(plan.mysql_url.clone()).table_prefix(prefix.clone());
    let store = config
        .clone()
        .connect()
        .await
        .map_err(|e| BenchError::connect(format!("{url} (and create tables {prefix}*)"), e))?;
    let names = plan.prefix(StoreKind::Mysql);
    let result = async {
        // A second store handle, as another process would have: its own pool and poller.
        let waiter = config
            .connect()
            .await
            .map_err(|e| BenchError::connect(&url, e))?;
        bench_with(plan, report, &store, &waiter, &names).await
    }
    .await;
    let cleaned = cleanup(&store).await;
    result.and(cleaned)
}

async fn bench_with(
    plan: &Plan,
    report: &mut Report,
    store: &MySqlStore,
    waiter: &MySqlStore,
    names: &str,
) -> Result<()> {
    let scratch = format!("`{}bench_floor`", store.table_prefix());
    let create = "create the scratch table";
    let mut conn = pooled(store, create).await?;
    conn.query_drop(format!(
        "CREATE TABLE {scratch} (id INT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB"
    ))
    .await
    .map_err(|e| BenchError::floor(create, e))?;
    conn.query_drop(format!("INSERT INTO {scratch} VALUES (1, 0)"))
        .await
        .map_err(|e| BenchError::floor(create, e))?;
    drop(conn);
    let update = format!("UPDATE {scratch} SET v = v + 1 WHERE id = 1");
    let how = SqlRounds {
        store: "mysql",
        pool: "mysql_async",
        statements: format!(
            "acquire of a free lease is one INSERT … ON DUPLICATE KEY UPDATE (its token in the \
             OK packet's LAST_INSERT_ID), renew and release one UPDATE each; renew_many one \
             UPDATE … JOIN JSON_TABLE per 1,000 leases; a waiter hears a release from its \
             handle's poller (every {POLL_MS} ms); tables {}*",
            store.table_prefix()
        ),
        acquire_factor: 1.3,
    };
    let settings = async || server_settings(store).await;
    sql::rounds(plan, report, store, names, &update, how, settings).await?;

    let held = HeldPlan::of(plan, "mysql", names, 4);
    let graceful = Some((format!("{POLL_MS} ms (the poll interval)"), POLL_MS));
    common::held_and_takeovers(plan, report, &held, store, waiter, graceful).await
}

/// The server's version and the settings that move these figures (commit cost, binary log).
async fn server_settings(store: &MySqlStore) -> Result<String> {
    let mut conn = pooled(store, "settings").await?;
    let row: Option<Row> = conn
        .query_first(
            "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin, \
             @@binlog_format",
        )
        .await
        .map_err(|e| BenchError::floor("server settings", e))?;
    let Some(row) = row else {
        return Ok("settings unknown".to_owned());
    };
    let text = |i: usize| {
        row.get_opt::<String, usize>(i)
            .and_then(|v| v.ok())
            .unwrap_or_else(|| "?".to_owned())
    };
    Ok(format!(
        "version={}, innodb_flush_log_at_trx_commit={}, sync_binlog={}, log_bin={}, binlog_format={}",
        text(0),
        text(1),
        text(2),
        text(3),
        text(4)
    ))
}

impl FloorStore for MySqlStore {
    async fn run_floor(&self, sql: &str) -> Result<()> {
        pooled(self, sql)
            .await?
            .exec_drop(sql, ())
            .await
            .map_err(|e| BenchError::floor(sql, e))
    }
}

/// Drops this run's tables: the store's and the scratch table.
async fn cleanup(store: &MySqlStore) -> Result<()> {
    let what = format!("cleanup: drop tables {}*", store.table_prefix());
    let mut conn = pooled(store, &what).await?;
    let tables: Vec<Row> = conn
        .exec(
            "SELECT TABLE_NAME FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE CONCAT(?, '%')",
            (store.table_prefix().replace('_', "\\_"),),
        )
        .await
        .map_err(|e| BenchError::floor(&what, e))?;
    for row in tables {
        let Some(Ok(table)) = row.get_opt::<String, usize>(0) else {
            continue;
        };
        conn.query_drop(format!("DROP TABLE IF EXISTS `{table}`"))
            .await
            .map_err(|e| BenchError::floor(&what, e))?;
    }
    Ok(())
}

/// A connection from the store's pool, for `what`.
async fn pooled(store: &MySqlStore, what: &str) -> Result<Conn> {
    store
        .pool()
        .get_conn()
        .await
        .map_err(|e| BenchError::floor(format!("{what}: a connection from the pool"), e))
}
