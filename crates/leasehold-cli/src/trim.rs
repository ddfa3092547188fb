//! Handing the memory the process freed back to the system. glibc's allocator returns only the
//! top of a heap: the pages a burst of requests used and freed below a live allocation stay
//! resident, so a sidecar that served 100,000 names kept its peak for good after forgetting
//! them (docs/bench.md, "Bounded state"). `malloc_trim` releases every whole free page of every
//! arena. Other C libraries' allocators give memory back on their own; there this is nothing.

use std::time::Duration;

/// How often the sidecar hands freed memory back: often enough that a burst's memory goes back
/// soon after its names are given up, rarely enough that the walk over the arenas (which holds
/// each arena's lock for about a millisecond per 40 MB) never shows in request latency.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Trims every [`TRIM_EVERY`] for the life of the runtime, off the request threads.
pub fn spawn_periodic() {
    if !SUPPORTED {
        return;
    }
    tokio::spawn(async {
        let mut every = tokio::time::interval(TRIM_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            if tokio::task::spawn_blocking(release).await.is_err() {
                return;
            }
        }
    });
}

const SUPPORTED: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// Returns the free pages of the allocator's arenas to the system; whether any went back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn release() -> bool {
    // SAFETY: malloc_trim takes no pointers and touches only the allocator's own free lists,
    // under the same locks as every malloc and free: it may be called from any thread at any
    // time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Returns the free pages of the allocator's arenas to the system; whether any went back.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freed pages in the middle of the heap go back: after a thousand 64 KiB blocks are freed
    /// below one that stays, the resident set drops by most of them.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn freed_pages_below_a_live_block_go_back() {
        let rss = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
            line.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap()
                * 1024
        };
        // Below glibc's mmap threshold (128 KiB), so they come from the heap, each filled so
        // its pages are resident.
        let blocks: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8 | 1; 64 * 1024]).collect();
        let keep = vec![1u8; 1024];
        let before = rss();
        drop(blocks);
        release();
        let after = rss();
        assert!(keep[0] == 1);
        assert!(
            before.saturating_sub(after) > 32 * 1024 * 1024,
            "RSS {before} -> {after}: less than half of the 64 MB freed went back"
        );
    }
}
