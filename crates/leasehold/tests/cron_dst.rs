//! Daily cron jobs across real daylight-saving changes (issue 27), through the Scheduler with two
//! replicas on one MemoryStore, on a paused clock whose store time is set to the night of the
//! change: a job at a wall time the change skips runs once, at the change; one at a wall time
//! the change repeats runs once, the first time; an interval job is unaffected; no slot runs
//! twice.
//!
//! The replicas build their schedules differently (`Schedule::cron_in` and a `CRON_TZ=` prefix)
//! and neither reads the host's zone: chrono is built without its `clock` feature, so it has no
//! `Local` (the CLI test `next_is_the_same_whatever_the_host_zone` runs the binary under
//! different `TZ`s).

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use leasehold::faults::FaultyStore;
use leasehold::{
    CatchUp, HolderId, LeaseConfig, MemoryStore, Schedule, Scheduler, SchedulerHandle, Store,
};
use support::{Ledger, recorder};

const SEC: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);

fn ms(rfc3339: &str) -> u64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .timestamp_millis() as u64
}

fn utc(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Runs `jobs` (name, expression) in `zone` and an hourly interval job on two replicas from
/// `start` (store time) for `hours`; returns each job's runs, sorted by slot, as
/// (slot in UTC, holder), and the interval job's slots.
async fn night(
    zone: &str,
    start: &str,
    hours: u32,
    jobs: &[&str],
) -> (Vec<Vec<(String, String)>>, Vec<u64>) {
    let shared = MemoryStore::new();
    let offset = ms(start) as i64 - shared.now_millis().await.unwrap() as i64;
    let ledgers: Vec<Ledger> = jobs.iter().map(|_| Ledger::default()).collect();
    let hourly = Ledger::default();
    let mut handles: Vec<SchedulerHandle> = Vec::new();
    for replica in ["a", "b"] {
        let store = FaultyStore::wrap(shared.clone());
        store.faults.clock_offset_ms.store(offset, Ordering::SeqCst);
        let mut scheduler = Scheduler::new(store)
            .holder(HolderId::new(replica).unwrap())
            .lease_config(LeaseConfig::new(SEC * 15))
            .grace_period(SEC);
        for (i, expr) in jobs.iter().enumerate() {
            let schedule = if replica == "a" {
                Schedule::cron_in(expr, zone).unwrap()
            } else {
                Schedule::cron(&format!("CRON_TZ={zone} {expr}")).unwrap()
            };
            let task = recorder(&ledgers[i], &format!("job-{i}"), schedule, SEC);
            scheduler = scheduler.task(task.catch_up(CatchUp::Skip));
        }
        let every_hour = Schedule::every(HOUR).unwrap();
        scheduler = scheduler.task(recorder(&hourly, "hourly", every_hour, SEC));
        handles.push(scheduler.start(std::future::pending()).unwrap());
    }
    tokio::time::sleep(HOUR * hours).await;
    for h in handles {
        h.shutdown().await;
    }
    let runs = ledgers
        .iter()
        .map(|l| {
            let mut runs: Vec<(u64, String)> = l
                .lock()
                .unwrap()
                .iter()
                .map(|r| (r.slot.unwrap(), r.holder.clone()))
                .collect();
            runs.sort();
            runs.into_iter().map(|(s, h)| (utc(s), h)).collect()
        })
        .collect();
    let mut hourly: Vec<u64> = hourly
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.slot.unwrap())
        .collect();
    hourly.sort_unstable();
    (runs, hourly)
}

/// Each job's runs are exactly `expected` (UTC), one run per slot.
fn assert_runs(runs: &[Vec<(String, String)>], jobs: &[&str], expected: &[&[&str]]) {
    for ((runs, job), expected) in runs.iter().zip(jobs).zip(expected) {
        let slots: Vec<&str> = runs.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(slots, *expected, "{job}: {runs:?}");
    }
}

