//! Measurements that work on any [`Store`]: the four operations, renewing many held leases one
//! by one, takeover after a release and after an expiry, and memory per held lease.

use std::time::{Duration, Instant};

use leasehold::faults::FaultyStore;
use leasehold::{
    FencingToken, HolderId, Lease, LeaseConfig, LeaseError, LeaseGuard, LeaseName, LeaseSession,
    MAX_RENEW_BATCH, MemoryStore, Purge, Release, Store, TryAcquire,
    store::{Acquisition, Renewal},
};
use tokio::task::JoinSet;

use crate::error::{BenchError, Result};
use crate::plan::Plan;
use crate::report::{HeldRow, Kind, MemoryRow, OpRow, Ratio, Report, TakeoverRow, Target};
use crate::stats::{Figure, Recorder, Round, Spread, percentile};

/// Waits for one of the releases in flight.
async fn released(set: &mut JoinSet<Result<Release, LeaseError>>) -> Result<()> {
    if let Some(joined) = set.join_next().await {
        joined
            .map_err(|e| BenchError::lease("a releasing task failed", e))?
            .map_err(|e| BenchError::lease("release of a held lease", e))?;
    }
    Ok(())
}

/// Ttl of the leases the operation rounds take: long enough never to expire mid-round.
pub(crate) const OP_TTL: Duration = Duration::from_secs(60);

/// `count` lease names `{prefix}/{what}/{i}`.
pub(crate) fn names(prefix: &str, what: &str, count: usize) -> Result<Vec<LeaseName>> {
    (0..count)
        .map(|i| {
            let name = format!("{prefix}/{what}/{i}");
            LeaseName::new(&name).map_err(|e| BenchError::lease(format!("lease name {name}"), e))
        })
        .collect()
}

/// Rounds of each leasehold operation on one store.
#[derive(Debug, Default)]
pub(crate) struct OpRounds {
    pub(crate) acquire: Vec<Round>,
    pub(crate) renew: Vec<Round>,
    pub(crate) release: Vec<Round>,
    pub(crate) acquire_release: Vec<Round>,
}

/// The targets of a store's operation rows (none where `None`; release has none).
#[derive(Debug, Default)]
pub(crate) struct OpTargets {
    pub(crate) acquire: Option<Target>,
    pub(crate) renew: Option<Target>,
    pub(crate) release: Option<Target>,
    pub(crate) acquire_release: Option<Target>,
}

impl OpRounds {
    /// The rows of the four operations on `store`, each p50 against `floor`'s if given.
    pub(crate) fn rows(
        &self,
        store: &str,
        floor: Option<(&[Round], &str)>,
        targets: OpTargets,
    ) -> Vec<OpRow> {
        [
            ("acquire", &self.acquire, targets.acquire),
            ("renew", &self.renew, targets.renew),
            ("release", &self.release, targets.release),
            (
                "acquire+release",
                &self.acquire_release,
                targets.acquire_release,
            ),
        ]
        .into_iter()
        .map(|(op, rounds, target)| OpRow {
            store: store.to_owned(),
            op: op.to_owned(),
            kind: Kind::Lease,
            figure: Figure::of(rounds),
            ratio: floor.and_then(|(base, name)| ratio(rounds, base, name)),
            server_us: None,
            target,
        })
        .collect()
    }
}

/// The rows of a store's floors: the first one alone, each other one's p50 against the first's.
pub(crate) fn floor_rows(store: &str, floors: &[(&str, &[Round])]) -> Vec<OpRow> {
    let base = floors.first().map(|&(name, rounds)| (rounds, name));
    floors
        .iter()
        .enumerate()
        .map(|(i, &(op, rounds))| OpRow {
            store: store.to_owned(),
            op: op.to_owned(),
            kind: Kind::Floor,
            figure: Figure::of(rounds),
            ratio: base
                .filter(|_| i > 0)
                .and_then(|(base, name)| ratio(rounds, base, name)),
            server_us: None,
            target: None,
        })
        .collect()
}

