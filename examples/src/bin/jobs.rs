//! A lease per job (the pattern of a .NET job processor): workers take pending rows of a
//! PostgreSQL `jobs` table, hold a lease on each job they work on (renewed together by one
//! `LeaseSession`), and complete a job in a transaction fenced by that lease's token. A worker
//! that crashes leaves its jobs to others once their leases expire; a worker that was paused
//! past its ttl finds its lease lost (its job is cancelled) and its late completion refused by
//! the fence, so every job is completed exactly once.
//!
//! ```text
//! cargo run -p leasehold-examples --bin jobs -- --db postgres://postgres@127.0.0.1/test \
//!     --schema jobs_demo --worker w1 [--seed 100] [--work 200ms] [--ttl 2s]
//! ```

use std::time::Duration;

use clap::Parser;
use leasehold::{HolderId, LeaseConfig, LeaseName, LeaseSession, TryAcquire};
use leasehold_postgres::tokio_postgres::{self, NoTls};
use leasehold_postgres::{Fence, FenceError, PgConfig};

#[derive(Parser)]
struct Args {
    /// The database (jobs, leases and fences live in --schema).
    #[arg(long)]
    db: String,
    /// The schema of the jobs table, the leases and the fences.
    #[arg(long, default_value = "jobs_demo")]
    schema: String,
    /// This worker's name.
    #[arg(long)]
    worker: String,
    /// Insert this many pending jobs first (if the table is empty).
    #[arg(long, default_value_t = 0)]
    seed: u32,
    /// How long each job's work takes.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    work: Duration,
    /// The lease ttl of each job.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Jobs worked on at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (mut client, connection) = tokio_postgres::connect(&args.db, NoTls).await?;
    tokio::spawn(connection);
    let schema = &args.schema;
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {schema}.jobs (
               id int PRIMARY KEY, state text NOT NULL DEFAULT 'pending',
               done_by text, done_token bigint);
             CREATE TABLE IF NOT EXISTS {schema}.refused (id int, worker text, token bigint);"
        ))
        .await?;
    if args.seed > 0 {
        client
            .execute(
                &format!(
                    "INSERT INTO {schema}.jobs (id) SELECT generate_series(1, $1::int)
                     ON CONFLICT DO NOTHING"
                ),
                &[&(args.seed as i32)],
            )
            .await?;
    }
    let fence = Fence::new(schema, "fences")?;
    fence.migrate(&mut client).await?;
    let store = PgConfig::new(&args.db).schema(schema).connect().await?;
    let session = LeaseSession::with_holder(
        store,
        LeaseConfig::new(args.ttl),
        HolderId::new(&args.worker)?,
    )?;
    let client = std::sync::Arc::new(tokio::sync::Mutex::new(client));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.parallel {
        let (session, client, fence) = (session.clone(), client.clone(), fence.clone());
        let (schema, worker, work) = (schema.clone(), args.worker.clone(), args.work);
        workers.spawn(async move { work_loop(session, client, fence, schema, worker, work).await });
    }
    while let Some(done) = workers.join_next().await {
        done?.map_err(|e| e.to_string())?;
    }
    println!("{}: no pending jobs left", args.worker);
    Ok(())
}

type Shared = std::sync::Arc<tokio::sync::Mutex<tokio_postgres::Client>>;

async fn work_loop(
    session: LeaseSession<leasehold_postgres::PgStore>,
    client: Shared,
    fence: Fence,
    schema: String,
    worker: String,
    work: Duration,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    loop {
        // A few pending jobs in random order, so workers do not all knock on the same one.
        let candidates: Vec<i32> = client
            .lock()
            .await
            .query(
                &format!(
                    "SELECT id FROM {schema}.jobs WHERE state = 'pending' ORDER BY random() LIMIT 8"
                ),
                &[],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        for id in candidates {
            let name = LeaseName::new(format!("job:{id}"))?;
            let guard = match session.try_acquire(name).await {
                Ok(TryAcquire::Acquired(guard)) => guard,
                // Another worker has it, or the store is slow: try another job.
                Ok(TryAcquire::Busy { .. }) | Err(_) => continue,
            };
            // Finished by another worker since the candidates were read: nothing to do.
            let pending = client
                .lock()
                .await
                .query_opt(
                    &format!("SELECT 1 FROM {schema}.jobs WHERE id = $1 AND state = 'pending'"),
                    &[&id],
                )
                .await?;
            if pending.is_none() {
                let _ = guard.release().await;
                continue;
            }
            let cancel = guard.cancellation_token();
            // The work; a lost lease cancels it.
            tokio::select! {
                biased;
                () = cancel.cancelled() => {
                    eprintln!("{worker}: job {id} cancelled: lease lost");
                    continue;
                }
                () = tokio::time::sleep(work) => {}
            }
            let token = guard.token();
            let mut client = client.lock().await;
            // Checked against the clock: false at once after a pause past the deadline. The fence
            // covers what this cannot: a pause between here and the commit.
            if !guard.is_held() {
                eprintln!("{worker}: job {id} not completed: lease no longer held");
                continue;
            }
            let tx = client.transaction().await?;
            match fence.check(&tx, &format!("job:{id}"), token).await {
                Ok(()) => {
                    let updated = tx
                        .execute(
                            &format!(
                                "UPDATE {schema}.jobs SET state = 'done', done_by = $2, done_token = $3
                                 WHERE id = $1 AND state = 'pending'"
                            ),
                            &[&id, &worker, &(token.get() as i64)],
                        )
                        .await?;
                    tx.commit().await?;
                    if updated == 1 {
                        println!("{worker}: job {id} done with token {token}");
                    }
                }
                Err(FenceError::Stale { .. }) => {
                    drop(tx);
                    client
                        .execute(
                            &format!("INSERT INTO {schema}.refused VALUES ($1, $2, $3)"),
                            &[&id, &worker, &(token.get() as i64)],
                        )
                        .await?;
                    eprintln!("{worker}: job {id}: completion refused, a newer lease wrote");
                }
                Err(e) => return Err(e.into()),
            }
            drop(client);
            let _ = guard.release().await;
        }
    }
}
