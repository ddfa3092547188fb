//! A process's tasks in the store's catalog, for every driver (the scheduler's tasks, the
//! tasks applications tick through a sidecar): each is registered with a heartbeat (its
//! definition, this instance and what it says about itself) once per renew interval of its
//! lease, so `leasehold status` lists it with its instances and pause and trigger reach it; it
//! is unregistered when the process stops, or, for a task kept only while it is fired, once
//! it has not been fired for its [`idle_expiry`].
//! A sidecar also registers the application instances it speaks for ([`Presence::keep_for`]):
//! each (task, instance) pair has its own heartbeat and idle expiry, so an application replica
//! that stops ticking leaves the task's instances while its sidecar, and the other replicas,
//! go on.
//! Each heartbeat reads the task's control record, which [`Presence::keep`]'s receiver
//! carries to the driver (a manual trigger can then be taken while the task lease is free).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::lease::config::LeaseConfig;
use crate::scheduling::definition::{InstanceInfo, TaskDefinition};
use crate::store::capabilities::Capabilities;
use crate::store::catalog::{CATALOG_RETENTION, Registration, Versioned};
use crate::store::name::{HolderId, LeaseName};
use crate::store::timeout::within;
use crate::store::traits::Catalog;

/// How long a task may go without a firing before an instance gives it up (its catalog entry,
/// a group campaigned for on its behalf): twice the interval between its slots, plus the task
/// lease's ttl.
pub fn idle_expiry(interval: Duration, ttl: Duration) -> Duration {
    interval.saturating_mul(2) + ttl
}

/// The catalog entries of one process's tasks: see the module documentation.
pub struct Presence<S> {
    store: S,
    instance: HolderId,
    about: String,
    stop: CancellationToken,
    tasks: Mutex<HashMap<(LeaseName, HolderId), Arc<Registered>>>,
    heartbeats: TaskTracker,
}

