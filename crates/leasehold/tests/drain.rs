//! Shutdown drains running jobs (issue 38): no new slot is taken, the run goes on holding and
//! renewing its lease for up to the grace period, and is still cancelled at once when its lease
//! is lost or starts expiring. On a paused clock.

mod support;

use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::history::{RecordTrigger, RunOutcome, RunRecord};
use leasehold::{HolderId, LeaseConfig, Schedule, Scheduler, SchedulerHandle};
use support::{Ledger, Run, recorder};
use tokio::time::Instant;

const SEC: Duration = Duration::from_secs(1);
const TTL: Duration = Duration::from_secs(3);

/// One instance running `sweep` every second, each run working for `work` (or until
/// cancelled), with a shutdown grace period of `grace`.
fn start(store: &FaultyStore, ledger: &Ledger, work: Duration, grace: Duration) -> SchedulerHandle {
    Scheduler::new(store.clone())
        .holder(HolderId::new("a").unwrap())
        .lease_config(LeaseConfig::new(TTL))
        .grace_period(grace)
        .task(recorder(
            ledger,
            "sweep",
            Schedule::every(SEC).unwrap(),
            work,
        ))
        .start(std::future::pending())
        .unwrap()
}

/// Waits until the first run is going, then half a second more; returns when it started.
async fn mid_run(s: &SchedulerHandle) -> Instant {
    while !s.status().tasks[0].running {
        tokio::time::sleep(SEC / 20).await;
    }
    let started = Instant::now();
    tokio::time::sleep(SEC / 2).await;
    started
}

/// Begins shutdown without waiting for it; the handle's `wait` tells when it is done.
fn begin_shutdown(s: &SchedulerHandle) {
    let s = s.clone();
    tokio::spawn(async move { s.shutdown().await });
}

fn runs(ledger: &Ledger) -> Vec<Run> {
    ledger.lock().unwrap().clone()
}

/// The runs (not missed slots) in the task's history, newest first.
async fn recorded_runs(s: &SchedulerHandle) -> Vec<RunRecord> {
    let all = s.history("sweep", 100).await.unwrap();
    all.into_iter().filter(|r| r.trigger.is_some()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_run_shorter_than_the_grace_finishes_and_no_slot_is_taken_meanwhile() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    // The run outlives the lease's ttl twice over: it is renewed throughout the drain.
    let work = TTL * 2 + SEC;
    let s = start(&store, &ledger, work, SEC * 30);
    mid_run(&s).await;
    let stopping = Instant::now();
    s.shutdown().await;
    let took = Instant::now() - stopping;
    let runs = runs(&ledger);
    assert_eq!(runs.len(), 1, "no slot taken during the drain: {runs:?}");
    assert!(!runs[0].cancelled, "the run's token was never cancelled");
    assert_eq!(runs[0].end - runs[0].start, work, "the run went to its end");
    assert!(
        took < work && took > work - SEC,
        "shutdown waited for the run and no longer: {took:?}"
    );
    let recorded = recorded_runs(&s).await;
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].trigger, Some(RecordTrigger::Timer));
    assert_eq!(recorded[0].outcome, RunOutcome::Ok);
    let lease = leasehold::LeaseName::new("sweep").unwrap();
    let state = leasehold::Store::inspect(&store, &lease)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        state.holder, None,
        "the task lease is released after the drain"
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_longer_than_the_grace_is_cancelled_when_it_runs_out() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    let grace = SEC * 2;
    let s = start(&store, &ledger, SEC * 20, grace);
    mid_run(&s).await;
    let stopping = Instant::now();
    s.shutdown().await;
    let runs = runs(&ledger);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].cancelled);
    assert_eq!(
        runs[0].end - stopping,
        grace,
        "cancelled exactly when the grace ran out"
    );
    let recorded = recorded_runs(&s).await;
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert!(
        matches!(&recorded[0].outcome, RunOutcome::Cancelled { why } if why.contains("grace")),
        "{:?}",
        recorded[0].outcome
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_during_the_drain_cancels_the_run_at_once() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    let s = start(&store, &ledger, SEC * 20, SEC * 30);
    mid_run(&s).await;
    begin_shutdown(&s);
    tokio::time::sleep(SEC).await;
    // Another instance took the lease over: the next renewal (at most a renew interval away)
    // answers lost.
    let lost = Instant::now();
    store.set(|f| &f.renew_lost, true);
    s.wait().await;
    let runs = runs(&ledger);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].cancelled);
    let after = runs[0].end - lost;
    assert!(
        after <= LeaseConfig::new(TTL).renew_interval,
        "cancelled at the renewal that found the lease lost, not at the grace: {after:?}"
    );
    let recorded = recorded_runs(&s).await;
    assert!(
        matches!(&recorded[0].outcome, RunOutcome::Cancelled { why } if why.contains("lease")),
        "{:?}",
        recorded[0].outcome
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_about_to_expire_during_the_drain_stops_the_run_a_stop_margin_early() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    let s = start(&store, &ledger, SEC * 20, SEC * 30);
    mid_run(&s).await;
    begin_shutdown(&s);
    tokio::time::sleep(SEC).await;
    // Renewals stop answering: the lease runs out a ttl after the last renewal at the latest.
    let hung = Instant::now();
    store.set(|f| &f.renew_hangs, true);
    s.wait().await;
    let runs = runs(&ledger);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].cancelled);
    let config = LeaseConfig::new(TTL);
    assert!(
        runs[0].end - hung <= config.ttl - config.stop_margin,
        "stopped a stop margin before the lease could pass to anyone else: {:?}",
        runs[0].end - hung
    );
}

#[tokio::test(start_paused = true)]
async fn end_drain_cancels_the_run_at_once() {
    let store = FaultyStore::new();
    let ledger = Ledger::default();
    let s = start(&store, &ledger, SEC * 20, SEC * 30);
    mid_run(&s).await;
    begin_shutdown(&s);
    tokio::time::sleep(SEC).await;
    let ended = Instant::now();
    // A second SIGTERM, in the CLI.
    s.end_drain();
    s.wait().await;
    let runs = runs(&ledger);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].cancelled);
    assert_eq!(runs[0].end, ended, "cancelled when the drain was ended");
}
