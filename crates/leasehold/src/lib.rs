#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

// Three layers, each importing only from itself and the layers below it:
// `store` (what a store is, the in-process store and the wrappers around any store), `lease`
// (leases, their renewal, sessions and leader election) and `scheduling` (schedules, the tick
// gate and lifecycle, history, the catalog's task records, the scheduler, the operator's view).
// The items below are re-exported for users only; the crate's own modules name their layer.
mod lease;
mod metrics_help;
mod scheduling;
pub mod store;

pub use lease::config::{ConfigError, LeaseConfig, MAX_TTL};
pub use lease::guard::{Lease, LeaseError, LeaseGuard, TryAcquire};
pub use lease::leader::{
    Leader, LeaderEvent, LeaderHandle, LeaderState, MAX_REFUSALS, RevokeReason,
};
pub use lease::session::{DEFAULT_SESSION_RETENTION, LeaseSession, MAX_RENEW_BATCH};
pub use lease::tenure::LossReason;
pub use metrics_help::describe_metrics;
#[cfg(feature = "cron")]
pub use scheduling::cron::CronSchedule;
pub use scheduling::policy::{Backoff, CatchUp, OnInterrupt, Overlap, RunPolicy};
pub use scheduling::schedule::Schedule;
pub use scheduling::schedule_error::ScheduleError;
#[cfg(feature = "cron")]
pub use scheduling::schedule_error::{CronField, CronProblem};
pub use scheduling::scheduler::{
    Scheduler, SchedulerError, SchedulerHandle, SchedulerStatus, SchedulerStore, TaskStatus,
};
pub use scheduling::task::{
    RunResult, StoreDownPolicy, Task, TaskContext, TickOutcome, Trigger, UnknownPolicy,
};
pub use scheduling::{
    backfill, fleet, gate, history, interrupted, lifecycle, overview, policy, presence,
};
pub use store::answers::{LeaseState, Release};
pub use store::boxed::BoxStore;
pub use store::capabilities::Capabilities;
pub use store::error::StoreError;
#[cfg(any(test, feature = "faults"))]
pub use store::faults;
pub use store::memory::MemoryStore;
pub use store::name::{HolderId, LeaseName, MAX_HOLDER_LEN, MAX_NAME_LEN, NameError, host_name};
pub use store::skew;
pub use store::text;
pub use store::token::FencingToken;
pub use store::traits::{Catalog, Membership, Purge, Slots, Store};

/// What a store's [`Catalog`] keeps: the tasks instances run (each instance's registration with
/// a heartbeat, its definition and what it says about itself), and each task's control record
/// (pause, a pending manual trigger), written by compare-and-set so the CLI, the sidecar and the
/// library can all act on it at once.
pub mod catalog {
    pub use crate::scheduling::definition::{InstanceInfo, TaskDefinition, TaskSource};
    pub use crate::store::catalog::*;
}

/// The store conformance suite: one set of checks, written once, that every [`Store`] must pass
/// against its real server; see [`store::conformance`], which holds all of them but those of a
/// [`Lease`] guard on the store, and [`conformance_tests!`].
#[cfg(any(test, feature = "conformance"))]
pub mod conformance {
    pub use crate::lease::conformance::{
        drop_then_reacquire_keeps_the_new_tenure, guard_renews_and_hands_over,
    };
    pub use crate::store::conformance::*;
}

/// Re-exported so users need not depend on tokio-util to hold the guard's cancellation token.
pub use tokio_util::sync::CancellationToken;
