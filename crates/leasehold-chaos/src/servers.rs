//! The store servers a chaos run starts itself (`leasehold-servers`'s launchers, which the
//! workspace's tests use too), behind one face: how each starts (and whether the fault proxy
//! stands in front of it), what the store-restart fault does to it, and how it stops. The
//! harness knows no server kind.
//!
//! The launchers block (they run processes and wait for them); the harness calls them with
//! `block_in_place`, so a run needs a multi-threaded runtime, as the CLI's is.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_servers::{MariaDb, Postgres, RedisCluster, RedisServer, SentinelGroup};
use tokio::task::block_in_place;

use crate::args::{ChaosArgs, StoreKind};
use crate::error::{ChaosError, Result};
use crate::etcd_members::EtcdMembers;
use crate::pg_url::PgTarget;
use crate::procs::epoch_ms;
use crate::proxy::FaultProxy;

/// The database the harness's PostgreSQL and MariaDB servers create (and the replicas use).
const DATABASE: &str = "chaos";

/// The name the sentinels monitor the primary under.
const MASTER: &str = "leasehold-chaos";

/// How long a cluster node may not answer before the others fail it over. Not shorter, for the
/// reason the sentinels' `down-after-milliseconds` is as long: a live primary that stalls past
/// it on a loaded machine is failed over while clients still reach it, and both accept writes
/// until it learns of the promotion (a 500 ms setting once produced 9 s of that, every slot run
/// twice with equal tokens).
const FAILOVER_AFTER: Duration = Duration::from_secs(2);

impl From<leasehold_servers::Error> for ChaosError {
    /// A launcher's failure, said as the harness says its own.
    fn from(e: leasehold_servers::Error) -> Self {
        use leasehold_servers::Error as E;
        match e {
            spawn @ E::Spawn { .. } => Self::Spawn(spawn),
            E::Server { server, problem } => Self::server(server, problem),
            E::Timeout { what, waited, log } => Self::ServerTimeout { what, waited, log },
            E::Io { what, source } => Self::Io { what, source },
            other => Self::server("store server", other.to_string()),
        }
    }
}

/// Milliseconds since the Unix epoch at `t`, as [`epoch_ms`] gives now.
fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A store server of the harness's own.
// One per run: boxing the larger ones would save nothing worth the indirection.
#[allow(clippy::large_enum_variant)]
pub(crate) enum StoreServer {
    Redis(RedisServer),
    Sentinel(SentinelGroup),
    Cluster(RedisCluster),
    Postgres(Postgres),
    Mysql(MariaDb),
    Etcd(EtcdMembers),
}

/// The store a run uses, as started.
pub(crate) struct Started {
    /// The server the harness runs, if it runs one (not for SQLite or `--postgres-url`).
    pub server: Option<StoreServer>,
    /// The fault proxy in front of it, where its clients can go through one.
    pub proxy: Option<FaultProxy>,
    /// The SQLite file's directory, removed when dropped.
    pub sqlite_dir: Option<tempfile::TempDir>,
    /// What replicas connect to: through the proxy where there is one.
    pub replica_url: String,
    /// What the harness's own view connects to: never through the proxy.
    pub direct_url: String,
    /// What the report says of this store and the faults it takes.
    pub note: String,
}

/// What a store restart did.
pub(crate) struct Restart {
    pub stopped_ms: u64,
    pub ready_ms: u64,
    pub detail: String,
    /// Whether writes the store acknowledged may be gone (no persistence, asynchronous
    /// replication): overlaps and duplicate slots starting in that window are excused.
    pub loses_writes: bool,
}

/// The fault proxy in front of `upstream`.
async fn start_proxy(upstream: std::net::SocketAddr) -> Result<FaultProxy> {
    FaultProxy::start(upstream)
        .await
        .map_err(|e| ChaosError::io(format!("cannot start the fault proxy to {upstream}"), e))
}

/// Connections a replica may hold at once (a pool of 4 and a listener or poller, twice while a
/// replacement overlaps it), with the harness's own view and room to spare.
fn max_connections(replicas: usize) -> usize {
    ((replicas * 2 + 2) * 5 + 20).max(50)
}

/// The harness's own PostgreSQL server, from `--postgres-bin` or where PostgreSQL is found.
fn start_postgres(args: &ChaosArgs, logs: &Path) -> Result<Postgres> {
    let bin = match &args.postgres_bin {
        Some(dir) if leasehold_servers::is_postgres_bindir(dir) => dir.clone(),
        Some(dir) => {
            return Err(ChaosError::Usage(format!(
                "{} lacks one of {} (--postgres-bin)",
                dir.display(),
                leasehold_servers::POSTGRES_PROGRAMS.join(", ")
            )));
        }
        None => leasehold_servers::find_postgres_bindir().map_err(|e| ChaosError::Server {
            server: "postgres",
            problem: "install PostgreSQL, pass --postgres-bin DIR, or pass --postgres-url to \
                      use a running server"
                .into(),
            source: Some(e.into()),
        })?,
    };
    let server = Postgres::builder()
        .bin(bin)
        .database(DATABASE)
        .max_connections(max_connections(args.replicas))
        .log(logs.join("postgres.log"))
        .start()?;
    Ok(server)
}

