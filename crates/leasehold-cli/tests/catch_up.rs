//! Slots missed while a SIGKILLed leader's lease runs out, against every store, with real
//! processes: `--catch-up latest` runs the newest missed slot exactly once on the next leader,
//! `skip` runs none; either way the history names the missed slots and why, and no slot runs
//! twice.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use leasehold::{BoxStore, LeaseName, Store};

fn redis_url() -> String {
    std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn postgres_url() -> String {
    std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

async fn leader(store: &BoxStore, lease: &str) -> Option<String> {
    let state = store
        .inspect(&LeaseName::new(lease).unwrap())
        .await
        .ok()??;
    state.holder.map(|h| h.to_string())
}

async fn missed_slots_after_a_crash(url: &str, policy: &str) {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = unique(&format!("catch-{policy}"));
    let args = [
        "--store",
        url,
        "--lease",
        &lease,
        "--every",
        "1s",
        "--ttl",
        "4s",
        "--retry",
        "200ms",
        "--catch-up",
        policy,
    ];
    let instances: Vec<Instance> = ["a", "b"]
        .iter()
        .map(|n| Instance::start(n, &args, &ledger, "50ms", dir.path()))
        .collect();
    let store = leasehold_connect::open_store(url).await.unwrap();
    // Let the first leader run a few slots, then kill it right after one.
    let start = Instant::now();
    let first = loop {
        let runs = read_ledger(&ledger);
        if runs.len() >= 2 {
            break runs.last().unwrap().holder.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let before = read_ledger(&ledger).len();
    while read_ledger(&ledger).len() == before {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Killed between runs: killed in the moment between a run's write and its end record, the
    // run is interrupted and its slot is run again (at-least-once, tests/interrupted.rs).
    tokio::time::sleep(Duration::from_millis(300)).await;
    instances
        .iter()
        .find(|i| i.name == first)
        .unwrap()
        .signal("KILL");
    let killed = Instant::now();
    loop {
        if let Some(l) = leader(&store, &lease).await
            && l != first
        {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(15), "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A few timer runs on the new leader.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in instances {
        if i.name != first {
            assert_eq!(i.stop(Duration::from_secs(10)), 0);
        }
    }
    let runs = read_ledger(&ledger);
    let by_slot = assert_exactly_once(&runs);
    let last_before = runs
        .iter()
        .filter(|r| r.holder == first)
        .filter_map(|r| r.slot)
        .max()
        .unwrap();
    let first_timer_after = runs
        .iter()
        .filter(|r| r.holder != first && r.trigger == "timer")
        .filter_map(|r| r.slot)
        .min()
        .expect("the new leader ran timer slots");
    let catch_ups: Vec<&Run> = runs.iter().filter(|r| r.trigger == "catch-up").collect();
    let gap: Vec<u64> = (last_before + 1000..first_timer_after)
        .step_by(1000)
        .collect();
    println!(
        "{policy}: last slot before the kill {last_before}, missed {gap:?}, catch-up runs {catch_ups:?}"
    );
    assert!(
        gap.len() >= 2,
        "the crash left a gap of slots: {gap:?} ({by_slot:?})"
    );
    match policy {
        "latest" => {
            assert_eq!(catch_ups.len(), 1, "one catch-up run: {catch_ups:?}");
            // The newest missed slot that was settled when the new leader took over.
            let slot = catch_ups[0].slot.unwrap();
            assert!(gap.contains(&slot), "{slot} is a missed slot");
            assert_ne!(catch_ups[0].holder, first);
        }
        _ => assert!(catch_ups.is_empty(), "skip runs none: {catch_ups:?}"),
    }
    // The history says what ran and which slots did not, and why.
    let out = Command::new(BIN)
        .args([
            "history", "--store", url, &lease, "--json", "--limit", "100",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let records = doc["runs"].as_array().unwrap();
    let missed: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| r["outcome"] == "missed")
        .collect();
    assert!(!missed.is_empty(), "missed slots recorded: {doc}");
    // Slots nobody claimed while the dead leader's lease ran out, and slots that fell due while
    // the new leader waited for the dead leader's run lease or ran the catch-up (overlap).
    assert!(
        missed.iter().any(|m| m["reason"] == "not-claimed")
            && missed
                .iter()
                .all(|m| m["reason"] == "not-claimed" || m["reason"] == "overlap"),
        "{missed:?}"
    );
    let recorded_missed: u64 = missed.iter().map(|m| m["count"].as_u64().unwrap()).sum();
    // Slots younger than a renew interval when the new leader looked are left alone (another
    // instance might be claiming them), so the record may omit the newest one of the gap.
    let unrun = gap.len() as u64 - catch_ups.len() as u64;
    assert!(
        recorded_missed <= unrun && recorded_missed + 1 >= unrun,
        "{recorded_missed} recorded of {unrun} unrun: {doc}"
    );
    if policy == "latest" {
        assert!(
            records
                .iter()
                .any(|r| r["trigger"] == "catch-up" && r["outcome"] == "ok"),
            "{doc}"
        );
    }
    let table = Command::new(BIN)
        .args(["history", "--store", url, &lease])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    println!("{text}");
    assert!(text.contains("missed") && text.contains("timer"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_latest_runs_the_newest_missed_slot_once() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    missed_slots_after_a_crash(&url, "latest").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_skip_runs_none() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    missed_slots_after_a_crash(&url, "skip").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_latest_runs_the_newest_missed_slot_once() {
    missed_slots_after_a_crash(&redis_url(), "latest").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_latest_runs_the_newest_missed_slot_once() {
    missed_slots_after_a_crash(&postgres_url(), "latest").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_skip_runs_none() {
    missed_slots_after_a_crash(&redis_url(), "skip").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_skip_runs_none() {
    missed_slots_after_a_crash(&postgres_url(), "skip").await;
}
