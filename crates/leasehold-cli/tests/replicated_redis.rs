//! `leasehold run` and `leasehold status` through `redis+sentinel://` and `redis+cluster://`,
//! against deployments of the test's own (`leasehold_testkit::ha`: a primary, a replica
//! and three sentinels; a six-node cluster): a distributed flock, a schedule whose every tick
//! runs exactly once on two instances, and `status` showing the held lease and the task's last
//! run.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use leasehold_testkit::ha;

fn status_json(url: &str, names: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["status", "--store", url, "--json"])
        .args(names)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

async fn run_and_status(url: &str) {
    let dir = temp_dir();
    let lease = format!("replicated-{}", std::process::id());

    // A distributed flock: the command runs, its status comes back.
    let out = Command::new(BIN)
        .args(["run", "--store", url, "--lease", &format!("{lease}-once")])
        .args(["--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A schedule on two instances: every tick once, and status sees the leader.
    let ledger = ledger_in(dir.path());
    let args = [
        "--store", url, "--lease", &lease, "--every", "1s", "--ttl", "3s",
    ];
    let instances: Vec<Instance> = ["i1", "i2"]
        .iter()
        .map(|n| Instance::start(n, &args, &ledger, "50ms", dir.path()))
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let seen = status_json(url, &[&lease]);
    assert_eq!(seen["leases"][0]["held"], true, "{seen}");
    let holder = seen["leases"][0]["holder"].as_str().unwrap().to_owned();
    assert!(holder == "i1" || holder == "i2", "{seen}");
    assert!(
        seen["store"]
            .as_str()
            .unwrap()
            .starts_with(url.split("://").next().unwrap()),
        "{seen}"
    );
    for i in instances {
        assert_eq!(i.stop(Duration::from_secs(10)), 0, "clean exit on SIGTERM");
    }
    let runs = read_ledger(&ledger);
    let by_slot = assert_exactly_once(&runs);
    assert!(
        by_slot.len() >= 3,
        "only {} ticks ran in 5 s",
        by_slot.len()
    );

    // After the stop: released, and the task's last run is in its history.
    let after = status_json(url, &[&lease]);
    assert_eq!(after["leases"][0]["held"], false, "{after}");
    let task = &after["tasks"][0];
    assert_eq!(task["task"], format!("{lease}:run"), "{after}");
    assert!(!task["last_run"].is_null(), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_status_through_sentinel() {
    let group = tokio::task::spawn_blocking(ha::SentinelGroup::start)
        .await
        .unwrap();
    run_and_status(&group.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_status_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(ha::Cluster::start)
        .await
        .unwrap();
    run_and_status(&cluster.url()).await;
}
