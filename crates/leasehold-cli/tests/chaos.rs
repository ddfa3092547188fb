//! The short fault-injection run against every store: kills, pauses past the ttl, graceful
//! stops, and (Redis, PostgreSQL) dropped, blackholed and delayed connections and a restart of a
//! store server the harness started itself (Redis without persistence; PostgreSQL crashed and
//! recovered from its WAL, with nothing excused; MariaDB SIGKILLed and recovered by InnoDB, with
//! nothing excused; etcd members, the Raft leader first, SIGKILLed and restarted, with nothing
//! excused). The harness exits non-zero if any guarantee broke.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// Runs the short run and returns its report.json.
fn short_run(store: &str) -> serde_json::Value {
    run_for(store, "90s", 10)
}

/// Runs `leasehold chaos` for `duration` with `faults` faults and returns its report.json.
fn run_for(store: &str, duration: &str, faults: usize) -> serde_json::Value {
    run_with(store, duration, faults, &[])
}

/// [`run_for`] with more arguments for `leasehold chaos`.
fn run_with(store: &str, duration: &str, faults: usize, more: &[&str]) -> serde_json::Value {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["chaos", "--store", store, "--duration", duration])
        .args(more)
        .args(["--faults", &faults.to_string()])
        .arg("--out")
        .arg(out_dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "chaos run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert!(
        report["faults"].as_array().map_or(0, Vec::len) >= faults,
        "{report}"
    );
    let svg = std::fs::read_to_string(out_dir.path().join("timeline.svg")).unwrap();
    assert!(svg.starts_with("<svg") || svg.contains("<svg"));
    report
}

/// At least one store-restart fault was injected (not skipped).
fn assert_store_restarted(report: &serde_json::Value) {
    let restarts = report["faults_by_kind"]["store-restart"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        restarts >= 1,
        "no store-restart fault was injected: {report}"
    );
}

#[test]
fn chaos_sqlite() {
    short_run("sqlite");
}

#[test]
fn chaos_redis() {
    let report = short_run("redis");
    assert_store_restarted(&report);
}

/// The short run on the harness's own Valkey 9 (`LEASEHOLD_TEST_VALKEY_SERVER`, the
/// valkey-server the test command fetches; see `scripts/valkey.sh`), where leases are renewed
/// and released with the native compare-and-set commands.
#[test]
fn chaos_valkey() {
    let Some(server) = std::env::var("LEASEHOLD_TEST_VALKEY_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
    else {
        eprintln!("LEASEHOLD_TEST_VALKEY_SERVER is not set: skipped (scripts/test.sh sets it)");
        return;
    };
    let report = run_with("redis", "90s", 10, &["--redis-server", &server]);
    assert_store_restarted(&report);
}

/// A durable store: nothing excused, and both leases' tokens survived every restart.
fn assert_nothing_lost(report: &serde_json::Value) {
    let check = &report["check"];
    assert_eq!(check["overlapping_accepted_excused"], 0, "{report}");
    assert_eq!(check["duplicate_slots_excused"], 0, "{report}");
    let restarts = report["store_restarts"].as_array().unwrap();
    assert!(
        !restarts.is_empty() && restarts.iter().all(|r| r["kept"] == true),
        "{report}"
    );
}

#[test]
fn chaos_postgres() {
    let report = short_run("postgres");
    assert_store_restarted(&report);
    assert_nothing_lost(&report);
}

/// MariaDB crash-restarted under the replicas (SIGKILL, InnoDB crash recovery with a durable
/// commit): nothing excused, no overlap, no duplicate slot, no stale write accepted.
#[test]
fn chaos_mysql() {
    let report = short_run("mysql");
    assert_store_restarted(&report);
    assert_nothing_lost(&report);
    let check = &report["check"];
    for zero in ["overlapping_accepted", "duplicate_slots", "stale_accepted"] {
        assert_eq!(check[zero], 0, "{zero}: {report}");
    }
}

#[test]
fn chaos_etcd() {
    // The first store restart SIGKILLs the Raft leader; Raft loses no acknowledged write.
    let report = run_for("etcd", "30s", 6);
    assert_store_restarted(&report);
    assert_nothing_lost(&report);
}

/// A primary killed under the replicas (one failover in a short run, to keep the suite short):
/// no guarantee breaks, and what the failover lost is reported as excused.
#[test]
fn chaos_redis_sentinel() {
    let report = run_for("redis-sentinel", "20s", 4);
    assert_store_restarted(&report);
    let check = &report["check"];
    println!(
        "failover: overlaps excused {}, duplicate slots excused {}",
        check["overlapping_accepted_excused"], check["duplicate_slots_excused"]
    );
}

/// The primary serving the task lease's slot killed under the replicas (one failover, as for
/// Sentinel): the cluster promotes its replica, the killed node rejoins as a replica, no
/// guarantee breaks, and what the failover lost is reported as excused.
#[test]
fn chaos_redis_cluster() {
    let report = run_for("redis-cluster", "30s", 4);
    assert_store_restarted(&report);
    let check = &report["check"];
    for zero in [
        "overlapping_accepted",
        "duplicate_slots",
        "stale_accepted",
        "unfenced_accepted",
    ] {
        assert_eq!(check[zero], 0, "{zero}: {report}");
    }
    let restart = report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "store-restart" && f["skipped"] == false)
        .unwrap();
    assert!(
        restart["detail"]
            .as_str()
            .unwrap()
            .contains("rejoined as its replica"),
        "{restart}"
    );
    println!(
        "failover: {}; overlaps excused {}, duplicate slots excused {}",
        restart["detail"], check["overlapping_accepted_excused"], check["duplicate_slots_excused"]
    );
}