/// `p50 ≤ {factor}× {floor}`: the median p50 of `rounds` against the floor's.
pub(crate) fn p50_within(rounds: &[Round], factor: f64, floor: (&[Round], &str)) -> Target {
    let (base, name) = floor;
    Target::new(
        format!("p50 ≤ {factor}× {name}"),
        Figure::of(rounds).p50_us.median <= factor * Figure::of(base).p50_us.median,
    )
}

/// Sequential acquire, renew, release and acquire+release over a fixed set of names, by one
/// holder on one store handle.
pub(crate) struct OpBench<S> {
    store: S,
    names: Vec<LeaseName>,
    holder: HolderId,
}

impl<S: Store + Purge> OpBench<S> {
    pub(crate) fn new(store: S, prefix: &str, ops: usize) -> Result<Self> {
        Ok(Self {
            store,
            names: names(prefix, "op", ops)?,
            holder: HolderId::generate(),
        })
    }

    /// Acquires and releases every name once, untimed, so the timed rounds see names that were
    /// used before (fencing counters exist, statements and scripts are cached), as a lease that
    /// is taken again and again does.
    pub(crate) async fn warm_up(&self) -> Result<()> {
        for name in &self.names {
            let token = self.acquire(name).await?;
            self.release(name, token).await?;
        }
        Ok(())
    }

    /// One round of each operation, appended to `out`.
    pub(crate) async fn round(&self, out: &mut OpRounds) -> Result<()> {
        let n = self.names.len();
        let mut tokens = Vec::with_capacity(n);
        let mut rec = Recorder::new(n);
        for name in &self.names {
            rec.start();
            let token = self.acquire(name).await?;
            rec.stop();
            tokens.push(token);
        }
        out.acquire.push(rec.finish());

        let mut rec = Recorder::new(n);
        for (name, &token) in self.names.iter().zip(&tokens) {
            rec.start();
            self.renew(name, token).await?;
            rec.stop();
        }
        out.renew.push(rec.finish());

        let mut rec = Recorder::new(n);
        for (name, &token) in self.names.iter().zip(&tokens) {
            rec.start();
            self.release(name, token).await?;
            rec.stop();
        }
        out.release.push(rec.finish());

        let mut rec = Recorder::new(n);
        for name in &self.names {
            rec.start();
            let token = self.acquire(name).await?;
            self.release(name, token).await?;
            rec.stop();
        }
        out.acquire_release.push(rec.finish());
        Ok(())
    }

    /// Acquires every name, untimed.
    pub(crate) async fn acquire_all(&self) -> Result<Vec<FencingToken>> {
        let mut tokens = Vec::with_capacity(self.names.len());
        for name in &self.names {
            tokens.push(self.acquire(name).await?);
        }
        Ok(tokens)
    }

    /// Renews every name acquired by [`acquire_all`](Self::acquire_all), untimed.
    pub(crate) async fn renew_all(&self, tokens: &[FencingToken]) -> Result<()> {
        for (name, &token) in self.names.iter().zip(tokens) {
            self.renew(name, token).await?;
        }
        Ok(())
    }

    /// Releases every name acquired by [`acquire_all`](Self::acquire_all), untimed.
    pub(crate) async fn release_all(&self, tokens: &[FencingToken]) -> Result<()> {
        for (name, &token) in self.names.iter().zip(tokens) {
            self.release(name, token).await?;
        }
        Ok(())
    }

    async fn renew(&self, name: &LeaseName, token: FencingToken) -> Result<()> {
        let renewal = self
            .store
            .renew(name, &self.holder, token, OP_TTL)
            .await
            .map_err(|e| BenchError::store("renew", e))?;
        expect("renew", name, renewal, Renewal::Renewed)
    }

