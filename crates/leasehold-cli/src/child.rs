//! Running the user's command so that it is always stopped in time and never outlives its lease
//! or `leasehold` itself.
//!
//! # One owner
//! [`run`] owns the command's process group from start to end. Every way the command can be
//! told to stop (the lease starting to expire, shutdown, a cancelled scheduled run) ends in one
//! pair of instants: SIGTERM to the whole group, once, and SIGKILL to the whole group, whichever
//! request came first or asked for the earlier kill. If the future is dropped instead (the
//! scheduler aborting a job, the runtime shutting down), the group gets SIGKILL at once. When
//! the command exits by itself, whatever it left running in its group is killed too: nothing
//! runs on after the lease is released.
//!
//! # The supervisor
//! The command runs under `leasehold supervise` (src/supervise.rs), a second copy of this binary
//! that leads the command's process group and holds one end of a socket pair whose other end only
//! this process holds. Over it this process hands the supervisor those two instants (src/link.rs):
//! from the lease's confirmed local deadline at the start and after every renewal (SIGTERM a
//! grace period before it, SIGKILL a [`kill_margin`] before it), and brought forward at once by
//! a stop. The supervisor sends SIGTERM and SIGKILL at those instants by its own clock, so the
//! command is stopped in time even when this process cannot act: frozen (SIGSTOP, a debugger,
//! a cgroup freeze of this process alone) or busy. This process keeps a SIGKILL timer of its own
//! for a stop it asked for, for the case where the supervisor is the one frozen.
//!
//! If `leasehold` dies for any reason, SIGKILL and the OOM killer included, the kernel closes its
//! end of the socket, and the supervisor kills the whole group at once.
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
//! # Output
//! With [`ChildSpec::output`] the group's stdout and stderr are pipes this process reads at once
//! and copies to its own (so the command never waits on a full pipe while this process runs),
//! keeping their end for the run's record (src/tail.rs). Without it they are this process's own.
//!
//! The supervisor needs no unsafe code, covers grandchildren, does not depend on threads, and,
//! being the group leader until the group is killed, keeps the group id from being reused while
//! anyone might still signal it. It costs one extra small process per run.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use leasehold::CancellationToken;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, Lines,
};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::link::Orders;
use crate::tail::{Redactor, Tail};

/// The command to run and what it is told about its lease.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment (`LEASEHOLD_*`).
    pub env: Vec<(String, String)>,
    /// Keep the end of what the command prints ([`Ended::output`]).
    pub output: Option<OutputTail>,
}

/// How much of a command's output to keep, and what to take out of it.
#[derive(Debug, Clone)]
pub struct OutputTail {
    /// Bytes kept (the last ones), more than 0.
    pub keep: usize,
    /// The passwords to take out.
    pub redact: Arc<Redactor>,
}

/// What tells the command to stop, and how long it then has.
pub struct Stops {
    /// The grace period (also the lease's stop margin): the command has this long after SIGTERM
    /// to exit before SIGKILL, less the kill margin.
    pub grace: Duration,
    /// The lease's confirmed local deadline and its renewals. The supervisor sends the group
    /// SIGTERM a grace period before the latest deadline it was handed and SIGKILL
    /// [`kill_margin`] before it, by its own clock, unless a fresher one comes first.
    pub deadline: Option<watch::Receiver<Instant>>,
    /// The lease's `expiring` signal: SIGTERM when it fires, SIGKILL [`kill_margin`] before the
    /// deadline (at most `grace − kill margin` after SIGTERM), so the command is gone before the
    /// store can grant the lease to anyone else.
    pub expiring: Option<CancellationToken>,
    /// A requested stop (shutdown, a cancelled scheduled run): SIGTERM when it fires, SIGKILL
    /// `grace − kill margin` later.
    pub requested: Option<CancellationToken>,
}

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The shell convention: the exit code, or 128 + the signal that ended it.
    pub code: i32,
    /// Whether it died of a signal sent to stop it (SIGTERM or SIGKILL, by this process's
    /// request or the supervisor's deadline).
    pub stopped_by_us: bool,
    /// Whether the lease ran out while the command ran: the `expiring` signal fired, or the
    /// supervisor had to stop the command by the lease's deadline without being asked (this
    /// process was frozen or too slow to renew). Whatever the command then returned, its run
    /// was cut short.
    pub lease_ended: bool,
    /// With [`ChildSpec::output`]: the end of its stdout and stderr, redacted; `None` when it
    /// printed nothing.
    pub output: Option<String>,
}

