//! Latency of the catalog's operations next to two one-statement floors, a read (`now_millis`, a
//! `SELECT` of the clock) and a write (`renew`, a one-row `UPDATE` and its commit), each run
//! sequentially on one handle, on tables of a prefix of its own that it drops afterwards.
//!
//! `cargo run -p leasehold-mysql --example catalog_latency [URL] [ROUNDS]` (default the local
//! MariaDB as root, 300 rounds).

use std::time::{Duration, Instant};

use leasehold::catalog::{CATALOG_RETENTION, Registration};
use leasehold::store::Acquisition;
use leasehold::{Catalog, HolderId, LeaseName, Store};
use leasehold_mysql::MySqlConfig;
use leasehold_mysql::mysql_async::prelude::Queryable;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".to_owned());
    let rounds: usize = args.next().map_or(Ok(300), |n| n.parse())?;
    let prefix = format!("lh_latency_{:08x}_", fastrand::u32(..));
    let store = MySqlConfig::new(&url)
        .table_prefix(&prefix)
        .notifications(false)
        .connect()
        .await?;
    let task = LeaseName::new("latency-task")?;
    let me = HolderId::new("latency-instance")?;
    let registration = Registration {
        task: &task,
        definition: "{\"schedule\":\"every 30s\",\"gated\":true}",
        instance: &me,
        about: "{\"version\":\"bench\"}",
        ttl: Duration::from_secs(60),
        forget_after: CATALOG_RETENTION,
    };
    // Ten other tasks with three instances each, so the listing has rows to join.
    for t in 0..10 {
        let other = LeaseName::new(format!("other-{t}"))?;
        for i in 0..3 {
            let who = HolderId::new(format!("instance-{i}"))?;
            store
                .register(&Registration {
                    task: &other,
                    instance: &who,
                    ..registration
                })
                .await?;
        }
    }

    let Acquisition::Acquired { token } =
        store.acquire(&task, &me, Duration::from_secs(60)).await?
    else {
        return Err("the lease is busy".into());
    };

    let mut version = None;
    let mut samples: [(&str, Vec<Duration>); 6] = [
        ("now_millis (read)", Vec::new()),
        ("renew (write)", Vec::new()),
        ("control", Vec::new()),
        ("set_control", Vec::new()),
        ("register", Vec::new()),
        ("tasks (11 tasks)", Vec::new()),
    ];
    for _ in 0..rounds {
        let started = Instant::now();
        store.now_millis().await?;
        samples[0].1.push(started.elapsed());
        let started = Instant::now();
        store
            .renew(&task, &me, token, Duration::from_secs(60))
            .await?;
        samples[1].1.push(started.elapsed());
        let started = Instant::now();
        store.control(&task).await?;
        samples[2].1.push(started.elapsed());
        let started = Instant::now();
        version = store.set_control(&task, version, "{}").await?;
        samples[3].1.push(started.elapsed());
        let started = Instant::now();
        store.register(&registration).await?;
        samples[4].1.push(started.elapsed());
        let started = Instant::now();
        store.tasks(CATALOG_RETENTION).await?;
        samples[5].1.push(started.elapsed());
    }
    println!("{rounds} rounds on {}", store.describe());
    println!("{:<20} {:>9} {:>9}", "operation", "p50 µs", "p99 µs");
    for (name, mut times) in samples {
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_micros();
        println!("{name:<20} {:>9} {:>9}", at(0.5), at(0.99));
    }

    drop(store);
    let mut conn = leasehold_mysql::mysql_async::Conn::new(
        leasehold_mysql::mysql_async::Opts::from_url(&url)?,
    )
    .await?;
    for table in [
        "leases",
        "slots",
        "history",
        "members",
        "tasks",
        "task_instances",
        "schema",
    ] {
        conn.query_drop(format!("DROP TABLE IF EXISTS `{prefix}{table}`"))
            .await?;
    }
    Ok(())
}
