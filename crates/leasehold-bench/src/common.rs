//! Measurements that work on any [`Store`]: the four operations, renewing many held leases one
//! by one, takeover after a release and after an expiry, and memory per held lease.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use leasehold::MAX_RENEW_BATCH;
use leasehold::faults::FaultyStore;
use leasehold::{
    FencingToken, HolderId, Lease, LeaseConfig, LeaseGuard, LeaseName, LeaseSession, MemoryStore,
    Release, Store, TryAcquire,
    store::{Acquisition, Renewal},
};
use tokio::task::JoinSet;

use crate::report::{HeldRow, MemoryRow, Ratio, TakeoverRow, Target};
use crate::stats::{Recorder, Round, Spread, percentile};

/// Ttl of the leases the operation rounds take: long enough never to expire mid-round.
pub(crate) const OP_TTL: Duration = Duration::from_secs(60);

/// `count` lease names `{prefix}/{what}/{i}`.
pub(crate) fn names(prefix: &str, what: &str, count: usize) -> anyhow::Result<Vec<LeaseName>> {
    (0..count)
        .map(|i| LeaseName::new(format!("{prefix}/{what}/{i}")).map_err(Into::into))
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

/// Sequential acquire, renew, release and acquire+release over a fixed set of names, by one
/// holder on one store handle.
pub(crate) struct OpBench<S> {
    store: S,
    names: Vec<LeaseName>,
    holder: HolderId,
}

impl<S: Store> OpBench<S> {
    pub(crate) fn new(store: S, prefix: &str, ops: usize) -> anyhow::Result<Self> {
        Ok(Self {
            store,
            names: names(prefix, "op", ops)?,
            holder: HolderId::generate(),
        })
    }

    /// Acquires and releases every name once, untimed, so the timed rounds see names that were
    /// used before (fencing counters exist, statements and scripts are cached), as a lease that
    /// is taken again and again does.
    pub(crate) async fn warm_up(&self) -> anyhow::Result<()> {
        for name in &self.names {
            let token = self.acquire(name).await?;
            self.release(name, token).await?;
        }
        Ok(())
    }

    /// One round of each operation, appended to `out`.
    pub(crate) async fn round(&self, out: &mut OpRounds) -> anyhow::Result<()> {
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
    pub(crate) async fn acquire_all(&self) -> anyhow::Result<Vec<FencingToken>> {
        let mut tokens = Vec::with_capacity(self.names.len());
        for name in &self.names {
            tokens.push(self.acquire(name).await?);
        }
        Ok(tokens)
    }

    /// Renews every name acquired by [`acquire_all`](Self::acquire_all), untimed.
    pub(crate) async fn renew_all(&self, tokens: &[FencingToken]) -> anyhow::Result<()> {
        for (name, &token) in self.names.iter().zip(tokens) {
            self.renew(name, token).await?;
        }
        Ok(())
    }

    /// Releases every name acquired by [`acquire_all`](Self::acquire_all), untimed.
    pub(crate) async fn release_all(&self, tokens: &[FencingToken]) -> anyhow::Result<()> {
        for (name, &token) in self.names.iter().zip(tokens) {
            self.release(name, token).await?;
        }
        Ok(())
    }

    async fn renew(&self, name: &LeaseName, token: FencingToken) -> anyhow::Result<()> {
        let renewal = self
            .store
            .renew(name, &self.holder, token, OP_TTL)
            .await
            .context("renew")?;
        ensure!(renewal == Renewal::Renewed, "renew of {name}: {renewal:?}");
        Ok(())
    }

    async fn acquire(&self, name: &LeaseName) -> anyhow::Result<FencingToken> {
        match self
            .store
            .acquire(name, &self.holder, OP_TTL)
            .await
            .context("acquire")?
        {
            Acquisition::Acquired { token } => Ok(token),
            busy => bail!("acquire of {name}: {busy:?}"),
        }
    }

    async fn release(&self, name: &LeaseName, token: FencingToken) -> anyhow::Result<()> {
        let release = self
            .store
            .release(name, &self.holder, token)
            .await
            .context("release")?;
        ensure!(
            release == Release::Released,
            "release of {name}: {release:?}"
        );
        Ok(())
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
        plan: &crate::Plan,
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
pub(crate) async fn held_renewal<S: Store>(
    store: &S,
    plan: &HeldPlan<'_>,
) -> anyhow::Result<HeldRow> {
    let counted = FaultyStore::wrap(store.clone());
    let session = LeaseSession::new(counted.clone(), LeaseConfig::new(plan.ttl))?;
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
        bail!(
            "{}: {} held by the session was lost while it was watched ({:?})",
            plan.store_name,
            lost.name(),
            lost.loss_reason()
        );
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
    let (mut one, mut batched, mut batch_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        let started = Instant::now();
        for (name, token) in &leases[..sample] {
            let r = store.renew(name, &holder, *token, plan.ttl).await?;
            ensure!(r == Renewal::Renewed, "renew of {name}: {r:?}");
        }
        one.push(sample as f64 / started.elapsed().as_secs_f64());

        let started = Instant::now();
        let answers = store.renew_many(&holder, batch, plan.ttl).await?;
        let took = started.elapsed();
        let renewed = answers.iter().filter(|r| **r == Renewal::Renewed).count();
        ensure!(
            renewed == batch.len(),
            "renew_many renewed {renewed} of {} leases",
            batch.len()
        );
        batched.push(batch.len() as f64 / took.as_secs_f64());
        batch_ms.push(took.as_secs_f64() * 1000.0);
    }
    drop(guards);
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
        one_by_one: Spread::of(&one),
        one_by_one_sample: sample,
        batched: Spread::of(&batched),
        batch_len: batch.len(),
        batch_ms: Spread::of(&batch_ms),
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
async fn acquire_in_session<S: Store>(
    session: &LeaseSession<S>,
    names: Vec<LeaseName>,
    concurrency: usize,
) -> anyhow::Result<Vec<LeaseGuard>> {
    let mut out = Vec::with_capacity(names.len());
    for chunk in names.chunks(concurrency.max(1)) {
        let mut set = JoinSet::new();
        for name in chunk {
            let (session, name) = (session.clone(), name.clone());
            set.spawn(async move { (name.clone(), session.try_acquire(name).await) });
        }
        while let Some(joined) = set.join_next().await {
            let (name, taken) = joined?;
            match taken.with_context(|| format!("acquire of {name}"))? {
                TryAcquire::Acquired(guard) => out.push(guard),
                TryAcquire::Busy { holder, .. } => bail!("{name} is held by {holder}"),
            }
        }
    }
    Ok(out)
}

/// User plus system CPU time of this process so far (every thread: the runtime, the store's
/// client tasks, SQLite's blocking pool), from `/proc/self/stat` in clock ticks (USER_HZ, 100
/// per second on Linux: 10 ms resolution, so watch several intervals).
fn cpu_time() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("read /proc/self/stat")?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("/proc/self/stat has no command field")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    let ticks = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .context("/proc/self/stat is short")?
            .parse()
            .context("/proc/self/stat time field")
    };
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

/// How long a waiter in [`Lease::acquire`] is given to start waiting before the holder lets go.
const SETTLE: Duration = Duration::from_millis(50);

/// Graceful handoff: a holder (on `holder_store`) holds a lease, a waiter (on `waiter_store`, a
/// separate connection, as another process would have) waits in [`Lease::acquire`]; measures from
/// the start of the holder's release call to the waiter's acquire returning.
pub(crate) async fn graceful_takeover<S: Store>(
    store_name: &str,
    holder_store: &S,
    waiter_store: &S,
    prefix: &str,
    trials: usize,
    target_ms: Option<f64>,
) -> anyhow::Result<TakeoverRow> {
    let config = LeaseConfig::new(Duration::from_secs(30));
    let mut samples = Vec::with_capacity(trials);
    for name in names(prefix, "graceful", trials)? {
        let holder = Lease::new(holder_store.clone(), name.clone(), config)?;
        let guard = match holder.try_acquire().await? {
            TryAcquire::Acquired(g) => g,
            TryAcquire::Busy { holder, .. } => bail!("{name} is held by {holder}"),
        };
        let waiter = Lease::new(waiter_store.clone(), name.clone(), config)?;
        let waiting = tokio::spawn(async move {
            let g = waiter.acquire().await;
            (Instant::now(), g)
        });
        tokio::time::sleep(SETTLE).await;
        ensure!(
            !waiting.is_finished(),
            "the waiter got {name} before release"
        );
        let started = Instant::now();
        guard.release().await?;
        let (acquired, g) = tokio::time::timeout(Duration::from_secs(40), waiting)
            .await
            .context("the waiter did not take over within 40 s")??;
        let g = g?;
        samples.push((acquired - started).as_secs_f64() * 1000.0);
        g.release().await?;
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
        target: target_ms.map(|t| Target::new(format!("p50 ≤ {t} ms"), p50 <= t)),
    })
}

/// Expiry handoff: a holder takes the lease with a short `ttl` through the raw store and stops
/// renewing; a waiter in [`Lease::acquire`] started after it must take over when the lease is due
/// to expire. Measures `acquired_at − (holder's acquire sent + ttl)`: how late after the
/// earliest moment the lease can have expired.
pub(crate) async fn expiry_takeover<S: Store>(
    store_name: &str,
    holder_store: &S,
    waiter_store: &S,
    prefix: &str,
    trials: usize,
    ttl: Duration,
) -> anyhow::Result<TakeoverRow> {
    let config = LeaseConfig::new(Duration::from_secs(2));
    let mut samples = Vec::with_capacity(trials);
    for name in names(prefix, "expiry", trials)? {
        let dead = HolderId::generate();
        let sent = Instant::now();
        match holder_store.acquire(&name, &dead, ttl).await? {
            Acquisition::Acquired { .. } => {}
            busy => bail!("acquire of {name}: {busy:?}"),
        }
        let expiry = sent + ttl;
        tokio::time::sleep(SETTLE).await;
        let waiter = Lease::new(waiter_store.clone(), name.clone(), config)?;
        let guard = tokio::time::timeout(ttl + Duration::from_secs(10), waiter.acquire())
            .await
            .context("the waiter did not take over within ttl + 10 s")??;
        let acquired = Instant::now();
        let late = if acquired >= expiry {
            (acquired - expiry).as_secs_f64()
        } else {
            -(expiry - acquired).as_secs_f64()
        };
        samples.push(late * 1000.0);
        guard.release().await?;
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

fn p50_max(samples: &[f64]) -> (f64, f64) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    (
        percentile(&sorted, 50.0),
        sorted.last().copied().unwrap_or(0.0),
    )
}

/// Resident set size of this process, in bytes, from `/proc/self/statm`.
pub(crate) fn rss_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("read /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .context("/proc/self/statm has no resident field")?
        .parse()
        .context("/proc/self/statm resident field")?;
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
) -> anyhow::Result<(MemoryRow, Box<dyn std::any::Any + Send>)> {
    let store = MemoryStore::new();
    let config = LeaseConfig::new(Duration::from_secs(600));
    let holder = HolderId::generate();
    let session = LeaseSession::with_holder(store.clone(), config, holder.clone())?;
    let names = names(prefix, &format!("mem-{how:?}"), count)?;
    // Let the runtime settle so earlier allocations do not land in the measurement.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = rss_bytes()?;
    let mut guards = Vec::with_capacity(count);
    for name in names {
        let taken = match how {
            HeldBy::StoreOnly => match store.acquire(&name, &holder, config.ttl).await? {
                Acquisition::Acquired { .. } => continue,
                busy => bail!("memory store lease busy ({busy:?})"),
            },
            HeldBy::Session => session.try_acquire(name).await?,
            HeldBy::Lease => {
                let lease = Lease::new(store.clone(), name, config)?.with_holder(holder.clone());
                lease.try_acquire().await?
            }
        };
        match taken {
            TryAcquire::Acquired(g) => guards.push(g),
            TryAcquire::Busy { holder, .. } => bail!("memory store lease busy ({holder})"),
        }
    }
    // Every renewer has run once and parked on its timers.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = rss_bytes()?;
    ensure!(
        guards.iter().all(LeaseGuard::is_held),
        "a memory-store lease was lost"
    );
    let row = MemoryRow {
        store: "memory".to_owned(),
        how: how.label(),
        leases: count,
        rss_before: before,
        rss_after: after,
        without_store: None,
        target: None,
    };
    Ok((row, Box::new((store, session, guards))))
}