    async fn acquire(&self, name: &LeaseName) -> Result<FencingToken> {
        let answer = self
            .store
            .acquire(name, &self.holder, OP_TTL)
            .await
            .map_err(|e| BenchError::store("acquire", e))?;
        acquired(name, answer)
    }

    async fn release(&self, name: &LeaseName, token: FencingToken) -> Result<()> {
        let release = self
            .store
            .release(name, &self.holder, token)
            .await
            .map_err(|e| BenchError::store("release", e))?;
        expect("release", name, release, Release::Released)
    }
}

/// The token of an acquisition that was granted; a busy lease is an error here.
fn acquired(name: &LeaseName, answer: Acquisition) -> Result<FencingToken> {
    match answer {
        Acquisition::Acquired { token } => Ok(token),
        busy => Err(BenchError::Unexpected(format!(
            "acquire of {name}: {busy:?}"
        ))),
    }
}

/// Whether the store answered `op` on `name` with `wanted`; any other answer is an error here.
fn expect<T: PartialEq + std::fmt::Debug>(
    op: &str,
    name: &LeaseName,
    answer: T,
    wanted: T,
) -> Result<()> {
    if answer != wanted {
        return Err(BenchError::Unexpected(format!(
            "{op} of {name}: {answer:?}"
        )));
    }
    Ok(())
}

/// The guard of a lease that was free; a busy lease is an error here.
fn taken(name: &LeaseName, answer: TryAcquire) -> Result<LeaseGuard> {
    match answer {
        TryAcquire::Acquired(guard) => Ok(guard),
        TryAcquire::Busy { holder, .. } => Err(BenchError::Unexpected(format!(
            "{name} is held by {holder}"
        ))),
    }
}

/// `figure / floor` on the p50, if the floor measured anything.
pub(crate) fn ratio(figure: &[Round], floor: &[Round], floor_name: &str) -> Option<Ratio> {
    let f = Spread::of(&figure.iter().map(Round::p50).collect::<Vec<_>>()).median;
    let b = Spread::of(&floor.iter().map(Round::p50).collect::<Vec<_>>()).median;
    (b > 0.0).then(|| Ratio {
        floor: floor_name.to_owned(),
        p50: f / b,
    })
}

/// What the held-lease benchmark needs to know.
pub(crate) struct HeldPlan<'a> {
    pub(crate) store_name: &'a str,
    pub(crate) prefix: &'a str,
    pub(crate) held: usize,
    /// Leases renewed one by one per round, for the comparison.
    pub(crate) sample: usize,
    pub(crate) rounds: usize,
    /// The session's lease ttl; it renews every ttl/3.
    pub(crate) ttl: Duration,
    /// Renewal intervals watched.
    pub(crate) intervals: u32,
    /// How many acquisitions to keep in flight while taking the leases (setup, untimed).
    pub(crate) concurrency: usize,
}

impl<'a> HeldPlan<'a> {
    /// The held-lease part of `plan` for one store.
    pub(crate) fn of(
        plan: &Plan,
        store_name: &'a str,
        prefix: &'a str,
        concurrency: usize,
    ) -> Self {
        Self {
            store_name,
            prefix,
            held: plan.held,
            sample: plan.held_sample,
            rounds: plan.rounds,
            ttl: plan.held_ttl,
            intervals: plan.held_intervals,
            concurrency,
        }
    }
}

