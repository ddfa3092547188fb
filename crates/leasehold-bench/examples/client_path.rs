//! A fixed number of one Redis operation, for counting the client's instructions per operation
//! with `valgrind --tool=callgrind` (stable on a loaded machine, unlike wall-clock time):
//!
//! ```text
//! cargo build --release -p leasehold-bench --example client_path
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \
//!     target/release/examples/client_path store-acquire-release 2000
//! ```
//!
//! Run it twice with different counts and divide the difference of the totals by the difference
//! of the counts: that cancels start-up and connection set-up. Modes: `ping`, `evalsha-noop`,
//! `raw-acquire-release` and `raw-renew` (EVALSHA through the redis crate of stand-in scripts
//! taking the store's keys and arguments and answering like its scripts: the client's least
//! work for the same calls), `store-acquire`,
//! `store-acquire-release` and `store-renew` (the [`Store`] calls of `leasehold-redis`),
//! `lease-acquire-release` (`Lease::try_acquire` then `LeaseGuard::release`) and `rslock`
//! (lock+unlock). Arguments: MODE OPS [URL] [THREADS]; THREADS 0 (default) is a current-thread
//! runtime. `NO_NOTIFY=1` connects the store without its release listener (whose share of a
//! release is the pub/sub message it receives back).
//!
//! Pointed at a `redis-server` of your own run under callgrind (`callgrind_control -z` before,
//! `-d` after), the same runs count the server's instructions per operation.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use leasehold::{
    HolderId, Lease, LeaseConfig, LeaseName, Release, Store, TryAcquire,
    store::{Acquisition, Renewal},
};
use leasehold_redis::{RedisConfig, RedisConnection, redis};

/// Names cycled through, so keys are reused as a lease taken again and again is.
const NAMES: usize = 100;

/// Stand-in for the acquire script: same keys and arguments, same reply shape, minimal work.
const RAW_ACQUIRE: &str = "return {1, '1700000000000000001'}";
/// Stand-in for the renew and release scripts: answers 1.
const RAW_ONE: &str = "return 1";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(mode), Some(ops)) = (args.first(), args.get(1)) else {
        bail!("usage: client_path MODE OPS [URL] [THREADS]");
    };
    let ops: usize = ops.parse().context("OPS")?;
    let url = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let threads: usize = args
        .get(3)
        .map_or(Ok(0), |t| t.parse())
        .context("THREADS")?;
    let runtime = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(run(mode, ops, &url))
}

async fn run(mode: &str, ops: usize, url: &str) -> anyhow::Result<()> {
    let key_prefix = format!("leasehold-client-path-{}", std::process::id());
    let store = RedisConfig::new(url)
        .prefix(key_prefix.clone())
        .notifications(std::env::var_os("NO_NOTIFY").is_none())
        .connect()
        .await?;
    let names: Vec<LeaseName> = (0..NAMES)
        .map(|i| LeaseName::new(format!("op/{i}")))
        .collect::<Result<_, _>>()?;
    let holder = HolderId::generate();
    let ttl = Duration::from_secs(60);
    let mut conn = store.connection();
    let result = match mode {
        "ping" => ping(&mut conn, ops).await,
        "evalsha-noop" => {
            let hash = load(&mut conn, RAW_ONE).await?;
            for _ in 0..ops {
                let _: i64 = evalsha(&mut conn, &hash, &[], &[]).await?;
            }
            Ok(())
        }
        "raw-acquire-release" => raw(&store, &mut conn, &names, &holder, ops, false).await,
        "raw-renew" => raw(&store, &mut conn, &names, &holder, ops, true).await,
        "store-acquire" => {
            for i in 0..ops {
                acquire(&store, &names[i % NAMES], &holder, ttl).await?;
            }
            Ok(())
        }
        "store-acquire-release" => {
            for i in 0..ops {
                let name = &names[i % NAMES];
                let token = acquire(&store, name, &holder, ttl).await?;
                let r = store.release(name, &holder, token).await?;
                ensure!(r == Release::Released, "release: {r:?}");
            }
            Ok(())
        }
        "store-renew" => {
            let mut tokens = Vec::with_capacity(NAMES);
            for name in &names {
                tokens.push(acquire(&store, name, &holder, ttl).await?);
            }
            for i in 0..ops {
                let r = store
                    .renew(&names[i % NAMES], &holder, tokens[i % NAMES], ttl)
                    .await?;
                ensure!(r == Renewal::Renewed, "renew: {r:?}");
            }
            Ok(())
        }
        "lease-acquire-release" => {
            let config = LeaseConfig::new(ttl);
            let leases: Vec<_> = names
                .iter()
                .map(|n| {
                    Lease::new(store.clone(), n.clone(), config)
                        .map(|l| l.with_holder(holder.clone()))
                })
                .collect::<Result<_, _>>()?;
            for i in 0..ops {
                let TryAcquire::Acquired(guard) = leases[i % NAMES].try_acquire().await? else {
                    bail!("busy");
                };
                let r = guard.release().await?;
                ensure!(r == Release::Released, "release: {r:?}");
            }
            Ok(())
        }
        "rslock" => {
            let peer = rslock::LockManager::new(vec![url.to_owned()]);
            let resources: Vec<String> = (0..NAMES)
                .map(|i| format!("{key_prefix}:rslock:{i}"))
                .collect();
            for i in 0..ops {
                let lock = peer
                    .lock(resources[i % NAMES].as_str(), ttl)
                    .await
                    .map_err(|e| anyhow::anyhow!("rslock: {e}"))?;
                peer.unlock(&lock).await;
            }
            Ok(())
        }
        other => bail!("unknown mode {other}"),
    };
    cleanup(&mut conn, &key_prefix).await?;
    result
}

