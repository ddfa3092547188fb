//! The process's metrics recorder: every series recorded through the [`metrics`] facade, kept
//! for `GET /metrics` and rendered in the Prometheus text format (with
//! metrics-exporter-prometheus' formatting).
//!
//! Bounded by design (docs/metrics.md, "How many series"):
//!
//! - A series about one task or group (a `leasehold_*` metric with a `task` or `group` label)
//!   lives while something holds its handle: the task's ticks, the group's leader. Once the task
//!   or group is given up (unregistered, idle past its expiry, leadership dropped) nothing does,
//!   and the next [`Series::sweep`] (each scrape, and the upkeep every few seconds) removes it.
//!   The recorder hands out shared handles, so "held" is a strong count above the registry's own.
//! - At most [`MAX_NAMES`] task and group names have series at once; a series for one more is not
//!   kept (its handle records nothing) and counted in `leasehold_series_dropped_total`.
//!
//! Every other series (routes, store operations, end reasons: a fixed set) is kept for the
//! life of the process, as Prometheus counters should be.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use indexmap::IndexMap;
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::LabelSet;
use metrics_exporter_prometheus::formatting::{
    sanitize_metric_name, write_help_line, write_metric_line, write_type_line,
};

/// The most task and group names with series at once. A fleet's sidecar serves tens to
/// hundreds of tasks; a scrape of this many is about 1.5 MB (a group has 21 lines).
pub const MAX_NAMES: usize = 1000;

/// The counter of series not kept because [`MAX_NAMES`] names had series.
pub const DROPPED: &str = "leasehold_series_dropped_total";

/// The labels that name one task or group.
const NAME_LABELS: [&str; 2] = ["task", "group"];

/// The recorder's series: see the module documentation. Shared by the installed recorder and
/// the handle that renders them.
#[derive(Debug)]
pub(crate) struct Series {
    counters: Family<AtomicU64>,
    gauges: Family<AtomicU64>,
    histograms: Family<Buckets>,
    /// How many series each task or group name has (`(label, value)`), at most `max_names`
    /// entries. Taken before a family's write lock.
    names: Mutex<HashMap<(String, String), usize>>,
    max_names: usize,
    /// Help text and unit by (sanitized) metric name.
    descriptions: RwLock<HashMap<String, (SharedString, Option<Unit>)>>,
    buckets: &'static [f64],
    dropped: Arc<AtomicU64>,
}

/// The series of one kind, by key.
#[derive(Debug)]
struct Family<T>(RwLock<HashMap<Key, Arc<T>>>);

impl<T> Default for Family<T> {
    fn default() -> Self {
        Self(RwLock::default())
    }
}

impl<T> Family<T> {
    fn get(&self, key: &Key) -> Option<Arc<T>> {
        read(&self.0).get(key).cloned()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The task or group a `leasehold_*` series is about, if any.
fn name_of(key: &Key) -> Option<(String, String)> {
    if !key.name().starts_with("leasehold_") {
        return None;
    }
    key.labels()
        .find(|l| NAME_LABELS.contains(&l.key()))
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
}

/// A histogram's buckets (not cumulative: each counts the samples up to its bound and above the
/// one before), sample count and sum.
#[derive(Debug)]
struct Buckets {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// An `f64`'s bits.
    sum: AtomicU64,
}

impl Buckets {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }
}

impl HistogramFn for Buckets {
    fn record(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|&le| value <= le) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }
}

impl Series {
    /// No series yet but the dropped counter; histograms with `buckets` (in seconds).
    pub(crate) fn new(buckets: &'static [f64], max_names: usize) -> Self {
        let dropped = Arc::new(AtomicU64::new(0));
        let counters = Family::default();
        write(&counters.0).insert(Key::from_static_name(DROPPED), dropped.clone());
        Self {
            counters,
            gauges: Family::default(),
            histograms: Family::default(),
            names: Mutex::default(),
            max_names,
            descriptions: RwLock::default(),
            buckets,
            dropped,
        }
    }

