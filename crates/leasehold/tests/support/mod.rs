//! Shared pieces of the engine's tests: a run ledger and its checks. Faults are injected with the
//! library's own wrapper, `leasehold::faults::FaultyStore`.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{FencingToken, LeaseName};
use tokio::time::Instant;

/// Runs recorded by a test job: (holder, slot, trigger, token, start, end).
pub type Ledger = Arc<Mutex<Vec<Run>>>;

/// One recorded run.
#[derive(Debug, Clone)]
pub struct Run {
    pub holder: String,
    pub slot: Option<u64>,
    pub trigger: leasehold::Trigger,
    pub token: Option<FencingToken>,
    pub start: Instant,
    pub end: Instant,
    pub cancelled: bool,
}

/// A task named `name` on `schedule` whose job works for `work` (or until cancelled) and records
/// its run in `ledger`.
pub fn recorder(
    ledger: &Ledger,
    name: &str,
    schedule: leasehold::Schedule,
    work: Duration,
) -> leasehold::Task {
    let ledger = ledger.clone();
    leasehold::Task::new(
        LeaseName::new(name).unwrap(),
        schedule,
        move |ctx: leasehold::TaskContext| {
            let ledger = ledger.clone();
            async move {
                let start = Instant::now();
                let cancelled = tokio::select! {
                    () = tokio::time::sleep(work) => false,
                    () = ctx.cancel.cancelled() => true,
                };
                ledger.lock().unwrap().push(Run {
                    holder: ctx.holder.to_string(),
                    slot: ctx.slot,
                    trigger: ctx.trigger,
                    token: ctx.token,
                    start,
                    end: Instant::now(),
                    cancelled,
                });
                Ok::<(), std::io::Error>(())
            }
        },
    )
}

/// Timer-run slots in the ledger, sorted.
pub fn timer_slots(ledger: &Ledger) -> Vec<u64> {
    let mut v: Vec<u64> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.trigger == leasehold::Trigger::Timer)
        .filter_map(|r| r.slot)
        .collect();
    v.sort_unstable();
    v
}

/// Panics if a slot appears twice.
pub fn assert_no_slot_twice(ledger: &Ledger) {
    let v = timer_slots(ledger);
    let mut dedup = v.clone();
    dedup.dedup();
    assert_eq!(v, dedup, "a slot ran twice");
}

/// Panics if two runs in `runs` overlapped in time (the task lease keeps them apart).
pub fn assert_no_overlap(runs: &[Run]) {
    for (i, r) in runs.iter().enumerate() {
        for o in &runs[i + 1..] {
            assert!(r.end <= o.start || o.end <= r.start, "overlap: {r:?} {o:?}");
        }
    }
}
