//! Running the user's command so that it is always stopped in time and never outlives its lease
//! or `leasehold` itself.
//!
//! # One owner
//! [`run`] owns the command's process group from start to end. Every way the command can be
//! told to stop (the lease starting to expire, shutdown, a cancelled scheduled run) goes through
//! one timer here: SIGTERM to the whole group at once, SIGKILL to the whole group when the timer
//! runs out, whichever request came first or asked for the earlier kill. If the future is dropped
//! instead (the scheduler aborting a job, the runtime shutting down), the group gets SIGKILL at
//! once. When the command exits by itself, whatever it left running in its group is killed
//! too: nothing runs on after the lease is released.
//!
//! # Dying with `leasehold`
//! The command runs under `leasehold supervise` (src/supervise.rs), a second copy of this binary
//! that leads the command's process group and holds one end of a socket pair whose other end only
//! this process holds. If `leasehold` dies for any reason, SIGKILL and the OOM killer included,
//! the kernel closes its end, and the supervisor kills the whole group.
//!
//! The other way, `PR_SET_PDEATHSIG` on the child, is not used because it is not correct here:
//! - it reaches only the direct child: with `sh -c "…; sleep 30"` the shell dies and `sleep` (and
//!   anything else the command started) runs on, orphaned, beside the next holder's command;
//! - it fires when the *thread* that forked the child exits, not the process: tokio spawns from
//!   whichever worker or blocking-pool thread polls the future, and blocking-pool threads exit
//!   after ten idle seconds, which would kill a healthy command;
//! - it needs `Command::pre_exec`, i.e. unsafe code (plus a getppid check for a parent that died
//!   before the prctl), in a workspace that forbids it.
//!
//! The supervisor needs no unsafe code, covers grandchildren, does not depend on threads, and,
//! being the group leader until the group is killed, keeps the group id from being reused while
//! anyone might still signal it. It costs one extra small process per run.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use leasehold::CancellationToken;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep_until};

/// The command to run and what it is told about its lease.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment (`LEASEHOLD_*`).
    pub env: Vec<(String, String)>,
}

/// What tells the command to stop, and how long it then has.
pub struct Stops<'a> {
    /// The grace period (also the lease's stop margin): the command has this long after SIGTERM
    /// to exit before SIGKILL, less the kill margin.
    pub grace: Duration,
    /// The lease's `expiring` token and a reader of its local deadline. When the token fires the
    /// command gets SIGTERM, and SIGKILL [`kill_margin`] before the deadline read then (at most
    /// `grace − kill margin` after SIGTERM), so it is gone before the store can grant the lease
    /// to anyone else.
    pub lease: Option<(CancellationToken, &'a (dyn Fn() -> Instant + Sync))>,
    /// A requested stop (shutdown, a cancelled scheduled run): SIGTERM when it fires, SIGKILL
    /// `grace − kill margin` later.
    pub requested: Option<CancellationToken>,
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The shell convention: the exit code, or 128 + the signal that ended it.
    pub code: i32,
    /// Whether it died of a signal this process sent it (SIGTERM or SIGKILL on a stop).
    pub stopped_by_us: bool,
}

/// How long before the lease's deadline the command's group gets SIGKILL: a quarter of the grace
/// period, at most 500 ms.
///
/// SIGKILL does not take effect at the instant it is sent: the timer that sends it may run late
/// on a loaded host, and the kernel still has to tear the group's processes down (unmapping a
/// large process's memory takes from milliseconds to a few hundred). The margin covers both,
/// while three quarters of the grace period stay with the command to exit cleanly after SIGTERM;
/// teardown does not take longer for a longer grace, hence the cap. (The store's own expiry lies
/// a drift margin beyond the local deadline besides.)
pub fn kill_margin(grace: Duration) -> Duration {
    (grace / 4).min(Duration::from_millis(500))
}

/// The program to start the supervisor with: this binary.
fn supervisor_program() -> PathBuf {
    // /proc/self/exe names this very binary even after a deploy replaced or deleted its file.
    let proc_exe = std::path::Path::new("/proc/self/exe");
    if proc_exe.exists() {
        return proc_exe.to_path_buf();
    }
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("leasehold"))
}

/// The command's process group, led by its supervisor. Dropped before it has been reaped, it
/// kills the group.
struct Group {
    supervisor: Child,
    pgid: Pid,
    link: BufReader<UnixStream>,
    reaped: bool,
}

impl Group {
    fn spawn(spec: &ChildSpec) -> Result<Self> {
        if spec.argv.is_empty() {
            return Err(anyhow!("no command given"));
        }
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().context("cannot create the supervisor link")?;
        // Both ends are close-on-exec: only the supervisor (as its stdin) and this process hold
        // them, so end of file on the supervisor's side means this process is done or dead.
        let mut cmd = Command::new(supervisor_program());
        cmd.arg("supervise")
            .arg("--")
            .args(&spec.argv)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .process_group(0)
            .kill_on_drop(true);
        let supervisor = cmd
            .spawn()
            .context("cannot start the command's supervisor")?;
        // Closes our copy of the supervisor's end.
        drop(cmd);
        let pgid = supervisor
            .id()
            .map(|id| Pid::from_raw(id as i32))
            .context("the supervisor vanished at start")?;
        ours.set_nonblocking(true)?;
        let link = BufReader::new(UnixStream::from_std(ours)?);
        Ok(Self {
            supervisor,
            pgid,
            link,
            reaped: false,
        })
    }

