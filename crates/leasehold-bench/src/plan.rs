//! What a bench run is asked for (the flags of `leasehold bench`) and the plan it runs, with
//! every default filled in and every flag checked.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_etcd::EtcdConfig;

use crate::error::{BenchError, Result};

/// A store `leasehold bench` can measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum StoreKind {
    /// The embedded SQLite store (a file in `--sqlite-dir`).
    Sqlite,
    /// The Redis store at `--redis-url`.
    Redis,
    /// The PostgreSQL store at `--postgres-url`.
    Postgres,
    /// The in-process memory store: the library's own cost, without a network or a disk.
    Memory,
    /// The etcd cluster at `--etcd-url`.
    Etcd,
    /// The MySQL or MariaDB database at `--mysql-url`.
    Mysql,
    /// The Redis store on the Valkey server at `--valkey-url` (`scripts/valkey.sh` starts
    /// Valkey 9 there), where it renews and releases with native commands.
    Valkey,
}

impl StoreKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Redis => "redis",
            Self::Postgres => "postgres",
            Self::Memory => "memory",
            Self::Etcd => "etcd",
            Self::Mysql => "mysql",
            Self::Valkey => "valkey",
        }
    }
}

/// `leasehold bench`: latency and throughput of acquire, renew, release and handoff per store,
/// next to the store's own floor measured in the same run.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Stores to measure, comma-separated (sqlite, redis, postgres, memory, etcd, mysql,
    /// valkey).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,redis,postgres")]
    pub stores: Vec<StoreKind>,
    /// The Redis server to measure (keys use a per-run prefix and are deleted afterwards).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// The Valkey server to measure the Redis store on (`bash scripts/valkey.sh` starts Valkey 9
    /// on this default; keys as for --redis-url).
    #[arg(long, default_value = "redis://127.0.0.1:6391")]
    pub valkey_url: String,
    /// The PostgreSQL database to measure (the store's tables go in a per-run schema, dropped
    /// afterwards; the role must be allowed to create a schema).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres_url: String,
    /// The etcd cluster to measure (keys under a per-run prefix, deleted afterwards); the
    /// floors need a plain `etcd://` URL without a user.
    #[arg(long, default_value = "etcd://127.0.0.1:2379")]
    pub etcd_url: String,
    /// The MySQL or MariaDB database to measure (the store's tables get a per-run prefix and
    /// are dropped afterwards; the user must be allowed to create tables).
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306/test")]
    pub mysql_url: String,
    /// Directory for the SQLite database file, created per run and deleted afterwards
    /// [default: the system temporary directory].
    #[arg(long, value_name = "DIR")]
    pub sqlite_dir: Option<PathBuf>,
    /// Rounds per figure; the median round is reported with the min–max [default: 5, 2 with
    /// --quick].
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Sequential operations per round [default: 2000, 200 with --quick].
    #[arg(long)]
    pub ops: Option<usize>,
    /// Leases held by one process for the renewal benchmark [default: 10000, 1000 with --quick].
    #[arg(long)]
    pub held: Option<usize>,
    /// Requests of the sidecar's memory pass (Redis), after a warm-up of a tenth as many
    /// [default: 1000000, 20000 with --quick; 0: no memory pass].
    #[arg(long)]
    pub sidecar_requests: Option<usize>,
    /// Instead of the store benchmarks, the bounded-state pass (issue 36): `leasehold serve`
    /// from this binary (build it with --release), in a process of its own over the Redis at
    /// --redis-url, driven with --bounded-requests requests over --bounded-names task and group
    /// names that are then given up; prints its resident set and /metrics size at the start, at
    /// the peak and after the give-up (about 2 minutes after the last request).
    #[arg(long)]
    pub bounded_state: bool,
    /// Requests of the bounded-state pass [default: 1000000, 20000 with --quick].
    #[arg(long, requires = "bounded_state")]
    pub bounded_requests: Option<usize>,
    /// Distinct task and group names of the bounded-state pass [default: 100000, 2000 with
    /// --quick].
    #[arg(long, requires = "bounded_state")]
    pub bounded_names: Option<usize>,
    /// Print the figures as one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// A smoke run: few rounds, operations and trials.
    #[arg(long)]
    pub quick: bool,
}

