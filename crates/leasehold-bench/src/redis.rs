//! The Redis store, next to PING and SET on the store's own connection (the same `redis` crate
//! and connection), and next to the `rslock` crate's lock+unlock on the same server. Behind
//! Sentinel the floors reach the primary through that connection; on a Redis Cluster they are
//! keyed commands, routed to the node owning the floor key's slot. rslock only connects to a
//! plain `redis://` server, so it is measured for those alone.

use std::time::Duration;

use leasehold_redis::{ClusterUrl, RedisConfig, RedisConnection, RedisStore, SentinelUrl, redis};

use leasehold::store::TickRequest;
use leasehold::{Slots, Store};

use crate::common::{self, HeldPlan, OpBench, OpRounds, OpTargets};
use crate::error::{BenchError, Result};
use crate::plan::{Plan, StoreKind};
use crate::report::{Kind, OpRow, Report, SidecarMemoryRow, Target};
use crate::sidecar::{self, ServerClock, SidecarPlan};
use crate::stats::{Figure, Recorder, Round};

/// What `--redis-url` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deployment {
    /// One server (`redis://`, `rediss://`, `unix://`).
    Single,
    /// The primary of a Sentinel group (`redis+sentinel://`).
    Sentinel,
    /// A Redis Cluster (`redis+cluster://`).
    Cluster,
}

impl Deployment {
    fn of(url: &str) -> Self {
        if SentinelUrl::parse(url).is_ok() {
            Self::Sentinel
        } else if ClusterUrl::parse(url).is_ok() {
            Self::Cluster
        } else {
            Self::Single
        }
    }
}

/// The note of a run in which rslock was not measured.
pub(crate) const RSLOCK_SKIPPED: &str = "redis: rslock lock+unlock not measured: rslock 0.10 \
     connects to plain redis:// servers only, not through Sentinel or to a Redis Cluster";

/// A store handle with a connection and release listener of its own, as another process has.
async fn connect_store(url: &str, key_prefix: &str) -> Result<RedisStore> {
    RedisConfig::new(url)
        .prefix(key_prefix)
        .connect()
        .await
        .map_err(|e| BenchError::connect(RedisConfig::new(url).describe(), e))
}

/// Deletes the keys under `key_prefix` of the Redis at `url`.
pub(crate) async fn delete_keys(url: &str, key_prefix: &str) -> Result<()> {
    let store = RedisConfig::new(url.to_owned())
        .prefix(key_prefix)
        .connect()
        .await
        .map_err(|e| BenchError::connect(RedisConfig::new(url.to_owned()).describe(), e))?;
    cleanup(&store, key_prefix, Deployment::of(url)).await
}

/// The Redis store on the server of `kind`: [`StoreKind::Redis`] at `--redis-url`, or
/// [`StoreKind::Valkey`] at `--valkey-url`, each next to its own floors and rslock on the same
/// server, its rows named after `kind`.
pub(crate) async fn bench(plan: &Plan, report: &mut Report, kind: StoreKind) -> Result<()> {
    let url = match kind {
        StoreKind::Valkey => plan.valkey_url.as_str(),
        _ => plan.redis_url.as_str(),
    };
    let key_prefix = format!("leasehold-bench-{}", plan.run_id);
    let deployment = Deployment::of(url);
    let store = connect_store(url, &key_prefix)
        .await
        .map_err(|e| match (kind, e) {
            (StoreKind::Valkey, BenchError::Connect { target, source }) => BenchError::Connect {
                target: format!(
                    "{target} (`bash scripts/valkey.sh` starts Valkey 9 on the default \
                     --valkey-url)"
                ),
                source,
            },
            (_, e) => e,
        })?;
    let at = Server { url, kind };
    let result = async {
        // A second store handle, as another process would have.
        let waiter = connect_store(url, &key_prefix).await?;
        bench_with(plan, report, at, &store, &waiter, &key_prefix, deployment).await
    }
    .await;
    let cleaned = cleanup(&store, &key_prefix, deployment).await;
    result.and(cleaned)
}

