//! The clock leases are timed on: the host's boot-time clock, not the wall clock.
//!
//! Every process sharing a SQLite file runs on one host, so they can share a clock that a
//! wall-clock step (NTP, an operator's `date -s`, a VM resumed with a stale clock) does not move:
//! on the wall clock a step of +1 h expired every live lease at once while the holders' own
//! deadlines still ran, and a second holder got in. `CLOCK_BOOTTIME` only moves forward and
//! counts time the host spent suspended, so a lease also expires across a suspend. It restarts
//! at a reboot, which the boot id recorded in the file detects.

use leasehold::StoreError;
use nix::time::{ClockId, clock_gettime};

/// Milliseconds on the host's boot-time clock.
pub(crate) fn now_ms() -> Result<i64, StoreError> {
    let t = clock_gettime(ClockId::CLOCK_BOOTTIME)
        .map_err(|e| StoreError::unavailable("cannot read the host's boot-time clock", e))?;
    Ok(t.tv_sec() * 1000 + t.tv_nsec() / 1_000_000)
}

/// This boot of the host (`/proc/sys/kernel/random/boot_id`), or `None` where the kernel does
/// not say.
pub(crate) fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}
