//! `leasehold run --overlap` with two instances on SQLite and Redis, each run (2.5 s) outliving
//! the next two slots (every 1 s): under `buffer-one` every slot runs at most once and never
//! beside another, a slot that waited runs late and the rest are recorded missed for the
//! overlap; under `replace` each run is stopped (SIGTERM) at the next slot, which then runs,
//! never beside it, and the history names what replaced it.

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

async fn buffer_one(url: &str) {
    let (runs, records) = two_instances(url, "buffer-one").await;
    let done = read_ledger_entries(&runs);
    assert!(done.len() >= 3, "{runs:#?}");
    // Every entry, a run stopped by the instances' shutdown too.
    assert_exactly_once(&runs);
    // A slot that fell during a run ran once it ended, late.
    assert!(
        done.iter().any(|r| r.start_ms >= r.slot.unwrap() + 1000),
        "{done:#?}"
    );
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

on_sqlite_and_redis!(buffer_one:
    sqlite_buffer_one_runs_a_waiting_slot_late_never_beside_another,
    redis_buffer_one_runs_a_waiting_slot_late_never_beside_another);
on_sqlite_and_redis!(replace:
    sqlite_replace_stops_the_run_going_for_the_next_slot,
    redis_replace_stops_the_run_going_for_the_next_slot);

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
