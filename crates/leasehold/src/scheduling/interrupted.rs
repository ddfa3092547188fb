//! Runs that were cut off, and run again: a run whose instance went away mid-run (killed, or
//! stopped answering: its record still says `running` under a tenure that is gone), or that was
//! told to stop because its lease or leadership ended or a shutdown's drain ran out (its record
//! says `cancelled`, not for the timeout). Such a slot started and did not finish; it is not a
//! missed slot. Unless the task says [`OnInterrupt::Skip`](crate::scheduling::policy::OnInterrupt::Skip), the instance that next holds the
//! task runs it once more, as attempt n + 1, right after the slot it was granted: at least once
//! for interrupted runs, the fencing token telling the first attempt's writes from the next's.
//!
//! The records are the run history's (each gated run's start is written before the job starts,
//! so a run killed at once is still found). Only the history the store kept is looked at, and
//! only runs that started within the task's catch-up window ([`rerun_window`]); a slot is tried at most
//! [`EXTRA_ATTEMPTS`] times beyond the task's retries, so a job that kills its instance each
//! time does not go round the fleet for ever.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::scheduling::history::{Outcome, RecordTrigger, RunOutcome, RunRecord};
use crate::scheduling::policy::CatchUp;
use crate::store::token::FencingToken;

/// How long after it started a cut-off run is still run again when the task's catch-up policy
/// gives no window (`skip`): a cut-off slot is not a missed one, so it is run again all the same.
pub const RERUN_WINDOW: Duration = Duration::from_secs(60 * 60);

/// How long after it started a cut-off run of a task with catch-up policy `catch_up` is still
/// run again: the catch-up window (a slot too old to catch up is too old to run again), or
/// [`RERUN_WINDOW`] for `skip`.
pub fn rerun_window(catch_up: CatchUp) -> Duration {
    match catch_up {
        CatchUp::Skip => RERUN_WINDOW,
        CatchUp::Latest { window } | CatchUp::All { window, .. } => window,
    }
}

/// How many attempts beyond its retries a slot gets for interruptions.
pub const EXTRA_ATTEMPTS: u32 = 2;

/// The most cut-off slots run again after one granted slot.
pub const MAX_RERUNS: usize = 3;

/// How many of the newest history entries are looked through.
pub(crate) const LOOKED_AT: usize = 12;

/// A slot to run again, and as which attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rerun {
    /// The slot.
    pub slot: u64,
    /// Its attempt number (the cut-off one's, plus one).
    pub attempt: u32,
    /// What started the slot's first run (recorded again with the new attempt).
    pub trigger: RecordTrigger,
}

/// What a look through the history found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    /// The slots to run again, oldest first, at most [`MAX_RERUNS`].
    pub reruns: Vec<Rerun>,
    /// A run still recorded `running` by an instance that is still live: it may yet record its
    /// end (a store that was down when it ended), so it is looked at again later.
    pub deferred: bool,
}

/// The slots among `records` (a task's newest history entries) whose newest attempt was cut off
/// and which may be run again now: slots before `granted` (the slot the caller holds the task's
/// lease for, with `held`), started within `window` of `now_ms`, with attempts left. A
/// run still recorded `running` counts as cut off once its instance is gone: not `is_live`
/// (the caller itself, holding the lease now, is not running it).
pub(crate) fn cut_off(
    records: &[RunRecord],
    granted: u64,
    held: FencingToken,
    now_ms: u64,
    window: Duration,
    retries: u32,
    is_live: impl Fn(&str) -> bool,
) -> Found {
    let oldest = now_ms.saturating_sub(u64::try_from(window.as_millis()).unwrap_or(u64::MAX));
    let most = 1 + retries.saturating_add(EXTRA_ATTEMPTS);
    // Each slot's newest attempt.
    let mut newest: BTreeMap<u64, &RunRecord> = BTreeMap::new();
    for record in records {
        let (Some(slot), Some(trigger)) = (record.slot, record.trigger) else {
            continue;
        };
        if slot >= granted
            || matches!(trigger, RecordTrigger::Manual | RecordTrigger::Backfill)
            || matches!(record.outcome, RunOutcome::Missed { .. })
        {
            continue;
        }
        let entry = newest.entry(slot).or_insert(record);
        if record.attempt() > entry.attempt() {
            *entry = record;
        }
    }
    let mut found = Found::default();
    for (slot, record) in newest {
        let started = record.started_ms.unwrap_or_default();
        if started < oldest || record.attempt() >= most || !was_cut_off(record, held) {
            continue;
        }
        if record.outcome == RunOutcome::Running && is_live(&record.holder) {
            found.deferred = true;
            continue;
        }
        if found.reruns.len() < MAX_RERUNS {
            found.reruns.push(Rerun {
                slot,
                attempt: record.attempt() + 1,
                trigger: record.trigger.unwrap_or(RecordTrigger::Timer),
            });
        }
    }
    found
}