/// One task's registration, for one instance.
struct Registered {
    /// The instance registered: this process, or one it speaks for.
    instance: HolderId,
    /// What the instance says about itself (JSON).
    about: String,
    /// The definition (JSON) and the lease timing, as the last call gave them.
    definition: Mutex<(String, LeaseConfig)>,
    /// The last firing, and how long after it the task is given up (`None`: never).
    activity: Mutex<(Instant, Option<Duration>)>,
    /// The control record as the last heartbeat read it.
    control: watch::Sender<Option<Versioned>>,
    /// Fires when the task is [forgotten](Presence::forget).
    forgotten: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: Catalog> Presence<S> {
    /// Registrations on `store` as `instance`, all unregistered when `stop` fires.
    pub fn new(store: S, instance: HolderId, stop: CancellationToken) -> Self {
        Self {
            store,
            instance,
            about: InstanceInfo::current().to_json(),
            stop,
            tasks: Mutex::default(),
            heartbeats: TaskTracker::new(),
        }
    }

    /// Whether the store keeps a catalog at all.
    pub fn catalog_kept(&self) -> bool {
        self.store.capabilities().contains(Capabilities::CATALOG)
    }

    /// Keeps `task` registered with `definition` (its heartbeat living its lease's ttl and
    /// renewed every renew interval of `config`): from now on for `idle` more, or, with `None`,
    /// until the process stops. A call for a task already kept updates its definition and
    /// activity. `None` where the store keeps no catalog or the process is stopping; else the
    /// control record as each heartbeat reads it.
    pub fn keep(
        self: &Arc<Self>,
        task: &LeaseName,
        definition: &TaskDefinition,
        config: LeaseConfig,
        idle: Option<Duration>,
    ) -> Option<watch::Receiver<Option<Versioned>>> {
        let instance = self.instance.clone();
        self.register(task, instance, None, definition, config, idle)
    }

    /// As [`keep`](Self::keep), for an application instance that this process speaks for (a
    /// sidecar's caller, named by its request): registered as `instance`, `via` this process's
    /// own instance id, with a heartbeat and an idle expiry of its own.
    pub fn keep_for(
        self: &Arc<Self>,
        task: &LeaseName,
        instance: &HolderId,
        definition: &TaskDefinition,
        config: LeaseConfig,
        idle: Option<Duration>,
    ) -> Option<watch::Receiver<Option<Versioned>>> {
        let about = InstanceInfo::via(self.instance.as_str()).to_json();
        self.register(
            task,
            instance.clone(),
            Some(about),
            definition,
            config,
            idle,
        )
    }

    /// The registration of `task` for `instance` (`about` it: this process's, unless given).
    fn register(
        self: &Arc<Self>,
        task: &LeaseName,
        instance: HolderId,
        about: Option<String>,
        definition: &TaskDefinition,
        config: LeaseConfig,
        idle: Option<Duration>,
    ) -> Option<watch::Receiver<Option<Versioned>>> {
        if !self.catalog_kept() || self.stop.is_cancelled() {
            return None;
        }
        let definition = (definition.to_json(), config);
        let key = (task.clone(), instance);
        let mut tasks = lock(&self.tasks);
        if let Some(known) = tasks.get(&key) {
            *lock(&known.definition) = definition;
            *lock(&known.activity) = (Instant::now(), idle);
            return Some(known.control.subscribe());
        }
        let registered = Arc::new(Registered {
            instance: key.1.clone(),
            about: about.unwrap_or_else(|| self.about.clone()),
            definition: Mutex::new(definition),
            activity: Mutex::new((Instant::now(), idle)),
            control: watch::Sender::new(None),
            forgotten: CancellationToken::new(),
        });
        let control = registered.control.subscribe();
        tasks.insert(key, registered.clone());
        let this = self.clone();
        let task = task.clone();
        self.heartbeats
            .spawn(async move { this.heartbeat(task, registered).await });
        Some(control)
    }

    async fn heartbeat(self: Arc<Self>, task: LeaseName, registered: Arc<Registered>) {
        loop {
            let (definition, config) = lock(&registered.definition).clone();
            let registration = Registration {
                task: &task,
                definition: &definition,
                instance: &registered.instance,
                about: &registered.about,
                ttl: config.ttl,
                forget_after: CATALOG_RETENTION,
            };
            let interval = config.renew_interval;
            match within(interval, self.store.register(&registration)).await {
                Ok(control) => {
                    registered.control.send_if_modified(|seen| {
                        let changed = *seen != control;
                        *seen = control;
                        changed
                    });
                }
                Err(e) => tracing::debug!(task = %task, error = %e, "catalog heartbeat failed"),
            }
            let next = Instant::now() + interval;
            if self.given_up(&task, &registered) {
                break;
            }
            tokio::select! {
                () = self.stop.cancelled() => {
                    lock(&self.tasks).remove(&(task.clone(), registered.instance.clone()));
                    break;
                }
                () = registered.forgotten.cancelled() => break,
                () = tokio::time::sleep_until(next) => {}
            }
        }
        let limit = lock(&registered.definition).1.renew_interval;
        if let Err(e) = within(limit, self.store.unregister(&task, &registered.instance)).await {
            tracing::debug!(task = %task, error = %e, "catalog entry not removed; it expires");
        }
    }

    /// Whether `task` is no longer fired here for the registration's instance (then it is
    /// forgotten, under the same lock a [`keep`](Self::keep) takes: a call after this starts a
    /// new registration).
    fn given_up(&self, task: &LeaseName, registered: &Registered) -> bool {
        let mut tasks = lock(&self.tasks);
        let (last, idle) = *lock(&registered.activity);
        let gone =
            idle.is_some_and(|idle| last + idle <= Instant::now()) || self.stop.is_cancelled();
        if gone {
            tasks.remove(&(task.clone(), registered.instance.clone()));
            if tasks.capacity() > 2 * tasks.len() + 64 {
                tasks.shrink_to_fit();
            }
        }
        gone
    }

    /// Unregisters `task` now, for every instance (a task taken out of a running scheduler).
    /// A later [`keep`](Self::keep) registers it anew.
    pub fn forget(&self, task: &LeaseName) {
        let mut tasks = lock(&self.tasks);
        tasks.retain(|(name, _), registered| {
            let keep = name != task;
            if !keep {
                registered.forgotten.cancel();
            }
            keep
        });
    }

    /// How many registrations are kept: one per task and instance.
    pub fn len(&self) -> usize {
        lock(&self.tasks).len()
    }

    /// Whether no task is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every task is unregistered (after `stop` fired), at most `limit`.
    pub async fn shut_down(&self, limit: Duration) {
        self.heartbeats.close();
        let _ = tokio::time::timeout(limit, self.heartbeats.wait()).await;
    }
}
