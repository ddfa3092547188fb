//! The PostgreSQL store, next to a one-row `UPDATE` of a scratch table run the way the store
//! runs its statements: through the store's own connection pool (deadpool-postgres over
//! tokio-postgres, re-exported by leasehold-postgres), as a cached prepared statement, in
//! autocommit.

use leasehold_postgres::deadpool_postgres;
use leasehold_postgres::{PgConfig, PgStore};

use crate::common::{self, HeldPlan};
use crate::error::{BenchError, Result};
use crate::plan::{Plan, StoreKind};
use crate::report::Report;
use crate::sql::{self, FloorStore, SqlRounds};

pub(crate) async fn bench(plan: &Plan, report: &mut Report) -> Result<()> {
    let url = PgConfig::new(plan.postgres_url.clone()).describe();
    // A schema of this run's own, created by the store's migration and dropped at the end: the
    // lease table starts empty (no dead rows left by earlier runs or other users of the
    // database, which matter where autovacuum is slow or off) and its release channel
    // (`SCHEMA.leases`) carries this run's notifications only.
    let schema = format!("leasehold_bench_{}", plan.run_id);
    let config = PgConfig::new(plan.postgres_url.clone()).schema(schema.clone());
    // `"schema"."table"`: the store checks the schema is a plain identifier.
    let scratch = format!("\"{schema}\".\"bench_floor\"");
    let store = config
        .clone()
        .connect()
        .await
        .map_err(|e| BenchError::connect(format!("{url} (and create schema {schema})"), e))?;
    let prefix = plan.prefix(StoreKind::Postgres);
    let result = async {
        // A second store handle, as another process would have: its own pool and LISTEN
        // connection.
        let waiter = config
            .connect()
            .await
            .map_err(|e| BenchError::connect(&url, e))?;
        bench_with(plan, report, &store, &waiter, &scratch, &prefix).await
    }
    .await;
    let cleaned = cleanup(&store, &schema).await;
    result.and(cleaned)
}

async fn bench_with(
    plan: &Plan,
    report: &mut Report,
    store: &PgStore,
    waiter: &PgStore,
    // The floor's scratch table in this run's schema, qualified and quoted.
    scratch: &str,
    prefix: &str,
) -> Result<()> {
    let create = "create the scratch table";
    pooled(store, create)
        .await?
        .batch_execute(&format!(
            "CREATE TABLE {scratch} (id integer PRIMARY KEY, v bigint NOT NULL); \
             INSERT INTO {scratch} VALUES (1, 0);"
        ))
        .await
        .map_err(|e| BenchError::floor(create, e))?;
    let update = format!("UPDATE {scratch} SET v = v + 1 WHERE id = 1");
    let how = SqlRounds {
        store: "postgres",
        pool: "deadpool-postgres, tokio-postgres",
        statements: format!(
            "acquire is one INSERT … ON CONFLICT DO UPDATE inside a CTE, renew one UPDATE, \
             release one UPDATE in a CTE with pg_notify; tables in schema {}",
            store.schema()
        ),
        acquire_factor: 1.2,
    };
    let settings = async || server_settings(store).await;
    sql::rounds(plan, report, store, prefix, &update, how, settings).await?;

    let held = HeldPlan::of(plan, "postgres", prefix, 32);
    let graceful = Some(("5 ms".to_owned(), 5.0));
    common::held_and_takeovers(plan, report, &held, store, waiter, graceful).await
}

/// The server's version and the settings that move these figures (commit cost, dead rows).
async fn server_settings(store: &PgStore) -> Result<String> {
    let client = pooled(store, "SHOW").await?;
    let mut out = Vec::new();
    for name in [
        "server_version",
        "synchronous_commit",
        "fsync",
        "autovacuum",
    ] {
        let row = client
            .query_one(&format!("SHOW {name}"), &[])
            .await
            .map_err(|e| BenchError::floor(format!("SHOW {name}"), e))?;
        out.push(format!("{name}={}", row.get::<_, String>(0)));
    }
    Ok(out.join(", "))
}

impl FloorStore for PgStore {
    async fn run_floor(&self, sql: &str) -> Result<()> {
        let client = pooled(self, sql).await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| BenchError::floor(sql, e))?;
        client
            .query(&stmt, &[])
            .await
            .map_err(|e| BenchError::floor(sql, e))?;
        Ok(())
    }
}

/// Drops this run's schema: the store's tables and the scratch table.
async fn cleanup(store: &PgStore, schema: &str) -> Result<()> {
    let what = format!("cleanup: drop schema {schema}");
    pooled(store, &what)
        .await?
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .map_err(|e| BenchError::floor(what, e))
}

/// A connection from the store's pool, for `what`.
async fn pooled(store: &PgStore, what: &str) -> Result<deadpool_postgres::Object> {
    store
        .pool()
        .get()
        .await
        .map_err(|e| BenchError::floor(format!("{what}: a connection from the pool"), e))
}
