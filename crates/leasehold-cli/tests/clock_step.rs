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
