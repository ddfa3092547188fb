//! The scheduler and leader election on a paused tokio clock.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::{
    Catalog, HolderId, Leader, LeaderEvent, Lease, LeaseConfig, LeaseName, Membership, MemoryStore,
    RevokeReason, RunResult, Schedule, Scheduler, SchedulerHandle, Slots, Store, StoreDownPolicy,
    Task, TaskContext, TickOutcome, Trigger,
};
use tokio::time::Instant;

const SEC: Duration = Duration::from_secs(1);

/// One record per run: (holder, slot, trigger, start, end).
type Ledger = Arc<Mutex<Vec<(String, Option<u64>, Trigger, Instant, Instant)>>>;

fn recording_task(ledger: &Ledger, work: Duration) -> Task {
    let ledger = ledger.clone();
    Task::new(
        LeaseName::new("sweep").unwrap(),
        Schedule::every(SEC).unwrap(),
        move |ctx: TaskContext| {
            let ledger = ledger.clone();
            async move {
                let start = Instant::now();
                tokio::select! {
                    () = tokio::time::sleep(work) => {}
                    () = ctx.cancel.cancelled() => {}
                }
                ledger.lock().unwrap().push((
                    ctx.holder.to_string(),
                    ctx.slot,
                    ctx.trigger,
                    start,
                    Instant::now(),
                ));
                Ok::<(), std::io::Error>(())
            }
        },
    )
}

fn instance<S: Slots + Membership + Catalog>(
    store: &S,
    name: &str,
    task: Task,
    gated: bool,
) -> SchedulerHandle {
    let mut s = Scheduler::new(store.clone())
        .holder(HolderId::new(name).unwrap())
        .lease_config(LeaseConfig::new(SEC * 3))
        .grace_period(SEC)
        .task(task);
    if gated {
        s = s.leader_group(LeaseName::new("sweepers").unwrap());
    }
    s.start(std::future::pending()).unwrap()
}

fn slots(ledger: &Ledger) -> Vec<u64> {
    let mut v: Vec<u64> = ledger.lock().unwrap().iter().filter_map(|r| r.1).collect();
    v.sort_unstable();
    v
}

fn assert_each_slot_once(ledger: &Ledger, at_least: usize) {
    let v = slots(ledger);
    let mut dedup = v.clone();
    dedup.dedup();
    assert_eq!(v, dedup, "a slot ran twice");
    assert!(v.len() >= at_least, "only {} runs", v.len());
    assert!(
        v.windows(2).all(|w| w[1] == w[0] + 1_000),
        "a slot was missed: {v:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn followers_skip_and_re_arm_while_the_leader_runs_each_tick() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let a = instance(&store, "a", recording_task(&ledger, SEC / 10), true);
    tokio::time::sleep(SEC / 10).await;
    let b = instance(&store, "b", recording_task(&ledger, SEC / 10), true);
    let c = instance(&store, "c", recording_task(&ledger, SEC / 10), true);
    tokio::time::sleep(SEC * 10).await;
    assert_each_slot_once(&ledger, 9);
    assert!(
        ledger.lock().unwrap().iter().all(|r| r.0 == "a"),
        "only the leader ran"
    );
    for follower in [&b, &c] {
        let status = follower.status();
        assert_eq!(status.leader, Some(false));
        assert!(
            status.tasks[0].ticks >= 9,
            "followers keep their timers armed"
        );
        assert_eq!(status.tasks[0].runs, 0);
        assert_eq!(
            status.tasks[0].last.unwrap().0,
            TickOutcome::SkippedNotLeader
        );
    }
    assert_eq!(a.status().tasks[0].last.unwrap().0, TickOutcome::Ran);
}

#[tokio::test(start_paused = true)]
async fn without_a_gate_each_tick_runs_once_among_racing_instances() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let _instances: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| instance(&store, n, recording_task(&ledger, SEC / 10), false))
        .collect();
    tokio::time::sleep(SEC * 20).await;
    assert_each_slot_once(&ledger, 19);
}

