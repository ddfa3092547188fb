//! Measurements that work on any [`Store`]: the four operations, renewing many held leases one
//! by one, takeover after a release and after an expiry, and memory per held lease.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use leasehold::{
    Acquisition, FencingToken, HolderId, Lease, LeaseConfig, LeaseName, MemoryStore, Release,
    Renewal, Store, TryAcquire,
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

/// Renews a batch of held leases in one go, the way the store allows.
pub(crate) trait BatchRenew {
    /// How, for the output.
    fn method(&self) -> String;

    /// Renews every `(name, token)` held by `holder` to `ttl`; returns how many were renewed.
    async fn renew_all(
        &self,
        leases: &[(LeaseName, FencingToken)],
        holder: &HolderId,
        ttl: Duration,
    ) -> anyhow::Result<usize>;
}

/// What the held-lease benchmark needs to know.
pub(crate) struct HeldPlan<'a> {
    pub(crate) store_name: &'a str,
    pub(crate) prefix: &'a str,
    pub(crate) held: usize,
    pub(crate) sample: usize,
    pub(crate) rounds: usize,
    /// How many acquisitions to keep in flight while taking the leases (setup, untimed).
    pub(crate) concurrency: usize,
}

/// Takes `held` leases for one holder, then per round renews `sample` of them one by one and
/// all of them in one batch. The leases are left to the store's cleanup (they expire anyway).
pub(crate) async fn held_renewal<S: Store, B: BatchRenew>(
    store: &S,
    batch: &B,
    plan: &HeldPlan<'_>,
) -> anyhow::Result<HeldRow> {
    let holder = HolderId::generate();
    let ttl = Duration::from_secs(120);
    let names = names(plan.prefix, "held", plan.held)?;
    check_batch(store, batch, plan.prefix, &holder).await?;
    let leases = acquire_many(store, &names, &holder, ttl, plan.concurrency).await?;
    let sample = plan.sample.min(leases.len());
    let (mut one, mut batched, mut batch_ms) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        let started = Instant::now();
        for (name, token) in &leases[..sample] {
            let r = store.renew(name, &holder, *token, ttl).await?;
            ensure!(r == Renewal::Renewed, "renew of {name}: {r:?}");
        }
        one.push(sample as f64 / started.elapsed().as_secs_f64());

        let started = Instant::now();
        let renewed = batch.renew_all(&leases, &holder, ttl).await?;
        let took = started.elapsed();
        ensure!(
            renewed == leases.len(),
            "batched renewal renewed {renewed} of {} leases",
            leases.len()
        );
        batched.push(leases.len() as f64 / took.as_secs_f64());
        batch_ms.push(took.as_secs_f64() * 1000.0);
    }
    let (one, batched) = (Spread::of(&one), Spread::of(&batched));
    let speedup = if one.median > 0.0 {
        batched.median / one.median
    } else {
        0.0
    };
    Ok(HeldRow {
        store: plan.store_name.to_owned(),
        held: leases.len(),
        one_by_one: one,
        one_by_one_sample: sample,
        batched,
        batch_ms: Spread::of(&batch_ms),
        method: batch.method(),
        target: Target::new("batched ≥ 10× one by one", speedup >= 10.0),
    })
}

