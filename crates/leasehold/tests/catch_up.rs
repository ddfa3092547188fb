//! Missed slots: caught up under `latest` / `all`, recorded as missed under `skip`, never run
//! twice; and the run history in the store (issue 13), on a paused clock.

mod support;

use std::sync::Arc;
use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::history::{self, MissReason, RecordTrigger, RunOutcome};
use leasehold::{
    CatchUp, HolderId, LeaseConfig, LeaseName, MemoryStore, Schedule, Scheduler, SchedulerHandle,
    Store, StoreDownPolicy, Task, TaskContext, Trigger,
};
use support::{Ledger, assert_no_slot_twice, recorder};

const SEC: Duration = Duration::from_secs(1);

/// One instance's view of a shared store, with faults of its own.
fn view(shared: &MemoryStore) -> FaultyStore {
    FaultyStore {
        inner: shared.clone(),
        ..FaultyStore::default()
    }
}

fn start(store: &FaultyStore, holder: &str, task: Task, group: bool) -> SchedulerHandle {
    let mut s = Scheduler::new(store.clone())
        .holder(HolderId::new(holder).unwrap())
        .lease_config(LeaseConfig::new(SEC * 15))
        .grace_period(SEC)
        .task(task);
    if group {
        s = s.leader_group(LeaseName::new("pods").unwrap());
    }
    s.start(std::future::pending()).unwrap()
}

/// Sleeps until `before` ahead of the next whole minute of the store's clock; returns that
/// minute (the slot).
async fn until_before_next_minute(store: &MemoryStore, before: Duration) -> u64 {
    let now = store.now_millis().await.unwrap();
    let before = before.as_millis() as u64;
    let mut slot = (now / 60_000 + 1) * 60_000;
    // Started within `before` of a whole minute (the store's clock is the wall clock): the
    // minute after.
    if slot - now < before {
        slot += 60_000;
    }
    let wait = slot - now - before;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    slot
}

/// The leader dies two seconds before a minutely slot, with a ttl (15 s) longer than that gap:
/// nobody runs the slot on time. Returns the ledger, the slot, and the history.
async fn leader_dies_before_a_slot(policy: CatchUp) -> (Ledger, u64, Vec<history::RunRecord>) {
    let shared = MemoryStore::new();
    let ledger = Ledger::default();
    let minutely = || {
        recorder(
            &ledger,
            "nightly",
            Schedule::cron("0 * * * * *").unwrap(),
            SEC,
        )
        .catch_up(policy)
    };
    let (a_store, b_store) = (view(&shared), view(&shared));
    let a = start(&a_store, "a", minutely(), true);
    a.leader().unwrap().elected().await.unwrap();
    let b = start(&b_store, "b", minutely(), true);
    // One slot on time, so there is a claimed slot to compare with.
    until_before_next_minute(&shared, SEC * 2).await;
    tokio::time::sleep(SEC * 5).await;
    let slot = until_before_next_minute(&shared, SEC * 2).await;
    a_store.set(|f| &f.down, true); // SIGKILL, as far as the store can tell
    b.leader().unwrap().elected().await.unwrap();
    tokio::time::sleep(SEC * 30).await;
    let records = b.history("nightly", 50).await.unwrap();
    drop(a);
    (ledger, slot, records)
}

#[tokio::test(start_paused = true)]
async fn latest_runs_the_slot_a_dead_leader_missed_once_on_the_next_leader() {
    let (ledger, slot, records) =
        leader_dies_before_a_slot(CatchUp::Latest { window: SEC * 3600 }).await;
    let runs: Vec<_> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.slot == Some(slot))
        .cloned()
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].holder, "b");
    assert_eq!(runs[0].trigger, Trigger::CatchUp);
    assert_no_slot_twice(&ledger);
    let entry = records
        .iter()
        .find(|r| r.slot == Some(slot))
        .expect("in history");
    assert_eq!(entry.trigger, Some(RecordTrigger::CatchUp));
    assert_eq!(entry.outcome, RunOutcome::Ok);
    assert_eq!(entry.holder, "b");
    assert!(entry.token.is_some() && entry.duration().is_some());
}

#[tokio::test(start_paused = true)]
async fn skip_leaves_the_slot_unrun_and_records_it_missed() {
    let (ledger, slot, records) = leader_dies_before_a_slot(CatchUp::Skip).await;
    assert!(
        ledger.lock().unwrap().iter().all(|r| r.slot != Some(slot)),
        "a skipped slot ran"
    );
    let entry = records
        .iter()
        .find(|r| r.slot == Some(slot))
        .expect("in history");
    assert_eq!(
        entry.outcome,
        RunOutcome::Missed {
            count: 1,
            last_slot: slot,
            reason: MissReason::NotClaimed
        }
    );
    assert_no_slot_twice(&ledger);
}

