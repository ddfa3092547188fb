//! Retries a sidecar owes its ticked tasks: the next attempt of a failed or timed-out run (the
//! task's `retries`, decided by the core's [`TaskTicks::next_attempt`]). A tick of the task
//! whose own slot already ran takes the oldest one that is due, under the task lease (so never
//! beside another run of the task), with trigger `retry` and its attempt number.
//!
//! Kept in this sidecar's memory: a retry owed here is not run if this sidecar stops (its
//! failed attempt stays in the history with the retry it was due). Runs cut off are not kept
//! here: they are looked for in the history, under the task lease, each time.
//!
//! [`TaskTicks::next_attempt`]: leasehold::lifecycle::TaskTicks::next_attempt

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use leasehold::LeaseName;
use leasehold::history::RecordTrigger;

/// The most tasks with runs owed: beyond it a new one is dropped (and logged), so a sidecar
/// ticked for ever more task names does not grow without bound.
const MAX_TASKS: usize = 10_000;
/// The most retries owed to one task: its slot's, and the next slot's if that one failed
/// before the first was given up.
const MAX_PER_TASK: usize = 2;

/// A run owed to a task (or, passed on within a tick, a cut-off slot to run again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwedRun {
    pub(crate) slot: u64,
    pub(crate) attempt: u32,
    /// What started the slot's first run (recorded again with the new attempt).
    pub(crate) trigger: RecordTrigger,
    /// Not before this (store clock, ms): the retry's backoff.
    pub(crate) from_ms: u64,
    /// Given up at this: the slot after (a retry never runs past it).
    pub(crate) until_ms: u64,
}

/// What a tick finds owed to its task.
pub(crate) enum Owed {
    Nothing,
    /// The oldest run owed is not due yet: in this many ms.
    Waits(OwedRun, u64),
    /// Due now: taken (put it back if it cannot run now).
    Due(OwedRun),
}

#[derive(Default)]
pub(crate) struct OwedRuns(Mutex<HashMap<LeaseName, VecDeque<OwedRun>>>);

impl OwedRuns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseName, VecDeque<OwedRun>>> {
        // Values are replaced whole: a poisoned lock is still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Owes `task` `run`, replacing an older attempt of its slot; the oldest slot goes first.
    pub(crate) fn owe(&self, task: &LeaseName, run: OwedRun, now_ms: u64) {
        let mut owed = self.lock();
        owed.retain(|_, runs| {
            runs.retain(|r| r.until_ms > now_ms);
            !runs.is_empty()
        });
        if owed.len() >= MAX_TASKS && !owed.contains_key(task) {
            tracing::warn!(task = %task, slot = run.slot, attempt = run.attempt, "too many tasks with runs owed: this one is not kept");
            return;
        }
        let runs = owed.entry(task.clone()).or_default();
        runs.retain(|r| r.slot != run.slot);
        if runs.len() >= MAX_PER_TASK {
            return;
        }
        let at = runs
            .iter()
            .position(|r| r.slot > run.slot)
            .unwrap_or(runs.len());
        runs.insert(at, run);
    }

    /// What `task` is owed at `now_ms` (store clock); runs past their time are forgotten.
    pub(crate) fn take(&self, task: &LeaseName, now_ms: u64) -> Owed {
        let mut owed = self.lock();
        let Some(runs) = owed.get_mut(task) else {
            return Owed::Nothing;
        };
        runs.retain(|r| {
            let kept = r.until_ms > now_ms;
            if !kept {
                tracing::warn!(task = %task, slot = r.slot, attempt = r.attempt, "owed run given up: no tick took it before the slot after it");
            }
            kept
        });
        let found = match runs.front().copied() {
            None => Owed::Nothing,
            Some(run) if run.from_ms > now_ms => Owed::Waits(run, run.from_ms - now_ms),
            Some(run) => {
                runs.pop_front();
                Owed::Due(run)
            }
        };
        if runs.is_empty() {
            owed.remove(task);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(slot: u64, attempt: u32, from_ms: u64, until_ms: u64) -> OwedRun {
        OwedRun {
            slot,
            attempt,
            trigger: RecordTrigger::Timer,
            from_ms,
            until_ms,
        }
    }

    #[test]
    fn the_oldest_slot_goes_first_after_its_wait_and_none_past_its_time() {
        let owed = OwedRuns::default();
        let task = LeaseName::new("mail").unwrap();
        owed.owe(&task, run(2000, 2, 2500, 4000), 2100);
        owed.owe(&task, run(1000, 2, 0, 90_000), 2100);
        assert!(matches!(owed.take(&task, 2200), Owed::Due(r) if r.slot == 1000));
        assert!(matches!(owed.take(&task, 2200), Owed::Waits(r, 300) if r.slot == 2000));
        // A newer attempt of a slot replaces the older one.
        owed.owe(&task, run(2000, 3, 2600, 4000), 2200);
        assert!(matches!(owed.take(&task, 2600), Owed::Due(r) if r.attempt == 3));
        owed.owe(&task, run(2000, 4, 3000, 4000), 2600);
        assert!(matches!(owed.take(&task, 4000), Owed::Nothing));
        assert!(owed.lock().is_empty());
    }
}
