//! Several `leasehold run --every` processes on one lease, against every store (etcd: a cluster
//! of the test's own): each tick runs exactly once (ledger check), a SIGKILLed leader is replaced
//! within ttl + retry interval, a gracefully stopped one hands over at once.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;

/// A lease name of this test run's own: leases and slots outlive a run on a shared server.
fn lease_name(tag: &str) -> String {
    format!("{tag}-{:08x}", fastrand_u32())
}

fn fastrand_u32() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    nanos.subsec_nanos() ^ std::process::id()
}

async fn each_tick_exactly_once(url: &str, replicas: usize) {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = lease_name("sweep");
    // A tick a second: each run starts two processes (the supervisor and the command), which
    // on a loaded 2-core CI host can take a good part of a shorter interval.
    let args = [
        "--store", url, "--lease", &lease, "--every", "1s", "--ttl", "3s",
    ];
    let instances: Vec<Instance> = (1..=replicas)
        .map(|i| Instance::start(&format!("i{i}"), &args, &ledger, "50ms", dir.path()))
        .collect();
    tokio::time::sleep(Duration::from_secs(9)).await;
    for i in instances {
        assert_eq!(i.stop(Duration::from_secs(10)), 0, "clean exit on SIGTERM");
    }
    let runs = read_ledger(&ledger);
    let by_slot = assert_exactly_once(&runs);
    assert!(
        by_slot.len() >= 7,
        "only {} ticks ran in 9 s",
        by_slot.len()
    );
    // Slots are firing times in ms on the store's clock, one a second. Every slot between the
    // first and the last run either ran or is in the history as missed, with its reason: a run
    // that outlasts its second on a loaded host misses the slot that fell due meanwhile.
    let slots: Vec<u64> = by_slot.keys().copied().collect();
    let missed = missed_slots(url, &lease);
    let (first, last) = (slots[0], slots[slots.len() - 1]);
    for slot in (first..=last).step_by(1000) {
        assert!(
            by_slot.contains_key(&slot) || missed.contains_key(&slot),
            "slot {slot} neither ran nor is recorded missed: ran {slots:?}, missed {missed:?}"
        );
    }
    println!("ran {} slots, missed {missed:?}", slots.len());
}

/// The slots the history of `lease` records as missed, each with its reason.
fn missed_slots(url: &str, lease: &str) -> BTreeMap<u64, String> {
    let out = std::process::Command::new(BIN)
        .args(["history", "--store", url, lease, "--json", "--limit", "100"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut missed = BTreeMap::new();
    for record in doc["runs"].as_array().unwrap() {
        if record["outcome"] != "missed" {
            continue;
        }
        let (from, to) = (
            record["slot"].as_u64().unwrap(),
            record["last_slot"].as_u64().unwrap(),
        );
        for slot in (from..=to).step_by(1000) {
            missed.insert(
                slot,
                record["reason"].as_str().unwrap_or_default().to_owned(),
            );
        }
    }
    missed
}

async fn killed_leader_is_replaced(url: &str, replicas: usize) {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = lease_name("kill");
    let (ttl, retry) = (Duration::from_secs(2), Duration::from_millis(200));
    let args = [
        "--store", url, "--lease", &lease, "--every", "500ms", "--ttl", "2s", "--retry", "200ms",
    ];
    let instances: Vec<Instance> = (1..=replicas)
        .map(|i| Instance::start(&format!("i{i}"), &args, &ledger, "20ms", dir.path()))
        .collect();
    let store = leasehold_connect::open_store(url).await.unwrap();
    let (first, _) = wait_for_leader(&store, &lease, None, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victim = instances.iter().find(|i| i.name == first).unwrap();
    victim.signal("KILL");
    let (next, took) = wait_for_leader(&store, &lease, Some(&first), Duration::from_secs(10)).await;
    println!("takeover after SIGKILL: {took:?}");
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

async fn graceful_stop_hands_over(url: &str) -> Duration {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = lease_name("handoff");
    let args = [
        "--store", url, "--lease", &lease, "--every", "500ms", "--ttl", "10s",
    ];
    let mut instances: Vec<Instance> = (1..=2)
        .map(|i| Instance::start(&format!("i{i}"), &args, &ledger, "20ms", dir.path()))
        .collect();
    let store = leasehold_connect::open_store(url).await.unwrap();
    let (first, _) = wait_for_leader(&store, &lease, None, Duration::from_secs(10)).await;
    // Stop between two ticks, so no run is draining.
    tokio::time::sleep(Duration::from_millis(1_250)).await;
    let idx = instances.iter().position(|i| i.name == first).unwrap();
    let leaving = instances.remove(idx);
    let stopped = Instant::now();
    leaving.signal("TERM");
    wait_for_leader(&store, &lease, Some(&first), Duration::from_secs(5)).await;
    let took = stopped.elapsed();
    println!("takeover after a graceful stop: {took:?}");
    // Far below the 10 s ttl: release plus notification, not expiry.
    assert!(took < Duration::from_millis(1_000), "handoff took {took:?}");
    assert_eq!(leaving.stop(Duration::from_secs(5)), 0);
    took
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}", path_str(&dir.path().join("leases.db")))
}

fn redis_url() -> String {
    std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into())
}

fn postgres_url() -> String {
    std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or("postgres://postgres@127.0.0.1:5432/test".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_three_instances_each_tick_once() {
    let dir = temp_dir();
    each_tick_exactly_once(&sqlite_url(&dir), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_leader_is_replaced() {
    let dir = temp_dir();
    killed_leader_is_replaced(&sqlite_url(&dir), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_graceful_stop_hands_over() {
    let dir = temp_dir();
    graceful_stop_hands_over(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_five_instances_each_tick_once() {
    each_tick_exactly_once(&redis_url(), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_leader_is_replaced() {
    killed_leader_is_replaced(&redis_url(), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_graceful_stop_hands_over() {
    graceful_stop_hands_over(&redis_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_five_instances_each_tick_once() {
    each_tick_exactly_once(&postgres_url(), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed_leader_is_replaced() {
    killed_leader_is_replaced(&postgres_url(), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_graceful_stop_hands_over() {
    graceful_stop_hands_over(&postgres_url()).await;
}

fn mysql_url() -> String {
    std::env::var("LEASEHOLD_TEST_MYSQL_URL").unwrap_or("mysql://root@127.0.0.1:3306/test".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_five_instances_each_tick_once() {
    each_tick_exactly_once(&mysql_url(), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_killed_leader_is_replaced() {
    killed_leader_is_replaced(&mysql_url(), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_graceful_stop_hands_over() {
    graceful_stop_hands_over(&mysql_url()).await;
}

/// A 3-member etcd cluster of the test's own (members killed and data removed on drop).
async fn etcd_cluster() -> leasehold_etcd::testing::EtcdCluster {
    tokio::task::spawn_blocking(|| leasehold_etcd::testing::EtcdCluster::start(3))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_killed_leader_is_replaced() {
    // Followers time the dead leader's lease from its last renewal, which their watch saw.
    let cluster = etcd_cluster().await;
    killed_leader_is_replaced(&cluster.url(), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_graceful_stop_hands_over() {
    let cluster = etcd_cluster().await;
    graceful_stop_hands_over(&cluster.url()).await;
}
