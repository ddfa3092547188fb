//! Backfill: past slots of a task run on purpose (`leasehold trigger NAME --slots FROM..TO`,
//! [`Fleet::backfill`](crate::fleet::Fleet::backfill), the sidecar's trigger endpoint). The
//! request travels in the task's control record like a manual trigger; the instance that takes
//! it runs, in slot order and one at a time, each slot of the range that has no `ok` run in
//! the task's history, as trigger `backfill`, each under the task lease and fenced by its token
//! ([`TaskTicks::backfill_next`](crate::lifecycle::TaskTicks::backfill_next)). The forward-only
//! slot claim is not moved: a backfill never stops a timer slot from running, and a slot it ran
//! is not run again because its `ok` run is in the history.

use crate::scheduling::history::{Outcome, RunRecord};
use crate::scheduling::schedule::Schedule;
use crate::store::catalog::SlotRange;

/// The most slots one backfill may span; a larger range is refused
/// ([`FleetError::TooManySlots`](crate::fleet::FleetError::TooManySlots)).
pub const MAX_BACKFILL_SLOTS: usize = 1000;

/// How many history entries are read to tell which slots ran ok: the most a task keeps
/// ([`MAX_HISTORY_SETTING`](crate::history::MAX_HISTORY_SETTING)).
pub(crate) const HISTORY_LOOKED_AT: usize = crate::scheduling::history::MAX_HISTORY_SETTING;

/// The slots of `schedule` in `range` (both ends included), oldest first; `Err(count)` when
/// there are more than [`MAX_BACKFILL_SLOTS`].
pub fn slots_in(schedule: &Schedule, range: SlotRange) -> Result<Vec<u64>, u64> {
    if range.to_ms < range.from_ms {
        return Ok(Vec::new());
    }
    // `firings_between` takes the slots after its first bound: a slot at `from_ms` is in.
    let mut slots = Vec::new();
    let after = match range.from_ms.checked_sub(1) {
        Some(after) => after,
        None => {
            if schedule.latest_at_or_before(0) == Some(0) {
                slots.push(0);
            }
            0
        }
    };
    let (count, newest) = schedule.firings_between(after, range.to_ms, MAX_BACKFILL_SLOTS + 1);
    let count = count + slots.len() as u64;
    if count > MAX_BACKFILL_SLOTS as u64 {
        return Err(count);
    }
    slots.extend(newest);
    Ok(slots)
}

/// Whether `records` (a task's history) hold an `ok` run of `slot`: a backfill does not run
/// it again. (A run still recorded `running` does not count: the backfill reads the history
/// while it holds the task lease, so such a run was cut off.)
pub fn ran_ok(records: &[RunRecord], slot: u64) -> bool {
    records
        .iter()
        .any(|r| r.slot == Some(slot) && r.trigger.is_some() && r.result() == Some(Outcome::Ok))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scheduling::history::{RecordTrigger, RunOutcome};

    fn range(from_ms: u64, to_ms: u64) -> SlotRange {
        SlotRange { from_ms, to_ms }
    }

    #[test]
    fn the_range_includes_both_ends_and_is_capped() {
        let every = Schedule::every(Duration::from_secs(60)).unwrap();
        assert_eq!(
            slots_in(&every, range(60_000, 180_000)),
            Ok(vec![60_000, 120_000, 180_000])
        );
        assert_eq!(slots_in(&every, range(60_001, 119_999)), Ok(vec![]));
        assert_eq!(slots_in(&every, range(0, 60_000)), Ok(vec![0, 60_000]));
        let max = MAX_BACKFILL_SLOTS as u64;
        assert_eq!(
            slots_in(&every, range(60_000, max * 60_000)).map(|s| s.len()),
            Ok(1000)
        );
        assert_eq!(
            slots_in(&every, range(60_000, (max + 1) * 60_000)),
            Err(max + 1)
        );
    }

    #[test]
    fn only_an_ok_run_of_the_slot_counts() {
        let run = |slot, outcome| {
            RunRecord::started(Some(slot), RecordTrigger::Timer, "a", None, slot, None)
                .ended(slot + 1, outcome)
        };
        let failed = RunOutcome::Failed { error: "x".into() };
        let records = vec![
            run(1_000, RunOutcome::Ok),
            run(2_000, failed),
            RunRecord::started(Some(3_000), RecordTrigger::Backfill, "a", None, 9, None),
            RunRecord::missed(4_000, 1, 4_000, crate::history::MissReason::NotClaimed, "a"),
        ];
        assert!(ran_ok(&records, 1_000));
        assert!(!ran_ok(&records, 2_000));
        assert!(!ran_ok(&records, 3_000));
        assert!(!ran_ok(&records, 4_000));
        assert!(!ran_ok(&records, 5_000));
    }
}
