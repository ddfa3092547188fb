//! Issue 32 case 1: only the `leasehold run` process is frozen (SIGSTOP; a debugger or a cgroup
//! freeze of that one process does the same), not its supervisor and not its command. The
//! supervisor holds the lease's deadline and stops the command by its own clock, so the command
//! is gone before a waiting instance can take the lease over: not one write of the two commands
//! overlaps.
//!
//! Each command ignores SIGTERM (so it has to be killed) and appends a wall-clock timestamped line
//! to a shared file every 50 ms: the overlap is measured from the commands' own writes.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const TTL: Duration = Duration::from_secs(3);

/// A command that ignores SIGTERM and writes `HOLDER MICROS` lines to `log` until it is killed
/// (bash's clock, so that only `sleep` is forked: these run beside other timing tests).
fn recorder(log: &Path) -> Vec<String> {
    let script = format!(
        "trap '' TERM; while :; do echo \"$LEASEHOLD_HOLDER ${{EPOCHREALTIME/./}}\" >> {log}; sleep 0.05; done",
        log = log.display()
    );
    vec!["bash".into(), "-c".into(), script]
}

/// The lines of `log`, as (holder, microseconds since the epoch).
fn writes(log: &Path) -> Vec<(String, u128)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (holder, at) = l.split_once(' ')?;
            Some((holder.to_owned(), at.trim().parse().ok()?))
        })
        .collect()
}

fn first_write_of(log: &Path, holder: &str) -> Option<u128> {
    writes(log)
        .into_iter()
        .filter(|(h, _)| h == holder)
        .map(|(_, at)| at)
        .min()
}

fn wait_for_write(log: &Path, holder: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    while first_write_of(log, holder).is_none() {
        assert!(
            start.elapsed() < limit,
            "{holder}'s command did not start within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig}");
}

fn start(holder: &str, args: &[&str], log: &Path, stderr: &Path) -> Child {
    Command::new(BIN)
        .arg("run")
        .args(["--holder", holder])
        .args(args)
        .arg("--")
        .args(recorder(log))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).unwrap())
        .spawn()
        .unwrap()
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(
            start.elapsed() < limit,
            "leasehold did not exit in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Freezes `a`'s `leasehold run` process for 2 × ttl while `b` waits for the lease; returns how
/// long after the freeze `b`'s command started, and checks the two commands never wrote at the
/// same time.
fn freeze_while_another_waits(store: &str, scheduled: bool) {
    let dir = temp_dir();
    let log = dir.path().join("writes");
    let lease = format!(
        "frozen-{}-{}",
        if scheduled { "every" } else { "flock" },
        std::process::id()
    );
    let ttl = format!("{}s", TTL.as_secs());
    let mut args = vec!["--store", store, "--lease", &lease, "--ttl", &ttl];
    if scheduled {
        // The commands never end: the final SIGTERMs stop them at once, without a drain.
        args.extend(["--every", "1s", "--drain", "0"]);
    } else {
        args.push("--wait");
    }
    let (a_log, b_log) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let mut a = KillOnDrop(start("a", &args, &log, &a_log));
    wait_for_write(&log, "a", Duration::from_secs(15));
    let mut b = KillOnDrop(start("b", &args, &log, &b_log));
    // b is waiting (or following); now only a's runner stops, not its supervisor or command.
    std::thread::sleep(Duration::from_millis(500));
    assert!(first_write_of(&log, "b").is_none(), "b ran beside a");
    signal(&a.0, "STOP");
    let frozen = Instant::now();
    let b_started = wait_for_write(&log, "b", TTL * 2);
    std::thread::sleep((TTL * 2).saturating_sub(frozen.elapsed()));
    signal(&a.0, "CONT");

    let all = writes(&log);
    let a_last = all.iter().filter(|(h, _)| h == "a").map(|w| w.1).max();
    let b_first = all.iter().filter(|(h, _)| h == "b").map(|w| w.1).min();
    let (a_last, b_first) = (a_last.unwrap(), b_first.unwrap());
    let gap_ms = (b_first as i128 - a_last as i128) as f64 / 1e3;
    println!(
        "{store} scheduled={scheduled}: b's command started {b_started:?} after the freeze; \
         a's last write {gap_ms:.1} ms before b's first"
    );
    assert!(
        a_last < b_first,
        "a's command wrote {:.1} ms after b's started",
        -gap_ms
    );
    // And a's command never wrote again.
    std::thread::sleep(Duration::from_millis(300));
    let a_after = writes(&log)
        .iter()
        .filter(|(h, at)| h == "a" && *at > b_first)
        .count();
    assert_eq!(a_after, 0, "a's command wrote after it was thawed");

    if scheduled {
        // Thawed, a carries on as a follower; a clean stop of both.
        for (name, mut run) in [("a", a), ("b", b)] {
            signal(&run.0, "TERM");
            assert_eq!(
                wait_exit(&mut run.0, Duration::from_secs(10)),
                Some(0),
                "{name}"
            );
        }
        let out = Command::new(BIN)
            .args(["history", "--store", store, &lease, "--json"])
            .output()
            .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // a's runs (not its records of missed slots): the one cut short is cancelled or lost.
        let a_runs: Vec<&serde_json::Value> = doc["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["holder"] == "a" && r["trigger"].is_string())
            .collect();
        println!("a's runs: {a_runs:?}");
        assert!(
            !a_runs.is_empty()
                && a_runs
                    .iter()
                    .all(|r| r["outcome"] == "cancelled" || r["outcome"] == "interrupted"),
            "a's cut-short run is recorded as cancelled: {doc}"
        );
    } else {
        // Thawed, a finds its lease lost: exit 1 and one error line.
        let code = wait_exit(&mut a.0, Duration::from_secs(10));
        let stderr = std::fs::read_to_string(&a_log).unwrap();
        println!("a exited {code:?}:\n{stderr}");
        assert_eq!(code, Some(1), "{stderr}");
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("error:") || l.contains("ERROR"))
            .collect();
        assert_eq!(errors.len(), 1, "one error line: {stderr}");
        assert!(
            errors[0].starts_with("leasehold: error: lease lost while the command ran"),
            "{stderr}"
        );
        signal(&b.0, "TERM");
        wait_exit(&mut b.0, Duration::from_secs(10));
    }
}

fn sqlite(dir: &Path) -> String {
    format!("sqlite:{}", path_str(&dir.join("leases.db")))
}

fn redis() -> String {
    std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

#[test]
fn sqlite_flock_frozen_runner_stops_its_command_in_time() {
    let dir = temp_dir();
    freeze_while_another_waits(&sqlite(dir.path()), false);
}

#[test]
fn sqlite_scheduled_frozen_runner_stops_its_command_in_time() {
    let dir = temp_dir();
    freeze_while_another_waits(&sqlite(dir.path()), true);
}

#[test]
fn redis_flock_frozen_runner_stops_its_command_in_time() {
    freeze_while_another_waits(&redis(), false);
}

#[test]
fn redis_scheduled_frozen_runner_stops_its_command_in_time() {
    freeze_while_another_waits(&redis(), true);
}
