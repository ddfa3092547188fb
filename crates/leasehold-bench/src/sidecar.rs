//! The sidecar: `leasehold serve` (the [`leasehold_serve::serve`] the command runs) on a
//! loopback port over the Redis store, on a runtime of its own, driven by keep-alive HTTP/1.1
//! connections written and read here (no client library, no `wrk`): one connection, then 64 at
//! once. `GET /healthz` on the same listener is the floor; a gated tick decision, and a lease's
//! acquire, keepalive and release are measured next to it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leasehold::BoxStore;
use leasehold_redis::RedisStore;
use leasehold_serve::{Listen, ServeConfig, Sidecar, SidecarConfig};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tokio::sync::{Barrier, oneshot};
use tokio::task::JoinSet;

use crate::common::rss_bytes;
use crate::error::{BenchError, Result};
use crate::report::{SidecarRow, Target};
use crate::stats::{Figure, Round};

/// Concurrent keep-alive connections of the second pass.
pub(crate) const MANY: usize = 64;

/// What one pass measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    Healthz,
    /// Every connection ticks one task, due every second (`every_ms` 1000) as a fleet's
    /// replicas tick theirs: the first tick of a second claims the slot and runs, and its run
    /// is then reported done; the others answer already-run (or busy while that run holds the
    /// task lease).
    Tick,
    /// Each connection acquires its leases, then keeps each alive once, then releases them.
    Leases,
}

/// A server-time probe: microseconds the store's server spent, from counters read before and
/// after a pass (Redis: `INFO commandstats`).
pub(crate) trait ServerClock {
    /// The server's busy time so far, in µs.
    async fn busy_us(&self) -> Option<u64>;
}

/// The figures of the sidecar passes.
pub(crate) struct SidecarPlan<'a> {
    pub(crate) prefix: &'a str,
    pub(crate) rounds: usize,
    /// Requests per connection per round with one connection.
    pub(crate) one: usize,
    /// Requests per connection per round with [`MANY`] connections.
    pub(crate) each_of_many: usize,
    /// The store's acquire p50 in this run (µs), for the tick target.
    pub(crate) acquire_p50_us: f64,
    /// Requests of the memory pass (0: none).
    pub(crate) memory_requests: usize,
}

/// The resident set's growth over the memory pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Growth {
    pub(crate) requests: usize,
    pub(crate) rss_before: u64,
    pub(crate) rss_after: u64,
}

/// The most the resident set may grow over the memory pass (issue 28).
pub(crate) const MAX_GROWTH: u64 = 10 << 20;

/// The thread serving the sidecar, with what `serve` returned.
type Served = std::thread::JoinHandle<std::io::Result<()>>;

/// Serves a sidecar over `store` on a loopback port, on a runtime of its own with `leasehold
/// serve`'s default thread count (as that process would run beside the bench's), until the
/// returned sender is dropped.
fn start(store: RedisStore) -> Result<(SocketAddr, oneshot::Sender<()>, Served)> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |source| BenchError::Io { what, source }
    };
    // A free port: bound, read and let go (the sidecar binds it again at once).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(io("bind a loopback port for the sidecar"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(leasehold_serve::DEFAULT_THREADS)
        .enable_all()
        .build()
        .map_err(io("start the sidecar's runtime"))?;
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        runtime.block_on(async move {
            let sidecar = Sidecar::new(
                BoxStore::new(store),
                SidecarConfig::default().holder("leasehold-bench"),
            );
            let shutdown = async move {
                let _ = stopped.await;
            };
            let listen = Listen::Tcp(addr);
            leasehold_serve::serve(sidecar, &listen, ServeConfig::default(), shutdown).await
        })
    });
    Ok((addr, stop, thread))
}

/// One keep-alive connection to the sidecar.
pub(crate) struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// A response: status and body.
pub(crate) struct Response<'a> {
    pub(crate) status: u16,
    pub(crate) body: &'a [u8],
}

