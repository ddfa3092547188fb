//! How runs went, on SQLite, Redis and PostgreSQL: a command that fails every run
//! (`sh -c 'echo boom >&2; exit 3'`) under `leasehold run` is recorded `failed` with its exit
//! status in `history --json`, shown `failing` with the count in `status` (table and JSON), and
//! counted in `/metrics` (`leasehold_runs_total{outcome="failed"}`, consecutive failures, last
//! run, interval; no last success).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use leasehold_testkit::free_port;

/// `GET /metrics` on `port`, `None` until something answers.
fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response.split_once("\r\n\r\n")?.1.to_owned())
}

/// The value of the sample of `metric` whose labels include every one of `labels`.
fn sample(scrape: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

async fn failing_runs_are_failed_everywhere(url: &str) {
    let lease = unique("boom");
    let task = format!("{lease}:run");
    let port = free_port();
    let dir = temp_dir();
    let log = std::fs::File::create(dir.path().join("run.log")).unwrap();
    let mut run = KillOnDrop(
        Command::new(BIN)
            .args(["run", "--store", url, "--lease", &lease, "--every", "1s"])
            .args([
                "--ttl",
                "3s",
                "--metrics-listen",
                &format!("127.0.0.1:{port}"),
            ])
            .args(["--", "sh", "-c", "echo boom >&2; exit 3"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    // Three failed runs counted on this instance.
    let task_label = format!("task=\"{task}\"");
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let text = scrape(port).unwrap_or_default();
        if sample(&text, "leasehold_consecutive_failures", &[&task_label]).unwrap_or(0.0) >= 3.0 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no 3 failures in a row counted: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let failed = sample(
        &metrics,
        "leasehold_runs_total",
        &[&task_label, "outcome=\"failed\"", "trigger=\"timer\""],
    );
    assert!(failed.is_some_and(|n| n >= 3.0), "{metrics}");
    assert_eq!(
        sample(
            &metrics,
            "leasehold_runs_total",
            &[&task_label, "outcome=\"ok\""]
        ),
        None,
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "leasehold_last_success_timestamp_seconds",
            &[&task_label]
        ),
        None,
        "no success yet: {metrics}"
    );
    assert_eq!(
        sample(&metrics, "leasehold_task_interval_seconds", &[&task_label]),
        Some(1.0)
    );
    let last_run = sample(
        &metrics,
        "leasehold_last_run_timestamp_seconds",
        &[&task_label],
    )
    .unwrap();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((wall - last_run).abs() < 30.0, "{last_run} vs {wall}");
    assert!(
        sample(
            &metrics,
            "leasehold_run_duration_seconds_count",
            &[&task_label]
        )
        .is_some_and(|n| n >= 3.0),
        "{metrics}"
    );

    // The history: every ended run failed, with its exit status.
    let doc = json_of(&["history", "--store", url, &lease, "--json"]);
    let runs = doc["runs"].as_array().unwrap();
    let ended: Vec<_> = runs.iter().filter(|r| r["ended_ms"].is_u64()).collect();
    assert!(ended.len() >= 3, "{doc}");
    for r in &ended {
        assert_eq!(r["outcome"], "failed", "{doc}");
        assert_eq!(r["result"], "failed", "{doc}");
        assert_eq!(r["error"], "command exited with status 3", "{doc}");
        // The names `status --json` and the API use, beside the record's own.
        assert_eq!(r["slot_ms"], r["slot"], "{doc}");
        let took = r["ended_ms"].as_u64().unwrap() - r["started_ms"].as_u64().unwrap();
        assert_eq!(r["duration_ms"].as_u64(), Some(took), "{doc}");
    }
    // The instance's log names the slot and the outcome in plain words.
    let logged = std::fs::read_to_string(dir.path().join("run.log")).unwrap();
    let failed_line = logged
        .lines()
        .find(|l| l.contains("run did not succeed"))
        .unwrap_or_else(|| panic!("{logged}"));
    assert!(
        failed_line.contains("result=failed: command exited with status 3")
            && ended
                .iter()
                .any(|r| failed_line.contains(&format!("slot={} ", r["slot"])))
            && !failed_line.contains("Some("),
        "{failed_line}"
    );
    let table = leasehold(&["history", "--store", url, &lease]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("failed: command exited with status 3"),
        "{table}"
    );

    // status: the task is failing, with the count; its last run failed. (Between runs: while
    // one goes, it is running.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let task_json = loop {
        let doc = json_of(&["status", "--store", url, "--json"]);
        let found = doc["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == task.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{task} not in the catalog: {doc}"));
        if found["state"] == "failing" {
            break found;
        }
        assert!(Instant::now() < deadline, "never failing: {found}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        task_json["consecutive_failures"].as_u64().unwrap() >= 3,
        "{task_json}"
    );
    assert_eq!(task_json["last_success_ms"], serde_json::Value::Null);
    assert_eq!(task_json["last_run"]["outcome"], "failed", "{task_json}");
    assert_eq!(
        task_json["last_run"]["error"], "command exited with status 3",
        "{task_json}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = leasehold(&["status", "--store", url]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // The table shows a run task by the name given to `run` (docs/cli.md, "Task names").
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{lease} ")))
            .unwrap_or("");
        if line.contains("failing (") {
            assert!(line.contains("failed"), "{text}");
            assert!(
                text.contains(
                    "failed in a row, no success recorded; last error: command exited with status 3"
                ),
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "never failing: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The command's failures are not this process's: it goes on, and stops cleanly.
    let pid = run.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while run.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_failing_runs_are_failed_in_history_status_and_metrics() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("o.db")));
    failing_runs_are_failed_everywhere(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_failing_runs_are_failed_in_history_status_and_metrics() {
    let url = std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    failing_runs_are_failed_everywhere(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_failing_runs_are_failed_in_history_status_and_metrics() {
    let url = std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or("postgres://postgres@127.0.0.1:5432/test".into());
    failing_runs_are_failed_everywhere(&url).await;
}

/// `--history N` bounds what the store keeps of a task's history; out of range is a usage
/// error naming the range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_setting_bounds_the_kept_entries() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("h.db")));
    let lease = unique("short");
    let mut run = KillOnDrop(
        Command::new(BIN)
            .args([
                "run", "--store", &url, "--lease", &lease, "--every", "500ms",
            ])
            .args(["--ttl", "3s", "--history", "3", "--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Six runs or more (one each 500 ms): the store keeps the newest three.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let doc = json_of(&[
        "history", "--store", &url, &lease, "--json", "--limit", "50",
    ]);
    let slots: Vec<u64> = doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["slot"].as_u64().unwrap())
        .collect();
    assert_eq!(slots.len(), 3, "--history 3: {doc}");
    assert!(
        slots.windows(2).all(|w| w[0] == w[1] + 500),
        "the newest three, one after another: {doc}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(now - slots[0] < 2000, "the newest kept: {doc} at {now}");
    let _ = run.0.kill();
    let out = leasehold(&[
        "run",
        "--store",
        &url,
        "--lease",
        &lease,
        "--every",
        "1s",
        "--history",
        "1001",
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 2, "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("from 1 to 1000"), "{stderr}");
}
