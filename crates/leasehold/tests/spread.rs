//! Tasks spread over instances (`Scheduler::spread`), on a paused tokio clock: each instance
//! runs the tasks it owns, tasks move when members join, leave or crash, and while views of the
//! membership disagree no slot runs twice.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::history::RunOutcome;
use leasehold::{
    CatchUp, HolderId, LeaseConfig, LeaseName, MemoryStore, Schedule, Scheduler, SchedulerHandle,
    TickOutcome,
};
use support::{Ledger, recorder};
use tokio::time::Instant;

const SEC: Duration = Duration::from_secs(1);
const TTL: Duration = Duration::from_secs(3);
const TASKS: usize = 12;

fn task_name(i: usize) -> String {
    format!("task-{i:02}")
}

/// One ledger per task.
fn ledgers() -> Vec<Ledger> {
    (0..TASKS).map(|_| Ledger::default()).collect()
}

/// An instance named `name` spreading every task over the group `spread`, through its own
/// fault switches on the shared `store`.
fn instance(store: &MemoryStore, name: &str, ledgers: &[Ledger]) -> (SchedulerHandle, FaultyStore) {
    let faulty = FaultyStore::wrap(store.clone());
    let mut s = Scheduler::new(faulty.clone())
        .holder(HolderId::new(name).unwrap())
        .lease_config(LeaseConfig::new(TTL))
        .grace_period(SEC)
        .spread(LeaseName::new("spread").unwrap());
    for (i, ledger) in ledgers.iter().enumerate() {
        // Every slot a member's departure leaves unrun is caught up by the task's next owner.
        let task = recorder(
            ledger,
            &task_name(i),
            Schedule::every(SEC).unwrap(),
            SEC / 10,
        )
        .catch_up(CatchUp::All {
            window: SEC * 30,
            max: 30,
        });
        s = s.task(task);
    }
    (s.start(std::future::pending()).unwrap(), faulty)
}

/// The slots of each task that the history in the store records as missed.
async fn recorded_misses(handle: &SchedulerHandle) -> Vec<BTreeSet<u64>> {
    let mut misses = Vec::new();
    for i in 0..TASKS {
        let mut slots = BTreeSet::new();
        for r in handle.history(&task_name(i), 100).await.unwrap() {
            if let (Some(first), RunOutcome::Missed { last_slot, .. }) = (r.slot, r.outcome) {
                slots.extend((first..=last_slot).step_by(1_000));
            }
        }
        misses.push(slots);
    }
    misses
}

/// No slot of any task ran twice, and from each task's first run to at least `until`
/// (store-clock ms) every slot ran, or is recorded missed in the store's history. (A slot falls
/// due while its new owner catches up the ones its old owner left unrun; the catch-up runs in
/// order and the timer then fires for the next slot, recording the one it passed.)
async fn assert_every_slot_once(handle: &SchedulerHandle, ledgers: &[Ledger], until: u64) {
    let misses = recorded_misses(handle).await;
    for (i, ledger) in ledgers.iter().enumerate() {
        let runs: Vec<(u64, String, leasehold::Trigger)> = ledger
            .lock()
            .unwrap()
            .iter()
            .map(|r| (r.slot.unwrap_or(0), r.holder.clone(), r.trigger))
            .collect();
        let mut slots: Vec<u64> = runs.iter().map(|r| r.0).collect();
        slots.sort_unstable();
        let mut dedup = slots.clone();
        dedup.dedup();
        assert_eq!(slots, dedup, "{}: a slot ran twice: {runs:?}", task_name(i));
        let (first, last) = (slots[0], *slots.last().unwrap());
        assert!(last >= until, "{}: ran only up to {last}", task_name(i));
        for slot in (first..=last).step_by(1_000) {
            assert!(
                slots.binary_search(&slot).is_ok() || misses[i].contains(&slot),
                "{}: slot {slot} neither ran nor is recorded missed: {runs:?}",
                task_name(i)
            );
        }
    }
}

/// Which instance ran each task's runs started in `from..to`.
fn runners(ledgers: &[Ledger], from: Instant, to: Instant) -> Vec<BTreeSet<String>> {
    ledgers
        .iter()
        .map(|l| {
            l.lock()
                .unwrap()
                .iter()
                .filter(|r| r.start >= from && r.start < to)
                .map(|r| r.holder.clone())
                .collect()
        })
        .collect()
}