/// The server a pass measures.
#[derive(Debug, Clone, Copy)]
struct Server<'a> {
    url: &'a str,
    kind: StoreKind,
}

async fn bench_with(
    plan: &Plan,
    report: &mut Report,
    at: Server<'_>,
    store: &RedisStore,
    waiter: &RedisStore,
    key_prefix: &str,
    deployment: Deployment,
) -> Result<()> {
    let mut conn = store.connection();
    let name = at.kind.name();
    let prefix = plan.prefix(at.kind);
    let ops = OpBench::new(store.clone(), &prefix, plan.ops)?;
    let peer = (deployment == Deployment::Single)
        .then(|| rslock::LockManager::new(vec![at.url.to_owned()]));
    let resources: Vec<String> = (0..plan.ops)
        .map(|i| format!("{key_prefix}:rslock:{i}"))
        .collect();
    let floor_key = format!("{key_prefix}:floor");
    // On a cluster PING goes to every primary; EXISTS of the floor key is one round trip to the
    // node owning its slot, as each store operation is.
    let probe = if deployment == Deployment::Cluster {
        Probe::Exists(&floor_key)
    } else {
        Probe::Ping
    };

    // On a cluster SCRIPT LOAD goes to every node.
    let noop: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut conn)
        .await
        .map_err(|e| BenchError::floor("SCRIPT LOAD of a no-op script", e))?;

    ops.warm_up().await?;
    probe.round(&mut conn, plan.ops.min(200)).await?;
    if let Some(peer) = &peer {
        rslock_round(peer, &resources).await?;
    }

    let mut rounds = OpRounds::default();
    let (mut pings, mut sets, mut evals, mut peers) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        pings.push(probe.round(&mut conn, plan.ops).await?);
        sets.push(set_round(&mut conn, &floor_key, plan.ops).await?);
        evals.push(evalsha_round(&mut conn, &noop, &floor_key, plan.ops).await?);
        ops.round(&mut rounds).await?;
        if let Some(peer) = &peer {
            peers.push(rslock_round(peer, &resources).await?);
        }
    }

    // Server time per call, from INFO commandstats around an untimed pass of each (a cluster
    // would sum every node's counters).
    let server = if deployment == Deployment::Cluster {
        report.notes.push(format!(
            "{name}: server time per call not measured on a Redis Cluster (INFO commandstats \
             would sum every node's counters)"
        ));
        None
    } else {
        match server_time(store, &ops, &noop, &floor_key, &prefix).await {
            Ok(times) => Some(times),
            Err(e) => {
                report.notes.push(format!(
                    "{name}: server time per call not measured: {}",
                    e.chain()
                ));
                None
            }
        }
    };
    let time_of = |what: &str| {
        server
            .as_ref()
            .and_then(|t| t.iter().find(|(w, _)| *w == what).map(|&(_, us)| us))
    };

    let ping = (&pings[..], probe.name());
    let mut floors = common::floor_rows(
        name,
        &[
            (probe.name(), &pings),
            ("SET", &sets),
            ("EVALSHA no-op", &evals),
        ],
    );
    for row in &mut floors {
        row.server_us = match row.op.as_str() {
            "PING" => time_of("PING"),
            "EVALSHA no-op" => time_of("no-op script"),
            _ => None,
        };
    }
    report.operations.extend(floors);
    let acquire_release = peer.is_some().then(|| {
        let peer_rate = Figure::of(&peers).ops_per_sec.median;
        let pair_rate = Figure::of(&rounds.acquire_release).ops_per_sec.median;
        Target::new(
            format!("ops/s ≥ rslock ({})", crate::report::fmt_count(peer_rate)),
            pair_rate >= peer_rate,
        )
    });
    let targets = OpTargets {
        acquire: Some(common::p50_within(&rounds.acquire, 1.15, ping)),
        renew: Some(common::p50_within(&rounds.renew, 1.05, ping)),
        release: Some(common::p50_within(&rounds.release, 1.05, ping)),
        acquire_release,
    };
    let mut rows = rounds.rows(name, Some(ping), targets);
    for row in &mut rows {
        row.server_us = match row.op.as_str() {
            "acquire+release" => time_of("acquire")
                .zip(time_of("release"))
                .map(|(a, r)| a + r),
            op => time_of(op),
        };
    }
    report.operations.extend(rows);
    if let Some(us) = time_of("tick") {
        report.notes.push(format!(
            "{name}: a gated tick decision (Slots::tick: clock, control record, slot, lease and \
             claim in one script) takes {us:.1} µs of server time"
        ));
    }
    for (what, target) in [("acquire", 6.0), ("renew", 2.0), ("release", 2.0)] {
        if let Some(us) = time_of(what) {
            report.notes.push(format!(
                "{name}: server time per {what} {us:.1} µs ({} ≤ {target} µs)",
                if us <= target { "PASS" } else { "MISS" }
            ));
        }
    }
    if peer.is_some() {
        report.operations.push(OpRow {
            store: name.to_owned(),
            op: "rslock lock+unlock".to_owned(),
            kind: Kind::Peer,
            figure: Figure::of(&peers),
            ratio: common::ratio(&peers, &pings, "PING"),
            server_us: None,
            target: None,
        });
    }
    report.notes.push(format!(
        "{name}: the server answers HELLO with {}; {}",
        hello(&mut conn).await,
        "renew is one SET … IFEQ … PX and release one DELIFEQ (Valkey ≥ 9) or DELEX … IFEQ \
         (Redis ≥ 8.4) pipelined with its PUBLISH where the server has them, scripts otherwise"
    ));
    report.notes.push(match deployment {
        Deployment::Single => format!(
            "{name}: PING, SET and EVALSHA of `return 1` run on the store's own connection \
             (redis crate); acquire and tick are one EVALSHA each; rslock 0.10 (same redis \
             crate) uses the same server and its own multiplexed connection; acquire+release \
             and lock+unlock are two round trips each"
        ),
        Deployment::Sentinel => format!(
            "{name}: Sentinel group; PING, SET and EVALSHA of `return 1` run on the store's own \
             connection to the primary the sentinels name; acquire+release is two round trips"
        ),
        Deployment::Cluster => format!(
            "{name}: Redis Cluster; EXISTS, SET and EVALSHA of `return 1` on one key run on the \
             store's own cluster connection, so each goes to the primary owning that key's slot \
             (PING would go to every primary); every store operation is one EVALSHA on the \
             lease's slot owner; acquire+release is two round trips"
        ),
    });
    if peer.is_none() {
        report.notes.push(RSLOCK_SKIPPED.to_owned());
    }

    let held = HeldPlan::of(plan, name, &prefix, 64);
    let graceful = Some(("1 ms".to_owned(), 1.0));
    if at.kind == StoreKind::Valkey {
        // The sidecar's rows name no store: they are measured over Redis alone.
        return common::held_and_takeovers(plan, report, &held, store, waiter, graceful).await;
    }

    // The sidecar over a store of its own (its own connection), as a `leasehold serve`
    // process beside the application has.
    let sidecar_store = connect_store(at.url, key_prefix).await?;
    let sidecar_plan = SidecarPlan {
        // Names go into URL paths: no `/` in them.
        prefix: &format!("{}-sidecar", prefix.replace('/', "-")),
        rounds: plan.rounds,
        one: plan.ops,
        each_of_many: (plan.ops / 4).max(10),
        acquire_p50_us: Figure::of(&rounds.acquire).p50_us.median,
        memory_requests: plan.sidecar_requests,
    };
    let probe_server = Commandstats {
        store: store.clone(),
        skip: deployment == Deployment::Cluster,
    };
    let (rows, notes, growth) = sidecar::bench(&sidecar_plan, sidecar_store, &probe_server).await?;
    report.sidecar.extend(rows);
    if let Some(g) = growth {
        let grew = g.rss_after.saturating_sub(g.rss_before);
        report.sidecar_memory = Some(SidecarMemoryRow {
            requests: g.requests,
            rss_before_bytes: g.rss_before,
            rss_after_bytes: g.rss_after,
            target: Target::new(
                format!("≤ {} MiB growth", sidecar::MAX_GROWTH >> 20),
                grew <= sidecar::MAX_GROWTH,
            ),
        });
    }
    report.notes.extend(notes);
    common::held_and_takeovers(plan, report, &held, store, waiter, graceful).await
}

