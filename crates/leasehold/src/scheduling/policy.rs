//! A task's run policies: how long one attempt may take ([`RunPolicy::timeout`]), how a
//! failed or timed-out run is tried again ([`RunPolicy::retries`], [`Backoff`]), how far
//! each slot's start is spread ([`RunPolicy::jitter`]), and what a slot that falls while a run
//! is going does ([`RunPolicy::overlap`], [`Overlap`]). Values only:
//! the task's lifecycle decides with them ([`TaskTicks::next_attempt`]) and its driver acts,
//! so every driver retries alike.
//!
//! [`TaskTicks::next_attempt`]: crate::lifecycle::TaskTicks::next_attempt

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::scheduling::history::Outcome;
use crate::scheduling::schedule::Schedule;
use crate::store::name::LeaseName;

/// The most retries a task may ask for: more are taken as this many.
pub const MAX_RETRIES: u32 = 100;

/// How long a retry waits: `base` before the first, doubling with each further one up to `max`,
/// each wait then cut by a deterministic jitter to between half and all of it.
///
/// The jitter is derived from the task's name, the slot and the attempt, so every instance (and
/// every release) computes the same wait for the same attempt, and tasks failing together do
/// not all retry at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    /// The wait before the first retry, before jitter. Default 1 s.
    pub base: Duration,
    /// The longest wait, before jitter. Default 60 s (or `base`, if longer).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), None)
    }
}

impl Backoff {
    /// The default cap when none is given.
    pub const DEFAULT_MAX: Duration = Duration::from_secs(60);

    /// Waits from `base` up to `max` (default [`DEFAULT_MAX`](Self::DEFAULT_MAX)); a `max`
    /// below `base` is taken as `base`.
    pub fn new(base: Duration, max: Option<Duration>) -> Self {
        Self {
            base,
            max: max.unwrap_or(Self::DEFAULT_MAX).max(base),
        }
    }

    /// The wait before attempt `attempt` (2 is the first retry) of `task`'s run of `slot`
    /// (`None` for a run without one): `base × 2^(attempt − 2)`, at most `max`, then jittered to
    /// `[w/2, w)` in whole milliseconds.
    pub fn delay(&self, task: &LeaseName, slot: Option<u64>, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(2).min(63);
        let base = millis(self.base);
        let wait = base.saturating_mul(1u64 << doublings).min(millis(self.max));
        let half = wait / 2;
        let spread = wait - half;
        if spread == 0 {
            return Duration::from_millis(wait);
        }
        let hash = stable_hash(
            task.as_str()
                .bytes()
                .chain([0xff])
                .chain(slot.unwrap_or(u64::MAX).to_le_bytes())
                .chain(attempt.to_le_bytes()),
        );
        Duration::from_millis(half + hash % spread)
    }
}

/// How long a run may take and how often it is tried again. The default: no timeout, no retry
/// (a run takes as long as it takes, and a failure waits for the next slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RunPolicy {
    /// Each attempt's time limit: at it, the attempt's cancellation token is cancelled; an
    /// attempt that then ends is `timed-out` (one that ignores it is aborted a stop margin
    /// later, `timed-out` too).
    pub timeout: Option<Duration>,
    /// How many times a `failed` or `timed-out` attempt of a slot is tried again, at most
    /// [`MAX_RETRIES`].
    pub retries: u32,
    /// The waits between attempts.
    pub backoff: Backoff,
    /// At most how long each slot's start is put off, by an amount derived from the task's name
    /// and the slot ([`start_delay`](Self::start_delay)); `None`: slots start when due.
    pub jitter: Option<Duration>,
    /// What becomes of a run that was cut off (its instance went away, its lease or leadership
    /// ended, a drain ran out): run again by the next holder, or left
    /// ([`interrupted`](crate::scheduling::interrupted)).
    pub on_interrupt: OnInterrupt,
    /// What a slot that falls while a run of the task is going does.
    pub overlap: Overlap,
}

/// The most slots [`Overlap::BufferAll`] keeps waiting for the run going: a slot falling while
/// this many wait is skipped (recorded missed, reason `overlap`), so a job that is always
/// slower than its schedule does not build up an endless backlog.
pub const BUFFER_ALL_CAP: usize = 16;

