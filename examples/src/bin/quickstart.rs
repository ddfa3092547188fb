//! The README's library example: one sweep, on one instance per tick.

use leasehold::{LeaseConfig, LeaseName, Schedule, Scheduler, StoreDownPolicy, Task, TaskContext};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The embedded store: one file, nothing to wait for. A server store returns at once and
    // connects in the background, so the service starts while its store is down:
    // leasehold_redis::connect_lazy("redis://cache:6379")? (or leasehold_postgres, _etcd).
    let store = leasehold_sqlite::connect("sqlite:leases.db").await?;
    let expire = Task::new(
        LeaseName::new("expire-gigs")?,
        Schedule::every(Duration::from_secs(30))?,
        |ctx: TaskContext| async move {
            // Runs on one instance per tick. ctx.token fences writes; ctx.cancel fires on loss.
            println!("slot {:?}, token {:?}", ctx.slot, ctx.token);
            Ok::<_, std::io::Error>(())
        },
    );
    let scheduler = Scheduler::new(store)
        .leader_group(LeaseName::new("sweepers")?)
        .lease_config(LeaseConfig::new(Duration::from_secs(15)))
        .on_store_down(StoreDownPolicy::FailClosed)
        .task(expire)
        .start(async {
            let _ = tokio::signal::ctrl_c().await;
        })?;
    scheduler.wait().await; // on Ctrl-C: drain runs, release, hand over
    Ok(())
}
