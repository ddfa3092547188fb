//! Rounds of timed operations and the statistics taken over them.

use std::time::{Duration, Instant};

/// Latencies of one round of sequential operations, and the round's wall time.
#[derive(Debug, Clone)]
pub(crate) struct Round {
    /// Per-operation latencies in microseconds, sorted.
    latencies_us: Vec<f64>,
    /// Operations per second over the whole round (operations / wall time).
    throughput: f64,
}

impl Round {
    /// A round from its latencies and wall time.
    pub(crate) fn new(latencies: &[Duration], wall: Duration) -> Self {
        let mut latencies_us: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        latencies_us.sort_by(f64::total_cmp);
        let secs = wall.as_secs_f64();
        let throughput = if secs > 0.0 {
            latencies.len() as f64 / secs
        } else {
            0.0
        };
        Self {
            latencies_us,
            throughput,
        }
    }

    pub(crate) fn throughput(&self) -> f64 {
        self.throughput
    }

    pub(crate) fn p50(&self) -> f64 {
        percentile(&self.latencies_us, 50.0)
    }

    pub(crate) fn p99(&self) -> f64 {
        percentile(&self.latencies_us, 99.0)
    }
}

/// Times operations one after another: `start` before each, `stop` after it.
pub(crate) struct Recorder {
    begun: Instant,
    started: Instant,
    latencies: Vec<Duration>,
}

impl Recorder {
    pub(crate) fn new(capacity: usize) -> Self {
        let now = Instant::now();
        Self {
            begun: now,
            started: now,
            latencies: Vec::with_capacity(capacity),
        }
    }

    pub(crate) fn start(&mut self) {
        self.started = Instant::now();
    }

    pub(crate) fn stop(&mut self) {
        self.latencies.push(self.started.elapsed());
    }

    pub(crate) fn finish(self) -> Round {
        Round::new(&self.latencies, self.begun.elapsed())
    }
}

/// The `p`-th percentile (0–100) of sorted `values` by nearest rank: the smallest value with at
/// least `p`% of the values at or below it. 0 for no values.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `values` (the mean of the two middle ones for an even count). 0 for none.
pub(crate) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// One figure over several rounds: the median round value, and the lowest and highest.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Spread {
    pub(crate) fn of(values: &[f64]) -> Self {
        Self {
            median: median(values),
            min: values.iter().copied().reduce(f64::min).unwrap_or(0.0),
            max: values.iter().copied().reduce(f64::max).unwrap_or(0.0),
        }
    }
}

/// Throughput and latency of one operation over all rounds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Figure {
    /// Operations per second.
    pub(crate) ops_per_sec: Spread,
    /// Median latency per round, µs.
    pub(crate) p50_us: Spread,
    /// 99th percentile latency per round, µs.
    pub(crate) p99_us: Spread,
    pub(crate) rounds: usize,
    pub(crate) ops_per_round: usize,
}

impl Figure {
    pub(crate) fn of(rounds: &[Round]) -> Self {
        let collect = |f: fn(&Round) -> f64| rounds.iter().map(f).collect::<Vec<_>>();
        Self {
            ops_per_sec: Spread::of(&collect(Round::throughput)),
            p50_us: Spread::of(&collect(Round::p50)),
            p99_us: Spread::of(&collect(Round::p99)),
            rounds: rounds.len(),
            ops_per_round: rounds.first().map_or(0, |r| r.latencies_us.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        let w = [10.0, 20.0, 30.0];
        assert_eq!(percentile(&w, 50.0), 20.0);
        // With fewer than 100 values p99 is the largest.
        assert_eq!(percentile(&w, 99.0), 30.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn round_sorts_latencies_and_computes_throughput() {
        let lat: Vec<Duration> = [3u64, 1, 2, 100]
            .iter()
            .map(|&us| Duration::from_micros(us))
            .collect();
        let r = Round::new(&lat, Duration::from_millis(2));
        assert!((r.throughput() - 2000.0).abs() < 1e-6);
        assert!((r.p50() - 2.0).abs() < 1e-9);
        assert!((r.p99() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn spread_and_figure_over_rounds() {
        let s = Spread::of(&[3.0, 9.0, 1.0, 5.0, 4.0]);
        assert_eq!(
            s,
            Spread {
                median: 4.0,
                min: 1.0,
                max: 9.0
            }
        );
        let round = |us: u64, wall_ms: u64| {
            Round::new(
                &[Duration::from_micros(us); 10],
                Duration::from_millis(wall_ms),
            )
        };
        let f = Figure::of(&[round(10, 1), round(30, 4), round(20, 2)]);
        assert_eq!(f.rounds, 3);
        assert_eq!(f.ops_per_round, 10);
        assert!((f.p50_us.median - 20.0).abs() < 1e-9);
        assert!((f.p50_us.min - 10.0).abs() < 1e-9);
        assert!((f.p99_us.max - 30.0).abs() < 1e-9);
        // 10 ops in 1 ms, 4 ms, 2 ms.
        assert!((f.ops_per_sec.median - 5000.0).abs() < 1e-6);
        assert!((f.ops_per_sec.min - 2500.0).abs() < 1e-6);
        assert!((f.ops_per_sec.max - 10000.0).abs() < 1e-6);
    }
}
