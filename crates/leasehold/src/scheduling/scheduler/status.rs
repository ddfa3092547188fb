//! What the scheduler answers: its errors and its status. Below the scheduler and its task
//! runners, which both answer them.

use crate::lease::config::ConfigError;
use crate::lease::guard::LeaseError;
use crate::scheduling::policy::CatchUp;
use crate::scheduling::task::{StoreDownPolicy, TickOutcome};
use crate::store::capabilities::Capabilities;
use crate::store::error::StoreError;
use crate::store::name::{HolderId, LeaseName};

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
    /// Both a leader gate and spreading were asked for; a scheduler uses one or the other.
    #[error("a scheduler either spreads its tasks or gates them on a leader group, not both")]
    SpreadWithLeaderGroup,
    /// No task has that name.
    #[error("no task named {0:?}")]
    UnknownTask(String),
    /// The lease timing is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The scheduler has shut down.
    #[error("the scheduler has shut down")]
    ShutDown,
    /// An exclusive manual run found the task running (here or on another instance).
    #[error("the task is running on {holder}")]
    Busy {
        /// Who holds the task lease.
        holder: HolderId,
    },
    /// An exclusive manual run could not take the task lease.
    #[error("cannot take the task lease: {0}")]
    Lease(#[from] LeaseError),
    /// The run history could not be read.
    #[error("cannot read the run history: {0}")]
    History(#[source] StoreError),
    /// The store lacks what the tasks need: slots for gated tasks, membership for spreading.
    #[error("store {store} cannot schedule these tasks: it keeps no {missing}")]
    MissingCapabilities {
        /// The store, as it describes itself.
        store: String,
        /// What it lacks.
        missing: Capabilities,
    },
}

/// A task's state, from [`SchedulerHandle::status`](crate::SchedulerHandle::status).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskStatus {
    /// The task's name.
    pub name: LeaseName,
    /// Its schedule, as text.
    pub schedule: String,
    /// The store-down policy in force.
    pub policy: StoreDownPolicy,
    /// Whether its timer ticks are gated.
    pub gated: bool,
    /// What happens to missed slots.
    pub catch_up: CatchUp,
    /// Timer firings seen here.
    pub ticks: u64,
    /// Runs here (timer and manual).
    pub runs: u64,
    /// Runs here that failed, panicked or were aborted.
    pub failures: u64,
    /// Ticks here that found the store down (run or skipped by the policy).
    pub store_down_ticks: u64,
    /// Whether a run (timer or manual) is in progress here.
    pub running: bool,
    /// With [`Scheduler::spread`](crate::Scheduler::spread): whether this instance owns the
    /// task in its current view of the membership. `None` without spreading, or while every
    /// instance contends for it.
    pub owned: Option<bool>,
    /// The last firing's outcome and slot.
    pub last: Option<(TickOutcome, Option<u64>)>,
}

/// The scheduler's state, from [`SchedulerHandle::status`](crate::SchedulerHandle::status).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SchedulerStatus {
    /// The store, with any password removed.
    pub store: String,
    /// This instance's holder id.
    pub holder: HolderId,
    /// With a leader gate: whether this instance leads.
    pub leader: Option<bool>,
    /// With [`Scheduler::spread`](crate::Scheduler::spread): the live members of the group as
    /// this instance last saw them (`None` before the first answer, or while placement is off).
    pub members: Option<Vec<HolderId>>,
    /// Whether the store answered the last tick that asked it (`None` before any did, and
    /// without a store).
    pub store_reachable: Option<bool>,
    /// Why the scheduler stopped itself, if it did (see
    /// [`SchedulerHandle::failure`](crate::SchedulerHandle::failure)).
    pub failure: Option<String>,
    /// Every task.
    pub tasks: Vec<TaskStatus>,
}
