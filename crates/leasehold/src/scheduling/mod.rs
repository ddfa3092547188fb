//! Scheduling: when a task fires and which slot each firing is ([`schedule`], [`cron`]), the
//! tick decision ([`gate`]) and leadership campaigned for on behalf of ticking callers
//! ([`campaigns`]), run history ([`history`]), the task records of the catalog
//! ([`definition`]), the scheduler ([`scheduler`]), and the operator's view and hand
//! ([`fleet`], [`overview`]). Built on the `lease` and `store` layers.

pub mod backfill;
pub(crate) mod campaigns;
#[cfg(feature = "cron")]
pub(crate) mod cron;
pub(crate) mod definition;
pub mod fleet;
pub mod gate;
pub mod history;
pub mod interrupted;
pub mod lifecycle;
pub mod overview;
pub(crate) mod placement;
pub mod policy;
pub mod presence;
pub(crate) mod run_metrics;
pub(crate) mod schedule;
pub(crate) mod schedule_error;
pub(crate) mod scheduler;
pub(crate) mod task;
