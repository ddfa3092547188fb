//! `leasehold crontab` as a container's PID 1 (issue 40): a line whose command daemonizes
//! (`setsid`) leaves orphans that are handed to PID 1 when their parent exits; leasehold reaps
//! them, so they never pile up as zombies. Run in a PID namespace of its own (`unshare`, as
//! root: the test command runs as root), where leasehold is PID 1.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The pids of `parent`'s children in state `Z`, from the host's /proc.
fn zombie_children(parent: u32) -> Vec<u32> {
    let mut zombies = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command's name: state, then the parent's pid.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (state, ppid) = (fields.next(), fields.next().and_then(|p| p.parse().ok()));
        if state == Some("Z") && ppid == Some(parent) {
            zombies.push(pid);
        }
    }
    zombies
}

/// The host pid of the one child of `pid` (unshare's forked child: PID 1 inside).
fn only_child(pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

#[test]
fn orphans_of_daemonizing_lines_are_reaped_as_pid_1() {
    let dir = temp_dir();
    let marks = dir.path().join("marks");
    let file = dir.path().join("crontab");
    // Every second: a grandchild that leaves the line's process group and outlives the line's
    // shell by a moment, then exits as PID 1's child.
    std::fs::write(
        &file,
        format!(
            "# leasehold: name=orphans\n\
             * * * * * * * setsid sh -c 'sleep 0.3' & echo $! >> {}\n",
            marks.display()
        ),
    )
    .unwrap();
    let store = format!("sqlite:{}", dir.path().join("db").display());
    let mut unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child", BIN])
        .args(["crontab", "--store", &store, file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) runs as root");
    let start = Instant::now();
    let init = loop {
        if let Some(pid) = only_child(unshare.id()) {
            break pid;
        }
        if let Some(status) = unshare.try_wait().unwrap() {
            panic!("unshare ended at once ({status}): is this root?");
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no PID 1");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Wait for several orphans to have come and gone, sampling the zombies meanwhile.
    let mut most = 0;
    let orphans = loop {
        most = most.max(zombie_children(init).len());
        let orphans = std::fs::read_to_string(&marks)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if orphans >= 6 && start.elapsed() > Duration::from_secs(2) {
            break orphans;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the line ran {orphans} times in 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The last orphan has had time to exit (0.3 s) and be reaped.
    std::thread::sleep(Duration::from_secs(1));
    let left = zombie_children(init);
    let _ = Command::new("kill")
        .args(["-TERM", &init.to_string()])
        .status();
    let status = unshare.wait().unwrap();
    println!("{orphans} orphans, at most {most} zombies at once, {left:?} left; exit {status}");
    assert!(
        left.len() <= 1,
        "zombies pile up under PID 1 after {orphans} orphans: {left:?}"
    );
    assert!(
        most <= 2,
        "{most} zombies at once: orphans are not reaped as they exit"
    );
    assert!(status.success(), "clean exit on SIGTERM: {status}");
}