/// `all` after a store outage under fail-closed: the newest `max` missed slots inside the window
/// run in order, the older ones are recorded missed because the store was down.
#[tokio::test(start_paused = true)]
async fn all_runs_the_newest_missed_slots_in_order_after_an_outage() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    let task = recorder(
        &ledger,
        "sweep",
        Schedule::every(SEC * 10).unwrap(),
        SEC / 10,
    )
    .catch_up(CatchUp::All {
        window: SEC * 3600,
        max: 3,
    });
    let s = Scheduler::new(store.clone())
        .lease_config(LeaseConfig::new(SEC * 3))
        .on_store_down(StoreDownPolicy::FailClosed)
        .task(task)
        .start(std::future::pending())
        .unwrap();
    tokio::time::sleep(SEC * 25).await;
    let before = ledger.lock().unwrap().len();
    assert!(before >= 2);
    store.set(|f| &f.down, true);
    tokio::time::sleep(SEC * 60).await;
    store.set(|f| &f.down, false);
    tokio::time::sleep(SEC * 15).await;
    let runs = ledger.lock().unwrap().clone();
    let caught: Vec<u64> = runs
        .iter()
        .filter(|r| r.trigger == Trigger::CatchUp)
        .filter_map(|r| r.slot)
        .collect();
    assert_eq!(caught.len(), 3, "{runs:?}");
    assert!(
        caught.windows(2).all(|w| w[1] == w[0] + 10_000),
        "in order: {caught:?}"
    );
    assert_no_slot_twice(&ledger);
    let records = s.history("sweep", 100).await.unwrap();
    let missed = records
        .iter()
        .find(|r| matches!(r.outcome, RunOutcome::Missed { .. }))
        .expect("older slots recorded missed");
    let RunOutcome::Missed {
        count,
        last_slot,
        reason,
    } = missed.outcome.clone()
    else {
        unreachable!()
    };
    assert_eq!(reason, MissReason::StoreDown);
    assert_eq!(last_slot + 10_000, caught[0]);
    assert_eq!(count, (last_slot - missed.slot.unwrap()) / 10_000 + 1);
}

/// Every run is recorded with its outcome; the history is bounded; manual runs appear too.
#[tokio::test(start_paused = true)]
async fn the_history_records_outcomes_and_stays_bounded() {
    let store = MemoryStore::new();
    let task = Task::new(
        LeaseName::new("flaky").unwrap(),
        Schedule::every(SEC).unwrap(),
        |ctx: TaskContext| async move {
            match ctx.slot.map(|s| s / 1000 % 2) {
                Some(0) => Err(std::io::Error::other("even slot")),
                _ => Ok(()),
            }
        },
    );
    let s = Scheduler::new(store.clone())
        .lease_config(LeaseConfig::new(SEC * 3))
        .history_limit(5)
        .task(task)
        .start(std::future::pending())
        .unwrap();
    tokio::time::sleep(SEC * 10).await;
    s.run_now("flaky").await.unwrap();
    s.shutdown().await;
    let records = history::read(&store, &LeaseName::new("flaky").unwrap(), 100)
        .await
        .unwrap();
    assert_eq!(records.len(), 5, "bounded to the limit: {records:?}");
    assert!(
        records.windows(2).all(|w| w[0].key() > w[1].key()),
        "newest first"
    );
    let manual = records
        .iter()
        .find(|r| r.trigger == Some(RecordTrigger::Manual))
        .expect("manual run recorded");
    assert!(manual.token.is_none() && manual.slot.is_none());
    for r in records
        .iter()
        .filter(|r| r.trigger == Some(RecordTrigger::Timer))
    {
        let even = r.slot.unwrap() / 1000 % 2 == 0;
        let expected = if even {
            RunOutcome::Failed {
                error: "even slot".into(),
            }
        } else {
            RunOutcome::Ok
        };
        assert_eq!(r.outcome, expected, "{r:?}");
    }
}

/// A job can ask whether it may still commit: false once its lease starts expiring.
#[tokio::test(start_paused = true)]
async fn a_job_sees_its_lease_expiring_before_it_commits() {
    let store = FaultyStore::new();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let flaky = store.clone();
    let task = Task::new(
        LeaseName::new("commit").unwrap(),
        Schedule::every(SEC * 30).unwrap(),
        move |ctx: TaskContext| {
            let (log, flaky) = (log.clone(), flaky.clone());
            async move {
                log.lock().unwrap().push(ctx.is_held());
                flaky.set(|f| &f.renew_hangs, true);
                // Past the stop margin (2.37 s of a 3 s ttl), before the local deadline.
                tokio::time::sleep(Duration::from_millis(2_500)).await;
                log.lock().unwrap().push(ctx.is_held());
                Ok::<(), std::io::Error>(())
            }
        },
    );
    let _s = Scheduler::new(store.clone())
        .lease_config(LeaseConfig::new(SEC * 3))
        .task(task)
        .start(std::future::pending())
        .unwrap();
    tokio::time::sleep(SEC * 35).await;
    assert_eq!(seen.lock().unwrap()[..2], [true, false]);
}