/// What a slot that falls while a run of its task is going does (Kubernetes'
/// `concurrencyPolicy`, Temporal's overlap policy). The instance running the task decides, at
/// the slot's time; every slot is still claimed once, fleet-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overlap {
    /// The slot is skipped, recorded missed with reason `overlap` (the default; Kubernetes'
    /// `Forbid`, Temporal's `SKIP`).
    #[default]
    Skip,
    /// The slot runs once the run going ends; a further slot falling while one waits is
    /// skipped (Temporal's `BUFFER_ONE`).
    BufferOne,
    /// Every such slot runs, in order, once the runs before it ended, at most
    /// [`BUFFER_ALL_CAP`] waiting; beyond that they are skipped (Temporal's `BUFFER_ALL`).
    BufferAll,
    /// The run going is cancelled (its cancellation token; a command gets SIGTERM, then
    /// SIGKILL after its grace), recorded `cancelled` with what replaced it, and the slot runs
    /// once it stopped (Kubernetes' `Replace`, Temporal's `CANCEL_OTHER`).
    Replace,
    /// The slot runs beside the run going, holding a run lease of its own (its own fencing
    /// token and cancellation token); each slot still runs once (Kubernetes' `Allow`,
    /// Temporal's `ALLOW_ALL`).
    Allow,
}

impl Overlap {
    /// Every policy, in the order of [`as_str`](Self::as_str)'s list.
    pub const ALL: [Overlap; 5] = [
        Self::Skip,
        Self::BufferOne,
        Self::BufferAll,
        Self::Replace,
        Self::Allow,
    ];

    /// `skip`, `buffer-one`, `buffer-all`, `replace`, `allow`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::BufferOne => "buffer-one",
            Self::BufferAll => "buffer-all",
            Self::Replace => "replace",
            Self::Allow => "allow",
        }
    }

    /// How many slots may wait for the run going: 1 for `buffer-one` (and for `replace`, the
    /// one replacing it), [`BUFFER_ALL_CAP`] for `buffer-all`, none otherwise.
    pub fn waiting_cap(self) -> usize {
        match self {
            Self::BufferOne | Self::Replace => 1,
            Self::BufferAll => BUFFER_ALL_CAP,
            Self::Skip | Self::Allow => 0,
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A text that names no overlap policy ([`Overlap`]'s `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlapError {
    /// The text as given.
    pub text: String,
}

impl fmt::Display for OverlapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The text may come from a crontab or an HTTP request: shown escaped.
        write!(
            f,
            "`{}` is not an overlap policy: use skip, buffer-one, buffer-all, replace or allow",
            crate::store::text::visible(&self.text)
        )
    }
}

impl std::error::Error for OverlapError {}

impl FromStr for Overlap {
    type Err = OverlapError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| OverlapError { text: s.to_owned() })
    }
}

/// The most a slot's start is put off, whatever the jitter asked: a slot started later would
/// be taken for a late one (the catch-up policy decides a slot fired an hour after it).
pub const MAX_JITTER: Duration = Duration::from_secs(30 * 60);

impl RunPolicy {
    /// Each slot's start put off by up to `jitter` (`None`, or zero: none), the same amount on
    /// every instance for a given task and slot ([`start_delay`](Self::start_delay)).
    pub fn jitter(mut self, jitter: Option<Duration>) -> Self {
        self.jitter = jitter.filter(|j| !j.is_zero());
        self
    }

    /// How long after it is due `task`'s `slot` of `schedule` starts: an amount in
    /// `[0, jitter)` derived from the task's name and the slot, so that every replica computes
    /// the same one and a fleet's tasks on one schedule (every hour at :00) do not all start at
    /// once. Never as much as half the way to the next slot, nor [`MAX_JITTER`].
    pub fn start_delay(&self, task: &LeaseName, schedule: &Schedule, slot: u64) -> Duration {
        let Some(jitter) = self.jitter else {
            return Duration::ZERO;
        };
        let interval = schedule
            .next_after(slot)
            .map_or(u64::MAX, |next| next.saturating_sub(slot));
        let room = millis(jitter).min(interval / 2).min(millis(MAX_JITTER));
        if room == 0 {
            return Duration::ZERO;
        }
        let hash = stable_hash(
            task.as_str()
                .bytes()
                .chain([0xfe])
                .chain(slot.to_le_bytes()),
        );
        Duration::from_millis(hash % room)
    }