async fn ping(conn: &mut RedisConnection, ops: usize) -> anyhow::Result<()> {
    for _ in 0..ops {
        let _: String = redis::cmd("PING").query_async(conn).await?;
    }
    Ok(())
}

async fn load(conn: &mut RedisConnection, code: &str) -> anyhow::Result<String> {
    Ok(redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(code)
        .query_async(conn)
        .await?)
}

async fn acquire(
    store: &impl Store,
    name: &LeaseName,
    holder: &HolderId,
    ttl: Duration,
) -> anyhow::Result<leasehold::FencingToken> {
    match store.acquire(name, holder, ttl).await? {
        Acquisition::Acquired { token } => Ok(token),
        busy => bail!("acquire: {busy:?}"),
    }
}

/// `EVALSHA hash numkeys keys… args…` through the redis crate, as a caller writing it by hand.
async fn evalsha<T: redis::FromRedisValue>(
    conn: &mut RedisConnection,
    hash: &str,
    keys: &[&str],
    args: &[&str],
) -> anyhow::Result<T> {
    Ok(redis::cmd("EVALSHA")
        .arg(hash)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query_async(conn)
        .await?)
}

/// The least a client can do for the store's calls: one EVALSHA per call with the same keys
/// and arguments, keys built once. `renew` sends renewals; otherwise an acquire and a release
/// per operation.
async fn raw(
    store: &leasehold_redis::RedisStore,
    conn: &mut RedisConnection,
    names: &[LeaseName],
    holder: &HolderId,
    ops: usize,
    renew: bool,
) -> anyhow::Result<()> {
    let keys: Vec<(String, String)> = names
        .iter()
        .map(|n| (store.lease_key(n), store.fence_key(n)))
        .collect();
    if renew {
        let renew = load(conn, RAW_ONE).await?;
        let tenure = format!("1700000000000000001 {holder}");
        for i in 0..ops {
            let (lease, _) = &keys[i % NAMES];
            let renewed: i64 = evalsha(conn, &renew, &[lease], &[&tenure, "60000"]).await?;
            ensure!(renewed == 1);
        }
        return Ok(());
    }
    let acquire = load(conn, RAW_ACQUIRE).await?;
    let release = load(conn, RAW_ONE).await?;
    for i in 0..ops {
        let (lease, fence) = &keys[i % NAMES];
        let (granted, token): (i64, String) = evalsha(
            conn,
            &acquire,
            &[lease, fence],
            &[holder.as_str(), "60000", "86400000"],
        )
        .await?;
        ensure!(granted == 1);
        let tenure = format!("{token} {holder}");
        let args = [
            tenure.as_str(),
            "leasehold:released",
            names[i % NAMES].as_str(),
        ];
        let released: i64 = evalsha(conn, &release, &[lease], &args).await?;
        ensure!(released == 1);
    }
    Ok(())
}

async fn cleanup(conn: &mut RedisConnection, key_prefix: &str) -> anyhow::Result<()> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{key_prefix}:*"))
        .query_async(conn)
        .await?;
    if !keys.is_empty() {
        let () = redis::cmd("UNLINK").arg(&keys).query_async(conn).await?;
    }
    Ok(())
}
