//! When a task's timer fires, and which slot each firing is.

use std::fmt;
use std::time::Duration;

#[cfg(feature = "cron")]
use crate::scheduling::cron::CronSchedule;
use crate::scheduling::schedule_error::ScheduleError;

/// When a task's timer fires.
///
/// Every firing has a **slot**: its scheduled time in milliseconds since the Unix epoch, on the
/// store's clock. All instances compute it alike, so a slot claim can tell whether that firing
/// already ran anywhere; and because it is a time for every kind of schedule, slots stay
/// comparable when a schedule changes (`every 1s` to `every 60s`, cron to interval) or when
/// replicas of two versions disagree during a rolling deploy: a claim only moves forward in time.
/// - `Every(interval)`: fires at every multiple of `interval` since the Unix epoch, so intervals
///   are aligned across instances (every 30 s fires at :00 and :30).
/// - `Cron(expr)`: fires at each wall-clock time the expression names, in its time zone (UTC
///   unless given); see [`Schedule::cron`] for the syntax and the daylight-saving rules.
///
/// Cron needs the `cron` feature (on by default); without it the crate carries neither
/// `croner` nor `chrono`/`chrono-tz`.
#[derive(Clone)]
#[non_exhaustive]
pub enum Schedule {
    /// A fixed interval, aligned to the epoch.
    Every(Duration),
    /// A cron expression in a time zone.
    #[cfg(feature = "cron")]
    Cron(Box<CronSchedule>),
}

impl Schedule {
    /// The IANA zone of a cron schedule; `None` for an interval.
    pub fn time_zone(&self) -> Option<&str> {
        match self {
            Self::Every(_) => None,
            #[cfg(feature = "cron")]
            Self::Cron(c) => Some(c.time_zone()),
        }
    }

    /// A fixed interval of at least 1 ms.
    pub fn every(interval: Duration) -> Result<Self, ScheduleError> {
        if interval < Duration::from_millis(1) {
            return Err(ScheduleError::ZeroInterval);
        }
        Ok(Self::Every(interval))
    }

    /// A cron expression, as crontab writes it, in UTC or in the zone of a `CRON_TZ=ZONE`
    /// prefix (`"CRON_TZ=Europe/Berlin 0 3 * * *"`).
    ///
    /// - Five fields: `minute hour day-of-month month day-of-week`; or six, with seconds
    ///   first: `second minute hour day-of-month month day-of-week` (a seventh, the year, may
    ///   follow).
    /// - In a field: `*`, numbers, ranges `1-5`, lists `1,15`, steps `*/15`, `0-30/10` and
    ///   `5/15` (from 5 to the field's end); months `JAN`-`DEC` and weekdays `SUN`-`SAT`
    ///   (either case). Day-of-week takes 0-7, 0 and 7 both Sunday. `?` is `*` in the two day
    ///   fields; `L` in day-of-month is the month's last day; `FRI#2` is the month's second
    ///   Friday and `FRIL` (or `5L`) its last.
    /// - Day-of-month and day-of-week: when both are restricted, a day matches if **either**
    ///   matches, as in crontab: `0 0 1,15 * MON` fires on the 1st, the 15th and every
    ///   Monday. When one is unrestricted, only the other counts. A day field is unrestricted
    ///   when it allows every day, however written: `*`, `?`, `1-31`, `MON-SUN`, `0-7`.
    ///   (`*/2` restricts; Vixie cron treats any field starting with `*` as unrestricted.)
    /// - Macros: `@yearly` (`@annually`), `@monthly`, `@weekly` (Sunday 00:00), `@daily`
    ///   (`@midnight`), `@hourly`. `@reboot` is refused: it names no time that replicas
    ///   share.
    ///
    /// **Daylight saving.** The expression names wall-clock times in its zone; each fires at
    /// most once, at an instant:
    /// - a wall time skipped by a change forward (02:30 on the night Berlin goes from 02:00 to
    ///   03:00) fires once, at the change (03:00 new time); several skipped wall times fire
    ///   once together;
    /// - a wall time that occurs twice when the clock goes back fires once, at its first
    ///   occurrence. This holds for every expression: `*/15 * * * *` fires at 02:00, 02:15,
    ///   02:30 and 02:45 before the change and not again in the repeated hour. A job that must
    ///   keep real-time spacing through the change belongs in UTC or on [`Schedule::every`],
    ///   which daylight saving never affects.
    ///
    /// Slots stay instants (ms since the epoch), strictly increasing, and the same on every
    /// replica whatever its host's zone: the zone rules are the IANA database compiled into
    /// the binary (`chrono-tz`), and the host's zone is never read.
    ///
    /// ```
    /// use leasehold::Schedule;
    ///
    /// let nightly = Schedule::cron("CRON_TZ=Europe/Berlin 30 2 * * *")?;
    /// // 2027-03-28, the night Berlin skips 02:00-03:00: 02:30 fires at the change,
    /// // 03:00 CEST (01:00 UTC).
    /// let before = 1_806_184_800_000; // 2027-03-27T22:00:00Z
    /// assert_eq!(nightly.next_after(before), Some(1_806_195_600_000));
    /// # Ok::<(), leasehold::ScheduleError>(())
    /// ```
    #[cfg(feature = "cron")]
    pub fn cron(expr: &str) -> Result<Self, ScheduleError> {
        Self::checked(CronSchedule::parse(expr, None)?)
    }

