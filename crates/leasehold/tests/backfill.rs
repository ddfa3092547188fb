//! Backfill (`Fleet::backfill`, `leasehold trigger --slots`) on a paused clock, two scheduler
//! instances led by one group on a memory store: the order the slots run in, the rule that a
//! slot with an ok run is skipped, the task lease held throughout, and the refusals.

mod support;

use std::time::Duration;

use leasehold::catalog::{SlotRange, TaskSource};
use leasehold::fleet::{Fleet, FleetError};
use leasehold::history::{self, RecordTrigger, RecordedSchedule, RunOutcome, RunRecord};
use leasehold::{
    HolderId, LeaseConfig, LeaseName, MemoryStore, Overlap, Schedule, Scheduler, SchedulerHandle,
    Slots, Store, Trigger,
};
use support::{Ledger, assert_no_overlap, recorder};

const SEC: Duration = Duration::from_secs(1);
const EVERY: u64 = 10_000;

fn name(s: &str) -> LeaseName {
    LeaseName::new(s).unwrap()
}

/// An instance running `sweep` every 10 s, each run working 3 s, led by group `pods`.
fn instance(store: &MemoryStore, holder: &str, ledger: &Ledger) -> SchedulerHandle {
    instance_with(store, holder, ledger, Overlap::Skip)
}

/// [`instance`] under overlap policy `overlap`.
fn instance_with(
    store: &MemoryStore,
    holder: &str,
    ledger: &Ledger,
    overlap: Overlap,
) -> SchedulerHandle {
    Scheduler::new(store.clone())
        .holder(HolderId::new(holder).unwrap())
        .lease_config(LeaseConfig::new(SEC * 6))
        .grace_period(SEC)
        .leader_group(name("pods"))
        .registered_as(TaskSource::Run)
        .task(
            recorder(ledger, "sweep", Schedule::every(SEC * 10).unwrap(), SEC * 3).overlap(overlap),
        )
        .start(std::future::pending())
        .unwrap()
}

/// The ten slots ending 100 s before the store's clock now (before any instance started).
async fn ten_past_slots(store: &MemoryStore) -> SlotRange {
    let now = store.now_millis().await.unwrap();
    let to_ms = (now / EVERY) * EVERY - 100_000;
    SlotRange {
        from_ms: to_ms - 9 * EVERY,
        to_ms,
    }
}

/// A run of `slot` recorded in the history as ended `outcome`, as an earlier run would be.
async fn ran_before(store: &MemoryStore, slot: u64, outcome: RunOutcome) {
    let mut record = RunRecord::started(
        Some(slot),
        RecordTrigger::Timer,
        "earlier",
        None,
        slot,
        Some(RecordedSchedule::EveryMs(EVERY)),
    );
    record = record.ended(slot + 1_000, outcome);
    store
        .record_history(&name("sweep"), record.key(), &record.to_json(), 100)
        .await
        .unwrap();
}

