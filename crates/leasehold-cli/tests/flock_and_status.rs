//! `leasehold run` as a distributed flock, and `leasehold status`, on a SQLite file.

mod common;

use std::time::Duration;

use common::*;
use leasehold::{LeaseName, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_schedule_it_is_a_distributed_flock() {
    let dir = temp_dir();
    let store_url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let ledger = ledger_in(dir.path());
    let holder = std::process::Command::new(BIN)
        .args([
            "run", "--store", &store_url, "--lease", "once", "--ttl", "5s", "--",
        ])
        .args(witness(&ledger, "3s"))
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

/// Without --store or LEASEHOLD_STORE the default SQLite file coordinates only one host and
/// directory: `run` says so loudly instead of silently letting each host run every tick.
#[test]
fn the_default_store_is_announced() {
    let dir = temp_dir();
    let out = std::process::Command::new(BIN)
        .args(["run", "--lease", "d", "--", "true"])
        .current_dir(dir.path())
        .env_remove("LEASEHOLD_STORE")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no --store and no LEASEHOLD_STORE") && stderr.contains("leasehold.db"),
        "{stderr}"
    );
    assert!(dir.path().join("leasehold.db").exists());
}
