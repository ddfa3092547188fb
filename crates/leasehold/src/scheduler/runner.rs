//! One task's timer loop, its gated ticks, and the runs of its job (timer and manual).

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use super::task::{RunResult, StoreDownPolicy, Task, TaskContext, TickOutcome, Trigger};
use super::{SchedulerError, TaskStatus};
use crate::leader::{LeaderHandle, LeaderState, MAX_REFUSALS};
use crate::lease::{Lease, LeaseGuard, TryAcquire};
use crate::store::{SlotClaim, Store, StoreError};
use crate::{FencingToken, HolderId};

/// What every task of one scheduler shares.
pub(super) struct Common {
    pub(super) stop: CancellationToken,
    pub(super) leader: Option<LeaderHandle>,
    pub(super) holder: HolderId,
    /// How long shutdown lets running jobs finish before cancelling them.
    pub(super) grace: Duration,
    /// False for [`Scheduler::local`](crate::Scheduler::local): no store at all.
    pub(super) has_store: bool,
    /// Why the scheduler stopped itself, if it did.
    pub(super) failure: OnceLock<String>,
    /// `STORE_UNKNOWN`, `STORE_UP` or `STORE_DOWN`, as the last tick found it.
    store_state: AtomicU8,
}

const STORE_UNKNOWN: u8 = 0;
const STORE_UP: u8 = 1;
const STORE_DOWN: u8 = 2;

impl Common {
    pub(super) fn new(
        leader: Option<LeaderHandle>,
        holder: HolderId,
        grace: Duration,
        has_store: bool,
        stop: CancellationToken,
    ) -> Self {
        Self {
            stop,
            leader,
            holder,
            grace,
            has_store,
            failure: OnceLock::new(),
            store_state: AtomicU8::new(STORE_UNKNOWN),
        }
    }

    /// Stops the scheduler because retrying cannot help; `why` is kept for status.
    pub(super) fn fail(&self, why: String) {
        self.stop.cancel();
        if self.failure.set(why).is_ok() {
            let why = self.failure.get().map(String::as_str).unwrap_or_default();
            tracing::error!(error = why, "scheduler stopped: the store keeps refusing");
        }
    }

    /// Whether the store answered the last tick that asked it; `None` before any did.
    pub(super) fn store_reachable(&self) -> Option<bool> {
        match self.store_state.load(Ordering::Relaxed) {
            STORE_UP => Some(true),
            STORE_DOWN => Some(false),
            _ => None,
        }
    }

    fn store_answered(&self) {
        if self.store_state.swap(STORE_UP, Ordering::Relaxed) == STORE_DOWN {
            tracing::info!("store answers again; timer ticks are gated again");
        }
    }

    /// One warning per outage, not one per tick.
    fn store_unreachable(&self, error: &(dyn fmt::Display + Sync)) {
        if self.store_state.swap(STORE_DOWN, Ordering::Relaxed) != STORE_DOWN {
            tracing::warn!(%error, "store unreachable; timer ticks follow each task's store-down policy until it answers");
        }
    }
}

/// Counters per task, for status.
#[derive(Default)]
struct TaskStats {
    ticks: AtomicU64,
    runs: AtomicU64,
    failures: AtomicU64,
    store_down_ticks: AtomicU64,
    /// Runs in progress here (timer and manual).
    active: AtomicUsize,
    last: Mutex<Option<(TickOutcome, Option<u64>)>>,
}

/// Counts a run as active for as long as it lives, however it ends.
struct Active<'a>(&'a AtomicUsize);

impl<'a> Active<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(super) struct TaskRunner<S> {
    task: Task,
    /// The task lease: held for the whole of a gated run.
    lease: Lease<S>,
    policy: StoreDownPolicy,
    common: Arc<Common>,
    stats: TaskStats,
    /// Manual runs, owned here so a caller that stops waiting does not detach them.
    manual: TaskTracker,
    /// Held by a gated run (timer, or exclusive manual) of this task in this process, so two
    /// never use the task lease at once.
    exclusive: Arc<tokio::sync::Mutex<()>>,
    /// Refusals in a row, for giving up after [`MAX_REFUSALS`].
    refusals: AtomicU32,
}

