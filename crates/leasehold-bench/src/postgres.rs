//! The PostgreSQL store, next to a one-row `UPDATE` of a scratch table run the way the store
//! runs its statements: through the store's own connection pool (deadpool-postgres over
//! tokio-postgres, re-exported by leasehold-postgres), as a cached prepared statement, in
//! autocommit.

use leasehold_postgres::deadpool_postgres;
use leasehold_postgres::{PgConfig, PgStore};

use crate::common::{self, HeldPlan, OpBench, OpRounds, OpTargets};
use crate::error::{BenchError, Result};
use crate::report::Report;
use crate::stats::{Recorder, Round};
use crate::{Plan, StoreKind};

const FLOOR: &str = "UPDATE";

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
    let floor = Floor {
        store,
        sql: &update,
    };
    let select = Floor {
        store,
        sql: "SELECT 1",
    };

    let ops = OpBench::new(store.clone(), prefix, plan.ops)?;
    ops.warm_up().await?;
    floor.round(plan.ops.min(200)).await?;
    select.round(plan.ops.min(200)).await?;
    let (mut rounds, mut floors, mut selects) = (OpRounds::default(), Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        floors.push(floor.round(plan.ops).await?);
        selects.push(select.round(plan.ops).await?);
        ops.round(&mut rounds).await?;
    }
    report.operations.extend(common::floor_rows(
        "postgres",
        &[(FLOOR, &floors), ("SELECT 1", &selects)],
    ));
    let floor = (&floors[..], FLOOR);
    let targets = OpTargets {
        acquire: Some(common::p50_within(&rounds.acquire, 1.2, floor)),
        ..OpTargets::default()
    };
    report
        .operations
        .extend(rounds.rows("postgres", Some(floor), targets));
    let settings = server_settings(store).await?;
    report.notes.push(format!(
        "postgres: floors = a one-row UPDATE of a scratch table (a commit, like every store \
         operation) and SELECT 1 (a round trip, no commit), each a cached prepared statement on \
         a connection from the store's own pool (deadpool-postgres, tokio-postgres), in \
         autocommit, as the store runs its statements; acquire is one INSERT … ON CONFLICT DO \
         UPDATE inside a CTE, renew one UPDATE, release one UPDATE in a CTE with pg_notify; \
         tables in schema {}; server {settings}",
        store.schema()
    ));

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

/// A floor statement, run exactly as the store runs one of its own: a connection from the
/// store's pool, the statement from the connection's prepared-statement cache, one round trip.
struct Floor<'a> {
    store: &'a PgStore,
    sql: &'a str,
}

impl Floor<'_> {
    async fn round(&self, ops: usize) -> Result<Round> {
        let mut rec = Recorder::new(ops);
        for _ in 0..ops {
            rec.start();
            let client = pooled(self.store, self.sql).await?;
            let stmt = client
                .prepare_cached(self.sql)
                .await
                .map_err(|e| BenchError::floor(self.sql, e))?;
            client
                .query(&stmt, &[])
                .await
                .map_err(|e| BenchError::floor(self.sql, e))?;
            drop(client);
            rec.stop();
        }
        Ok(rec.finish())
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
