//! Reaping orphans when `leasehold` is a container's PID 1.
//!
//! A process whose parent dies is handed to PID 1, which must wait for it when it exits, or it
//! stays a zombie (a process-table entry) for good. Commands are run in process groups that are
//! killed whole (src/child.rs), but a command that daemonizes (`setsid`, a double fork) leaves
//! the group, and its processes end up with PID 1 when they exit. Run as PID 1 (`docker run
//! image leasehold crontab …` without `--init`), `leasehold` reaps them: on every SIGCHLD, and
//! every few seconds in case one was coalesced, it waits for each zombie child that is not one
//! of the supervisors it started itself (those tokio waits for, and their exit is reported).

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{Pid, getpid};

/// The supervisors started and not yet waited for. Held across a spawn, so a supervisor that
/// exits at once is never taken for an orphan.
static OURS: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

/// The set of our own children, locked.
pub fn ours() -> MutexGuard<'static, Option<HashSet<i32>>> {
    OURS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notes a child started by this process (under the lock [`ours`] returned).
pub fn started(set: &mut Option<HashSet<i32>>, pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        set.get_or_insert_with(HashSet::new).insert(pid);
    }
}

/// Forgets a child this process has waited for.
pub fn waited(pid: Option<u32>) {
    if let (Some(set), Some(pid)) = (ours().as_mut(), pid.and_then(|p| i32::try_from(p).ok())) {
        set.remove(&pid);
    }
}

/// As PID 1, reaps orphans for as long as the runtime lives; otherwise does nothing (the
/// init process reaps them).
pub fn start_if_init() {
    if getpid().as_raw() != 1 {
        return;
    }
    tracing::info!("running as PID 1: reaping orphaned processes");
    tokio::spawn(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut chld = signal(SignalKind::child()).ok();
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = async {
                    match chld.as_mut() {
                        Some(s) => { s.recv().await; }
                        None => std::future::pending().await,
                    }
                } => {}
                _ = tick.tick() => {}
            }
            reap_orphans();
        }
    });
}

/// Waits for every zombie child that is not one of ours.
fn reap_orphans() {
    let me = getpid().as_raw();
    let ours = ours();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if ours.as_ref().is_some_and(|s| s.contains(&pid)) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command name (which may hold spaces or parentheses): state ppid …
        let mut fields = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace();
        let state = fields.next();
        let ppid = fields.next().and_then(|f| f.parse::<i32>().ok());
        if state == Some("Z") && ppid == Some(me) {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}