/// Ten past slots from before the instances started, one of them with an ok run and one with
/// a failed run: the nine without an ok run run once each, oldest first, one at a time, as
/// trigger backfill, holding the task lease (never beside a timer run), without moving the slot
/// claim; the same backfill again runs nothing.
#[tokio::test(start_paused = true)]
async fn a_backfill_runs_each_slot_without_an_ok_run_once_in_order() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let range = ten_past_slots(&store).await;
    let to_ms = range.to_ms;
    let (ok_slot, failed_slot) = (range.from_ms + 2 * EVERY, range.from_ms + 5 * EVERY);
    ran_before(&store, ok_slot, RunOutcome::Ok).await;
    let failed = RunOutcome::Failed {
        error: "exit status 1".into(),
    };
    ran_before(&store, failed_slot, failed).await;
    let a = instance(&store, "a", &ledger);
    let b = instance(&store, "b", &ledger);
    tokio::time::sleep(SEC * 12).await;
    let claimed = store.last_slot(&name("sweep")).await.unwrap().unwrap();
    let fleet = Fleet::new(store.clone());
    let backfill = fleet
        .backfill(&name("sweep"), "ops@desk", range)
        .await
        .unwrap();
    let all: Vec<u64> = (0..10).map(|k| range.from_ms + k * EVERY).collect();
    assert_eq!(backfill.slots, all);
    let to_run: Vec<u64> = all.iter().copied().filter(|&s| s != ok_slot).collect();
    assert_eq!(backfill.to_run, to_run);
    let request = backfill.request.clone().unwrap();
    assert_eq!(request.slots, Some(range));
    let runs = fleet
        .wait_for_backfill(&name("sweep"), &backfill, SEC * 120)
        .await
        .unwrap();
    let slots: Vec<Option<u64>> = runs.iter().map(|r| r.slot).collect();
    assert_eq!(slots, to_run.iter().map(|&s| Some(s)).collect::<Vec<_>>());
    for run in &runs {
        assert_eq!(run.trigger, Some(RecordTrigger::Backfill), "{run:?}");
        assert_eq!(run.outcome, RunOutcome::Ok, "{run:?}");
        assert!(run.token.is_some(), "a backfill run holds the task lease");
        assert_eq!(run.request.as_ref().unwrap().id, request.id);
    }
    // The jobs saw the slots in order, as trigger backfill, each once, never beside a run.
    tokio::time::sleep(SEC * 15).await;
    let ledger_runs = ledger.lock().unwrap().clone();
    let mut backfilled: Vec<_> = ledger_runs
        .iter()
        .filter(|r| r.trigger == Trigger::Backfill)
        .collect();
    backfilled.sort_by_key(|r| r.start);
    let seen: Vec<u64> = backfilled.iter().filter_map(|r| r.slot).collect();
    assert_eq!(seen, to_run, "{ledger_runs:#?}");
    assert_no_overlap(&ledger_runs);
    // The slot claim only moved forward with the timer; the timer ran on.
    let now_claimed = store.last_slot(&name("sweep")).await.unwrap().unwrap();
    assert!(now_claimed >= claimed && now_claimed > to_ms);
    let timer_after = ledger_runs
        .iter()
        .filter(|r| r.trigger == Trigger::Timer && r.start > backfilled[0].start)
        .count();
    assert!(timer_after > 0, "{ledger_runs:#?}");
    // The same backfill again: every slot ran ok, nothing is asked for or run.
    let again = fleet
        .backfill(&name("sweep"), "ops@desk", range)
        .await
        .unwrap();
    assert!(again.request.is_none(), "{again:?}");
    assert!(again.to_run.is_empty());
    tokio::time::sleep(SEC * 15).await;
    let count = ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.trigger == Trigger::Backfill)
        .count();
    assert_eq!(count, to_run.len());
    let records = history::read(&store, &name("sweep"), 200).await.unwrap();
    assert_eq!(
        records
            .iter()
            .filter(|r| r.trigger == Some(RecordTrigger::Backfill))
            .count(),
        to_run.len()
    );
    drop((a, b));
}

/// The instance reads the history again before each slot: a slot that ran ok after the request
/// was made (another backfill) is skipped.
#[tokio::test(start_paused = true)]
async fn a_slot_that_ran_ok_after_the_request_is_skipped() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let start_ms = store.now_millis().await.unwrap();
    let to_ms = (start_ms / EVERY) * EVERY - 100_000;
    let range = SlotRange {
        from_ms: to_ms - 2 * EVERY,
        to_ms,
    };
    let fleet = Fleet::new(store.clone());
    let a = instance(&store, "a", &ledger);
    tokio::time::sleep(SEC * 2).await;
    let backfill = fleet.backfill(&name("sweep"), "ops", range).await.unwrap();
    assert_eq!(backfill.to_run.len(), 3);
    // Before any instance takes it, the middle slot runs ok elsewhere.
    ran_before(&store, range.from_ms + EVERY, RunOutcome::Ok).await;
    fleet
        .wait_for_backfill(&name("sweep"), &backfill, SEC * 60)
        .await
        .unwrap();
    tokio::time::sleep(SEC * 5).await;
    let seen: Vec<u64> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.trigger == Trigger::Backfill)
        .filter_map(|r| r.slot)
        .collect();
    assert_eq!(seen, [range.from_ms, to_ms]);
    drop(a);
}