/// Starts the store `args` ask for, its files and logs in `logs`.
pub(crate) async fn start(args: &ChaosArgs, logs: &Path) -> Result<Started> {
    let no_proxy = |server: StoreServer, url: String, note: String| Started {
        server: Some(server),
        proxy: None,
        sqlite_dir: None,
        replica_url: url.clone(),
        direct_url: url,
        note,
    };
    Ok(match args.store {
        StoreKind::Sqlite => {
            let dir = tempfile::Builder::new()
                .prefix("leasehold-chaos-db-")
                .tempdir()
                .map_err(|e| ChaosError::io("cannot create a temporary directory for SQLite", e))?;
            let url = format!("sqlite:{}", dir.path().join("chaos.db").display());
            Started {
                server: None,
                proxy: None,
                sqlite_dir: Some(dir),
                replica_url: url.clone(),
                direct_url: url,
                note: "sqlite: one file on this machine; no proxy faults, no store restart".into(),
            }
        }
        StoreKind::Redis => {
            let server = block_in_place(|| {
                RedisServer::builder()
                    .program(&args.redis_server)
                    .log(logs.join("redis-server.log"))
                    .start()
            })?;
            let proxy = start_proxy(server.addr()).await?;
            Started {
                replica_url: format!("redis://{}/0", proxy.addr()),
                direct_url: format!("redis://{}/0", server.addr()),
                server: Some(StoreServer::Redis(server)),
                proxy: Some(proxy),
                sqlite_dir: None,
                note: "redis: the harness's own redis-server without persistence; a restart loses every lease and slot (a documented non-guarantee), so overlaps and duplicate slots that begin in the window after a restart are reported as excused; fencing must hold there too".into(),
            }
        }
        StoreKind::RedisSentinel => {
            let group = block_in_place(|| {
                SentinelGroup::builder()
                    .program(&args.redis_server)
                    .master(MASTER)
                    .down_after(FAILOVER_AFTER)
                    .files_in(logs)
                    .start()
            })?;
            let url = group.url();
            no_proxy(
                StoreServer::Sentinel(group),
                url,
                format!(
                    "redis-sentinel: the harness's own primary, replica and three sentinels (quorum 2, down-after {} ms), no proxy; a store restart SIGKILLs the primary, the sentinels promote the replica and the killed server returns as its replica. Replication is asynchronous: writes acknowledged by the killed primary and not yet copied are lost, so overlaps and duplicate slots that begin in the failover window are reported as excused (the window asynchronous replication allows); fencing must hold there too",
                    FAILOVER_AFTER.as_millis()
                ),
            )
        }
        StoreKind::RedisCluster => {
            let cluster = block_in_place(|| {
                RedisCluster::builder()
                    .program(&args.redis_server)
                    .node_timeout(FAILOVER_AFTER)
                    .files_in(logs)
                    .start()
            })?;
            let url = cluster.url();
            no_proxy(
                StoreServer::Cluster(cluster),
                url,
                format!(
                    "redis-cluster: the harness's own six-node Redis Cluster (three primaries with one replica each, cluster-node-timeout {} ms, nodes.conf and logs in logs/), no proxy; a store restart SIGKILLs the primary serving the task lease's slot, the cluster promotes its replica and the killed node returns as the promoted node's replica. Replication is asynchronous: writes acknowledged by the killed primary and not yet copied are lost, so overlaps and duplicate slots that begin in the failover window are reported as excused (the window asynchronous replication allows); fencing must hold there too",
                    FAILOVER_AFTER.as_millis()
                ),
            )
        }
        StoreKind::Postgres => match &args.postgres_url {
            Some(shared) => {
                let target = PgTarget::parse(shared)?;
                let proxy = start_proxy(target.addr).await?;
                Started {
                    replica_url: target.url_at(proxy.addr()),
                    direct_url: target.url_at(target.addr),
                    server: None,
                    proxy: Some(proxy),
                    sqlite_dir: None,
                    note: "postgres: a running server (--postgres-url), through the proxy; it is not the harness's, so it is not restarted (no store-restart faults)".into(),
                }
            }
            None => {
                let server = block_in_place(|| start_postgres(args, logs))?;
                let proxy = start_proxy(server.addr()).await?;
                let target = PgTarget::local(server.addr(), server.user(), server.database());
                Started {
                    replica_url: target.url_at(proxy.addr()),
                    direct_url: target.url_at(target.addr),
                    note: format!(
                        "postgres: the harness's own server ({}; fsync and synchronous commit on), through the proxy; a store restart is a crash (pg_ctl stop -m immediate: no checkpoint) and a start that replays the WAL; a durable store forgets nothing, so nothing is excused: overlaps and duplicate slots must stay 0 across restarts, and both leases' tokens must survive each one",
                        server.bin().display()
                    ),
                    server: Some(StoreServer::Postgres(server)),
                    proxy: Some(proxy),
                    sqlite_dir: None,
                }
            }
        },
        StoreKind::Mysql => {
            let server = block_in_place(|| {
                MariaDb::builder()
                    .database(DATABASE)
                    .max_connections(max_connections(args.replicas))
                    .log(logs.join("mariadb.log"))
                    .start()
            })?;
            let proxy = start_proxy(server.addr()).await?;
            Started {
                replica_url: server.url_at(proxy.addr()),
                direct_url: server.url_at(server.addr()),
                server: Some(StoreServer::Mysql(server)),
                proxy: Some(proxy),
                sqlite_dir: None,
                note: "mysql: the harness's own MariaDB server (mariadbd, InnoDB with innodb_flush_log_at_trx_commit=1 and the doublewrite buffer, no binary log), through the proxy; a store restart is a crash (SIGKILL: no shutdown, no checkpoint) and a start that runs InnoDB's crash recovery; a durable store forgets nothing, so nothing is excused: overlaps and duplicate slots must stay 0 across restarts, and both leases' tokens must survive each one".into(),
            }
        }
        StoreKind::Etcd => {
            let members = block_in_place(EtcdMembers::start)?;
            let url = members.url();
            no_proxy(StoreServer::Etcd(members), url, "etcd: a 3-member cluster of the harness's own on loopback (data on disk, fsync on), no proxy (three endpoints); a store restart SIGKILLs, in turn, the Raft leader (kept down 2 ttl), the leader and a follower together (no quorum for 2 ttl), or a follower (restarted at once) and starts them again on their data; Raft commits every write on a majority, so nothing is excused: overlaps and duplicate slots must stay 0 and both leases' tokens must survive each restart".into())
        }
    })
}

