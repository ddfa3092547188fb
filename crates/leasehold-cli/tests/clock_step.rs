//! A wall-clock step on a SQLite host does not end a live lease (issue 11 case 10): leases are
//! timed on the host's boot-time clock. A second `leasehold run` whose wall clock is an hour
//! ahead (libfaketime; `scripts/stores.sh` installs it) finds the lease busy. On the wall clock it
//! saw the lease as expired an hour ago and took it beside the live holder.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn faketime(offset: &str) -> Command {
    let mut cmd = Command::new("faketime");
    // Only the wall clock steps: the boot-time clock, like the kernel's, does not.
    cmd.env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .args(["-f", offset, BIN]);
    cmd
}

#[test]
fn a_wall_clock_step_does_not_free_a_live_lease() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let started = dir.path().join("started");
    let mut holder = Command::new(BIN)
        .args([
            "run", "--store", &url, "--lease", "step", "--ttl", "10s", "--",
        ])
        .args([
            "sh",
            "-c",
            &format!("touch {}; sleep 30", started.display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !started.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "holder did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Sanity: the faked wall clock really is an hour ahead in that process.
    let shown = faketime("+1h")
        .args(["--version"])
        .output()
        .expect("faketime (scripts/stores.sh installs it)");
    assert!(shown.status.success());
    for offset in ["+1h", "+10d", "-1h"] {
        let out = faketime(offset)
            .args(["run", "--store", &url, "--lease", "step", "--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(75),
            "wall clock {offset}: the live lease must be busy: {stderr}"
        );
        assert!(stderr.contains("is held by"), "{stderr}");
    }
    let _ = holder.kill();
    let _ = holder.wait();
}

/// libfaketime's preload library, where Debian puts it.
fn libfaketime() -> String {
    ["x86_64-linux-gnu", "aarch64-linux-gnu"]
        .iter()
        .map(|arch| format!("/usr/lib/{arch}/faketime/libfaketime.so.1"))
        .find(|p| std::path::Path::new(p).exists())
        .expect("libfaketime (scripts/stores.sh installs it)")
}

/// The wall clock of a `leasehold run` host steps 20 s forward (issue 36 item 8): the slot due
/// after the step runs at once as `timer`; of the slots the clock jumped over, the newest is
/// caught up (labelled catch-up) and the others are recorded as missed, not claimed (nothing
/// was running). Before, the slot the timer was armed
/// for ran 20 s late as `timer` and the jump was recorded as "previous run still going".
#[test]
fn a_forward_wall_clock_step_runs_the_slot_due_now_and_records_the_ones_jumped_over() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let ledger = ledger_in(dir.path());
    let offset = dir.path().join("offset");
    std::fs::write(&offset, "+0\n").unwrap();
    let lib = libfaketime();
    let offset_path = path_str(&offset);
    let instance = Instance::start_with_env(
        "stepped",
        &[
            "--store",
            &url,
            "--lease",
            "stepped",
            "--cron",
            "*/2 * * * * *",
            "--ttl",
            "3s",
        ],
        &ledger,
        "50ms",
        dir.path(),
        &[
            ("LD_PRELOAD", &lib),
            ("FAKETIME_TIMESTAMP_FILE", &offset_path),
            ("FAKETIME_NO_CACHE", "1"),
            // Only the wall clock steps: the boot-time clock, like the kernel's, does not.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    let start = Instant::now();
    while read_ledger(&ledger).len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(30), "no three runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = read_ledger(&ledger);
    let last_before = before.iter().filter_map(|r| r.slot).max().unwrap();
    std::fs::write(&offset, "+20s\n").unwrap();
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(instance.stop(Duration::from_secs(15)), 0);

    let runs = read_ledger(&ledger);
    assert_exactly_once(&runs);
    let after: Vec<_> = runs
        .iter()
        .filter(|r| r.slot.is_some_and(|s| s > last_before))
        .collect();
    assert!(after.len() >= 2, "{runs:?}");
    // After the step: the newest slot jumped over, caught up (cron's default catch-up policy,
    // `latest` within an hour), then the slot due now as timer, on time.
    let (caught_up, due) = (after[0], after[1]);
    assert_eq!(caught_up.trigger, "catch-up", "{runs:?}");
    assert!(caught_up.slot.unwrap() >= last_before + 18_000, "{runs:?}");
    let slot = due.slot.unwrap();
    assert_eq!(slot, caught_up.slot.unwrap() + 2_000, "{runs:?}");
    assert_eq!(due.trigger, "timer", "{runs:?}");
    assert!(due.start_ms.saturating_sub(slot) < 1_500, "{due:?}");
    // The slots jumped over: missed, not claimed; none for an overlap.
    let history = json_of(&["history", "--store", &url, "stepped", "--json"]);
    let text = history.to_string();
    assert!(!text.contains("overlap"), "{text}");
    let jumped = history
        .as_array()
        .or_else(|| history["runs"].as_array())
        .unwrap()
        .iter()
        .filter(|r| r.to_string().contains("not-claimed"))
        .count();
    assert!(jumped >= 1, "{text}");
}
