//! A scheduler checks at start that its store has what its tasks need (slots for gated tasks,
//! membership for spreading), and names what is missing, instead of meeting `Unsupported` at
//! every tick.

use std::future::Future;
use std::time::Duration;

use leasehold::store::{Answer, Layer, StoreResult};
use leasehold::{
    Capabilities, LeaseName, MemoryStore, Schedule, Scheduler, SchedulerError, Store, Task,
};

/// A memory store that takes some capabilities away.
#[derive(Clone)]
struct Without {
    inner: MemoryStore,
    taken: Capabilities,
}

impl Layer for Without {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
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
        call()
    }

    fn capabilities_offered(&self) -> Capabilities {
        self.inner.capabilities().without(self.taken)
    }
}

fn without(taken: Capabilities) -> Without {
    Without {
        inner: MemoryStore::new(),
        taken,
    }
}

fn task(gated: bool) -> Task {
    let name = LeaseName::new("nightly").unwrap();
    let schedule = Schedule::every(Duration::from_secs(60)).unwrap();
    Task::new(name, schedule, |_| async { Ok::<(), std::io::Error>(()) }).gated(gated)
}

fn missing(result: Result<leasehold::SchedulerHandle, SchedulerError>) -> Capabilities {
    match result {
        Err(SchedulerError::MissingCapabilities { missing, .. }) => missing,
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("started without what its tasks need"),
    }
}

#[tokio::test]
async fn gated_tasks_need_slots() {
    let refused = Scheduler::new(without(Capabilities::SLOTS))
        .task(task(true))
        .start(std::future::pending());
    let error = refused.as_ref().err().map(ToString::to_string);
    assert_eq!(missing(refused), Capabilities::SLOTS);
    assert_eq!(
        error.as_deref(),
        Some("store memory cannot schedule these tasks: it keeps no slots")
    );
}

#[tokio::test]
async fn spreading_needs_membership() {
    let group = LeaseName::new("workers").unwrap();
    let refused = Scheduler::new(without(Capabilities::MEMBERSHIP))
        .spread(group)
        .task(task(true))
        .start(std::future::pending());
    assert_eq!(missing(refused), Capabilities::MEMBERSHIP);
}

#[tokio::test]
async fn what_the_tasks_do_not_need_may_be_missing() {
    // Ungated tasks touch no slot; a store without a catalog is run without one.
    let handle = Scheduler::new(without(Capabilities::SLOTS | Capabilities::CATALOG))
        .task(task(false))
        .start(std::future::pending())
        .unwrap();
    handle.shutdown().await;
    let handle = Scheduler::new(without(Capabilities::CATALOG | Capabilities::PURGE))
        .task(task(true))
        .start(std::future::pending())
        .unwrap();
    handle.shutdown().await;
}