/// The cheapest command that makes one round trip to the server the store's operations go to.
#[derive(Debug, Clone, Copy)]
enum Probe<'a> {
    /// PING: one server, or the primary behind Sentinel.
    Ping,
    /// EXISTS of this key: on a cluster, the node owning its slot.
    Exists(&'a str),
}

impl Probe<'_> {
    fn name(self) -> &'static str {
        match self {
            Self::Ping => "PING",
            Self::Exists(_) => "EXISTS",
        }
    }

    async fn round(self, conn: &mut RedisConnection, ops: usize) -> Result<Round> {
        let cmd = match self {
            Self::Ping => redis::cmd("PING"),
            Self::Exists(key) => redis::cmd("EXISTS").arg(key).clone(),
        };
        let mut rec = Recorder::new(ops);
        for _ in 0..ops {
            rec.start();
            let _: redis::Value = cmd
                .query_async(conn)
                .await
                .map_err(|e| BenchError::floor(self.name(), e))?;
            rec.stop();
        }
        Ok(rec.finish())
    }
}

async fn set_round(conn: &mut RedisConnection, key: &str, ops: usize) -> Result<Round> {
    let mut rec = Recorder::new(ops);
    for i in 0..ops {
        rec.start();
        let () = redis::cmd("SET")
            .arg(key)
            .arg(i)
            .query_async(conn)
            .await
            .map_err(|e| BenchError::floor("SET", e))?;
        rec.stop();
    }
    Ok(rec.finish())
}

