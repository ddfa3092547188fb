//! A wall clock that steps (the store's clock, which is the host's for SQLite and the server's
//! for the others): forward, the slot due now runs on time as `timer` and the slots jumped over
//! are recorded as missed (not claimed, never "previous run still going") and follow the
//! catch-up policy, labelled catch-up; backward, nothing runs twice. On a paused clock, with the
//! step injected as an offset of the store's clock readings.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::history::{self, MissReason, RunOutcome, RunRecord};
use leasehold::{
    CatchUp, HolderId, LeaseConfig, LeaseName, Schedule, Scheduler, SchedulerHandle, Store, Trigger,
};
use support::{Ledger, assert_no_slot_twice, recorder};
use tokio::time::Instant;

const SEC: Duration = Duration::from_secs(1);
const STEP_MS: i64 = 60_000;

fn start(store: &FaultyStore, ledger: &Ledger, catch_up: CatchUp) -> SchedulerHandle {
    let task = recorder(
        ledger,
        "steps",
        Schedule::cron("*/10 * * * * *").unwrap(),
        SEC / 10,
    )
    .catch_up(catch_up);
    Scheduler::new(store.clone())
        .holder(HolderId::new("a").unwrap())
        .lease_config(LeaseConfig::new(SEC * 3))
        .task(task)
        .start(std::future::pending())
        .unwrap()
}

/// Runs until three slots ran, then steps the store's clock by `step_ms`; answers the slot the
/// timer was armed for when the clock stepped and the instant it was to fire.
async fn step_after_three_runs(
    store: &FaultyStore,
    ledger: &Ledger,
    step_ms: i64,
) -> (u64, Instant) {
    while ledger.lock().unwrap().len() < 3 {
        tokio::time::sleep(SEC / 10).await;
    }
    let now = store.now_millis().await.unwrap();
    let armed = now - now % 10_000 + 10_000;
    let fires_at = Instant::now() + Duration::from_millis(armed - now);
    store
        .faults
        .clock_offset_ms
        .fetch_add(step_ms, Ordering::SeqCst);
    (armed, fires_at)
}

async fn history(store: &FaultyStore) -> Vec<RunRecord> {
    history::read(store, &LeaseName::new("steps").unwrap(), 100)
        .await
        .unwrap()
}

fn misses(records: &[RunRecord]) -> Vec<(u64, u64, u64, MissReason)> {
    records
        .iter()
        .filter_map(|r| match r.outcome {
            RunOutcome::Missed {
                count,
                last_slot,
                reason,
            } => Some((r.slot?, count, last_slot, reason)),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_forward_step_runs_the_slot_due_now_on_time_and_records_the_ones_jumped_over() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    let _s = start(&store, &ledger, CatchUp::Skip);
    let (armed, fires_at) = step_after_three_runs(&store, &ledger, STEP_MS).await;
    tokio::time::sleep(SEC * 35).await;
    assert_no_slot_twice(&ledger);
    let due_now = armed + STEP_MS as u64;
    let runs = ledger.lock().unwrap().clone();
    // The slot due when the timer fired runs then, as timer.
    let first_after = runs
        .iter()
        .find(|r| r.slot.is_some_and(|s| s >= armed))
        .expect("a run after the step");
    assert_eq!(first_after.slot, Some(due_now), "{runs:?}");
    assert_eq!(first_after.trigger, Trigger::Timer);
    assert!(
        first_after.start.duration_since(fires_at) < SEC,
        "ran {:?} after its firing",
        first_after.start.duration_since(fires_at)
    );
    // No slot the clock jumped over ran.
    assert!(
        runs.iter()
            .all(|r| !r.slot.is_some_and(|s| (armed..due_now).contains(&s))),
        "{runs:?}"
    );
    // They are recorded as missed, not claimed (nothing was running).
    let misses = misses(&history(&store).await);
    assert_eq!(
        misses,
        [(armed, 6, due_now - 10_000, MissReason::NotClaimed)],
        "{misses:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn slots_jumped_over_follow_the_catch_up_policy_labelled_catch_up() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    let _s = start(
        &store,
        &ledger,
        CatchUp::Latest {
            window: Duration::from_secs(3600),
        },
    );
    let (armed, _) = step_after_three_runs(&store, &ledger, STEP_MS).await;
    tokio::time::sleep(SEC * 35).await;
    assert_no_slot_twice(&ledger);
    let due_now = armed + STEP_MS as u64;
    let after: Vec<_> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.slot.is_some_and(|s| s >= armed))
        .map(|r| (r.slot.unwrap(), r.trigger))
        .collect();
    // The newest slot jumped over, caught up; then the slot due now, as timer; then on.
    assert_eq!(
        after[..3],
        [
            (due_now - 10_000, Trigger::CatchUp),
            (due_now, Trigger::Timer),
            (due_now + 10_000, Trigger::Timer)
        ],
        "{after:?}"
    );
    let misses = misses(&history(&store).await);
    assert_eq!(
        misses,
        [(armed, 5, due_now - 20_000, MissReason::NotClaimed)],
        "{misses:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_backward_step_runs_nothing_twice_and_goes_on_once_the_clock_is_back() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    let _s = start(&store, &ledger, CatchUp::Skip);
    let (armed, _) = step_after_three_runs(&store, &ledger, -STEP_MS).await;
    let last_before = armed - 10_000;
    // The store's clock is a minute behind: the slots it shows again were claimed.
    tokio::time::sleep(SEC * 50).await;
    assert!(
        ledger
            .lock()
            .unwrap()
            .iter()
            .all(|r| r.slot.is_some_and(|s| s <= last_before)),
        "a slot ran again while the clock was behind"
    );
    // Once it is back past the last slot run, every slot runs once more.
    tokio::time::sleep(SEC * 40).await;
    assert_no_slot_twice(&ledger);
    let after: Vec<u64> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| r.slot.filter(|&s| s > last_before))
        .collect();
    assert!(after.len() >= 2, "{after:?}");
    assert!(after.windows(2).all(|w| w[1] == w[0] + 10_000), "{after:?}");
}
