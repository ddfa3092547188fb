//! The store servers a chaos run starts itself, behind one face: how each starts (and whether
//! the fault proxy stands in front of it), what the store-restart fault does to it, and how it
//! stops. The harness knows no server kind.

use std::path::Path;
use std::time::Duration;

use crate::error::{ChaosError, Result};
use crate::etcd_members::EtcdMembers;
use crate::mysql_server::MySqlServer;
use crate::pg_server::{self, PgServer};
use crate::pg_url::PgTarget;
use crate::procs::{RedisServer, Watchdog};
use crate::proxy::FaultProxy;
use crate::redis_cluster::{self, ClusterGroup};
use crate::sentinel::SentinelGroup;
use crate::{ChaosArgs, StoreKind};

/// A store server of the harness's own.
// One per run: boxing the larger groups would save nothing worth the indirection.
#[allow(clippy::large_enum_variant)]
pub(crate) enum StoreServer {
    Redis(RedisServer),
    Sentinel(SentinelGroup),
    Cluster(ClusterGroup),
    Postgres(PgServer),
    Mysql(MySqlServer),
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

/// Starts the store `args` ask for.
pub(crate) async fn start(args: &ChaosArgs, logs: &Path, watchdog: &Watchdog) -> Result<Started> {
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
            let server = RedisServer::start(
                &args.redis_server,
                &logs.join("redis-server.log"),
                watchdog.group(),
            )
            .await?;
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
            let group = SentinelGroup::start(&args.redis_server, logs, watchdog.group()).await?;
            let url = group.url();
            no_proxy(StoreServer::Sentinel(group), url, "redis-sentinel: the harness's own primary, replica and three sentinels (quorum 2, down-after 2000 ms), no proxy; a store restart SIGKILLs the primary, the sentinels promote the replica and the killed server returns as its replica. Replication is asynchronous: writes acknowledged by the killed primary and not yet copied are lost, so overlaps and duplicate slots that begin in the failover window are reported as excused (the window asynchronous replication allows); fencing must hold there too".into())
        }
        StoreKind::RedisCluster => {
            let group = ClusterGroup::start(&args.redis_server, logs, watchdog.group()).await?;
            let url = group.url();
            no_proxy(
                StoreServer::Cluster(group),
                url,
                format!(
                    "redis-cluster: the harness's own six-node Redis Cluster (three primaries with one replica each, cluster-node-timeout {} ms, nodes.conf and logs in logs/), no proxy; a store restart SIGKILLs the primary serving the task lease's slot, the cluster promotes its replica and the killed node returns as the promoted node's replica. Replication is asynchronous: writes acknowledged by the killed primary and not yet copied are lost, so overlaps and duplicate slots that begin in the failover window are reported as excused (the window asynchronous replication allows); fencing must hold there too",
                    redis_cluster::NODE_TIMEOUT_MS
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
                let bin = pg_server::find_bindir(args.postgres_bin.as_deref())?;
                let server = PgServer::start(
                    &bin,
                    &logs.join("postgres.log"),
                    watchdog,
                    max_connections(args.replicas),
                )
                .await?;
                let proxy = start_proxy(server.addr()).await?;
                let target = server.target();
                Started {
                    replica_url: target.url_at(proxy.addr()),
                    direct_url: target.url_at(target.addr),
                    server: Some(StoreServer::Postgres(server)),
                    proxy: Some(proxy),
                    sqlite_dir: None,
                    note: format!(
                        "postgres: the harness's own server ({}; fsync and synchronous commit on), through the proxy; a store restart is a crash (pg_ctl stop -m immediate: no checkpoint) and a start that replays the WAL; a durable store forgets nothing, so nothing is excused: overlaps and duplicate slots must stay 0 across restarts, and both leases' tokens must survive each one",
                        bin.display()
                    ),
                }
            }
        },
        StoreKind::Mysql => {
            let server = MySqlServer::start(
                &logs.join("mariadb.log"),
                watchdog,
                max_connections(args.replicas),
            )
            .await?;
            let proxy = start_proxy(server.addr()).await?;
            Started {
                replica_url: MySqlServer::url_at(proxy.addr()),
                direct_url: MySqlServer::url_at(server.addr()),
                server: Some(StoreServer::Mysql(server)),
                proxy: Some(proxy),
                sqlite_dir: None,
                note: "mysql: the harness's own MariaDB server (mariadbd, InnoDB with innodb_flush_log_at_trx_commit=1 and the doublewrite buffer, no binary log), through the proxy; a store restart is a crash (SIGKILL: no shutdown, no checkpoint) and a start that runs InnoDB's crash recovery; a durable store forgets nothing, so nothing is excused: overlaps and duplicate slots must stay 0 across restarts, and both leases' tokens must survive each one".into(),
            }
        }
        StoreKind::Etcd => {
            let members = EtcdMembers::start().await?;
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
                let (killed, ready) = server.restart().await?;
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
                let (killed, promoted) = group.fail_over().await?;
                Restart {
                    stopped_ms: killed,
                    ready_ms: promoted,
                    detail: format!(
                        "primary SIGKILLed, replica promoted by the sentinels {} ms later; the killed server restarted as its replica",
                        promoted - killed
                    ),
                    loses_writes: true,
                }
            }
            Self::Cluster(group) => {
                // The keys of the leader lease and of the lease `leasehold run` takes for each
                // tick (default prefix; each lease's keys share its name as hash tag, so the
                // task's slot also holds its fencing counter and slot claims).
                let key = |name: &str| format!("leasehold:{{{name}}}:lease");
                let f = group
                    .fail_over(&key(&format!("{lease}:run")), &key(lease))
                    .await?;
                Restart {
                    stopped_ms: f.killed_ms,
                    ready_ms: f.serving_ms,
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
                        f.promoted_ms - f.killed_ms,
                        f.serving_ms - f.killed_ms,
                        f.ready_ms - f.killed_ms
                    ),
                    loses_writes: true,
                }
            }
            Self::Postgres(server) => {
                let (stopped, ready) = server.restart(down).await?;
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
                let (stopped, ready) = server.restart(down).await?;
                Restart {
                    stopped_ms: stopped,
                    ready_ms: ready,
                    detail: format!(
                        "mariadbd SIGKILLed, kept down {} ms, restarted with InnoDB crash recovery (down {} ms in all)",
                        down.as_millis(),
                        ready - stopped
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
    pub(crate) async fn stop(self, logs: &Path) {
        match self {
            Self::Redis(mut server) => server.stop().await,
            Self::Sentinel(mut group) => group.stop().await,
            Self::Cluster(mut group) => group.stop().await,
            Self::Postgres(mut server) => server.stop().await,
            Self::Mysql(mut server) => server.stop().await,
            Self::Etcd(members) => members.stop(logs),
        }
    }
}