/// `(calls, usec)` of one command in `INFO commandstats`.
async fn command_stat(conn: &mut RedisConnection, command: &str) -> Result<(u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| BenchError::floor("INFO commandstats", e))?;
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find_map(|l| l.strip_prefix(&prefix)) else {
        return Ok((0, 0));
    };
    let field = |name: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((field("calls"), field("usec")))
}

/// Microseconds the server spent per call of each operation (from `INFO commandstats` around
/// one untimed pass of each: EVALSHA for the scripts, PING for PING), to tell the server's
/// share of each p50 from the round trip's and the client's. Includes other clients' calls
/// made meanwhile.
async fn server_time(
    store: &RedisStore,
    ops: &OpBench<RedisStore>,
    noop: &str,
    floor_key: &str,
    prefix: &str,
) -> Result<Vec<(&'static str, f64)>> {
    let mut conn = store.connection();
    let mut per_call = Vec::new();
    let mut tokens = Vec::new();
    let tasks = common::names(prefix, "tick", 200)?;
    let holder = leasehold::HolderId::generate();
    for what in [
        "PING",
        "no-op script",
        "acquire",
        "renew",
        "release",
        "tick",
    ] {
        let commands: &[&str] = if what == "PING" {
            &["ping"]
        } else {
            STORE_COMMANDS
        };
        let usec0 = server_usec(&mut conn, commands).await?;
        match what {
            "PING" => drop(Probe::Ping.round(&mut conn, 200).await?),
            "no-op script" => drop(evalsha_round(&mut conn, noop, floor_key, 200).await?),
            "acquire" => tokens = ops.acquire_all().await?,
            "renew" => ops.renew_all(&tokens).await?,
            "release" => ops.release_all(&tokens).await?,
            _ => {
                let now = store
                    .now_millis()
                    .await
                    .map_err(|e| BenchError::store("time", e))?;
                for task in &tasks {
                    let request = TickRequest::new(task, &holder, common::OP_TTL, now, None);
                    store
                        .tick(&request)
                        .await
                        .map_err(|e| BenchError::store("tick", e))?;
                }
            }
        }
        let usec1 = server_usec(&mut conn, commands).await?;
        let count = match what {
            "PING" | "no-op script" => 200,
            "tick" => tasks.len(),
            _ => tokens.len(),
        };
        per_call.push((
            what,
            usec1.saturating_sub(usec0) as f64 / count.max(1) as f64,
        ));
    }
    Ok(per_call)
}

