//! Fleet control through the store's catalog (issue 25), on a paused clock with two scheduler
//! instances on one memory store: what each instance registers, and pause, resume and trigger
//! in the call orders that matter (a pause while a run is going, a trigger during a leader
//! change, a resume racing a pause).

mod support;

use std::time::Duration;

use leasehold::catalog::TaskSource;
use leasehold::fleet::{Fleet, FleetError};
use leasehold::history::{self, RecordTrigger, RunOutcome};
use leasehold::{
    HolderId, LeaseConfig, LeaseName, MemoryStore, Schedule, Scheduler, SchedulerHandle, Trigger,
};
use support::{Ledger, assert_no_overlap, assert_no_slot_twice, recorder};

const SEC: Duration = Duration::from_secs(1);

fn name(s: &str) -> LeaseName {
    LeaseName::new(s).unwrap()
}

/// An instance running `sweep` every 10 s (each run working `work`), led by group `pods`.
fn instance(store: &MemoryStore, holder: &str, ledger: &Ledger, work: Duration) -> SchedulerHandle {
    Scheduler::new(store.clone())
        .holder(HolderId::new(holder).unwrap())
        .lease_config(LeaseConfig::new(SEC * 6))
        .grace_period(SEC)
        .leader_group(name("pods"))
        .registered_as(TaskSource::Run)
        .task(recorder(
            ledger,
            "sweep",
            Schedule::every(SEC * 10).unwrap(),
            work,
        ))
        .start(std::future::pending())
        .unwrap()
}

fn runs_between(ledger: &Ledger, from: tokio::time::Instant, to: tokio::time::Instant) -> usize {
    let runs = ledger.lock().unwrap();
    runs.iter()
        .filter(|r| r.trigger == Trigger::Timer && r.start >= from && r.start < to)
        .count()
}

#[tokio::test(start_paused = true)]
async fn both_instances_register_and_the_catalog_lists_them() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let _a = instance(&store, "a", &ledger, SEC);
    let _b = instance(&store, "b", &ledger, SEC);
    tokio::time::sleep(SEC * 3).await;
    let fleet = Fleet::new(store.clone());
    let tasks = fleet.tasks().await.unwrap();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    let sweep = &tasks[0];
    assert_eq!(sweep.name, name("sweep"));
    let def = sweep.definition.as_ref().unwrap();
    assert_eq!(def.source, TaskSource::Run);
    assert_eq!(def.leader_group.as_deref(), Some("pods"));
    assert!(def.gated);
    let holders: Vec<String> = sweep
        .instances
        .iter()
        .map(|i| i.instance.to_string())
        .collect();
    assert_eq!(holders, ["a", "b"]);
    assert!(sweep.instances.iter().all(|i| i.live));
    let version = &sweep.instances[0].info.as_ref().unwrap().version;
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    // The leader group's lease is listed among the leases.
    let leases = fleet.leases(100).await.unwrap();
    assert!(
        leases
            .iter()
            .any(|l| l.name == name("pods") && l.state.holder.is_some()),
        "{leases:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn unknown_tasks_and_tasks_nobody_runs_are_named() {
    let store = MemoryStore::new();
    let fleet = Fleet::new(store.clone());
    let missing = name("missing");
    assert!(matches!(
        fleet.pause(&missing, "ops", None).await,
        Err(FleetError::UnknownTask(t)) if t == missing
    ));
    assert!(matches!(
        fleet.trigger(&missing, "ops").await,
        Err(FleetError::UnknownTask(_))
    ));
    // An instance that registered and then died: its heartbeat ran out.
    let (task, who) = (name("orphan"), HolderId::new("dead").unwrap());
    let registration = leasehold::catalog::Registration {
        task: &task,
        definition: r#"{"source":"run","schedule":"every 10s","on_store_down":"fail-closed","gated":true}"#,
        instance: &who,
        about: "{}",
        ttl: SEC,
        forget_after: leasehold::catalog::CATALOG_RETENTION,
    };
    leasehold::Catalog::register(&store, &registration)
        .await
        .unwrap();
    tokio::time::sleep(SEC * 2).await;
    let view = fleet.task(&task).await.unwrap();
    assert!(!view.has_live_instance(), "{view:?}");
    // Still listed (for a day), but nobody would take a trigger.
    assert!(matches!(
        fleet.trigger(&task, "ops").await,
        Err(FleetError::NoInstance(_))
    ));
    // A task whose instances all stopped gracefully leaves the catalog with them.
    let ledger = Ledger::default();
    let a = instance(&store, "a", &ledger, SEC);
    tokio::time::sleep(SEC).await;
    assert!(fleet.task(&name("sweep")).await.is_ok());
    a.shutdown().await;
    a.wait().await;
    assert!(matches!(
        fleet.task(&name("sweep")).await,
        Err(FleetError::UnknownTask(_))
    ));
}

