//! The fenced resource: a file holding the highest fencing token written so far, guarded by an
//! exclusive `flock`. A write with a lower token is refused.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

/// The fence's answer to a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceDecision {
    /// The token is at least the highest one seen: the write lands and the token is recorded.
    Accepted,
    /// The token is below the highest one seen: a stale holder; nothing is written.
    Rejected {
        /// The highest token seen.
        max: u64,
    },
}

/// The fence rule: accept `token` unless a higher one was written before.
pub fn decide(max: Option<u64>, token: u64) -> FenceDecision {
    match max {
        Some(max) if token < max => FenceDecision::Rejected { max },
        _ => FenceDecision::Accepted,
    }
}

fn lock(path: &Path) -> io::Result<Flock<File>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| io::Error::from(errno))
}

fn read_max(file: &mut File) -> io::Result<Option<u64>> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_string(&mut text)?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("fence file holds {text:?}, not a token"),
        )
    })
}

/// The highest token written so far, read without taking the lock: for an observer that must
/// never wait on a writer (one that may be SIGSTOPped while it holds the lock). `None` before the
/// first write and while a write is half done (the file is emptied and rewritten under the lock);
/// a half-written token is a prefix of the new one, so it reads as a lower token, never a higher.
pub fn peek(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A fenced write of `token` to the fence at `path`. `then` runs while the lock is still held,
/// with the decision and the highest token seen before it (the ledger line is appended there, so
/// the ledger's order is the order of the decisions).
pub fn write<T>(
    path: &Path,
    token: u64,
    then: impl FnOnce(FenceDecision, Option<u64>) -> io::Result<T>,
) -> io::Result<T> {
    let mut guard = lock(path)?;
    let max = read_max(&mut guard)?;
    let decision = decide(max, token);
    if decision == FenceDecision::Accepted {
        guard.set_len(0)?;
        guard.seek(SeekFrom::Start(0))?;
        guard.write_all(format!("{token}\n").as_bytes())?;
        guard.sync_data()?;
    }
    then(decision, max)
    // The lock is released when `guard` drops.
}

/// Runs `f` while holding the fence lock without writing (aborted runs log under the lock too).
pub fn with_lock<T>(path: &Path, f: impl FnOnce(Option<u64>) -> io::Result<T>) -> io::Result<T> {
    let mut guard = lock(path)?;
    let max = read_max(&mut guard)?;
    f(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_tokens_are_rejected_equal_and_greater_accepted() {
        assert_eq!(decide(None, 0), FenceDecision::Accepted);
        assert_eq!(decide(Some(5), 4), FenceDecision::Rejected { max: 5 });
        assert_eq!(decide(Some(5), 5), FenceDecision::Accepted);
        assert_eq!(decide(Some(5), 6), FenceDecision::Accepted);
    }

    #[test]
    fn the_file_keeps_the_highest_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence");
        assert_eq!(peek(&path), None);
        let w = |t| write(&path, t, |d, max| Ok((d, max))).unwrap();
        assert_eq!(w(3), (FenceDecision::Accepted, None));
        assert_eq!(w(7), (FenceDecision::Accepted, Some(3)));
        assert_eq!(w(7), (FenceDecision::Accepted, Some(7)));
        assert_eq!(w(6), (FenceDecision::Rejected { max: 7 }, Some(7)));
        assert_eq!(peek(&path), Some(7));
        assert_eq!(w(100), (FenceDecision::Accepted, Some(7)));
        assert_eq!(peek(&path), Some(100));
    }

    /// An observer reads the fence while a writer holds the lock (as a SIGSTOPped witness would
    /// in the middle of its write) instead of waiting for it.
    #[test]
    fn peek_does_not_wait_for_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence");
        assert_eq!(peek(&path), None);
        write(&path, 9, |_, _| Ok(())).unwrap();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                with_lock(&path, |_| {
                    held_tx.send(()).unwrap();
                    // Hold the lock until the observer has read.
                    done_rx.recv().unwrap();
                    Ok(())
                })
                .unwrap();
            })
        };
        held_rx.recv().unwrap();
        assert_eq!(peek(&path), Some(9));
        done_tx.send(()).unwrap();
        writer.join().unwrap();
    }

    #[test]
    fn concurrent_writers_never_lower_the_fence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence");
        let threads: Vec<_> = (0..8u64)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for k in 0..25u64 {
                        let token = k * 8 + i;
                        write(&path, token, |d, max| {
                            if let Some(max) = max {
                                assert_eq!(d == FenceDecision::Accepted, token >= max);
                            }
                            Ok(())
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(peek(&path), Some(24 * 8 + 7));
    }
}
