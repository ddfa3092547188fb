// NOT COMPILED YET: written before crates/leasehold-postgres existed. To wire it in:
//   1. Cargo.toml: `leasehold-postgres = { workspace = true }`;
//   2. move this file to src/postgres.rs, add `mod postgres;` to src/lib.rs and replace the
//      `StoreKind::Postgres => Err(..)` arm of `bench` with `postgres::bench(plan, &mut report).await`;
//   3. check against the store's source: the store type name, the `tokio_postgres` re-export,
//      the table (`leasehold_leases` assumed) and the renew statement copied into RENEW_MANY
//      (column names, how expiry is stored and compared).
//! The PostgreSQL store, next to a one-row `UPDATE` of a scratch table through the same client
//! library (`tokio-postgres`, re-exported by leasehold-postgres).

use std::time::Duration;

use anyhow::Context;
use leasehold::{FencingToken, HolderId, LeaseName};
use leasehold_postgres::tokio_postgres::{self, Client, NoTls};

use crate::common::{self, BatchRenew, HeldPlan, OpBench, OpRounds};
use crate::report::{Kind, OpRow, Report, Target};
use crate::stats::{Figure, Recorder, Round};
use crate::{Plan, StoreKind};

const FLOOR: &str = "UPDATE";

pub(crate) async fn bench(plan: &Plan, report: &mut Report) -> anyhow::Result<()> {
    let url = leasehold::store::redact_url(&plan.postgres_url);
    let store = leasehold_postgres::connect(&plan.postgres_url)
        .await
        .with_context(|| format!("connect to {url}"))?;
    let (client, connection) = tokio_postgres::connect(&plan.postgres_url, NoTls)
        .await
        .with_context(|| format!("connect to {url}"))?;
    tokio::spawn(connection);
    let scratch = format!("leasehold_bench_floor_{}", plan.run_id);
    let prefix = plan.prefix(StoreKind::Postgres);
    let result = async {
        // A second store handle, as another process would have: its own connection and
        // LISTEN channel.
        let waiter = leasehold_postgres::connect(&plan.postgres_url)
            .await
            .with_context(|| format!("connect to {url}"))?;
        bench_with(plan, report, &store, &waiter, &client, &scratch, &prefix).await
    }
    .await;
    let cleaned = cleanup(&client, &scratch, &prefix).await;
    result.and(cleaned)
}

async fn bench_with(
    plan: &Plan,
    report: &mut Report,
    store: &leasehold_postgres::PostgresStore,
    waiter: &leasehold_postgres::PostgresStore,
    client: &Client,
    scratch: &str,
    prefix: &str,
) -> anyhow::Result<()> {
    client
        .batch_execute(&format!(
            "CREATE TABLE {scratch} (id integer PRIMARY KEY, v bigint NOT NULL); \
             INSERT INTO {scratch} VALUES (1, 0);"
        ))
        .await
        .context("create the scratch table")?;
    let update = client
        .prepare(&format!("UPDATE {scratch} SET v = v + 1 WHERE id = 1"))
        .await?;
    let floor_round = async |ops: usize| -> anyhow::Result<Round> {
        let mut rec = Recorder::new(ops);
        for _ in 0..ops {
            rec.start();
            client.execute(&update, &[]).await?;
            rec.stop();
        }
        Ok(rec.finish())
    };

    let ops = OpBench::new(store.clone(), prefix, plan.ops)?;
    ops.warm_up().await?;
    floor_round(plan.ops.min(200)).await?;
    let (mut rounds, mut floors) = (OpRounds::default(), Vec::new());
    for _ in 0..plan.rounds {
        floors.push(floor_round(plan.ops).await?);
        ops.round(&mut rounds).await?;
    }
    let name = || "postgres".to_owned();
    let floor = Figure::of(&floors);
    let acquire = Figure::of(&rounds.acquire);
    report.ops_rows.push(OpRow {
        store: name(),
        op: FLOOR.to_owned(),
        kind: Kind::Floor,
        figure: floor,
        ratio: None,
        target: None,
    });
    for (op, r, target) in [
        (
            "acquire",
            &rounds.acquire,
            Some(Target::new(
                "p50 ≤ 1.2× UPDATE",
                acquire.p50_us.median <= 1.2 * floor.p50_us.median,
            )),
        ),
        ("renew", &rounds.renew, None),
        ("release", &rounds.release, None),
        ("acquire+release", &rounds.acquire_release, None),
    ] {
        report.ops_rows.push(OpRow {
            store: name(),
            op: op.to_owned(),
            kind: Kind::Lease,
            figure: Figure::of(r),
            ratio: common::ratio(r, &floors, FLOOR),
            target,
        });
    }
    report.notes.push(
        "postgres: floor = a prepared one-row UPDATE of a scratch table (autocommit) through \
         tokio-postgres, the store's client, on a connection of its own"
            .to_owned(),
    );

    let batch = Batch::new(client).await?;
    report.held_rows.push(
        common::held_renewal(
            store,
            &batch,
            &HeldPlan {
                store_name: "postgres",
                prefix,
                held: plan.held,
                sample: plan.held_sample,
                rounds: plan.rounds,
                concurrency: 32,
            },
        )
        .await?,
    );
    report.takeover_rows.push(
        common::graceful_takeover(
            "postgres",
            store,
            waiter,
            prefix,
            plan.graceful_trials,
            Some(5.0),
        )
        .await?,
    );
    report.takeover_rows.push(
        common::expiry_takeover(
            "postgres",
            store,
            waiter,
            prefix,
            plan.expiry_trials,
            plan.expiry_ttl,
        )
        .await?,
    );
    Ok(())
}

