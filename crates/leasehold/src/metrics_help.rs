//! The help text of the engine's metrics, for recorders that print it (Prometheus' `# HELP`),
//! and the counters one task holds for as long as it lives.

use std::sync::Mutex;

use metrics::{Counter, Unit};

/// How a metric is recorded.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric the engine and [`Metered`](crate::store::Metered) record: name, kind, help.
/// docs/metrics.md has the same list with the labels (a test checks both name the same ones).
const ENGINE_METRICS: &[(&str, Kind, &str)] = &[
    (
        "leasehold_leases_lost_total",
        Kind::Counter,
        "Leases lost by reason (taken-over, expired, superseded); releases are not losses.",
    ),
    (
        "leasehold_leader",
        Kind::Gauge,
        "1 while this instance leads the group, else 0.",
    ),
    (
        "leasehold_leader_campaign_seconds",
        Kind::Histogram,
        "Time from starting a campaign to being elected.",
    ),
    (
        "leasehold_ticks_total",
        Kind::Counter,
        "Timer firings on this instance by task and what became of them.",
    ),
    (
        "leasehold_store_down_ticks_total",
        Kind::Counter,
        "Timer firings that found the store unreachable, by the policy that decided them.",
    ),
    (
        "leasehold_slots_missed_total",
        Kind::Counter,
        "Slots that did not run, by task and reason, counted by the instance that found them.",
    ),
    (
        "leasehold_runs_total",
        Kind::Counter,
        "Runs that ended, by task, outcome (ok, failed, timed-out, cancelled, interrupted) and trigger.",
    ),
    (
        "leasehold_run_retries_total",
        Kind::Counter,
        "Runs that were a retry of their slot (attempt 2 on), by task; each is in leasehold_runs_total too.",
    ),
    (
        "leasehold_retries_dropped_total",
        Kind::Counter,
        "Retries not run because they would not have started before the task's next slot, by task.",
    ),
    (
        "leasehold_run_duration_seconds",
        Kind::Histogram,
        "How long runs took, by task, whatever their outcome.",
    ),
    (
        "leasehold_last_run_timestamp_seconds",
        Kind::Gauge,
        "When the task's last run ended (store clock, Unix seconds).",
    ),
    (
        "leasehold_last_success_timestamp_seconds",
        Kind::Gauge,
        "When the task's last ok run ended (store clock, Unix seconds).",
    ),
    (
        "leasehold_consecutive_failures",
        Kind::Gauge,
        "Failed and timed-out runs of the task on this instance since its last ok run.",
    ),
    (
        "leasehold_task_interval_seconds",
        Kind::Gauge,
        "The time between the task's slots about its last run.",
    ),
    (
        "leasehold_history_dropped_total",
        Kind::Counter,
        "Run history records dropped because the writer's queue was full.",
    ),
    (
        "leasehold_store_operations_total",
        Kind::Counter,
        "Store calls by operation and answer (or error kind).",
    ),
    (
        "leasehold_store_operation_seconds",
        Kind::Histogram,
        "Time from a store call to its answer, successful or not.",
    ),
];

/// Gives the installed [`metrics`] recorder the help text (and unit) of every metric the engine
/// records, so an exporter that prints descriptions has them (Prometheus' `# HELP` lines, which
/// `promtool check metrics` asks for). Call it once after installing the recorder; without a
/// recorder it does nothing.
pub fn describe_metrics() {
    for &(name, kind, help) in ENGINE_METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
            Kind::Histogram => metrics::describe_histogram!(name, Unit::Seconds, help),
        }
    }
}

/// The counters about one task (a `task` label), each registered on its first use and held for
/// as long as the task lives here. A recorder that removes the series nobody holds (the
/// sidecar's and `leasehold run`'s) so keeps a task's series exactly as long as the task: they
/// go with it when it is given up, not before (a daily task's counters between its runs).
#[derive(Default)]
pub(crate) struct TaskCounters(Mutex<Vec<(&'static str, &'static str, Counter)>>);

impl TaskCounters {
    /// The counter of `metric` with the other label's value `value`, registered with `make`
    /// the first time.
    pub(crate) fn get(
        &self,
        metric: &'static str,
        value: &'static str,
        make: impl FnOnce() -> Counter,
    ) -> Counter {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((.., counter)) = held.iter().find(|(m, v, _)| *m == metric && *v == value) {
            return counter.clone();
        }
        let counter = make();
        held.push((metric, value, counter.clone()));
        counter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics reference lists exactly the metrics described here.
    #[test]
    fn docs_list_every_engine_metric() {
        let docs = include_str!("../../../docs/metrics.md");
        let documented: std::collections::BTreeSet<&str> = docs
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .filter(|name| {
                !name.starts_with("leasehold_sidecar_") && !name.starts_with("leasehold_series_")
            })
            .collect();
        let described: std::collections::BTreeSet<&str> =
            ENGINE_METRICS.iter().map(|(name, ..)| *name).collect();
        assert_eq!(documented, described);
    }
}
