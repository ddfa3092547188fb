//! When a task's timer fires, and which slot each firing is.

use std::fmt;
#[cfg(feature = "cron")]
use std::str::FromStr;
use std::time::Duration;

/// A schedule that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The interval was below 1 ms.
    #[error("interval must be at least 1ms")]
    ZeroInterval,
    /// The cron expression did not parse.
    #[cfg(feature = "cron")]
    #[error("invalid cron expression {expr:?}: {reason}")]
    BadCron {
        /// The expression.
        expr: String,
        /// What the parser said.
        reason: String,
    },
    /// The cron expression has no future occurrence.
    #[cfg(feature = "cron")]
    #[error("cron expression {0:?} never fires again")]
    NeverFires(String),
}

/// When a task's timer fires.
///
/// Every firing has a **slot**: its scheduled time in milliseconds since the Unix epoch, on the
/// store's clock. All instances compute it alike, so a slot claim can tell whether that firing
/// already ran anywhere; and because it is a time for every kind of schedule, slots stay
/// comparable when a schedule changes (`every 1s` to `every 60s`, cron to interval) or when
/// replicas of two versions disagree during a rolling deploy: a claim only moves forward in time.
/// - `Every(interval)`: fires at every multiple of `interval` since the Unix epoch, so intervals
///   are aligned across instances (every 30 s fires at :00 and :30).
/// - `Cron(expr)`: fires at each occurrence of the expression (UTC).
///
/// Cron needs the `cron` feature (on by default); without it the crate carries neither `cron`
/// nor `chrono`.
#[derive(Clone)]
#[non_exhaustive]
pub enum Schedule {
    /// A fixed interval, aligned to the epoch.
    Every(Duration),
    /// A cron expression with a seconds field (`sec min hour day-of-month month day-of-week
    /// [year]`), evaluated in UTC.
    #[cfg(feature = "cron")]
    Cron(Box<CronSchedule>),
}

/// A parsed cron expression.
#[cfg(feature = "cron")]
#[derive(Clone)]
pub struct CronSchedule {
    expr: String,
    parsed: cron::Schedule,
}

#[cfg(feature = "cron")]
impl CronSchedule {
    /// The expression as given.
    pub fn expr(&self) -> &str {
        &self.expr
    }
}

impl Schedule {
    /// A fixed interval of at least 1 ms.
    pub fn every(interval: Duration) -> Result<Self, ScheduleError> {
        if interval < Duration::from_millis(1) {
            return Err(ScheduleError::ZeroInterval);
        }
        Ok(Self::Every(interval))
    }

    /// A cron expression, with a seconds field: `"0 */5 * * * *"` fires every five minutes.
    #[cfg(feature = "cron")]
    pub fn cron(expr: &str) -> Result<Self, ScheduleError> {
        let parsed = cron::Schedule::from_str(expr).map_err(|e| ScheduleError::BadCron {
            expr: expr.to_owned(),
            reason: e.to_string(),
        })?;
        if parsed.upcoming(chrono::Utc).next().is_none() {
            return Err(ScheduleError::NeverFires(expr.to_owned()));
        }
        Ok(Self::Cron(Box::new(CronSchedule {
            expr: expr.to_owned(),
            parsed,
        })))
    }

    /// The first firing strictly after `now_ms` (store clock), in ms since the epoch: the next
    /// slot. `None` when the schedule never fires again (or not within the representable range).
    pub fn next_after(&self, now_ms: u64) -> Option<u64> {
        match self {
            Self::Every(interval) => {
                let iv = u64::try_from(interval.as_millis()).ok()?.max(1);
                (now_ms / iv + 1).checked_mul(iv)
            }
            #[cfg(feature = "cron")]
            Self::Cron(cron) => {
                let after = chrono::DateTime::from_timestamp_millis(i64::try_from(now_ms).ok()?)?;
                let at = cron.parsed.after(&after).next()?;
                u64::try_from(at.timestamp_millis()).ok()
            }
        }
    }

    /// The latest firing at or before `now_ms`: the slot that a tick arriving at `now_ms`
    /// belongs to (an application that keeps its own timer asks which slot it is in). `None`
    /// before the schedule's first firing.
    pub fn latest_at_or_before(&self, now_ms: u64) -> Option<u64> {
        match self {
            Self::Every(interval) => {
                let iv = u64::try_from(interval.as_millis()).ok()?.max(1);
                Some(now_ms - now_ms % iv)
            }
            #[cfg(feature = "cron")]
            Self::Cron(cron) => {
                // Firings are whole seconds; the one at `now_ms` itself counts.
                let bound = i64::try_from(now_ms.checked_add(1)?).ok()?;
                let after = chrono::DateTime::from_timestamp_millis(bound)?;
                let at = cron.parsed.after(&after).next_back()?;
                u64::try_from(at.timestamp_millis()).ok()
            }
        }
    }

