//! What a scheduler runs: [`Task`], what a run is told ([`TaskContext`]) and how ticks and runs
//! end ([`TickOutcome`], [`RunResult`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::guard::HeldProbe;
use crate::scheduling::policy::{Backoff, CatchUp, OnInterrupt, Overlap, RunPolicy};
use crate::scheduling::schedule::Schedule;
use crate::store::error::BoxError;
use crate::store::name::{HolderId, LeaseName};
use crate::store::token::FencingToken;

/// What a gated task does with a timer tick while the store cannot answer.
///
/// Each policy holds in every state of the instance: leader, follower, campaigning, and before
/// the store has answered for the first time (a store connects in the background, so a service
/// starts while its store is down). The policy applies to a tick exactly when the store cannot
/// answer that tick's first request (its clock read) or a later step of it; as soon as the store
/// answers again, ticks are gated as usual.
///
/// | policy | tick while the store cannot answer | after the store answers again |
/// |---|---|---|
/// | `FailClosed` | skipped (`skipped-store-down`) | gated again |
/// | `FailOpen` | runs here without lease or slot claim (`ran-store-down`): every instance that cannot reach the store runs it | gated again |
/// | `Local` | as `FailOpen`; with [`Scheduler::local`](crate::Scheduler::local) there is no store and every tick runs here | gated again |
///
/// One warning is logged when the store stops answering and one when it answers again, not one
/// per tick; `leasehold_store_down_ticks_total{task, policy}` counts the ticks it affected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StoreDownPolicy {
    /// Skip the tick. The default: right for work with side effects, such as sending webhooks,
    /// where a duplicate is worse than a delay.
    #[default]
    FailClosed,
    /// Run the tick anyway, without lease or slot claim: for work that must never stall and
    /// tolerates duplicates ("scans never stall"). While the store is down every instance that
    /// cannot reach it runs every tick; the instance treats itself as the leader.
    FailOpen,
    /// Single-instance mode: no coordination while the store cannot answer (as `FailOpen`),
    /// re-attached as soon as it answers. A scheduler built with
    /// [`Scheduler::local`](crate::Scheduler::local) has no store at all.
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

    /// Whether a tick runs here, ungated, while the store cannot answer.
    pub fn runs_when_down(self) -> bool {
        !matches!(self, Self::FailClosed)
    }
}

impl fmt::Display for StoreDownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A store-down policy name that is not one of `fail-closed`, `fail-open`, `local`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown store-down policy {0:?}; use fail-closed, fail-open or local")]
pub struct UnknownPolicy(pub String);

impl std::str::FromStr for StoreDownPolicy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fail-closed" => Ok(Self::FailClosed),
            "fail-open" => Ok(Self::FailOpen),
            "local" => Ok(Self::Local),
            other => Err(UnknownPolicy(other.to_owned())),
        }
    }
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Trigger {
    /// The task's timer, gated so only one instance runs each slot (unless the task is ungated
    /// or the store is down under a fail-open policy).
    Timer,
    /// A slot that no instance ran when it was due, run later under the task's [`CatchUp`]
    /// policy (gated and claimed like a timer run).
    CatchUp,
    /// [`SchedulerHandle::run_now`](crate::SchedulerHandle::run_now) or
    /// [`run_now_exclusive`](crate::SchedulerHandle::run_now_exclusive).
    Manual,
    /// A slot run again because its run was cut off (its instance went away, its lease or
    /// leadership ended, a drain ran out): see [`OnInterrupt`](crate::OnInterrupt). The
    /// context's attempt number says which attempt of the slot this is.
    Retry,
    /// A past slot run on purpose ([`Fleet::backfill`](crate::fleet::Fleet::backfill),
    /// `leasehold trigger --slots`), under the task lease, without moving the slot claim.
    Backfill,
}

impl Trigger {
    /// `timer`, `catch-up`, `manual`, `retry` or `backfill`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timer => "timer",
            Self::CatchUp => "catch-up",
            Self::Manual => "manual",
            Self::Retry => "retry",
            Self::Backfill => "backfill",
        }
    }
}

