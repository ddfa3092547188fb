//! The seeded fault schedule: the same seed and settings give the same faults at the same times.

use std::fmt;
use std::time::Duration;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FaultKind {
    /// SIGKILL of the current holder (and its command), then a replacement replica starts.
    Kill,
    /// SIGSTOP of the holder and its running command for longer than the ttl, then SIGCONT:
    /// the command resumes first and tries its write with the stale token.
    Pause,
    /// SIGTERM of the holder (a graceful handoff), then a replacement replica starts.
    Terminate,
    /// The proxy closes every connection to the store.
    DropConnections,
    /// The proxy forwards nothing for longer than the ttl, then is repaired.
    Blackhole,
    /// The proxy adds latency for a while, then is repaired.
    Delay,
    /// The harness's own store server is killed and started again: Redis (no persistence)
    /// loses its data, PostgreSQL crashes and recovers it from its WAL.
    StoreRestart,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [FaultKind; 7] = [
        Self::Kill,
        Self::Pause,
        Self::Terminate,
        Self::DropConnections,
        Self::Blackhole,
        Self::Delay,
        Self::StoreRestart,
    ];

    /// The name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::Terminate => "terminate",
            Self::DropConnections => "drop",
            Self::Blackhole => "blackhole",
            Self::Delay => "delay",
            Self::StoreRestart => "store-restart",
        }
    }
}

/// As its report name ([`FaultKind::as_str`]).
impl serde::Serialize for FaultKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedFault {
    /// When, from the start of the run.
    pub at: Duration,
    /// What.
    pub kind: FaultKind,
    /// How long a pause, blackhole or delay lasts (at least; a pause also waits for the new
    /// holder's write).
    pub hold: Duration,
    /// The added latency of a delay.
    pub latency: Duration,
}

/// Plans `count` faults between `from` and `until`, spread evenly with seeded jitter. Each of
/// `kinds` appears at least once when `count` allows; `Pause` (the fencing check) always does.
pub fn plan(
    seed: u64,
    from: Duration,
    until: Duration,
    count: usize,
    kinds: &[FaultKind],
    ttl: Duration,
) -> Vec<PlannedFault> {
    let mut rng = fastrand::Rng::with_seed(seed);
    if count == 0 || kinds.is_empty() || until <= from {
        return Vec::new();
    }
    let mut picks: Vec<FaultKind> = Vec::with_capacity(count);
    if kinds.contains(&FaultKind::Pause) {
        picks.push(FaultKind::Pause);
    }
    for &k in kinds {
        if picks.len() < count && !picks.contains(&k) {
            picks.push(k);
        }
    }
    while picks.len() < count {
        picks.push(kinds[rng.usize(..kinds.len())]);
    }
    rng.shuffle(&mut picks);
    let span = until - from;
    let step = span / u32::try_from(count).unwrap_or(u32::MAX);
    let scale = |d: Duration, lo: f64, hi: f64, rng: &mut fastrand::Rng| {
        d.mul_f64(lo + (hi - lo) * rng.f64())
    };
    picks
        .into_iter()
        .enumerate()
        .map(|(i, kind)| {
            let slot_start = from + step * u32::try_from(i).unwrap_or(u32::MAX);
            let at = slot_start + scale(step, 0.0, 0.4, &mut rng);
            let (hold, latency) = match kind {
                FaultKind::Pause => (scale(ttl, 1.5, 2.5, &mut rng), Duration::ZERO),
                FaultKind::Blackhole => (scale(ttl, 1.3, 2.5, &mut rng), Duration::ZERO),
                FaultKind::Delay => (
                    scale(ttl, 1.0, 3.0, &mut rng),
                    Duration::from_millis(rng.u64(50..=300)),
                ),
                _ => (Duration::ZERO, Duration::ZERO),
            };
            PlannedFault {
                at,
                kind,
                hold,
                latency,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let a = plan(42, S(3), S(80), 10, &FaultKind::ALL, S(1));
        let b = plan(42, S(3), S(80), 10, &FaultKind::ALL, S(1));
        assert_eq!(a, b);
        let c = plan(43, S(3), S(80), 10, &FaultKind::ALL, S(1));
        assert_ne!(a, c);
    }

    #[test]
    fn faults_are_spread_in_order_within_the_window() {
        let p = plan(7, S(3), S(80), 12, &FaultKind::ALL, S(1));
        assert_eq!(p.len(), 12);
        assert!(p.windows(2).all(|w| w[0].at < w[1].at));
        assert!(p.iter().all(|f| f.at >= S(3) && f.at < S(80)));
    }

    #[test]
    fn every_kind_appears_and_pause_always_does() {
        let p = plan(1, S(3), S(80), 10, &FaultKind::ALL, S(1));
        for k in FaultKind::ALL {
            assert!(p.iter().any(|f| f.kind == k), "{k} missing");
        }
        let local = [FaultKind::Kill, FaultKind::Terminate, FaultKind::Pause];
        for seed in 0..50 {
            let p = plan(seed, S(3), S(80), 2, &local, S(1));
            assert!(p.iter().any(|f| f.kind == FaultKind::Pause));
            assert!(p.iter().all(|f| local.contains(&f.kind)));
        }
    }

    #[test]
    fn holds_outlast_the_ttl() {
        for f in plan(9, S(3), S(600), 50, &FaultKind::ALL, S(1)) {
            match f.kind {
                FaultKind::Pause | FaultKind::Blackhole => assert!(f.hold > S(1)),
                FaultKind::Delay => {
                    let ms = f.latency.as_millis();
                    assert!((50..=300).contains(&ms));
                }
                _ => {}
            }
        }
    }
}