impl StoreServer {
    /// The store-restart fault, the `n`th of the run (0-based), on a run whose leases live
    /// `ttl`; `lease` is the run's leader lease name.
    pub(crate) async fn restart(
        &mut self,
        n: usize,
        ttl: Duration,
        lease: &str,
    ) -> Result<Restart> {
        // Durable servers: every other restart (the first, third, ...) stays down past the
        // ttl, so the lease runs out during the outage and someone takes over after it; the
        // others start at once and the holder keeps its lease.
        let down = if n.is_multiple_of(2) {
            ttl * 2
        } else {
            Duration::ZERO
        };
        Ok(match self {
            Self::Redis(server) => {
                let killed = epoch_ms();
                block_in_place(|| server.restart())?;
                let ready = epoch_ms();
                Restart {
                    stopped_ms: killed,
                    ready_ms: ready,
                    detail: format!(
                        "redis-server SIGKILLed and restarted (down {} ms; every lease forgotten)",
                        ready - killed
                    ),
                    loses_writes: true,
                }
            }
            Self::Sentinel(group) => {
                let (killed, promoted) = block_in_place(|| group.fail_over())?;
                let (killed, promoted) = (ms(killed), ms(promoted));
                Restart {
                    stopped_ms: killed,
                    ready_ms: promoted,
                    detail: format!(
                        "primary SIGKILLed, replica promoted by the sentinels {} ms later; the killed server restarted as its replica",
                        promoted.saturating_sub(killed)
                    ),
                    loses_writes: true,
                }
            }
            Self::Cluster(cluster) => {
                // The keys of the leader lease and of the lease `leasehold run` takes for each
                // tick (default prefix; each lease's keys share its name as hash tag, so the
                // task's slot also holds its fencing counter and slot claims).
                let key = |name: &str| format!("leasehold:{{{name}}}:lease");
                let (task, leader) = (key(&format!("{lease}:run")), key(lease));
                let f = block_in_place(|| cluster.fail_over(&task, &leader))?;
                let (killed, promoted, serving, ready) =
                    (ms(f.killed), ms(f.promoted), ms(f.serving), ms(f.ready));
                Restart {
                    stopped_ms: killed,
                    ready_ms: serving,
                    detail: format!(
                        "primary :{} (serving the task's slot {}, {}) SIGKILLed; its replica :{} promoted {} ms later, every node serving again after {} ms; the killed node rejoined as its replica ({} ms after the kill)",
                        f.killed_port,
                        f.slot,
                        if f.other_in_shard {
                            "and the leader lease's"
                        } else {
                            "not the leader lease's"
                        },
                        f.promoted_port,
                        promoted.saturating_sub(killed),
                        serving.saturating_sub(killed),
                        ready.saturating_sub(killed)
                    ),
                    loses_writes: true,
                }
            }
            Self::Postgres(server) => {
                let stopped = epoch_ms();
                block_in_place(|| server.crash());
                tokio::time::sleep(down).await;
                block_in_place(|| server.start_again())?;
                let ready = epoch_ms();
                Restart {
                    stopped_ms: stopped,
                    ready_ms: ready,
                    detail: format!(
                        "postgres crashed (pg_ctl stop -m immediate), kept down {} ms, restarted with WAL recovery (down {} ms in all)",
                        down.as_millis(),
                        ready - stopped
                    ),
                    loses_writes: false,
                }
            }
            Self::Mysql(server) => {
                let killed = epoch_ms();
                block_in_place(|| server.crash());
                tokio::time::sleep(down).await;
                block_in_place(|| server.start_again())?;
                let ready = epoch_ms();
                Restart {
                    stopped_ms: killed,
                    ready_ms: ready,
                    detail: format!(
                        "mariadbd SIGKILLed, kept down {} ms, restarted with InnoDB crash recovery (down {} ms in all)",
                        down.as_millis(),
                        ready - killed
                    ),
                    loses_writes: false,
                }
            }
            Self::Etcd(members) => {
                let (stopped, ready, detail) = members.restart(n, ttl * 2).await?;
                Restart {
                    stopped_ms: stopped,
                    ready_ms: ready,
                    detail,
                    loses_writes: false,
                }
            }
        })
    }

