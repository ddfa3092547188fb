//! [`Timeout`]: a time limit on every operation of any store, and [`within`], the one way an
//! operation is bounded (the store crates bound their own operations with it).

use std::future::Future;
use std::time::Duration;

use crate::store::answers::Answer;
use crate::store::error::StoreError;
use crate::store::error::StoreResult;
use crate::store::layer::Layer;
use crate::store::traits::Store;

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

impl<S: Store> Layer for Timeout<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    fn around<'a, T: Answer, F>(
        &'a self,
        _op: &'static str,
        call: impl FnOnce() -> F + Send + 'a,
    ) -> impl Future<Output = StoreResult<T>> + Send + 'a
    where
        F: Future<Output = StoreResult<T>> + Send + 'a,
    {
        within(self.limit, call())
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::store::answers::Release;
    use crate::store::faults::FaultyStore;
    use crate::store::name::{HolderId, LeaseName};
    use crate::store::{Acquisition, Renewal};

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
