#![doc = include_str!("../README.md")]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod fence;
pub mod ledger;
pub mod procs;
mod witness;

use std::path::PathBuf;
use std::time::Duration;

pub use fence::FenceDecision;
pub use ledger::{Fenced, LedgerEntry};
pub use witness::{WitnessError, run};

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