    /// The series of `key` in `family`, created with `make` if there is none; `None` when it is
    /// about a task or group beyond the cap.
    fn series<T>(&self, family: &Family<T>, key: &Key, make: impl FnOnce() -> T) -> Option<Arc<T>> {
        if let Some(found) = family.get(key) {
            return Some(found);
        }
        let Some(name) = name_of(key) else {
            return Some(
                write(&family.0)
                    .entry(key.clone())
                    .or_insert_with(|| Arc::new(make()))
                    .clone(),
            );
        };
        let mut names = lock(&self.names);
        let mut series = write(&family.0);
        if let Some(found) = series.get(key) {
            return Some(found.clone());
        }
        if !names.contains_key(&name) && names.len() >= self.max_names {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *names.entry(name).or_default() += 1;
        let created = Arc::new(make());
        series.insert(key.clone(), created.clone());
        Some(created)
    }

    /// Removes the series about a task or group that nothing holds any more.
    pub(crate) fn sweep(&self) {
        let mut names = lock(&self.names);
        sweep_family(&self.counters, &mut names);
        sweep_family(&self.gauges, &mut names);
        sweep_family(&self.histograms, &mut names);
    }

    /// How many series there are (a histogram is one).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        read(&self.counters.0).len() + read(&self.gauges.0).len() + read(&self.histograms.0).len()
    }

    fn describe(&self, name: KeyName, unit: Option<Unit>, description: SharedString) {
        write(&self.descriptions)
            .entry(sanitize_metric_name(name.as_str()))
            .or_insert((description, unit));
    }

    /// Every series, in the Prometheus text format: metrics by name, series by labels.
    pub(crate) fn render(&self) -> String {
        let no_global_labels = IndexMap::new();
        let labels = |key: &Key| LabelSet::from_key_and_global(key, &no_global_labels);
        let descriptions = read(&self.descriptions);
        let mut out = String::new();
        let header = |out: &mut String, name: &str, kind: &str| {
            if let Some((help, _)) = descriptions.get(name) {
                write_help_line(out, name, None, None, help);
            }
            write_type_line(out, name, None, None, kind);
        };
        // Values as their text (what the line writes of them): counters and gauges alike.
        let counters = by_name(&self.counters, |c| c.load(Ordering::Relaxed).to_string());
        let gauges = by_name(&self.gauges, |g| {
            f64::from_bits(g.load(Ordering::Relaxed)).to_string()
        });
        for (kind, families) in [("counter", counters), ("gauge", gauges)] {
            for (name, series) in families {
                header(&mut out, &name, kind);
                for (key, value) in series {
                    write_metric_line::<&str, String>(
                        &mut out,
                        &name,
                        None,
                        &labels(&key),
                        None,
                        value,
                        None,
                    );
                }
                out.push('\n');
            }
        }
        let snapshot = |h: &Buckets| {
            let counts: Vec<u64> = h.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
            let count = h.count.load(Ordering::Relaxed);
            (
                h.bounds,
                counts,
                count,
                f64::from_bits(h.sum.load(Ordering::Relaxed)),
            )
        };
        for (name, series) in by_name(&self.histograms, snapshot) {
            header(&mut out, &name, "histogram");
            for (key, (bounds, counts, count, sum)) in series {
                let labels = labels(&key);
                let mut cumulative = 0;
                for (le, n) in bounds.iter().zip(counts) {
                    cumulative += n;
                    write_metric_line(
                        &mut out,
                        &name,
                        Some("bucket"),
                        &labels,
                        Some(("le", le)),
                        cumulative,
                        None,
                    );
                }
                write_metric_line(
                    &mut out,
                    &name,
                    Some("bucket"),
                    &labels,
                    Some(("le", "+Inf")),
                    count,
                    None,
                );
                write_metric_line::<&str, f64>(
                    &mut out,
                    &name,
                    Some("sum"),
                    &labels,
                    None,
                    sum,
                    None,
                );
                write_metric_line::<&str, u64>(
                    &mut out,
                    &name,
                    Some("count"),
                    &labels,
                    None,
                    count,
                    None,
                );
            }
            out.push('\n');
        }
        out
    }
}