/// A handoff a moment after a slot fired: the old leader stops (and releases) 10 ms before the
/// minute, the new leader is elected a moment after it, when its own timer for that minute has
/// already been skipped as a follower's. The slot is due by the time the new leader looks, so
/// `latest` runs it, rather than treating it as too young to judge and losing it.
#[tokio::test(start_paused = true)]
async fn a_handoff_right_at_the_slot_does_not_lose_it() {
    let shared = MemoryStore::new();
    let ledger = Ledger::default();
    let minutely = || {
        recorder(
            &ledger,
            "nightly",
            Schedule::cron("0 * * * * *").unwrap(),
            SEC,
        )
        .catch_up(CatchUp::Latest { window: SEC * 3600 })
    };
    let (a_store, b_store) = (view(&shared), view(&shared));
    let a = start(&a_store, "a", minutely(), true);
    a.leader().unwrap().elected().await.unwrap();
    let b = start(&b_store, "b", minutely(), true);
    until_before_next_minute(&shared, SEC * 2).await;
    tokio::time::sleep(SEC * 5).await;
    // The follower's acquire is slow enough that it wins just after the minute.
    b_store
        .faults
        .acquire_delay_ms
        .store(50, std::sync::atomic::Ordering::SeqCst);
    let slot = until_before_next_minute(&shared, Duration::from_millis(10)).await;
    a.shutdown().await;
    b.leader().unwrap().elected().await.unwrap();
    tokio::time::sleep(SEC * 30).await;
    let runs: Vec<_> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.slot == Some(slot))
        .cloned()
        .collect();
    assert_eq!(runs.len(), 1, "the 03:00 run of a 03:00 handoff: {runs:?}");
    assert_eq!(runs[0].holder, "b");
    assert_no_slot_twice(&ledger);
}

/// A run longer than the interval: the slots that fell due while it ran are not fired at all;
/// the leader records them missed (overlap) instead of losing them silently.
#[tokio::test(start_paused = true)]
async fn slots_overlapped_by_a_long_run_are_recorded() {
    let shared = MemoryStore::new();
    let ledger = Ledger::default();
    let slow = recorder(
        &ledger,
        "slow",
        Schedule::every(SEC).unwrap(),
        Duration::from_millis(2500),
    );
    let store = view(&shared);
    let a = start(&store, "a", slow, true);
    a.leader().unwrap().elected().await.unwrap();
    tokio::time::sleep(SEC * 12).await;
    let records = a.history("slow", 100).await.unwrap();
    a.shutdown().await;
    let ran: Vec<u64> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| r.slot)
        .collect();
    assert!(ran.len() >= 3, "{ran:?}");
    let (first, last) = (ran[0], *ran.last().unwrap());
    // Missed slots recorded between the first and the last run (shutdown may record more after).
    let overlapped: u64 = records
        .iter()
        .filter_map(|r| match r.outcome {
            RunOutcome::Missed {
                last_slot,
                reason: MissReason::Overlap,
                ..
            } => {
                let (from, to) = (r.slot?.max(first), last_slot.min(last));
                (from <= to).then(|| (to - from) / 1000 + 1)
            }
            _ => None,
        })
        .sum();
    let due = (last - first) / 1000 + 1;
    assert_eq!(
        ran.len() as u64 + overlapped,
        due,
        "every slot from {first} to {last} either ran or is recorded: {records:?}"
    );
}

/// A leader cut off from the store mid-run (paused, or partitioned) while the next leader runs
/// slots: when it is back, those slots ran, so they are not recorded as missed for an overlap
/// (issue 32: a paused former leader used to record them).
#[tokio::test(start_paused = true)]
async fn a_leader_cut_off_mid_run_records_no_overlap_for_slots_run_elsewhere() {
    let shared = MemoryStore::new();
    let ledger = Ledger::default();
    let every_5 = |work| recorder(&ledger, "sweep", Schedule::every(SEC * 5).unwrap(), work);
    let (a_store, b_store) = (view(&shared), view(&shared));
    // a's runs take 40 s, b's one.
    let a = start(&a_store, "a", every_5(SEC * 40), true);
    a.leader().unwrap().elected().await.unwrap();
    // a's first run starts, then a is cut off from the store (paused, or partitioned).
    tokio::time::sleep(SEC * 6).await;
    a_store.set(|f| &f.down, true);
    let b = start(&b_store, "b", every_5(SEC).catch_up(CatchUp::Skip), true);
    tokio::time::sleep(SEC * 60).await;
    a_store.set(|f| &f.down, false);
    tokio::time::sleep(SEC * 20).await;
    let ran_by_b: Vec<u64> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.holder == "b")
        .filter_map(|r| r.slot)
        .collect();
    assert!(
        !ran_by_b.is_empty(),
        "b took over and ran slots: {:?} {:?}",
        ledger.lock().unwrap(),
        b.status()
    );
    let records = b.history("sweep", 100).await.unwrap();
    for r in &records {
        if let RunOutcome::Missed {
            last_slot,
            reason: MissReason::Overlap,
            ..
        } = r.outcome
        {
            let first = r.slot.unwrap();
            assert!(
                !ran_by_b.iter().any(|s| (first..=last_slot).contains(s)),
                "slots {first}..={last_slot} recorded missed for an overlap, but b ran {ran_by_b:?}"
            );
        }
    }
    drop(a);
}