fn wall_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Milliseconds of a clock that read `ms` at `at`, extrapolated to now on the monotonic clock.
fn extrapolate((ms, at): (u64, Instant)) -> u64 {
    let elapsed = Instant::now().saturating_duration_since(at).as_millis();
    ms.saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
}

async fn fired(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

impl<S: Store> TaskRunner<S> {
    pub(super) fn new(
        task: Task,
        lease: Lease<S>,
        policy: StoreDownPolicy,
        common: Arc<Common>,
    ) -> Self {
        Self {
            task,
            lease,
            policy,
            common,
            stats: TaskStats::default(),
            manual: TaskTracker::new(),
            exclusive: Arc::default(),
            refusals: AtomicU32::new(0),
        }
    }

    pub(super) fn manual_runs(&self) -> TaskTracker {
        self.manual.clone()
    }

    /// Whether this task's ticks go through the store.
    fn coordinated(&self) -> bool {
        self.common.has_store && self.task.gated
    }

    /// Arms the timer for the next slot, fires it, repeats until shutdown.
    ///
    /// Timers are armed on an estimate of the store's clock (its last reading, carried forward on
    /// the monotonic clock; the local wall clock before any reading). A gated tick reads the
    /// store's clock again when it fires and claims its slot only once the store's clock has
    /// reached it, so a host whose clock runs ahead never claims a future slot.
    pub(super) async fn timer_loop(self: Arc<Self>) {
        let name = self.task.name.clone();
        let mut reference = (wall_millis(), Instant::now());
        if self.coordinated() {
            match self.read_clock().await {
                Ok(reading) => {
                    self.common.store_answered();
                    reference = reading;
                }
                Err(e) => self.common.store_unreachable(&e),
            }
        }
        let mut last: Option<u64> = None;
        while !self.common.stop.is_cancelled() {
            let now = extrapolate(reference);
            let mut next = self.task.schedule.next_after(now);
            // A timer that fired a hair early must not pick the slot it just ran again.
            if let (Some(slot), Some(last)) = (next, last)
                && slot <= last
            {
                next = self.task.schedule.next_after(last);
            }
            let Some(slot) = next else {
                tracing::warn!(task = %name, "schedule has no further firing; timer stopped");
                return;
            };
            let fire_at = Instant::now() + Duration::from_millis(slot.saturating_sub(now));
            tokio::select! {
                () = self.common.stop.cancelled() => return,
                () = tokio::time::sleep_until(fire_at) => {}
            }
            let outcome = if !self.coordinated() {
                self.run(Trigger::Timer, Some(slot), None, None, None).await;
                TickOutcome::RanUngated
            } else {
                match self.read_clock().await {
                    Ok(reading) => {
                        self.common.store_answered();
                        reference = reading;
                        if reading.0 < slot {
                            // Our estimate ran ahead of the store: wait for the store's time.
                            // Slots fired on that estimate (while the store was down) are no
                            // guide to what comes next; the store's slot claim still is.
                            last = last.filter(|&l| l <= reading.0);
                            continue;
                        }
                        self.tick(slot).await
                    }
                    Err(e) if e.is_transient() => self.store_down(slot, &e).await,
                    Err(e) => self.refused(&e),
                }
            };
            last = Some(slot);
            self.stats.ticks.fetch_add(1, Ordering::Relaxed);
            *lock(&self.stats.last) = Some((outcome, Some(slot)));
            metrics::counter!("leasehold_ticks_total", "task" => name.as_str().to_owned(), "outcome" => outcome.as_str())
                .increment(1);
            tracing::debug!(task = %name, slot, outcome = outcome.as_str(), "tick");
        }
    }

    /// The store's time in ms and the local instant it corresponds to (the middle of the round
    /// trip), within the renew interval.
    async fn read_clock(&self) -> Result<(u64, Instant), StoreError> {
        let limit = self.lease.config().renew_interval;
        let sent = Instant::now();
        match tokio::time::timeout(limit, self.lease.store().now_millis()).await {
            Ok(Ok(ms)) => Ok((ms, sent + sent.elapsed() / 2)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Timeout(limit)),
        }
    }

    fn leader_gate(&self) -> Result<Option<CancellationToken>, TickOutcome> {
        match &self.common.leader {
            None => Ok(None),
            Some(leader) => match leader.state() {
                LeaderState::Leading { cancel, .. } if !cancel.is_cancelled() => Ok(Some(cancel)),
                _ => Err(TickOutcome::SkippedNotLeader),
            },
        }
    }

    /// A gated tick, once the store's clock has reached `slot`: leader gate, task lease, slot
    /// claim, run, release.
    async fn tick(&self, slot: u64) -> TickOutcome {
        let leader_cancel = match self.leader_gate() {
            Ok(c) => c,
            Err(outcome) => return outcome,
        };
        // An exclusive manual run of this task is in progress here.
        let Ok(_exclusive) = self.exclusive.try_lock() else {
            return TickOutcome::SkippedClaimed;
        };
        let guard = match self.lease.try_acquire().await {
            Ok(TryAcquire::Acquired(guard)) => guard,
            Ok(TryAcquire::Busy { .. }) => return self.answered(TickOutcome::SkippedClaimed),
            Err(e) if e.is_transient() => return self.store_down(slot, &e).await,
            Err(e) => return self.refused(&e),
        };
        let outcome = self.claim_and_run(&guard, slot, leader_cancel).await;
        if let Err(e) = guard.release().await {
            tracing::warn!(task = %self.task.name, error = %e, "task lease release failed");
        }
        outcome
    }

    async fn claim_and_run(
        &self,
        guard: &LeaseGuard,
        slot: u64,
        leader_cancel: Option<CancellationToken>,
    ) -> TickOutcome {
        let expiring = guard.expiring_token();
        let limit = self.lease.config().renew_interval;
        let claim = tokio::select! {
            biased;
            () = expiring.cancelled() => return TickOutcome::SkippedLeaseLost,
            claim = tokio::time::timeout(limit, self.lease.store().claim_slot(&self.task.name, slot)) => {
                claim.unwrap_or(Err(StoreError::Timeout(limit)))
            }
        };
        match claim {
            Ok(SlotClaim::Claimed) => {}
            Ok(SlotClaim::AlreadyRun { .. }) => return self.answered(TickOutcome::SkippedClaimed),
            Err(e) if e.is_transient() => return self.store_down(slot, &e).await,
            Err(e) => return self.refused(&e),
        }
        self.answered(TickOutcome::Ran);
        // The claim may have taken long enough for the lease to start expiring: then the slot
        // stays claimed but unrun rather than run by a holder that may be about to lose it.
        if expiring.is_cancelled() || !guard.is_held() {
            tracing::warn!(task = %self.task.name, slot, "task lease expiring before the run could start; slot not run");
            return TickOutcome::SkippedLeaseLost;
        }
        self.run(
            Trigger::Timer,
            Some(slot),
            Some(guard.token()),
            Some(expiring),
            leader_cancel,
        )
        .await;
        TickOutcome::Ran
    }

    /// The store answered (whatever it said): refusals in a row start again from zero.
    fn answered(&self, outcome: TickOutcome) -> TickOutcome {
        self.refusals.store(0, Ordering::Relaxed);
        outcome
    }

    fn refused(&self, error: &(dyn fmt::Display + Sync)) -> TickOutcome {
        let refusals = self.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(task = %self.task.name, %error, refusals, "the store refused the task lease or slot claim");
        if refusals >= MAX_REFUSALS {
            self.common.fail(format!(
                "task {}: the store refused {refusals} times in a row: {error}",
                self.task.name
            ));
        }
        TickOutcome::SkippedRefused
    }

    async fn store_down(&self, slot: u64, error: &(dyn fmt::Display + Sync)) -> TickOutcome {
        self.common.store_unreachable(error);
        self.stats.store_down_ticks.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("leasehold_store_down_ticks_total", "task" => self.task.name.as_str().to_owned(), "policy" => self.policy.as_str())
            .increment(1);
        if !self.policy.runs_when_down() {
            return TickOutcome::SkippedStoreDown;
        }
        self.run(Trigger::Timer, Some(slot), None, None, None).await;
        TickOutcome::RanStoreDown
    }

    /// Runs the job in its own task (so a panic is contained). Its token is cancelled when the
    /// task lease or leadership starts expiring, or when shutdown's grace period ends; a job
    /// still running a stop margin later is aborted.
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
            holder: self.common.holder.clone(),
            cancel: cancel.clone(),
        };
        let _active = Active::new(&self.stats.active);
        // Aborted if this future is dropped, so a job never outlives its run.
        let mut job = AbortOnDropHandle::new(tokio::spawn((self.task.job)(ctx)));
        let stop = async {
            tokio::select! {
                () = fired(lease_cancel.as_ref()) => "task lease expiring",
                () = fired(leader_cancel.as_ref()) => "leadership ending",
                () = async {
                    self.common.stop.cancelled().await;
                    tokio::time::sleep(self.common.grace).await;
                } => "shutdown grace period over",
            }
        };
        let joined = tokio::select! {
            joined = &mut job => Some(joined),
            why = stop => {
                // Cancel first: a log write that fails must never delay the stop.
                cancel.cancel();
                tracing::warn!(task = %self.task.name, why, "cancelling run");
                tokio::time::timeout(self.lease.config().stop_margin, &mut job).await.ok()
            }
        };
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

    /// A manual run in a task of the scheduler's own (so it is drained on shutdown even if the
    /// caller stops waiting). `exclusive`: hold the task lease for the run, so it never overlaps
    /// a run of this task anywhere.
    async fn manual_run(self: Arc<Self>, exclusive: bool) -> Result<RunResult, SchedulerError> {
        if !exclusive {
            return Ok(self.run(Trigger::Manual, None, None, None, None).await);
        }
        let Ok(_exclusive) = self.exclusive.clone().try_lock_owned() else {
            return Err(SchedulerError::Busy {
                holder: self.common.holder.clone(),
            });
        };
        let guard = match self.lease.try_acquire().await? {
            TryAcquire::Acquired(guard) => guard,
            TryAcquire::Busy { holder, .. } => return Err(SchedulerError::Busy { holder }),
        };
        let result = self
            .run(
                Trigger::Manual,
                None,
                Some(guard.token()),
                Some(guard.expiring_token()),
                None,
            )
            .await;
        if let Err(e) = guard.release().await {
            tracing::warn!(task = %self.task.name, error = %e, "task lease release failed");
        }
        Ok(result)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The object-safe part of a task runner the handle needs.
pub(super) trait RunNow: Send + Sync {
    fn start_manual(
        self: Arc<Self>,
        exclusive: bool,
    ) -> tokio::task::JoinHandle<Result<RunResult, SchedulerError>>;
    fn status(&self) -> TaskStatus;
}

impl<S: Store> RunNow for TaskRunner<S> {
    fn start_manual(
        self: Arc<Self>,
        exclusive: bool,
    ) -> tokio::task::JoinHandle<Result<RunResult, SchedulerError>> {
        let tracker = self.manual.clone();
        tracker.spawn(self.manual_run(exclusive))
    }

    fn status(&self) -> TaskStatus {
        TaskStatus {
            name: self.task.name.clone(),
            schedule: self.task.schedule.to_string(),
            policy: self.policy,
            gated: self.task.gated,
            ticks: self.stats.ticks.load(Ordering::Relaxed),
            runs: self.stats.runs.load(Ordering::Relaxed),
            failures: self.stats.failures.load(Ordering::Relaxed),
            store_down_ticks: self.stats.store_down_ticks.load(Ordering::Relaxed),
            running: self.stats.active.load(Ordering::Relaxed) > 0,
            last: *lock(&self.stats.last),
        }
    }
}