/// The interval job ran every whole UTC hour of the night, once each.
fn assert_hourly(hourly: &[u64], start: &str, hours: u32) {
    let first = ms(start) / 3_600_000 * 3_600_000 + 3_600_000;
    let expected: Vec<u64> = (0..u64::from(hours))
        .map(|h| first + h * 3_600_000)
        .collect();
    // The last one may fall on the end of the run.
    assert!(
        hourly == expected || hourly == &expected[..expected.len() - 1],
        "{:?}",
        hourly.iter().map(|&s| utc(s)).collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn berlin_spring_forward_runs_a_skipped_time_once_at_the_change() {
    // 2027-03-28: 02:00 CET becomes 03:00 CEST at 01:00 UTC.
    let jobs = ["30 2 * * *", "0 2 * * *", "0 3 * * *", "59 1 * * *"];
    let (runs, hourly) = night("Europe/Berlin", "2027-03-27T20:00:00Z", 30, &jobs).await;
    assert_runs(
        &runs,
        &jobs,
        &[
            &["2027-03-28T01:00:00Z", "2027-03-29T00:30:00Z"],
            &["2027-03-28T01:00:00Z", "2027-03-29T00:00:00Z"],
            &["2027-03-28T01:00:00Z", "2027-03-29T01:00:00Z"],
            &["2027-03-28T00:59:00Z", "2027-03-28T23:59:00Z"],
        ],
    );
    assert_hourly(&hourly, "2027-03-27T20:00:00Z", 30);
}

#[tokio::test(start_paused = true)]
async fn berlin_fall_back_runs_a_repeated_time_once_the_first_time() {
    // 2027-10-31: 03:00 CEST becomes 02:00 CET at 01:00 UTC.
    let jobs = ["30 2 * * *", "0 2 * * *", "59 2 * * *", "0 3 * * *"];
    let (runs, hourly) = night("Europe/Berlin", "2027-10-30T20:00:00Z", 31, &jobs).await;
    assert_runs(
        &runs,
        &jobs,
        &[
            &["2027-10-31T00:30:00Z", "2027-11-01T01:30:00Z"],
            &["2027-10-31T00:00:00Z", "2027-11-01T01:00:00Z"],
            &["2027-10-31T00:59:00Z", "2027-11-01T01:59:00Z"],
            &["2027-10-31T02:00:00Z", "2027-11-01T02:00:00Z"],
        ],
    );
    assert_hourly(&hourly, "2027-10-30T20:00:00Z", 31);
}

#[tokio::test(start_paused = true)]
async fn new_york_spring_forward_runs_a_skipped_time_once_at_the_change() {
    // 2027-03-14: 02:00 EST becomes 03:00 EDT at 07:00 UTC.
    let jobs = ["30 2 * * *", "0 2 * * *", "59 1 * * *", "0 3 * * *"];
    let (runs, hourly) = night("America/New_York", "2027-03-13T20:00:00Z", 36, &jobs).await;
    assert_runs(
        &runs,
        &jobs,
        &[
            &["2027-03-14T07:00:00Z", "2027-03-15T06:30:00Z"],
            &["2027-03-14T07:00:00Z", "2027-03-15T06:00:00Z"],
            &["2027-03-14T06:59:00Z", "2027-03-15T05:59:00Z"],
            &["2027-03-14T07:00:00Z", "2027-03-15T07:00:00Z"],
        ],
    );
    assert_hourly(&hourly, "2027-03-13T20:00:00Z", 36);
}

#[tokio::test(start_paused = true)]
async fn new_york_fall_back_runs_a_repeated_time_once_the_first_time() {
    // 2027-11-07: 02:00 EDT becomes 01:00 EST at 06:00 UTC.
    let jobs = ["30 1 * * *", "0 1 * * *", "59 1 * * *", "0 2 * * *"];
    let (runs, hourly) = night("America/New_York", "2027-11-06T20:00:00Z", 36, &jobs).await;
    assert_runs(
        &runs,
        &jobs,
        &[
            &["2027-11-07T05:30:00Z", "2027-11-08T06:30:00Z"],
            &["2027-11-07T05:00:00Z", "2027-11-08T06:00:00Z"],
            &["2027-11-07T05:59:00Z", "2027-11-08T06:59:00Z"],
            &["2027-11-07T07:00:00Z", "2027-11-08T07:00:00Z"],
        ],
    );
    assert_hourly(&hourly, "2027-11-06T20:00:00Z", 36);
}
