//! Placement: tasks spread over live instances (`Scheduler::spread`), in one process on the
//! memory store. Measures how many of the tasks each instance owns once every instance sees
//! every other; the takeover after a SIGKILL needs separate processes and is measured by the
//! examples' `spread bench` (docs/spread.md).

use std::time::{Duration, Instant};

use leasehold::{
    HolderId, LeaseConfig, LeaseName, MemoryStore, Schedule, Scheduler, SchedulerHandle, Task,
    TaskContext,
};

use crate::error::{BenchError, Result};
use crate::report::{PlacementRow, Target};

/// Starts `instances` schedulers spreading `tasks` tasks over one group, waits until each sees
/// all the others, and counts the tasks each owns.
pub(crate) async fn placement(
    prefix: &str,
    tasks: usize,
    instances: usize,
) -> Result<PlacementRow> {
    let store = MemoryStore::new();
    let name =
        |n: String| LeaseName::new(&n).map_err(|e| BenchError::lease(format!("lease name {n}"), e));
    let group = name(format!("{prefix}/spread-group"))?;
    let mut handles: Vec<SchedulerHandle> = Vec::with_capacity(instances);
    for _ in 0..instances {
        let mut scheduler = Scheduler::new(store.clone())
            .holder(HolderId::generate())
            .spread(group.clone())
            .lease_config(LeaseConfig::new(Duration::from_secs(3)));
        for t in 0..tasks {
            let name = name(format!("{prefix}/spread-task/{t}"))?;
            let job = |_: TaskContext| async { Ok::<(), std::io::Error>(()) };
            scheduler = scheduler.task(Task::new(
                name,
                Schedule::every(Duration::from_secs(60))
                    .map_err(|e| BenchError::lease("schedule", e))?,
                job,
            ));
        }
        let handle = scheduler
            .start(std::future::pending())
            .map_err(|e| BenchError::lease("start a scheduler", e))?;
        handles.push(handle);
    }
    let started = Instant::now();
    let owned = loop {
        let statuses: Vec<_> = handles.iter().map(SchedulerHandle::status).collect();
        let settled = statuses
            .iter()
            .all(|s| s.members.as_ref().is_some_and(|m| m.len() == instances));
        let owned: Vec<usize> = statuses
            .iter()
            .map(|s| s.tasks.iter().filter(|t| t.owned == Some(true)).count())
            .collect();
        if settled && owned.iter().sum::<usize>() == tasks {
            break owned;
        }
        if started.elapsed() >= Duration::from_secs(20) {
            return Err(BenchError::Unexpected(format!(
                "placement: the {instances} instances did not settle on one owner per task \
                 within 20 s (owned: {owned:?})"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let settled_in = started.elapsed();
    for handle in &handles {
        handle.shutdown().await;
    }
    let (min, max) = (
        owned.iter().copied().min().unwrap_or(0),
        owned.iter().copied().max().unwrap_or(0),
    );
    let mean = tasks as f64 / instances as f64;
    Ok(PlacementRow {
        tasks,
        instances,
        min,
        max,
        mean,
        settled_in,
        target: Target::new("max ≤ 2 × mean", max as f64 <= 2.0 * mean),
    })
}
