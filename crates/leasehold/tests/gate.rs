//! The gate's decision in one store call: once a gate has read the store's clock, a store that
//! answers `Slots::tick` itself (`Capabilities::TICK`) decides a tick in one call, with the
//! same answers as the separate calls.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::catalog::{Control, Pause};
use leasehold::gate::{Decision, Due, Gate, Skip, StoreClock};
use leasehold::store::{Answer, Layer, StoreResult};
use leasehold::{
    Capabilities, Catalog, HolderId, Lease, LeaseConfig, LeaseName, MemoryStore, Schedule, Slots,
    Store,
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

#[tokio::test]
async fn a_tick_is_one_store_call_once_the_clock_is_known() {
    let store = Counted::default();
    assert!(store.capabilities().contains(Capabilities::TICK));
    let task = LeaseName::new("gate/one-call").unwrap();
    let schedule = Schedule::every(Duration::from_secs(3600)).unwrap();
    let clock = StoreClock::new();

    // No reading yet: the clock with the control record, then the one call for the slot.
    let first = gate(&store, &task, "a");
    let Due::Decided {
        slot,
        decision: Decision::Run(ticket),
        ..
    } = first.decide_due(&schedule, &clock).await.unwrap()
    else {
        panic!("the first tick of a slot runs");
    };
    assert_eq!(store.take_calls(), ["control", "tick"]);
    assert_eq!(store.last_slot(&task).await.unwrap(), Some(slot));
    assert!(clock.now_ms().is_some());
    store.take_calls();

    // Known clock: one call. The run holds the task lease and the slot is claimed.
    let second = gate(&store, &task, "b");
    match second.decide_due(&schedule, &clock).await.unwrap() {
        Due::Decided {
            slot: s,
            decision: Decision::Skip(Skip::AlreadyRun { last }),
            ..
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
    let third = gate(&store, &task, "c");
    match third.decide_due(&schedule, &clock).await.unwrap() {
        Due::Decided {
            reading,
            decision: Decision::Skip(Skip::Paused(p)),
            ..
        } => {
            assert_eq!(p.by, "test");
            assert!(reading.control.is_some_and(|c| c.paused.is_some()));
        }
        other => panic!("a paused task's tick answered {other:?}"),
    }
    assert_eq!(store.take_calls(), ["tick", "claim_slot"]);
    assert_eq!(
        store.inspect(&task).await.unwrap().and_then(|s| s.holder),
        None
    );
}

#[tokio::test]
async fn a_stale_clock_costs_a_second_call_not_a_wrong_slot() {
    let store = Counted::default();
    let task = LeaseName::new("gate/stale-clock").unwrap();
    let schedule = Schedule::every(Duration::from_millis(100)).unwrap();
    let clock = StoreClock::new();
    let g = gate(&store, &task, "a");
    let Due::Decided { decision, .. } = g.decide_due(&schedule, &clock).await.unwrap() else {
        panic!("an every-100ms task is always due");
    };
    let Decision::Run(ticket) = decision else {
        panic!("the first tick runs");
    };
    drop(ticket);
    // The local clock runs on; the store's reading is 250 ms old: the slot named from it is
    // still right (the monotonic clock moved with it).
    tokio::time::sleep(Duration::from_millis(250)).await;
    store.take_calls();
    let Due::Decided { slot, reading, .. } = g.decide_due(&schedule, &clock).await.unwrap() else {
        panic!("due");
    };
    assert_eq!(Some(slot), schedule.latest_at_or_before(reading.now_ms));
    assert_eq!(store.take_calls().first(), Some(&"tick"));
}