/// What a job is told about its run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskContext {
    /// The task's name.
    pub task: LeaseName,
    /// Timer or manual.
    pub trigger: Trigger,
    /// The slot this run is for: the firing's scheduled time in ms since the Unix epoch (store
    /// clock). `None` for manual runs.
    pub slot: Option<u64>,
    /// The fencing token of the task lease held for this run; send it with protected writes.
    /// `None` when no lease is held: bypassing manual runs, ungated tasks, store-down runs.
    pub token: Option<FencingToken>,
    /// This instance's holder id.
    pub holder: HolderId,
    /// Fires when the run must stop: the task lease or leadership is about to expire (its
    /// renewal is overdue by the lease's stop margin) or was lost, shutdown's grace period
    /// ran out, or the attempt reached the task's [`timeout`](Task::timeout). A job still
    /// running a stop margin later is aborted.
    pub cancel: CancellationToken,
    /// The leases the run holds (task lease, leadership), for [`is_held`](Self::is_held).
    pub(crate) held: Vec<HeldProbe>,
    /// Which attempt of the slot this is: 1, then 2 for the first retry
    /// ([`Task::retries`]).
    pub attempt: u32,
    /// What [`keep_output`](Self::keep_output) was given last, shared with the runner (the job
    /// owns its context, and a clone of it, by value).
    pub(crate) output: Arc<std::sync::Mutex<Option<String>>>,
}

impl TaskContext {
    /// The task lease's local deadline, updated with every confirmed renewal (see
    /// [`LeaseGuard::deadline_updates`](crate::LeaseGuard::deadline_updates)); `None` when the run holds no task lease.
    pub fn lease_deadline(&self) -> Option<watch::Receiver<Instant>> {
        self.held.iter().find_map(|probe| match probe {
            HeldProbe::Guard(shared) => Some(shared.deadline_updates()),
            HeldProbe::Token(_) => None,
        })
    }
}

impl TaskContext {
    /// Keeps `output` (what the run printed, a log's end) in the run's history record, written
    /// when the run ends however it ends; a later call replaces an earlier one. Cut to its last
    /// [`text::OUTPUT`](crate::text::OUTPUT) bytes when recorded, and shown escaped: it is
    /// untrusted text. Runs the history does not keep (ungated and store-down runs) drop it.
    pub fn keep_output(&self, output: impl Into<String>) {
        let mut kept = self
            .output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *kept = Some(output.into());
    }

    /// Whether the run may still act: not cancelled, and every lease it runs under (task lease,
    /// leadership) still held on the local clock and not expiring. Check it right before
    /// committing work the lease protects (and send [`token`](Self::token) with the write).
    /// Always true for a run that holds no lease (a bypassing manual run, an ungated task, a
    /// store-down run): it has nothing to lose.
    pub fn is_held(&self) -> bool {
        !self.cancel.is_cancelled() && self.held.iter().all(HeldProbe::is_held)
    }
}

/// The outcome of one timer firing on this instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickOutcome {
    /// The job ran here, gated: this instance claimed the slot.
    Ran,
    /// The job ran here without coordination because the task is ungated (or the scheduler has
    /// no store).
    RanUngated,
    /// The store was down and the policy let the job run here ungated.
    RanStoreDown,
    /// A leader gate is in use and this instance is not the leader.
    SkippedNotLeader,
    /// Another instance runs the task now or already ran this slot (or a later one).
    SkippedClaimed,
    /// The scheduler spreads its tasks and another instance owns this one.
    SkippedNotOwner,
    /// The store was down and the policy is fail-closed.
    SkippedStoreDown,
    /// The store refused an operation (wrong key type, no permission): retrying cannot help.
    SkippedRefused,
    /// The slot was claimed, but the task lease started expiring before the job could start.
    SkippedLeaseLost,
    /// The task is paused fleet-wide (`leasehold pause`); the slot is recorded as paused.
    SkippedPaused,
}

