//! The single-active scheduler; its documentation is on [`Scheduler`].

mod runner;
mod status;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::lease::config::LeaseConfig;
use crate::lease::guard::Lease;
use crate::lease::leader::{Leader, LeaderState};
use crate::scheduling::definition::TaskSource;
use crate::scheduling::history::{DEFAULT_HISTORY_LIMIT, RunRecord};
use crate::scheduling::placement::Placement;
use crate::scheduling::presence::Presence;
use crate::store::capabilities::Capabilities;
use crate::store::memory::MemoryStore;
use crate::store::name::{HolderId, LeaseName};
use crate::store::traits::{Catalog, Membership, Slots};
use runner::{Common, RunNow, TaskRunner};
pub use status::{SchedulerError, SchedulerStatus, TaskStatus};

use crate::scheduling::task::{RunResult, StoreDownPolicy, Task};

/// The single-active scheduler: periodic tasks whose timer ticks run on exactly one instance.
///
/// # How a timer tick is won
/// Every instance arms every task's timer. When it fires for a slot (the firing's scheduled time
/// in ms on the store's clock, see [`Schedule`](crate::Schedule)), a gated task's tick:
/// 1. reads the store's clock: if the store cannot answer, the task's [`StoreDownPolicy`]
///    decides; if the store's clock has not reached the slot yet, the timer waits for it (so a
///    host whose clock runs ahead never claims a future slot);
/// 2. with a leader gate, skips on a non-leader (`skipped-not-leader`);
/// 3. takes the task's lease (named like the task). `Busy` means another instance is running the
///    task right now: skip (`skipped-claimed`). Holding the lease for the whole run is what
///    keeps a run that outlives its interval from overlapping the next run anywhere;
/// 4. claims the slot in the store, a compare-and-set that only moves forward. `AlreadyRun`
///    means another instance ran this slot (or a later one): skip (`skipped-claimed`). This is
///    what keeps a tick from running twice across a failover, and, because slots are times,
///    across a schedule change or a rolling deploy whose replicas disagree on the schedule;
/// 5. runs the job with a [`TaskContext`](crate::TaskContext) whose cancellation token fires when the task lease
///    or leadership starts expiring (renewal overdue by the stop margin) or is lost, then
///    releases the lease.
///
/// An ungated task ([`Task::gated`]`(false)`) skips all of this: every instance runs each tick.
///
/// # Spreading tasks over instances
/// Without a leader group every instance contends for every tick and the fastest wins. With
/// [`spread`](Self::spread) each instance keeps an entry in a membership group in the store
/// (refreshed every ttl/3, expiring a ttl after its last refresh, on the store's clock) and
/// contends only for the tasks it owns: the live member with the highest rendezvous weight for
/// the task (a stable hash of member and task), so tasks spread evenly and a member joining or
/// leaving moves only the tasks it gains or loses. In step 2 a task owned elsewhere skips
/// (`skipped-not-owner`). A member that dies drops out when its entry expires, and its tasks
/// move within about a ttl and a third; one that shuts down leaves the group at once. Steps 3
/// and 4 still gate every run, so two instances whose views of the membership differ for a
/// moment still run each slot at most once. A task that moves here looks for its missed slots
/// as on winning leadership. If the store keeps no membership (or stops answering it for a
/// ttl) every instance contends for every task, as without spreading, and that is logged once.
///
/// # Missed ticks
/// Ticks are never queued or replayed. A firing that falls while the task runs (here or on
/// another instance) is skipped, and after a run the timer is armed for the next firing after
/// *now*: like tokio's `MissedTickBehavior::Skip`. A process that was paused wakes, finds its slot
/// already claimed by a later one, and skips.
///
/// # Manual runs
/// [`SchedulerHandle::run_now`] runs a task here and now, bypassing the gate, the lease and the
/// slot claim: it may overlap a timer run of the same task on another instance.
/// [`SchedulerHandle::run_now_exclusive`] holds the task lease for the run instead, so it never
/// overlaps a run of the task anywhere (it answers [`SchedulerError::Busy`] while one is in
/// progress). Either way the run belongs to the scheduler: a caller that stops waiting does not
/// detach it, and shutdown drains it like a timer run.
///
/// # Missed slots and catch-up
/// A slot no instance ran when it was due (a crashed leader's lease was running out, every
/// instance was down, the store was down under fail-closed, a run overlapped) is handled by the
/// task's [`CatchUp`](crate::CatchUp) policy when this instance wins leadership (without a
/// leader group: on start and when the store answers again): `Skip` records it missed, `Latest`
/// runs the most recent one inside a window, `All` runs every one inside the window, in order,
/// capped. Catch-up runs are gated and claimed like timer runs, so no slot runs twice.
///
/// # When the store is down
/// See [`StoreDownPolicy`] for what each policy does in each state.
///
/// # Run history
/// Every gated, catch-up and manual run is recorded in the store (slot, trigger, holder, token,
/// start, end, outcome), and so are missed slots with the reason where it is known; the newest
/// [`history_limit`](Self::history_limit) entries per task are kept. The writes leave each run's
/// critical path (one writer task per scheduler). Read it with [`SchedulerHandle::history`] or
/// `leasehold history`.
///
/// ```
/// use leasehold::{CatchUp, LeaseName, MemoryStore, Schedule, Scheduler, Task, TaskContext};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let nightly = Task::new(
///     LeaseName::new("nightly-report")?,
///     Schedule::cron("0 0 3 * * *")?,
///     |ctx: TaskContext| async move {
///         // ... build the report; check ctx.is_held() right before publishing it.
///         Ok::<_, std::io::Error>(())
///     },
/// )
/// .catch_up(CatchUp::Latest { window: Duration::from_secs(6 * 3600) });
/// let scheduler = Scheduler::new(MemoryStore::new())
///     .leader_group(LeaseName::new("reporters")?)
///     .task(nightly)
///     .start(std::future::ready(()))?; // a shutdown signal; here: stop at once
/// scheduler.wait().await;
/// # Ok(()) }
/// ```
pub struct Scheduler<S> {
    store: S,
    holder: HolderId,
    lease_config: LeaseConfig,
    policy: StoreDownPolicy,
    leader_group: Option<LeaseName>,
    spread: Option<LeaseName>,
    grace: Duration,
    tasks: Vec<Task>,
    has_store: bool,
    history_limit: usize,
    source: TaskSource,
}