/// A pause stops runs on every instance within one tick interval; the slots that fall while
/// paused are recorded as paused (with who and why) and never caught up; resume restarts at the
/// next slot. A run already going when the pause lands finishes.
#[tokio::test(start_paused = true)]
async fn pause_stops_every_instance_and_resume_restarts_them() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let a = instance(&store, "a", &ledger, SEC * 4);
    let _b = instance(&store, "b", &ledger, SEC * 4);
    let fleet = Fleet::new(store.clone());
    // Let a few slots run, and land the pause in the middle of a run.
    tokio::time::sleep(SEC * 25).await;
    let slot_ms = 10_000;
    let now_ms = leasehold::Store::now_millis(&store).await.unwrap();
    let into_slot = now_ms % slot_ms;
    tokio::time::sleep(Duration::from_millis(slot_ms - into_slot + 1_000)).await;
    let before_pause = ledger.lock().unwrap().len();
    let pause = fleet
        .pause(&name("sweep"), "ops@desk", Some("vendor down"))
        .await
        .unwrap();
    assert_eq!(pause.by, "ops@desk");
    let paused_at = tokio::time::Instant::now();
    tokio::time::sleep(SEC * 45).await;
    let resumed_at = tokio::time::Instant::now();
    // The run going when the pause landed finished, uncancelled.
    {
        let runs = ledger.lock().unwrap();
        assert_eq!(runs.len(), before_pause + 1, "{runs:?}");
        assert!(
            !runs.last().unwrap().cancelled,
            "a run going at the pause finishes"
        );
    }
    assert_eq!(runs_between(&ledger, paused_at, resumed_at), 0);
    assert!(fleet.resume(&name("sweep")).await.unwrap());
    assert!(
        !fleet.resume(&name("sweep")).await.unwrap(),
        "resuming twice is a no-op"
    );
    tokio::time::sleep(SEC * 30).await;
    let after = runs_between(&ledger, resumed_at, tokio::time::Instant::now());
    assert!(
        (2..=3).contains(&after),
        "{after} runs in the 30 s after resume"
    );
    assert_no_slot_twice(&ledger);
    let records = a.history("sweep", 100).await.unwrap();
    let paused: Vec<_> = records.iter().filter(|r| r.paused.is_some()).collect();
    assert!(
        (4..=5).contains(&paused.len()),
        "paused slots recorded: {records:#?}"
    );
    assert!(paused.iter().all(|r| {
        let p = r.paused.as_ref().unwrap();
        p.by == "ops@desk" && p.reason.as_deref() == Some("vendor down")
    }));
    // Never caught up: no run of a paused slot.
    let ran: Vec<u64> = ledger
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| r.slot)
        .collect();
    assert!(paused.iter().all(|r| !ran.contains(&r.slot.unwrap())));
}

