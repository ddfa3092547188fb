//! The single-active scheduler: periodic tasks whose timer ticks run on exactly one instance.
//!
//! # How a timer tick is won
//! Every instance arms every task's timer. When it fires for slot `n` (see [`Schedule`]):
//! 1. with a leader gate, a non-leader skips (`skipped-not-leader`);
//! 2. the instance tries to take the task's lease (named like the task). `Busy` means another
//!    instance is running the task right now: skip (`skipped-claimed`). Holding the lease for the
//!    whole run is what keeps a run that outlives its interval from overlapping the next run
//!    anywhere;
//! 3. it claims slot `n` in the store, a compare-and-set that only moves forward. `AlreadyRun`
//!    means another instance ran this slot (or a later one): skip (`skipped-claimed`). This is what
//!    keeps a tick from running twice across a failover;
//! 4. it runs the job with a [`TaskContext`] whose cancellation token fires if the task lease, or
//!    leadership, is lost, then releases the lease.
//!
//! # Missed ticks
//! Ticks are never queued or replayed. A firing that falls while the task runs (here or on
//! another instance) is skipped, and after a run the timer is armed for the next firing after
//! *now*: like tokio's `MissedTickBehavior::Skip`. A process that was paused wakes, finds its slot
//! already claimed by a later one, and skips.
//!
//! # When the store is down
//! Each task follows its [`StoreDownPolicy`] whenever a store operation of the tick fails.
//!
//! # Manual runs
//! [`SchedulerHandle::run_now`] runs a task here and now, bypassing the gate, the lease and the
//! slot claim.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::leader::{Leader, LeaderHandle};
use crate::lease::{Lease, TryAcquire};
use crate::schedule::Schedule;
use crate::store::{BoxError, SlotClaim, Store};
use crate::{ConfigError, FencingToken, HolderId, LeaseConfig, LeaseName, MemoryStore};

/// What a task does when the store cannot answer during a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StoreDownPolicy {
    /// Skip the tick (`skipped-store-down`). The default: right for work with side effects, such
    /// as sending webhooks, where a duplicate is worse than a delay.
    #[default]
    FailClosed,
    /// Run the tick anyway, without lease or slot claim, and warn on every such run: for work
    /// that must never stall and tolerates duplicates ("scans never stall"). While the store is
    /// down every instance runs every tick.
    FailOpen,
    /// Single-instance mode: every tick runs here without coordination. A scheduler built with
    /// [`Scheduler::local`] has no store at all; on a scheduler with a store, ticks during an
    /// outage run as with `FailOpen` but the warning is logged once per outage.
    Local,
}

impl StoreDownPolicy {
    /// The name used by the CLI and in status: `fail-closed`, `fail-open`, `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailClosed => "fail-closed",
            Self::FailOpen => "fail-open",
            Self::Local => "local",
        }
    }
}

impl fmt::Display for StoreDownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for StoreDownPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fail-closed" => Ok(Self::FailClosed),
            "fail-open" => Ok(Self::FailOpen),
            "local" => Ok(Self::Local),
            other => Err(format!(
                "unknown store-down policy {other:?}; use fail-closed, fail-open or local"
            )),
        }
    }
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The task's timer, gated so only one instance runs each slot.
    Timer,
    /// [`SchedulerHandle::run_now`]: not gated.
    Manual,
}

/// What a job is told about its run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskContext {
    /// The task's name.
    pub task: LeaseName,
    /// Timer or manual.
    pub trigger: Trigger,
    /// The slot this run is for (timer runs that claimed one).
    pub slot: Option<u64>,
    /// The fencing token of the task lease held for this run; send it with protected writes.
    /// `None` for manual runs and runs without the store (fail-open, local).
    pub token: Option<FencingToken>,
    /// This instance's holder id.
    pub holder: HolderId,
    /// Fires when the run must stop: the task lease or leadership was lost, or shutdown's grace
    /// period ran out.
    pub cancel: CancellationToken,
}

