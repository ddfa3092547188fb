//! `leasehold run --overlap`, each policy with two instances on SQLite, Redis and PostgreSQL,
//! each run (2.5 s) outliving the next two slots (every 1 s). Under `skip` the slots that fall
//! during a run are recorded missed for the overlap and none runs late; under `buffer-one` every
//! slot runs at most once and never beside another, a slot that waited runs late and the rest
//! are recorded missed; under `buffer-all` the waiting slots run late, in order, none missed;
//! under `replace` each run is stopped (SIGTERM) at the next slot, which then runs, never beside
//! it, and the history names what replaced it; under `allow` runs go on side by side, each slot
//! still once.

mod common;

use std::time::Duration;

use common::*;

/// Two instances on `url` running the witness for 2.5 s every second under `overlap`, for
/// about ten seconds: the ledger (every entry, stopped runs too) and the task's history.
async fn two_instances(url: &str, overlap: &str) -> (Vec<Run>, Vec<serde_json::Value>) {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = unique(&format!("overlap-{overlap}"));
    let args = [
        "--store",
        url,
        "--lease",
        &lease,
        "--every",
        "1s",
        "--ttl",
        "6s",
        "--grace",
        "500ms",
        "--overlap",
        overlap,
    ];
    let instances: Vec<Instance> = ["a", "b"]
        .iter()
        .map(|n| Instance::start(n, &args, &ledger, "2500ms", dir.path()))
        .collect();
    tokio::time::sleep(Duration::from_secs(10)).await;
    for instance in instances {
        instance.stop(Duration::from_secs(20));
    }
    let (runs, unreadable) = leasehold_witness::ledger::read(&ledger).unwrap();
    assert_eq!(unreadable, 0);
    let doc = json_of(&[
        "history", "--store", url, &lease, "--json", "--limit", "100",
    ]);
    let records = doc["runs"].as_array().cloned().unwrap_or_default();
    (runs, records)
}

fn missed_for_overlap(records: &[serde_json::Value]) -> u64 {
    records
        .iter()
        .filter(|r| r["outcome"] == "missed" && r["reason"] == "overlap")
        .map(|r| r["count"].as_u64().unwrap_or(0))
        .sum()
}

/// Whether a run started a slot period (1 s) or more after its slot: it waited for a run.
fn started_late(run: &Run) -> bool {
    run.start_ms >= run.slot.unwrap() + 1000
}

async fn skip(url: &str) {
    let (runs, records) = two_instances(url, "skip").await;
    assert!(runs.len() >= 2, "{runs:#?}");
    assert_exactly_once(&runs);
    assert!(missed_for_overlap(&records) >= 2, "{records:#?}");
    // No slot waited for the run going: each started near its own time (well under a period:
    // a slot is granted or skipped when it falls).
    assert!(runs.iter().all(|r| !started_late(r)), "{runs:#?}");
}

async fn buffer_all(url: &str) {
    let (runs, records) = two_instances(url, "buffer-all").await;
    let done = read_ledger_entries(&runs);
    assert!(done.len() >= 3, "{runs:#?}");
    assert_exactly_once(&runs);
    // Slots waited and ran late, in slot order; ten seconds of slots stay under the cap.
    assert!(
        done.iter().filter(|r| started_late(r)).count() >= 2,
        "{done:#?}"
    );
    let mut by_start = runs.clone();
    by_start.sort_by_key(|r| r.start_ms);
    assert!(
        by_start.windows(2).all(|w| w[0].slot < w[1].slot),
        "{by_start:#?}"
    );
    assert_eq!(missed_for_overlap(&records), 0, "{records:#?}");
}

async fn allow(url: &str) {
    let (runs, _) = two_instances(url, "allow").await;
    // Each slot once (a cut-off run again aside), and runs side by side: every slot of the
    // ten seconds runs, though each run takes two and a half.
    let mut slots: Vec<u64> = runs
        .iter()
        .filter(|r| r.trigger != "retry")
        .map(|r| r.slot.unwrap())
        .collect();
    let n = slots.len();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), n, "a slot ran twice: {runs:#?}");
    assert!(n >= 6, "most slots ran: {runs:#?}");
    let mut by_start = runs.clone();
    by_start.sort_by_key(|r| r.start_ms);
    assert!(
        by_start.windows(2).any(|w| w[1].start_ms < w[0].end_ms),
        "runs went on side by side: {by_start:#?}"
    );
}

