//! The chaos run: replicas, the store, the proxy, the poller, the faults, then the report.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{BoxStore, LeaseName, Store};
use leasehold_witness::fence;
use leasehold_witness::ledger::{self, Fenced, LedgerEntry};
use nix::sys::signal::Signal;
use serde::Serialize;

use crate::args::{ChaosArgs, StoreKind};
use crate::check::{self, CheckReport, LossWindow};
use crate::error::{ChaosError, Result};
use crate::procs::{self, Replica, Watchdog, epoch_ms};
use crate::proxy::FaultProxy;
use crate::schedule::{self, FaultKind, PlannedFault};
use crate::servers::{self, StoreServer};
use crate::svg::{Marker, Span, Timeline};

mod report;

/// Poll interval of the harness's own view of the leader lease.
const POLL: Duration = Duration::from_millis(5);

/// How long after a witness's runtime is up the harness waits before pausing it mid-work.
const WORK_SETTLE: Duration = Duration::from_millis(15);

/// One tenure of the leader lease as the poller saw it.
#[derive(Debug, Clone)]
struct Tenure {
    holder: String,
    token: u64,
    from_ms: u64,
    to_ms: u64,
}

#[derive(Debug, Default)]
struct PollState {
    tenures: Vec<Tenure>,
    current: Option<String>,
    polls: u64,
    errors: u64,
    last_error: Option<String>,
}

