//! One name for a `leasehold run --lease NAME` task (docs/cli.md, "Task names"): the catalog
//! and the history file it as `NAME:run`, and every command shows it as `NAME`, the name the
//! operator gave `run`, in its tables and messages. Both names are accepted as input; JSON
//! carries the catalog's name, exact.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// `leasehold ARGS`, which must succeed: its stdout.
fn stdout_of(args: &[&str]) -> String {
    let out = leasehold(args);
    assert_eq!(
        code(&out),
        0,
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The first word of each line of `text` (a table's first column).
fn first_words(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

#[test]
fn a_run_task_is_named_as_given_to_run_and_answers_to_both_names() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("names.db")));
    let name = "nightly-report";
    let filed = format!("{name}:run");
    let args = [
        "--store", &url, "--lease", name, "--every", "1s", "--ttl", "3s",
    ];
    let instance = Instance::start("i1", &args, &ledger_in(dir.path()), "20ms", dir.path());

    // Once it has run: the history is there, under the catalog's name.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = leasehold(&["history", "--store", &url, name, "--json"]);
        if code(&out) == 0 {
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if doc["runs"].as_array().is_some_and(|r| !r.is_empty()) {
                assert_eq!(doc["task"], filed.as_str(), "JSON is exact: {doc}");
                break;
            }
        }
        assert!(Instant::now() < deadline, "no run recorded in 20 s");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Paused by its catalog name, shown by its own.
    let paused = stdout_of(&["pause", "--store", &url, &filed, "--by", "ops"]);
    assert!(
        paused.starts_with(&format!("{name} is paused (by ops")),
        "{paused}"
    );
    assert!(
        paused.contains(&format!("`leasehold resume {name}`")),
        "{paused}"
    );

    // Every task of the fleet by its name; only the lease table names the run lease.
    let fleet = stdout_of(&["status", "--store", &url]);
    let (tasks, rest) = fleet.split_once("\nLEASE").expect("a lease table");
    assert!(first_words(tasks).contains(&name), "{fleet}");
    assert!(!tasks.contains(&filed), "{fleet}");
    let groups = rest.split_once("\nGROUP").expect("a group table").1;
    let group_row = groups.lines().nth(1).unwrap_or_default();
    assert!(group_row.ends_with(&format!("  {name}")), "{fleet}");
    let json = json_of(&["status", "--store", &url, "--json"]);
    assert_eq!(
        json["tasks"][0]["name"],
        filed.as_str(),
        "JSON is exact: {json}"
    );

    // `status NAME`: the lease NAME (the leader group) and the task NAME, paused.
    let named = stdout_of(&["status", "--store", &url, name]);
    let task_table = named.split_once("\nTASK").expect("a task row").1;
    assert_eq!(first_words(task_table).get(1), Some(&name), "{named}");
    assert!(task_table.contains("paused by ops"), "{named}");
    assert!(!task_table.contains(&filed), "{named}");

    let resumed = stdout_of(&["resume", "--store", &url, name]);
    assert_eq!(resumed, format!("{name} resumed: its next slot runs\n"));

    let triggered = stdout_of(&["trigger", "--store", &url, &filed, "--wait=30s"]);
    let lines: Vec<&str> = triggered.lines().collect();
    assert_eq!(lines.len(), 2, "{triggered}");
    for line in &lines {
        assert!(line.starts_with(&format!("{name}: run ")), "{triggered}");
    }
    assert!(lines[1].contains("ended ok"), "{triggered}");

    for given in [name, filed.as_str()] {
        let history = stdout_of(&["history", "--store", &url, given, "--limit", "3"]);
        assert!(
            history.starts_with(&format!("task: {name}   store: ")),
            "history {given}: {history}"
        );
    }

    assert_eq!(instance.stop(Duration::from_secs(10)), 0);
    let forgot = stdout_of(&["forget", "--store", &url, &filed]);
    assert!(
        forgot.starts_with(&format!("{name} forgotten: ")),
        "{forgot}"
    );
}