impl Scheduler<MemoryStore> {
    /// Single-instance mode: no store, every tick runs here. Logs one warning at start.
    pub fn local() -> Self {
        let mut s = Scheduler::new(MemoryStore::new());
        s.policy = StoreDownPolicy::Local;
        s.has_store = false;
        s
    }
}

/// What a [`Scheduler`] needs of its store: slots and history, membership, the catalog. Every
/// store crate's store has it (the memory store too); generic code over a scheduler names it:
///
/// ```
/// use leasehold::{Scheduler, SchedulerStore};
///
/// fn nightly<S: SchedulerStore>(scheduler: Scheduler<S>) -> Scheduler<S> {
///     scheduler.grace_period(std::time::Duration::from_secs(30))
/// }
/// # let _ = nightly(Scheduler::new(leasehold::MemoryStore::new()));
/// ```
pub trait SchedulerStore: Slots + Membership + Catalog {}

impl<S: Slots + Membership + Catalog> SchedulerStore for S {}

impl<S: SchedulerStore> Scheduler<S> {
    /// A scheduler coordinating through `store`, with default lease timing (ttl 15 s), policy
    /// fail-closed, no leader gate and a 30 s shutdown grace period.
    pub fn new(store: S) -> Self {
        Self {
            store,
            holder: HolderId::generate(),
            lease_config: LeaseConfig::default(),
            policy: StoreDownPolicy::default(),
            leader_group: None,
            spread: None,
            grace: Duration::from_secs(30),
            tasks: Vec::new(),
            has_store: true,
            history_limit: DEFAULT_HISTORY_LIMIT,
            source: TaskSource::Scheduler,
        }
    }

    /// How many run-history entries the store keeps per task (newest first). Default:
    /// [`DEFAULT_HISTORY_LIMIT`] (100).
    pub fn history_limit(mut self, entries: usize) -> Self {
        self.history_limit = entries.max(1);
        self
    }

    /// Lease timing for task leases and the leader lease. Default: `LeaseConfig::default()`.
    /// Its `stop_margin` is also how long a cancelled job has to return before it is aborted.
    pub fn lease_config(mut self, config: LeaseConfig) -> Self {
        self.lease_config = config;
        self
    }

