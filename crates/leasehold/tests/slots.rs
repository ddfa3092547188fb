//! Slots are times on the store's clock: schedule changes, rolling deploys with two schedules, a
//! host clock ahead of the store's, and a lease that starts expiring during the claim (issue 11,
//! cases 3 and 11), on a paused clock.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::{
    Catalog, HolderId, LeaseConfig, Membership, MemoryStore, Schedule, Scheduler, SchedulerHandle,
    Slots, Store, Task, TickOutcome,
};
use support::{Ledger, assert_no_slot_twice, recorder, timer_slots};

const SEC: Duration = Duration::from_secs(1);

fn start<S: Slots + Membership + Catalog>(store: &S, holder: &str, task: Task) -> SchedulerHandle {
    Scheduler::new(store.clone())
        .holder(HolderId::new(holder).unwrap())
        .lease_config(LeaseConfig::new(SEC * 3))
        .grace_period(SEC)
        .task(task)
        .start(std::future::pending())
        .unwrap()
}

fn every(d: Duration) -> Schedule {
    Schedule::every(d).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_longer_interval_after_a_shorter_one_keeps_running() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let old = start(
        &store,
        "v1",
        recorder(&ledger, "sweep", every(SEC), SEC / 10),
    );
    tokio::time::sleep(SEC * 5).await;
    old.shutdown().await;
    let before = ledger.lock().unwrap().len();
    assert!(before >= 4);
    let _new = start(
        &store,
        "v2",
        recorder(&ledger, "sweep", every(SEC * 60), SEC / 10),
    );
    tokio::time::sleep(SEC * 600).await;
    let after = ledger.lock().unwrap().len() - before;
    assert!(after >= 9, "{after} runs in 10 minutes at every 60s");
    assert_no_slot_twice(&ledger);
}

#[tokio::test(start_paused = true)]
async fn an_interval_after_a_cron_schedule_keeps_running() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let cron = Schedule::cron("* * * * * *").unwrap();
    let old = start(&store, "v1", recorder(&ledger, "sweep", cron, SEC / 10));
    tokio::time::sleep(SEC * 5).await;
    old.shutdown().await;
    let before = ledger.lock().unwrap().len();
    let _new = start(
        &store,
        "v2",
        recorder(&ledger, "sweep", every(SEC * 5), SEC / 10),
    );
    tokio::time::sleep(SEC * 60).await;
    let after = ledger.lock().unwrap().len() - before;
    assert!(after >= 11, "{after} runs in 60 s at every 5s");
    assert_no_slot_twice(&ledger);
}

/// Replicas of two versions disagree on the schedule during a rolling deploy: each firing of
/// either runs at most once, and neither stalls the other.
#[tokio::test(start_paused = true)]
async fn a_rolling_deploy_with_two_schedules_runs_each_firing_at_most_once() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let _old = start(
        &store,
        "v1",
        recorder(&ledger, "sweep", every(SEC * 2), SEC / 10),
    );
    let _new = start(
        &store,
        "v2",
        recorder(&ledger, "sweep", every(SEC * 3), SEC / 10),
    );
    tokio::time::sleep(SEC * 60).await;
    assert_no_slot_twice(&ledger);
    let slots = timer_slots(&ledger);
    // 30 firings of one, 20 of the other, 10 shared: 40 distinct times.
    assert!(slots.len() >= 36, "{} of 40 firings ran", slots.len());
    let holders: Vec<String> = ledger
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.holder.clone())
        .collect();
    assert!(holders.iter().any(|h| h == "v1") && holders.iter().any(|h| h == "v2"));
}

/// The first clock read fails while the other operations answer, and this host's clock is an
/// hour ahead of the store's: the tick must not claim a slot an hour in the future (which would
/// make every slot of the next hour `AlreadyRun`).
#[tokio::test(start_paused = true)]
async fn a_host_clock_ahead_of_the_store_never_claims_a_future_slot() {
    let store = FaultyStore::new();
    store
        .faults
        .clock_offset_ms
        .store(-3_600_000, Ordering::SeqCst);
    store.set(|f| &f.clock_down, true);
    let ledger = Ledger::default();
    let _a = start(
        &store,
        "a",
        recorder(&ledger, "sweep", every(SEC), SEC / 10),
    );
    tokio::time::sleep(SEC * 3).await;
    store.set(|f| &f.clock_down, false);
    tokio::time::sleep(SEC * 20).await;
    let now = store.now_millis().await.unwrap();
    let slots = timer_slots(&ledger);
    assert!(
        slots.len() >= 18,
        "only {} runs after recovery",
        slots.len()
    );
    assert!(
        slots.iter().all(|&s| s <= now),
        "a slot from the future was claimed: {slots:?} at {now}"
    );
    assert_no_slot_twice(&ledger);
}

/// The task lease starts expiring while the slot claim is in flight (renewals hang, the acquire
/// reply came late): the job must not start under a lease that is about to be lost.
#[tokio::test(start_paused = true)]
async fn a_lease_that_starts_expiring_during_the_claim_does_not_run_the_job() {
    let store = FaultyStore::new();
    store.set(|f| &f.renew_hangs, true);
    store.faults.acquire_delay_ms.store(2_200, Ordering::SeqCst);
    store.faults.claim_delay_ms.store(900, Ordering::SeqCst);
    let ledger = Ledger::default();
    let a = start(
        &store,
        "a",
        recorder(&ledger, "sweep", every(SEC * 10), SEC / 10),
    );
    tokio::time::sleep(SEC * 15).await;
    assert!(
        ledger.lock().unwrap().is_empty(),
        "{:?}",
        ledger.lock().unwrap()
    );
    let status = a.status();
    assert_eq!(
        status.tasks[0].last.map(|l| l.0),
        Some(TickOutcome::SkippedLeaseLost)
    );
}