async fn buffer_one(url: &str) {
    let (runs, records) = two_instances(url, "buffer-one").await;
    let done = read_ledger_entries(&runs);
    assert!(done.len() >= 3, "{runs:#?}");
    // Every entry, a run stopped by the instances' shutdown too.
    assert_exactly_once(&runs);
    // A slot that fell during a run ran once it ended, late.
    assert!(done.iter().any(started_late), "{done:#?}");
    assert!(missed_for_overlap(&records) >= 1, "{records:#?}");
}

async fn replace(url: &str) {
    let (runs, records) = two_instances(url, "replace").await;
    assert!(runs.len() >= 4, "{runs:#?}");
    // Every entry, the stopped runs too: each slot once, never two at once.
    assert_exactly_once(&runs);
    // Each run was stopped for the next slot before its write (2.5 s of work, a slot a second).
    let stopped = runs
        .iter()
        .filter(|r| r.fenced == leasehold_witness::Fenced::Aborted)
        .count();
    assert!(stopped + 1 >= runs.len(), "{runs:#?}");
    let replaced: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| r["replaced_by"].is_u64())
        .collect();
    assert!(replaced.len() >= 3, "{records:#?}");
    for r in &replaced {
        assert_eq!(r["result"], "cancelled", "{r}");
        let (slot, by) = (
            r["slot"].as_u64().unwrap(),
            r["replaced_by"].as_u64().unwrap(),
        );
        assert!(by > slot, "{r}");
        // The slot that replaced it ran.
        assert!(
            runs.iter().any(|run| run.slot == Some(by)),
            "slot {by} ran: {runs:#?}"
        );
    }
    // Replaced runs are not run again as cut-off ones.
    assert!(runs.iter().all(|r| r.trigger != "retry"), "{runs:#?}");
}

/// The entries of runs that did their work.
fn read_ledger_entries(runs: &[Run]) -> Vec<Run> {
    runs.iter()
        .filter(|r| r.fenced != leasehold_witness::Fenced::Aborted)
        .cloned()
        .collect()
}

on_sqlite_redis_and_postgres!(skip:
    sqlite_skip_records_the_slots_that_fell_during_a_run,
    redis_skip_records_the_slots_that_fell_during_a_run,
    postgres_skip_records_the_slots_that_fell_during_a_run);
on_sqlite_redis_and_postgres!(buffer_one:
    sqlite_buffer_one_runs_a_waiting_slot_late_never_beside_another,
    redis_buffer_one_runs_a_waiting_slot_late_never_beside_another,
    postgres_buffer_one_runs_a_waiting_slot_late_never_beside_another);
on_sqlite_redis_and_postgres!(buffer_all:
    sqlite_buffer_all_runs_every_waiting_slot_in_order,
    redis_buffer_all_runs_every_waiting_slot_in_order,
    postgres_buffer_all_runs_every_waiting_slot_in_order);
on_sqlite_redis_and_postgres!(replace:
    sqlite_replace_stops_the_run_going_for_the_next_slot,
    redis_replace_stops_the_run_going_for_the_next_slot,
    postgres_replace_stops_the_run_going_for_the_next_slot);
on_sqlite_redis_and_postgres!(allow:
    sqlite_allow_runs_slots_side_by_side_each_once,
    redis_allow_runs_slots_side_by_side_each_once,
    postgres_allow_runs_slots_side_by_side_each_once);

/// A word that is no policy is a usage error naming the five, the word escaped; `--overlap`
/// needs a schedule.
#[test]
fn bad_overlap_values_are_usage_errors() {
    for (args, says) in [
        (
            &["--every", "5s", "--overlap", "sometimes\u{1b}[2J"][..],
            "`sometimes\\x1b[2J` is not an overlap policy: use skip, buffer-one, buffer-all, replace or allow",
        ),
        (&["--overlap", "replace"], "--overlap needs a schedule"),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["run", "--store", "sqlite::memory:", "--lease", "x"])
            .args(args)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 2, "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