/// Each task's owner by the instances' status (each task owned by exactly one instance).
fn owners(instances: &[(&str, &SchedulerHandle)]) -> BTreeMap<String, String> {
    let mut owners = BTreeMap::new();
    for (name, handle) in instances {
        for t in handle.status().tasks {
            if t.owned == Some(true) {
                let before = owners.insert(t.name.to_string(), name.to_string());
                assert_eq!(before, None, "{} owned twice", t.name);
            }
        }
    }
    assert_eq!(owners.len(), TASKS, "every task has an owner: {owners:?}");
    owners
}

async fn store_now(store: &MemoryStore) -> u64 {
    leasehold::Store::now_millis(store).await.unwrap()
}

/// The slot a run may still be finishing, and the one before it, are not yet in the ledger.
async fn finished_until(store: &MemoryStore) -> u64 {
    store_now(store).await - 2_000
}

/// Sleeps to the middle of a second on the store's clock, when no run (100 ms from each
/// whole second) is in progress: a member cut off then holds no task lease.
async fn between_runs(store: &MemoryStore) {
    let into = store_now(store).await % 1_000;
    tokio::time::sleep(Duration::from_millis((1_500 - into) % 1_000)).await;
}

#[tokio::test(start_paused = true)]
async fn each_task_runs_on_its_owner_and_a_joiner_takes_its_share() {
    let store = MemoryStore::new();
    let ledgers = ledgers();
    let (a, _) = instance(&store, "a", &ledgers);
    let (b, _) = instance(&store, "b", &ledgers);
    let (c, _) = instance(&store, "c", &ledgers);
    tokio::time::sleep(SEC * 5).await;
    let before = owners(&[("a", &a), ("b", &b), ("c", &c)]);
    let per: BTreeSet<&String> = before.values().collect();
    assert_eq!(per.len(), 3, "every instance owns a task: {before:?}");
    let members = a.status().members.unwrap();
    assert_eq!(
        members.iter().map(HolderId::as_str).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    let (from, to) = (Instant::now(), Instant::now() + SEC * 5);
    tokio::time::sleep(SEC * 5).await;
    for (i, ran) in runners(&ledgers, from, to).iter().enumerate() {
        let owner = &before[&task_name(i)];
        assert_eq!(ran, &BTreeSet::from([owner.clone()]), "{}", task_name(i));
    }
    // Instances that do not own a task skip its ticks.
    let skipped = c.status().tasks.iter().any(|t| {
        t.owned == Some(false) && t.last.map(|l| l.0) == Some(TickOutcome::SkippedNotOwner)
    });
    assert!(skipped, "c skips the ticks of the tasks it does not own");

    let (d, _) = instance(&store, "d", &ledgers);
    tokio::time::sleep(SEC * 5).await;
    let after = owners(&[("a", &a), ("b", &b), ("c", &c), ("d", &d)]);
    let moved: Vec<&String> = after.keys().filter(|t| before[*t] != after[*t]).collect();
    assert!(!moved.is_empty(), "d took some tasks over");
    assert!(
        moved.iter().all(|t| after[*t] == "d"),
        "only tasks moving to the joiner moved: {before:?} -> {after:?}"
    );
    let (from, to) = (Instant::now(), Instant::now() + SEC * 5);
    tokio::time::sleep(SEC * 5).await;
    for (i, ran) in runners(&ledgers, from, to).iter().enumerate() {
        assert_eq!(ran, &BTreeSet::from([after[&task_name(i)].clone()]));
    }
    assert_every_slot_once(&a, &ledgers, finished_until(&store).await).await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_members_tasks_move_within_about_a_ttl() {
    let store = MemoryStore::new();
    let ledgers = ledgers();
    let (a, _) = instance(&store, "a", &ledgers);
    let (b, _) = instance(&store, "b", &ledgers);
    let (c, c_store) = instance(&store, "c", &ledgers);
    tokio::time::sleep(SEC * 5).await;
    let before = owners(&[("a", &a), ("b", &b), ("c", &c)]);
    // c is cut off from the store (as if it crashed): no heartbeat, no leave, no runs.
    between_runs(&store).await;
    c_store.set(|f| &f.down, true);
    let crashed = Instant::now();
    tokio::time::sleep(SEC * 10).await;
    let mut moved = 0;
    for (i, ledger) in ledgers.iter().enumerate() {
        if before[&task_name(i)] != "c" {
            continue;
        }
        moved += 1;
        let first_after = ledger
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.start >= crashed && r.trigger == leasehold::Trigger::Timer)
            .map(|r| (r.start, r.holder.clone()))
            .min()
            .expect("the task runs again");
        assert_ne!(first_after.1, "c");
        // Expiry (a ttl after c's last heartbeat) plus one heartbeat interval, plus the tick.
        let took = first_after.0 - crashed;
        assert!(
            took <= TTL + TTL / 3 + SEC,
            "{} moved after {took:?}",
            task_name(i)
        );
    }
    assert!(moved > 0, "c owned a task: {before:?}");
    let members = a.status().members.unwrap();
    assert_eq!(
        members.iter().map(HolderId::as_str).collect::<Vec<_>>(),
        ["a", "b"]
    );
    // The survivors own every task between them, and each runs only on its owner.
    let after = owners(&[("a", &a), ("b", &b)]);
    let (from, to) = (Instant::now(), Instant::now() + SEC * 3);
    tokio::time::sleep(SEC * 3).await;
    for (i, ran) in runners(&ledgers, from, to).iter().enumerate() {
        assert_eq!(ran, &BTreeSet::from([after[&task_name(i)].clone()]));
    }
    // The slots missed meanwhile were caught up by the new owners.
    assert_every_slot_once(&a, &ledgers, finished_until(&store).await).await;
    drop(c);
}

#[tokio::test(start_paused = true)]
async fn a_leaving_member_hands_its_tasks_over_at_once() {
    let store = MemoryStore::new();
    let ledgers = ledgers();
    let (a, _) = instance(&store, "a", &ledgers);
    let (b, _) = instance(&store, "b", &ledgers);
    let (c, _) = instance(&store, "c", &ledgers);
    tokio::time::sleep(SEC * 5).await;
    owners(&[("a", &a), ("b", &b), ("c", &c)]);
    let left = Instant::now();
    c.shutdown().await;
    // Seen at the others' next heartbeat (a third of the ttl), not at c's entry's expiry.
    tokio::time::sleep(TTL / 3 + SEC / 10).await;
    assert!(Instant::now() - left < TTL);
    owners(&[("a", &a), ("b", &b)]);
    tokio::time::sleep(SEC * 5).await;
    assert_every_slot_once(&a, &ledgers, finished_until(&store).await).await;
}

#[tokio::test(start_paused = true)]
async fn disagreeing_views_never_run_a_slot_twice() {
    let store = MemoryStore::new();
    let ledgers = ledgers();
    let (a, _) = instance(&store, "a", &ledgers);
    let (b, _) = instance(&store, "b", &ledgers);
    // d's store keeps no membership: d contends for every task, alongside each task's owner,
    // as an instance does while its view lags behind the others'. Its clock reads 300 ms behind,
    // so it tries each slot after the owner's run has released the task lease: only the slot
    // claim stops it.
    let (d, d_store) = instance(&store, "d", &ledgers);
    d_store.set(|f| &f.members_unsupported, true);
    d_store
        .faults
        .clock_offset_ms
        .store(-300, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(SEC * 4).await;
    assert!(d.status().members.is_none(), "d's placement is off");
    assert!(d.status().tasks.iter().all(|t| t.owned.is_none()));
    // Joins and a crash while d races everyone.
    let (c, c_store) = instance(&store, "c", &ledgers);
    tokio::time::sleep(SEC * 4).await;
    between_runs(&store).await;
    c_store.set(|f| &f.down, true);
    tokio::time::sleep(SEC * 8).await;
    assert_every_slot_once(&a, &ledgers, finished_until(&store).await).await;
    let ran_on_d = ledgers
        .iter()
        .any(|l| l.lock().unwrap().iter().any(|r| r.holder == "d"));
    let ran_on_others = ledgers
        .iter()
        .any(|l| l.lock().unwrap().iter().any(|r| r.holder != "d"));
    assert!(ran_on_d && ran_on_others, "both views won some ticks");
    drop((a, b, c));
}

#[tokio::test(start_paused = true)]
async fn spreading_and_a_leader_group_are_exclusive() {
    let err = Scheduler::new(MemoryStore::new())
        .spread(LeaseName::new("g").unwrap())
        .leader_group(LeaseName::new("l").unwrap())
        .start(std::future::pending())
        .unwrap_err();
    assert!(matches!(
        err,
        leasehold::SchedulerError::SpreadWithLeaderGroup
    ));
}