impl TickOutcome {
    /// The metrics label: `ran`, `ran-ungated`, `ran-store-down`, `skipped-not-leader`,
    /// `skipped-claimed`, `skipped-not-owner`, `skipped-store-down`, `skipped-refused`,
    /// `skipped-lease-lost`, `skipped-paused`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ran => "ran",
            Self::RanUngated => "ran-ungated",
            Self::RanStoreDown => "ran-store-down",
            Self::SkippedNotLeader => "skipped-not-leader",
            Self::SkippedClaimed => "skipped-claimed",
            Self::SkippedNotOwner => "skipped-not-owner",
            Self::SkippedStoreDown => "skipped-store-down",
            Self::SkippedRefused => "skipped-refused",
            Self::SkippedLeaseLost => "skipped-lease-lost",
            Self::SkippedPaused => "skipped-paused",
        }
    }
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
    /// The job ignored cancellation past the stop margin and was aborted.
    Aborted,
    /// The job reached the task's [`timeout`](Task::timeout) and was cancelled (or aborted, if
    /// it ignored that).
    TimedOut,
}

/// The words logs and messages use: `succeeded`, `failed: …`, `panicked`, `aborted`,
/// `timed-out`.
impl std::fmt::Display for RunResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Succeeded => f.write_str("succeeded"),
            Self::Failed(error) => write!(f, "failed: {error}"),
            Self::Panicked => f.write_str("panicked"),
            Self::Aborted => f.write_str("aborted"),
            Self::TimedOut => f.write_str("timed-out"),
        }
    }
}

pub(crate) type JobFuture = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;
pub(crate) type Job = Arc<dyn Fn(TaskContext) -> JobFuture + Send + Sync>;

/// A periodic task: a name, a schedule, a job, and optionally its own store-down policy.
#[derive(Clone)]
pub struct Task {
    pub(crate) name: LeaseName,
    pub(crate) schedule: Schedule,
    pub(crate) policy: Option<StoreDownPolicy>,
    pub(crate) gated: bool,
    pub(crate) catch_up: Option<CatchUp>,
    pub(crate) run_policy: RunPolicy,
    pub(crate) job: Job,
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("policy", &self.policy)
            .field("gated", &self.gated)
            .field("catch_up", &self.catch_up)
            .field("run_policy", &self.run_policy)
            .finish_non_exhaustive()
    }
}

