//! A store wrapper that injects faults by flag, for paused-clock tests of the engine.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::store::{Acquisition, LeaseState, Release, Renewal, SlotClaim, StoreResult};
use leasehold::{
    FencingToken, HolderId, LeaseName, MemoryStore, ReleaseSubscription, Store, StoreError,
};
use tokio::time::Instant;

/// Faults to inject; all off by default.
#[derive(Default)]
pub struct Faults {
    /// Every operation fails with `Unavailable`.
    pub down: AtomicBool,
    /// Only `now_millis` fails with `Unavailable` (the other operations answer).
    pub clock_down: AtomicBool,
    /// Every operation is refused (`Rejected`), as with a key of the wrong type.
    pub refuse: AtomicBool,
    /// Renewals hang forever.
    pub renew_hangs: AtomicBool,
    /// Renewals answer `Lost`.
    pub renew_lost: AtomicBool,
    /// Milliseconds by which acquire replies are delayed (the clock is advanced by that much
    /// before the reply, as if the reply crawled through a slow network).
    pub acquire_delay_ms: AtomicU64,
    /// Milliseconds by which renewal replies are delayed (a sleep, so timers still fire).
    pub renew_delay_ms: AtomicU64,
    /// Milliseconds by which releases reach the store (a sleep before the inner call): a
    /// release that answers late.
    pub release_delay_ms: AtomicU64,
    /// Milliseconds by which slot claims are delayed (a sleep before the inner call).
    pub claim_delay_ms: AtomicU64,
    /// Added to the store's clock (`now_millis`), e.g. negative when this host's clock runs
    /// ahead of the store's.
    pub clock_offset_ms: AtomicI64,
}

/// A [`MemoryStore`] behind switchable faults, recording when each renewal was sent.
#[derive(Clone, Default)]
pub struct FlakyStore {
    pub inner: MemoryStore,
    pub faults: Arc<Faults>,
    pub renewals: Arc<Mutex<Vec<Instant>>>,
}

impl FlakyStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&self, flag: impl Fn(&Faults) -> &AtomicBool, on: bool) {
        flag(&self.faults).store(on, Ordering::SeqCst);
    }

    pub fn renewal_times(&self) -> Vec<Instant> {
        self.renewals.lock().unwrap().clone()
    }

    fn check(&self) -> StoreResult<()> {
        if self.faults.down.load(Ordering::SeqCst) {
            Err(StoreError::unavailable("injected outage", "store down"))
        } else if self.faults.refuse.load(Ordering::SeqCst) {
            Err(StoreError::rejected("injected refusal", "wrong type"))
        } else {
            Ok(())
        }
    }
}

async fn sleep_ms(ms: &AtomicU64) {
    let ms = ms.load(Ordering::SeqCst);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

impl Store for FlakyStore {
    async fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Acquisition> {
        self.check()?;
        let answer = self.inner.acquire(name, holder, ttl).await;
        let delay = self.faults.acquire_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::advance(Duration::from_millis(delay)).await;
        }
        answer
    }

    async fn renew(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> StoreResult<Renewal> {
        self.renewals.lock().unwrap().push(Instant::now());
        self.check()?;
        if self.faults.renew_hangs.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let delay = self.faults.renew_delay_ms.load(Ordering::SeqCst);
        let answer = self.inner.renew(name, holder, token, ttl).await;
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.faults.renew_lost.load(Ordering::SeqCst) {
            return Ok(Renewal::Lost);
        }
        answer
    }

    async fn release(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
    ) -> StoreResult<Release> {
        self.check()?;
        sleep_ms(&self.faults.release_delay_ms).await;
        self.inner.release(name, holder, token).await
    }

    async fn inspect(&self, name: &LeaseName) -> StoreResult<Option<LeaseState>> {
        self.check()?;
        self.inner.inspect(name).await
    }

    async fn claim_slot(&self, task: &LeaseName, slot: u64) -> StoreResult<SlotClaim> {
        self.check()?;
        sleep_ms(&self.faults.claim_delay_ms).await;
        self.check()?;
        self.inner.claim_slot(task, slot).await
    }

    async fn now_millis(&self) -> StoreResult<u64> {
        self.check()?;
        if self.faults.clock_down.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("injected clock outage", "no clock"));
        }
        let offset = self.faults.clock_offset_ms.load(Ordering::SeqCst);
        Ok(self.inner.now_millis().await?.saturating_add_signed(offset))
    }

    async fn last_slot(&self, task: &LeaseName) -> StoreResult<Option<u64>> {
        self.check()?;
        self.inner.last_slot(task).await
    }

    async fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> StoreResult<()> {
        self.check()?;
        self.inner.record_history(task, key, entry, keep).await
    }

    async fn history(&self, task: &LeaseName, limit: usize) -> StoreResult<Vec<String>> {
        self.check()?;
        self.inner.history(task, limit).await
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.inner.subscribe_releases()
    }

    fn describe(&self) -> String {
        "flaky memory".into()
    }
}

/// Runs recorded by a test job: (holder, slot, trigger, token, start, end).
pub type Ledger = Arc<Mutex<Vec<Run>>>;

/// One recorded run.
#[derive(Debug, Clone)]
pub struct Run {
    pub holder: String,
    pub slot: Option<u64>,
    pub trigger: leasehold::Trigger,
    pub token: Option<FencingToken>,
    pub start: Instant,
    pub end: Instant,
    pub cancelled: bool,
}

/// A task named `name` on `schedule` whose job works for `work` (or until cancelled) and records
/// its run in `ledger`.
pub fn recorder(
    ledger: &Ledger,
    name: &str,
    schedule: leasehold::Schedule,
    work: Duration,
) -> leasehold::Task {
    let ledger = ledger.clone();
    leasehold::Task::new(
        LeaseName::new(name).unwrap(),
        schedule,
        move |ctx: leasehold::TaskContext| {
            let ledger = ledger.clone();
            async move {
                let start = Instant::now();
                let cancelled = tokio::select! {
                    () = tokio::time::sleep(work) => false,
                    () = ctx.cancel.cancelled() => true,
                };
                ledger.lock().unwrap().push(Run {
                    holder: ctx.holder.to_string(),
                    slot: ctx.slot,
                    trigger: ctx.trigger,
                    token: ctx.token,
                    start,
                    end: Instant::now(),
                    cancelled,
                });
                Ok::<(), std::io::Error>(())
            }
        },
    )
}

/// Timer-run slots in the ledger, sorted.
pub fn timer_slots(ledger: &Ledger) -> Vec<u64> {
    let mut v: Vec<u64> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.trigger == leasehold::Trigger::Timer)
        .filter_map(|r| r.slot)
        .collect();
    v.sort_unstable();
    v
}

/// Panics if a slot appears twice.
pub fn assert_no_slot_twice(ledger: &Ledger) {
    let v = timer_slots(ledger);
    let mut dedup = v.clone();
    dedup.dedup();
    assert_eq!(v, dedup, "a slot ran twice");
}
