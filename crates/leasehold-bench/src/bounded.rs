//! The bounded-state pass (issue 36, `leasehold bench --bounded-state`): a release build of the
//! sidecar (`leasehold serve` from this very binary, in a process of its own, over Redis under a
//! key prefix of the run's) is driven with many requests over many distinct task and group
//! names, which are then given up; what it keeps must go with them. Printed: its resident set
//! (`VmRSS` of `/proc/PID/status`) and its `/metrics` size at the start, at the peak and after
//! the give-up.
//!
//! The names come in threes, each three on one connection: a task ticked (every second, its
//! runs reported done) in a group of its own, which the sidecar campaigns for, and a group the
//! application campaigns for itself, kept alive between the ticks and released at the end. The
//! tasks and their groups are given up by going idle (twice the interval plus the ttl: 5 s);
//! the pass then waits for the ends the sidecar remembers (2 minutes) to be forgotten too.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::error::{BenchError, Result};
use crate::sidecar::{Connection, field, ok_json};

/// Connections driving the sidecar at once.
pub(crate) const CONNECTIONS: usize = 16;

/// The most the resident set may grow from the start to after the give-up.
pub(crate) const MAX_GROWTH: u64 = 10 << 20;

/// How long after the last request the names are all given up and forgotten: the tasks' and
/// groups' idle expiry (5 s), a catalog heartbeat, and the 2 minutes the ends of leases and runs
/// are remembered (for a late call about one), with a margin.
const GIVE_UP: Duration = Duration::from_secs(135);

/// The tick body: due every second, a 3 s ttl, in group `GROUP`.
fn tick_body(group: &str) -> String {
    format!(r#"{{"every_ms":1000,"ttl_ms":3000,"group":"{group}"}}"#)
}

/// What the pass does.
#[derive(Debug, Clone)]
pub(crate) struct BoundedPlan {
    /// Requests in all.
    pub(crate) requests: usize,
    /// Distinct task and group names in all.
    pub(crate) names: usize,
    /// The Redis server the sidecar runs on.
    pub(crate) redis_url: String,
    /// Its keys' prefix (deleted afterwards).
    pub(crate) key_prefix: String,
    /// Lease names start with it.
    pub(crate) prefix: String,
}

/// The sizes at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub(crate) rss: u64,
    pub(crate) metrics_lines: usize,
    pub(crate) metrics_bytes: usize,
    /// `/metrics` lines that name a task or group of the pass (warm-up included).
    pub(crate) named_lines: usize,
}

/// What the pass measured.
#[derive(Debug, Clone)]
pub(crate) struct Bounded {
    pub(crate) requests: usize,
    pub(crate) names: usize,
    pub(crate) load: Duration,
    pub(crate) start: Sizes,
    /// The largest of each, not necessarily at one moment.
    pub(crate) peak: Sizes,
    pub(crate) after: Sizes,
}

impl Bounded {
    /// The table docs/bench.md records.
    pub(crate) fn table(&self) -> String {
        let mb = |b: u64| format!("{:.1} MB", b as f64 / 1_048_576.0);
        let mut out = format!(
            "Bounded state (issue 36): {} requests over {} task and group names, {} connections, \
             in {:.0} s ({:.0} requests/s)\n\n",
            thousands(self.requests as u64),
            thousands(self.names as u64),
            CONNECTIONS,
            self.load.as_secs_f64(),
            self.requests as f64 / self.load.as_secs_f64().max(0.001),
        );
        out.push_str(
            "| moment | sidecar RSS | /metrics lines | /metrics bytes | lines naming the pass's tasks and groups |\n",
        );
        out.push_str("|---|---:|---:|---:|---:|\n");
        for (moment, s) in [
            ("start (after a warm-up)", self.start),
            ("peak", self.peak),
            ("after give-up", self.after),
        ] {
            out.push_str(&format!(
                "| {moment} | {} | {} | {} | {} |\n",
                mb(s.rss),
                thousands(s.metrics_lines as u64),
                thousands(s.metrics_bytes as u64),
                thousands(s.named_lines as u64)
            ));
        }
        let growth = self.after.rss.saturating_sub(self.start.rss);
        // Back when no series names a task or group of the pass any more. (Series without a
        // name, such as a route's status or a store answer first met in the load, are a fixed
        // set kept for the life of the process.)
        let back = self.after.named_lines == 0;
        out.push_str(&format!(
            "\nRSS growth after give-up: {} (target ≤ {}: {}); series back to baseline: {}\n",
            mb(growth),
            mb(MAX_GROWTH),
            if growth <= MAX_GROWTH {
                "met"
            } else {
                "MISSED"
            },
            if back { "yes" } else { "NO" },
        ));
        out
    }
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The sidecar's process, killed when dropped.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Io { what, source }
}

