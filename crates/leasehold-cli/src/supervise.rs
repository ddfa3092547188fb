//! `leasehold supervise -- COMMAND…` (hidden): the small process `leasehold run` starts its
//! command under. Why it exists is in src/child.rs; here is what it does.
//!
//! It is started as the leader of a new process group, with its stdin one end of a socket pair
//! whose other end only the `leasehold run` process holds. It starts COMMAND in its own group
//! (so everything COMMAND starts is in that group too), then:
//! - when COMMAND exits, it writes `exit N` or `signal N` to the socket and waits;
//! - when the socket reaches end of file, because `leasehold run` is done with the group or has
//!   died (`kill -9`, the OOM killer: the kernel closes a dead process's descriptors), it sends
//!   SIGKILL to its whole group, itself included.
//!
//! SIGTERM, SIGINT and SIGHUP sent to the group are meant for COMMAND: the supervisor catches
//! them and carries on, so the group keeps its anchor until SIGKILL. (Caught signals are reset to
//! their defaults by exec, so COMMAND does not inherit this.)

use std::os::fd::AsFd;
use std::process::{ExitCode, Stdio};

use clap::Args;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{getpgrp, getpid};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

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
        return ExitCode::from(crate::EXIT_USAGE);
    }
    let runtime = match crate::start_runtime(&mut tokio::runtime::Builder::new_current_thread()) {
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

/// Completes when `leasehold run` closes its end or dies (or the link fails).
async fn parent_gone(link: &mut UnixStream) {
    let mut buf = [0u8; 64];
    // `leasehold run` never writes; any read that is not data means it is gone.
    while let Ok(n) = link.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

async fn supervise(argv: Vec<String>) {
    // First, so a SIGTERM for the command that arrives early does not end the anchor.
    let _handlers = [
        tokio::signal::unix::SignalKind::terminate(),
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::hangup(),
    ]
    .map(tokio::signal::unix::signal);
    let Ok(mut link) = parent_link() else {
        logging::error_line("supervise is internal to leasehold run (no link on stdin)");
        kill_group();
        return;
    };
    let (program, rest) = match argv.split_first() {
        Some(split) => split,
        None => {
            kill_group();
            return;
        }
    };
    let child = tokio::process::Command::new(program)
        .args(rest)
        .stdin(Stdio::null())
        .spawn();
    match child {
        Err(e) => {
            let _ = link
                .write_all(format!("error cannot start {program:?}: {e}\n").as_bytes())
                .await;
            parent_gone(&mut link).await;
        }
        Ok(mut child) => {
            tokio::select! {
                status = child.wait() => {
                    let report = match status {
                        Ok(status) => describe(status),
                        Err(e) => format!("error cannot wait for the command: {e}"),
                    };
                    let _ = link.write_all(format!("{report}\n").as_bytes()).await;
                    parent_gone(&mut link).await;
                }
                () = parent_gone(&mut link) => {}
            }
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
