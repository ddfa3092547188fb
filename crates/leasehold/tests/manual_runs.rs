//! Manual runs belong to the scheduler (issue 11, case 4), and the exclusive variant never
//! overlaps a timer run anywhere; on a paused clock.

mod support;

use std::time::Duration;

use leasehold::{
    HolderId, LeaseConfig, MemoryStore, RunResult, Schedule, Scheduler, SchedulerError,
    SchedulerHandle, Task, Trigger,
};
use support::{Ledger, recorder};
use tokio::time::Instant;

const SEC: Duration = Duration::from_secs(1);

fn start(store: &MemoryStore, holder: &str, task: Task) -> SchedulerHandle {
    Scheduler::new(store.clone())
        .holder(HolderId::new(holder).unwrap())
        .lease_config(LeaseConfig::new(SEC * 3))
        .grace_period(SEC * 2)
        .task(task)
        .start(std::future::pending())
        .unwrap()
}

/// A caller that stops waiting (an HTTP client that disconnects) does not detach the run:
/// status stays true while it runs, and shutdown cancels and drains it.
#[tokio::test(start_paused = true)]
async fn a_dropped_run_now_future_leaves_the_run_owned_by_the_scheduler() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let hourly = Schedule::every(SEC * 3600).unwrap();
    let s = start(&store, "a", recorder(&ledger, "sweep", hourly, SEC * 60));
    tokio::select! {
        _ = s.run_now("sweep") => panic!("a 60 s job finished in 1 s"),
        () = tokio::time::sleep(SEC) => {}
    }
    assert!(
        s.status().tasks[0].running,
        "the run goes on after the caller left"
    );
    let stopping = Instant::now();
    s.shutdown().await;
    let took = Instant::now() - stopping;
    let runs = ledger.lock().unwrap().clone();
    assert_eq!(runs.len(), 1, "shutdown drained the manual run: {runs:?}");
    assert!(runs[0].cancelled, "cancelled after the grace period");
    assert_eq!(runs[0].trigger, Trigger::Manual);
    assert!(took >= SEC * 2 && took < SEC * 3, "shutdown took {took:?}");
    assert!(!s.status().tasks[0].running);
    assert!(matches!(
        s.run_now("sweep").await,
        Err(SchedulerError::ShutDown)
    ));
}

/// `run_now_exclusive` holds the task lease: it never overlaps a timer run on any instance,
/// and answers `Busy` while one is in progress. Plain `run_now` bypasses the gate.
#[tokio::test(start_paused = true)]
async fn an_exclusive_manual_run_never_overlaps_a_timer_run() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let task = || recorder(&ledger, "sweep", Schedule::every(SEC).unwrap(), SEC / 2);
    let _a = start(&store, "a", task());
    let b = start(&store, "b", task());
    let (mut ran, mut busy) = (0usize, 0usize);
    for i in 0..20u32 {
        tokio::time::sleep(SEC / 7 * (1 + i % 5)).await;
        match b.run_now_exclusive("sweep").await {
            Ok(RunResult::Succeeded) => ran += 1,
            Err(SchedulerError::Busy { .. }) => busy += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(ran > 0 && busy > 0, "ran {ran}, busy {busy}");
    let mut runs = ledger.lock().unwrap().clone();
    runs.sort_by_key(|r| r.start);
    for pair in runs.windows(2) {
        assert!(pair[1].start >= pair[0].end, "overlap: {pair:?}");
    }
    let manual: Vec<_> = runs
        .iter()
        .filter(|r| r.trigger == Trigger::Manual)
        .collect();
    assert_eq!(manual.len(), ran);
    assert!(manual.iter().all(|r| r.token.is_some() && r.slot.is_none()));
}

#[tokio::test(start_paused = true)]
async fn a_bypassing_manual_run_may_overlap_a_timer_run() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let task = recorder(&ledger, "sweep", Schedule::every(SEC).unwrap(), SEC * 3 / 4);
    let s = start(&store, "a", task);
    // In the middle of a timer run (ticks align to whole seconds of the store's clock).
    while !s.status().tasks[0].running {
        tokio::time::sleep(SEC / 20).await;
    }
    assert_eq!(s.run_now("sweep").await.unwrap(), RunResult::Succeeded);
    let runs = ledger.lock().unwrap().clone();
    let manual = runs.iter().find(|r| r.trigger == Trigger::Manual).unwrap();
    assert_eq!(manual.token, None);
    assert!(
        runs.iter()
            .any(|r| r.trigger == Trigger::Timer && r.start < manual.end && manual.start < r.end),
        "the documented choice: bypass runs beside the timer run"
    );
}

/// Tasks added to a running scheduler start at once; a removed one takes no more slots, its
/// run in progress finishes (not cancelled), and `remove_task` returns once it has ended.
#[tokio::test(start_paused = true)]
async fn tasks_are_added_and_removed_while_the_scheduler_runs() {
    let store = MemoryStore::new();
    let (kept, slow) = (Ledger::default(), Ledger::default());
    let every = Schedule::every(SEC * 2).unwrap();
    let s = start(
        &store,
        "a",
        recorder(&kept, "kept", every.clone(), SEC / 10),
    );
    s.add_task(recorder(&slow, "slow", every.clone(), SEC * 3))
        .unwrap();
    assert!(matches!(
        s.add_task(recorder(&slow, "slow", every.clone(), SEC)),
        Err(SchedulerError::DuplicateTask(_))
    ));
    let running = |s: &SchedulerHandle| {
        s.status()
            .tasks
            .iter()
            .any(|t| t.name.as_str() == "slow" && t.running)
    };
    tokio::time::sleep(SEC * 3).await;
    for _ in 0..100 {
        if running(&s) && !slow.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(SEC / 10).await;
    }
    assert!(running(&s), "a second run of slow is going");
    let removing = Instant::now();
    s.remove_task("slow").await.unwrap();
    let took = Instant::now() - removing;
    let runs = slow.lock().unwrap().clone();
    let last = runs.last().unwrap().clone();
    assert!(!last.cancelled, "the run in progress finished: {runs:?}");
    assert!(
        took > Duration::ZERO && last.end <= Instant::now(),
        "waited for it"
    );
    assert_eq!(s.status().tasks.len(), 1);
    tokio::time::sleep(SEC * 6).await;
    assert_eq!(
        slow.lock().unwrap().len(),
        runs.len(),
        "no run after removal"
    );
    assert!(kept.lock().unwrap().len() >= 5, "the other task ran on");
    assert!(matches!(
        s.remove_task("slow").await,
        Err(SchedulerError::UnknownTask(_))
    ));
    // Added back under the same name, it runs again.
    s.add_task(recorder(&slow, "slow", every, SEC / 10))
        .unwrap();
    tokio::time::sleep(SEC * 3).await;
    assert!(slow.lock().unwrap().len() > runs.len());
    s.shutdown().await;
    assert!(matches!(
        s.add_task(recorder(&kept, "late", Schedule::every(SEC).unwrap(), SEC)),
        Err(SchedulerError::ShutDown)
    ));
}