/// A trigger runs the task once, on one instance, holding the task lease (never beside a timer
/// run), recorded as a manual run with who asked; it is taken even while the leader changes.
#[tokio::test(start_paused = true)]
async fn a_trigger_runs_once_with_the_task_lease_even_across_a_leader_change() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let a = instance(&store, "a", &ledger, SEC * 3);
    let b = instance(&store, "b", &ledger, SEC * 3);
    let fleet = Fleet::new(store.clone());
    tokio::time::sleep(SEC * 12).await;
    let request = fleet.trigger(&name("sweep"), "ops@desk").await.unwrap();
    // A second trigger while the first waits is the same request.
    let again = fleet.trigger(&name("sweep"), "someone-else").await.unwrap();
    assert_eq!(again.id, request.id);
    // The leader steps down at once: whoever leads next (or anyone, between) takes it.
    a.shutdown().await;
    let run = fleet
        .wait_for_run(&name("sweep"), &request, SEC * 60)
        .await
        .unwrap();
    assert_eq!(run.trigger, Some(RecordTrigger::Manual));
    assert_eq!(run.outcome, RunOutcome::Ok);
    let asked = run.request.as_ref().unwrap();
    assert_eq!(
        (asked.id.as_str(), asked.by.as_str()),
        (request.id.as_str(), "ops@desk")
    );
    assert!(run.token.is_some(), "a triggered run holds the task lease");
    tokio::time::sleep(SEC * 20).await;
    let runs = ledger.lock().unwrap().clone();
    let manual: Vec<_> = runs
        .iter()
        .filter(|r| r.trigger == Trigger::Manual)
        .collect();
    assert_eq!(manual.len(), 1, "{runs:#?}");
    // Never beside another run of the task.
    assert_no_overlap(&runs);
    let records = history::read(&store, &name("sweep"), 100).await.unwrap();
    assert_eq!(records.iter().filter(|r| r.request.is_some()).count(), 1);
    drop(b);
}

/// Pause and resume racing through two handles: compare-and-set leaves one of the two states,
/// never a mix, and every instance agrees at its next tick.
#[tokio::test(start_paused = true)]
async fn pause_and_resume_racing_leave_one_state() {
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    let _a = instance(&store, "a", &ledger, SEC);
    tokio::time::sleep(SEC).await;
    let (f1, f2) = (Fleet::new(store.clone()), Fleet::new(store.clone()));
    for round in 0..20 {
        let task = name("sweep");
        let (p, r) = tokio::join!(f1.pause(&task, "one", None), f2.resume(&task));
        p.unwrap();
        r.unwrap();
        let view = f1.task(&task).await.unwrap();
        // Whichever landed last wins; the record is whole either way.
        if let Some(pause) = view.paused {
            assert_eq!(pause.by, "one", "round {round}");
        }
        f1.resume(&task).await.unwrap();
        assert!(f1.task(&task).await.unwrap().paused.is_none());
    }
}

/// Catalog beats in step with the runs: every second a run holds the task lease from just after
/// the second to 0.9 s past it, and the beat (once per renew interval, 1 s) always comes half way
/// through one, so a beat never finds the task lease free. The trigger is taken as the run it
/// was seen beside ends (the run's tick read it), within two seconds, once.
#[tokio::test(start_paused = true)]
async fn a_trigger_is_taken_when_beats_always_fall_inside_a_run() {
    use leasehold::Store;
    let store = MemoryStore::new();
    let ledger = Ledger::default();
    // Start half a second past a second of the store's clock: the beats keep that phase.
    let now = store.now_millis().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000 - now % 1000 + 500)).await;
    let _a = Scheduler::new(store.clone())
        .holder(HolderId::new("a").unwrap())
        .lease_config(LeaseConfig::new(SEC * 3))
        .registered_as(TaskSource::Run)
        .task(recorder(
            &ledger,
            "sweep",
            Schedule::every(SEC).unwrap(),
            Duration::from_millis(900),
        ))
        .start(std::future::pending())
        .unwrap();
    tokio::time::sleep(SEC * 5).await;
    let fleet = Fleet::new(store.clone());
    let asked = tokio::time::Instant::now();
    let request = fleet.trigger(&name("sweep"), "ops").await.unwrap();
    let run = fleet
        .wait_for_run(&name("sweep"), &request, SEC * 30)
        .await
        .unwrap();
    assert_eq!(run.trigger, Some(RecordTrigger::Manual));
    let runs = ledger.lock().unwrap().clone();
    let manual: Vec<_> = runs
        .iter()
        .filter(|r| r.trigger == Trigger::Manual)
        .collect();
    assert_eq!(manual.len(), 1, "{runs:#?}");
    assert!(
        manual[0].start - asked <= SEC * 2,
        "taken {:?} after it was asked for",
        manual[0].start - asked
    );
    assert_no_overlap(&runs);
    assert_no_slot_twice(&ledger);
}
