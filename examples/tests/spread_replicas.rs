//! The spread bench at a small scale, as separate processes on one SQLite file: the tasks
//! settle on one owner each, a SIGKILLed replica's tasks run elsewhere, no slot runs twice.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_spread");

#[test]
fn a_killed_replicas_tasks_move_and_no_slot_runs_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("spread.db").display());
    let out = Command::new(BIN)
        .args([
            "bench",
            "--store",
            &store,
            "--replicas",
            "3",
            "--tasks",
            "12",
        ])
        .args(["--every", "500ms", "--ttl", "1500ms", "--watch", "1s"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("slots run twice: 0 "), "{stdout}");
    assert!(stdout.contains("every survivor sees 2 members"), "{stdout}");
    assert!(stdout.contains("its "), "{stdout}");
}