/// Holds `held` leases in one [`LeaseSession`] and watches it renew them for a few intervals:
/// store calls per interval (counted by a pass-through [`FaultyStore`]), leases per call and
/// the process's CPU time per interval. Then, per round, renews `sample` of them one by one
/// and one [`MAX_RENEW_BATCH`] of them in one [`Store::renew_many`], for the per-lease cost.
async fn held_renewal<S: Store + Purge>(store: &S, plan: &HeldPlan<'_>) -> Result<HeldRow> {
    let counted = FaultyStore::wrap(store.clone());
    let session = LeaseSession::new(counted.clone(), LeaseConfig::new(plan.ttl))
        .map_err(|e| BenchError::lease("lease session", e))?;
    let names = names(plan.prefix, "held", plan.held)?;
    let guards = acquire_in_session(&session, names, plan.concurrency).await?;
    let interval = LeaseConfig::new(plan.ttl).renew_interval;
    // One untimed interval so that every lease has been renewed once, on the session's rhythm.
    tokio::time::sleep(interval).await;
    counted
        .batches
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    let cpu_before = cpu_time()?;
    let watched = interval * plan.intervals;
    tokio::time::sleep(watched).await;
    let cpu = cpu_time()?.saturating_sub(cpu_before);
    let batches = std::mem::take(&mut *counted.batches.lock().unwrap_or_else(|p| p.into_inner()));
    if let Some(lost) = guards.iter().find(|g| !g.is_held()) {
        return Err(BenchError::Unexpected(format!(
            "{}: {} held by the session was lost while it was watched ({:?})",
            plan.store_name,
            lost.name(),
            lost.loss_reason()
        )));
    }
    let renewed: usize = batches.iter().sum();
    let passes = renewed as f64 / guards.len() as f64;
    let calls_per_interval = batches.len() as f64 / f64::from(plan.intervals);
    let allowed = guards.len().div_ceil(MAX_RENEW_BATCH) as f64;

    let leases: Vec<(LeaseName, FencingToken)> = guards
        .iter()
        .map(|g| (g.name().clone(), g.token()))
        .collect();
    let holder = session.holder().clone();
    let sample = plan.sample.min(leases.len());
    let batch = &leases[..MAX_RENEW_BATCH.min(leases.len())];
    let (mut one, mut batched, mut renew_many_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        let started = Instant::now();
        for (name, token) in &leases[..sample] {
            let r = store
                .renew(name, &holder, *token, plan.ttl)
                .await
                .map_err(|e| BenchError::store("renew", e))?;
            expect("renew", name, r, Renewal::Renewed)?;
        }
        one.push(sample as f64 / started.elapsed().as_secs_f64());

        let started = Instant::now();
        let answers = store
            .renew_many(&holder, batch, plan.ttl)
            .await
            .map_err(|e| BenchError::store("renew_many", e))?;
        let took = started.elapsed();
        let renewed = answers.iter().filter(|r| **r == Renewal::Renewed).count();
        if renewed != batch.len() {
            return Err(BenchError::Unexpected(format!(
                "renew_many renewed {renewed} of {} leases",
                batch.len()
            )));
        }
        batched.push(batch.len() as f64 / took.as_secs_f64());
        renew_many_ms.push(took.as_secs_f64() * 1000.0);
    }
    // Let go of every lease before the next figure: releases left to run in the background
    // (dropped guards) competed with the takeover trials that follow, as 0.5-1.2 s outliers in
    // their first trials on SQLite and PostgreSQL.
    // As many at a time as the acquisitions were (the store's pool size).
    let mut releasing = JoinSet::new();
    for guard in guards {
        if releasing.len() >= plan.concurrency {
            released(&mut releasing).await?;
        }
        releasing.spawn(guard.release());
    }
    while !releasing.is_empty() {
        released(&mut releasing).await?;
    }
    let (one_by_one, batched) = (Spread::of(&one), Spread::of(&batched));
    Ok(HeldRow {
        store: plan.store_name.to_owned(),
        held: leases.len(),
        interval,
        passes,
        calls_per_interval,
        leases_per_call: if batches.is_empty() {
            0.0
        } else {
            renewed as f64 / batches.len() as f64
        },
        cpu_ms_per_interval: cpu.as_secs_f64() * 1000.0 / f64::from(plan.intervals),
        one_by_one,
        one_by_one_sample: sample,
        batched,
        speedup: if one_by_one.median > 0.0 {
            batched.median / one_by_one.median
        } else {
            0.0
        },
        renew_many_leases: batch.len(),
        renew_many_ms: Spread::of(&renew_many_ms),
        target: Target::new(
            format!(
                "≤ {allowed} calls per interval ({} leases, ≤ {MAX_RENEW_BATCH} per call)",
                crate::report::fmt_count(leases.len() as f64)
            ),
            // A pass delayed past the window's end (a loaded machine) is not a miss.
            passes >= f64::from(plan.intervals) - 1.0 && calls_per_interval <= allowed,
        ),
    })
}