/// Starts `leasehold serve` (this binary) on a free loopback port.
fn start(plan: &BoundedPlan) -> Result<(Served, SocketAddr)> {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(io("bind a loopback port for the sidecar"))?;
    let bin = std::env::current_exe().map_err(io("find this binary"))?;
    let joiner = if plan.redis_url.contains('?') {
        '&'
    } else {
        '?'
    };
    let store = format!("{}{joiner}prefix={}", plan.redis_url, plan.key_prefix);
    let child = Command::new(&bin)
        .args(["serve", "--store", &store, "--holder", "bench-bounded"])
        .arg("--listen")
        .arg(addr.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(io(format!("start {} serve", bin.display())))?;
    Ok((Served(child), addr))
}

/// `VmRSS` of process `pid`, in bytes.
fn rss_of(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(io(format!("read {path}")))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| BenchError::Unexpected(format!("no VmRSS in {path}")))
}

/// The sidecar's sizes now (on a connection of its own: an idle one would be closed).
async fn sizes(addr: SocketAddr, pid: u32, prefix: &str) -> Result<Sizes> {
    let mut conn = Connection::open(addr).await?;
    let response = conn.call("GET", "/metrics", None).await?;
    if response.status != 200 {
        return Err(BenchError::Unexpected(format!(
            "GET /metrics: HTTP {}",
            response.status
        )));
    }
    let text = String::from_utf8_lossy(response.body);
    let (metrics_lines, metrics_bytes) = (text.lines().count(), response.body.len());
    Ok(Sizes {
        rss: rss_of(pid)?,
        metrics_lines,
        metrics_bytes,
        named_lines: text.lines().filter(|l| l.contains(prefix)).count(),
    })
}

/// The units of three names: `0..units`, `requests` requests in all.
struct Load {
    prefix: String,
    units: usize,
    requests: usize,
    next: AtomicUsize,
    sent: AtomicU64,
}