impl Connection {
    pub(crate) async fn open(addr: SocketAddr) -> Result<Self> {
        let mut last = None;
        // The sidecar may still be binding its port.
        for _ in 0..100 {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(Self {
                        stream,
                        buf: Vec::with_capacity(1024),
                    });
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(BenchError::Io {
            what: format!("connect to the sidecar at {addr}"),
            source: last.unwrap_or_else(|| std::io::Error::other("no attempt")),
        })
    }

    /// Sends one request (`body` as JSON when given) and reads its response.
    pub(crate) async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Response<'_>> {
        let mut request = Vec::with_capacity(128 + path.len() + body.map_or(0, str::len));
        request.extend_from_slice(method.as_bytes());
        request.push(b' ');
        request.extend_from_slice(path.as_bytes());
        request.extend_from_slice(b" HTTP/1.1\r\nhost: localhost\r\n");
        if let Some(body) = body {
            request.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
            request.extend_from_slice(body.len().to_string().as_bytes());
            request.extend_from_slice(b"\r\n\r\n");
            request.extend_from_slice(body.as_bytes());
        } else {
            request.extend_from_slice(b"\r\n");
        }
        let failed = |e| BenchError::Io {
            what: format!("{method} {path} on the sidecar"),
            source: e,
        };
        self.stream.write_all(&request).await.map_err(failed)?;
        self.buf.clear();
        let (head, length) = loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head = end + 4;
                break (head, content_length(&self.buf[..head]));
            }
            self.read_more().await.map_err(failed)?;
        };
        while self.buf.len() < head + length {
            self.read_more().await.map_err(failed)?;
        }
        let status = std::str::from_utf8(self.buf.get(9..12).unwrap_or_default())
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Ok(Response {
            status,
            body: &self.buf[head..head + length],
        })
    }

    /// Reports the run a tick's `answer` granted as done (`ok`) on the tick's path `tick`:
    /// whether it granted one (and so a `done` request was sent).
    pub(crate) async fn done_if_granted(
        &mut self,
        tick: &str,
        answer: &serde_json::Value,
    ) -> Result<bool> {
        if answer.get("run") != Some(&serde_json::Value::Bool(true)) {
            return Ok(false);
        }
        let slot = field("tick", answer, "slot")?;
        let token = field("tick", answer, "token")?;
        let done = format!(r#"{{"token":{token},"outcome":"ok"}}"#);
        let path = format!("{tick}/{slot}/done");
        ok_json("done", &self.call("POST", &path, Some(&done)).await?)?;
        Ok(true)
    }

    async fn read_more(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the sidecar closed the connection",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The `content-length` of a response head (0 without one).
fn content_length(head: &[u8]) -> usize {
    let head = String::from_utf8_lossy(head);
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// A 200 response's JSON body.
pub(crate) fn ok_json(what: &str, response: &Response<'_>) -> Result<serde_json::Value> {
    if response.status != 200 {
        return Err(BenchError::Unexpected(format!(
            "{what}: HTTP {} {}",
            response.status,
            String::from_utf8_lossy(response.body)
        )));
    }
    serde_json::from_slice(response.body)
        .map_err(|e| BenchError::Unexpected(format!("{what}: unreadable answer: {e}")))
}

pub(crate) fn field<'v>(
    what: &str,
    json: &'v serde_json::Value,
    name: &str,
) -> Result<&'v serde_json::Value> {
    json.get(name)
        .ok_or_else(|| BenchError::Unexpected(format!("{what}: no {name} in {json}")))
}

/// Latencies of one connection's pass, per request kind.
#[derive(Default)]
struct Timings {
    main: Vec<Duration>,
    keepalive: Vec<Duration>,
    release: Vec<Duration>,
    /// Ticks that ran (each then reported done).
    runs: usize,
}

/// One kind of latency of a connection's pass.
type Pick = fn(&Timings) -> &Vec<Duration>;

fn timed(out: &mut Vec<Duration>, started: Instant) {
    out.push(started.elapsed());
}

/// The instants at which every connection of a round had ended a phase (the first: had
/// connected), so each phase's requests/s is over its own wall time.
#[derive(Clone)]
struct Phases {
    barrier: Arc<Barrier>,
    marks: Arc<Mutex<Vec<Instant>>>,
}

impl Phases {
    fn new(clients: usize) -> Self {
        Self {
            barrier: Arc::new(Barrier::new(clients)),
            marks: Arc::default(),
        }
    }

    async fn mark(&self) {
        if self.barrier.wait().await.is_leader() {
            self.marks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Instant::now());
        }
    }

    /// The wall time of phase `i` (0: the first after connecting).
    fn wall(&self, i: usize) -> Duration {
        let marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        match (marks.get(i), marks.get(i + 1)) {
            (Some(a), Some(b)) => *b - *a,
            _ => Duration::ZERO,
        }
    }
}

