//! Runs that were cut off are run again (issue 38), on a paused tokio clock: an instance cut off
//! from the store mid-run (as if killed: its run stays `running` in the store) has its slot run
//! once more by the next holder, as attempt 2 with the `retry` trigger, once; a run cancelled
//! because its own lease was lost is run again by the same instance; `OnInterrupt::Skip` leaves
//! both; a run that ended while the store was down is recorded when it is back, not re-run; a
//! run again that races the next timer slot keeps the overlap policy.

mod support;

use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::{
    HolderId, LeaseConfig, MemoryStore, OnInterrupt, Schedule, Scheduler, SchedulerHandle, Store,
    Trigger,
};
use support::{Ledger, Run, assert_no_overlap, recorder};

const SEC: Duration = Duration::from_secs(1);
const TTL: Duration = Duration::from_secs(3);
const EVERY: Duration = Duration::from_secs(10);

fn instance(
    store: &FaultyStore,
    name: &str,
    ledger: &Ledger,
    work: Duration,
    on_interrupt: OnInterrupt,
) -> SchedulerHandle {
    Scheduler::new(store.clone())
        .holder(HolderId::new(name).unwrap())
        .lease_config(LeaseConfig::new(TTL))
        .grace_period(SEC)
        .task(
            recorder(ledger, "job", Schedule::every(EVERY).unwrap(), work)
                .on_interrupt(on_interrupt),
        )
        .start(std::future::pending())
        .unwrap()
}

/// Sleeps until `offset` past the next slot on the store's clock.
async fn into_next_slot(store: &MemoryStore, offset: Duration) -> u64 {
    let now = store.now_millis().await.unwrap();
    let every = EVERY.as_millis() as u64;
    let slot = (now / every + 1) * every;
    tokio::time::sleep(Duration::from_millis(slot - now) + offset).await;
    slot
}

fn runs(ledger: &Ledger) -> Vec<Run> {
    ledger.lock().unwrap().clone()
}

/// Instance `a` starts the slot's run, then loses the store for good (as if killed); `b` is
/// there to take over. Returns the slot `a` was running.
async fn a_cut_off_mid_run(
    store: &MemoryStore,
    ledger: &Ledger,
    on_interrupt: OnInterrupt,
) -> (u64, SchedulerHandle, FaultyStore) {
    let a_store = FaultyStore::wrap(store.clone());
    let _a = instance(&a_store, "a", ledger, 4 * SEC, on_interrupt);
    let slot = into_next_slot(store, SEC).await;
    let b_store = FaultyStore::wrap(store.clone());
    let b = instance(&b_store, "b", ledger, 4 * SEC, on_interrupt);
    a_store.set(|f| &f.down, true);
    std::mem::forget(_a);
    (slot, b, a_store)
}

