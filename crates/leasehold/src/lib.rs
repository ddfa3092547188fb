#![doc = include_str!("../README.md")]

mod config;
pub mod history;
mod leader;
mod lease;
mod memory;
mod name;
mod notify;
mod schedule;
mod scheduler;
pub mod session;
pub mod store;
mod token;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
#[cfg(any(test, feature = "faults"))]
pub mod faults;

pub use config::{ConfigError, LeaseConfig};
pub use leader::{Leader, LeaderEvent, LeaderHandle, LeaderState, MAX_REFUSALS, RevokeReason};
pub use lease::{Lease, LeaseError, LeaseGuard, LossReason, TryAcquire};
pub use memory::MemoryStore;
pub use name::{HolderId, LeaseName, MAX_HOLDER_LEN, MAX_NAME_LEN, NameError};
pub use notify::{ReleaseHub, ReleaseSubscription};
pub use schedule::{CronSchedule, Schedule, ScheduleError};
pub use scheduler::{
    CatchUp, RunResult, Scheduler, SchedulerError, SchedulerHandle, SchedulerStatus,
    StoreDownPolicy, Task, TaskContext, TaskStatus, TickOutcome, Trigger, UnknownPolicy,
};
pub use session::LeaseSession;
pub use store::{
    Acquisition, BoxStore, LeaseState, Release, Renewal, SlotClaim, Store, StoreError, StoreResult,
};
pub use token::FencingToken;

/// Re-exported so users need not depend on tokio-util to hold the guard's cancellation token.
pub use tokio_util::sync::CancellationToken;
