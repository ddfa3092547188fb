//! What the SQL stores' benches share: the store's operations timed in rounds between two
//! floors run through the store's own pool, a one-row `UPDATE` of a scratch table (a commit,
//! like every store operation) and `SELECT 1` (a round trip, no commit).

use leasehold::{Purge, Store};

use crate::common::{self, OpBench, OpRounds, OpTargets};
use crate::error::Result;
use crate::plan::Plan;
use crate::report::Report;
use crate::stats::{Recorder, Round};

/// The floor every operation row of a SQL store is compared with.
const UPDATE: &str = "UPDATE";
const SELECT: &str = "SELECT 1";

/// A SQL store that runs a floor statement exactly as it runs one of its own: a connection
/// from its pool, the statement from the connection's prepared-statement cache, one round
/// trip, in autocommit.
pub(crate) trait FloorStore: Store + Purge + Clone {
    /// Runs `sql` once, the connection back in the pool when it returns.
    fn run_floor(&self, sql: &str) -> impl Future<Output = Result<()>> + Send;
}

/// How one SQL store's rounds are labelled and judged.
pub(crate) struct SqlRounds<'a> {
    /// The store's name in the report (`postgres`, `mysql`).
    pub(crate) store: &'a str,
    /// Its driver and pool, for the note.
    pub(crate) pool: &'a str,
    /// The note's account of the store's own statements.
    pub(crate) statements: String,
    /// Acquire's target: its p50 within this factor of the `UPDATE` floor's.
    pub(crate) acquire_factor: f64,
}

/// Warms up, then times `plan.rounds` rounds of each floor and of the store's operations on
/// lease names under `names`, and adds their rows and the store's note (with `settings`, the
/// server's, read once the rounds are over) to `report`. `update` is the one-row `UPDATE`.
pub(crate) async fn rounds<S: FloorStore>(
    plan: &Plan,
    report: &mut Report,
    store: &S,
    names: &str,
    update: &str,
    how: SqlRounds<'_>,
    settings: impl AsyncFnOnce() -> Result<String>,
) -> Result<()> {
    let ops = OpBench::new(store.clone(), names, plan.ops)?;
    ops.warm_up().await?;
    round(store, update, plan.ops.min(200)).await?;
    round(store, SELECT, plan.ops.min(200)).await?;
    let (mut rounds, mut floors, mut selects) = (OpRounds::default(), Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        floors.push(round(store, update, plan.ops).await?);
        selects.push(round(store, SELECT, plan.ops).await?);
        ops.round(&mut rounds).await?;
    }
    report.operations.extend(common::floor_rows(
        how.store,
        &[(UPDATE, &floors), (SELECT, &selects)],
    ));
    let floor = (&floors[..], UPDATE);
    let targets = OpTargets {
        acquire: Some(common::p50_within(
            &rounds.acquire,
            how.acquire_factor,
            floor,
        )),
        ..OpTargets::default()
    };
    report
        .operations
        .extend(rounds.rows(how.store, Some(floor), targets));
    let settings = settings().await?;
    report.notes.push(format!(
        "{}: floors = a one-row UPDATE of a scratch table (a commit, like every store \
         operation) and SELECT 1 (a round trip, no commit), each a cached prepared statement on \
         a connection from the store's own pool ({}), in autocommit, as the store runs its \
         statements; {}; server {settings}",
        how.store, how.pool, how.statements
    ));
    Ok(())
}

/// `ops` runs of the floor statement `sql`, each timed from taking the connection to giving
/// it back.
async fn round<S: FloorStore>(store: &S, sql: &str, ops: usize) -> Result<Round> {
    let mut rec = Recorder::new(ops);
    for _ in 0..ops {
        rec.start();
        store.run_floor(sql).await?;
        rec.stop();
    }
    Ok(rec.finish())
}
