//! Running the user's command as a child process that can be told to stop.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use leasehold::CancellationToken;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// The command to run and what it is told about its lease.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment (`LEASEHOLD_*`).
    pub env: Vec<(String, String)>,
}

/// Starts the child in its own process group, so a stop signal reaches everything it started
/// (a shell's children too).
fn spawn(spec: &ChildSpec) -> Result<Child> {
    let (program, args) = spec.argv.split_first().context("no command given")?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    cmd.spawn()
        .with_context(|| format!("cannot start {program:?}"))
}

fn signal_group(child: &Child, signal: Signal) {
    if let Some(pid) = child.id() {
        // The group may already be gone; nothing to do then.
        let _ = killpg(Pid::from_raw(pid as i32), signal);
    }
}

/// Runs the child until it exits. When `stop` fires, sends SIGTERM to its process group, then
/// SIGKILL after `grace`.
pub async fn run(spec: &ChildSpec, stop: CancellationToken, grace: Duration) -> Result<ExitStatus> {
    let mut child = spawn(spec)?;
    tokio::select! {
        status = child.wait() => return Ok(status?),
        () = stop.cancelled() => {}
    }
    tracing::warn!("stopping the command: SIGTERM, then SIGKILL after {grace:?}");
    signal_group(&child, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => Ok(status?),
        Err(_) => {
            signal_group(&child, Signal::SIGKILL);
            Ok(child.wait().await?)
        }
    }
}

/// The shell convention: the exit code, or 128 + the signal that ended the process.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
