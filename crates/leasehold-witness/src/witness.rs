//! The witness: the command every replica runs. One fenced write, one ledger line.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

use crate::fence::{self, FenceDecision};
use crate::ledger::{self, Fenced, LedgerEntry};
use crate::procs::{self, epoch_ms};

fn duration_arg(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

/// `leasehold witness`: the command demo and chaos replicas run. Works for `--work`, then makes
/// a fenced write of `LEASEHOLD_TOKEN` to `--fence` and appends a line to `--ledger`. On SIGTERM
/// before its write it records the run as aborted and writes nothing.
#[derive(Debug, Clone, clap::Args)]
pub struct WitnessArgs {
    /// The ledger (JSON lines, appended under the fence lock).
    #[arg(long)]
    pub ledger: PathBuf,
    /// The fence file: the highest token written so far, guarded by an exclusive flock.
    #[arg(long)]
    pub fence: PathBuf,
    /// How long the work takes before the write.
    #[arg(long, default_value = "100ms", value_parser = duration_arg)]
    pub work: Duration,
    /// The chaos harness's pid: if it is gone, the witness stops its replica (SIGTERM to its
    /// parent) instead of working, so replicas do not outlive a harness that was killed.
    #[arg(long)]
    pub harness_pid: Option<u32>,
}

fn var(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// Why a witness could not record its run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WitnessError {
    /// It could not listen for SIGTERM.
    #[error("cannot handle SIGTERM")]
    Signal(#[source] io::Error),
    /// The fence or the ledger could not be written.
    #[error("cannot write {fence} or {ledger}")]
    Write {
        /// The fence file.
        fence: String,
        /// The ledger.
        ledger: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Runs one witness (the replicas' command). Returns its exit status: 0, also when it stopped
/// before its write (the ledger says so).
pub async fn run(args: WitnessArgs) -> Result<u8, WitnessError> {
    let start_ms = epoch_ms();
    if let Some(harness) = args.harness_pid
        && !procs::signal_exists(harness)
    {
        // Orphaned: the harness was killed. Stop the replica that started us (our parent is
        // its supervisor, which leaves SIGTERM to the command).
        let replica = var("LEASEHOLD_PID")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(std::os::unix::process::parent_id);
        procs::signal(replica, Signal::SIGTERM);
        return Ok(0);
    }
    let mut term = signal(SignalKind::terminate()).map_err(WitnessError::Signal)?;
    let mut entry = LedgerEntry {
        task: var("LEASEHOLD_LEASE").unwrap_or_default(),
        slot: var("LEASEHOLD_SLOT").and_then(|s| s.parse().ok()),
        token: var("LEASEHOLD_TOKEN").and_then(|s| s.parse().ok()),
        holder: var("LEASEHOLD_HOLDER").unwrap_or_default(),
        trigger: var("LEASEHOLD_TRIGGER").unwrap_or_default(),
        pid: std::process::id(),
        start_ms,
        end_ms: 0,
        fenced: Fenced::Aborted,
        fence_max: None,
    };
    let stopped = tokio::select! {
        () = tokio::time::sleep(args.work) => false,
        _ = term.recv() => true,
    };
    let append = |entry: &mut LedgerEntry, fenced: Fenced, max: Option<u64>| {
        entry.end_ms = epoch_ms();
        entry.fenced = fenced;
        entry.fence_max = max;
        ledger::append(&args.ledger, entry)
    };
    let written = match (stopped, entry.token) {
        (false, Some(token)) => fence::write(&args.fence, token, |decision, max| {
            let fenced = match decision {
                FenceDecision::Accepted => Fenced::Accepted,
                FenceDecision::Rejected { .. } => Fenced::Rejected,
            };
            append(&mut entry, fenced, max)
        }),
        // Stopped before the write, or no token to fence with: nothing is written.
        (true, _) => fence::with_lock(&args.fence, |max| append(&mut entry, Fenced::Aborted, max)),
        (false, None) => {
            fence::with_lock(&args.fence, |max| append(&mut entry, Fenced::Rejected, max))
        }
    };
    written.map_err(|source| WitnessError::Write {
        fence: args.fence.display().to_string(),
        ledger: args.ledger.display().to_string(),
        source,
    })?;
    Ok(0)
}