    /// Stops the server (its logs stay under `logs`).
    pub(crate) fn stop(self, logs: &Path) {
        block_in_place(|| match self {
            Self::Etcd(members) => members.stop(logs),
            // The others keep their logs in `logs` already; dropping one stops it.
            other => drop(other),
        });
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::procs;
    use crate::tests::Cli;

    /// Starts the harness's own `store` server, takes a lease on it, injects the second
    /// store-restart fault (a crash and an immediate start), checks that the lease survived,
    /// and returns what the restart reported and the store's log.
    async fn a_lease_survives_the_restart_of(store: &str, log: &str) -> (Restart, String) {
        let work = tempfile::tempdir().unwrap();
        let cli = Cli::try_parse_from(["chaos", "--store", store]).unwrap();
        let started = start(&cli.args, work.path()).await.unwrap();
        assert!(started.proxy.is_some());
        let mut server = started.server.unwrap();
        let lease = leasehold_connect::open_store(&started.direct_url)
            .await
            .unwrap();
        let mut restart = None;
        procs::testing::a_lease_survives(&lease, async || {
            let ttl = Duration::from_secs(1);
            restart = Some(server.restart(1, ttl, "crash").await.unwrap());
        })
        .await;
        drop(lease);
        server.stop(work.path());
        let log = std::fs::read_to_string(work.path().join(log)).unwrap();
        (restart.unwrap(), log)
    }

    /// Needs PostgreSQL's server programs (scripts/stores.sh installs them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_survives_a_postgres_crash() {
        let (restart, log) = a_lease_survives_the_restart_of("postgres", "postgres.log").await;
        assert!(!restart.loses_writes);
        assert!(restart.stopped_ms <= restart.ready_ms);
        assert!(
            restart.detail.starts_with("postgres crashed"),
            "{}",
            restart.detail
        );
        assert!(log.contains("immediate shutdown"), "{log}");
        assert!(log.contains("automatic recovery"), "{log}");
    }

    /// Needs MariaDB's server programs (scripts/stores.sh installs them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_survives_a_mariadb_crash() {
        let (restart, log) = a_lease_survives_the_restart_of("mysql", "mariadb.log").await;
        assert!(!restart.loses_writes);
        assert!(
            restart.detail.starts_with("mariadbd SIGKILLed"),
            "{}",
            restart.detail
        );
        assert_eq!(log.matches("ready for connections").count(), 2, "{log}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_directory_without_the_postgres_programs_is_a_usage_error() {
        let empty = tempfile::tempdir().unwrap();
        let cli = Cli::try_parse_from([
            "chaos".as_ref(),
            "--store".as_ref(),
            "postgres".as_ref(),
            "--postgres-bin".as_ref(),
            empty.path().as_os_str(),
        ])
        .unwrap();
        let refused = start(&cli.args, empty.path()).await.err().unwrap();
        assert!(
            matches!(&refused, ChaosError::Usage(m) if m.contains("--postgres-bin")),
            "{refused:?}"
        );
    }
}
