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

use std::any::Any;
use std::future::Future;

use crate::store::answers::{Answer, Renewal};
use crate::store::capabilities::Capabilities;
use crate::store::catalog::ControlRead;
use crate::store::error::StoreError;
use crate::store::error::StoreResult;
use crate::store::layer::Layer;
use crate::store::memory::MemoryStore;
use crate::store::traits::Store;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Faults to inject; all off by default.
#[derive(Default)]
pub struct Faults {
    /// Every operation fails with `Unavailable`.
    pub down: AtomicBool,
    /// Only the clock (`now_millis`, and `control` which reads it) fails with `Unavailable`
    /// (the other operations answer).
    pub clock_down: AtomicBool,
    /// Every operation is refused (`Rejected`), as with a key of the wrong type.
    pub refuse: AtomicBool,
    /// The store offers no membership: its membership operations answer `Unsupported`, as from
    /// a store that keeps none.
    pub members_unsupported: AtomicBool,
    /// The store offers no catalog, as one from before it: its catalog operations answer
    /// `Unsupported`.
    pub catalog_unsupported: AtomicBool,
    /// Renewals hang forever.
    pub renew_hangs: AtomicBool,
    /// Renewals answer `Lost`.
    pub renew_lost: AtomicBool,
    /// Milliseconds this process stands still between the store granting an acquire and the
    /// reply being read, with no timer firing meanwhile (a stop-the-world pause, or a reply
    /// that crawled): the paused tokio clock jumps by that much. Only for tests on a paused
    /// clock (`#[tokio::test(start_paused = true)]`); tokio panics otherwise.
    /// (Feature `faults-paused-clock`, which turns on tokio's test utilities.)
    #[cfg(feature = "faults-paused-clock")]
    pub acquire_delay_ms: AtomicU64,
    /// Milliseconds by which acquires reach the store (a sleep before the inner call), so that
    /// concurrent acquires overlap in flight.
    pub acquire_wait_ms: AtomicU64,
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

/// `answer` as `U` when it is one (the answers a fault rewrites: renewals, the clock).
fn as_mut<T: 'static, U: 'static>(answer: &mut T) -> Option<&mut U> {
    (answer as &mut dyn Any).downcast_mut::<U>()
}

impl<S: Store> Layer for FaultyStore<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    fn around<'a, T: Answer, F>(
        &'a self,
        op: &'static str,
        call: impl FnOnce() -> F + Send + 'a,
    ) -> impl Future<Output = StoreResult<T>> + Send + 'a
    where
        F: Future<Output = StoreResult<T>> + Send + 'a,
    {
        let faults = &*self.faults;
        let renewal = matches!(op, "renew" | "renew_many");
        async move {
            if renewal {
                lock(&self.renewals).push(Instant::now());
            }
            self.check()?;
            match op {
                _ if renewal && faults.renew_hangs.load(Ordering::SeqCst) => {
                    std::future::pending::<()>().await;
                }
                "acquire" => sleep_ms(&faults.acquire_wait_ms).await,
                "release" => sleep_ms(&faults.release_delay_ms).await,
                "claim_slot" => {
                    sleep_ms(&faults.claim_delay_ms).await;
                    self.check()?;
                }
                // A tick reads the clock through `control` where the store keeps a catalog.
                "now_millis" | "control" if faults.clock_down.load(Ordering::SeqCst) => {
                    return Err(StoreError::unavailable("injected clock outage", "no clock"));
                }
                _ => {}
            }
            let mut answer = call().await;

            match op {
                #[cfg(feature = "faults-paused-clock")]
                "acquire" => {
                    let pause = faults.acquire_delay_ms.load(Ordering::SeqCst);
                    if pause > 0 {
                        tokio::time::advance(Duration::from_millis(pause)).await;
                    }
                }
                _ if renewal => {
                    sleep_ms(&faults.renew_delay_ms).await;
                    let lost = faults.renew_lost.load(Ordering::SeqCst);
                    if let Some(Ok(renewal)) = as_mut::<_, StoreResult<Renewal>>(&mut answer)
                        && lost
                    {
                        *renewal = Renewal::Lost;
                    }
                    if let Some(Ok(batch)) = as_mut::<_, StoreResult<Vec<Renewal>>>(&mut answer) {
                        lock(&self.batches).push(batch.len());
                        if lost {
                            batch.fill(Renewal::Lost);
                        }
                    }
                }
                "now_millis" | "control" => {
                    let offset = faults.clock_offset_ms.load(Ordering::SeqCst);
                    if let Some(Ok(ms)) = as_mut::<_, StoreResult<u64>>(&mut answer) {
                        *ms = ms.saturating_add_signed(offset);
                    }
                    if let Some(Ok(read)) = as_mut::<_, StoreResult<ControlRead>>(&mut answer) {
                        read.now_ms = read.now_ms.saturating_add_signed(offset);
                    }
                }
                _ => {}
            }
            answer
        }
    }

    fn description(&self) -> String {
        format!("{} (with injected faults)", self.inner.describe())
    }

    fn capabilities_offered(&self) -> Capabilities {
        // A one-call tick would run the inner store's own calls, past the faults injected on
        // each of them (delays, clock skew): the gate decides with the separate calls here.
        let mut all = self.inner.capabilities().without(Capabilities::TICK);
        if self.faults.members_unsupported.load(Ordering::SeqCst) {
            all = all.without(Capabilities::MEMBERSHIP);
        }
        if self.faults.catalog_unsupported.load(Ordering::SeqCst) {
            all = all.without(Capabilities::CATALOG);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::FaultyStore;
    use crate::store::capabilities::Capabilities;
    use crate::store::conformance::capabilities_are_declared_truly;
    use crate::store::traits::Store;

    /// A capability the faults take away is taken away whole: every one of its operations
    /// answers `Unsupported`, as from a store that never had it (`leave` and the catalog's
    /// operations used to reach the store, while `capabilities` said they were not there).
    #[tokio::test]
    async fn a_withdrawn_capability_answers_unsupported_in_every_operation() {
        let store = FaultyStore::new();
        store.set(|f| &f.members_unsupported, true);
        store.set(|f| &f.catalog_unsupported, true);
        assert_eq!(
            store.capabilities(),
            Capabilities::SLOTS | Capabilities::PURGE
        );
        capabilities_are_declared_truly(store.clone()).await;
        store.set(|f| &f.members_unsupported, false);
        store.set(|f| &f.catalog_unsupported, false);
        capabilities_are_declared_truly(store).await;
    }
}