/// A range that ends before it starts, one that reaches past the store's clock, one of more
/// than 1000 slots, and an unknown task are refused, nothing written.
#[tokio::test(start_paused = true)]
async fn bad_ranges_are_refused() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let a = instance(&store, "a", &ledger);
    tokio::time::sleep(SEC * 2).await;
    let fleet = Fleet::new(store.clone());
    let now = store.now_millis().await.unwrap();
    let sweep = name("sweep");
    let backwards = SlotRange {
        from_ms: now - 1_000,
        to_ms: now - 60_000,
    };
    assert!(matches!(
        fleet.backfill(&sweep, "ops", backwards).await,
        Err(FleetError::BadRange { .. })
    ));
    let future = SlotRange {
        from_ms: now - 60_000,
        to_ms: now + 60_000,
    };
    assert!(matches!(
        fleet.backfill(&sweep, "ops", future).await,
        Err(FleetError::FutureRange { .. })
    ));
    let huge = SlotRange {
        from_ms: now - 1001 * EVERY,
        to_ms: now,
    };
    let err = fleet.backfill(&sweep, "ops", huge).await.unwrap_err();
    assert!(
        matches!(
            err,
            FleetError::TooManySlots {
                slots: 1001,
                max: 1000,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("at most 1000"), "{err}");
    assert!(matches!(
        fleet.backfill(&name("missing"), "ops", future).await,
        Err(FleetError::UnknownTask(_))
    ));
    assert!(fleet.task(&sweep).await.unwrap().trigger.is_none());
    drop(a);
}

/// Timer slots that fall while backfill runs go are decided under the task's overlap policy, as
/// during a timer run: under `buffer-one` each runs once the backfill run ends, before the next
/// backfill slot; under `skip` they are skipped (missed, reason overlap). Never two runs at once.
#[tokio::test(start_paused = true)]
async fn timer_slots_falling_during_a_backfill_follow_the_overlap_policy() {
    for overlap in [Overlap::BufferOne, Overlap::Skip] {
        let store = MemoryStore::new();
        let ledger = Ledger::default();
        let range = ten_past_slots(&store).await;
        let a = instance_with(&store, "a", &ledger, overlap);
        // Its first slots ran: the ones the backfill overlaps follow them.
        tokio::time::sleep(SEC * 22).await;
        let fleet = Fleet::new(store.clone());
        let backfill = fleet.backfill(&name("sweep"), "ops", range).await.unwrap();
        fleet
            .wait_for_backfill(&name("sweep"), &backfill, SEC * 120)
            .await
            .unwrap();
        let mut runs = ledger.lock().unwrap().clone();
        runs.sort_by_key(|r| r.start);
        assert_no_overlap(&runs);
        let backfilled: Vec<_> = runs
            .iter()
            .filter(|r| r.trigger == Trigger::Backfill)
            .collect();
        assert_eq!(backfilled.len(), 10);
        let (first, last) = (backfilled[0].start, backfilled[9].end);
        // Timer runs that started while the backfill went on, between two of its runs.
        let timer_between: Vec<_> = runs
            .iter()
            .filter(|r| r.trigger == Trigger::Timer && r.start > first && r.start < last)
            .collect();
        match overlap {
            Overlap::BufferOne => {
                // Ten 3 s runs take 30 s: at least two 10 s slots fell during them, each run as
                // soon as the backfill run it fell in ended, before the next backfill slot.
                assert!(timer_between.len() >= 2, "{runs:#?}");
                for timer in &timer_between {
                    let right_after = backfilled.iter().any(|b| {
                        b.end <= timer.start && timer.start - b.end < Duration::from_millis(100)
                    });
                    assert!(right_after, "{timer:?} {runs:#?}");
                }
            }
            _ => {
                assert!(timer_between.is_empty(), "{runs:#?}");
                // The next firing's look back records them missed for the overlap.
                tokio::time::sleep(SEC * 15).await;
                let records = history::read(&store, &name("sweep"), 200).await.unwrap();
                let overlapped = records.iter().any(|r| {
                    matches!(
                        r.outcome,
                        RunOutcome::Missed {
                            reason: history::MissReason::Overlap,
                            ..
                        }
                    )
                });
                assert!(overlapped, "{records:#?}");
            }
        }
        drop(a);
    }
}