/// Checks, untimed, that `batch` follows the store's renew rule: of four leases it renews only
/// the one `holder` holds with the right token; a wrong token, another holder's lease and an
/// expired lease are left alone (and the expired one stays free).
async fn check_batch<S: Store, B: BatchRenew>(
    store: &S,
    batch: &B,
    prefix: &str,
    holder: &HolderId,
) -> anyhow::Result<()> {
    let [live, wrong_token, other, expired]: [LeaseName; 4] = names(prefix, "batch-check", 4)?
        .try_into()
        .map_err(|_| anyhow::anyhow!("four names"))?;
    let ttl = Duration::from_secs(30);
    let take =
        async |name: &LeaseName, who: &HolderId, ttl: Duration| -> anyhow::Result<FencingToken> {
            match store.acquire(name, who, ttl).await? {
                Acquisition::Acquired { token } => Ok(token),
                busy => bail!("acquire of {name}: {busy:?}"),
            }
        };
    let stranger = HolderId::generate();
    let t_live = take(&live, holder, ttl).await?;
    let t_wrong = take(&wrong_token, holder, ttl).await?;
    let t_other = take(&other, &stranger, ttl).await?;
    let t_expired = take(&expired, holder, Duration::from_millis(20)).await?;
    tokio::time::sleep(Duration::from_millis(80)).await;
    let leases = [
        (live.clone(), t_live),
        (wrong_token.clone(), FencingToken(t_wrong.get() + 1)),
        (other.clone(), t_other),
        (expired.clone(), t_expired),
    ];
    let renewed = batch.renew_all(&leases, holder, ttl).await?;
    ensure!(
        renewed == 1,
        "the batched renewal renewed {renewed} of 4 check leases, expected only the live one \
         (wrong token, other holder and expired must not be renewed)"
    );
    let still_free = store
        .inspect(&expired)
        .await?
        .is_none_or(|s| s.holder.is_none());
    ensure!(still_free, "the batched renewal revived an expired lease");
    for (name, token, who) in [
        (&live, t_live, holder),
        (&wrong_token, t_wrong, holder),
        (&other, t_other, &stranger),
    ] {
        store.release(name, who, token).await?;
    }
    Ok(())
}

/// Acquires every name for `holder`, `concurrency` at a time.
pub(crate) async fn acquire_many<S: Store>(
    store: &S,
    names: &[LeaseName],
    holder: &HolderId,
    ttl: Duration,
    concurrency: usize,
) -> anyhow::Result<Vec<(LeaseName, FencingToken)>> {
    let mut out = Vec::with_capacity(names.len());
    for chunk in names.chunks(concurrency.max(1)) {
        let mut set = JoinSet::new();
        for name in chunk {
            let (store, name, holder) = (store.clone(), name.clone(), holder.clone());
            set.spawn(async move {
                let a = store.acquire(&name, &holder, ttl).await;
                (name, a)
            });
        }
        while let Some(joined) = set.join_next().await {
            let (name, a) = joined?;
            match a.with_context(|| format!("acquire of {name}"))? {
                Acquisition::Acquired { token } => out.push((name, token)),
                busy => bail!("acquire of {name}: {busy:?}"),
            }
        }
    }
    Ok(out)
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

/// RSS before and after holding `count` [`leasehold::LeaseGuard`]s (each with its renewer task)
/// on a memory store, all for one holder id, as one process holding many leases would.
pub(crate) async fn memory_per_lease(prefix: &str, count: usize) -> anyhow::Result<MemoryRow> {
    let store = MemoryStore::new();
    let config = LeaseConfig::new(Duration::from_secs(600));
    let holder = HolderId::generate();
    // Let the runtime settle so earlier allocations do not land in the measurement.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = rss_bytes()?;
    let mut guards = Vec::with_capacity(count);
    for i in 0..count {
        let name = LeaseName::new(format!("{prefix}/mem/{i}"))?;
        let lease = Lease::new(store.clone(), name, config)?.with_holder(holder.clone());
        match lease.try_acquire().await? {
            TryAcquire::Acquired(g) => guards.push(g),
            TryAcquire::Busy { holder, .. } => bail!("memory store lease busy ({holder})"),
        }
    }
    // Every renewer task has run once and parked on its timers.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = rss_bytes()?;
    ensure!(
        guards.iter().all(|g| g.is_held()),
        "a memory-store lease was lost"
    );
    for g in guards {
        g.release().await?;
    }
    Ok(MemoryRow {
        store: "memory".to_owned(),
        leases: count,
        rss_before: before,
        rss_after: after,
    })
}