/// Takes every name in `session`, `concurrency` at a time.
async fn acquire_in_session<S: Store + Purge>(
    session: &LeaseSession<S>,
    names: Vec<LeaseName>,
    concurrency: usize,
) -> Result<Vec<LeaseGuard>> {
    let mut out = Vec::with_capacity(names.len());
    for chunk in names.chunks(concurrency.max(1)) {
        let mut set = JoinSet::new();
        for name in chunk {
            let (session, name) = (session.clone(), name.clone());
            set.spawn(async move { (name.clone(), session.try_acquire(name).await) });
        }
        while let Some(joined) = set.join_next().await {
            let (name, answer) =
                joined.map_err(|e| BenchError::lease("an acquiring task failed", e))?;
            let answer = answer.map_err(|e| BenchError::lease(format!("acquire of {name}"), e))?;
            out.push(taken(&name, answer)?);
        }
    }
    Ok(out)
}

/// User plus system CPU time of this process so far (every thread: the runtime, the store's
/// client tasks, SQLite's blocking pool), from `/proc/self/stat` in clock ticks (USER_HZ, 100
/// per second on Linux: 10 ms resolution, so watch several intervals).
fn cpu_time() -> Result<Duration> {
    let stat = read_proc("/proc/self/stat")?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    let ticks = |i: usize| proc_field("/proc/self/stat", fields.get(i).copied());
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

/// A file of `/proc`.
fn read_proc(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| BenchError::Io {
        what: format!("read {path}"),
        source,
    })
}

/// A number field of a `/proc` file.
fn proc_field(path: &str, field: Option<&str>) -> Result<u64> {
    field
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| BenchError::Unexpected(format!("{path} has no such number field")))
}

/// The held-lease row and both takeover rows of one store, added to `report`: `store` holds,
/// `waiter` (a second handle, as another process would have) takes over. `graceful` is the
/// graceful takeover's target: its text after `p50 ≤ ` and its bound in ms.
pub(crate) async fn held_and_takeovers<S: Store + Purge>(
    plan: &Plan,
    report: &mut Report,
    held: &HeldPlan<'_>,
    store: &S,
    waiter: &S,
    graceful: Option<(String, f64)>,
) -> Result<()> {
    let (name, prefix) = (held.store_name, held.prefix);
    report.held_renewal.push(held_renewal(store, held).await?);
    let trials = plan.graceful_trials;
    let row = graceful_takeover(name, store, waiter, prefix, trials, graceful).await?;
    report.takeover.push(row);
    let (trials, ttl) = (plan.expiry_trials, plan.expiry_ttl);
    let row = expiry_takeover(name, store, waiter, prefix, trials, ttl).await?;
    report.takeover.push(row);
    Ok(())
}

/// How long a waiter in [`Lease::acquire`] is given to start waiting before the holder lets go.
const SETTLE: Duration = Duration::from_millis(50);

