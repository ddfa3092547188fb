//! A store wrapper that injects faults by flag, for paused-clock tests of the engine.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Renewals hang forever.
    pub renew_hangs: AtomicBool,
    /// Renewals answer `Lost`.
    pub renew_lost: AtomicBool,
    /// Milliseconds by which acquire replies are delayed (the clock is advanced by that much
    /// before the reply, as if the reply crawled through a slow network).
    pub acquire_delay_ms: AtomicU64,
    /// Milliseconds by which renewal replies are delayed (a sleep, so timers still fire).
    pub renew_delay_ms: AtomicU64,
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
        } else {
            Ok(())
        }
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
        self.inner.release(name, holder, token).await
    }

    async fn inspect(&self, name: &LeaseName) -> StoreResult<Option<LeaseState>> {
        self.check()?;
        self.inner.inspect(name).await
    }

    async fn claim_slot(&self, task: &LeaseName, slot: u64) -> StoreResult<SlotClaim> {
        self.check()?;
        self.inner.claim_slot(task, slot).await
    }

    async fn now_millis(&self) -> StoreResult<u64> {
        self.check()?;
        self.inner.now_millis().await
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.inner.subscribe_releases()
    }

    fn describe(&self) -> String {
        "flaky memory".into()
    }
}