/// The outcome of one timer firing on this instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickOutcome {
    /// The job ran here, gated.
    Ran,
    /// The store was down and the policy let the job run here ungated.
    RanStoreDown,
    /// A leader gate is in use and this instance is not the leader.
    SkippedNotLeader,
    /// Another instance runs the task now or already ran this slot.
    SkippedClaimed,
    /// The store was down and the policy is fail-closed.
    SkippedStoreDown,
}

impl TickOutcome {
    /// The metrics label: `ran`, `ran-store-down`, `skipped-not-leader`, `skipped-claimed`,
    /// `skipped-store-down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ran => "ran",
            Self::RanStoreDown => "ran-store-down",
            Self::SkippedNotLeader => "skipped-not-leader",
            Self::SkippedClaimed => "skipped-claimed",
            Self::SkippedStoreDown => "skipped-store-down",
        }
    }
}

type JobFuture = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;
type Job = Arc<dyn Fn(TaskContext) -> JobFuture + Send + Sync>;

/// A periodic task: a name, a schedule, a job, and optionally its own store-down policy.
#[derive(Clone)]
pub struct Task {
    name: LeaseName,
    schedule: Schedule,
    policy: Option<StoreDownPolicy>,
    job: Job,
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Task {
    /// A task running `job` on `schedule`. The job gets a [`TaskContext`]; an `Err` is logged and
    /// counted, and does not stop the schedule.
    pub fn new<F, Fut, E>(name: LeaseName, schedule: Schedule, job: F) -> Self
    where
        F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let job: Job = Arc::new(move |ctx| {
            let fut = job(ctx);
            Box::pin(async move { fut.await.map_err(Into::into) })
        });
        Self {
            name,
            schedule,
            policy: None,
            job,
        }
    }

    /// This task's own store-down policy, overriding the scheduler's.
    pub fn on_store_down(mut self, policy: StoreDownPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The task's name.
    pub fn name(&self) -> &LeaseName {
        &self.name
    }
}

/// Why a scheduler could not start or a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulerError {
    /// Two tasks share a name.
    #[error("task {0} is registered twice")]
    DuplicateTask(LeaseName),
    /// The leader group has the name of a task; leases would collide.
    #[error("leader group {0} has the same name as a task")]
    GroupNamedLikeTask(LeaseName),
    /// No task has that name.
    #[error("no task named {0:?}")]
    UnknownTask(String),
    /// The lease timing is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The scheduler has shut down.
    #[error("the scheduler has shut down")]
    ShutDown,
}

/// How a manual or timer run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunResult {
    /// The job returned `Ok`.
    Succeeded,
    /// The job returned `Err` (its message).
    Failed(String),
    /// The job panicked.
    Panicked,
    /// The job ignored cancellation past the grace period and was aborted.
    Aborted,
}

/// Builds a [`Scheduler`].
pub struct Scheduler<S> {
    store: S,
    holder: HolderId,
    lease_config: LeaseConfig,
    policy: StoreDownPolicy,
    leader_group: Option<LeaseName>,
    grace: Duration,
    tasks: Vec<Task>,
    local: bool,
}

impl Scheduler<MemoryStore> {
    /// Single-instance mode: no store, every tick runs here. Logs one warning at start.
    pub fn local() -> Self {
        let mut s = Scheduler::new(MemoryStore::new());
        s.policy = StoreDownPolicy::Local;
        s.local = true;
        s
    }
}

impl<S: Store> Scheduler<S> {
    /// A scheduler coordinating through `store`, with default lease timing (ttl 15 s), policy
    /// fail-closed, no leader gate and a 30 s shutdown grace period.
    pub fn new(store: S) -> Self {
        Self {
            store,
            holder: HolderId::generate(),
            lease_config: LeaseConfig::default(),
            policy: StoreDownPolicy::default(),
            leader_group: None,
            grace: Duration::from_secs(30),
            tasks: Vec::new(),
            local: false,
        }
    }

