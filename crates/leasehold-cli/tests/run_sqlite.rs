//! `leasehold run` processes sharing one SQLite file.

mod common;

use std::time::{Duration, Instant};

use common::*;
use leasehold::{LeaseName, Store};

async fn leader(store: &leasehold_sqlite::SqliteStore, lease: &str) -> Option<String> {
    let state = store
        .inspect(&LeaseName::new(lease).unwrap())
        .await
        .unwrap()?;
    state.holder.map(|h| h.to_string())
}

async fn wait_for_leader(
    store: &leasehold_sqlite::SqliteStore,
    lease: &str,
    not: Option<&str>,
    limit: Duration,
) -> (String, Duration) {
    let start = Instant::now();
    loop {
        if let Some(l) = leader(store, lease).await
            && Some(l.as_str()) != not
        {
            return (l, start.elapsed());
        }
        assert!(start.elapsed() < limit, "no new leader within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_run_each_tick_exactly_once() {
    let dir = temp_dir();
    let store_url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let ledger = ledger_in(dir.path());
    let args = [
        "--store", &store_url, "--lease", "sweep", "--every", "500ms", "--ttl", "2s",
    ];
    let instances: Vec<Instance> = (1..=3)
        .map(|i| Instance::start(&format!("i{i}"), &args, &ledger, "50ms", dir.path()))
        .collect();
    tokio::time::sleep(Duration::from_secs(8)).await;
    for i in instances {
        assert_eq!(i.stop(Duration::from_secs(10)), 0, "clean exit on SIGTERM");
    }
    let runs = read_ledger(&ledger);
    let by_slot = assert_exactly_once(&runs);
    assert!(
        by_slot.len() >= 12,
        "only {} ticks ran in 8 s",
        by_slot.len()
    );
    let slots: Vec<u64> = by_slot.keys().copied().collect();
    assert!(
        slots.windows(2).all(|w| w[1] == w[0] + 1),
        "no tick missed: {slots:?}"
    );
    for r in &runs {
        assert!(["i1", "i2", "i3"].contains(&r.holder.as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_within_ttl_plus_retry() {
    let dir = temp_dir();
    let db = dir.path().join("leases.db");
    let store_url = format!("sqlite:{}", path_str(&db));
    let ledger = ledger_in(dir.path());
    let (ttl, retry) = (Duration::from_secs(2), Duration::from_millis(200));
    let args = [
        "--store", &store_url, "--lease", "sweep", "--every", "500ms", "--ttl", "2s", "--retry",
        "200ms",
    ];
    let instances: Vec<Instance> = (1..=3)
        .map(|i| Instance::start(&format!("i{i}"), &args, &ledger, "20ms", dir.path()))
        .collect();
    let store = leasehold_sqlite::connect(&store_url).await.unwrap();
    let (first, _) = wait_for_leader(&store, "sweep", None, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victim = instances.iter().find(|i| i.name == first).unwrap();
    victim.signal("KILL");
    let (next, took) =
        wait_for_leader(&store, "sweep", Some(&first), Duration::from_secs(10)).await;
    assert_ne!(next, first);
    // The dead leader's lease had at most a ttl left; a follower retries when it is due.
    assert!(
        took <= ttl + retry + Duration::from_millis(300),
        "takeover took {took:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(instances);
    let runs = read_ledger(&ledger);
    assert_exactly_once(&runs);
    assert!(
        runs.iter().any(|r| r.holder == next),
        "the new leader ran ticks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_hands_over_at_once() {
    let dir = temp_dir();
    let store_url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let ledger = ledger_in(dir.path());
    let args = [
        "--store", &store_url, "--lease", "sweep", "--every", "500ms", "--ttl", "10s",
    ];
    let mut instances: Vec<Instance> = (1..=2)
        .map(|i| Instance::start(&format!("i{i}"), &args, &ledger, "20ms", dir.path()))
        .collect();
    let store = leasehold_sqlite::connect(&store_url).await.unwrap();
    let (first, _) = wait_for_leader(&store, "sweep", None, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idx = instances.iter().position(|i| i.name == first).unwrap();
    let leaving = instances.remove(idx);
    let stopped = Instant::now();
    leaving.signal("TERM");
    let (_, _) = wait_for_leader(&store, "sweep", Some(&first), Duration::from_secs(5)).await;
    let took = stopped.elapsed();
    // Far below the 10 s ttl: release plus notification, not expiry.
    assert!(took < Duration::from_secs(2), "handoff took {took:?}");
    println!("graceful handoff: {took:?}");
    assert_eq!(leaving.stop(Duration::from_secs(5)), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_schedule_it_is_a_distributed_flock() {
    let dir = temp_dir();
    let store_url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let ledger = ledger_in(dir.path());
    let holder = std::process::Command::new(BIN)
        .args([
            "run", "--store", &store_url, "--lease", "once", "--ttl", "5s", "--", BIN, "record",
        ])
        .arg(&ledger)
        .args(["--sleep", "3s"])
        .spawn()
        .unwrap();
    let mut holder = scopeguard(holder);
    let store = leasehold_sqlite::connect(&store_url).await.unwrap();
    wait_for_leader(&store, "once", None, Duration::from_secs(10)).await;
    let busy = std::process::Command::new(BIN)
        .args([
            "run", "--store", &store_url, "--lease", "once", "--", "true",
        ])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(75), "busy lease exits 75");
    assert!(String::from_utf8_lossy(&busy.stderr).contains("is held by"));
    let status = holder.0.wait().unwrap();
    assert!(status.success());
    let runs = read_ledger(&ledger);
    assert_eq!(runs.len(), 1);
    assert!(runs[0].token.is_some() && runs[0].slot.is_none());
    assert_eq!(
        leader(&store, "once").await,
        None,
        "released after the command"
    );
    // The command's own status comes back.
    let failing = std::process::Command::new(BIN)
        .args([
            "run", "--store", &store_url, "--lease", "once", "--", "sh", "-c", "exit 7",
        ])
        .status()
        .unwrap();
    assert_eq!(failing.code(), Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_holder_and_token() {
    let dir = temp_dir();
    let store_url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let store = leasehold_sqlite::connect(&store_url).await.unwrap();
    let name = LeaseName::new("shown").unwrap();
    let me = leasehold::HolderId::new("tester").unwrap();
    store
        .acquire(&name, &me, Duration::from_secs(60))
        .await
        .unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "status",
            "--store",
            &store_url,
            "shown",
            "never-used",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["leases"][0]["holder"], "tester");
    assert_eq!(v["leases"][0]["held"], true);
    assert!(v["leases"][0]["remaining_ms"].as_u64().unwrap() > 50_000);
    assert_eq!(v["leases"][1]["held"], false);
    let table = std::process::Command::new(BIN)
        .args(["status", "--store", &store_url, "shown"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("tester") && text.contains("held"), "{text}");
}

/// Kills the child if the test fails before waiting for it.
struct ChildGuard(std::process::Child);
fn scopeguard(c: std::process::Child) -> ChildGuard {
    ChildGuard(c)
}
impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
