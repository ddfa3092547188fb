//! The SQLite store, next to a one-row write transaction on the same file with the same
//! settings (WAL, the store's `synchronous` level and busy timeout), run the same way the store
//! runs its statements (on tokio's blocking pool, one connection).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use leasehold_sqlite::SqliteStore;
use leasehold_sqlite::rusqlite::{self, Connection, TransactionBehavior};

use crate::common::{self, HeldPlan, OpBench, OpRounds};
use crate::report::{Kind, OpRow, Report, Target};
use crate::stats::{Figure, Recorder, Round};
use crate::{Plan, StoreKind};

const FLOOR: &str = "write tx";

pub(crate) async fn bench(plan: &Plan, report: &mut Report) -> anyhow::Result<()> {
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

async fn bench_at(plan: &Plan, report: &mut Report, path: &Path) -> anyhow::Result<()> {
    let url = format!("sqlite:{}", path.display());
    let store = leasehold_sqlite::connect(&url)
        .await
        .with_context(|| format!("open {url}"))?;
    // A second handle, as a second process would have: its own connection and release poller.
    let waiter = leasehold_sqlite::connect(&url)
        .await
        .with_context(|| format!("open {url}"))?;
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
    let store_name = "sqlite".to_owned();
    report
        .ops_rows
        .push(OpRow::floor(&store_name, FLOOR, &floors, None));
    let acquire = Figure::of(&rounds.acquire);
    for (op, r, target) in [
        (
            "acquire",
            &rounds.acquire,
            Some(Target::new("p50 ≤ 0.5 ms", acquire.p50_us.median <= 500.0)),
        ),
        ("renew", &rounds.renew, None),
        ("release", &rounds.release, None),
        ("acquire+release", &rounds.acquire_release, None),
    ] {
        report.ops_rows.push(OpRow {
            store: store_name.clone(),
            op: op.to_owned(),
            kind: Kind::Lease,
            figure: Figure::of(r),
            ratio: common::ratio(r, &floors, FLOOR),
            target,
        });
    }
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

    report
        .held_rows
        .push(common::held_renewal(&store, &HeldPlan::of(plan, "sqlite", &prefix, 16)).await?);
    report.takeover_rows.push(
        common::graceful_takeover(
            "sqlite",
            &store,
            &waiter,
            &prefix,
            plan.graceful_trials,
            None,
        )
        .await?,
    );
    report.takeover_rows.push(
        common::expiry_takeover(
            "sqlite",
            &store,
            &waiter,
            &prefix,
            plan.expiry_trials,
            plan.expiry_ttl,
        )
        .await?,
    );
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
    fn open(path: &Path, store: &SqliteStore) -> anyhow::Result<Self> {
        let config = store.config();
        let conn = Connection::open(path).with_context(|| format!("open {}", path.display()))?;
        conn.busy_timeout(config.busy_timeout)?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        anyhow::ensure!(mode.eq_ignore_ascii_case("wal"), "journal mode {mode}");
        conn.pragma_update(
            None,
            "synchronous",
            if config.durable { "FULL" } else { "NORMAL" },
        )?;
        Ok(Self(Arc::new(Mutex::new(conn))))
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let conn = self.0.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn)
        })
        .await?;
        Ok(result?)
    }

    async fn exec(&self, sql: &'static str) -> anyhow::Result<()> {
        self.with(move |c| c.execute_batch(sql)).await
    }

    async fn floor_round(&self, ops: usize) -> anyhow::Result<Round> {
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
