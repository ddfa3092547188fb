#![doc = include_str!("../README.md")]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod bounded;
mod common;
mod error;
mod etcd;
mod memory;
mod mysql;
mod plan;
mod postgres;
mod redis;
mod report;
mod sidecar;
mod spread;
mod sql;
mod sqlite;
mod stats;

pub use crate::error::BenchError;
pub use crate::plan::{BenchArgs, StoreKind};

use crate::common::HeldBy;
use crate::error::Result;
use crate::plan::Plan;
use crate::report::{Failure, Report, Target};

/// Runs the benchmarks in `args` and prints the report (tables, or JSON with `--json`).
///
/// Returns the exit status: 0 when every store asked for was measured (missed targets are
/// reported, not failures), 1 when a store could not be measured (its error is in the report).
pub async fn run(args: BenchArgs) -> Result<u8> {
    let plan = Plan::new(&args)?;
    if args.bounded_state {
        return bounded_state(&args, &plan).await;
    }
    let report = bench(&plan).await?;
    if args.json {
        let json = report
            .json()
            .and_then(|json| serde_json::to_string_pretty(&json))
            .map_err(BenchError::Json)?;
        println!("{json}");
    } else {
        print!("{}", report.table());
    }
    Ok(if report.failures.is_empty() { 0 } else { 1 })
}

/// The bounded-state pass, its Redis keys deleted afterwards: 0 once it ran (a missed target
/// is reported, not a failure).
async fn bounded_state(args: &BenchArgs, plan: &Plan) -> Result<u8> {
    let q = plan.quick;
    let bounded_plan = bounded::BoundedPlan {
        requests: args
            .bounded_requests
            .unwrap_or(if q { 20_000 } else { 1_000_000 }),
        names: args
            .bounded_names
            .unwrap_or(if q { 2_000 } else { 100_000 }),
        redis_url: plan.redis_url.clone(),
        key_prefix: format!("leasehold-bench-{}", plan.run_id),
        prefix: format!("bench-{}", plan.run_id),
    };
    let result = bounded::bounded(&bounded_plan).await;
    let cleaned = redis::delete_keys(&plan.redis_url, &bounded_plan.key_prefix).await;
    let measured = result?;
    cleaned?;
    print!("{}", measured.table());
    Ok(0)
}

