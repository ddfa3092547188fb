//! `leasehold supervise -- COMMAND…` (hidden): the small process `leasehold run` starts its
//! command under. Why it exists is in src/child.rs; here is what it does.
//!
//! It is started as the leader of a new process group, with its stdin one end of a socket pair
//! whose other end only the `leasehold run` process holds. It starts COMMAND in its own group
//! (so everything COMMAND starts is in that group too), then, until the group is killed:
//! - it reads its orders from the socket (src/link.rs): when to send SIGTERM and SIGKILL to the
//!   group. `leasehold run` derives them from the lease's confirmed deadline and renews them with
//!   every renewal, or brings them forward to stop the command. The supervisor keeps to the last
//!   orders it read by its own clock, whatever becomes of `leasehold run`: frozen, it can
//!   neither renew the lease nor stop the command, and the lease runs out in the store, so the
//!   command must be gone by then all the same. It sends SIGTERM once, at the instant ordered,
//!   and at the SIGKILL instant kills the whole group, itself included, saying `term` and
//!   `kill` on the socket first;
//! - when COMMAND exits, it writes `exit N` or `signal N` to the socket and stays, keeping to its
//!   orders for whatever COMMAND left running;
//! - when the socket reaches end of file, because `leasehold run` is done with the group or has
//!   died (`kill -9`, the OOM killer: the kernel closes a dead process's descriptors), it sends
//!   SIGKILL to its whole group, itself included.
//!
//! A freeze of the supervisor itself (with or without its command) is left to `leasehold run`'s
//! own SIGKILL when it asked for a stop, and otherwise to fencing.
//!
//! SIGTERM, SIGINT and SIGHUP sent to the group are meant for COMMAND: the supervisor catches
//! them and carries on, so the group keeps its anchor until SIGKILL. (Caught signals are reset to
//! their defaults by exec, so COMMAND does not inherit this.)

use std::os::fd::AsFd;
use std::process::{ExitCode, Stdio};

use clap::Args;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{getpgrp, getpid};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::UnixStream;
use tokio::process::Child;
use tokio::time::Instant;

use crate::link::Orders;
use crate::logging;

#[derive(Args)]
pub struct SuperviseArgs {
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn main(args: SuperviseArgs) -> ExitCode {
    // Only ever the leader of a group of its own: killing "its group" must never reach anyone
    // else's processes (someone typing `leasehold supervise` in a shell, say).
    if getpgrp() != getpid() {
        logging::error_line("supervise is internal to leasehold run");
        return crate::failure::exit(crate::failure::EXIT_USAGE);
    }
    let runtime =
        match crate::failure::start_runtime(&mut tokio::runtime::Builder::new_current_thread()) {
            Ok(rt) => rt,
            Err(code) => return code,
        };
    runtime.block_on(supervise(args.command));
    // The group is being killed (us too); nothing else to do.
    ExitCode::from(1)
}

/// The link to `leasehold run`: our stdin, a Unix socket.
fn parent_link() -> std::io::Result<UnixStream> {
    let fd = std::io::stdin().as_fd().try_clone_to_owned()?;
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn exited(child: &mut Option<Child>) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(child) => child.wait().await,
        None => std::future::pending().await,
    }
}

/// Tells `leasehold run` one line. It never waits: the socket cannot be full of this process's
/// few short lines, and a stop must not wait for a frozen reader anyway.
fn tell(link: &mut Lines<BufReader<UnixStream>>, line: &str) {
    let _ = link
        .get_ref()
        .get_ref()
        .try_write(format!("{line}\n").as_bytes());
}

async fn supervise(argv: Vec<String>) {
    // First, so a SIGTERM for the command that arrives early does not end the anchor.
    let _handlers = [
        tokio::signal::unix::SignalKind::terminate(),
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::hangup(),
    ]
    .map(tokio::signal::unix::signal);
    let Ok(link) = parent_link() else {
        logging::error_line("supervise is internal to leasehold run (no link on stdin)");
        // The line is written by another thread: give it a moment before this process ends.
        logging::drain(std::time::Duration::from_millis(500));
        kill_group();
        return;
    };
    let mut link = BufReader::new(link).lines();
    let Some((program, rest)) = argv.split_first() else {
        kill_group();
        return;
    };
    let mut child = match tokio::process::Command::new(program)
        .args(rest)
        .stdin(Stdio::null())
        .spawn()
    {
        Ok(child) => Some(child),
        Err(e) => {
            tell(&mut link, &format!("error cannot start {program:?}: {e}"));
            None
        }
    };
    let mut orders = Orders::default();
    let mut term_sent = false;
    loop {
        tokio::select! {
            biased;
            () = sleep_until(orders.kill) => {
                tell(&mut link, "kill");
                break;
            }
            () = sleep_until(orders.term), if !term_sent => {
                let _ = killpg(getpgrp(), Signal::SIGTERM);
                term_sent = true;
                tell(&mut link, "term");
            }
            status = exited(&mut child) => {
                child = None;
                let report = match status {
                    Ok(status) => describe(status),
                    Err(e) => format!("error cannot wait for the command: {e}"),
                };
                tell(&mut link, &report);
            }
            line = link.next_line() => match line {
                Ok(Some(line)) => {
                    if let Some(newer) = Orders::parse(&line) {
                        orders = newer;
                    }
                }
                // End of file or a broken link: `leasehold run` is done or dead.
                Ok(None) | Err(_) => break,
            },
        }
    }
    kill_group();
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "exit 1".to_owned(),
    }
}

/// SIGKILL to our group: the command, whatever it left behind, and this process.
fn kill_group() {
    let _ = killpg(getpgrp(), Signal::SIGKILL);
}
