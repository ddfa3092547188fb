#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod catalog;
mod config;
#[cfg(feature = "cron")]
mod cron;
mod feed;
pub mod fleet;
pub mod gate;
pub mod history;
mod leader;
mod lease;
mod memory;
mod metered;
mod metrics_help;
mod name;
mod notify;
pub mod overview;
mod schedule;
mod scheduler;
mod session;
pub mod skew;
mod store_api;
mod timeout;
mod token;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
#[cfg(any(test, feature = "faults"))]
pub mod faults;

pub use config::{ConfigError, LeaseConfig, MAX_TTL};
#[cfg(feature = "cron")]
pub use cron::{CronField, CronProblem, CronSchedule};
pub use leader::{Leader, LeaderEvent, LeaderHandle, LeaderState, MAX_REFUSALS, RevokeReason};
pub use lease::{Lease, LeaseError, LeaseGuard, LossReason, TryAcquire};
pub use memory::MemoryStore;
pub use metrics_help::describe_metrics;
pub use name::{HolderId, LeaseName, MAX_HOLDER_LEN, MAX_NAME_LEN, NameError, host_name};
pub use schedule::{Schedule, ScheduleError};
pub use scheduler::{
    CatchUp, RunResult, Scheduler, SchedulerError, SchedulerHandle, SchedulerStatus,
    StoreDownPolicy, Task, TaskContext, TaskStatus, TickOutcome, Trigger, UnknownPolicy,
};
pub use session::{DEFAULT_SESSION_RETENTION, LeaseSession, MAX_RENEW_BATCH};
pub use store_api::{
    BoxStore, Capabilities, Catalog, LeaseState, Membership, Purge, Release, Slots, Store,
    StoreError,
};

/// What a [`Store`] implementation works with beyond the items at the crate root: the answers of
/// its operations, its error helpers and its release notifications; and the wrappers that work
/// around any store ([`Layer`](store::Layer)s): an operation time limit
/// ([`Timeout`](store::Timeout)) and metrics per call ([`Metered`](store::Metered)). Applications need these only to call a store's operations
/// directly or to wrap a store.
pub mod store {
    pub use crate::config::{ZeroDuration, check_nonzero};
    pub use crate::feed::{FeedLink, ReleaseFeed, ReleaseSource};
    pub use crate::metered::Metered;
    pub use crate::notify::{ReleaseHub, ReleaseSubscription};
    pub use crate::store_api::{
        Acquisition, Answer, BoxError, Layer, Operation, Renewal, SlotClaim, StoreResult,
        TickAnswer, TickClaim, TickRequest, unsupported,
    };
    pub use crate::timeout::{Timeout, within};
}
pub use token::FencingToken;

/// Re-exported so users need not depend on tokio-util to hold the guard's cancellation token.
pub use tokio_util::sync::CancellationToken;