/// Measures everything in `plan`.
pub(crate) async fn bench(plan: &Plan) -> Result<Report> {
    let mut report = Report {
        run_id: plan.run_id.clone(),
        rounds: plan.rounds,
        ops: plan.ops,
        quick: plan.quick,
        ..Report::default()
    };
    // First, while the heap is small and nothing else runs. Each measurement is kept alive
    // until the last is done, so none lands in memory another freed.
    let prefix = plan.prefix(StoreKind::Memory);
    let mut kept = Vec::new();
    let mut store_record = 0.0;
    for how in [HeldBy::StoreOnly, HeldBy::Session, HeldBy::Lease] {
        let (mut row, keep) = common::memory_per_lease(&prefix, plan.memory_leases, how).await?;
        kept.push(keep);
        if how == HeldBy::StoreOnly {
            store_record = row.bytes_per_lease;
        } else {
            let without = (row.bytes_per_lease - store_record).max(0.0);
            row.without_store = Some(without);
            if how == HeldBy::Session {
                row.target = Some(Target::new(
                    "≤ 500 B without the store's record",
                    without <= 500.0,
                ));
            }
        }
        report.memory.push(row);
    }
    drop(kept);
    report.notes.push(format!(
        "memory per held lease: resident set size (/proc/self/statm) before and after taking \
         {} leases on a fresh memory store, divided by the count. Store records only: \
         Store::acquire, no guards (with Redis or PostgreSQL these records live in the server); \
         LeaseSession: LeaseSession::try_acquire, one renewer for all; Lease: \
         Lease::try_acquire, a renewer task per guard. The target is on the session's figure \
         less the store's record",
        plan.memory_leases
    ));
    report.placement = Some(spread::placement(&prefix, 100, 10).await?);
    report.notes.push(
        "tasks spread over instances: 10 schedulers in this process on one memory store, each \
         with the same 100 tasks and Scheduler::spread over one group (random holder ids, so \
         the split differs per run); counted once every instance sees 10 members and each task \
         has one owner. The takeover after a SIGKILL of an instance needs separate processes: \
         `spread bench` in examples/ (docs/spread.md)"
            .to_owned(),
    );
    for &store in &plan.stores {
        let result = match store {
            StoreKind::Memory => memory::bench(plan, &mut report).await,
            StoreKind::Sqlite => sqlite::bench(plan, &mut report).await,
            StoreKind::Redis => redis::bench(plan, &mut report, StoreKind::Redis).await,
            StoreKind::Valkey => redis::bench(plan, &mut report, StoreKind::Valkey).await,
            StoreKind::Postgres => postgres::bench(plan, &mut report).await,
            StoreKind::Etcd => etcd::bench(plan, &mut report).await,
            StoreKind::Mysql => mysql::bench(plan, &mut report).await,
        };
        if let Err(e) = result {
            report.failures.push(Failure {
                store: store.name().to_owned(),
                error: e.chain(),
            });
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn quick_plan(stores: Vec<StoreKind>) -> Plan {
        let mut plan = Plan::new(&quick_args(stores)).unwrap();
        plan.memory_leases = 2000;
        plan
    }

    fn quick_args(stores: Vec<StoreKind>) -> BenchArgs {
        BenchArgs {
            stores,
            redis_url: String::new(),
            valkey_url: String::new(),
            postgres_url: String::new(),
            etcd_url: "etcd://127.0.0.1:2379".to_owned(),
            mysql_url: String::new(),
            sqlite_dir: None,
            sidecar_requests: None,
            bounded_state: false,
            bounded_requests: None,
            bounded_names: None,
            rounds: None,
            ops: Some(50),
            held: None,
            json: false,
            quick: true,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_store_smoke_run() {
        let mut plan = quick_plan(vec![StoreKind::Memory]);
        plan.held = 2500;
        // Long enough that a loaded debug build renews 2,500 leases in time (at 1 s, one run
        // beside four compiles lost one while it was watched); the figures are not checked here.
        plan.held_ttl = Duration::from_secs(3);
        let report = bench(&plan).await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let ops: Vec<&str> = report.operations.iter().map(|r| r.op.as_str()).collect();
        assert_eq!(ops, ["acquire", "renew", "release", "acquire+release"]);
        for r in &report.operations {
            assert_eq!(r.figure.rounds, 2);
            assert_eq!(r.figure.ops_per_round, 50);
            assert!(r.figure.ops_per_sec.median > 0.0);
            assert!(r.figure.p50_us.median <= r.figure.p99_us.median);
        }
        // 2,500 leases in one session: three renew_many calls per pass, a pass per interval (one
        // may fall past the window on a loaded machine).
        let held = &report.held_renewal[0];
        assert_eq!(held.held, 2500);
        assert!(held.target.pass, "{held:?}");
        assert!((1.9..=3.0).contains(&held.calls_per_interval), "{held:?}");
        assert!(held.leases_per_call > 800.0, "{held:?}");
        assert_eq!(held.renew_many_leases, 1000);
        let paths: Vec<&str> = report.takeover.iter().map(|r| r.path).collect();
        assert_eq!(paths, ["graceful", "expiry"]);
        let expiry = &report.takeover[1];
        assert!(expiry.max_ms < 1000.0, "{expiry:?}");
        let placement = report.placement.as_ref().unwrap();
        assert_eq!((placement.tasks, placement.instances), (100, 10));
        assert!(placement.min <= 10 && placement.max >= 10, "{placement:?}");
        assert!(placement.max as f64 <= 2.0 * placement.mean || !placement.target.pass);
        assert!(
            report.table().contains("tasks spread over instances"),
            "{}",
            report.table()
        );
        assert!(report.json().unwrap()["placement"]["max"].is_number());
        assert_eq!(report.memory.len(), 3);
        assert!(report.memory.iter().all(|m| m.rss_after_bytes > 0));
        // The session's row carries the ≤ 500 B target, on its figure less the store's record.
        let [store, session, lease] = &report.memory[..] else {
            unreachable!()
        };
        assert!(store.without_store.is_none() && store.target.is_none());
        assert!(session.target.is_some() && lease.target.is_none());
        let without = session.without_store.unwrap();
        assert!(without < session.bytes_per_lease || store.bytes_per_lease == 0.0);

        let table = report.table();
        assert!(table.contains("acquire+release"), "{table}");
        assert!(table.contains("memory per held lease"), "{table}");
        let json = report.json().unwrap();
        assert_eq!(json["operations"].as_array().unwrap().len(), 4);
        assert_eq!(json["takeover"].as_array().unwrap().len(), 2);
        assert!(json["memory"][1]["bytes_per_lease"].is_number());
        assert_eq!(json["memory"][1]["held_by"], "LeaseSession");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_store_smoke_run() {
        use report::Kind::{self, Floor, Lease};

        let cluster = leasehold_etcd::testing::EtcdCluster::start(1);
        let mut plan = quick_plan(vec![StoreKind::Etcd]);
        plan.etcd_url = cluster.url();
        plan.held = 50;
        plan.held_ttl = Duration::from_millis(1500);
        let report = bench(&plan).await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let ops: Vec<(&str, Kind)> = report
            .operations
            .iter()
            .map(|r| (r.op.as_str(), r.kind))
            .collect();
        assert_eq!(
            ops,
            [
                ("put", Floor),
                ("txn", Floor),
                ("range", Floor),
                ("acquire", Lease),
                ("renew", Lease),
                ("release", Lease),
                ("acquire+release", Lease)
            ]
        );
        for r in &report.operations {
            assert_eq!(r.figure.rounds, 2);
            assert_eq!(r.figure.ops_per_round, 50);
            assert!(r.figure.ops_per_sec.median > 0.0, "{r:?}");
            assert!(r.figure.p50_us.median <= r.figure.p99_us.median, "{r:?}");
            // Every row but the put is compared with the put.
            assert_eq!(r.ratio.is_some(), r.op != "put", "{r:?}");
        }
        // Three commits against one.
        let pair = report.operations[6].ratio.as_ref().unwrap();
        assert!(pair.p50 > 1.5, "{pair:?}");
        let targets: Vec<String> = report
            .targets()
            .into_iter()
            .map(|(f, _)| f)
            .filter(|f| f.starts_with("etcd"))
            .collect();
        assert_eq!(
            targets,
            [
                "etcd acquire",
                "etcd renew",
                "etcd renew 50 held",
                "etcd graceful takeover",
                "etcd expiry takeover"
            ]
        );
        // One renew_many call per interval, one transaction per lease: whether a pass fits in
        // the 500 ms interval depends on the machine's commits, so the target is not asserted,
        // only that the session kept renewing every lease.
        let held = &report.held_renewal[0];
        assert_eq!(held.held, 50);
        assert!(held.passes >= 2.0, "{held:?}");
        assert!((0.6..=1.1).contains(&held.calls_per_interval), "{held:?}");
        assert!(held.leases_per_call > 45.0, "{held:?}");
        let paths: Vec<&str> = report.takeover.iter().map(|r| r.path).collect();
        assert_eq!(paths, ["graceful", "expiry"]);
        assert!(report.takeover.iter().all(|r| r.max_ms < 1000.0));
        let note = report
            .notes
            .iter()
            .find(|n| n.starts_with("etcd: "))
            .unwrap();
        assert!(note.contains("1 members, the client's member"), "{note}");
        assert!(note.contains("is the leader"), "{note}");
        // Nothing of the run is left in the cluster.
        let left = cluster.etcdctl(None, &["get", "", "--prefix", "--keys-only"]);
        assert_eq!(left.trim(), "", "keys left: {left}");
    }

    /// A quick run over `url`, which names a Sentinel group or a cluster: the Redis rows are
    /// there, EXISTS (cluster) or PING (Sentinel) as the floor, and rslock is left out with a
    /// note.
    async fn ha_smoke_run(url: String, floor: &str) -> Report {
        let mut plan = quick_plan(vec![StoreKind::Redis]);
        plan.redis_url = url;
        plan.held = 50;
        plan.held_ttl = Duration::from_millis(1500);
        let report = bench(&plan).await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let ops: Vec<&str> = report.operations.iter().map(|r| r.op.as_str()).collect();
        assert_eq!(
            ops,
            [
                floor,
                "SET",
                "EVALSHA no-op",
                "acquire",
                "renew",
                "release",
                "acquire+release"
            ]
        );
        assert!(report.operations.iter().all(|r| r.store == "redis"));
        for r in &report.operations {
            assert_eq!(r.figure.ops_per_round, 50, "{r:?}");
            assert!(r.figure.ops_per_sec.median > 0.0, "{r:?}");
        }
        assert_eq!(report.held_renewal[0].held, 50);
        let paths: Vec<&str> = report.takeover.iter().map(|r| r.path).collect();
        assert_eq!(paths, ["graceful", "expiry"]);
        assert!(report.notes.iter().any(|n| n == redis::RSLOCK_SKIPPED));
        // The sidecar's rows, and its memory pass over the quick run's 20,000 requests.
        let requests: Vec<(&str, usize)> = report
            .sidecar
            .iter()
            .map(|r| (r.op.as_str(), r.clients))
            .collect();
        assert_eq!(requests.len(), 10, "{requests:?}");
        assert_eq!(requests[1], ("tick (gated decision)", 1));
        let memory = report.sidecar_memory.as_ref().expect("a memory pass");
        assert!(memory.requests >= 20_000, "{memory:?}");
        assert!(memory.rss_before_bytes > 1 << 20, "{memory:?}");
        // The row list above has no rslock row; the table says why.
        let table = report.table();
        assert!(table.contains(redis::RSLOCK_SKIPPED), "{table}");
        assert!(table.contains("sidecar resident set over 20,"), "{table}");
        report
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_sentinel_smoke_run() {
        let group = leasehold_testkit::ha::SentinelGroup::start();
        let report = ha_smoke_run(group.url(), "PING").await;
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.starts_with("redis: server time per acquire")),
            "{:?}",
            report.notes
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cluster_smoke_run() {
        let cluster = leasehold_testkit::ha::Cluster::start();
        ha_smoke_run(cluster.url(), "EXISTS").await;
        // Nothing of the run is left on any primary.
        for &port in &cluster.ports {
            let client =
                leasehold_redis::redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            let keys: Vec<String> = leasehold_redis::redis::cmd("KEYS")
                .arg("leasehold-bench-*")
                .query_async(&mut c)
                .await
                .unwrap();
            assert!(keys.is_empty(), "left on {port}: {keys:?}");
        }
    }

    /// A quick run of one SQL store: the floors and the lease rows, the held-lease and takeover
    /// rows, and its note naming `setting` of the server.
    async fn sql_smoke_run(plan: &Plan, store: &str, setting: &str) {
        use report::Kind::{self, Floor, Lease};

        let report = bench(plan).await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let ops: Vec<(&str, Kind)> = report
            .operations
            .iter()
            .map(|r| (r.op.as_str(), r.kind))
            .collect();
        assert_eq!(
            ops,
            [
                ("UPDATE", Floor),
                ("SELECT 1", Floor),
                ("acquire", Lease),
                ("renew", Lease),
                ("release", Lease),
                ("acquire+release", Lease)
            ]
        );
        assert!(report.operations.iter().all(|r| r.store == store));
        let targets: Vec<String> = report.targets().into_iter().map(|(f, _)| f).collect();
        assert!(targets.contains(&format!("{store} acquire")), "{targets:?}");
        assert_eq!(report.held_renewal[0].held, plan.held);
        let paths: Vec<&str> = report.takeover.iter().map(|r| r.path).collect();
        assert_eq!(paths, ["graceful", "expiry"]);
        assert!(report.takeover.iter().all(|r| r.max_ms < 1000.0));
        let note = report
            .notes
            .iter()
            .find(|n| n.starts_with(&format!("{store}: floors = a one-row UPDATE")))
            .unwrap();
        assert!(note.contains(setting), "{note}");
    }

    /// A quick run on the local MariaDB (`LEASEHOLD_TEST_MYSQL_URL`), and nothing of the run left
    /// in the database.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql_store_smoke_run() {
        use leasehold_mysql::mysql_async::prelude::Queryable;

        let url = std::env::var("LEASEHOLD_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
        let mut plan = quick_plan(vec![StoreKind::Mysql]);
        plan.mysql_url = url.clone();
        plan.held = 50;
        plan.held_ttl = Duration::from_millis(1500);
        sql_smoke_run(&plan, "mysql", "innodb_flush_log_at_trx_commit=").await;
        let opts = leasehold_mysql::mysql_async::Opts::from_url(&url).unwrap();
        let mut conn = leasehold_mysql::mysql_async::Conn::new(opts).await.unwrap();
        let left: Vec<String> = conn
            .exec(
                "SELECT TABLE_NAME FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE CONCAT(?, '%')",
                (format!("lhbench\\_{}", plan.run_id),),
            )
            .await
            .unwrap();
        assert!(left.is_empty(), "tables left: {left:?}");
    }

    /// A quick run on the local PostgreSQL (`LEASEHOLD_TEST_POSTGRES_URL`), and the run's schema
    /// dropped afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_store_smoke_run() {
        let url = std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let mut plan = quick_plan(vec![StoreKind::Postgres]);
        plan.postgres_url = url.clone();
        plan.held = 50;
        plan.held_ttl = Duration::from_millis(1500);
        sql_smoke_run(&plan, "postgres", "synchronous_commit=").await;
        let store = leasehold_postgres::PgConfig::new(url)
            .notifications(false)
            .connect()
            .await
            .unwrap();
        let client = store.pool().get().await.unwrap();
        let schema = format!("leasehold_bench_{}", plan.run_id);
        let left = client
            .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
            .await
            .unwrap();
        assert!(left.is_none(), "schema {schema} left");
    }

    #[tokio::test]
    async fn an_etcd_that_does_not_answer_is_reported_not_measured() {
        let mut plan = quick_plan(vec![StoreKind::Etcd]);
        // Port 1 on loopback: nothing listens there.
        plan.etcd_url = "etcd://127.0.0.1:1/?connect_timeout_ms=200".to_owned();
        let report = bench(&plan).await.unwrap();
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        let Failure { store, error } = &report.failures[0];
        assert_eq!(store, "etcd");
        assert!(
            error.starts_with("connect to etcd://127.0.0.1:1"),
            "{error}"
        );
        assert!(report.operations.is_empty());
        plan.etcd_url = "etcd://root:secret@127.0.0.1:1".to_owned();
        let report = bench(&plan).await.unwrap();
        let error = &report.failures[0].error;
        assert!(error.contains("without a user"), "{error}");
        assert!(!error.contains("secret"), "{error}");
        // Given as a flag, the run refuses it before it measures anything.
        let args = BenchArgs {
            etcd_url: plan.etcd_url.clone(),
            ..quick_args(vec![StoreKind::Memory, StoreKind::Etcd])
        };
        let refused = Plan::new(&args).map(|_| ()).unwrap_err();
        assert!(
            matches!(&refused, BenchError::Usage(m) if m.contains("without a user")),
            "{refused:?}"
        );
        assert!(!refused.to_string().contains("secret"), "{refused}");
    }

    #[test]
    fn quick_defaults_and_unique_run_ids() {
        let plan = quick_plan(vec![StoreKind::Redis, StoreKind::Redis]);
        assert_eq!(plan.stores, [StoreKind::Redis]);
        assert_eq!(plan.rounds, 2);
        assert_eq!(plan.held, 1000);
        assert!(plan.prefix(StoreKind::Redis).starts_with("bench-"));
        leasehold::LeaseName::new(format!("{}/op/1", plan.prefix(StoreKind::Redis))).unwrap();
    }
}
