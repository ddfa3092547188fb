//! `leasehold status`, `pause`, `resume` and `trigger` as an operator uses them, on every store
//! (etcd: one of the test's own): a `leasehold run --every` task on two instances, and a task
//! an application ticks through a real `leasehold serve` sidecar. A pause stops runs and
//! records the paused slots, a resume lets them run again, a trigger runs once on one
//! instance; forget is refused while the instances run the task and removes it once they
//! stopped; unknown tasks and tasks nobody runs exit with their documented statuses.

mod common;

use std::time::Duration;

use common::sidecar::Sidecar;
use common::*;
use serde_json::{Value, json};

/// Two `leasehold run --every 1s` instances: status lists the task with both and its group's
/// leader; pause stops the runs and records the paused slots; resume and trigger --wait run
/// it again, the manual run once, on one instance.
fn run_task(url: &str) {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = unique("ctl");
    let task = format!("{lease}:run");
    let instances = two_every_second(url, &lease, &ledger, dir.path());
    let listed = task_when(url, &task, "two live instances", two_live);
    assert_eq!(listed["definition"]["source"], "run", "{listed}");
    assert_eq!(listed["definition"]["leader_group"], lease.as_str());
    let status = json_of(&["status", "--store", url, "--json"]);
    let group = status["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == lease.as_str())
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        ["i1", "i2"].contains(&group["leader"].as_str().unwrap_or("")),
        "{group}"
    );

    let paused = leasehold(&[
        "pause", "--store", url, &lease, "--reason", "freeze", "--by", "ops",
    ]);
    assert_eq!(
        code(&paused),
        0,
        "{}",
        String::from_utf8_lossy(&paused.stderr)
    );
    let pause_at = task_when(url, &task, "paused", |t| t["state"] == "paused")["paused"]["at_ms"]
        .as_u64()
        .unwrap();
    std::thread::sleep(Duration::from_millis(3500));
    let records = history(url, &task);
    let paused_slots = records
        .iter()
        .filter(|r| r["paused"]["by"] == "ops")
        .count();
    assert!(paused_slots >= 2, "{records:?}");
    let resumed = leasehold(&["resume", "--store", url, &lease]);
    assert_eq!(code(&resumed), 0);
    let resumed_at = pause_at + 3500;
    let ran_while_paused: Vec<_> = read_ledger(&ledger)
        .into_iter()
        .filter(|r| {
            r.slot
                .is_some_and(|s| s > pause_at + 1000 && s < resumed_at)
        })
        .collect();
    assert!(ran_while_paused.is_empty(), "{ran_while_paused:?}");

    let triggered = leasehold(&[
        "trigger",
        "--store",
        url,
        &lease,
        "--by",
        "ops",
        "--wait=30s",
    ]);
    let stdout = String::from_utf8_lossy(&triggered.stdout);
    assert_eq!(
        code(&triggered),
        0,
        "{stdout} {}",
        String::from_utf8_lossy(&triggered.stderr)
    );
    assert!(stdout.contains("ended ok"), "{stdout}");
    std::thread::sleep(Duration::from_millis(2000));
    // Forget is refused while the instances run it, and removes nothing.
    let refused = leasehold(&["forget", "--store", url, &lease]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(code(&refused), 77, "{stderr}");
    assert!(stderr.contains("2 live instance(s)"), "{stderr}");
    task_when(url, &task, "still listed", two_live);
    for i in instances {
        assert_eq!(i.stop(Duration::from_secs(10)), 0);
    }
    // The instance that found the task paused said so once, with who and why, and once that
    // it ran again.
    let logs: String = ["i1", "i2"]
        .iter()
        .map(|i| std::fs::read_to_string(dir.path().join(format!("{i}.log"))).unwrap())
        .collect();
    let said = |what: &str| logs.lines().filter(|l| l.contains(what)).count();
    assert_eq!(said("task paused: its slots are skipped"), 1, "{logs}");
    assert!(logs.contains("by=ops reason=freeze"), "{logs}");
    assert_eq!(said("task resumed: its slots run again"), 1, "{logs}");
    // Each instance said when its first slot falls due.
    assert_eq!(said(" first_slot=20"), 2, "{logs}");
    let runs = read_ledger(&ledger);
    let manual: Vec<_> = runs.iter().filter(|r| r.trigger == "manual").collect();
    assert_eq!(manual.len(), 1, "{runs:?}");
    assert!(
        ["i1", "i2"].contains(&manual[0].holder.as_str()),
        "{manual:?}"
    );
    assert!(
        runs.iter()
            .any(|r| r.trigger == "timer" && r.start_ms > manual[0].end_ms),
        "timer runs go on after the resume: {runs:?}"
    );
    let records = history(url, &task);
    let manual: Vec<_> = records
        .iter()
        .filter(|r| r["trigger"] == "manual")
        .collect();
    assert_eq!(manual.len(), 1, "{records:?}");
    assert_eq!(manual[0]["request"]["by"], "ops");

    // The instances stopped (the task stays listed: it was paused once): nobody would take it.
    assert_eq!(code(&leasehold(&["trigger", "--store", url, &lease])), 68);
    assert_eq!(
        code(&leasehold(&["pause", "--store", url, "no-such-task"])),
        66
    );
    assert_eq!(
        code(&leasehold(&["trigger", "--store", url, "no-such-task"])),
        66
    );

    // Stopped: forget takes it out of the catalog with its pause record, the history stays
    // until --history.
    let forgot = leasehold(&["forget", "--store", url, &lease]);
    let stdout = String::from_utf8_lossy(&forgot.stdout);
    assert_eq!(
        code(&forgot),
        0,
        "{stdout} {}",
        String::from_utf8_lossy(&forgot.stderr)
    );
    assert!(stdout.contains(&format!("{lease} forgotten")), "{stdout}");
    let status = json_of(&["status", "--store", url, "--json"]);
    let listed = status["tasks"].as_array().unwrap();
    assert!(
        listed.iter().all(|t| t["name"] != task.as_str()),
        "{status}"
    );
    assert!(!history(url, &task).is_empty(), "the history is kept");
    assert_eq!(
        code(&leasehold(&["forget", "--store", url, &task, "--history"])),
        66,
        "no longer in the catalog"
    );
    assert!(history(url, &task).is_empty(), "--history removed it");
}

fn tick(sidecar: &Sidecar, task: &str) -> Value {
    let (status, answer) = sidecar.post(
        &format!("/v1/tasks/{task}/ticks"),
        json!({"every_ms": 1000, "ttl_ms": 3000}),
    );
    assert_eq!(status, 200, "{answer}");
    answer
}

fn done(sidecar: &Sidecar, task: &str, granted: &Value) {
    let slot = granted["slot"].as_u64().unwrap();
    let (status, answer) = sidecar.post(
        &format!("/v1/tasks/{task}/ticks/{slot}/done"),
        json!({"token": granted["token"], "outcome": "ok"}),
    );
    assert_eq!(status, 200, "{answer}");
}

/// A task two real sidecars tick: listed by status with both, paused (their ticks answer
/// paused, the slot is recorded), resumed, and triggered (exactly one of their next ticks
/// answers a manual run).
fn sidecar_task(url: &str) {
    let sidecars = [Sidecar::start(url, "side-a"), Sidecar::start(url, "side-b")];
    let task = unique("side");
    // Both tick each round, as replicas' timers fire together; granted runs end at once.
    let round = || -> Vec<Value> {
        let answers: Vec<Value> = sidecars.iter().map(|s| tick(s, &task)).collect();
        for (sidecar, answer) in sidecars.iter().zip(&answers) {
            if answer["run"] == true {
                done(sidecar, &task, answer);
            }
        }
        answers
    };
    let first = round();
    let ran: Vec<&Value> = first
        .iter()
        .filter(|a| a["run"] == true)
        .map(|a| &a["slot"])
        .collect();
    // Two runs only for two slots: a second began between the two ticks.
    assert!(
        !ran.is_empty() && (ran.len() == 1 || ran[0] != ran[1]),
        "{first:?}"
    );
    let listed = task_when(url, &task, "registered by both sidecars", two_live);
    assert_eq!(listed["definition"]["source"], "sidecar", "{listed}");
    assert_eq!(listed["definition"]["schedule"], "every 1s");

    assert_eq!(
        code(&leasehold(&["pause", "--store", url, &task, "--by", "ops"])),
        0
    );
    std::thread::sleep(Duration::from_millis(1100));
    // A tick a little before a boundary is answered not-due for the slot about to start
    // (`starts_in_ms`); the pause shows at the ticks that reach a slot. Nothing runs either way.
    let mut saw_paused = false;
    for _ in 0..4 {
        let paused = round();
        assert!(
            paused
                .iter()
                .all(|a| a["run"] == false && (a["reason"] == "paused" || a["reason"] == "not-due")),
            "{paused:?}"
        );
        if paused.iter().any(|a| a["reason"] == "paused") {
            saw_paused = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(saw_paused, "a tick while paused answered `paused`");
    assert_eq!(code(&leasehold(&["resume", "--store", url, &task])), 0);
    let out = leasehold(&["trigger", "--store", url, &task, "--by", "ops"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    // Taken at the sidecars' next ticks: where a new slot began since the pause, the first
    // round runs that timer slot and the trigger waits beside no run, for the next round.
    let mut rounds = Vec::new();
    while rounds.len() < 3 {
        let answers = round();
        let taken = answers.iter().any(|a| a["trigger"] == "manual");
        rounds.push(answers);
        if taken {
            break;
        }
    }
    // And not again.
    rounds.push(round());
    let manual = rounds
        .iter()
        .flatten()
        .filter(|a| a["trigger"] == "manual")
        .count();
    assert_eq!(manual, 1, "one manual run, on one instance: {rounds:?}");
    assert!(rounds.len() <= 3, "taken within two rounds: {rounds:?}");
    std::thread::sleep(Duration::from_millis(500));
    let records = history(url, &task);
    assert_eq!(
        records.iter().filter(|r| r["trigger"] == "manual").count(),
        1,
        "{records:?}"
    );
    assert!(
        records.iter().any(|r| r["paused"]["by"] == "ops"),
        "{records:?}"
    );
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}", path_str(&dir.path().join("leases.db")))
}

fn env_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

#[test]
fn sqlite_run_task_is_paused_resumed_and_triggered() {
    let dir = temp_dir();
    run_task(&sqlite_url(&dir));
}

#[test]
fn sqlite_sidecar_task_is_paused_resumed_and_triggered() {
    let dir = temp_dir();
    sidecar_task(&sqlite_url(&dir));
}

#[test]
fn redis_run_task_is_paused_resumed_and_triggered() {
    run_task(&env_url(
        "LEASEHOLD_TEST_REDIS_URL",
        "redis://127.0.0.1:6379",
    ));
}

#[test]
fn redis_sidecar_task_is_paused_resumed_and_triggered() {
    sidecar_task(&env_url(
        "LEASEHOLD_TEST_REDIS_URL",
        "redis://127.0.0.1:6379",
    ));
}

const POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

#[test]
fn postgres_run_task_is_paused_resumed_and_triggered() {
    run_task(&env_url("LEASEHOLD_TEST_POSTGRES_URL", POSTGRES));
}

#[test]
fn postgres_sidecar_task_is_paused_resumed_and_triggered() {
    sidecar_task(&env_url("LEASEHOLD_TEST_POSTGRES_URL", POSTGRES));
}

const MYSQL: &str = "mysql://root@127.0.0.1:3306/test";

#[test]
fn mysql_run_task_is_paused_resumed_and_triggered() {
    run_task(&env_url("LEASEHOLD_TEST_MYSQL_URL", MYSQL));
}

#[test]
fn mysql_sidecar_task_is_paused_resumed_and_triggered() {
    sidecar_task(&env_url("LEASEHOLD_TEST_MYSQL_URL", MYSQL));
}

#[test]
fn etcd_run_and_sidecar_tasks_are_paused_resumed_and_triggered() {
    let etcd = leasehold_etcd::testing::EtcdCluster::start(1);
    run_task(&etcd.url());
    sidecar_task(&etcd.url());
}

/// `status NAME` of a task paused before its first slot (no history yet): its row comes from
/// the catalog, with the next slot and who paused it.
#[test]
fn status_of_a_task_paused_before_it_ever_ran() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("p.db")));
    let ledger = ledger_in(dir.path());
    let lease = unique("early");
    let task = format!("{lease}:run");
    let args = [
        "--store",
        &url,
        "--lease",
        &lease,
        "--every",
        "1h",
        "--ttl",
        "3s",
        "--timeout",
        "5s",
        "--retries",
        "2",
        "--jitter",
        "100ms",
    ];
    let instance = Instance::start("i1", &args, &ledger, "20ms", dir.path());
    let listed = task_when(&url, &task, "one live instance", |t| {
        t["instances"]
            .as_array()
            .is_some_and(|i| i.iter().any(|i| i["live"] == true))
    });
    // The catalog shows the task's run policies.
    let d = &listed["definition"];
    assert_eq!(
        (&d["timeout_ms"], &d["retries"], &d["jitter_ms"]),
        (&5000.into(), &2.into(), &100.into()),
        "{listed}"
    );
    let paused = leasehold(&[
        "pause", "--store", &url, &lease, "--reason", "not yet", "--by", "ops",
    ]);
    assert_eq!(
        code(&paused),
        0,
        "{}",
        String::from_utf8_lossy(&paused.stderr)
    );
    let table = leasehold(&["status", "--store", &url, &lease]);
    let table = String::from_utf8_lossy(&table.stdout);
    // The task row names it as `run` was given it (its catalog name, `NAME:run`, is in JSON).
    let task_row = table
        .split_once("\nTASK")
        .and_then(|(_, rows)| rows.lines().nth(1))
        .unwrap_or_default();
    assert!(
        task_row.starts_with(&format!("{lease} ")) && table.contains("paused by ops at "),
        "{table}"
    );
    assert!(table.contains(": not yet"), "{table}");
    let doc = json_of(&["status", "--store", &url, &lease, "--json"]);
    let row = &doc["tasks"][0];
    assert_eq!(row["task"], task.as_str(), "{doc}");
    assert_eq!(row["paused"]["by"], "ops", "{doc}");
    assert!(
        row["next_due_ms"]
            .as_u64()
            .is_some_and(|n| n % 3_600_000 == 0),
        "{doc}"
    );
    assert!(row["last_run"].is_null(), "{doc}");
    assert_eq!(instance.stop(Duration::from_secs(10)), 0);
}