#[tokio::test(start_paused = true)]
async fn a_run_that_outlives_its_interval_never_overlaps_the_next() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let a = instance(&store, "a", recording_task(&ledger, SEC * 5 / 2), false);
    let b = instance(&store, "b", recording_task(&ledger, SEC * 5 / 2), false);
    tokio::time::sleep(SEC * 12).await;
    let mut runs = ledger.lock().unwrap().clone();
    runs.sort_by_key(|r| r.3);
    assert!(runs.len() >= 3);
    for pair in runs.windows(2) {
        assert!(pair[1].3 >= pair[0].4, "overlap: {pair:?}");
    }
    let skipped = [a.status(), b.status()]
        .iter()
        .map(|s| s.tasks[0].ticks - s.tasks[0].runs)
        .sum::<u64>();
    assert!(skipped > 0, "ticks during a long run were skipped");
}

#[tokio::test(start_paused = true)]
async fn fail_closed_skips_ticks_while_the_store_is_down() {
    let store = FaultyStore::new();
    store.set(|f| &f.down, true);
    let ledger = Ledger::default();
    let a = instance(&store, "a", recording_task(&ledger, SEC / 10), false);
    tokio::time::sleep(SEC * 5).await;
    assert!(ledger.lock().unwrap().is_empty());
    let status = a.status();
    assert_eq!(status.tasks[0].policy, StoreDownPolicy::FailClosed);
    assert_eq!(
        status.tasks[0].last.unwrap().0,
        TickOutcome::SkippedStoreDown
    );
    assert!(
        status.tasks[0].ticks >= 4,
        "timers keep firing during the outage"
    );
    // Recovery: ticks run again, once each.
    store.set(|f| &f.down, false);
    tokio::time::sleep(SEC * 5).await;
    assert!(ledger.lock().unwrap().len() >= 4);
    assert_eq!(a.status().tasks[0].last.unwrap().0, TickOutcome::Ran);
}

#[tokio::test(start_paused = true)]
async fn fail_open_runs_ticks_everywhere_while_the_store_is_down() {
    let store = FaultyStore::new();
    store.set(|f| &f.down, true);
    let ledger = Ledger::default();
    let task = || recording_task(&ledger, SEC / 10).on_store_down(StoreDownPolicy::FailOpen);
    let a = instance(&store, "a", task(), false);
    let _b = instance(&store, "b", task(), false);
    tokio::time::sleep(SEC * 5 + SEC / 2).await;
    let runs = ledger.lock().unwrap().clone();
    assert!(runs.iter().any(|r| r.0 == "a") && runs.iter().any(|r| r.0 == "b"));
    assert!(
        runs.len() >= 8,
        "both instances ran every tick: {}",
        runs.len()
    );
    assert_eq!(
        a.status().tasks[0].last.unwrap().0,
        TickOutcome::RanStoreDown
    );
    assert_eq!(a.status().tasks[0].policy, StoreDownPolicy::FailOpen);
}

#[tokio::test(start_paused = true)]
async fn local_mode_runs_every_tick_without_a_store() {
    let ledger = Ledger::default();
    let s = Scheduler::local()
        .task(recording_task(&ledger, SEC / 10))
        .start(std::future::pending())
        .unwrap();
    tokio::time::sleep(SEC * 5 + SEC / 2).await;
    assert_each_slot_once(&ledger, 5);
    let status = s.status();
    assert_eq!(status.tasks[0].policy, StoreDownPolicy::Local);
    assert!(status.store.contains("single-instance"));
}

#[tokio::test(start_paused = true)]
async fn losing_leadership_cancels_the_running_job() {
    let store = FaultyStore::new();
    let cancelled_at = Arc::new(Mutex::new(None));
    let seen = cancelled_at.clone();
    let task = Task::new(
        LeaseName::new("long").unwrap(),
        Schedule::every(SEC).unwrap(),
        move |ctx: TaskContext| {
            let seen = seen.clone();
            async move {
                ctx.cancel.cancelled().await;
                *seen.lock().unwrap() = Some(Instant::now());
                Ok::<(), std::io::Error>(())
            }
        },
    );
    let a = instance(&store, "a", task, true);
    tokio::time::sleep(SEC * 2).await;
    assert!(a.status().tasks[0].running);
    let lost_from = Instant::now();
    store.set(|f| &f.renew_lost, true);
    tokio::time::sleep(SEC * 2).await;
    let at = cancelled_at.lock().unwrap().expect("job was cancelled");
    assert!(at - lost_from <= SEC, "cancelled at the next renewal");
}

