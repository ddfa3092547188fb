//! The README's first command, `leasehold demo`, as a newcomer runs it: it must finish and say
//! that no tick ran twice.

mod common;

use common::*;

#[test]
fn the_demo_runs_and_no_tick_runs_twice() {
    let dir = temp_dir();
    let out = std::process::Command::new(BIN)
        .args(["demo", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("duplicate ticks      0"), "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    // A few ticks fall while the killed leader's lease (3 s) runs out, at a tick a second.
    let missed: u64 = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("missed ticks"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("a missed ticks line");
    assert!(missed <= 5, "{stdout}");
}