/// What the store sends for its operations: scripts, TIME for a tick composed of separate
/// calls, and the native renew and release with its PUBLISH.
const STORE_COMMANDS: &[&str] = &[
    "evalsha", "eval", "time", "set", "delifeq", "delex", "publish",
];

/// `server version` from HELLO, for the notes.
async fn hello(conn: &mut RedisConnection) -> String {
    let reply: redis::RedisResult<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("HELLO").query_async(conn).await;
    let Ok(fields) = reply else {
        return "an error (Redis < 6)".to_owned();
    };
    let field = |name: &str| {
        fields
            .get(name)
            .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            .unwrap_or_default()
    };
    format!("{} {}", field("server"), field("version"))
}

/// Microseconds the server spent in `commands` so far (`INFO commandstats`).
async fn server_usec(conn: &mut RedisConnection, commands: &[&str]) -> Result<u64> {
    let mut total = 0;
    for command in commands {
        total += command_stat(conn, command).await?.1;
    }
    Ok(total)
}

/// The Redis server's time so far in what the store sends (`INFO commandstats`:
/// [`STORE_COMMANDS`]), for the sidecar rows.
struct Commandstats {
    store: RedisStore,
    /// On a cluster the counters are every node's: not read.
    skip: bool,
}

impl ServerClock for Commandstats {
    async fn busy_us(&self) -> Option<u64> {
        if self.skip {
            return None;
        }
        let mut conn = self.store.connection();
        server_usec(&mut conn, STORE_COMMANDS).await.ok()
    }
}

/// A script that does nothing: what running any Lua script costs over PING. It names `key`
/// (unread) so that a cluster runs it on the key's slot owner, like the store's scripts.
async fn evalsha_round(
    conn: &mut RedisConnection,
    hash: &str,
    key: &str,
    ops: usize,
) -> Result<Round> {
    let mut rec = Recorder::new(ops);
    for _ in 0..ops {
        rec.start();
        let _: i64 = redis::cmd("EVALSHA")
            .arg(hash)
            .arg(1)
            .arg(key)
            .query_async(conn)
            .await
            .map_err(|e| BenchError::floor("EVALSHA of the no-op script", e))?;
        rec.stop();
    }
    Ok(rec.finish())
}

async fn rslock_round(peer: &rslock::LockManager, resources: &[String]) -> Result<Round> {
    let mut rec = Recorder::new(resources.len());
    for resource in resources {
        rec.start();
        let lock = peer
            .lock(resource.as_str(), Duration::from_secs(60))
            .await
            .map_err(|e| BenchError::floor(format!("rslock lock of {resource}"), e))?;
        peer.unlock(&lock).await;
        rec.stop();
    }
    Ok(rec.finish())
}

/// Deletes every key of this run.
async fn cleanup(store: &RedisStore, key_prefix: &str, deployment: Deployment) -> Result<()> {
    let mut conn = store.connection();
    let pattern = format!("{key_prefix}:*");
    if deployment == Deployment::Cluster {
        // SCAN would walk one node; KEYS goes to every primary and joins their answers, and
        // UNLINK is split by slot.
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut conn)
            .await
            .map_err(|e| BenchError::floor("cleanup: KEYS", e))?;
        for chunk in keys.chunks(1000) {
            let _: i64 = redis::cmd("UNLINK")
                .arg(chunk)
                .query_async(&mut conn)
                .await
                .map_err(|e| BenchError::floor("cleanup: UNLINK", e))?;
        }
        return Ok(());
    }
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .map_err(|e| BenchError::floor("cleanup: SCAN", e))?;
        if !keys.is_empty() {
            let () = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .map_err(|e| BenchError::floor("cleanup: UNLINK", e))?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}
