//! The SQLite store, next to a one-row write transaction on the same file with the same
//! settings (WAL, the store's `synchronous` level and busy timeout), run the same way the store
//! runs its statements (on tokio's blocking pool, one connection).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use leasehold_sqlite::SqliteStore;
use leasehold_sqlite::rusqlite::{self, Connection, TransactionBehavior};

use crate::common::{self, HeldPlan, OpBench, OpRounds, OpTargets};
use crate::error::{BenchError, Result};
use crate::plan::{Plan, StoreKind};
use crate::report::{Report, Target};
use crate::stats::{Figure, Recorder, Round};

const FLOOR: &str = "write tx";

pub(crate) async fn bench(plan: &Plan, report: &mut Report) -> Result<()> {
    let path = plan
        .sqlite_dir
        .join(format!("leasehold-bench-{}.db", plan.run_id));
    let result = bench_at(plan, report, &path).await;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
    result
}

async fn bench_at(plan: &Plan, report: &mut Report, path: &Path) -> Result<()> {
    let url = format!("sqlite:{}", path.display());
    let connect = || async {
        leasehold_sqlite::connect(&url)
            .await
            .map_err(|e| BenchError::connect(&url, e))
    };
    let store = connect().await?;
    // A second handle, as a second process would have: its own connection and release poller.
    let waiter = connect().await?;
    let floor = Conn::open(path, &store)?;
    floor
        .exec(
            "CREATE TABLE IF NOT EXISTS bench_floor (id INTEGER PRIMARY KEY, v INTEGER NOT NULL); \
                INSERT OR IGNORE INTO bench_floor (id, v) VALUES (1, 0);",
        )
        .await?;

    let prefix = plan.prefix(StoreKind::Sqlite);
    let ops = OpBench::new(store.clone(), &prefix, plan.ops)?;
    ops.warm_up().await?;
    floor.floor_round(plan.ops.min(200)).await?;
    let (mut rounds, mut floors) = (OpRounds::default(), Vec::new());
    for _ in 0..plan.rounds {
        floors.push(floor.floor_round(plan.ops).await?);
        ops.round(&mut rounds).await?;
    }
    report
        .operations
        .extend(common::floor_rows("sqlite", &[(FLOOR, &floors)]));
    let acquire = Figure::of(&rounds.acquire).p50_us.median;
    let targets = OpTargets {
        acquire: Some(Target::new("p50 ≤ 0.5 ms", acquire <= 500.0)),
        ..OpTargets::default()
    };
    report
        .operations
        .extend(rounds.rows("sqlite", Some((&floors, FLOOR)), targets));
    report.notes.push(format!(
        "sqlite: floor = BEGIN IMMEDIATE; one-row UPDATE; COMMIT on the store's file (WAL, \
         synchronous={}, on tokio's blocking pool like the store); file {}",
        if store.config().durable {
            "FULL"
        } else {
            "NORMAL"
        },
        path.display()
    ));

    let held = HeldPlan::of(plan, "sqlite", &prefix, 16);
    common::held_and_takeovers(plan, report, &held, &store, &waiter, None).await?;
    report.notes.push(format!(
        "sqlite graceful takeover: the waiter's handle learns of another handle's release by \
         polling PRAGMA data_version every {} ms (the store's notify_poll_interval)",
        store.config().notify_poll_interval.as_millis()
    ));
    Ok(())
}

/// A connection of our own to the store's file, with the store's settings.
#[derive(Clone)]
struct Conn(Arc<Mutex<Connection>>);

impl Conn {
    fn open(path: &Path, store: &SqliteStore) -> Result<Self> {
        let config = store.config();
        let what = || format!("open {} for the floor", path.display());
        let conn = Connection::open(path).map_err(|e| BenchError::floor(what(), e))?;
        let mode = (|| {
            conn.busy_timeout(config.busy_timeout)?;
            let mode: String =
                conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
            conn.pragma_update(
                None,
                "synchronous",
                if config.durable { "FULL" } else { "NORMAL" },
            )?;
            Ok::<_, rusqlite::Error>(mode)
        })()
        .map_err(|e| BenchError::floor(what(), e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(BenchError::Unexpected(format!(
                "{}: journal mode {mode}, not WAL",
                what()
            )));
        }
        Ok(Self(Arc::new(Mutex::new(conn))))
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(|e| BenchError::floor("the floor's blocking task", e))?
        .map_err(|e| BenchError::floor("the floor's statement", e))
    }

    async fn exec(&self, sql: &'static str) -> Result<()> {
        self.with(move |c| c.execute_batch(sql)).await
    }

    async fn floor_round(&self, ops: usize) -> Result<Round> {
        let mut rec = Recorder::new(ops);
        for _ in 0..ops {
            rec.start();
            self.with(|c| {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                tx.prepare_cached("UPDATE bench_floor SET v = v + 1 WHERE id = 1")?
                    .execute([])?;
                tx.commit()
            })
            .await?;
            rec.stop();
        }
        Ok(rec.finish())
    }
}