    /// The firings `f` with `after < f <= until`: how many there are (counted up to 100,000 for
    /// cron; exact for intervals) and the newest `newest` of them, oldest first.
    pub fn firings_between(&self, after: u64, until: u64, newest: usize) -> (u64, Vec<u64>) {
        let Some(first) = self.next_after(after).filter(|&f| f <= until) else {
            return (0, Vec::new());
        };
        match self {
            Self::Every(interval) => {
                let iv = u64::try_from(interval.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1);
                let count = (until - first) / iv + 1;
                let last = first + (count - 1) * iv;
                let take = count.min(newest as u64);
                let slots = (0..take).rev().map(|k| last - k * iv).collect();
                (count, slots)
            }
            #[cfg(feature = "cron")]
            Self::Cron(_) => {
                let mut slots = std::collections::VecDeque::with_capacity(newest.min(1024));
                let (mut count, mut at) = (0u64, first);
                loop {
                    count += 1;
                    if slots.len() == newest {
                        slots.pop_front();
                    }
                    if newest > 0 {
                        slots.push_back(at);
                    }
                    match self.next_after(at) {
                        Some(next) if next <= until && count < 100_000 => at = next,
                        _ => break,
                    }
                }
                (count, slots.into())
            }
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Every(d) => write!(f, "every {d:?}"),
            #[cfg(feature = "cron")]
            Self::Cron(c) => write!(f, "cron {:?}", c.expr),
        }
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(all(test, feature = "cron"))]
mod tests {
    use super::*;

    #[test]
    fn intervals_align_to_the_epoch() {
        let s = Schedule::every(Duration::from_secs(30)).unwrap();
        assert_eq!(s.next_after(0), Some(30_000));
        assert_eq!(s.next_after(29_999), Some(30_000));
        assert_eq!(s.next_after(30_000), Some(60_000));
        // An interval too long to fire again within u64 milliseconds never fires.
        let far = Schedule::every(Duration::from_secs(u64::MAX / 2000 + 1)).unwrap();
        let first = far.next_after(0).unwrap();
        assert_eq!(far.next_after(first), None);
        assert_eq!(
            Schedule::every(Duration::ZERO).unwrap_err(),
            ScheduleError::ZeroInterval
        );
    }

    #[test]
    fn a_tick_belongs_to_the_latest_firing_at_or_before_it() {
        let every = Schedule::every(Duration::from_secs(30)).unwrap();
        assert_eq!(every.latest_at_or_before(29_999), Some(0));
        assert_eq!(every.latest_at_or_before(30_000), Some(30_000));
        assert_eq!(every.latest_at_or_before(59_999), Some(30_000));
        let cron = Schedule::cron("0 */5 * * * *").unwrap();
        let five = 1_767_225_900_000; // 2026-01-01T00:05:00Z
        assert_eq!(cron.latest_at_or_before(five), Some(five));
        assert_eq!(cron.latest_at_or_before(five + 299_999), Some(five));
        assert_eq!(cron.latest_at_or_before(five - 1), Some(five - 300_000));
        // Consistent with next_after: the slot's next firing is after the tick.
        let now = five + 123_456;
        let slot = cron.latest_at_or_before(now).unwrap();
        assert!(cron.next_after(slot).unwrap() > now);
    }

    #[test]
    fn cron_slots_are_occurrence_times() {
        let s = Schedule::cron("0 */5 * * * *").unwrap();
        // 2026-01-01T00:02:00Z → next at 00:05:00Z.
        let now = 1_767_225_720_000;
        let at = s.next_after(now).unwrap();
        assert_eq!(at, 1_767_225_900_000);
        assert_eq!(s.next_after(at).unwrap(), at + 300_000);
    }

    #[test]
    fn firings_between_counts_and_keeps_the_newest() {
        let every = Schedule::every(Duration::from_secs(10)).unwrap();
        assert_eq!(every.firings_between(0, 9_999, 5), (0, vec![]));
        assert_eq!(every.firings_between(0, 10_000, 5), (1, vec![10_000]));
        assert_eq!(
            every.firings_between(10_000, 1_000_000, 3),
            (99, vec![980_000, 990_000, 1_000_000])
        );
        assert_eq!(every.firings_between(10_000, 35_000, 0), (2, vec![]));
        let cron = Schedule::cron("*/10 * * * * *").unwrap();
        assert_eq!(
            cron.firings_between(10_000, 1_000_000, 3),
            (99, vec![980_000, 990_000, 1_000_000])
        );
    }

    #[test]
    fn slots_of_different_schedules_are_comparable_times() {
        // The same instant is the same slot whatever the schedule, so a claim made under one
        // schedule neither blocks nor repeats the firings of another.
        let now = 1_767_225_720_000; // 2026-01-01T00:02:00Z
        let every_second = Schedule::every(Duration::from_secs(1)).unwrap();
        let every_minute = Schedule::every(Duration::from_secs(60)).unwrap();
        let cron_minute = Schedule::cron("0 * * * * *").unwrap();
        assert_eq!(every_second.next_after(now), Some(now + 1_000));
        assert_eq!(every_minute.next_after(now), Some(now + 60_000));
        assert_eq!(cron_minute.next_after(now), every_minute.next_after(now));
    }

    #[test]
    fn bad_cron_is_a_typed_error() {
        assert!(matches!(
            Schedule::cron("every tuesday"),
            Err(ScheduleError::BadCron { .. })
        ));
        assert!(matches!(
            Schedule::cron("0 0 0 1 1 * 2001"),
            Err(ScheduleError::NeverFires(_))
        ));
    }
}
