//! A store wrapper that records every operation as metrics; see [`Metered`].

use std::future::Future;

use tokio::time::Instant;

use crate::store::answers::Answer;
use crate::store::error::StoreError;
use crate::store::error::StoreResult;
use crate::store::layer::Layer;
use crate::store::traits::Store;

/// A store that records each operation through the [`metrics`] facade, then answers as the store
/// it wraps: `leasehold_store_operations_total{op, result}` and
/// `leasehold_store_operation_seconds{op}` (call to answer). `result` is the answer where it has
/// a meaning (`acquired`, `busy`, `renewed`, `lost`, `released`, `not-held`, `claimed`,
/// `already-run`), `ok` for the other answers, and the error's kind on failure (`unavailable`,
/// `timeout`, `rejected`, `corrupt`, `unsupported`).
///
/// The engine records what only it knows (leases lost and why, leadership, ticks); what each
/// store call cost is recorded here, for any store, only when asked for:
///
/// ```
/// use leasehold::{Lease, LeaseConfig, MemoryStore, store::Metered};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Metered::new(MemoryStore::new());
/// let lease = Lease::new(store, "nightly-sweep".parse()?, LeaseConfig::default())?;
/// # drop(lease); Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Metered<S> {
    inner: S,
}

impl<S: Store> Metered<S> {
    /// Records the operations of `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The inner store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner store, unrecorded.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

fn error_kind(error: &StoreError) -> &'static str {
    match error {
        StoreError::Unavailable { .. } => "unavailable",
        StoreError::Timeout(_) => "timeout",
        StoreError::Rejected { .. } => "rejected",
        StoreError::Corrupt(_) => "corrupt",
        StoreError::Unsupported(_) => "unsupported",
    }
}

async fn measure<T: Answer>(
    op: &'static str,
    call: impl Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    let sent = Instant::now();
    let answer = call.await;
    metrics::histogram!("leasehold_store_operation_seconds", "op" => op)
        .record(sent.elapsed().as_secs_f64());
    let result = match &answer {
        Ok(value) => value.label(),
        Err(e) => error_kind(e),
    };
    metrics::counter!("leasehold_store_operations_total", "op" => op, "result" => result)
        .increment(1);
    answer
}

impl<S: Store> Layer for Metered<S> {
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
        measure(op, call())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::faults::FaultyStore;
    use crate::store::name::{HolderId, LeaseName};
    use crate::store::{Acquisition, Renewal};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    /// Every answer is counted under its operation and result, and timed.
    #[test]
    fn each_call_is_counted_by_its_answer() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let faulty = FaultyStore::new();
                let store = Metered::new(faulty.clone());
                let name = LeaseName::new("metered").unwrap();
                let (a, b) = (HolderId::new("a").unwrap(), HolderId::new("b").unwrap());
                let ttl = Duration::from_secs(10);
                let Acquisition::Acquired { token } = store.acquire(&name, &a, ttl).await.unwrap()
                else {
                    panic!("a free lease was not acquired");
                };
                assert!(matches!(
                    store.acquire(&name, &b, ttl).await.unwrap(),
                    Acquisition::Busy { .. }
                ));
                assert_eq!(
                    store.renew(&name, &a, token, ttl).await.unwrap(),
                    Renewal::Renewed
                );
                assert_eq!(
                    store.renew(&name, &b, token, ttl).await.unwrap(),
                    Renewal::Lost
                );
                // A batch in which any lease was lost is counted as lost.
                assert_eq!(
                    store
                        .renew_many(
                            &a,
                            &[
                                (name.clone(), token),
                                (
                                    name.clone(),
                                    crate::store::token::FencingToken(token.get() + 1)
                                )
                            ],
                            ttl
                        )
                        .await
                        .unwrap(),
                    vec![Renewal::Renewed, Renewal::Lost]
                );
                faulty.set(|f| &f.down, true);
                assert!(store.renew(&name, &a, token, ttl).await.is_err());
            });
        });
        let mut counts = std::collections::BTreeMap::new();
        let mut timed = 0;
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            match value {
                DebugValue::Counter(n) => {
                    assert_eq!(key.key().name(), "leasehold_store_operations_total");
                    counts.insert(labels.join(","), n);
                }
                DebugValue::Histogram(samples) => {
                    assert_eq!(key.key().name(), "leasehold_store_operation_seconds");
                    timed += samples.len();
                }
                DebugValue::Gauge(_) => panic!("no gauge expected"),
            }
        }
        let expected: std::collections::BTreeMap<String, u64> = [
            ("op=acquire,result=acquired", 1),
            ("op=acquire,result=busy", 1),
            ("op=renew,result=renewed", 1),
            ("op=renew,result=lost", 1),
            ("op=renew,result=unavailable", 1),
            ("op=renew_many,result=lost", 1),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_owned(), n))
        .collect();
        assert_eq!(counts, expected);
        assert_eq!(timed, 6, "every call is timed");
    }
}