/// Marks a connection reaches after connecting: one per phase (three for leases; the one-phase
/// loads reach the rest at once).
const PHASES: usize = 3;

/// One connection's pass of `load`: `n` requests of its kind, over names of its own.
async fn pass(
    addr: SocketAddr,
    load: Load,
    prefix: String,
    n: usize,
    phases: Phases,
) -> Result<Timings> {
    let conn = Connection::open(addr).await;
    phases.mark().await;
    let mut t = Timings::default();
    let mut marked = 0;
    let result = match conn {
        Ok(mut conn) => requests(&mut conn, load, &prefix, n, &mut t, &phases, &mut marked).await,
        Err(e) => Err(e),
    };
    // Every connection reaches every mark, failed or not, so that none waits forever.
    while marked < PHASES {
        phases.mark().await;
        marked += 1;
    }
    result.map(|()| t)
}

async fn requests(
    conn: &mut Connection,
    load: Load,
    prefix: &str,
    n: usize,
    t: &mut Timings,
    phases: &Phases,
    marked: &mut usize,
) -> Result<()> {
    match load {
        Load::Healthz => {
            for _ in 0..n {
                let started = Instant::now();
                let r = conn.call("GET", "/healthz", None).await?;
                if r.status != 200 {
                    return Err(BenchError::Unexpected(format!(
                        "GET /healthz: HTTP {}",
                        r.status
                    )));
                }
                timed(&mut t.main, started);
            }
        }
        Load::Tick => {
            let path = format!("/v1/tasks/{prefix}/ticks");
            let body = r#"{"every_ms":1000,"ttl_ms":10000}"#;
            for _ in 0..n {
                let started = Instant::now();
                let answer = ok_json("tick", &conn.call("POST", &path, Some(body)).await?)?;
                timed(&mut t.main, started);
                if answer.get("run") == Some(&serde_json::Value::Bool(true)) {
                    t.runs += 1;
                    let slot = field("tick", &answer, "slot")?;
                    let token = field("tick", &answer, "token")?;
                    let done = format!(r#"{{"token":{token},"outcome":"ok"}}"#);
                    let done_path = format!("{path}/{slot}/done");
                    ok_json("done", &conn.call("POST", &done_path, Some(&done)).await?)?;
                } else if answer.get("reason").and_then(|r| r.as_str()) == Some("store-down") {
                    return Err(BenchError::Unexpected(format!("tick: {answer}")));
                }
            }
        }
        Load::Leases => {
            let mut tokens = Vec::with_capacity(n);
            for i in 0..n {
                let path = format!("/v1/leases/{prefix}-{i}/acquire");
                let started = Instant::now();
                let answer = ok_json(
                    "acquire",
                    &conn
                        .call("POST", &path, Some(r#"{"ttl_ms":30000}"#))
                        .await?,
                )?;
                timed(&mut t.main, started);
                if answer.get("acquired") != Some(&serde_json::Value::Bool(true)) {
                    return Err(BenchError::Unexpected(format!("acquire: {answer}")));
                }
                let token = field("acquire", &answer, "token")?;
                tokens.push(format!(r#"{{"token":{token}}}"#));
            }
            for (op, out) in [("keepalive", &mut t.keepalive), ("release", &mut t.release)] {
                phases.mark().await;
                *marked += 1;
                for (i, token) in tokens.iter().enumerate() {
                    let path = format!("/v1/leases/{prefix}-{i}/{op}");
                    let started = Instant::now();
                    ok_json(op, &conn.call("POST", &path, Some(token)).await?)?;
                    timed(out, started);
                }
            }
        }
    }
    phases.mark().await;
    *marked += 1;
    Ok(())
}

/// One round of `load` over `clients` connections at once, `n` requests each: every
/// connection's timings, and the wall time of each phase.
async fn round(
    addr: SocketAddr,
    load: Load,
    prefix: &str,
    clients: usize,
    n: usize,
    round: usize,
) -> Result<(Vec<Timings>, [Duration; PHASES])> {
    let phases = Phases::new(clients);
    let mut set = JoinSet::new();
    for c in 0..clients {
        // Ticks of many connections are for one task, as a fleet's replicas tick theirs; leases
        // are each connection's own.
        let prefix = match load {
            Load::Tick => format!("{prefix}-r{round}"),
            _ => format!("{prefix}-r{round}c{c}"),
        };
        set.spawn(pass(addr, load, prefix, n, phases.clone()));
    }
    let mut all = Vec::with_capacity(clients);
    while let Some(joined) = set.join_next().await {
        all.push(joined.map_err(|e| BenchError::lease("a sidecar client failed", e))??);
    }
    Ok((all, [phases.wall(0), phases.wall(1), phases.wall(2)]))
}

/// A row's rounds: every connection's latencies of one kind together, requests/s over the
/// wall time of `phase`.
fn rounds_of(
    rounds: &[(Vec<Timings>, [Duration; PHASES])],
    phase: usize,
    pick: Pick,
) -> Vec<Round> {
    rounds
        .iter()
        .map(|(timings, walls)| {
            let latencies: Vec<Duration> = timings
                .iter()
                .flat_map(|t| pick(t).iter().copied())
                .collect();
            Round::new(&latencies, walls[phase])
        })
        .collect()
}

/// Every sidecar row: `/healthz`, tick, acquire, keepalive, release with one connection and
/// with [`MANY`], over `store`; with the server's time per request where `server` tells it.
pub(crate) async fn bench(
    plan: &SidecarPlan<'_>,
    store: RedisStore,
    server: &impl ServerClock,
) -> Result<(Vec<SidecarRow>, Vec<String>, Option<Growth>)> {
    let (addr, stop, served) = start(store)?;
    let result = async {
        let (rows, notes) = measure(plan, addr, server).await?;
        let growth = match plan.memory_requests {
            0 => None,
            n => Some(memory(addr, plan.prefix, n).await?),
        };
        Ok((rows, notes, growth))
    }
    .await;
    drop(stop);
    let served = tokio::task::spawn_blocking(move || served.join()).await;
    match served {
        // The sidecar could not serve: that, rather than the clients' failure to connect.
        Ok(Ok(Err(source))) => Err(BenchError::Io {
            what: format!("serve the sidecar on {addr}"),
            source,
        }),
        _ => result,
    }
}

async fn measure(
    plan: &SidecarPlan<'_>,
    addr: SocketAddr,
    server: &impl ServerClock,
) -> Result<(Vec<SidecarRow>, Vec<String>)> {
    // Warm up: connections, the scripts on the server, the sidecar's first clock reading.
    round(addr, Load::Healthz, plan.prefix, 1, 50, 0).await?;
    round(addr, Load::Tick, &format!("{}-warm", plan.prefix), 1, 20, 0).await?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for clients in [1, MANY] {
        let n = if clients == 1 {
            plan.one
        } else {
            plan.each_of_many
        };
        let mut floor = None;
        for load in [Load::Healthz, Load::Tick, Load::Leases] {
            let before = server.busy_us().await;
            let mut rounds = Vec::with_capacity(plan.rounds);
            for r in 0..plan.rounds {
                let prefix = format!("{}-{load:?}-{clients}", plan.prefix);
                rounds.push(round(addr, load, &prefix, clients, n, r + 1).await?);
            }
            let after = server.busy_us().await;
            let requests: usize = rounds
                .iter()
                .flat_map(|(t, _)| t.iter())
                .map(|t| t.main.len() + t.keepalive.len() + t.release.len() + t.runs)
                .sum();
            let server_us = match (before, after) {
                (Some(us0), Some(us1)) if requests > 0 => {
                    Some(us1.saturating_sub(us0) as f64 / requests as f64)
                }
                _ => None,
            };
            let floor_p50 = floor;
            let row = |op: &str, figure: Figure, target: Option<Target>, server_us: Option<f64>| {
                SidecarRow {
                    op: op.to_owned(),
                    clients,
                    figure,
                    vs_floor_us: floor_p50.map(|f: f64| figure.p50_us.median - f),
                    server_us,
                    target,
                }
            };
            match load {
                Load::Healthz => {
                    let figure = Figure::of(&rounds_of(&rounds, 0, |t| &t.main));
                    floor = Some(figure.p50_us.median);
                    rows.push(row("GET /healthz (floor)", figure, None, None));
                }
                Load::Tick => {
                    let figure = Figure::of(&rounds_of(&rounds, 0, |t| &t.main));
                    let ticks: usize = rounds
                        .iter()
                        .flat_map(|(t, _)| t.iter())
                        .map(|t| t.main.len())
                        .sum();
                    let runs: usize = rounds
                        .iter()
                        .flat_map(|(t, _)| t.iter())
                        .map(|t| t.runs)
                        .sum();
                    let target = if clients == 1 {
                        let bound = floor.unwrap_or(0.0) + 1.2 * plan.acquire_p50_us;
                        Some(Target::new(
                            format!("p50 ≤ /healthz + 1.2× redis acquire ({bound:.0}µs)"),
                            figure.p50_us.median <= bound,
                        ))
                    } else {
                        Some(Target::new(
                            "≥ 30,000 decisions/s",
                            figure.ops_per_sec.median >= 30_000.0,
                        ))
                    };
                    // Per request of the pass: the dones' (a release, a history write) too.
                    rows.push(row("tick (gated decision)", figure, target, server_us));
                    notes.push(format!(
                        "sidecar, {clients} connection(s) ticking one task due every second: {:.1}% \
                         of ticks ran (each then reported done on its connection, not timed in \
                         the tick row but within its phase); the rest did not run (already-run, \
                         or busy while a run held the task lease)",
                        100.0 * runs as f64 / ticks.max(1) as f64
                    ));
                }
                Load::Leases => {
                    let kinds: [(&str, Pick); PHASES] = [
                        ("lease acquire", |t| &t.main),
                        ("lease keepalive (renew)", |t| &t.keepalive),
                        ("lease release", |t| &t.release),
                    ];
                    for (phase, (op, pick)) in kinds.into_iter().enumerate() {
                        let figure = Figure::of(&rounds_of(&rounds, phase, pick));
                        rows.push(row(op, figure, None, None));
                    }
                }
            }
        }
    }
    Ok((rows, notes))
}

/// The memory pass: [`MANY`] connections each repeat acquire, keepalive and release of a lease
/// of their own and a tick of one shared task until `requests` were answered. The resident set
/// (of this process, which serves the sidecar; the clients keep no per-request state) is read
/// after a tenth of them, once buffers and pools have grown to their working size, and at the
/// end.
async fn memory(addr: SocketAddr, prefix: &str, requests: usize) -> Result<Growth> {
    let sent = Arc::new(AtomicUsize::new(0));
    let warm = requests / 10;
    let before = Arc::new(Mutex::new(None));
    let mut set = JoinSet::new();
    for c in 0..MANY {
        let (sent, before) = (sent.clone(), before.clone());
        let prefix = format!("{prefix}-mem");
        set.spawn(async move {
            let mut conn = Connection::open(addr).await?;
            let tick = format!("/v1/tasks/{prefix}/ticks");
            // A few names per connection, reused: the store's keys stay few.
            for i in 0.. {
                let lease = format!("/v1/leases/{prefix}-c{c}-{}", i % 4);
                let answer = ok_json(
                    "acquire",
                    &conn
                        .call(
                            "POST",
                            &format!("{lease}/acquire"),
                            Some(r#"{"ttl_ms":30000}"#),
                        )
                        .await?,
                )?;
                let token = format!(r#"{{"token":{}}}"#, field("acquire", &answer, "token")?);
                for op in ["keepalive", "release"] {
                    ok_json(
                        op,
                        &conn
                            .call("POST", &format!("{lease}/{op}"), Some(&token))
                            .await?,
                    )?;
                }
                let answer = ok_json(
                    "tick",
                    &conn
                        .call("POST", &tick, Some(r#"{"every_ms":1000,"ttl_ms":10000}"#))
                        .await?,
                )?;
                let mut n = 4;
                if conn.done_if_granted(&tick, &answer).await? {
                    n += 1;
                }
                let total = sent.fetch_add(n, Ordering::Relaxed) + n;
                if total >= warm {
                    let mut before = before.lock().unwrap_or_else(|p| p.into_inner());
                    if before.is_none() {
                        *before = Some((total, rss_bytes()?));
                    }
                }
                if total >= warm + requests {
                    break;
                }
            }
            Ok::<(), BenchError>(())
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.map_err(|e| BenchError::lease("a sidecar client failed", e))??;
    }
    let rss_after = rss_bytes()?;
    let (at, rss_before) = before
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .unwrap_or((0, rss_after));
    Ok(Growth {
        requests: sent.load(Ordering::Relaxed) - at,
        rss_before,
        rss_after,
    })
}
