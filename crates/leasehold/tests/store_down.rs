//! Each store-down policy in every state of an instance (issue 12), on a paused clock: a full
//! outage under a leader group, a scheduler started while its store is down, `local`
//! re-attaching, ungated tasks beside gated ones, and refusals that retrying cannot fix.

mod support;

use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::{
    Catalog, HolderId, LeaseConfig, LeaseName, Membership, MemoryStore, Schedule, Scheduler,
    SchedulerHandle, Slots, StoreDownPolicy, Task, TickOutcome, Trigger,
};
use support::{Ledger, Run, assert_no_slot_twice, recorder};
use tokio::time::Instant;

const SEC: Duration = Duration::from_secs(1);

fn start<S: Slots + Membership + Catalog>(
    store: &S,
    holder: &str,
    policy: StoreDownPolicy,
    tasks: Vec<Task>,
) -> SchedulerHandle {
    let mut s = Scheduler::new(store.clone())
        .holder(HolderId::new(holder).unwrap())
        .lease_config(LeaseConfig::new(SEC * 3))
        .leader_group(LeaseName::new("pods").unwrap())
        .on_store_down(policy)
        .grace_period(SEC);
    for t in tasks {
        s = s.task(t);
    }
    s.start(std::future::pending()).unwrap()
}

fn runs_between(ledger: &Ledger, from: Instant, to: Instant) -> Vec<Run> {
    ledger
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.start >= from && r.start < to)
        .cloned()
        .collect()
}

/// The seed scenario: three pods under a leader group with fail-open, all cut off for 12 s.
/// Every pod runs every tick while cut off (the pod treats itself as leader), and within one
/// ttl of recovery the runs are single-instance again with no slot run twice.
#[tokio::test(start_paused = true)]
async fn fail_open_under_a_leader_group_never_stalls_and_re_attaches() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    let every_2s = || {
        recorder(
            &ledger,
            "library-refresh",
            Schedule::every(SEC * 2).unwrap(),
            SEC / 10,
        )
    };
    let pods: Vec<_> = ["p1", "p2", "p3"]
        .iter()
        .map(|p| start(&store, p, StoreDownPolicy::FailOpen, vec![every_2s()]))
        .collect();
    tokio::time::sleep(SEC * 9).await;
    let cut = Instant::now();
    store.set(|f| &f.down, true);
    tokio::time::sleep(SEC * 12).await;
    let back = Instant::now();
    store.set(|f| &f.down, false);
    let during = runs_between(&ledger, cut, back);
    for pod in ["p1", "p2", "p3"] {
        let n = during.iter().filter(|r| r.holder == pod).count();
        assert!(n >= 5, "{pod} ran {n} of 6 ticks while cut off");
    }
    assert!(
        during
            .iter()
            .all(|r| r.token.is_none() && r.trigger == Trigger::Timer)
    );
    for pod in &pods {
        assert!(pod.status().tasks[0].store_down_ticks >= 5);
    }
    // One ttl after recovery, gated again: each slot once, on one pod.
    tokio::time::sleep(SEC * 20).await;
    let after: Vec<Run> = runs_between(&ledger, back + SEC * 3, Instant::now());
    assert!(after.len() >= 8, "{} runs after recovery", after.len());
    let mut slots: Vec<u64> = after.iter().filter_map(|r| r.slot).collect();
    let n = slots.len();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), n, "a slot ran twice after recovery: {after:?}");
    assert!(after.iter().all(|r| r.token.is_some()));
    assert!(
        pods.iter()
            .any(|p| p.status().store_reachable == Some(true))
    );
}

/// Started while the store is down, fail-closed: nothing runs, then each tick exactly once as
/// soon as the store answers.
#[tokio::test(start_paused = true)]
async fn fail_closed_started_without_its_store_runs_once_per_tick_when_it_arrives() {
    let store = FaultyStore::new();
    store.set(|f| &f.down, true);
    let ledger = Ledger::default();
    let task = || recorder(&ledger, "sweep", Schedule::every(SEC).unwrap(), SEC / 10);
    let pods: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|p| start(&store, p, StoreDownPolicy::FailClosed, vec![task()]))
        .collect();
    tokio::time::sleep(SEC * 5).await;
    assert!(ledger.lock().unwrap().is_empty());
    assert_eq!(pods[0].status().store_reachable, Some(false));
    assert_eq!(
        pods[0].status().tasks[0].last.map(|l| l.0),
        Some(TickOutcome::SkippedStoreDown)
    );
    store.set(|f| &f.down, false);
    tokio::time::sleep(SEC * 10).await;
    assert!(ledger.lock().unwrap().len() >= 8);
    assert_no_slot_twice(&ledger);
}

/// `local` runs without coordination only while the store cannot answer: beside a normal
/// instance, no slot runs twice once the store is back.
#[tokio::test(start_paused = true)]
async fn local_re_attaches_when_the_store_answers() {
    let store = FaultyStore::new();
    store.set(|f| &f.down, true);
    let ledger = Ledger::default();
    let task = || recorder(&ledger, "sweep", Schedule::every(SEC).unwrap(), SEC / 10);
    let _local = start(&store, "local", StoreDownPolicy::Local, vec![task()]);
    tokio::time::sleep(SEC * 4).await;
    assert!(
        ledger.lock().unwrap().len() >= 3,
        "local ran while the store was down"
    );
    store.set(|f| &f.down, false);
    let back = Instant::now();
    let _normal = start(&store, "normal", StoreDownPolicy::FailClosed, vec![task()]);
    tokio::time::sleep(SEC * 20).await;
    let after = runs_between(&ledger, back + SEC * 3, Instant::now());
    let mut slots: Vec<u64> = after.iter().filter_map(|r| r.slot).collect();
    let n = slots.len();
    slots.sort_unstable();
    slots.dedup();
    assert!(n >= 15, "{n} runs after recovery");
    assert_eq!(slots.len(), n, "a slot ran twice after the store came back");
}