    /// With a time limit per attempt (`None`, or zero: none).
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout.filter(|t| !t.is_zero());
        self
    }

    /// With `overlap` for a slot that falls while a run is going.
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = overlap;
        self
    }

    /// With `on_interrupt` for a run that was cut off.
    pub fn on_interrupt(mut self, on_interrupt: OnInterrupt) -> Self {
        self.on_interrupt = on_interrupt;
        self
    }

    /// With `retries` retries (at most [`MAX_RETRIES`]).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries.min(MAX_RETRIES);
        self
    }

    /// With `backoff` between attempts.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// What follows attempt `attempt` of `task`'s run of `slot`, which ended `outcome` at
    /// `now_ms` (store clock): another attempt for a `failed` or `timed-out` one while retries
    /// are left, unless it would start at or after the schedule's next slot (a retry never
    /// runs beside, or instead of, the next slot's run). A run without a slot (a manual one) is
    /// not retried: whoever asked for it is answered with its outcome.
    pub fn next_attempt(
        &self,
        task: &LeaseName,
        schedule: &Schedule,
        slot: Option<u64>,
        attempt: u32,
        outcome: Outcome,
        now_ms: u64,
    ) -> NextAttempt {
        let Some(slot) = slot else {
            return NextAttempt::Done;
        };
        if !outcome.is_failure() || attempt > self.retries {
            return NextAttempt::Done;
        }
        let attempt = attempt + 1;
        let wait = self.backoff.delay(task, Some(slot), attempt);
        let starts = now_ms.saturating_add(millis(wait));
        match schedule.next_after(slot) {
            Some(next) if starts >= next => NextAttempt::Dropped { attempt, next },
            _ => NextAttempt::After { attempt, wait },
        }
    }
}

/// What follows an attempt ([`RunPolicy::next_attempt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NextAttempt {
    /// Nothing: the attempt succeeded, was not the job's failure, or was the last allowed.
    Done,
    /// Attempt `attempt` starts after `wait`.
    After {
        /// Its number (the first attempt is 1).
        attempt: u32,
        /// How long until it starts.
        wait: Duration,
    },
    /// Attempt `attempt` was due but would not start before the next slot, at `next`: it is
    /// dropped (and recorded so).
    Dropped {
        /// Its number.
        attempt: u32,
        /// The next slot.
        next: u64,
    },
}

/// A hash of `bytes` that every instance and every release computes alike: FNV-1a, finished
/// with splitmix64's mixer so that inputs differing in a few trailing bytes still spread.
/// (std's hasher is randomly seeded, or may change between releases.)
pub(crate) fn stable_hash(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What becomes of a run that was cut off: see [`interrupted`](crate::scheduling::interrupted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnInterrupt {
    /// The next holder runs the slot again (the default).
    #[default]
    Rerun,
    /// The slot is left as it ended.
    Skip,
}

impl OnInterrupt {
    /// `rerun` or `skip`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rerun => "rerun",
            Self::Skip => "skip",
        }
    }
}

impl fmt::Display for OnInterrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnInterrupt {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "rerun" => Ok(Self::Rerun),
            "skip" => Ok(Self::Skip),
            other => Err(format!(
                "`{}` is not an interrupt policy: use rerun or skip",
                other.escape_debug()
            )),
        }
    }
}

/// What happens to slots that no instance ran when they were due (a crashed leader's lease was
/// running out, every instance was down, the store was down under fail-closed, a run
/// overlapped). Checked by the instance that wins leadership (or, without a leader group, on
/// start and when the store answers again), against the highest claimed slot on the store's
/// clock. Catch-up runs are gated and claimed like timer runs, one at a time and in order; since
/// slot claims only move forward, no slot runs twice, even when an old leader comes back.
///
/// Missed slots are recorded in the run history whatever the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CatchUp {
    /// Missed slots are not run. The default for interval schedules: the next tick comes soon.
    Skip,
    /// The most recent missed slot runs once, if it is younger than `window`. The default for
    /// cron schedules, with a one-hour window: a nightly job whose leader died a second before
    /// it was due runs as soon as the next leader is elected.
    Latest {
        /// How old a missed slot may be and still run.
        window: Duration,
    },
    /// Every missed slot younger than `window` runs, oldest first, at most `max` of them (the
    /// newest ones).
    All {
        /// How old a missed slot may be and still run.
        window: Duration,
        /// The most slots one catch-up runs.
        max: usize,
    },
}