/// Graceful handoff: a holder (on `holder_store`) holds a lease, a waiter (on `waiter_store`, a
/// separate connection, as another process would have) waits in [`Lease::acquire`]; measures from
/// the start of the holder's release call to the waiter's acquire returning.
async fn graceful_takeover<S: Store + Purge>(
    store_name: &str,
    holder_store: &S,
    waiter_store: &S,
    prefix: &str,
    trials: usize,
    target: Option<(String, f64)>,
) -> Result<TakeoverRow> {
    let config = LeaseConfig::new(Duration::from_secs(30));
    let mut samples = Vec::with_capacity(trials);
    for name in names(prefix, "graceful", trials)? {
        let holder = lease(holder_store, &name, config)?;
        let answer = holder
            .try_acquire()
            .await
            .map_err(|e| BenchError::lease(format!("acquire of {name}"), e))?;
        let guard = taken(&name, answer)?;
        let waiter = lease(waiter_store, &name, config)?;
        let waiting = tokio::spawn(async move {
            let g = waiter.acquire().await;
            (Instant::now(), g)
        });
        tokio::time::sleep(SETTLE).await;
        if waiting.is_finished() {
            return Err(BenchError::Unexpected(format!(
                "the waiter got {name} before release"
            )));
        }
        let started = Instant::now();
        release(guard).await?;
        let (acquired, g) = tokio::time::timeout(Duration::from_secs(40), waiting)
            .await
            .map_err(|_| BenchError::Unexpected("the waiter did not take over within 40 s".into()))?
            .map_err(|e| BenchError::lease("the waiting task failed", e))?;
        let g = g.map_err(|e| BenchError::lease(format!("acquire of {name}"), e))?;
        samples.push((acquired - started).as_secs_f64() * 1000.0);
        release(g).await?;
    }
    let (p50, max) = p50_max(&samples);
    Ok(TakeoverRow {
        store: store_name.to_owned(),
        path: "graceful",
        trials,
        p50_ms: p50,
        max_ms: max,
        measures: "holder's release call starts → the waiter's Lease::acquire returns \
                   (waiter on its own connection, woken by the store's release notification)"
            .to_owned(),
        target: target.map(|(text, bound)| Target::new(format!("p50 ≤ {text}"), p50 <= bound)),
    })
}

/// Expiry handoff: a holder takes the lease with a short `ttl` through the raw store and stops
/// renewing; a waiter in [`Lease::acquire`] started after it must take over when the lease is due
/// to expire. Measures `acquired_at − (holder's acquire sent + ttl)`: how late after the
/// earliest moment the lease can have expired.
async fn expiry_takeover<S: Store + Purge>(
    store_name: &str,
    holder_store: &S,
    waiter_store: &S,
    prefix: &str,
    trials: usize,
    ttl: Duration,
) -> Result<TakeoverRow> {
    let config = LeaseConfig::new(Duration::from_secs(2));
    let mut samples = Vec::with_capacity(trials);
    for name in names(prefix, "expiry", trials)? {
        let dead = HolderId::generate();
        let sent = Instant::now();
        let answer = holder_store
            .acquire(&name, &dead, ttl)
            .await
            .map_err(|e| BenchError::store("acquire", e))?;
        acquired(&name, answer)?;
        let expiry = sent + ttl;
        tokio::time::sleep(SETTLE).await;
        let waiter = lease(waiter_store, &name, config)?;
        let guard = tokio::time::timeout(ttl + Duration::from_secs(10), waiter.acquire())
            .await
            .map_err(|_| {
                BenchError::Unexpected("the waiter did not take over within ttl + 10 s".into())
            })?
            .map_err(|e| BenchError::lease(format!("acquire of {name}"), e))?;
        let acquired = Instant::now();
        let late = if acquired >= expiry {
            (acquired - expiry).as_secs_f64()
        } else {
            -(expiry - acquired).as_secs_f64()
        };
        samples.push(late * 1000.0);
        release(guard).await?;
    }
    let (p50, max) = p50_max(&samples);
    Ok(TakeoverRow {
        store: store_name.to_owned(),
        path: "expiry",
        trials,
        p50_ms: p50,
        max_ms: max,
        measures: format!(
            "a holder takes the lease with ttl {} ms and stops renewing; figure = the waiter's \
             acquire returns − (holder's acquire sent + ttl), i.e. time past the remaining ttl",
            ttl.as_millis()
        ),
        target: Some(Target::new("max ≤ remaining + 20 ms", max <= 20.0)),
    })
}