/// Polls `inspect(NAME)` on the store directly (not through the proxy).
struct Poller {
    state: Arc<Mutex<PollState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Poller {
    fn start(store: BoxStore, name: LeaseName) -> Self {
        let state = Arc::new(Mutex::new(PollState::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let seen =
                    tokio::time::timeout(Duration::from_millis(500), store.inspect(&name)).await;
                let now = epoch_ms();
                let mut st = shared.lock().unwrap_or_else(|e| e.into_inner());
                st.polls += 1;
                let state = match seen {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        st.errors += 1;
                        st.last_error = Some(e.to_string());
                        continue;
                    }
                    Err(_) => {
                        st.errors += 1;
                        st.last_error = Some("inspect timed out".into());
                        continue;
                    }
                };
                let held = state.and_then(|s| s.holder.map(|h| (h.to_string(), s.token.get())));
                match held {
                    Some((holder, token)) => {
                        let same = st.current.as_deref() == Some(holder.as_str())
                            && st.tenures.last().is_some_and(|t| t.token == token);
                        if same {
                            if let Some(t) = st.tenures.last_mut() {
                                t.to_ms = now;
                            }
                        } else {
                            st.tenures.push(Tenure {
                                holder: holder.clone(),
                                token,
                                from_ms: now,
                                to_ms: now,
                            });
                            st.current = Some(holder);
                        }
                    }
                    None => st.current = None,
                }
            }
        });
        Self { state, task }
    }

    fn current(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .current
            .clone()
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A fault as it was injected (report.json's `faults`).
#[derive(Debug, Clone, Serialize)]
struct FaultRecord {
    kind: FaultKind,
    at_ms: u64,
    until_ms: Option<u64>,
    target: Option<String>,
    detail: String,
    skipped: bool,
}

/// A paused holder whose command resumed with a stale token.
#[derive(Debug, Clone, Serialize)]
struct FencingCheck {
    holder: String,
    pid: u32,
    token: u64,
    paused_ms: u64,
    resumed_ms: u64,
    fence_max_at_resume: Option<u64>,
}

/// The last tokens the store handed out for the leader lease (`NAME`) and for the task lease
/// the replicas take for each tick (`NAME:run`, whose token the witness writes); `None` where the
/// store has no such lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
struct Tokens {
    leader: Option<u64>,
    task: Option<u64>,
}

impl Tokens {
    fn show(t: Option<u64>) -> String {
        t.map_or("none".into(), |t| t.to_string())
    }
}

/// The store's tokens just before a store restart and once it answered again.
#[derive(Debug, Clone)]
struct RestartCheck {
    at_ms: u64,
    /// Before the restart (`Err`: the store did not answer).
    before: Result<Tokens, String>,
    /// After the restart.
    after: Result<Tokens, String>,
}

impl RestartCheck {
    /// Whether both leases survived the restart: no token is lower (or gone) after it.
    fn kept(&self) -> bool {
        match (&self.before, &self.after) {
            (Ok(b), Ok(a)) => a.leader >= b.leader && a.task >= b.task,
            _ => false,
        }
    }

    fn describe(&self) -> String {
        match (&self.before, &self.after) {
            (Ok(b), Ok(a)) => format!(
                "tokens before/after: leader {}/{}, task {}/{}",
                Tokens::show(b.leader),
                Tokens::show(a.leader),
                Tokens::show(b.task),
                Tokens::show(a.task)
            ),
            (Err(e), _) => format!("tokens unreadable before: {e}"),
            (_, Err(e)) => format!("tokens unreadable after: {e}"),
        }
    }
}

/// A kill or graceful stop of the holder, to measure the takeover from.
#[derive(Debug, Clone, Serialize)]
struct TakeoverProbe {
    kind: FaultKind,
    at_ms: u64,
    old_holder: String,
}

struct Settings {
    store: StoreKind,
    /// The faults this run injects (no store restart for a server the harness does not own).
    kinds: Vec<FaultKind>,
    replicas: usize,
    duration: Duration,
    faults: usize,
    seed: u64,
    ttl: Duration,
    every: Duration,
    work: Duration,
    grace: Duration,
    bin: PathBuf,
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Everything the run owns; dropping it stops every child process and server.
struct Harness {
    s: Settings,
    out: PathBuf,
    ledger: PathBuf,
    fence: PathBuf,
    logs: PathBuf,
    lease: String,
    replica_url: String,
    // Declared before the servers so that replicas stop first.
    replicas: Vec<Replica>,
    retired: Vec<Replica>,
    poller: Option<Poller>,
    polled: PollState,
    proxy: Option<FaultProxy>,
    server: Option<StoreServer>,
    watchdog: Watchdog,
    /// The store, opened directly (not through the proxy), for the restart checks; closed at
    /// shutdown, before the server stops.
    direct: Option<BoxStore>,
    _sqlite_dir: Option<tempfile::TempDir>,
    faults: Vec<FaultRecord>,
    checks: Vec<FencingCheck>,
    probes: Vec<TakeoverProbe>,
    restarts: Vec<RestartCheck>,
    loss: Vec<LossWindow>,
    notes: Vec<String>,
}

pub(crate) async fn run(args: ChaosArgs) -> Result<u8> {
    let mut h = Harness::new(args).await?;
    let outcome = tokio::select! {
        r = h.drive() => r,
        _ = tokio::signal::ctrl_c() => Err(ChaosError::Interrupted),
    };
    if let Err(e) = outcome {
        h.shutdown().await;
        return Err(ChaosError::Run {
            out: h.out.clone(),
            source: Box::new(e),
        });
    }
    h.shutdown().await;
    h.report()
}

impl Harness {
    async fn new(args: ChaosArgs) -> Result<Self> {
        if args.replicas < 2 {
            return Err(ChaosError::Usage(
                "--replicas must be at least 2 (someone has to take over)".into(),
            ));
        }
        if args.ttl < Duration::from_millis(300) {
            return Err(ChaosError::Usage("--ttl must be at least 300ms".into()));
        }
        if args.duration < Duration::from_secs(10) {
            return Err(ChaosError::Usage("--duration must be at least 10s".into()));
        }
        let faults = args.faults.unwrap_or_else(|| {
            usize::try_from(args.duration.as_secs() / 8)
                .unwrap_or(10)
                .max(10)
        });
        let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
        let bin = match args.bin.clone() {
            Some(b) => b,
            None => std::env::current_exe()
                .map_err(|e| ChaosError::io("cannot find this program's path; pass --bin", e))?,
        };
        let out = match args.out.clone() {
            Some(dir) => {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| ChaosError::io(format!("cannot create {}", dir.display()), e))?;
                dir
            }
            None => tempfile::Builder::new()
                .prefix("leasehold-chaos-")
                .tempdir()
                .map_err(|e| ChaosError::io("cannot create a temporary directory", e))?
                .keep(),
        };
        let out = out.canonicalize().unwrap_or(out);
        let logs = out.join("logs");
        std::fs::create_dir_all(&logs)
            .map_err(|e| ChaosError::io(format!("cannot create {}", logs.display()), e))?;
        let ledger = out.join("ledger.jsonl");
        let fence = out.join("fence");
        let paused_file = out.join("paused-groups");
        for stale in [&ledger, &fence, &paused_file] {
            match std::fs::remove_file(stale) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    let what = format!("cannot remove {}", stale.display());
                    return Err(ChaosError::io(what, e));
                }
            }
        }
        let lease = format!("chaos-{seed:016x}-{}", std::process::id());
        let own_server = !(args.store == StoreKind::Postgres && args.postgres_url.is_some());
        let kinds = args
            .store
            .faults()
            .iter()
            .copied()
            .filter(|k| own_server || *k != FaultKind::StoreRestart)
            .collect();
        let s = Settings {
            store: args.store,
            kinds,
            replicas: args.replicas,
            duration: args.duration,
            faults,
            seed,
            ttl: args.ttl,
            every: args.every,
            work: args.work,
            // `leasehold run`'s default: the lease's stop margin, a fifth of the ttl.
            grace: args.ttl / 5,
            bin,
        };
        let watchdog = Watchdog::start(&paused_file)?;
        let started = servers::start(&args, &logs).await?;
        let notes = vec![started.note];
        let name = LeaseName::new(&lease).map_err(|source| ChaosError::LeaseName {
            name: lease.clone(),
            source,
        })?;
        let store = leasehold_connect::open_store(&started.direct_url)
            .await
            .map_err(ChaosError::Store)?;
        let poller = Poller::start(store.clone(), name);
        Ok(Self {
            s,
            out,
            ledger,
            fence,
            logs,
            lease,
            replica_url: started.replica_url,
            replicas: Vec::new(),
            retired: Vec::new(),
            poller: Some(poller),
            polled: PollState::default(),
            proxy: started.proxy,
            server: started.server,
            watchdog,
            direct: Some(store),
            _sqlite_dir: started.sqlite_dir,
            faults: Vec::new(),
            checks: Vec::new(),
            probes: Vec::new(),
            restarts: Vec::new(),
            loss: Vec::new(),
            notes,
        })
    }

    fn replica_args(&self, holder: &str) -> Vec<String> {
        let bin = self.s.bin.display().to_string();
        let retry = (self.s.ttl / 5).min(Duration::from_millis(200));
        // The store URL goes in the environment (`LEASEHOLD_STORE`), not on the command line,
        // where `ps` and the logs would show its password.
        let mut a: Vec<String> = [
            "run",
            "--lease",
            &self.lease,
            "--every",
            &ms(self.s.every),
            "--ttl",
            &ms(self.s.ttl),
            "--retry",
            &ms(retry),
            "--grace",
            &ms(self.s.grace),
            "--holder",
            holder,
            "--on-store-down",
            "fail-closed",
            "--",
            &bin,
            "witness",
            "--ledger",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        a.push(self.ledger.display().to_string());
        a.push("--fence".into());
        a.push(self.fence.display().to_string());
        a.push("--work".into());
        a.push(ms(self.s.work));
        a.push("--harness-pid".into());
        a.push(std::process::id().to_string());
        a
    }

    fn spawn(&self, row: usize, generation: usize) -> Result<Replica> {
        let holder = Replica::holder_id(row, generation);
        let log = self.logs.join(format!("{holder}.log"));
        let mut command = tokio::process::Command::new(&self.s.bin);
        command
            .args(self.replica_args(&holder))
            .env("LEASEHOLD_STORE", &self.replica_url)
            .process_group(self.watchdog.group());
        Replica::spawn(row, generation, holder, command, &log)
            .map_err(|e| ChaosError::spawn(&self.s.bin, format!(" (log {})", log.display()), e))
    }

    /// Starts a new generation in `row`; the old replica is kept for the report.
    fn replace(&mut self, row: usize) -> Result<()> {
        let generation = self.replicas[row].generation + 1;
        let fresh = self.spawn(row, generation)?;
        let old = std::mem::replace(&mut self.replicas[row], fresh);
        self.retired.push(old);
        Ok(())
    }

    /// The row of the replica that holds the leader lease, waiting up to `limit` for one.
    async fn holder_row(&mut self, limit: Duration) -> Option<usize> {
        let deadline = Instant::now() + limit;
        loop {
            // The poller runs until shutdown; without it, nobody is known to hold the lease.
            if let Some(h) = self.poller.as_ref().and_then(Poller::current)
                && let Some(row) = Replica::row_of(&h)
                && let Some(r) = self.replicas.get_mut(row)
                && r.holder == h
                && r.alive()
            {
                return Some(row);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn drive(&mut self) -> Result<()> {
        let s = &self.s;
        let kinds = &s.kinds;
        let settle = (s.ttl * 3).max(Duration::from_secs(3));
        let warmup = (s.ttl * 2).max(Duration::from_secs(3));
        let plan = schedule::plan(
            s.seed,
            warmup,
            s.duration.saturating_sub(settle),
            s.faults,
            kinds,
            s.ttl,
        );
        println!(
            "chaos: store {}, {} replicas, {:?}, {} faults, seed {} (replay: --seed {}), out {}",
            s.store.as_str(),
            s.replicas,
            s.duration,
            plan.len(),
            s.seed,
            s.seed,
            self.out.display()
        );
        let start = Instant::now();
        for row in 0..self.s.replicas {
            let r = self.spawn(row, 0)?;
            self.replicas.push(r);
        }
        let first_holder = Duration::from_secs(15);
        if self.holder_row(first_holder).await.is_none() {
            return Err(ChaosError::NoLeader {
                waited: first_holder,
                last_error: self.poller.as_ref().and_then(|p| {
                    p.state
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .last_error
                        .clone()
                }),
                logs: self.logs.clone(),
            });
        }
        let hard_stop = self.s.duration + Duration::from_secs(8);
        for (i, f) in plan.iter().enumerate() {
            if start.elapsed() >= hard_stop {
                self.notes.push(format!(
                    "{} planned faults were not injected: the run reached its time limit",
                    plan.len() - i
                ));
                break;
            }
            tokio::time::sleep_until((start + f.at).into()).await;
            self.inject(f).await?;
            self.top_up()?;
            println!(
                "  {:>6.1}s  {:<13} {}",
                start.elapsed().as_secs_f64(),
                f.kind.as_str(),
                self.faults
                    .last()
                    .map_or(String::new(), |r| r.detail.clone())
            );
        }
        tokio::time::sleep_until((start + self.s.duration).into()).await;
        // The fencing check is part of every run: retry it if no pause caught a command mid-run.
        let mut extra = 0;
        while !self.fencing_exercised() && extra < 3 && start.elapsed() < hard_stop {
            extra += 1;
            let f = PlannedFault {
                at: start.elapsed(),
                kind: FaultKind::Pause,
                hold: self.s.ttl * 2,
                latency: Duration::ZERO,
            };
            self.inject(&f).await?;
            self.top_up()?;
            println!(
                "  {:>6.1}s  {:<13} {} (extra fencing check)",
                start.elapsed().as_secs_f64(),
                "pause",
                self.faults
                    .last()
                    .map_or(String::new(), |r| r.detail.clone())
            );
        }
        // Let the last run finish and land in the ledger.
        tokio::time::sleep(self.s.work + self.s.every).await;
        Ok(())
    }

    /// Whether a paused holder's stale write was attempted after a newer write.
    fn fencing_exercised(&self) -> bool {
        let (entries, _) = ledger::read(&self.ledger).unwrap_or_default();
        self.checks.iter().any(|c| {
            c.fence_max_at_resume.is_some_and(|m| m > c.token)
                && entries
                    .iter()
                    .any(|e| e.pid == c.pid && e.fenced == Fenced::Rejected)
        })
    }

    /// Replaces replicas that exited without being told to.
    fn top_up(&mut self) -> Result<()> {
        for row in 0..self.replicas.len() {
            if !self.replicas[row].alive() {
                let r = &self.replicas[row];
                self.notes.push(format!(
                    "replica {} exited on its own ({}); replaced",
                    r.holder,
                    r.exit.as_deref().unwrap_or("?")
                ));
                self.replace(row)?;
            }
        }
        Ok(())
    }

    fn record(&mut self, kind: FaultKind, at_ms: u64, target: Option<String>, detail: String) {
        self.faults.push(FaultRecord {
            kind,
            at_ms,
            until_ms: None,
            target,
            detail,
            skipped: false,
        });
    }

    fn skip(&mut self, kind: FaultKind, why: &str) {
        self.faults.push(FaultRecord {
            kind,
            at_ms: epoch_ms(),
            until_ms: None,
            target: None,
            detail: format!("skipped: {why}"),
            skipped: true,
        });
    }

    async fn inject(&mut self, f: &PlannedFault) -> Result<()> {
        let holder_wait = (self.s.ttl * 3).max(Duration::from_secs(3));
        match f.kind {
            FaultKind::Kill => {
                let Some(row) = self.holder_row(holder_wait).await else {
                    self.skip(f.kind, "no holder");
                    return Ok(());
                };
                let at = epoch_ms();
                let r = &mut self.replicas[row];
                let holder = r.holder.clone();
                r.kill_all();
                r.wait(Duration::from_secs(2)).await;
                self.probes.push(TakeoverProbe {
                    kind: f.kind,
                    at_ms: at,
                    old_holder: holder.clone(),
                });
                self.replace(row)?;
                self.record(
                    f.kind,
                    at,
                    Some(holder.clone()),
                    format!("SIGKILL {holder} and its command; replacement started"),
                );
            }
            FaultKind::Terminate => {
                let Some(row) = self.holder_row(holder_wait).await else {
                    self.skip(f.kind, "no holder");
                    return Ok(());
                };
                let at = epoch_ms();
                let holder = self.replicas[row].holder.clone();
                procs::signal(self.replicas[row].pid, Signal::SIGTERM);
                self.probes.push(TakeoverProbe {
                    kind: f.kind,
                    at_ms: at,
                    old_holder: holder.clone(),
                });
                self.replace(row)?;
                let grace = self.s.grace + Duration::from_secs(2);
                // `replace` just retired it.
                let Some(old) = self.retired.last_mut() else {
                    return Ok(());
                };
                let exited = old.wait(grace).await;
                let detail = if exited {
                    format!(
                        "SIGTERM {holder}: exited {}; replacement started",
                        old.exit.as_deref().unwrap_or("?")
                    )
                } else {
                    old.kill_all();
                    format!(
                        "SIGTERM {holder}: still running after {grace:?}, killed; replacement started"
                    )
                };
                if !exited || old.exit.as_deref() != Some("exit status: 0") {
                    self.notes
                        .push(format!("graceful stop of {holder}: {detail}"));
                }
                self.record(f.kind, at, Some(holder), detail);
            }
            FaultKind::Pause => self.pause(f).await?,
            FaultKind::DropConnections => {
                let Some(p) = &self.proxy else {
                    self.skip(f.kind, "no proxy");
                    return Ok(());
                };
                p.drop_connections();
                self.record(
                    f.kind,
                    epoch_ms(),
                    None,
                    "proxy closed every connection".into(),
                );
            }
            FaultKind::Blackhole | FaultKind::Delay => {
                let Some(p) = &self.proxy else {
                    self.skip(f.kind, "no proxy");
                    return Ok(());
                };
                let at = epoch_ms();
                let detail = if f.kind == FaultKind::Blackhole {
                    p.blackhole();
                    format!("proxy forwarded nothing for {}", ms(f.hold))
                } else {
                    p.delay(f.latency);
                    format!("proxy added {} each way for {}", ms(f.latency), ms(f.hold))
                };
                tokio::time::sleep(f.hold).await;
                if let Some(p) = &self.proxy {
                    p.repair();
                }
                self.record(f.kind, at, None, detail);
                if let Some(r) = self.faults.last_mut() {
                    r.until_ms = Some(epoch_ms());
                }
            }
            FaultKind::StoreRestart => {
                let before = self.direct_tokens().await;
                let Some(server) = self.server.as_mut() else {
                    self.skip(f.kind, "the harness runs no store server");
                    return Ok(());
                };
                let restart = server
                    .restart(self.restarts.len(), self.s.ttl, &self.lease)
                    .await?;
                let (stopped, ready, detail) =
                    (restart.stopped_ms, restart.ready_ms, restart.detail);
                if restart.loses_writes {
                    self.note_loss(stopped, ready);
                }
                // The store answers again; the pooled connections it broke are replaced on use.
                let mut after = Err("not read".to_owned());
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    after = self.direct_tokens().await;
                    if after.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let check = RestartCheck {
                    at_ms: stopped,
                    before,
                    after,
                };
                let lease = check.describe();
                self.restarts.push(check);
                self.record(f.kind, stopped, None, format!("{detail}; {lease}"));
                if let Some(r) = self.faults.last_mut() {
                    r.until_ms = Some(ready);
                }
            }
        }
        Ok(())
    }

    /// Records the window in which a store that lost writes (killed at `killed`, answering
    /// again at `ready`) excuses overlaps and duplicate slots: until the old holder's lease has
    /// run out on its own clock, plus one tick and its work.
    fn note_loss(&mut self, killed: u64, ready: u64) {
        let ttl = u64::try_from(self.s.ttl.as_millis()).unwrap_or(u64::MAX);
        let tail = u64::try_from((self.s.every + self.s.work * 2).as_millis()).unwrap_or(0) + 250;
        self.loss.push(LossWindow {
            from_ms: killed,
            to_ms: ready.max(killed + ttl) + tail,
        });
    }

    /// The store's tokens for the leader lease and the task lease, read directly (not through
    /// the proxy).
    async fn direct_tokens(&self) -> Result<Tokens, String> {
        let store = self.direct.as_ref().ok_or("the store is closed")?;
        let read = |name: String| async move {
            let name = LeaseName::new(name).map_err(|e| e.to_string())?;
            match tokio::time::timeout(Duration::from_secs(1), store.inspect(&name)).await {
                Ok(Ok(state)) => Ok(state.map(|s| s.token.get())),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("inspect timed out".to_owned()),
            }
        };
        Ok(Tokens {
            leader: read(self.lease.clone()).await?,
            // The name `leasehold run` gives the lease it takes for each tick.
            task: read(format!("{}:run", self.lease)).await?,
        })
    }

    /// SIGSTOP of the holder and its running command (its supervisor included) past the ttl;
    /// the command resumes first, alone, once a newer holder has written, and must be refused
    /// by the fence (if none writes in time, the command is killed instead: nothing to judge).
    async fn pause(&mut self, f: &PlannedFault) -> Result<()> {
        let Some(row) = self
            .holder_row((self.s.ttl * 3).max(Duration::from_secs(3)))
            .await
        else {
            self.skip(f.kind, "no holder");
            return Ok(());
        };
        let (runner, holder) = (self.replicas[row].pid, self.replicas[row].holder.clone());
        // Catch the holder mid-run: its command is the one that must be fenced.
        let deadline = Instant::now() + self.s.every * 2 + self.s.work + Duration::from_secs(1);
        let mut command = None;
        while Instant::now() < deadline {
            // The witness is in its work once its runtime's worker threads run (it records its
            // start first thing); a few ms more and it is asleep in its work.
            let running = self.replicas[row]
                .command_groups()
                .into_iter()
                .find_map(|g| Some((g, *procs::children_of(g).first()?)));
            if let Some((g, c)) = running
                && procs::threads_of(c) >= 2
                && let Some(token) =
                    procs::env_of(c, "LEASEHOLD_TOKEN").and_then(|t| t.parse::<u64>().ok())
            {
                tokio::time::sleep(WORK_SETTLE.min(self.s.work / 4)).await;
                command = Some((g, c, token));
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let at = epoch_ms();
        let Some((group, cmd, token)) = command else {
            procs::signal(runner, Signal::SIGSTOP);
            tokio::time::sleep(f.hold).await;
            procs::signal(runner, Signal::SIGCONT);
            self.record(
                f.kind,
                at,
                Some(holder.clone()),
                format!(
                    "SIGSTOP {holder} for {} (no command was running)",
                    ms(f.hold)
                ),
            );
            if let Some(r) = self.faults.last_mut() {
                r.until_ms = Some(epoch_ms());
            }
            return Ok(());
        };
        self.watchdog.note_paused(group);
        procs::signal_group(group, Signal::SIGSTOP);
        procs::signal(runner, Signal::SIGSTOP);
        let paused = Instant::now();
        let longest = self.s.ttl * 4 + self.s.every * 4 + Duration::from_secs(2);
        let newer = loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            // Without the lock: the paused command may be stopped while holding it.
            let max = fence::peek(&self.fence);
            let written = max.is_some_and(|m| m > token);
            if (paused.elapsed() >= f.hold && written) || paused.elapsed() >= longest {
                break max;
            }
        };
        // The command first, alone: it wakes with its work done and writes with its stale token
        // before its supervisor (which stops it by the lease's deadline, long past) or its
        // runner can act. That is the case `leasehold run` leaves to fencing: a freeze of the
        // supervisor as well as the runner.
        let resumed = epoch_ms();
        if newer.is_some_and(|m| m > token) {
            procs::signal(cmd, Signal::SIGCONT);
            let wait_write = Instant::now();
            while wait_write.elapsed() < Duration::from_secs(3) && !procs::finished(cmd) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } else {
            // No newer holder wrote in time (another fault held it up): the fence has nothing to
            // judge the stale write by, and resumed it would land beside a newer holder's run
            // that has not written yet. The check is skipped: the command is killed unresumed.
            procs::signal(cmd, Signal::SIGKILL);
        }
        procs::signal_group(group, Signal::SIGCONT);
        procs::signal(runner, Signal::SIGCONT);
        self.watchdog.clear_paused();
        let detail = match newer.filter(|&m| m > token) {
            Some(m) => format!(
                "SIGSTOP {holder} and its command (pid {cmd}, token {token}) for {} ms; resumed after the fence reached {m}",
                resumed - at
            ),
            None => format!(
                "SIGSTOP {holder} and its command (pid {cmd}, token {token}) for {} ms; no newer write by then, so the command was killed rather than resumed",
                resumed - at
            ),
        };
        self.checks.push(FencingCheck {
            holder: holder.clone(),
            pid: cmd,
            token,
            paused_ms: at,
            resumed_ms: resumed,
            fence_max_at_resume: newer,
        });
        self.record(f.kind, at, Some(holder), detail);
        if let Some(r) = self.faults.last_mut() {
            r.until_ms = Some(resumed);
        }
        Ok(())
    }

    /// Stops every replica (SIGTERM, then SIGKILL), the poller, the proxy and the server.
    async fn shutdown(&mut self) {
        for r in self.replicas.iter_mut().chain(self.retired.iter_mut()) {
            if r.alive() {
                // A paused replica cannot handle SIGTERM.
                for g in r.command_groups() {
                    procs::signal_group(g, Signal::SIGCONT);
                }
                procs::signal(r.pid, Signal::SIGCONT);
                procs::signal(r.pid, Signal::SIGTERM);
            }
        }
        let limit = self.s.grace + Duration::from_secs(3);
        let deadline = Instant::now() + limit;
        for r in self.replicas.iter_mut().chain(self.retired.iter_mut()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if !r.wait(left).await {
                r.kill_all();
                r.wait(Duration::from_secs(2)).await;
            }
        }
        if let Some(mut p) = self.poller.take() {
            p.task.abort();
            // Wait for the task to go, and with it its handle on the store.
            let _ = (&mut p.task).await;
            self.polled = std::mem::take(&mut *p.state.lock().unwrap_or_else(|e| e.into_inner()));
        }
        self.proxy = None;
        self.direct = None;
        if let Some(server) = self.server.take() {
            server.stop(&self.logs);
        }
        self.watchdog.stop();
    }
}