/// The store's table and renew rule (leasehold-postgres's renew statement), for the batch.
const LEASES: &str = "leasehold_leases";

const RENEW_MANY: &str = "UPDATE leasehold_leases AS l \
     SET expires_at = now() + make_interval(secs => $4::double precision / 1000) \
     FROM unnest($1::text[], $2::bigint[]) AS b(name, token) \
     WHERE l.name = b.name AND l.holder = $3 AND l.token = b.token AND l.expires_at > now()";

/// Batched renewal: one `UPDATE … FROM unnest(…)` statement for all leases.
struct Batch<'a> {
    client: &'a Client,
    stmt: tokio_postgres::Statement,
}

impl<'a> Batch<'a> {
    async fn new(client: &'a Client) -> anyhow::Result<Self> {
        let stmt = client
            .prepare(RENEW_MANY)
            .await
            .context("prepare the batched renew statement")?;
        Ok(Self { client, stmt })
    }
}

impl BatchRenew for Batch<'_> {
    fn method(&self) -> String {
        "one UPDATE … FROM unnest($1::text[], $2::bigint[]) statement with the store's renew \
         rule (the store has no batch call; done in this crate against its table)"
            .to_owned()
    }

    async fn renew_all(
        &self,
        leases: &[(LeaseName, FencingToken)],
        holder: &HolderId,
        ttl: Duration,
    ) -> anyhow::Result<usize> {
        let names: Vec<&str> = leases.iter().map(|(n, _)| n.as_str()).collect();
        let tokens: Vec<i64> = leases
            .iter()
            .map(|(_, t)| i64::try_from(t.get()).unwrap_or(-1))
            .collect();
        let ttl_ms = ttl.as_millis() as f64;
        let n = self
            .client
            .execute(&self.stmt, &[&names, &tokens, &holder.as_str(), &ttl_ms])
            .await?;
        Ok(n as usize)
    }
}

/// Deletes this run's rows and the scratch table.
async fn cleanup(client: &Client, scratch: &str, prefix: &str) -> anyhow::Result<()> {
    client
        .batch_execute(&format!("DROP TABLE IF EXISTS {scratch}"))
        .await
        .context("cleanup: drop the scratch table")?;
    client
        .execute(
            &format!("DELETE FROM {LEASES} WHERE starts_with(name, $1)"),
            &[&format!("{prefix}/")],
        )
        .await
        .context("cleanup: delete this run's leases")?;
    Ok(())
}