/// An ungated task runs every tick on every instance, beside a gated one that runs on the
/// leader only; the store being down does not touch it.
#[tokio::test(start_paused = true)]
async fn ungated_tasks_run_everywhere_beside_gated_ones() {
    let store = FaultyStore::new();
    let gated = Ledger::default();
    let ungated = Ledger::default();
    let tasks = || {
        vec![
            recorder(&gated, "scan", Schedule::every(SEC).unwrap(), SEC / 10),
            recorder(&ungated, "cache", Schedule::every(SEC).unwrap(), SEC / 10).gated(false),
        ]
    };
    let _a = start(&store, "a", StoreDownPolicy::FailClosed, tasks());
    let _b = start(&store, "b", StoreDownPolicy::FailClosed, tasks());
    tokio::time::sleep(SEC * 10).await;
    store.set(|f| &f.down, true);
    tokio::time::sleep(SEC * 5).await;
    assert_no_slot_twice(&gated);
    let gated_holders: Vec<String> = gated
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.holder.clone())
        .collect();
    assert!(gated_holders.len() >= 8);
    assert!(
        gated_holders.iter().all(|h| h == &gated_holders[0]),
        "gated task on one pod only"
    );
    let runs = ungated.lock().unwrap().clone();
    for pod in ["a", "b"] {
        let n = runs.iter().filter(|r| r.holder == pod).count();
        assert!(n >= 14, "ungated task ran {n} times on {pod} in 15 s");
    }
    assert!(runs.iter().all(|r| r.token.is_none()));
}

/// A store that refuses the leader lease (wrong key type, no permission) stops the scheduler
/// with a reason after a bounded number of tries, rather than leaving an idle process.
#[tokio::test(start_paused = true)]
async fn repeated_refusals_stop_the_scheduler_with_a_reason() {
    for group in [true, false] {
        let store = FaultyStore::new();
        store.set(|f| &f.refuse, true);
        let ledger = Ledger::default();
        let mut s = Scheduler::new(store.clone())
            .lease_config(LeaseConfig::new(SEC * 3))
            .task(recorder(
                &ledger,
                "sweep",
                Schedule::every(SEC).unwrap(),
                SEC / 10,
            ));
        if group {
            s = s.leader_group(LeaseName::new("pods").unwrap());
        }
        let s = s.start(std::future::pending()).unwrap();
        tokio::time::timeout(SEC * 120, s.wait())
            .await
            .expect("the scheduler stopped itself");
        let failure = s.failure().expect("a failure is reported");
        assert!(failure.contains("refused"), "{failure}");
        assert_eq!(s.status().failure, Some(failure));
    }
}

/// A refusal (credentials, permissions) is not an outage: whatever the store-down policy, a
/// scheduler whose store refuses never runs a tick (fail-open and local run ticks only while the
/// store cannot be reached) and gives up with a reason after a bounded number of refusals.
#[tokio::test(start_paused = true)]
async fn refusals_never_fail_open() {
    for policy in [
        StoreDownPolicy::FailOpen,
        StoreDownPolicy::Local,
        StoreDownPolicy::FailClosed,
    ] {
        for group in [true, false] {
            let store = FaultyStore::new();
            store.set(|f| &f.refuse, true);
            let ledger = Ledger::default();
            let mut s = Scheduler::new(store.clone())
                .lease_config(LeaseConfig::new(SEC * 3))
                .on_store_down(policy)
                .task(recorder(
                    &ledger,
                    "sweep",
                    Schedule::every(SEC).unwrap(),
                    SEC / 10,
                ));
            if group {
                s = s.leader_group(LeaseName::new("pods").unwrap());
            }
            let s = s.start(std::future::pending()).unwrap();
            tokio::time::timeout(SEC * 120, s.wait())
                .await
                .unwrap_or_else(|_| panic!("{policy}, group {group}: did not give up"));
            assert!(s.failure().is_some(), "{policy}, group {group}");
            let runs = ledger.lock().unwrap().len();
            assert_eq!(
                runs, 0,
                "{policy}, group {group}: ran against a refusing store"
            );
        }
    }
}

/// The memory store never goes down; the single-instance scheduler runs every tick.
#[tokio::test(start_paused = true)]
async fn single_instance_mode_runs_every_tick_ungated() {
    let ledger = Ledger::default();
    let s = Scheduler::local()
        .task(recorder(
            &ledger,
            "sweep",
            Schedule::every(SEC).unwrap(),
            SEC / 10,
        ))
        .start(std::future::pending())
        .unwrap();
    tokio::time::sleep(SEC * 5 + SEC / 2).await;
    assert!(ledger.lock().unwrap().len() >= 5);
    assert_eq!(
        s.status().tasks[0].last.map(|l| l.0),
        Some(TickOutcome::RanUngated)
    );
    let _ = MemoryStore::new();
}
