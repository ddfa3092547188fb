//! Cron as people write it, through the binary (issue 27): `leasehold next`, `run --cron --tz`
//! on replicas whose hosts are in different zones, and the task's zone in `status`.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn next(args: &[&str], host_zone: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("next").args(args);
    match host_zone {
        Some(zone) => cmd.env("TZ", zone),
        None => cmd.env_remove("TZ"),
    };
    cmd.output().unwrap()
}

fn next_json(args: &[&str]) -> serde_json::Value {
    let out = next(args, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn next_shows_local_and_utc_times_across_a_change() {
    let doc = next_json(&[
        "--cron",
        "30 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--after",
        "2027-03-26T12:00:00Z",
        "-n",
        "3",
        "--json",
    ]);
    assert_eq!(doc["cron"], "CRON_TZ=Europe/Berlin 30 2 * * *");
    assert_eq!(doc["time_zone"], "Europe/Berlin");
    let pairs: Vec<(&str, &str)> = doc["firings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["local"].as_str().unwrap(), f["utc"].as_str().unwrap()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("2027-03-27T02:30:00+01:00", "2027-03-27T01:30:00.000Z"),
            // 02:30 does not occur on the 28th: it runs at the change, 03:00 CEST.
            ("2027-03-28T03:00:00+02:00", "2027-03-28T01:00:00.000Z"),
            ("2027-03-29T02:30:00+02:00", "2027-03-29T00:30:00.000Z"),
        ]
    );
    // The zone in the expression, a macro, the text form.
    let prefixed = next_json(&[
        "--cron",
        "CRON_TZ=America/New_York @daily",
        "--after",
        "2027-11-06T12:00:00Z",
        "-n",
        "1",
        "--json",
    ]);
    assert_eq!(prefixed["firings"][0]["local"], "2027-11-07T00:00:00-04:00");
    let out = next(
        &[
            "--cron",
            "0 3 * * *",
            "--after",
            "2027-01-01T00:00:00Z",
            "-n",
            "2",
        ],
        None,
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("cron \"0 3 * * *\" in UTC"), "{text}");
    assert!(text.contains("2027-01-01T03:00:00+00:00"), "{text}");
    // With --tz the expression is echoed as written, the zone beside it.
    let out = next(
        &[
            "--cron",
            "0 3 * * *",
            "--tz",
            "Europe/Paris",
            "--after",
            "2027-01-01T00:00:00Z",
            "-n",
            "1",
        ],
        None,
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("cron \"0 3 * * *\" in Europe/Paris"),
        "{text}"
    );
}

#[test]
fn next_is_the_same_whatever_the_host_zone() {
    let args = [
        "--cron",
        "*/20 1-3 * * *",
        "--tz",
        "Europe/Berlin",
        "--after",
        "2027-10-30T22:00:00Z",
        "-n",
        "12",
        "--json",
    ];
    let outputs: Vec<Vec<u8>> = [
        None,
        Some("UTC"),
        Some("Pacific/Chatham"),
        Some("America/Los_Angeles"),
        Some("Europe/Berlin"),
    ]
    .into_iter()
    .map(|host| next(&args, host).stdout)
    .collect();
    assert!(!outputs[0].is_empty());
    assert!(outputs.iter().all(|o| *o == outputs[0]));
}

#[test]
fn bad_expressions_and_zones_are_one_line_and_exit_2() {
    for (args, expect) in [
        (
            vec!["--cron", "0 3 * *"],
            "expected 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds \
             first (second minute hour day-of-month month day-of-week), found 4",
        ),
        (
            vec!["--cron", "0 24 * * *"],
            "hour field \"24\": 24 is out of range (allowed: 0-23)",
        ),
        (
            vec!["--cron", "0 3 * * *", "--tz", "Europe/Berln"],
            "unknown time zone \"Europe/Berln\"",
        ),
        (
            vec!["--cron", "CRON_TZ=Mars/Base 0 3 * * *"],
            "unknown time zone \"Mars/Base\"",
        ),
        (vec!["--cron", "@reboot"], "@reboot names no time"),
        (
            vec!["--cron", "0 3 * * *", "-n", "0"],
            "0 is not in 1..=1000",
        ),
    ] {
        let out = next(&args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
    // `run` refuses the same way, before touching a store.
    let out = Command::new(BIN)
        .args([
            "run",
            "--lease",
            "x",
            "--cron",
            "0 3 * * *",
            "--tz",
            "Nowhere/City",
        ])
        .args(["--store", "sqlite:/nonexistent/dir/x.db", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown time zone \"Nowhere/City\""));
}

/// Two replicas whose hosts are in different zones (TZ) run one every-second schedule in
/// Europe/Berlin on one SQLite file: each slot once; status shows the task's zone.
#[test]
fn replicas_in_different_host_zones_run_each_slot_once() {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let store = format!("sqlite:{}", path_str(&dir.path().join("cron.db")));
    let args = [
        "--store",
        &store,
        "--lease",
        "berlin",
        "--cron",
        "* * * * * *",
        "--tz",
        "Europe/Berlin",
        "--ttl",
        "3s",
    ];
    let instances: Vec<Instance> = [("east", "Asia/Tokyo"), ("west", "America/Los_Angeles")]
        .iter()
        .map(|(name, zone)| {
            Instance::start_with_env(name, &args, &ledger, "50ms", dir.path(), &[("TZ", zone)])
        })
        .collect();
    std::thread::sleep(Duration::from_secs(5));
    for i in instances {
        assert_eq!(i.stop(Duration::from_secs(10)), 0, "clean exit on SIGTERM");
    }
    let by_slot = assert_exactly_once(&read_ledger(&ledger));
    assert!(
        by_slot.len() >= 3,
        "only {} slots ran in 5 s",
        by_slot.len()
    );
    assert!(by_slot.keys().all(|s| s % 1000 == 0));

    let out = Command::new(BIN)
        .args(["status", "--store", &store, "--json", "berlin"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let task = &doc["tasks"][0];
    assert_eq!(task["time_zone"], "Europe/Berlin", "{doc}");
    let local = task["next_due_local"].as_str().unwrap();
    assert!(
        local.ends_with("+01:00") || local.ends_with("+02:00"),
        "{doc}"
    );
    let text = Command::new(BIN)
        .args(["status", "--store", &store, "berlin"])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("NEXT DUE (TASK'S ZONE)") && text.contains(" Europe/Berlin"),
        "{text}"
    );
}