#[tokio::test(start_paused = true)]
async fn shutdown_hands_leadership_over_at_once() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let a = instance(&store, "a", recording_task(&ledger, SEC / 10), true);
    tokio::time::sleep(SEC / 10).await;
    let b = instance(&store, "b", recording_task(&ledger, SEC / 10), true);
    tokio::time::sleep(SEC * 3).await;
    let stopped = Instant::now();
    a.shutdown().await;
    b.leader().unwrap().elected().await.unwrap();
    assert!(
        Instant::now() - stopped < SEC / 5,
        "handoff without waiting for expiry"
    );
    tokio::time::sleep(SEC * 3).await;
    assert_each_slot_once(&ledger, 5);
    let holders: Vec<String> = ledger.lock().unwrap().iter().map(|r| r.0.clone()).collect();
    assert!(holders.contains(&"a".to_owned()) && holders.contains(&"b".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_a_running_job_finish_within_the_grace_period() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let a = instance(&store, "a", recording_task(&ledger, SEC / 2), false);
    // Stop in the middle of a run.
    tokio::time::sleep_until(Instant::now() + SEC).await;
    while !a.status().tasks[0].running {
        tokio::time::sleep(SEC / 20).await;
    }
    a.shutdown().await;
    let runs = ledger.lock().unwrap().clone();
    let last = runs.last().unwrap();
    assert_eq!(
        last.4 - last.3,
        SEC / 2,
        "the run finished instead of being cancelled"
    );
    let state = store
        .inspect(&LeaseName::new("sweep").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.holder, None, "task lease released");
}

#[tokio::test(start_paused = true)]
async fn a_manual_run_on_a_follower_runs_there() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let _a = instance(&store, "a", recording_task(&ledger, SEC / 10), true);
    tokio::time::sleep(SEC / 10).await;
    let b = instance(&store, "b", recording_task(&ledger, SEC / 10), true);
    assert_eq!(b.run_now("sweep").await.unwrap(), RunResult::Succeeded);
    let runs = ledger.lock().unwrap().clone();
    let manual: Vec<_> = runs.iter().filter(|r| r.2 == Trigger::Manual).collect();
    assert_eq!(manual.len(), 1);
    assert_eq!(manual[0].0, "b");
    assert_eq!(manual[0].1, None);
    assert!(b.run_now("nope").await.is_err());
}

#[tokio::test(start_paused = true)]
async fn leader_events_report_election_and_revocation() {
    let store = FaultyStore::new();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let lease = Lease::new(
        store.clone(),
        LeaseName::new("group").unwrap(),
        LeaseConfig::new(SEC * 3),
    )
    .unwrap();
    let leader = Leader::new(lease)
        .on_event(move |e| seen.lock().unwrap().push(e.clone()))
        .start(std::future::pending());
    let (token, cancel) = leader.elected().await.unwrap();
    // An outage longer than the lease: the term ends at the local deadline, the store's entry
    // expires just after, and the re-election after the outage is a new term.
    store.set(|f| &f.down, true);
    cancel.cancelled().await;
    tokio::time::sleep(SEC).await;
    store.set(|f| &f.down, false);
    let (again, _) = leader.elected().await.unwrap();
    assert!(again > token);
    leader.step_down().await.unwrap();
    let events = events.lock().unwrap().clone();
    assert_eq!(
        events,
        vec![
            LeaderEvent::Elected { token },
            // The term ends a stop margin before the local deadline, not at it.
            LeaderEvent::Revoked {
                reason: RevokeReason::RenewalOverdue
            },
            LeaderEvent::Elected { token: again },
            LeaderEvent::Revoked {
                reason: RevokeReason::SteppedDown
            },
        ]
    );
}

#[test]
fn duplicate_tasks_are_rejected() {
    let ledger = Ledger::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let err = Scheduler::local()
            .task(recording_task(&ledger, SEC))
            .task(recording_task(&ledger, SEC))
            .start(std::future::pending())
            .unwrap_err();
        assert_eq!(err.to_string(), "task sweep is registered twice");
    });
}