/// A [`Lease`] on `store`.
fn lease<S: Store + Purge>(store: &S, name: &LeaseName, config: LeaseConfig) -> Result<Lease<S>> {
    Lease::new(store.clone(), name.clone(), config)
        .map_err(|e| BenchError::lease(format!("lease {name}"), e))
}

/// Releases a guard.
async fn release(guard: LeaseGuard) -> Result<()> {
    let name = guard.name().clone();
    guard
        .release()
        .await
        .map_err(|e| BenchError::lease(format!("release of {name}"), e))?;
    Ok(())
}

fn p50_max(samples: &[f64]) -> (f64, f64) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    (
        percentile(&sorted, 50.0),
        sorted.last().copied().unwrap_or(0.0),
    )
}

/// Resident set size of this process, in bytes, from `/proc/self/statm`.
pub(crate) fn rss_bytes() -> Result<u64> {
    let statm = read_proc("/proc/self/statm")?;
    let pages = proc_field("/proc/self/statm", statm.split_whitespace().nth(1))?;
    Ok(pages * page_size())
}

/// The page size from `/proc/self/smaps` (`KernelPageSize`), else 4 KiB.
fn page_size() -> u64 {
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("KernelPageSize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(4096, |kb| kb * 1024)
}

/// How the leases of a memory measurement are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeldBy {
    /// No guards: only the memory store's own records (`Store::acquire`), the part of each
    /// measurement below that a Redis or PostgreSQL store keeps in its server instead.
    StoreOnly,
    /// [`LeaseSession`] guards: one renewer for all.
    Session,
    /// [`Lease`] guards: a renewer task each.
    Lease,
}

impl HeldBy {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::StoreOnly => "store records only",
            Self::Session => "LeaseSession",
            Self::Lease => "Lease",
        }
    }
}

/// RSS before and after holding `count` leases on a fresh memory store, all for one holder id,
/// as one process holding many leases would. The second value keeps what was measured alive,
/// so a later measurement does not land in memory this one freed.
pub(crate) async fn memory_per_lease(
    prefix: &str,
    count: usize,
    how: HeldBy,
) -> Result<(MemoryRow, Box<dyn std::any::Any + Send>)> {
    let store = MemoryStore::new();
    let config = LeaseConfig::new(Duration::from_secs(600));
    let holder = HolderId::generate();
    let session = LeaseSession::with_holder(store.clone(), config, holder.clone())
        .map_err(|e| BenchError::lease("lease session", e))?;
    let names = names(prefix, &format!("mem-{how:?}"), count)?;
    // Let the runtime settle so earlier allocations do not land in the measurement.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = rss_bytes()?;
    let mut guards = Vec::with_capacity(count);
    for name in names {
        let answer = match how {
            HeldBy::StoreOnly => {
                let answer = store
                    .acquire(&name, &holder, config.ttl)
                    .await
                    .map_err(|e| BenchError::store("acquire", e))?;
                acquired(&name, answer)?;
                continue;
            }
            HeldBy::Session => session.try_acquire(name.clone()).await,
            HeldBy::Lease => {
                let lease = lease(&store, &name, config)?.with_holder(holder.clone());
                lease.try_acquire().await
            }
        };
        let answer = answer.map_err(|e| BenchError::lease(format!("acquire of {name}"), e))?;
        guards.push(taken(&name, answer)?);
    }
    // Every renewer has run once and parked on its timers.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = rss_bytes()?;
    if !guards.iter().all(LeaseGuard::is_held) {
        return Err(BenchError::Unexpected(
            "a memory-store lease was lost".into(),
        ));
    }
    let row = MemoryRow {
        store: "memory".to_owned(),
        how: how.label(),
        leases: count,
        rss_before_bytes: before,
        rss_after_bytes: after,
        bytes_per_lease: after.saturating_sub(before) as f64 / count.max(1) as f64,
        without_store: None,
        target: None,
    };
    Ok((row, Box::new((store, session, guards))))
}