/// How long before the lease's deadline the command's group gets SIGKILL: a quarter of the grace
/// period, at most 500 ms.
///
/// SIGKILL does not take effect at the instant it is sent: the timer that sends it may run late
/// on a loaded host, and the kernel still has to tear the group's processes down (unmapping a
/// large process's memory takes from milliseconds to a few hundred). The margin covers both,
/// while three quarters of the grace period stay with the command to exit cleanly after SIGTERM;
/// teardown does not take longer for a longer grace, hence the cap. The store's own expiry lies
/// a drift margin beyond the local deadline besides: the deadline is measured from when the
/// acquire or renewal was sent, less the drift margin, so even with the client's clock running
/// fast by that much the store cannot grant the lease before it.
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
    reports: Lines<BufReader<OwnedReadHalf>>,
    reaped: bool,
    tee: Option<Tee>,
}

/// The copies of the group's stdout and stderr to this process's, and the tail they keep.
struct Tee {
    tail: Arc<Mutex<Tail>>,
    redact: Arc<Redactor>,
    copies: Vec<tokio::task::JoinHandle<()>>,
}

/// How long, once the group is gone, the copies may take to reach the end of its output. Only a
/// process that left the group (a daemon's `setsid`) can hold the pipes open longer: its output
/// is still copied after, but not kept.
const OUTPUT_END: Duration = Duration::from_millis(100);

impl Tee {
    /// The kept tail, once both copies reached the end of their pipe (or [`OUTPUT_END`] passed).
    async fn finish(mut self) -> Option<String> {
        let _ = tokio::time::timeout(OUTPUT_END, async {
            for copy in &mut self.copies {
                let _ = copy.await;
            }
        })
        .await;
        let tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.text(&self.redact)
    }
}

/// Copies `from` to `to` as it is read, keeping each read in `tail`. Reads on when `to` fails
/// (this process's stdout closed), so the command never blocks on a full pipe.
async fn copy_keeping(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    tail: Arc<Mutex<Tail>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut writable = true;
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        let read = &buf[..n];
        tail.lock().unwrap_or_else(|p| p.into_inner()).push(read);
        if writable {
            writable = to.write_all(read).await.is_ok() && to.flush().await.is_ok();
        }
    }
}

/// What the supervisor said: the signals it sent by its orders, and how the command ended.
struct Report {
    end: End,
    term: bool,
    kill: bool,
}

enum End {
    Exit(i32),
    Signal(i32),
}