/// One unit on `conn`: its group campaigned for, its task ticked and the group kept alive in
/// turns until the unit's share of requests is sent, then the group released.
async fn unit(conn: &mut Connection, load: &Load, u: usize, share: usize) -> Result<()> {
    let p = &load.prefix;
    let (task, tick_group, group) = (
        format!("{p}-t{u}"),
        format!("{p}-g{u}"),
        format!("{p}-c{u}"),
    );
    let granted = ok_json(
        "campaign",
        &conn
            .call(
                "POST",
                &format!("/v1/groups/{group}/campaign"),
                Some(r#"{"ttl_ms":10000}"#),
            )
            .await?,
    )?;
    let token = format!(r#"{{"token":{}}}"#, field("campaign", &granted, "token")?);
    let tick = format!("/v1/tasks/{task}/ticks");
    let body = tick_body(&tick_group);
    let mut sent = 1;
    while sent + 1 < share {
        let answer = ok_json("tick", &conn.call("POST", &tick, Some(&body)).await?)?;
        sent += 1;
        if conn.done_if_granted(&tick, &answer).await? {
            sent += 1;
        }
        if sent + 1 < share {
            let path = format!("/v1/leases/{group}/keepalive");
            ok_json("keepalive", &conn.call("POST", &path, Some(&token)).await?)?;
            sent += 1;
        }
    }
    let released = ok_json(
        "release",
        &conn
            .call("POST", &format!("/v1/leases/{group}/release"), Some(&token))
            .await?,
    )?;
    if released.get("released") != Some(&serde_json::Value::Bool(true)) {
        return Err(BenchError::Unexpected(format!("release: {released}")));
    }
    load.sent.fetch_add(sent as u64 + 1, Ordering::Relaxed);
    Ok(())
}

/// Sends `load` over [`CONNECTIONS`] connections, each taking the next unit until none is left.
async fn drive(addr: SocketAddr, load: Arc<Load>) -> Result<()> {
    let share = load.requests.div_ceil(load.units.max(1)).max(3);
    let mut set = JoinSet::new();
    for _ in 0..CONNECTIONS {
        let load = load.clone();
        set.spawn(async move {
            let mut conn = Connection::open(addr).await?;
            loop {
                let u = load.next.fetch_add(1, Ordering::Relaxed);
                if u >= load.units {
                    return Ok::<(), BenchError>(());
                }
                unit(&mut conn, &load, u, share).await?;
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.map_err(|e| BenchError::lease("a sidecar client failed", e))??;
    }
    Ok(())
}

/// Runs the pass: see the module documentation.
pub(crate) async fn bounded(plan: &BoundedPlan) -> Result<Bounded> {
    let (served, addr) = start(plan)?;
    let pid = served.0.id();
    // A warm-up of a few units (every route, the store's scripts, the pools at their working
    // size), given up before the start is read.
    let warm = Arc::new(Load {
        prefix: format!("{}-warm", plan.prefix),
        units: 64,
        requests: 64 * 30,
        next: AtomicUsize::new(0),
        sent: AtomicU64::new(0),
    });
    drive(addr, warm).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    sizes(addr, pid, &plan.prefix).await?;
    let start = sizes(addr, pid, &plan.prefix).await?;

    let units = plan.names.div_ceil(3).max(1);
    let load = Arc::new(Load {
        prefix: plan.prefix.clone(),
        units,
        requests: plan.requests,
        next: AtomicUsize::new(0),
        sent: AtomicU64::new(0),
    });
    // The peak: sampled every half second (the resident set) and every 2 s (`/metrics`) while
    // the load runs.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        let load = load.clone();
        let prefix = plan.prefix.clone();
        tokio::spawn(async move {
            let mut peak = Sizes::default();
            let mut last_scrape = Instant::now();
            let mut reported = 0;
            while !done.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let rss = rss_of(pid)?;
                peak.rss = peak.rss.max(rss);
                if last_scrape.elapsed() >= Duration::from_secs(2) {
                    let now = sizes(addr, pid, &prefix).await?;
                    peak.metrics_lines = peak.metrics_lines.max(now.metrics_lines);
                    peak.metrics_bytes = peak.metrics_bytes.max(now.metrics_bytes);
                    peak.named_lines = peak.named_lines.max(now.named_lines);
                    last_scrape = Instant::now();
                }
                let sent = load.sent.load(Ordering::Relaxed) / 100_000;
                if sent > reported {
                    reported = sent;
                    eprintln!(
                        "bounded state: {} requests, RSS {:.1} MB",
                        thousands(sent * 100_000),
                        rss as f64 / 1_048_576.0
                    );
                }
            }
            Ok::<Sizes, BenchError>(peak)
        })
    };
    let began = Instant::now();
    let driven = drive(addr, load.clone()).await;
    let took = began.elapsed();
    done.store(true, Ordering::Relaxed);
    let mut peak = sampler
        .await
        .map_err(|e| BenchError::lease("the sampler failed", e))??;
    driven?;
    let end = sizes(addr, pid, &plan.prefix).await?;
    peak.rss = peak.rss.max(end.rss);
    peak.metrics_lines = peak.metrics_lines.max(end.metrics_lines);
    peak.metrics_bytes = peak.metrics_bytes.max(end.metrics_bytes);
    peak.named_lines = peak.named_lines.max(end.named_lines);
    eprintln!(
        "bounded state: load done; waiting {} s for the names to be given up",
        GIVE_UP.as_secs()
    );

    // The give-up: no request about these names any more (a scrape every 30 s).
    let until = Instant::now() + GIVE_UP;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(30).min(until - Instant::now())).await;
        let now = sizes(addr, pid, &plan.prefix).await?;
        peak.rss = peak.rss.max(now.rss);
    }
    sizes(addr, pid, &plan.prefix).await?;
    let after = sizes(addr, pid, &plan.prefix).await?;
    drop(served);
    Ok(Bounded {
        requests: load.sent.load(Ordering::Relaxed) as usize,
        names: units * 3,
        load: took,
        start,
        peak,
        after,
    })
}
