//! A task's run series (docs/metrics.md, "Runs"): how its runs ended, how long they took, when
//! it last ran and last succeeded, its failures in a row, and its interval (for the alert on
//! no success within two of them). Every series is labelled `task` and written here only, so
//! dropping a task's series when it is unregistered is one change in one place.
//!
//! Written by whoever records a run's end ([`lifecycle::record_run_end`](super::lifecycle::record_run_end)):
//! the scheduler for its runs, the sidecar for the runs its applications report `done` (or that
//! it ends for them).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use metrics::{Counter, Gauge, Histogram};

use crate::scheduling::history::{Outcome, RecordTrigger, RunRecord};
use crate::store::name::LeaseName;

/// Runs ended, by task, outcome and trigger.
pub(crate) const RUNS: &str = "leasehold_runs_total";
/// How long runs took, by task.
pub(crate) const DURATION: &str = "leasehold_run_duration_seconds";
/// When the task last ended a run, any outcome (store clock, seconds since the epoch).
pub(crate) const LAST_RUN: &str = "leasehold_last_run_timestamp_seconds";
/// When the task last ended a run `ok`.
pub(crate) const LAST_SUCCESS: &str = "leasehold_last_success_timestamp_seconds";
/// `failed` and `timed-out` runs since the task's last `ok` on this instance.
pub(crate) const CONSECUTIVE_FAILURES: &str = "leasehold_consecutive_failures";
/// The interval between the task's slots about its last run.
pub(crate) const INTERVAL: &str = "leasehold_task_interval_seconds";
/// Attempts after the first of a slot (retries), by task.
pub(crate) const RETRIES: &str = "leasehold_run_retries_total";

/// The handles of each task's run series, held from its first run's end until the task is given
/// up here ([`forget`], when its [`TaskTicks`](super::lifecycle::TaskTicks) goes): a recorder
/// that removes the series nobody holds (the sidecar's, `leasehold run`'s) so keeps them exactly
/// as long as the task, a daily task's between its runs included.
#[derive(Default)]
struct Held {
    runs: HashMap<(&'static str, &'static str), Counter>,
    gauges: HashMap<&'static str, Gauge>,
    duration: Option<Histogram>,
    retries: Option<Counter>,
}

static HELD: LazyLock<Mutex<HashMap<LeaseName, Held>>> = LazyLock::new(Mutex::default);

fn held() -> std::sync::MutexGuard<'static, HashMap<LeaseName, Held>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops `task`'s run series (the task is given up here).
pub(crate) fn forget(task: &LeaseName) {
    held().remove(task);
}

/// Counts `record`, an ended run of `task`, in the task's series. A record that has not ended
/// (running, or missed slots) counts nowhere.
pub(crate) fn run_ended(task: &LeaseName, record: &RunRecord) {
    let Some(outcome) = record.result() else {
        return;
    };
    let name = task.as_str().to_owned();
    let trigger = record.trigger.map_or("timer", RecordTrigger::as_str);
    let interval = record
        .schedule
        .as_ref()
        .and_then(|s| s.schedule())
        .and_then(|s| {
            let at = record.slot.or(record.started_ms)?;
            let slot = s.latest_at_or_before(at).or(Some(at))?;
            Some(s.next_after(slot)? - slot)
        });
    let mut all = held();
    let series = all.entry(task.clone()).or_default();
    // A gauge is registered when first set: no last success until there is one.
    let mut gauge = |metric: &'static str| {
        series
            .gauges
            .entry(metric)
            .or_insert_with(|| metrics::gauge!(metric, "task" => name.clone()))
            .clone()
    };
    if let Some(ended) = record.ended_ms {
        let seconds = ended as f64 / 1000.0;
        gauge(LAST_RUN).set(seconds);
        if outcome == Outcome::Ok {
            gauge(LAST_SUCCESS).set(seconds);
        }
    }
    let failures = gauge(CONSECUTIVE_FAILURES);
    match outcome {
        Outcome::Ok => failures.set(0.0),
        o if o.is_failure() => failures.increment(1.0),
        // Present from the task's first run on, so an alert can compare it with zero.
        _ => failures.increment(0.0),
    }
    if let Some(ms) = interval {
        gauge(INTERVAL).set(ms as f64 / 1000.0);
    }
    series
        .runs
        .entry((outcome.as_str(), trigger))
        .or_insert_with(|| {
            metrics::counter!(RUNS, "task" => name.clone(), "outcome" => outcome.as_str(), "trigger" => trigger)
        })
        .increment(1);
    if record.attempt() > 1 {
        series
            .retries
            .get_or_insert_with(|| metrics::counter!(RETRIES, "task" => name.clone()))
            .increment(1);
    }
    if let Some(took) = record.duration() {
        series
            .duration
            .get_or_insert_with(|| metrics::histogram!(DURATION, "task" => name))
            .record(took.as_secs_f64());
    }
}