/// Removes the series of `family` about a task or group that only the family holds, and
/// forgets the names left without a series.
fn sweep_family<T>(family: &Family<T>, names: &mut HashMap<(String, String), usize>) {
    let mut series_of = write(&family.0);
    series_of.retain(|key, series| {
        if Arc::strong_count(series) > 1 {
            return true;
        }
        let Some(name) = name_of(key) else {
            return true;
        };
        if let Some(count) = names.get_mut(&name) {
            *count -= 1;
            if *count == 0 {
                names.remove(&name);
            }
        }
        false
    });
    // The room of many names given up at once goes back too.
    if series_of.capacity() > 2 * series_of.len() + 64 {
        series_of.shrink_to_fit();
    }
    if names.capacity() > 2 * names.len() + 64 {
        names.shrink_to_fit();
    }
}

/// The values of `family` (read with `value`), grouped by sanitized metric name and sorted by
/// name and labels, so scrapes list series in a stable order.
fn by_name<T, V>(family: &Family<T>, value: impl Fn(&T) -> V) -> BTreeMap<String, Vec<(Key, V)>> {
    let mut grouped: BTreeMap<String, Vec<(Key, V)>> = BTreeMap::new();
    for (key, series) in read(&family.0).iter() {
        grouped
            .entry(sanitize_metric_name(key.name()))
            .or_default()
            .push((key.clone(), value(series)));
    }
    for series in grouped.values_mut() {
        series.sort_by(|a, b| a.0.labels().cmp(b.0.labels()));
    }
    grouped
}

/// The [`Recorder`] over shared [`Series`].
#[derive(Debug)]
pub(crate) struct SeriesRecorder(pub(crate) Arc<Series>);

