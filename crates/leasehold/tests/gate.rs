//! The gate's decision in one store call: once a task's ticks have read the store's clock, a
//! store that answers `Slots::tick` itself (`Capabilities::TICK`) decides a timer firing in one
//! call, with the same answers as the separate calls.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::catalog::{Control, Pause};
use leasehold::gate::{Gate, Skip, StoreClock};
use leasehold::history::HistoryWriter;
use leasehold::lifecycle::{Fired, RunsPerFiring, TaskPlan, TaskTicks};
use leasehold::store::{Answer, Layer, StoreResult};
use leasehold::{
    Capabilities, Catalog, CatchUp, HolderId, Lease, LeaseConfig, LeaseName, MemoryStore, Schedule,
    Slots, Store, Trigger,
};

/// A memory store that notes every call the gate makes.
#[derive(Clone, Default)]
struct Counted {
    inner: MemoryStore,
    calls: Arc<Mutex<Vec<&'static str>>>,
}

impl Counted {
    fn take_calls(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl Layer for Counted {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    fn around<'a, T: Answer, F>(
        &'a self,
        op: &'static str,
        call: impl FnOnce() -> F + Send + 'a,
    ) -> impl Future<Output = StoreResult<T>> + Send + 'a
    where
        F: Future<Output = StoreResult<T>> + Send + 'a,
    {
        self.calls.lock().unwrap().push(op);
        call()
    }
}

fn gate(store: &Counted, task: &LeaseName, holder: &str) -> Gate<Counted> {
    let config = LeaseConfig::new(Duration::from_secs(30));
    let lease = Lease::new(store.clone(), task.clone(), config)
        .unwrap()
        .with_holder(HolderId::new(holder).unwrap());
    Gate::new(lease)
}

/// One process's ticks of `task` (as a sidecar keeps them across its requests).
fn ticks(store: &Counted, task: &LeaseName) -> TaskTicks {
    let history = HistoryWriter::spawn(store.clone(), 100, Duration::from_secs(1));
    TaskTicks::new(
        task.clone(),
        HolderId::new("sidecar").unwrap(),
        history,
        Arc::new(StoreClock::new()),
    )
}

#[tokio::test]
async fn a_tick_is_one_store_call_once_the_clock_is_known() {
    let store = Counted::default();
    assert!(store.capabilities().contains(Capabilities::TICK));
    let task = LeaseName::new("gate/one-call").unwrap();
    let plan = TaskPlan::new(Schedule::every(Duration::from_secs(3600)).unwrap());
    let ticks = ticks(&store, &task);

    // No reading yet, nothing decided here: the clock with the control record and the slot
    // record (anything missed?), then the one call for the slot (its interval is an hour: a
    // firing anywhere in it is on time).
    let Fired::Run(ticket) = ticks.fire(&gate(&store, &task, "a"), &plan, None).await else {
        panic!("the first tick of a slot runs");
    };
    let slot = ticket.slot();
    assert_eq!(store.take_calls(), ["control", "last_slot", "tick"]);
    assert_eq!(store.last_slot(&task).await.unwrap(), Some(slot));
    assert!(ticks.store_now().is_some());
    store.take_calls();

    // Known clock: one call. The run holds the task lease and the slot is claimed.
    match ticks.fire(&gate(&store, &task, "b"), &plan, None).await {
        Fired::Skipped {
            slot: s,
            skip: Skip::AlreadyRun { last },
        } => assert_eq!((s, last), (slot, slot)),
        other => panic!("a second tick of the slot answered {other:?}"),
    }
    assert_eq!(store.take_calls(), ["tick"]);

    // Paused: the one call takes nothing; the gate records the slot as paused (claimed).
    ticket.into_guard().release().await.unwrap();
    let pause = Control {
        paused: Some(Pause {
            by: "test".to_owned(),
            reason: None,
            at_ms: slot,
        }),
        trigger: None,
    };
    store
        .set_control(&task, None, &pause.to_json())
        .await
        .unwrap();
    store.take_calls();
    match ticks.fire(&gate(&store, &task, "c"), &plan, None).await {
        Fired::Skipped {
            skip: Skip::Paused(p),
            ..
        } => assert_eq!(p.by, "test"),
        other => panic!("a paused task's tick answered {other:?}"),
    }
    assert_eq!(store.take_calls(), ["tick", "claim_slot"]);
    assert_eq!(
        store.inspect(&task).await.unwrap().and_then(|s| s.holder),
        None
    );
}

#[tokio::test(start_paused = true)]
async fn a_clock_estimate_carried_forward_names_the_next_slot_in_one_call() {
    let store = Counted::default();
    let task = LeaseName::new("gate/stale-clock").unwrap();
    let plan = TaskPlan::new(Schedule::every(Duration::from_millis(100)).unwrap());
    let ticks = ticks(&store, &task);
    let g = gate(&store, &task, "a");
    let Fired::Run(ticket) = ticks.fire(&g, &plan, None).await else {
        panic!("the first tick of an every-100ms task runs");
    };
    let first = ticket.slot();
    drop(ticket);
    // The store's clock was read 100 ms ago: the slot named from the estimate carried forward
    // on the monotonic clock is the next one, and the store decides it in one call.
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.take_calls();
    let Fired::Run(ticket) = ticks.fire(&g, &plan, None).await else {
        panic!("the next slot runs");
    };
    assert_eq!(ticket.slot(), first + 100);
    assert_eq!(store.take_calls(), ["tick"]);
}

/// A new leader looks back half way between two slots after three went unrun, and catches up
/// the newest: what, if anything, it decides right after that run, given when (ms after the
/// look back) the catch-up is decided, when its run starts and how long it lasts.
async fn after_a_catch_up(decided: u64, starts: u64, lasts: u64) -> (u64, Option<(u64, Trigger)>) {
    let store = Counted::default();
    let task = LeaseName::new("gate/catch-up-then-due").unwrap();
    let plan = TaskPlan::new(Schedule::every(Duration::from_secs(1)).unwrap())
        .catch_up(CatchUp::Latest {
            window: Duration::from_secs(3600),
        })
        .runs(RunsPerFiring::All);
    let g = gate(&store, &task, "a");
    let first = {
        let old_leader = ticks(&store, &task);
        let Fired::Run(ticket) = old_leader.fire(&g, &plan, None).await else {
            panic!("the first tick runs");
        };
        let slot = ticket.slot();
        ticket.into_guard().release().await.unwrap();
        slot
    };
    let now = store.now_millis().await.unwrap();
    tokio::time::sleep(Duration::from_millis(first + 3_500 - now)).await;
    let new_leader = ticks(&store, &task);
    assert!(new_leader.look_for_missed(&g, &plan).await.unwrap());
    tokio::time::sleep(Duration::from_millis(decided)).await;
    let Some(Fired::Run(catch_up)) = new_leader.fire_queued(&g, &plan).await else {
        panic!("the newest missed slot is caught up");
    };
    assert_eq!(
        (catch_up.slot(), catch_up.trigger()),
        (first + 3_000, Trigger::CatchUp)
    );
    tokio::time::sleep(Duration::from_millis(starts - decided)).await;
    let start = new_leader.run_starts(catch_up.slot());
    tokio::time::sleep(Duration::from_millis(lasts)).await;
    new_leader.run_ended(&plan.schedule, start).await;
    catch_up.into_guard().release().await.unwrap();
    let next = match new_leader.fire_queued(&g, &plan).await {
        None => None,
        Some(Fired::Run(due)) => Some((due.slot(), due.trigger())),
        Some(other) => panic!("{other:?}"),
    };
    (first, next)
}

/// The store answered the look back late: the slot that fell due before the catch-up was
/// decided runs next as `timer`, on time, not a slot later as a second catch-up.
#[tokio::test(start_paused = true)]
async fn the_slot_due_when_a_catch_up_is_decided_runs_next_on_time() {
    let (first, next) = after_a_catch_up(700, 700, 50).await;
    assert_eq!(next, Some((first + 4_000, Trigger::Timer)));
}

/// The catch-up was decided just before a slot and its run started just after it (a CI run
/// caught the slot a second later as a second catch-up): that slot too runs next, on time.
#[tokio::test(start_paused = true)]
async fn the_slot_due_when_a_catch_up_starts_runs_next_on_time() {
    let (first, next) = after_a_catch_up(300, 700, 50).await;
    assert_eq!(next, Some((first + 4_000, Trigger::Timer)));
}

/// A slot that fell due while the catch-up ran is missed for the overlap, as after any run:
/// nothing runs right after it.
#[tokio::test(start_paused = true)]
async fn the_slot_due_while_a_catch_up_runs_is_not_run_after_it() {
    let (_, next) = after_a_catch_up(300, 300, 400).await;
    assert_eq!(next, None);
}

/// The catch-up's run started more than a slot late (a loaded CI host, a slow store): the
/// newest slot due runs next, on time, and the one between is missed, not caught up later.
#[tokio::test(start_paused = true)]
async fn the_newest_slot_due_when_a_late_catch_up_ends_runs_next_on_time() {
    let (first, next) = after_a_catch_up(300, 1_700, 50).await;
    assert_eq!(next, Some((first + 5_000, Trigger::Timer)));
}