    /// Lease timing for task leases and the leader lease. Default: `LeaseConfig::default()`.
    pub fn lease_config(mut self, config: LeaseConfig) -> Self {
        self.lease_config = config;
        self
    }

    /// The default store-down policy for tasks without their own. Default: fail-closed.
    pub fn on_store_down(mut self, policy: StoreDownPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Gates every timer tick on leadership of `group`: only its leader runs ticks. Default:
    /// none (every instance competes for each tick through the task lease and slot claim).
    pub fn leader_group(mut self, group: LeaseName) -> Self {
        self.leader_group = Some(group);
        self
    }

    /// How long shutdown waits for running jobs before cancelling them; they then get as long
    /// again to stop before they are aborted. Default: 30 s.
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace = grace;
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
    /// `shutdown` completes or [`SchedulerHandle::shutdown`] is called.
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
        // `stop` ends the timers; leadership is given up only once running jobs have drained,
        // so the next leader's first tick does not find the task lease still held.
        let stop = CancellationToken::new();
        let step_down = CancellationToken::new();
        let done = CancellationToken::new();
        if self.local {
            tracing::warn!(
                "leasehold scheduler in single-instance mode (no store): every tick runs here"
            );
        }
        let leader = match (&self.leader_group, self.local) {
            (Some(group), false) => {
                let lease = Lease::new(self.store.clone(), group.clone(), self.lease_config)?
                    .with_holder(self.holder.clone());
                let step_down = step_down.clone();
                Some(Leader::new(lease).start(async move { step_down.cancelled().await }))
            }
            _ => None,
        };
        let leader = Arc::new(leader);
        let mut tasks: HashMap<LeaseName, Arc<dyn RunNow>> = HashMap::new();
        let mut loops = Vec::new();
        for task in self.tasks {
            let policy = task.policy.unwrap_or(self.policy);
            let policy = if self.local {
                StoreDownPolicy::Local
            } else {
                policy
            };
            tracing::info!(task = %task.name, schedule = %task.schedule, %policy, "task scheduled");
            let runner = Arc::new(TaskRunner {
                lease: Lease::new(self.store.clone(), task.name.clone(), self.lease_config)?
                    .with_holder(self.holder.clone()),
                task,
                policy,
                local: self.local,
                grace: self.grace,
                stop: stop.clone(),
                leader: leader.clone(),
                stats: TaskStats::default(),
            });
            tasks.insert(runner.task.name.clone(), runner.clone());
            loops.push(tokio::spawn(runner.timer_loop()));
        }
        tokio::spawn(supervise(
            shutdown,
            stop.clone(),
            loops,
            step_down,
            leader.clone(),
            done.clone(),
        ));
        Ok(SchedulerHandle {
            inner: Arc::new(HandleInner {
                tasks,
                stop,
                done,
                leader,
                holder: self.holder,
                store: if self.local {
                    "none (single-instance mode)".to_owned()
                } else {
                    self.store.describe()
                },
            }),
        })
    }
}

/// Waits for shutdown, then drains the timer loops, steps down, and marks the scheduler done.
async fn supervise(
    shutdown: impl Future<Output = ()> + Send,
    stop: CancellationToken,
    loops: Vec<JoinHandle<()>>,
    step_down: CancellationToken,
    leader: Arc<Option<LeaderHandle>>,
    done: CancellationToken,
) {
    tokio::select! {
        () = shutdown => stop.cancel(),
        () = stop.cancelled() => {}
    }
    for l in loops {
        let _ = l.await;
    }
    step_down.cancel();
    if let Some(leader) = leader.as_ref() {
        let mut rx = leader.watch();
        while !matches!(*rx.borrow_and_update(), crate::LeaderState::Stopped) {
            if rx.changed().await.is_err() {
                break;
            }
        }
    }
    done.cancel();
}

