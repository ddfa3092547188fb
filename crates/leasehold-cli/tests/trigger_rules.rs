//! Two documented rules of `leasehold trigger` (issue 36, item 10), shown on two real
//! `leasehold run` instances: a trigger runs a paused task (as `kubectl create job --from`
//! runs a suspended CronJob) and the pause stays; triggers made while one waits to be taken
//! are that one request and one run, and a trigger made after it was taken is another run.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

fn leasehold(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run leasehold")
}

/// The run id in `trigger`'s first line: `TASK: run ID asked for by WHO (…)`.
fn run_id(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .next()
        .and_then(|l| l.split_once(": run "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in {stdout:?}"))
        .to_owned()
}

fn manual_runs(ledger: &std::path::Path) -> Vec<Run> {
    read_ledger(ledger)
        .into_iter()
        .filter(|r| r.trigger == "manual")
        .collect()
}

/// `status --json`'s state of `task`; empty when it is not listed, or before the first `run`
/// has created the store.
fn state(url: &str, task: &str) -> String {
    let out = leasehold(&["status", "--store", url, "--json"]);
    if out.status.code() == Some(66) {
        return String::new();
    }
    assert!(out.status.success(), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == task)
        .map(|t| t["state"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default()
}

#[test]
fn a_paused_task_runs_when_triggered_and_triggers_waiting_together_are_one_run() {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let lease = "rules";
    let task = "rules:run";
    // An hourly task: its timer stays out of the way. A ttl of 15 s: the instances read the
    // catalog (and take a trigger) every 5 s, and stay registered while stopped below.
    let args = [
        "--store", &url, "--lease", lease, "--every", "1h", "--ttl", "15s",
    ];
    let instances: Vec<Instance> = ["i1", "i2"]
        .iter()
        .map(|name| Instance::start(name, &args, &ledger, "50ms", dir.path()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while state(&url, task).is_empty() {
        assert!(Instant::now() < deadline, "the task was never registered");
        std::thread::sleep(Duration::from_millis(200));
    }

    let paused = leasehold(&["pause", "--store", &url, lease, "--by", "ops"]);
    assert!(paused.status.success(), "{paused:?}");
    assert_eq!(state(&url, task), "paused");

    // Neither instance can take a trigger while stopped, so every trigger below is made while
    // the first one waits.
    for i in &instances {
        i.signal("STOP");
    }
    let burst: Vec<std::process::Child> = (0..20)
        .map(|n| {
            let by = format!("op-{n}");
            let mut args = vec!["trigger", "--store", &url, lease, "--by", &by];
            if n == 0 {
                args.push("--wait=60s");
            }
            Command::new(BIN)
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // The waiting one is still waiting; the others have their answers.
    let mut burst = burst.into_iter();
    let waiting = burst.next().unwrap();
    let answers: Vec<Output> = burst.map(|c| c.wait_with_output().unwrap()).collect();
    for i in &instances {
        i.signal("CONT");
    }
    let waited = waiting.wait_with_output().unwrap();
    assert_eq!(waited.status.code(), Some(0), "{waited:?}");
    let id = run_id(&waited);
    assert!(
        String::from_utf8_lossy(&waited.stdout).contains(&format!("run {id} ended ok")),
        "{waited:?}"
    );
    for answer in &answers {
        assert!(answer.status.success(), "{answer:?}");
        assert_eq!(run_id(answer), id, "one request for all: {answer:?}");
    }
    let manual = manual_runs(&ledger);
    assert_eq!(manual.len(), 1, "twenty triggers, one run: {manual:?}");
    // The run was the trigger's, on a paused task, and the pause is still there.
    assert_eq!(state(&url, task), "paused");

    // Once taken, a trigger is a new request and another run.
    let again = leasehold(&["trigger", "--store", &url, lease, "--wait=60s"]);
    assert_eq!(again.status.code(), Some(0), "{again:?}");
    assert_ne!(run_id(&again), id);
    assert_eq!(manual_runs(&ledger).len(), 2);
    assert_eq!(state(&url, task), "paused");
    let timer: Vec<Run> = read_ledger(&ledger)
        .into_iter()
        .filter(|r| r.trigger == "timer" && r.start_ms > manual[0].start_ms)
        .collect();
    assert!(timer.is_empty(), "no timer run while paused: {timer:?}");
    for i in instances {
        assert_eq!(i.stop(Duration::from_secs(20)), 0);
    }
}
