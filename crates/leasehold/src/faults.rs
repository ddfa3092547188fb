//! A store wrapper that injects faults by switch: outages, refusals, hanging or late replies,
//! a skewed clock. For tests of code built on leasehold (paused-clock tests of the engine, of
//! the sidecar, of an application's own use of leases): turn the `faults` feature on in
//! dev-dependencies.
//!
//! ```
//! use leasehold::faults::FaultyStore;
//! let store = FaultyStore::new();
//! store.set(|f| &f.renew_hangs, true); // renewals never answer from now on
//! ```

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::store_api::{Acquisition, LeaseState, Release, Renewal, SlotClaim, StoreResult};
use crate::{
    FencingToken, HolderId, LeaseName, MemoryStore, Store, StoreError, store::ReleaseSubscription,
};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Faults to inject; all off by default.
#[derive(Default)]
pub struct Faults {
    /// Every operation fails with `Unavailable`.
    pub down: AtomicBool,
    /// Only `now_millis` fails with `Unavailable` (the other operations answer).
    pub clock_down: AtomicBool,
    /// Every operation is refused (`Rejected`), as with a key of the wrong type.
    pub refuse: AtomicBool,
    /// `members` answers `Unsupported`, as from a store that keeps no membership.
    pub members_unsupported: AtomicBool,
    /// Renewals hang forever.
    pub renew_hangs: AtomicBool,
    /// Renewals answer `Lost`.
    pub renew_lost: AtomicBool,
    /// Milliseconds this process stands still between the store granting an acquire and the
    /// reply being read, with no timer firing meanwhile (a stop-the-world pause, or a reply
    /// that crawled): the paused tokio clock jumps by that much. Only for tests on a paused
    /// clock (`#[tokio::test(start_paused = true)]`); tokio panics otherwise.
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

/// A store behind switchable faults (a [`MemoryStore`] unless given another), recording when
/// each renewal was sent.
#[derive(Clone, Default)]
pub struct FaultyStore<S = MemoryStore> {
    /// The store that answers when no fault is on.
    pub inner: S,
    /// The switches; shared by clones.
    pub faults: Arc<Faults>,
    /// When each renewal was sent.
    pub renewals: Arc<Mutex<Vec<Instant>>>,
    /// The size of each `renew_many` call, in order.
    pub batches: Arc<Mutex<Vec<usize>>>,
}

impl FaultyStore {
    /// A memory store with every fault off.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S: Store> FaultyStore<S> {
    /// `inner` with every fault off.
    pub fn wrap(inner: S) -> Self {
        Self {
            inner,
            faults: Arc::default(),
            renewals: Arc::default(),
            batches: Arc::default(),
        }
    }

    /// Turns the fault `flag` on or off: `store.set(|f| &f.down, true)`.
    pub fn set(&self, flag: impl Fn(&Faults) -> &AtomicBool, on: bool) {
        flag(&self.faults).store(on, Ordering::SeqCst);
    }

    /// When each renewal was sent, oldest first.
    pub fn renewal_times(&self) -> Vec<Instant> {
        lock(&self.renewals).clone()
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

impl<S: Store> Store for FaultyStore<S> {
    async fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Acquisition> {
        self.check()?;
        let answer = self.inner.acquire(name, holder, ttl).await;
        let pause = self.faults.acquire_delay_ms.load(Ordering::SeqCst);
        if pause > 0 {
            tokio::time::advance(Duration::from_millis(pause)).await;
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
        lock(&self.renewals).push(Instant::now());
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

    async fn renew_many(
        &self,
        holder: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> StoreResult<Vec<Renewal>> {
        lock(&self.batches).push(leases.len());
        lock(&self.renewals).push(Instant::now());
        self.check()?;
        if self.faults.renew_hangs.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let answer = self.inner.renew_many(holder, leases, ttl).await?;
        sleep_ms(&self.faults.renew_delay_ms).await;
        if self.faults.renew_lost.load(Ordering::SeqCst) {
            return Ok(vec![Renewal::Lost; leases.len()]);
        }
        Ok(answer)
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

    async fn purge(&self, retention: Duration) -> StoreResult<u64> {
        self.check()?;
        self.inner.purge(retention).await
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

    async fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Vec<HolderId>> {
        self.check()?;
        if self.faults.members_unsupported.load(Ordering::SeqCst) {
            return Err(StoreError::Unsupported("members"));
        }
        self.inner.members(group, member, ttl).await
    }

    async fn leave(&self, group: &LeaseName, member: &HolderId) -> StoreResult<()> {
        self.check()?;
        self.inner.leave(group, member).await
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.inner.subscribe_releases()
    }

    fn describe(&self) -> String {
        format!("{} (with injected faults)", self.inner.describe())
    }
}