    /// Waits for the command to exit (or the supervisor to die), then kills what is left of the
    /// group, reaps the supervisor and waits (up to 2 s) until no process of the group is left.
    async fn finish(&mut self) -> Result<Report> {
        let mut line = String::new();
        let _ = self.link.read_line(&mut line).await;
        // The supervisor is not reaped yet, so the group id cannot have been reused.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let supervisor = self.supervisor.wait().await;
        self.reaped = true;
        let until = Instant::now() + Duration::from_secs(2);
        while group_has_live_members(self.pgid) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let line = line.trim_end();
        let number = |s: &str| s.parse::<i32>().ok();
        if let Some(code) = line.strip_prefix("exit ").and_then(number) {
            return Ok(Report::Exit(code));
        }
        if let Some(signal) = line.strip_prefix("signal ").and_then(number) {
            return Ok(Report::Signal(signal));
        }
        if let Some(error) = line.strip_prefix("error ") {
            return Err(anyhow!("{error}"));
        }
        // No report: the supervisor died first (our SIGKILL, or someone else's).
        use std::os::unix::process::ExitStatusExt;
        let status = supervisor.context("cannot wait for the command's supervisor")?;
        match (status.signal(), status.code()) {
            (Some(signal), _) => Ok(Report::Signal(signal)),
            (None, Some(code)) => Err(anyhow!(
                "the command's supervisor exited with status {code} without a report"
            )),
            (None, None) => Err(anyhow!("the command's supervisor vanished")),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.reaped {
            // Dropped mid-run (an aborted job, runtime shutdown): nothing may run on unowned.
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}

/// Whether a process of group `pgid` is still running. Zombies do not count: a killed process
/// stays one until whoever adopted it reaps it, which may be late (a container's pid 1 that
/// does not reap), and a zombie runs nothing. Reads /proc; without it, asks the kernel.
fn group_has_live_members(pgid: Pid) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return killpg(pgid, None).is_ok();
    };
    entries.flatten().any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // After the command name (which may hold spaces or parentheses): state ppid pgrp …
        let mut fields = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace();
        let state = fields.next().unwrap_or("Z");
        let pgrp = fields.nth(1).and_then(|f| f.parse::<i32>().ok());
        pgrp == Some(pgid.as_raw()) && state != "Z" && state != "X"
    })
}

enum Report {
    Exit(i32),
    Signal(i32),
}

async fn fired(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Runs the command in a process group of its own until it exits, stopping it as `stops` say.
pub async fn run(spec: &ChildSpec, stops: Stops<'_>) -> Result<Ended> {
    let margin = kill_margin(stops.grace);
    let term_to_kill = stops.grace - margin;
    let mut group = Group::spawn(spec)?;
    let pgid = group.pgid;
    let (lease_token, deadline) = stops.lease.unzip();
    let mut lease_pending = lease_token.is_some();
    let mut requested_pending = stops.requested.is_some();
    let mut kill_at: Option<Instant> = None;
    let (mut term_sent, mut kill_sent) = (false, false);
    let report = {
        let finished = group.finish();
        tokio::pin!(finished);
        loop {
            let kill_timer = async {
                match kill_at {
                    Some(at) if !kill_sent => sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            // Each branch signals first and logs after: a log write must never delay a stop.
            let (why, by) = tokio::select! {
                biased;
                report = &mut finished => break report?,
                () = kill_timer => {
                    let _ = killpg(pgid, Signal::SIGKILL);
                    kill_sent = true;
                    tracing::warn!("the command did not exit in time: SIGKILL to its process group");
                    continue;
                }
                () = fired(lease_token.as_ref()), if lease_pending => {
                    lease_pending = false;
                    let now = Instant::now();
                    let deadline = deadline.map_or(now, |d| d());
                    let by = deadline.checked_sub(margin).unwrap_or(now).min(now + term_to_kill);
                    ("the lease is expiring", by)
                }
                () = fired(stops.requested.as_ref()), if requested_pending => {
                    requested_pending = false;
                    ("stop requested", Instant::now() + term_to_kill)
                }
            };
            let by = kill_at.map_or(by, |k| k.min(by));
            kill_at = Some(by);
            if !std::mem::replace(&mut term_sent, true) {
                let _ = killpg(pgid, Signal::SIGTERM);
            }
            let left = by.saturating_duration_since(Instant::now());
            tracing::warn!(
                why,
                "stopping the command: SIGTERM to its process group, SIGKILL in {left:.1?} if it is still running"
            );
        }
    };
    let (code, signal) = match report {
        Report::Exit(code) => (code, None),
        Report::Signal(signal) => (128 + signal, Some(signal)),
    };
    let stopped_by_us = match signal {
        Some(s) if s == Signal::SIGTERM as i32 => term_sent,
        Some(s) if s == Signal::SIGKILL as i32 => kill_sent,
        _ => false,
    };
    Ok(Ended {
        code,
        stopped_by_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_margin_is_a_quarter_of_the_grace_up_to_half_a_second() {
        assert_eq!(
            kill_margin(Duration::from_millis(200)),
            Duration::from_millis(50)
        );
        assert_eq!(
            kill_margin(Duration::from_secs(3)),
            Duration::from_millis(500)
        );
        assert_eq!(kill_margin(Duration::ZERO), Duration::ZERO);
    }
}