#[tokio::test(start_paused = true)]
async fn a_run_whose_instance_went_away_is_run_again_by_the_next_holder_once() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let (cut, b, a_store) = a_cut_off_mid_run(&store, &ledger, OnInterrupt::Rerun).await;
    tokio::time::sleep(EVERY * 4).await;
    let all = runs(&ledger);
    let first = all
        .iter()
        .find(|r| r.slot == Some(cut))
        .expect("a ran the slot");
    assert_eq!(
        (first.holder.as_str(), first.cancelled),
        ("a", true),
        "{all:?}"
    );
    let again: Vec<&Run> = all.iter().filter(|r| r.trigger == Trigger::Retry).collect();
    assert_eq!(again.len(), 1, "run again once: {all:?}");
    assert_eq!((again[0].slot, again[0].holder.as_str()), (Some(cut), "b"));
    assert!(!again[0].cancelled);
    assert_no_overlap(&all);
    // The history says which attempt it was.
    let history = b.history("job", 20).await.unwrap();
    let attempt = history
        .iter()
        .find(|r| r.slot == Some(cut) && r.attempt() == 2)
        .expect("attempt 2 recorded");
    assert_eq!(attempt.result(), Some(leasehold::history::Outcome::Ok));
    // `a` comes back and records how its run ended (cancelled): the slot is not run again.
    a_store.set(|f| &f.down, false);
    tokio::time::sleep(EVERY * 4).await;
    let all = runs(&ledger);
    let retries = all.iter().filter(|r| r.trigger == Trigger::Retry).count();
    assert_eq!(retries, 1, "{all:?}");
    // Every timer slot ran once.
    let mut slots: Vec<u64> = all
        .iter()
        .filter(|r| r.trigger == Trigger::Timer)
        .filter_map(|r| r.slot)
        .collect();
    let n = slots.len();
    slots.dedup();
    assert_eq!(slots.len(), n, "{all:?}");
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn with_skip_a_cut_off_run_is_left() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let (_, b, _a) = a_cut_off_mid_run(&store, &ledger, OnInterrupt::Skip).await;
    tokio::time::sleep(EVERY * 4).await;
    let all = runs(&ledger);
    assert!(all.iter().any(|r| r.holder == "b"), "{all:?}");
    assert!(all.iter().all(|r| r.trigger != Trigger::Retry), "{all:?}");
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_cancelled_for_a_lost_lease_is_run_again_by_its_own_instance() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let a_store = FaultyStore::wrap(store.clone());
    let a = instance(&a_store, "a", &ledger, 4 * SEC, OnInterrupt::Rerun);
    let cut = into_next_slot(&store, SEC).await;
    // The store is away long enough for the lease to start expiring, then back.
    a_store.set(|f| &f.down, true);
    tokio::time::sleep(TTL + SEC).await;
    a_store.set(|f| &f.down, false);
    tokio::time::sleep(EVERY * 2).await;
    let all = runs(&ledger);
    let first = all.iter().find(|r| r.slot == Some(cut)).unwrap();
    assert!(first.cancelled, "{all:?}");
    let again: Vec<&Run> = all.iter().filter(|r| r.trigger == Trigger::Retry).collect();
    assert_eq!(again.len(), 1, "{all:?}");
    assert_eq!(again[0].slot, Some(cut));
    assert_no_overlap(&all);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_that_ended_while_the_store_was_down_is_recorded_later_not_run_again() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let a_store = FaultyStore::wrap(store.clone());
    // Runs of half a second: the store goes away mid-run and the run ends before the lease
    // starts expiring, so it ends `ok` with the store away.
    let a = instance(&a_store, "a", &ledger, SEC / 2, OnInterrupt::Rerun);
    into_next_slot(&store, SEC / 4).await;
    a_store.set(|f| &f.down, true);
    tokio::time::sleep(SEC * 2).await;
    a_store.set(|f| &f.down, false);
    // `b` starts and takes the next slots (a's view of its history is its own).
    let b_store = FaultyStore::wrap(store.clone());
    let b = instance(&b_store, "b", &ledger, SEC / 2, OnInterrupt::Rerun);
    tokio::time::sleep(EVERY * 4).await;
    let all = runs(&ledger);
    assert!(all.iter().all(|r| !r.cancelled), "{all:?}");
    assert!(all.iter().all(|r| r.trigger != Trigger::Retry), "{all:?}");
    a.shutdown().await;
    b.shutdown().await;
}

/// The run again races the next timer slot: `b`'s granted slot runs 8 s of a 10 s period, the
/// cut-off slot's run again follows it and is still going when the next slot falls. That slot is
/// skipped for the overlap (the default policy, recorded), never run beside the retry; the one
/// after runs on time; the cut-off slot runs again once.
#[tokio::test(start_paused = true)]
async fn a_run_again_racing_the_next_timer_slot_keeps_the_overlap_policy() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let work = 8 * SEC;
    let a_store = FaultyStore::wrap(store.clone());
    let a = instance(&a_store, "a", &ledger, work, OnInterrupt::Rerun);
    let cut = into_next_slot(&store, SEC).await;
    let b_store = FaultyStore::wrap(store.clone());
    let b = instance(&b_store, "b", &ledger, work, OnInterrupt::Rerun);
    a_store.set(|f| &f.down, true);
    std::mem::forget(a);
    tokio::time::sleep(EVERY * 5).await;
    let all = runs(&ledger);
    let every = EVERY.as_millis() as u64;
    let again: Vec<&Run> = all.iter().filter(|r| r.trigger == Trigger::Retry).collect();
    assert_eq!(again.len(), 1, "run again once: {all:?}");
    assert_eq!((again[0].slot, again[0].holder.as_str()), (Some(cut), "b"));
    assert_no_overlap(&all);
    // The granted slot ran first, the run again right after it, across the next slot.
    let granted = all
        .iter()
        .find(|r| r.holder == "b" && r.trigger == Trigger::Timer)
        .expect("b ran a slot");
    assert!(again[0].start >= granted.end, "{all:?}");
    let raced = granted.slot.unwrap() + every;
    assert!(
        all.iter().all(|r| r.slot != Some(raced)),
        "the slot that fell during the run again did not run beside it: {all:?}"
    );
    assert!(
        all.iter().any(|r| r.slot == Some(raced + every)),
        "the slot after ran on time: {all:?}"
    );
    let history = b.history("job", 20).await.unwrap();
    assert!(
        history.iter().any(|r| matches!(
            r.outcome,
            leasehold::history::RunOutcome::Missed {
                reason: leasehold::history::MissReason::Overlap,
                ..
            }
        ) && r.slot == Some(raced)),
        "the raced slot is recorded skipped for the overlap: {history:?}"
    );
    b.shutdown().await;
}