/// What one run does, with every default filled in.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) stores: Vec<StoreKind>,
    pub(crate) redis_url: String,
    pub(crate) valkey_url: String,
    pub(crate) postgres_url: String,
    pub(crate) etcd_url: String,
    pub(crate) mysql_url: String,
    pub(crate) sqlite_dir: PathBuf,
    pub(crate) rounds: usize,
    pub(crate) ops: usize,
    pub(crate) held: usize,
    /// Leases renewed one by one per round in the held-lease benchmark.
    pub(crate) held_sample: usize,
    /// Ttl of the leases a session holds in the held-lease benchmark (renewed every ttl/3).
    pub(crate) held_ttl: Duration,
    /// Renewal intervals watched in the held-lease benchmark.
    pub(crate) held_intervals: u32,
    pub(crate) graceful_trials: usize,
    pub(crate) expiry_trials: usize,
    pub(crate) expiry_ttl: Duration,
    pub(crate) memory_leases: usize,
    /// Requests of the sidecar's memory pass.
    pub(crate) sidecar_requests: usize,
    pub(crate) quick: bool,
    /// Unique per run: key prefixes and lease names start with it.
    pub(crate) run_id: String,
}

impl Plan {
    pub(crate) fn new(args: &BenchArgs) -> Result<Self> {
        let q = args.quick;
        let plan = Self {
            stores: dedup(&args.stores),
            redis_url: args.redis_url.clone(),
            valkey_url: args.valkey_url.clone(),
            postgres_url: args.postgres_url.clone(),
            etcd_url: args.etcd_url.clone(),
            mysql_url: args.mysql_url.clone(),
            sqlite_dir: args.sqlite_dir.clone().unwrap_or_else(std::env::temp_dir),
            rounds: args.rounds.unwrap_or(if q { 2 } else { 5 }),
            ops: args.ops.unwrap_or(if q { 200 } else { 2000 }),
            held: args.held.unwrap_or(if q { 1000 } else { 10_000 }),
            held_sample: if q { 200 } else { 2000 },
            held_ttl: Duration::from_secs(3),
            held_intervals: if q { 3 } else { 5 },
            graceful_trials: if q { 5 } else { 20 },
            expiry_trials: if q { 3 } else { 10 },
            expiry_ttl: Duration::from_millis(300),
            memory_leases: 10_000,
            sidecar_requests: args
                .sidecar_requests
                .unwrap_or(if q { 20_000 } else { 1_000_000 }),
            quick: q,
            run_id: run_id(),
        };
        for (flag, value) in [
            ("--rounds", plan.rounds),
            ("--ops", plan.ops),
            ("--held", plan.held),
        ] {
            if value == 0 {
                return Err(BenchError::Usage(format!("{flag} must be at least 1")));
            }
        }
        if plan.stores.contains(&StoreKind::Etcd) {
            etcd_floor_config(&plan.etcd_url)?;
        }
        Ok(plan)
    }

    /// The lease-name prefix of this run on `store`.
    pub(crate) fn prefix(&self, store: StoreKind) -> String {
        format!("bench-{}/{}", self.run_id, store.name())
    }
}

fn dedup(stores: &[StoreKind]) -> Vec<StoreKind> {
    let mut out = Vec::new();
    for &s in stores {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// Process id and clock, in hex: unique enough that two runs never share a key.
fn run_id() -> String {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    format!("{:x}{:x}", std::process::id(), micros & 0xff_ffff_ffff)
}

/// `--etcd-url` as the bench can use it, or the usage error that says why not (checked before
/// the run starts, so a bad flag measures nothing).
pub(crate) fn etcd_floor_config(url: &str) -> Result<EtcdConfig> {
    let config =
        EtcdConfig::from_url(url).map_err(|e| BenchError::Usage(format!("--etcd-url: {e}")))?;
    if config.tls || config.user.is_some() {
        return Err(BenchError::Usage(
            "the floors are sent over plain HTTP without authentication: give an etcd:// URL \
             without a user"
                .into(),
        ));
    }
    Ok(config)
}