/// Counters per task, for status.
#[derive(Default)]
struct TaskStats {
    ticks: AtomicU64,
    runs: AtomicU64,
    failures: AtomicU64,
    running: AtomicBool,
    last: Mutex<Option<(TickOutcome, Option<u64>)>>,
    store_down_warned: AtomicBool,
}

struct TaskRunner<S> {
    task: Task,
    lease: Lease<S>,
    policy: StoreDownPolicy,
    local: bool,
    grace: Duration,
    stop: CancellationToken,
    leader: Arc<Option<LeaderHandle>>,
    stats: TaskStats,
}

fn wall_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl<S: Store> TaskRunner<S> {
    /// Arms the timer for the next slot, fires it, repeats until shutdown.
    async fn timer_loop(self: Arc<Self>) {
        let name = self.task.name.clone();
        // The last (store ms, local instant) pair; starts from the wall clock.
        let mut reference = (wall_millis(), Instant::now());
        let mut last_slot: Option<u64> = None;
        while !self.stop.is_cancelled() {
            let (store_now, local_now) = self.store_clock(&mut reference).await;
            let mut next = self.task.schedule.next_after(store_now);
            // A timer that fired a hair early must not pick the slot it just ran again.
            while let (Some((slot, at)), Some(last)) = (next, last_slot) {
                if slot > last {
                    break;
                }
                next = self.task.schedule.next_after(at);
            }
            let Some((slot, at_ms)) = next else {
                tracing::warn!(task = %name, "schedule has no further firing; timer stopped");
                return;
            };
            let fire_at = local_now + Duration::from_millis(at_ms.saturating_sub(store_now));
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep_until(fire_at) => {}
            }
            last_slot = Some(slot);
            let outcome = self.tick(slot).await;
            self.stats.ticks.fetch_add(1, Ordering::Relaxed);
            *lock(&self.stats.last) = Some((outcome, Some(slot)));
            metrics::counter!("leasehold_ticks_total", "task" => name.as_str().to_owned(), "outcome" => outcome.as_str())
                .increment(1);
            tracing::debug!(task = %name, slot, outcome = outcome.as_str(), "tick");
        }
    }

    /// The store's time in ms and the local instant it corresponds to. When the store cannot
    /// answer, extrapolates from the last answer on the monotonic clock (timing only: the slot
    /// claim, not this estimate, decides whether a tick runs).
    async fn store_clock(&self, reference: &mut (u64, Instant)) -> (u64, Instant) {
        if !self.local {
            let sent = Instant::now();
            let answer = tokio::time::timeout(
                self.lease.config().renew_interval,
                self.lease.store().now_millis(),
            )
            .await;
            if let Ok(Ok(store_ms)) = answer {
                // The store read its clock somewhere in the round trip; assume the middle.
                *reference = (store_ms, sent + sent.elapsed() / 2);
                return *reference;
            }
        }
        let now = Instant::now();
        let (ms, at) = *reference;
        (ms + now.duration_since(at).as_millis() as u64, now)
    }

    fn leader_gate(&self) -> Result<Option<CancellationToken>, TickOutcome> {
        match &*self.leader {
            None => Ok(None),
            Some(leader) => match leader.state() {
                crate::LeaderState::Leading { cancel, .. } if !cancel.is_cancelled() => {
                    Ok(Some(cancel))
                }
                _ => Err(TickOutcome::SkippedNotLeader),
            },
        }
    }

    async fn tick(&self, slot: u64) -> TickOutcome {
        if self.local {
            self.run(Trigger::Timer, Some(slot), None, None, None).await;
            return TickOutcome::Ran;
        }
        let leader_cancel = match self.leader_gate() {
            Ok(c) => c,
            Err(outcome) => return outcome,
        };
        let guard = match self.lease.try_acquire().await {
            Ok(TryAcquire::Acquired(guard)) => guard,
            Ok(TryAcquire::Busy { .. }) => return TickOutcome::SkippedClaimed,
            Err(e) => return self.store_down(slot, &e.to_string()).await,
        };
        let claim = self.lease.store().claim_slot(&self.task.name, slot).await;
        let outcome = match claim {
            Ok(SlotClaim::Claimed) => {
                self.recovered();
                self.run(
                    Trigger::Timer,
                    Some(slot),
                    Some(guard.token()),
                    Some(guard.cancellation_token()),
                    leader_cancel,
                )
                .await;
                TickOutcome::Ran
            }
            Ok(SlotClaim::AlreadyRun { .. }) => TickOutcome::SkippedClaimed,
            Err(e) => {
                let _ = guard.release().await;
                return self.store_down(slot, &e.to_string()).await;
            }
        };
        if let Err(e) = guard.release().await {
            tracing::warn!(task = %self.task.name, error = %e, "task lease release failed");
        }
        outcome
    }

    fn recovered(&self) {
        if self.stats.store_down_warned.swap(false, Ordering::Relaxed) {
            tracing::info!(task = %self.task.name, "store reachable again");
        }
    }

    async fn store_down(&self, slot: u64, error: &str) -> TickOutcome {
        let first = !self.stats.store_down_warned.swap(true, Ordering::Relaxed);
        match self.policy {
            StoreDownPolicy::FailClosed => {
                if first {
                    tracing::warn!(task = %self.task.name, slot, error, policy = "fail-closed", "store unavailable; skipping ticks until it answers");
                }
                TickOutcome::SkippedStoreDown
            }
            StoreDownPolicy::FailOpen | StoreDownPolicy::Local => {
                if first || self.policy == StoreDownPolicy::FailOpen {
                    tracing::warn!(task = %self.task.name, slot, error, policy = %self.policy, "store unavailable; running the tick without coordination");
                }
                self.run(Trigger::Timer, Some(slot), None, None, None).await;
                TickOutcome::RanStoreDown
            }
        }
    }

    /// Runs the job in its own task (so a panic is contained), cancelling it when the lease or
    /// leadership is lost or shutdown's grace period ends, and aborting it a grace period later.
    async fn run(
        &self,
        trigger: Trigger,
        slot: Option<u64>,
        token: Option<FencingToken>,
        lease_cancel: Option<CancellationToken>,
        leader_cancel: Option<CancellationToken>,
    ) -> RunResult {
        let cancel = CancellationToken::new();
        let ctx = TaskContext {
            task: self.task.name.clone(),
            trigger,
            slot,
            token,
            holder: self.lease.holder().clone(),
            cancel: cancel.clone(),
        };
        self.stats.running.store(true, Ordering::Relaxed);
        let mut job: JoinHandle<Result<(), BoxError>> = tokio::spawn((self.task.job)(ctx));
        let lost = async {
            let lease = async {
                match &lease_cancel {
                    Some(c) => c.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            let leader = async {
                match &leader_cancel {
                    Some(c) => c.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = lease => "task lease lost",
                () = leader => "leadership lost",
                () = async { self.stop.cancelled().await; tokio::time::sleep(self.grace).await } => "shutdown grace period over",
            }
        };
        let joined = tokio::select! {
            joined = &mut job => Some(joined),
            why = lost => {
                tracing::warn!(task = %self.task.name, why, "cancelling run");
                cancel.cancel();
                match tokio::time::timeout(self.grace, &mut job).await {
                    Ok(joined) => Some(joined),
                    Err(_) => {
                        job.abort();
                        None
                    }
                }
            }
        };
        self.stats.running.store(false, Ordering::Relaxed);
        let result = match joined {
            Some(Ok(Ok(()))) => RunResult::Succeeded,
            Some(Ok(Err(e))) => RunResult::Failed(e.to_string()),
            Some(Err(e)) if e.is_panic() => RunResult::Panicked,
            _ => RunResult::Aborted,
        };
        self.stats.runs.fetch_add(1, Ordering::Relaxed);
        if result != RunResult::Succeeded {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(task = %self.task.name, ?slot, ?result, "run did not succeed");
        }
        result
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A task's state, from [`SchedulerHandle::status`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskStatus {
    /// The task's name.
    pub name: LeaseName,
    /// Its schedule, as text.
    pub schedule: String,
    /// The store-down policy in force.
    pub policy: StoreDownPolicy,
    /// Timer firings seen here.
    pub ticks: u64,
    /// Runs here (timer and manual).
    pub runs: u64,
    /// Runs here that failed, panicked or were aborted.
    pub failures: u64,
    /// Whether a run is in progress here.
    pub running: bool,
    /// The last firing's outcome and slot.
    pub last: Option<(TickOutcome, Option<u64>)>,
}

/// The scheduler's state, from [`SchedulerHandle::status`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SchedulerStatus {
    /// The store, with any password removed.
    pub store: String,
    /// This instance's holder id.
    pub holder: HolderId,
    /// With a leader gate: whether this instance leads.
    pub leader: Option<bool>,
    /// Every task.
    pub tasks: Vec<TaskStatus>,
}

struct HandleInner {
    tasks: HashMap<LeaseName, Arc<dyn RunNow>>,
    stop: CancellationToken,
    done: CancellationToken,
    leader: Arc<Option<LeaderHandle>>,
    holder: HolderId,
    store: String,
}

/// The object-safe part of a task runner the handle needs.
trait RunNow: Send + Sync {
    fn run_now(self: Arc<Self>) -> Pin<Box<dyn Future<Output = RunResult> + Send>>;
    fn status(&self) -> TaskStatus;
}

impl<S: Store> RunNow for TaskRunner<S> {
    fn run_now(self: Arc<Self>) -> Pin<Box<dyn Future<Output = RunResult> + Send>> {
        Box::pin(async move { self.run(Trigger::Manual, None, None, None, None).await })
    }
    fn status(&self) -> TaskStatus {
        TaskStatus {
            name: self.task.name.clone(),
            schedule: self.task.schedule.to_string(),
            policy: self.policy,
            ticks: self.stats.ticks.load(Ordering::Relaxed),
            runs: self.stats.runs.load(Ordering::Relaxed),
            failures: self.stats.failures.load(Ordering::Relaxed),
            running: self.stats.running.load(Ordering::Relaxed),
            last: *lock(&self.stats.last),
        }
    }
}

/// A running scheduler. Cheap to clone.
#[derive(Clone)]
pub struct SchedulerHandle {
    inner: Arc<HandleInner>,
}

impl SchedulerHandle {
    /// Runs `task` here now, bypassing the leader gate, the task lease and the slot claim, and
    /// waits for it to finish.
    pub async fn run_now(&self, task: &str) -> Result<RunResult, SchedulerError> {
        if self.inner.stop.is_cancelled() {
            return Err(SchedulerError::ShutDown);
        }
        let runner = LeaseName::new(task)
            .ok()
            .and_then(|n| self.inner.tasks.get(&n).cloned())
            .ok_or_else(|| SchedulerError::UnknownTask(task.to_owned()))?;
        Ok(runner.run_now().await)
    }

    /// A snapshot of every task.
    pub fn status(&self) -> SchedulerStatus {
        let mut tasks: Vec<TaskStatus> = self.inner.tasks.values().map(|t| t.status()).collect();
        tasks.sort_by(|a, b| a.name.cmp(&b.name));
        SchedulerStatus {
            store: self.inner.store.clone(),
            holder: self.inner.holder.clone(),
            leader: self.inner.leader.as_ref().as_ref().map(|l| l.is_leader()),
            tasks,
        }
    }

    /// The leader election, with a leader gate.
    pub fn leader(&self) -> Option<&LeaderHandle> {
        self.inner.leader.as_ref().as_ref()
    }

    /// Stops arming timers, lets running jobs finish (cancelling them after the grace period),
    /// releases every lease so another instance takes over at once, and waits for all of it.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        self.wait().await;
    }

    /// Waits until the scheduler has stopped: timers disarmed, running jobs drained, leases
    /// released.
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
