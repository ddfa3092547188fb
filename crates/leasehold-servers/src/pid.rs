//! A process by its pid: signalled, and its state read from `/proc`. Below the server
//! directories (which kill what a dead owner left) and the processes they start.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Sends `sig` to process `pid`; false if it is gone.
pub(crate) fn signal(pid: u32, sig: Signal) -> bool {
    i32::try_from(pid).is_ok_and(|raw| kill(Pid::from_raw(raw), sig).is_ok())
}

/// Whether a process is a zombie or gone (its state in `/proc/PID/stat`).
#[cfg(test)]
pub(crate) fn finished(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, None | Some("Z" | "X"))
}

/// A process's start time (clock ticks after boot, field 22 of `/proc/PID/stat`).
pub(crate) fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state …": comm may hold spaces, so count from after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19).map(str::to_owned)
}
