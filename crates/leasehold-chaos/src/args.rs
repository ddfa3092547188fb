//! What a chaos run is asked for: the store and the flags of `leasehold chaos`.

use std::path::PathBuf;
use std::time::Duration;

use crate::schedule::FaultKind;

/// The store a chaos run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum StoreKind {
    /// A SQLite file in a temporary directory (no proxy, no restart).
    Sqlite,
    /// A `redis-server` the harness starts itself, behind the fault proxy, restarted as a fault.
    Redis,
    /// A primary, a replica and three sentinels the harness starts itself (`redis+sentinel://`,
    /// no proxy); the store-restart fault SIGKILLs the primary, so the sentinels fail over.
    RedisSentinel,
    /// A six-node Redis Cluster (three primaries, one replica each) the harness starts itself
    /// (`redis+cluster://`, no proxy); the store-restart fault SIGKILLs the primary serving the
    /// task lease's slot, so the cluster promotes its replica.
    RedisCluster,
    /// A PostgreSQL server the harness starts itself (fsync on), behind the fault proxy, crashed
    /// and restarted as a fault; or a running server (`--postgres-url`), never restarted.
    Postgres,
    /// A 3-member etcd cluster the harness starts itself (no proxy: three endpoints); members,
    /// the Raft leader among them, are SIGKILLed and restarted as the store-restart fault.
    Etcd,
    /// A MariaDB server the harness starts itself (`mariadbd`, InnoDB with a durable commit),
    /// behind the fault proxy, SIGKILLed and restarted (crash recovery) as a fault.
    Mysql,
}

impl StoreKind {
    /// The name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Redis => "redis",
            Self::RedisSentinel => "redis-sentinel",
            Self::RedisCluster => "redis-cluster",
            Self::Postgres => "postgres",
            Self::Etcd => "etcd",
            Self::Mysql => "mysql",
        }
    }

    /// The faults that apply to this store when the harness runs its server (for PostgreSQL
    /// at a `--postgres-url`, every one but [`FaultKind::StoreRestart`]).
    pub fn faults(self) -> &'static [FaultKind] {
        use FaultKind::*;
        match self {
            Self::Sqlite => &[Kill, Pause, Terminate],
            Self::Etcd => &[Kill, Pause, Terminate, StoreRestart],
            Self::RedisSentinel | Self::RedisCluster => &[Kill, Pause, Terminate, StoreRestart],
            Self::Redis | Self::Postgres | Self::Mysql => &FaultKind::ALL,
        }
    }
}

fn duration_arg(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

/// `leasehold chaos`: replicas of a fenced task under kills, pauses, dropped, blackholed and
/// delayed connections and store restarts, then a check of the witness ledger.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// The store to run against.
    #[arg(long, value_enum)]
    pub store: StoreKind,
    /// How many replicas of `leasehold run` to keep running.
    #[arg(long, default_value_t = 5)]
    pub replicas: usize,
    /// How long to inject faults for.
    #[arg(long, default_value = "120s", value_parser = duration_arg)]
    pub duration: Duration,
    /// How many faults to inject (at least), spread over the duration [default: one per 8 s,
    /// at least 10].
    #[arg(long)]
    pub faults: Option<usize>,
    /// Seed of the fault schedule; printed, so a run can be replayed [default: random].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Lease ttl of the replicas.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    pub ttl: Duration,
    /// Tick interval of the replicas' schedule.
    #[arg(long, default_value = "500ms", value_parser = duration_arg)]
    pub every: Duration,
    /// How long each run of the witness works before its fenced write.
    #[arg(long, default_value = "100ms", value_parser = duration_arg)]
    pub work: Duration,
    /// Where to write report.json, timeline.svg, the ledger and the replica logs [default: a
    /// new temporary directory, kept and printed].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The `leasehold` binary the replicas run [default: this program].
    #[arg(long)]
    pub bin: Option<PathBuf>,
    /// For `--store postgres`: use this running PostgreSQL database (on a loopback address)
    /// instead of a server of the harness's own. It is shared, so it is never restarted: no
    /// store-restart faults [default: the harness starts its own server and crashes it].
    #[arg(long)]
    pub postgres_url: Option<String>,
    /// The directory of PostgreSQL's programs (`initdb`, `postgres`, `pg_ctl`, `pg_isready`,
    /// `createdb`) for the harness's own server (default: the newest
    /// `/usr/lib/postgresql/VERSION/bin`, else `pg_config --bindir`, else `PATH`).
    #[arg(long)]
    pub postgres_bin: Option<PathBuf>,
    /// The Redis server program for `--store redis`, `--store redis-sentinel` (which runs it
    /// with `--sentinel` too) and `--store redis-cluster`.
    #[arg(long, default_value = "redis-server")]
    pub redis_server: PathBuf,
}
