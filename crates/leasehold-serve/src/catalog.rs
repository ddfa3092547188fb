//! The tasks applications tick through this sidecar, in the store's catalog: each is registered
//! with a heartbeat (source `sidecar`, its schedule and policy) from its first tick, renewed
//! every third of the task lease's ttl while ticks keep arriving, and unregistered once they
//! stop for twice the schedule's interval plus the ttl (as a group campaign is given up), or on
//! shutdown. So `leasehold status` lists sidecar tasks with their instances, and pause and
//! trigger reach them (a trigger is taken at the task's next tick).
//!
//! It also remembers the slot this sidecar granted last per task, so a grant that does not
//! follow it (the previous firing ran elsewhere, or nowhere) looks for slots nobody accounted
//! for and records them as missed, as the scheduler's timer does; and the tasks whose pending
//! manual trigger a tick here left for a timer run, so that the next tick takes it first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::catalog::{CATALOG_RETENTION, InstanceInfo, Registration, TaskDefinition};
use leasehold::{BoxStore, CancellationToken, Capabilities, Catalog, HolderId, LeaseName, Store};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One ticked task's registration.
struct Registered {
    /// The definition (JSON) and the heartbeat's ttl, as the last tick gave them.
    definition: Mutex<(String, Duration)>,
    /// The last tick, and how long after it the task counts as no longer ticked here.
    activity: Mutex<(Instant, Duration)>,
}

/// The registrations of one sidecar's ticked tasks.
pub(crate) struct Registrations {
    store: BoxStore,
    instance: HolderId,
    about: String,
    stop: CancellationToken,
    tasks: Mutex<HashMap<LeaseName, Arc<Registered>>>,
    heartbeats: TaskTracker,
    /// The slot this sidecar granted last, per task (whether or not the store keeps a catalog).
    granted: Mutex<HashMap<LeaseName, u64>>,
    /// The tasks whose last tick here ran its timer slot while a manual trigger was pending.
    passed_over: Mutex<std::collections::HashSet<LeaseName>>,
}

impl Registrations {
    pub(crate) fn new(store: BoxStore, instance: HolderId, stop: CancellationToken) -> Self {
        Self {
            store,
            instance,
            about: InstanceInfo::current().to_json(),
            stop,
            tasks: Mutex::default(),
            heartbeats: TaskTracker::new(),
            granted: Mutex::default(),
            passed_over: Mutex::default(),
        }
    }

    /// A tick of `task` arrived: keeps it registered (from now on, with `definition`) for
    /// `idle` more, its heartbeat living `ttl`.
    pub(crate) fn ticked(
        self: &Arc<Self>,
        task: &LeaseName,
        definition: &TaskDefinition,
        ttl: Duration,
        idle: Duration,
    ) {
        if !self.store.capabilities().contains(Capabilities::CATALOG) || self.stop.is_cancelled() {
            return;
        }
        let definition = (definition.to_json(), ttl);
        let mut tasks = lock(&self.tasks);
        if let Some(known) = tasks.get(task) {
            *lock(&known.definition) = definition;
            let mut activity = lock(&known.activity);
            *activity = (Instant::now(), idle);
            return;
        }
        let registered = Arc::new(Registered {
            definition: Mutex::new(definition),
            activity: Mutex::new((Instant::now(), idle)),
        });
        tasks.insert(task.clone(), registered.clone());
        let this = self.clone();
        let task = task.clone();
        self.heartbeats
            .spawn(async move { this.heartbeat(task, registered).await });
    }

    /// This sidecar granted `slot` of `task`: answers the slot it granted before, if any.
    pub(crate) fn granted(&self, task: &LeaseName, slot: u64) -> Option<u64> {
        lock(&self.granted).insert(task.clone(), slot)
    }

    /// A tick of `task` here ran its timer slot and left a pending trigger (`true`), or a tick
    /// found none left to take (`false`).
    pub(crate) fn passed_over(&self, task: &LeaseName, passed: bool) {
        let mut tasks = lock(&self.passed_over);
        match passed {
            true => tasks.insert(task.clone()),
            false => tasks.remove(task),
        };
    }

    /// Whether the last tick of `task` here left a pending trigger for its timer run.
    pub(crate) fn trigger_waits(&self, task: &LeaseName) -> bool {
        lock(&self.passed_over).contains(task)
    }

    async fn heartbeat(self: Arc<Self>, task: LeaseName, registered: Arc<Registered>) {
        loop {
            let (definition, ttl) = lock(&registered.definition).clone();
            let registration = Registration {
                task: &task,
                definition: &definition,
                instance: &self.instance,
                about: &self.about,
                ttl,
                forget_after: CATALOG_RETENTION,
            };
            let interval = ttl / 3;
            if let Err(e) =
                leasehold::store::within(interval, self.store.register(&registration)).await
            {
                tracing::debug!(task = %task, error = %e, "catalog heartbeat failed");
            }
            let next = Instant::now() + interval;
            if self.idle(&task, &registered) {
                break;
            }
            tokio::select! {
                () = self.stop.cancelled() => {
                    lock(&self.tasks).remove(&task);
                    break;
                }
                () = tokio::time::sleep_until(next) => {}
            }
        }
        let limit = lock(&registered.definition).1 / 3;
        if let Err(e) =
            leasehold::store::within(limit, self.store.unregister(&task, &self.instance)).await
        {
            tracing::debug!(task = %task, error = %e, "catalog entry not removed; it expires");
        }
    }

    /// Whether `task` stopped being ticked here (then it is forgotten, under the same lock a
    /// tick takes: a tick after this starts a new registration).
    fn idle(&self, task: &LeaseName, registered: &Registered) -> bool {
        let mut tasks = lock(&self.tasks);
        let (last, idle) = *lock(&registered.activity);
        let gone = last + idle <= Instant::now() || self.stop.is_cancelled();
        if gone {
            tasks.remove(task);
        }
        gone
    }

    /// Unregisters every task, waiting at most `limit`.
    pub(crate) async fn shut_down(&self, limit: Duration) {
        self.heartbeats.close();
        let _ = tokio::time::timeout(limit, self.heartbeats.wait()).await;
    }
}