    /// The default store-down policy for tasks without their own. Default: fail-closed.
    pub fn on_store_down(mut self, policy: StoreDownPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Gates the timer ticks of gated tasks on leadership of `group`: only its leader runs them.
    /// Default: none (every instance competes for each tick through the task lease and slot
    /// claim).
    pub fn leader_group(mut self, group: LeaseName) -> Self {
        self.leader_group = Some(group);
        self
    }

    /// Spreads the gated tasks over the live instances that spread over the same `group`: each
    /// instance contends only for the ticks of the tasks it owns (see "Spreading tasks over
    /// instances" above). Membership expires after the lease ttl. Not with a leader group.
    pub fn spread(mut self, group: LeaseName) -> Self {
        self.spread = Some(group);
        self
    }

    /// How long shutdown lets running jobs finish before cancelling them (the drain); a
    /// cancelled job that has not returned a stop margin later (see [`LeaseConfig::stop_margin`])
    /// is aborted, so shutdown takes at most `grace + stop_margin`. Default: 30 s.
    ///
    /// While it drains the scheduler takes no new slot (nor manual trigger) and keeps renewing
    /// the leases its running jobs hold; a job whose lease (or leadership) starts expiring is
    /// cancelled at once, as at any other time. [`SchedulerHandle::end_drain`] ends the
    /// grace period early. `Duration::ZERO` cancels running jobs as soon as shutdown begins.
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// What the store's catalog says registered the tasks (`leasehold status` shows it).
    /// Default: [`TaskSource::Scheduler`]; `leasehold run` says [`TaskSource::Run`].
    pub fn registered_as(mut self, source: TaskSource) -> Self {
        self.source = source;
        self
    }

    /// This instance's holder id. Default: a generated `host:pid:random` id.
    pub fn holder(mut self, holder: HolderId) -> Self {
        self.holder = holder;
        self
    }

    /// Adds a task.
    pub fn task(mut self, task: Task) -> Self {
        self.tasks.push(task);
        self
    }

    /// Starts every task's timer (and the election, with a leader gate). Scheduling stops when
    /// `shutdown` completes, [`SchedulerHandle::shutdown`] is called, or the last handle is
    /// dropped.
    pub fn start(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<SchedulerHandle, SchedulerError> {
        self.lease_config.validate()?;
        let mut names = HashMap::new();
        for t in &self.tasks {
            if names.insert(t.name.clone(), ()).is_some() {
                return Err(SchedulerError::DuplicateTask(t.name.clone()));
            }
        }
        if let Some(group) = &self.leader_group
            && names.contains_key(group)
        {
            return Err(SchedulerError::GroupNamedLikeTask(group.clone()));
        }
        if self.spread.is_some() && self.leader_group.is_some() {
            return Err(SchedulerError::SpreadWithLeaderGroup);
        }
        // A scheduler started without tasks expects gated ones to be added
        // ([`SchedulerHandle::add_task`]): it takes part in the election or placement at once.
        let any_gated = self.tasks.is_empty() || self.tasks.iter().any(|t| t.gated);
        let needed = match (self.has_store && any_gated, self.spread.is_some()) {
            (false, _) => Capabilities::NONE,
            (true, false) => Capabilities::SLOTS,
            (true, true) => Capabilities::SLOTS | Capabilities::MEMBERSHIP,
        };
        let missing = self.store.capabilities().missing(needed);
        if !missing.is_empty() {
            return Err(SchedulerError::MissingCapabilities {
                store: self.store.describe(),
                missing,
            });
        }
        // `stop` ends the timers; leadership is given up only once running jobs have drained,
        // so the next leader's first tick does not find the task lease still held.
        let stop = CancellationToken::new();
        let step_down = CancellationToken::new();
        let done = CancellationToken::new();
        if !self.has_store {
            tracing::warn!(
                "leasehold scheduler in single-instance mode (no store): every tick runs here"
            );
        }
        let leader = match &self.leader_group {
            Some(group) if self.has_store && any_gated => {
                let holder = self.holder.clone();
                let lease =
                    Lease::held_as(self.store.clone(), group.clone(), self.lease_config, holder)?;
                let step_down = step_down.clone();
                Some(Leader::new(lease).start(async move { step_down.cancelled().await }))
            }
            _ => None,
        };
        let placement = match &self.spread {
            Some(group) if self.has_store && any_gated => Some(Arc::new(Placement::new(
                group.clone(),
                self.holder.clone(),
                self.lease_config.ttl,
            ))),
            _ => None,
        };
        let history = crate::scheduling::history::HistoryWriter::spawn(
            self.store.clone(),
            self.history_limit,
            self.lease_config.renew_interval,
        );
        let common = Arc::new(Common::new(
            leader,
            placement.clone(),
            self.holder.clone(),
            self.grace,
            self.has_store,
            stop.clone(),
            history,
        ));
        let mut loops = Vec::new();
        if let Some(placement) = placement {
            loops.push(tokio::spawn(
                placement.heartbeat(self.store.clone(), stop.clone()),
            ));
        }
        let presence = Arc::new(Presence::new(
            self.store.clone(),
            self.holder.clone(),
            stop.clone(),
        ));
        let catalog = self.has_store && presence.catalog_kept();
        if self.has_store && !catalog {
            tracing::info!(store = %self.store.describe(), capabilities = %self.store.capabilities(), "the store keeps no catalog: these tasks are not listed, and pause and trigger do not reach them");
        }
        let registrar = Registrar {
            store: self.store.clone(),
            lease_config: self.lease_config,
            policy: self.policy,
            has_store: self.has_store,
            source: self.source,
            leader_group: self.leader_group.clone(),
            spread: self.spread.clone(),
            common: common.clone(),
            presence: presence.clone(),
            catalog,
        };
        let tasks = Arc::new(TaskSet {
            runners: std::sync::Mutex::new(HashMap::new()),
            timers: TaskTracker::new(),
        });
        for task in self.tasks {
            let name = task.name.clone();
            let runner = registrar.register(task, &tasks.timers)?;
            lock(&tasks.runners).insert(name, runner);
        }
        {
            let (presence, stop, limit) = (presence, stop.clone(), self.lease_config.ttl);
            loops.push(tokio::spawn(async move {
                stop.cancelled().await;
                presence.shut_down(limit).await;
            }));
        }
        tokio::spawn(supervise(
            shutdown,
            common.clone(),
            loops,
            tasks.clone(),
            step_down,
            done.clone(),
        ));
        Ok(SchedulerHandle {
            inner: Arc::new(HandleInner {
                tasks,
                registrar: Arc::new(registrar),
                common,
                done,
                store: if self.has_store {
                    self.store.describe()
                } else {
                    "none (single-instance mode)".to_owned()
                },
            }),
        })
    }
}

/// A running scheduler's tasks: their runners, and the timer loops shutdown drains (also
/// those of tasks being removed).
struct TaskSet {
    runners: std::sync::Mutex<HashMap<LeaseName, Registered>>,
    timers: TaskTracker,
}

/// A task of a running scheduler.
struct Registered {
    runner: Arc<dyn RunNow>,
    timer: JoinHandle<()>,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What starting a task needs, kept for tasks added while the scheduler runs.
struct Registrar<S> {
    store: S,
    lease_config: LeaseConfig,
    policy: StoreDownPolicy,
    has_store: bool,
    source: TaskSource,
    leader_group: Option<LeaseName>,
    spread: Option<LeaseName>,
    common: Arc<Common>,
    presence: Arc<Presence<S>>,
    catalog: bool,
}

/// The object-safe part of a [`Registrar`] the (not generic) handle needs.
trait Register: Send + Sync {
    /// Starts `task`'s timer loop on `timers`, and keeps it in the catalog.
    fn register(&self, task: Task, timers: &TaskTracker) -> Result<Registered, SchedulerError>;
    /// Takes `task` out of the catalog (its entry here, then in the store).
    fn forget(&self, task: &LeaseName);
}

impl<S: Slots + Membership + Catalog> Register for Registrar<S> {
    fn register(&self, task: Task, timers: &TaskTracker) -> Result<Registered, SchedulerError> {
        if self.leader_group.as_ref() == Some(&task.name) {
            return Err(SchedulerError::GroupNamedLikeTask(task.name.clone()));
        }
        let policy = match self.has_store {
            true => task.policy.unwrap_or(self.policy),
            false => StoreDownPolicy::Local,
        };
        tracing::info!(task = %task.name, schedule = %task.schedule, %policy, gated = task.gated, "task scheduled");
        let holder = self.common.holder.clone();
        let lease = Lease::held_as(
            self.store.clone(),
            task.name.clone(),
            self.lease_config,
            holder,
        )?;
        let name = task.name.clone();
        let runner = Arc::new(TaskRunner::new(task, lease, policy, self.common.clone()));
        let definition = runner.definition(
            self.source,
            self.leader_group.as_ref(),
            self.spread.as_ref(),
        );
        // Registered until the task is removed or the scheduler stops; each heartbeat's
        // control record goes to the task's timer loop, which takes a pending manual trigger.
        let control = match self.catalog {
            true => self
                .presence
                .keep(&name, &definition, self.lease_config, None),
            false => None,
        };
        let timer = timers.spawn(runner.clone().timer_loop(control));
        Ok(Registered { runner, timer })
    }

    fn forget(&self, task: &LeaseName) {
        self.presence.forget(task);
    }
}

/// Waits for shutdown (or a failure), then drains the timer loops and manual runs, steps down,
/// and marks the scheduler done.
async fn supervise(
    shutdown: impl Future<Output = ()> + Send,
    common: Arc<Common>,
    loops: Vec<JoinHandle<()>>,
    tasks: Arc<TaskSet>,
    step_down: CancellationToken,
    done: CancellationToken,
) {
    let leader_failed = async {
        let Some(leader) = &common.leader else {
            return std::future::pending().await;
        };
        let mut rx = leader.watch();
        loop {
            if let LeaderState::Failed { error } = &*rx.borrow_and_update() {
                return error.clone();
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    };
    tokio::select! {
        () = shutdown => {}
        () = common.stop.cancelled() => {}
        error = leader_failed => common.fail(format!("leader election: {error}")),
    }
    common.stop.cancel();
    // No task is added from here on (add_task checks `stop` under the same lock).
    let manual_runs: Vec<TaskTracker> = lock(&tasks.runners)
        .values()
        .map(|r| r.runner.manual_runs())
        .collect();
    tasks.timers.close();
    tasks.timers.wait().await;
    for l in loops {
        let _ = l.await;
    }
    for runs in manual_runs {
        runs.close();
        runs.wait().await;
    }
    // The last runs' records reach the store before the scheduler reports itself done.
    common.history.flush(Duration::from_secs(5)).await;
    step_down.cancel();
    if let Some(leader) = &common.leader {
        let mut rx = leader.watch();
        while !matches!(
            *rx.borrow_and_update(),
            LeaderState::Stopped | LeaderState::Failed { .. }
        ) {
            if rx.changed().await.is_err() {
                break;
            }
        }
    }
    done.cancel();
}

struct HandleInner {
    tasks: Arc<TaskSet>,
    registrar: Arc<dyn Register>,
    common: Arc<Common>,
    done: CancellationToken,
    store: String,
}

impl Drop for HandleInner {
    fn drop(&mut self) {
        // As with a dropped LeaderHandle: no handle left means nobody can stop it later.
        self.common.stop.cancel();
    }
}

/// A running scheduler. Cheap to clone.
///
/// Dropping the last clone shuts the scheduler down (as dropping a
/// [`LeaderHandle`](crate::LeaderHandle) steps down): keep a handle for as long as it should run.
#[derive(Clone)]
pub struct SchedulerHandle {
    inner: Arc<HandleInner>,
}

impl SchedulerHandle {
    fn runner(&self, task: &str) -> Result<Arc<dyn RunNow>, SchedulerError> {
        if self.inner.common.stop.is_cancelled() {
            return Err(SchedulerError::ShutDown);
        }
        self.task_runner(task)
    }

    fn task_runner(&self, task: &str) -> Result<Arc<dyn RunNow>, SchedulerError> {
        LeaseName::new(task)
            .ok()
            .and_then(|n| {
                lock(&self.inner.tasks.runners)
                    .get(&n)
                    .map(|r| r.runner.clone())
            })
            .ok_or_else(|| SchedulerError::UnknownTask(task.to_owned()))
    }

    /// Adds `task` to the running scheduler: its timer starts at once, as a task given to
    /// [`Scheduler::task`] does at start. [`SchedulerError::DuplicateTask`] if one of that name
    /// runs (or is being removed: wait for [`remove_task`](Self::remove_task) first).
    pub fn add_task(&self, task: Task) -> Result<(), SchedulerError> {
        let mut runners = lock(&self.inner.tasks.runners);
        if self.inner.common.stop.is_cancelled() {
            return Err(SchedulerError::ShutDown);
        }
        if runners.contains_key(&task.name) {
            return Err(SchedulerError::DuplicateTask(task.name.clone()));
        }
        let name = task.name.clone();
        let registered = self
            .inner
            .registrar
            .register(task, &self.inner.tasks.timers)?;
        runners.insert(name, registered);
        Ok(())
    }

    /// Removes `task` from the running scheduler: no more of its slots are taken here, a run
    /// in progress (timer or manual) finishes as it would have, and then the task leaves the
    /// catalog. Returns once that run has ended. Its slots are then run by no one here; another
    /// instance that still has the task keeps running it.
    pub async fn remove_task(&self, task: &str) -> Result<(), SchedulerError> {
        let name =
            LeaseName::new(task).map_err(|_| SchedulerError::UnknownTask(task.to_owned()))?;
        let Some(registered) = lock(&self.inner.tasks.runners).remove(&name) else {
            return Err(SchedulerError::UnknownTask(task.to_owned()));
        };
        registered.runner.retire();
        let _ = registered.timer.await;
        let manual = registered.runner.manual_runs();
        manual.close();
        manual.wait().await;
        self.inner.registrar.forget(&name);
        Ok(())
    }

    async fn manual(&self, task: &str, exclusive: bool) -> Result<RunResult, SchedulerError> {
        let run = self.runner(task)?.start_manual(exclusive);
        // Dropping this future stops the waiting, not the run: the scheduler owns it.
        run.await.unwrap_or(Err(SchedulerError::ShutDown))
    }

    /// Runs `task` here now, bypassing the leader gate, the task lease and the slot claim, and
    /// waits for it to finish. It may overlap a timer run of the task on another instance; use
    /// [`run_now_exclusive`](Self::run_now_exclusive) where that must not happen. The run
    /// belongs to the scheduler: dropping this future does not cancel or detach it, and
    /// shutdown drains it.
    pub async fn run_now(&self, task: &str) -> Result<RunResult, SchedulerError> {
        self.manual(task, false).await
    }

    /// Runs `task` here now while holding its task lease, so it never overlaps a run of the
    /// task anywhere; answers [`SchedulerError::Busy`] when one is in progress. The run gets the
    /// lease's fencing token and is cancelled if the lease starts expiring. No slot is claimed.
    pub async fn run_now_exclusive(&self, task: &str) -> Result<RunResult, SchedulerError> {
        self.manual(task, true).await
    }

    /// The newest `limit` entries of `task`'s run history in the store (every instance's runs,
    /// and the slots that did not run), newest first.
    pub async fn history(
        &self,
        task: &str,
        limit: usize,
    ) -> Result<Vec<RunRecord>, SchedulerError> {
        let runner = self.task_runner(task)?;
        runner.history(limit).await.map_err(SchedulerError::History)
    }

    /// A snapshot of every task.
    pub fn status(&self) -> SchedulerStatus {
        let mut tasks: Vec<TaskStatus> = lock(&self.inner.tasks.runners)
            .values()
            .map(|t| t.runner.status())
            .collect();
        tasks.sort_by(|a, b| a.name.cmp(&b.name));
        let common = &self.inner.common;
        SchedulerStatus {
            store: self.inner.store.clone(),
            holder: common.holder.clone(),
            leader: common.leader.as_ref().map(|l| l.is_leader()),
            members: common.placement.as_ref().and_then(|p| p.members()),
            store_reachable: common.store_reachable(),
            failure: self.failure(),
            tasks,
        }
    }

    /// The leader election, with a leader gate.
    pub fn leader(&self) -> Option<&crate::lease::leader::LeaderHandle> {
        self.inner.common.leader.as_ref()
    }

    /// Why the scheduler stopped itself, if it did: the store refused the leader lease, or a
    /// task's lease or slot claim, [`MAX_REFUSALS`](crate::MAX_REFUSALS) times in a row (a key
    /// of the wrong type, no permission, scripts disabled), which retrying cannot fix. Check it
    /// after [`wait`](Self::wait) returns.
    pub fn failure(&self) -> Option<String> {
        self.inner.common.failure.get().cloned()
    }

    /// Stops arming timers, lets running jobs (timer and manual) finish, cancelling them after
    /// the grace period, releases every lease so another instance takes over at once, and waits
    /// for all of it.
    pub async fn shutdown(&self) {
        self.inner.common.stop.cancel();
        self.wait().await;
    }

    /// Ends shutdown's grace period now: running jobs are cancelled at once (they have a stop
    /// margin to return). Begins shutdown if it has not begun. Returns without waiting; see
    /// [`wait`](Self::wait).
    pub fn end_drain(&self) {
        self.inner.common.drain_over.cancel();
        self.inner.common.stop.cancel();
    }

    /// Waits until the scheduler has stopped (shutdown, or a [`failure`](Self::failure)):
    /// timers disarmed, running jobs drained, leases released.
    pub async fn wait(&self) {
        self.inner.done.cancelled().await;
    }
}

impl fmt::Debug for SchedulerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchedulerHandle")
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}