impl Task {
    /// A gated task running `job` on `schedule`. The job gets a [`TaskContext`]; an `Err` is
    /// logged and counted, and does not stop the schedule.
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
            gated: true,
            catch_up: None,
            run_policy: RunPolicy::default(),
            job,
        }
    }

    /// This task's own store-down policy, overriding the scheduler's.
    pub fn on_store_down(mut self, policy: StoreDownPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Whether the task's timer ticks are gated (the default) so that each runs on exactly one
    /// instance: the leader gate (with a leader group), the task lease and the slot claim. An
    /// ungated task (`gated(false)`) runs every tick on every instance, on the local clock,
    /// without touching the store, beside gated tasks of the same scheduler.
    pub fn gated(mut self, gated: bool) -> Self {
        self.gated = gated;
        self
    }

    /// What to do with slots that did not run when they were due. Default:
    /// [`CatchUp::default_for`] the schedule.
    pub fn catch_up(mut self, policy: CatchUp) -> Self {
        self.catch_up = Some(policy);
        self
    }

    /// Each attempt's time limit: at `timeout` its [`TaskContext::cancel`] is cancelled, and an
    /// attempt that then ends is recorded `timed-out` (kept as `cancelled` in the store's
    /// `outcome`, which older releases read); one still running a stop margin later is
    /// aborted, `timed-out` too. Zero: no limit (the default).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.run_policy = self.run_policy.timeout(Some(timeout));
        self
    }

    /// Retries a slot's `failed` or `timed-out` run up to `retries` times (at most
    /// [`MAX_RETRIES`](crate::policy::MAX_RETRIES)), after the waits of
    /// [`retry_backoff`](Self::retry_backoff), on the instance that ran it and while it holds
    /// the task lease, so never beside another run of the task. A retry that would not start
    /// before the next slot is dropped and recorded so. Each attempt is in the history with its
    /// number ([`RunRecord::attempt`](crate::history::RunRecord::attempt)) and told it in
    /// [`TaskContext::attempt`]. Runs cancelled by the instance (a lease lost, shutdown) and
    /// manual runs are not retried. Default: none.
    pub fn retries(mut self, retries: u32) -> Self {
        self.run_policy = self.run_policy.retries(retries);
        self
    }

    /// The waits between attempts: `base` before the first retry, doubling up to `max`, with a
    /// deterministic jitter ([`Backoff`]). Default: 1 s up to 60 s.
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.run_policy = self.run_policy.backoff(Backoff::new(base, Some(max)));
        self
    }

    /// Puts each slot's start off by up to `jitter`: an amount derived from the task's name and
    /// the slot, the same on every instance, never as much as half the way to the next slot
    /// (nor [`MAX_JITTER`](crate::policy::MAX_JITTER)), so that a fleet's tasks on one
    /// schedule do not all start at the same instant. The slot is still the one due (the run's
    /// [`TaskContext::slot`] and history say it). Zero: none (the default).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use leasehold::{LeaseName, Schedule, Task, TaskContext};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let hourly = Task::new(
    ///     LeaseName::new("refresh-library")?,
    ///     Schedule::every(Duration::from_secs(3600))?,
    ///     |_ctx: TaskContext| async { Ok::<_, std::io::Error>(()) },
    /// )
    /// .jitter(Duration::from_secs(300)); // somewhere in the first five minutes of the hour
    /// # Ok(()) }
    /// ```
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.run_policy = self.run_policy.jitter(Some(jitter));
        self
    }

    /// What becomes of a run of this task that was cut off (its instance killed mid-run, its
    /// lease or leadership lost, shutdown's grace period run out): by default the next instance
    /// to hold the task runs its slot again, with [`Trigger::Retry`] and the next attempt
    /// number ([`OnInterrupt`](crate::OnInterrupt)).
    pub fn on_interrupt(mut self, on_interrupt: OnInterrupt) -> Self {
        self.run_policy = self.run_policy.on_interrupt(on_interrupt);
        self
    }

    /// What a slot that falls while a run of this task is going does ([`Overlap`](crate::Overlap)):
    /// skipped and recorded missed with reason `overlap` (the default), run once the run
    /// ends (`BufferOne`, `BufferAll`), run after cancelling it (`Replace`), or run beside it
    /// (`Allow`). Each slot still runs once, fleet-wide.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use leasehold::{LeaseName, Overlap, Schedule, Task, TaskContext};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let sync = Task::new(
    ///     LeaseName::new("sync-accounts")?,
    ///     Schedule::every(Duration::from_secs(60))?,
    ///     |_ctx: TaskContext| async { Ok::<_, std::io::Error>(()) },
    /// )
    /// .overlap(Overlap::BufferOne); // a slow sync is followed by one more, never two at once
    /// # Ok(()) }
    /// ```
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.run_policy = self.run_policy.overlap(overlap);
        self
    }

    /// With timeout and retries as `policy` says (what [`timeout`](Self::timeout),
    /// [`retries`](Self::retries) and [`retry_backoff`](Self::retry_backoff) set, at once).
    pub fn with_run_policy(mut self, policy: RunPolicy) -> Self {
        self.run_policy = policy;
        self
    }

    /// The task's timeout and retries.
    pub fn run_policy(&self) -> RunPolicy {
        self.run_policy
    }

    /// The task's name.
    pub fn name(&self) -> &LeaseName {
        &self.name
    }
}