impl Recorder for SeriesRecorder {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe(name, unit, description);
    }

    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe(name, unit, description);
    }

    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe(name, unit, description);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let series = &self.0;
        series
            .series(&series.counters, key, || AtomicU64::new(0))
            .map_or_else(Counter::noop, Counter::from_arc)
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let series = &self.0;
        series
            .series(&series.gauges, key, || AtomicU64::new(0f64.to_bits()))
            .map_or_else(Gauge::noop, Gauge::from_arc)
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let series = &self.0;
        let buckets = series.buckets;
        series
            .series(&series.histograms, key, || Buckets::new(buckets))
            .map_or_else(Histogram::noop, Histogram::from_arc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUCKETS: &[f64] = &[0.1, 1.0];

    fn recorder(max_names: usize) -> SeriesRecorder {
        SeriesRecorder(Arc::new(Series::new(BUCKETS, max_names)))
    }

    fn lines(series: &Series) -> Vec<String> {
        series.render().lines().map(str::to_owned).collect()
    }

    #[test]
    fn a_task_or_group_series_lives_while_it_is_held() {
        let recorder = recorder(10);
        let series = recorder.0.clone();
        metrics::with_local_recorder(&recorder, || {
            let gauge = metrics::gauge!("leasehold_leader", "group" => "g");
            gauge.set(1.0);
            let held = metrics::histogram!("leasehold_leader_campaign_seconds", "group" => "g");
            held.record(0.5);
            metrics::counter!("leasehold_slots_missed_total", "task" => "t").increment(2);
            metrics::counter!("leasehold_sidecar_requests_total", "route" => "/healthz")
                .increment(1);
            let text = series.render();
            assert!(text.contains("leasehold_leader{group=\"g\"} 1\n"), "{text}");
            assert!(
                text.contains("leasehold_slots_missed_total{task=\"t\"} 2\n"),
                "{text}"
            );
            assert!(
                text.contains(
                    "leasehold_leader_campaign_seconds_bucket{group=\"g\",le=\"0.1\"} 0\n\
                 leasehold_leader_campaign_seconds_bucket{group=\"g\",le=\"1\"} 1\n\
                 leasehold_leader_campaign_seconds_bucket{group=\"g\",le=\"+Inf\"} 1\n\
                 leasehold_leader_campaign_seconds_sum{group=\"g\"} 0.5\n\
                 leasehold_leader_campaign_seconds_count{group=\"g\"} 1\n"
                ),
                "{text}"
            );
            // The counter nobody holds is gone; the held gauge and histogram stay.
            series.sweep();
            let text = series.render();
            assert!(!text.contains("task=\"t\""), "{text}");
            assert!(text.contains("leasehold_leader{group=\"g\"} 1\n"), "{text}");
            assert!(
                text.contains("leasehold_leader_campaign_seconds_count{group=\"g\"} 1"),
                "{text}"
            );
            // Given up: nothing of the group is left; series of no task or group stay.
            drop((gauge, held));
            series.sweep();
            let text = series.render();
            assert!(!text.contains("group="), "{text}");
            assert!(
                text.contains("leasehold_sidecar_requests_total{route=\"/healthz\"} 1\n"),
                "{text}"
            );
            assert_eq!(series.len(), 2, "{text}");
        });
    }

    #[test]
    fn names_beyond_the_cap_are_counted_not_kept() {
        let recorder = recorder(2);
        let series = recorder.0.clone();
        metrics::with_local_recorder(&recorder, || {
            let held: Vec<_> = ["a", "b", "c", "d"]
                .into_iter()
                .map(|task| {
                    let counter = metrics::counter!("leasehold_ticks_total", "task" => task, "outcome" => "ran");
                    counter.increment(1);
                    counter
                })
                .collect();
            // A second series of a name that has one is kept.
            let other = metrics::counter!("leasehold_ticks_total", "task" => "a", "outcome" => "skipped-claimed");
            other.increment(1);
            let text = series.render();
            assert!(text.contains("task=\"a\",outcome=\"ran\"} 1"), "{text}");
            assert!(
                text.contains("task=\"a\",outcome=\"skipped-claimed\"} 1"),
                "{text}"
            );
            assert!(text.contains("task=\"b\""), "{text}");
            assert!(
                !text.contains("task=\"c\"") && !text.contains("task=\"d\""),
                "{text}"
            );
            assert!(
                text.contains("leasehold_series_dropped_total 2\n"),
                "{text}"
            );
            // Once a name is given up, a new one fits.
            drop(held);
            drop(other);
            series.sweep();
            metrics::counter!("leasehold_ticks_total", "task" => "e", "outcome" => "ran")
                .increment(1);
            let text = series.render();
            assert!(text.contains("task=\"e\""), "{text}");
        });
    }

    #[test]
    fn the_render_has_help_and_type_lines_once_per_metric() {
        let recorder = recorder(10);
        let series = recorder.0.clone();
        metrics::with_local_recorder(&recorder, || {
            metrics::describe_counter!("leasehold_sidecar_requests_total", "Requests.");
            metrics::counter!("leasehold_sidecar_requests_total", "route" => "/a").increment(1);
            metrics::counter!("leasehold_sidecar_requests_total", "route" => "/b").increment(3);
        });
        assert_eq!(
            lines(&series),
            [
                "# TYPE leasehold_series_dropped_total counter",
                "leasehold_series_dropped_total 0",
                "",
                "# HELP leasehold_sidecar_requests_total Requests.",
                "# TYPE leasehold_sidecar_requests_total counter",
                "leasehold_sidecar_requests_total{route=\"/a\"} 1",
                "leasehold_sidecar_requests_total{route=\"/b\"} 3",
                "",
            ]
        );
    }
}