    /// A cron expression (as [`Schedule::cron`] takes it) in the time zone named `zone`, an
    /// IANA name such as `Europe/Berlin`. A `CRON_TZ=` prefix in `expr` must name the same
    /// zone.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::{LeaseName, Schedule, Task, TaskContext};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let schedule = Schedule::cron_in("0 3 * * *", "America/New_York")?; // 03:00 in New York
    /// let task = Task::new(LeaseName::new("nightly-report")?, schedule, |_ctx: TaskContext| async {
    ///     Ok::<(), std::io::Error>(())
    /// });
    /// # let _ = task;
    /// assert!(matches!(
    ///     Schedule::cron_in("0 3 * * *", "Europe/Berln"),
    ///     Err(leasehold::ScheduleError::UnknownZone { .. })
    /// ));
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cron")]
    pub fn cron_in(expr: &str, zone: &str) -> Result<Self, ScheduleError> {
        Self::checked(CronSchedule::parse(expr, Some(zone))?)
    }

    #[cfg(feature = "cron")]
    fn checked(cron: CronSchedule) -> Result<Self, ScheduleError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        if cron.next_after_secs(now).is_none() {
            return Err(ScheduleError::NeverFires(cron.expr().to_owned()));
        }
        Ok(Self::Cron(Box::new(cron)))
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
                // Firings are whole seconds: after `now_ms` means after its second.
                let at = cron.next_after_secs(i64::try_from(now_ms / 1000).ok()?)?;
                u64::try_from(at).ok()?.checked_mul(1000)
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
                let at = cron.latest_at_or_before_secs(i64::try_from(now_ms / 1000).ok()?)?;
                u64::try_from(at).ok()?.checked_mul(1000)
            }
        }
    }

    /// The longest a firing may come before `slot` and still be for it: a second, or a quarter
    /// of the interval from the slot before, whichever is shorter. An application's timer on a
    /// host whose clock runs a little ahead of the store's fires that early.
    pub fn early_tolerance(&self, slot: u64) -> Duration {
        let period = self
            .latest_at_or_before(slot.saturating_sub(1))
            .map_or(u64::MAX, |before| slot - before);
        Duration::from_millis((period / 4).min(1000))
    }

    /// The slot a firing at `now_ms` (store clock) is for, and how long until it starts: the
    /// slot about to start if it starts within [`early_tolerance`](Self::early_tolerance),
    /// else the latest one at or before `now_ms` (zero). `None` before the first slot.
    pub fn slot_meant(&self, now_ms: u64) -> Option<(u64, Duration)> {
        if let Some(next) = self.next_after(now_ms) {
            let starts_in = Duration::from_millis(next - now_ms);
            if starts_in <= self.early_tolerance(next) {
                return Some((next, starts_in));
            }
        }
        Some((self.latest_at_or_before(now_ms)?, Duration::ZERO))
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
            Self::Cron(c) => write!(f, "cron {:?}", c.expr()),
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