/// Whether any of `records` is a run recorded `running` under a tenure before `held`, by
/// another instance than `me`: only then does whether that instance is live matter.
pub(crate) fn running_elsewhere(records: &[RunRecord], held: FencingToken, me: &str) -> bool {
    records
        .iter()
        .any(|r| r.holder != me && r.outcome == RunOutcome::Running && was_cut_off(r, held))
}

/// Whether `record`'s run was cut off, seen by the holder of the task's lease with `held`: still
/// `running` under an earlier tenure, or told to stop for anything but its timeout or a newer
/// slot replacing it (overlap policy `replace`).
fn was_cut_off(record: &RunRecord, held: FencingToken) -> bool {
    match record.outcome {
        RunOutcome::Running => record.token.is_some_and(|token| token < held),
        _ => {
            record.replaced_by.is_none()
                && matches!(
                    record.result(),
                    Some(Outcome::Cancelled | Outcome::Interrupted)
                )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::policy::OnInterrupt;

    const MIN: u64 = 60_000;
    const NOW: u64 = 1_800_000_000_000;

    fn run(slot: u64, attempt: u32, token: u64, outcome: RunOutcome) -> RunRecord {
        let mut record = RunRecord::started(
            Some(slot),
            RecordTrigger::Timer,
            "host:1:a",
            Some(FencingToken(token)),
            slot,
            None,
        );
        record.attempt = (attempt > 1).then_some(attempt);
        match outcome {
            RunOutcome::Running => record,
            outcome => record.ended(slot + 1000, outcome),
        }
    }

    fn gone(_: &str) -> bool {
        false
    }

    fn cancelled(why: &str) -> RunOutcome {
        RunOutcome::Cancelled { why: why.into() }
    }

    #[test]
    fn a_run_still_running_under_an_older_tenure_is_run_again_as_the_next_attempt() {
        let records = [
            run(NOW - MIN, 1, 7, RunOutcome::Running),
            run(NOW - 2 * MIN, 1, 6, RunOutcome::Ok),
        ];
        let again = cut_off(&records, NOW, FencingToken(8), NOW, RERUN_WINDOW, 0, gone).reruns;
        assert_eq!(
            again,
            [Rerun {
                slot: NOW - MIN,
                attempt: 2,
                trigger: RecordTrigger::Timer
            }]
        );
    }

    #[test]
    fn only_the_newest_attempt_of_a_slot_counts() {
        let slot = NOW - MIN;
        let mut records = vec![
            run(slot, 1, 7, RunOutcome::Running),
            run(slot, 2, 8, RunOutcome::Ok),
        ];
        assert!(
            cut_off(&records, NOW, FencingToken(9), NOW, RERUN_WINDOW, 0, gone)
                .reruns
                .is_empty()
        );
        records[1] = run(slot, 2, 8, cancelled("task lease expiring"));
        assert_eq!(
            cut_off(&records, NOW, FencingToken(9), NOW, RERUN_WINDOW, 0, gone).reruns[0].attempt,
            3
        );
    }

    #[test]
    fn what_ended_on_its_own_or_at_its_timeout_is_not_run_again() {
        let slot = NOW - MIN;
        let mut timed_out = run(slot, 1, 7, cancelled("timeout reached (1s)"));
        timed_out.result = Some(Outcome::TimedOut);
        // Cancelled because a newer slot replaced it (overlap replace): ended on purpose.
        let mut replaced = run(
            slot,
            1,
            7,
            cancelled("replaced by the slot at 1 (overlap replace)"),
        );
        replaced.replaced_by = Some(slot + MIN);
        for record in [
            replaced,
            run(slot, 1, 7, RunOutcome::Ok),
            run(slot, 1, 7, RunOutcome::Failed { error: "x".into() }),
            run(slot, 1, 7, RunOutcome::Panicked),
            timed_out,
        ] {
            assert!(
                cut_off(
                    std::slice::from_ref(&record),
                    NOW,
                    FencingToken(8),
                    NOW,
                    RERUN_WINDOW,
                    0,
                    gone
                )
                .reruns
                .is_empty(),
                "{record:?}"
            );
        }
        // A running record of the tenure the caller holds is its own run, going on.
        assert!(
            cut_off(
                &[run(slot, 1, 8, RunOutcome::Running)],
                NOW,
                FencingToken(8),
                NOW,
                RERUN_WINDOW,
                0,
                gone
            )
            .reruns
            .is_empty()
        );
    }

    #[test]
    fn stopped_for_a_lease_or_a_drain_is_run_again_and_so_is_an_abort() {
        for outcome in [
            cancelled("task lease expiring"),
            cancelled("shutdown: drain over"),
            RunOutcome::Aborted,
        ] {
            let records = [run(NOW - MIN, 1, 7, outcome.clone())];
            assert_eq!(
                cut_off(&records, NOW, FencingToken(8), NOW, RERUN_WINDOW, 0, gone)
                    .reruns
                    .len(),
                1,
                "{outcome:?}"
            );
        }
    }

    #[test]
    fn old_runs_later_slots_manual_runs_and_spent_attempts_are_left() {
        let day = u64::try_from(RERUN_WINDOW.as_millis()).unwrap();
        let old = run(NOW - day - MIN, 1, 5, RunOutcome::Running);
        let later = run(NOW, 1, 5, RunOutcome::Running);
        let mut manual = run(NOW - MIN, 1, 5, RunOutcome::Running);
        manual.trigger = Some(RecordTrigger::Manual);
        let spent = run(NOW - 2 * MIN, 1 + EXTRA_ATTEMPTS, 5, RunOutcome::Running);
        let records = [old, later, manual, spent.clone()];
        assert!(
            cut_off(&records, NOW, FencingToken(8), NOW, RERUN_WINDOW, 0, gone)
                .reruns
                .is_empty()
        );
        // Retries leave room for as many more.
        assert_eq!(
            cut_off(&[spent], NOW, FencingToken(8), NOW, RERUN_WINDOW, 1, gone).reruns[0].attempt,
            4
        );
    }

    #[test]
    fn the_window_is_the_catch_up_window_or_an_hour_without_one() {
        let window = rerun_window(CatchUp::All {
            window: Duration::from_secs(600),
            max: 5,
        });
        assert_eq!(window, Duration::from_secs(600));
        assert_eq!(rerun_window(CatchUp::Skip), RERUN_WINDOW);
        let inside = [run(NOW - 9 * MIN, 1, 7, RunOutcome::Running)];
        let outside = [run(NOW - 11 * MIN, 1, 7, RunOutcome::Running)];
        let found = |records: &[RunRecord]| {
            cut_off(records, NOW, FencingToken(8), NOW, window, 0, gone)
                .reruns
                .len()
        };
        assert_eq!((found(&inside), found(&outside)), (1, 0));
    }

    #[test]
    fn several_cut_off_slots_run_oldest_first_and_at_most_a_few() {
        let records: Vec<_> = (1..=5)
            .map(|i| run(NOW - i * MIN, 1, 7, RunOutcome::Running))
            .collect();
        let again = cut_off(&records, NOW, FencingToken(8), NOW, RERUN_WINDOW, 0, gone).reruns;
        let slots: Vec<u64> = again.iter().map(|r| r.slot).collect();
        assert_eq!(slots, [NOW - 5 * MIN, NOW - 4 * MIN, NOW - 3 * MIN]);
    }

    #[test]
    fn a_run_recorded_running_by_an_instance_still_live_waits_for_its_end() {
        let records = [run(NOW - MIN, 1, 7, RunOutcome::Running)];
        let live = |holder: &str| holder == "host:1:a";
        let found = cut_off(&records, NOW, FencingToken(8), NOW, RERUN_WINDOW, 0, live);
        assert_eq!(
            found,
            Found {
                reruns: vec![],
                deferred: true
            }
        );
        assert!(running_elsewhere(&records, FencingToken(8), "host:2:b"));
        assert!(!running_elsewhere(&records, FencingToken(8), "host:1:a"));
        // What it recorded once it was cancelled is not waited for.
        let records = [run(NOW - MIN, 1, 7, cancelled("task lease expiring"))];
        let found = cut_off(&records, NOW, FencingToken(8), NOW, RERUN_WINDOW, 0, live);
        assert_eq!((found.reruns.len(), found.deferred), (1, false));
    }

    #[test]
    fn the_policy_parses_its_two_words_and_nothing_else() {
        assert_eq!("rerun".parse(), Ok(OnInterrupt::Rerun));
        assert_eq!("skip".parse(), Ok(OnInterrupt::Skip));
        assert!(
            "\u{1b}[2J"
                .parse::<OnInterrupt>()
                .unwrap_err()
                .contains("\\u{1b}")
        );
    }
}
