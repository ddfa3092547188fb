//! [`Timeout`]: a time limit on every operation of any store, and [`within`], the one way an
//! operation is bounded (the store crates bound their own operations with it).

use std::future::Future;
use std::time::Duration;

use crate::notify::ReleaseSubscription;
use crate::store_api::{Acquisition, LeaseState, Release, Renewal, SlotClaim, StoreResult};
use crate::{FencingToken, HolderId, LeaseName, Store, StoreError};

/// Runs `op`, answering [`StoreError::Timeout(limit)`](StoreError::Timeout) if it has not
/// answered within `limit` (the operation is then dropped).
pub async fn within<T>(
    limit: Duration,
    op: impl Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    tokio::time::timeout(limit, op)
        .await
        .unwrap_or(Err(StoreError::Timeout(limit)))
}

/// A store whose every operation fails with [`StoreError::Timeout`] once it has taken longer
/// than a limit; everything else is the inner store's. For a store of your own that has no
/// operation timeout, or to bound any store more tightly than its own setting.
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    limit: Duration,
}

impl<S: Store> Timeout<S> {
    /// `inner` with each operation bounded by `limit`.
    pub fn new(inner: S, limit: Duration) -> Self {
        Self { inner, limit }
    }

    /// The time limit of each operation.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// The inner store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner store, unbounded.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Store> Store for Timeout<S> {
    async fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Acquisition> {
        within(self.limit, self.inner.acquire(name, holder, ttl)).await
    }

    async fn renew(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> StoreResult<Renewal> {
        within(self.limit, self.inner.renew(name, holder, token, ttl)).await
    }

    async fn renew_many(
        &self,
        holder: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> StoreResult<Vec<Renewal>> {
        within(self.limit, self.inner.renew_many(holder, leases, ttl)).await
    }

    async fn release(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
    ) -> StoreResult<Release> {
        within(self.limit, self.inner.release(name, holder, token)).await
    }

    async fn purge(&self, retention: Duration) -> StoreResult<u64> {
        within(self.limit, self.inner.purge(retention)).await
    }

    async fn inspect(&self, name: &LeaseName) -> StoreResult<Option<LeaseState>> {
        within(self.limit, self.inner.inspect(name)).await
    }

    async fn claim_slot(&self, task: &LeaseName, slot: u64) -> StoreResult<SlotClaim> {
        within(self.limit, self.inner.claim_slot(task, slot)).await
    }

    async fn now_millis(&self) -> StoreResult<u64> {
        within(self.limit, self.inner.now_millis()).await
    }

    async fn last_slot(&self, task: &LeaseName) -> StoreResult<Option<u64>> {
        within(self.limit, self.inner.last_slot(task)).await
    }

    async fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> StoreResult<()> {
        within(
            self.limit,
            self.inner.record_history(task, key, entry, keep),
        )
        .await
    }

    async fn history(&self, task: &LeaseName, limit: usize) -> StoreResult<Vec<String>> {
        within(self.limit, self.inner.history(task, limit)).await
    }

    async fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Vec<HolderId>> {
        within(self.limit, self.inner.members(group, member, ttl)).await
    }

    async fn leave(&self, group: &LeaseName, member: &HolderId) -> StoreResult<()> {
        within(self.limit, self.inner.leave(group, member)).await
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.inner.subscribe_releases()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::faults::FaultyStore;

    fn name() -> LeaseName {
        LeaseName::new("bounded").unwrap()
    }

    fn holder() -> HolderId {
        HolderId::new("me").unwrap()
    }

    /// A renewal that never answers fails with `Timeout(limit)` exactly at the limit; one that
    /// answers in time, and every other operation, is the inner store's answer.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_operation_times_out_at_the_limit() {
        let faulty = FaultyStore::new();
        let limit = Duration::from_secs(2);
        let store = Timeout::new(faulty.clone(), limit);
        let ttl = Duration::from_secs(10);
        let Acquisition::Acquired { token } = store.acquire(&name(), &holder(), ttl).await.unwrap()
        else {
            panic!("a free lease is acquired");
        };

        faulty
            .faults
            .renew_delay_ms
            .store(1_900, std::sync::atomic::Ordering::SeqCst);
        let started = Instant::now();
        let answer = store.renew(&name(), &holder(), token, ttl).await;
        assert_eq!(answer.unwrap(), Renewal::Renewed);
        assert_eq!(started.elapsed(), Duration::from_millis(1_900));

        faulty.set(|f| &f.renew_hangs, true);
        let started = Instant::now();
        let err = store
            .renew(&name(), &holder(), token, ttl)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Timeout(d) if d == limit),
            "{err:?}"
        );
        assert_eq!(started.elapsed(), limit);
        let err = store
            .renew_many(&holder(), &[(name(), token)], ttl)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Timeout(d) if d == limit),
            "{err:?}"
        );

        // Errors of the inner store pass through unchanged.
        faulty.set(|f| &f.down, true);
        let err = store.inspect(&name()).await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
        faulty.set(|f| &f.down, false);
        assert_eq!(
            store.release(&name(), &holder(), token).await.unwrap(),
            Release::Released
        );
        assert_eq!(store.describe(), faulty.describe());
        assert!(store.subscribe_releases().is_some());
    }
}
