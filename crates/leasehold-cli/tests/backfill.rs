//! `leasehold trigger NAME --slots FROM..TO` on every store (etcd: one of the test's own): two
//! `leasehold run --every 1s` instances backfill ten past slots, each once, oldest first, as
//! trigger backfill (LEASEHOLD_TRIGGER), never beside another run; the same backfill again runs
//! nothing; a range over the cap, a range that ends before it starts or after now, and an
//! unknown task exit with their documented statuses and one line.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use serde_json::Value;

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Refused with `code` and one line on stderr containing `says`.
fn refused(args: &[&str], code_wanted: i32, says: &str) {
    let out = leasehold(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), code_wanted, "{args:?}: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

fn backfill_on(url: &str) {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = unique("backfill");
    let task = format!("{lease}:run");
    let instances = two_every_second(url, &lease, &ledger, dir.path());
    task_when(url, &task, "two live instances", two_live);
    // Ten slots from a minute before the instances started: none ran.
    let to_ms = (wall_ms() - 60_000) / 1000 * 1000;
    let from_ms = to_ms - 9_000;
    let slots: Vec<u64> = (0..10).map(|k| from_ms + k * 1000).collect();
    let from = humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(from_ms));
    let range = format!("{from}..{to_ms}");
    let backfill = [
        "trigger",
        "--store",
        url,
        &lease,
        "--slots",
        &range,
        "--by",
        "ops",
        "--wait=60s",
    ];
    let out = leasehold(&backfill);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        code(&out),
        0,
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("10 of 10 slots"), "{stdout}");
    assert!(stdout.contains("10 slots run, 0 not ok"), "{stdout}");

    std::thread::sleep(Duration::from_millis(1500));
    let runs = read_ledger(&ledger);
    let mut backfilled: Vec<_> = runs.iter().filter(|r| r.trigger == "backfill").collect();
    backfilled.sort_by_key(|r| r.start_ms);
    let seen: Vec<u64> = backfilled.iter().filter_map(|r| r.slot).collect();
    assert_eq!(seen, slots, "each slot once, oldest first: {runs:?}");
    assert!(
        backfilled.iter().all(|r| r.token.is_some()),
        "{backfilled:?}"
    );
    // Never beside another run of the task (the witness's clock, a process per run).
    for b in &backfilled {
        for o in runs.iter().filter(|o| o.pid != b.pid) {
            assert!(
                b.end_ms <= o.start_ms || o.end_ms <= b.start_ms,
                "overlap: {b:?} {o:?}"
            );
        }
    }
    let records = history(url, &task);
    let recorded: Vec<&Value> = records
        .iter()
        .filter(|r| r["trigger"] == "backfill")
        .collect();
    assert_eq!(recorded.len(), 10, "{records:?}");
    assert!(
        recorded
            .iter()
            .all(|r| r["outcome"] == "ok" && r["request"]["by"] == "ops")
    );
    // The timer went on: its slots are after the backfilled ones, the claim never went back.
    assert!(
        runs.iter()
            .any(|r| r.trigger == "timer" && r.slot > Some(to_ms))
    );

    // The same backfill again runs nothing.
    let out = leasehold(&backfill);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{stdout}");
    assert!(stdout.contains("nothing to backfill"), "{stdout}");
    std::thread::sleep(Duration::from_millis(1500));
    let again = read_ledger(&ledger)
        .iter()
        .filter(|r| r.trigger == "backfill")
        .count();
    assert_eq!(again, 10);

    // Refused, nothing written: over the cap, backwards, into the future, an unknown task.
    let huge = format!("{}..now", to_ms - 1_000_000);
    let trigger = |name: &str, slots: &str, code: i32, says: &str| {
        refused(
            &["trigger", "--store", url, name, "--slots", slots],
            code,
            says,
        );
    };
    trigger(&lease, &huge, 2, "one backfill runs at most 1000");
    let backwards = format!("{to_ms}..{from_ms}");
    trigger(&lease, &backwards, 2, "ends before it starts");
    let future = format!("{from_ms}..{}", wall_ms() + 3_600_000);
    trigger(&lease, &future, 2, "a backfill runs past slots only");
    trigger("no-such-task", &range, 66, "no task no-such-task");
    refused(
        &["trigger", "--store", url, &lease, "--slots", "yesterday"],
        2,
        "not a range FROM..TO",
    );
    for i in instances {
        assert_eq!(i.stop(Duration::from_secs(10)), 0);
    }
}

fn env_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

#[test]
fn sqlite_backfill() {
    let dir = temp_dir();
    backfill_on(&format!(
        "sqlite:{}",
        path_str(&dir.path().join("leases.db"))
    ));
}

#[test]
fn redis_backfill() {
    backfill_on(&env_url(
        "LEASEHOLD_TEST_REDIS_URL",
        "redis://127.0.0.1:6379",
    ));
}

#[test]
fn postgres_backfill() {
    backfill_on(&env_url(
        "LEASEHOLD_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ));
}

#[test]
fn mysql_backfill() {
    backfill_on(&env_url(
        "LEASEHOLD_TEST_MYSQL_URL",
        "mysql://root@127.0.0.1:3306/test",
    ));
}

#[test]
fn etcd_backfill() {
    let etcd = leasehold_etcd::testing::EtcdCluster::start(1);
    backfill_on(&etcd.url());
}
