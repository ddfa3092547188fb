//! The help text of the engine's metrics, for recorders that print it (Prometheus' `# HELP`).

use metrics::Unit;

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
            .filter(|name| !name.starts_with("leasehold_sidecar_"))
            .collect();
        let described: std::collections::BTreeSet<&str> =
            ENGINE_METRICS.iter().map(|(name, ..)| *name).collect();
        assert_eq!(documented, described);
    }
}