impl Group {
    /// Starts the supervisor with `orders` already waiting on its link (so they hold from its
    /// first instant), and a task that hands it every change of them.
    fn spawn(spec: &ChildSpec, mut orders: watch::Receiver<Orders>) -> Result<Self> {
        use std::io::Write;
        if spec.argv.is_empty() {
            return Err(anyhow!("no command given"));
        }
        let (mut ours, theirs) =
            std::os::unix::net::UnixStream::pair().context("cannot create the supervisor link")?;
        if let Some(line) = orders.borrow_and_update().line() {
            // An empty socket buffer takes a line at once.
            ours.write_all(line.as_bytes())
                .context("cannot write to the supervisor link")?;
        }
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
        if spec.output.is_some() {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        // Noted as ours under the reaper's lock, so a PID 1 reaper never takes it.
        let mut supervisor = {
            let mut ours = crate::reaper::ours();
            let supervisor = cmd
                .spawn()
                .context("cannot start the command's supervisor")?;
            if let Some(pid) = supervisor.id() {
                crate::reaper::started(&mut ours, pid);
            }
            supervisor
        };
        // Closes our copy of the supervisor's end.
        drop(cmd);
        let tee = spec.output.as_ref().map(|output| {
            let tail = Arc::new(Mutex::new(Tail::new(output.keep)));
            let mut copies = Vec::with_capacity(2);
            if let Some(out) = supervisor.stdout.take() {
                copies.push(tokio::spawn(copy_keeping(
                    out,
                    tokio::io::stdout(),
                    tail.clone(),
                )));
            }
            if let Some(err) = supervisor.stderr.take() {
                copies.push(tokio::spawn(copy_keeping(
                    err,
                    tokio::io::stderr(),
                    tail.clone(),
                )));
            }
            Tee {
                tail,
                redact: output.redact.clone(),
                copies,
            }
        });
        let pgid = supervisor
            .id()
            .map(|id| Pid::from_raw(id as i32))
            .context("the supervisor vanished at start")?;
        ours.set_nonblocking(true)?;
        let (reports, orders_link) = UnixStream::from_std(ours)?.into_split();
        tokio::spawn(hand_over(orders_link, orders));
        Ok(Self {
            supervisor,
            pgid,
            reports: BufReader::new(reports).lines(),
            reaped: false,
            tee,
        })
    }

    /// Waits for the command to exit (or the supervisor to die), then kills what is left of the
    /// group, reaps the supervisor and waits (up to 2 s) until no process of the group is left.
    async fn finish(&mut self) -> Result<Report> {
        let (mut term, mut kill, mut end) = (false, false, None);
        while let Ok(Some(line)) = self.reports.next_line().await {
            let number = |s: &str| s.parse::<i32>().ok();
            match line.as_str() {
                "term" => term = true,
                "kill" => kill = true,
                line => {
                    if let Some(code) = line.strip_prefix("exit ").and_then(number) {
                        end = Some(Ok(End::Exit(code)));
                    } else if let Some(signal) = line.strip_prefix("signal ").and_then(number) {
                        end = Some(Ok(End::Signal(signal)));
                    } else if let Some(error) = line.strip_prefix("error ") {
                        end = Some(Err(anyhow!("{error}")));
                    }
                    if end.is_some() {
                        break;
                    }
                }
            }
        }
        // The supervisor is not reaped yet, so the group id cannot have been reused.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let pid = self.supervisor.id();
        let supervisor = self.supervisor.wait().await;
        crate::reaper::waited(pid);
        self.reaped = true;
        let until = Instant::now() + Duration::from_secs(2);
        while group_has_live_members(self.pgid) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let end = match end {
            Some(end) => end?,
            // No report: the supervisor died first (a SIGKILL of the group, its own or ours, or
            // someone else's).
            None => {
                use std::os::unix::process::ExitStatusExt;
                let status = supervisor.context("cannot wait for the command's supervisor")?;
                match (status.signal(), status.code()) {
                    (Some(signal), _) => End::Signal(signal),
                    (None, Some(code)) => {
                        return Err(anyhow!(
                            "the command's supervisor exited with status {code} without a report"
                        ));
                    }
                    (None, None) => return Err(anyhow!("the command's supervisor vanished")),
                }
            }
        };
        Ok(Report { end, term, kill })
    }
}

/// Writes every change of the orders to the supervisor. Ends when the orders' sender is dropped
/// (the run is over) or the link breaks; dropping the link's write half then ends the
/// supervisor's input.
async fn hand_over(mut link: OwnedWriteHalf, mut orders: watch::Receiver<Orders>) {
    while orders.changed().await.is_ok() {
        let line = orders.borrow_and_update().line();
        if let Some(line) = line
            && link.write_all(line.as_bytes()).await.is_err()
        {
            return;
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

async fn fired(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

/// The next confirmed deadline; `None` once its guard is gone. Never completes without one.
async fn next_deadline(updates: &mut Option<watch::Receiver<Instant>>) -> Option<Instant> {
    match updates {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(*rx.borrow_and_update()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Runs the command in a process group of its own until it exits, stopping it as `stops` say.
pub async fn run(spec: &ChildSpec, stops: Stops) -> Result<Ended> {
    let Stops {
        grace,
        deadline: mut updates,
        expiring,
        requested,
    } = stops;
    let margin = kill_margin(grace);
    let term_to_kill = grace - margin;
    // An instant before the clock's start has passed: now.
    let before = |at: Instant, d: Duration| at.checked_sub(d).unwrap_or_else(Instant::now);
    let mut deadline = updates.as_mut().map(|rx| *rx.borrow_and_update());
    // A stop asked for here: when, and the SIGKILL it asked for.
    let mut stop: Option<(Instant, Instant)> = None;
    let orders_for = |deadline: Option<Instant>, stop: Option<(Instant, Instant)>| Orders {
        term: earliest(deadline.map(|d| before(d, grace)), stop.map(|s| s.0)),
        kill: earliest(deadline.map(|d| before(d, margin)), stop.map(|s| s.1)),
    };
    let (orders, orders_rx) = watch::channel(orders_for(deadline, stop));
    let mut group = Group::spawn(spec, orders_rx)?;
    let pgid = group.pgid;
    let mut expiring_pending = expiring.is_some();
    let mut requested_pending = requested.is_some();
    let mut lease_stop = false;
    let mut kill_sent = false;
    let report = {
        let finished = group.finish();
        tokio::pin!(finished);
        loop {
            // This process's own SIGKILL for a stop it asked for, should the supervisor be
            // frozen; otherwise the supervisor's comes at the same instant.
            let kill_timer = async {
                match stop {
                    Some((_, at)) if !kill_sent => sleep_until(at).await,
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
                () = fired(expiring.as_ref()), if expiring_pending => {
                    expiring_pending = false;
                    lease_stop = true;
                    let now = Instant::now();
                    let by = deadline.map_or(now, |d| before(d, margin)).min(now + term_to_kill);
                    ("the lease is expiring", by)
                }
                () = fired(requested.as_ref()), if requested_pending => {
                    requested_pending = false;
                    ("stop requested", Instant::now() + term_to_kill)
                }
                renewed = next_deadline(&mut updates) => {
                    match renewed {
                        Some(d) => deadline = Some(d),
                        None => updates = None,
                    }
                    orders.send_replace(orders_for(deadline, stop));
                    continue;
                }
            };
            let now = Instant::now();
            stop = Some(match stop {
                Some((asked, kill)) => (asked, kill.min(by)),
                None => (now, by),
            });
            orders.send_replace(orders_for(deadline, stop));
            let left = by.saturating_duration_since(now);
            tracing::warn!(
                why,
                "stopping the command: SIGTERM to its process group, SIGKILL in {left:.1?} if it is still running"
            );
        }
    };
    let asked = stop.is_some();
    // The supervisor signalled by the deadline alone: no renewal reached it in time.
    let by_deadline = (report.term || report.kill) && !asked;
    if by_deadline {
        tracing::warn!(
            "no renewal of the lease reached the command's supervisor in time: it stopped the command by the lease's deadline"
        );
    }
    let (code, signal) = match report.end {
        End::Exit(code) => (code, None),
        End::Signal(signal) => (128 + signal, Some(signal)),
    };
    let stopped_by_us = match signal {
        Some(s) if s == Signal::SIGTERM as i32 => asked || report.term,
        Some(s) if s == Signal::SIGKILL as i32 => asked || kill_sent || report.kill,
        _ => false,
    };
    let output = match group.tee.take() {
        Some(tee) => tee.finish().await,
        None => None,
    };
    Ok(Ended {
        code,
        stopped_by_us,
        lease_ended: lease_stop || by_deadline,
        output,
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