impl CatchUp {
    /// `skip`, `latest` or `all`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Latest { .. } => "latest",
            Self::All { .. } => "all",
        }
    }

    /// The default for a schedule: `Skip` for intervals, `Latest` within an hour for cron.
    pub fn default_for(schedule: &Schedule) -> Self {
        match schedule {
            Schedule::Every(_) => Self::Skip,
            #[cfg(feature = "cron")]
            Schedule::Cron(_) => Self::Latest {
                window: Duration::from_secs(3600),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> LeaseName {
        LeaseName::new("sweep").unwrap()
    }

    #[test]
    fn start_delays_are_the_same_everywhere_spread_and_short_of_half_the_interval() {
        let every_minute = Schedule::every(Duration::from_secs(60)).unwrap();
        let p = RunPolicy::default().jitter(Some(Duration::from_secs(45)));
        let delays: Vec<Duration> = (1..=50)
            .map(|i| p.start_delay(&task(), &every_minute, i * 60_000))
            .collect();
        // Half the way to the next slot at most, though 45 s were asked.
        assert!(
            delays.iter().all(|d| *d < Duration::from_secs(30)),
            "{delays:?}"
        );
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 40, "spread: {delays:?}");
        // Every instance computes the same.
        let again: Vec<Duration> = (1..=50)
            .map(|i| p.start_delay(&task(), &every_minute, i * 60_000))
            .collect();
        assert_eq!(delays, again);
        // Other tasks on the same slot start at other times.
        let others: std::collections::HashSet<_> = (0..20)
            .map(|i| {
                let name = LeaseName::new(format!("sweep-{i}")).unwrap();
                p.start_delay(&name, &every_minute, 60_000)
            })
            .collect();
        assert!(others.len() > 15, "{others:?}");
        // None asked, or none possible: none.
        assert_eq!(
            RunPolicy::default().start_delay(&task(), &every_minute, 60_000),
            Duration::ZERO
        );
        let daily = Schedule::every(Duration::from_secs(86_400)).unwrap();
        let long = RunPolicy::default().jitter(Some(Duration::from_secs(86_400)));
        assert!(long.start_delay(&task(), &daily, 86_400_000) < MAX_JITTER);
    }

    #[test]
    fn overlap_policies_read_their_words_and_refuse_others_escaped() {
        for overlap in Overlap::ALL {
            assert_eq!(overlap.as_str().parse::<Overlap>(), Ok(overlap));
        }
        assert_eq!(Overlap::default(), Overlap::Skip);
        let error = "Replace\u{202e}\n".parse::<Overlap>().unwrap_err();
        let shown = error.to_string();
        assert!(shown.contains("Replace\\u{202e}\\n"), "{shown}");
        assert!(
            !shown.contains('\n') && !shown.contains('\u{202e}'),
            "{shown}"
        );
        assert_eq!(Overlap::BufferAll.waiting_cap(), BUFFER_ALL_CAP);
        assert_eq!(Overlap::BufferOne.waiting_cap(), 1);
    }

    #[test]
    fn waits_double_up_to_the_cap_and_stay_within_their_jitter() {
        let b = Backoff::new(Duration::from_millis(100), Some(Duration::from_millis(350)));
        for (attempt, full) in [(2, 100), (3, 200), (4, 350), (5, 350), (90, 350)] {
            let d = b.delay(&task(), Some(60_000), attempt).as_millis() as u64;
            assert!(full / 2 <= d && d < full, "attempt {attempt}: {d} ms");
            assert_eq!(
                b.delay(&task(), Some(60_000), attempt).as_millis() as u64,
                d
            );
        }
        let spread: std::collections::HashSet<_> = (0..20)
            .map(|slot| b.delay(&task(), Some(slot * 1000), 2))
            .collect();
        assert!(spread.len() > 5, "jitter differs between slots: {spread:?}");
    }

    #[test]
    fn only_failures_of_slots_are_retried_and_never_past_the_next_slot() {
        let every = Schedule::every(Duration::from_secs(10)).unwrap();
        let policy = RunPolicy::default()
            .retries(2)
            .backoff(Backoff::new(Duration::from_secs(1), None));
        let next = |attempt, outcome, now| {
            policy.next_attempt(&task(), &every, Some(10_000), attempt, outcome, now)
        };
        assert!(matches!(
            next(1, Outcome::Failed, 10_100),
            NextAttempt::After { attempt: 2, .. }
        ));
        assert!(matches!(
            next(2, Outcome::TimedOut, 10_100),
            NextAttempt::After { attempt: 3, .. }
        ));
        assert_eq!(next(3, Outcome::Failed, 10_100), NextAttempt::Done);
        assert_eq!(next(1, Outcome::Ok, 10_100), NextAttempt::Done);
        assert_eq!(next(1, Outcome::Cancelled, 10_100), NextAttempt::Done);
        assert_eq!(
            next(1, Outcome::Failed, 19_900),
            NextAttempt::Dropped {
                attempt: 2,
                next: 20_000
            }
        );
        assert_eq!(
            policy.next_attempt(&task(), &every, None, 1, Outcome::Failed, 0),
            NextAttempt::Done
        );
    }
}
