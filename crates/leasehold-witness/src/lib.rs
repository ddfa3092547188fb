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

pub use fence::FenceDecision;
pub use ledger::{Fenced, LedgerEntry};
pub use witness::{WitnessArgs, WitnessError, run};
