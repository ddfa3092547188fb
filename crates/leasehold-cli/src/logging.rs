//! Writing to stderr in a way that can never take the process down or hold it up.
//!
//! `leasehold run … 2>&1 | logger` whose reader exits leaves stderr a pipe with no reader: every
//! write fails with EPIPE (Rust ignores SIGPIPE). `eprintln!` panics then, and so does
//! tracing-subscriber's report of its own write errors, inside whichever task logged: once that
//! was the lease renewer or the signal handler, a lost lease went unnoticed and SIGTERM was
//! ignored. A reader that lives but never reads (`… 2>&1 | (sleep 1000)`, a stuck log shipper)
//! is worse: once the pipe is full every write blocks, and whichever thread logged (a runtime
//! worker, the main thread with the last error) stops with it; the process neither renewed,
//! stopped its command nor exited.
//!
//! So no thread that matters writes to stderr: lines go to a bounded queue that one thread of
//! its own writes out, a line that finds the queue full is dropped, and at exit [`drain`] waits a
//! moment for the queue and then lets the process end regardless. Losing log lines is
//! acceptable; losing the loss signal, or the exit, is not.
//!
//! Every line is one line: newlines inside a message (a server's multi-line error) become
//! spaces, so each error is one line on stderr. (Log lines are tracing-subscriber's, which
//! escapes ESC in what it formats.)

use std::io::{self, Write};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::time::{Duration, Instant};

/// Lines waiting for a slow stderr before new ones are dropped.
const QUEUE_LINES: usize = 1024;

/// The queue to the writer thread (`None` if it could not be started), and how many lines are
/// queued or being written.
static QUEUE: OnceLock<Option<SyncSender<Vec<u8>>>> = OnceLock::new();
static PENDING: AtomicUsize = AtomicUsize::new(0);

fn queue() -> Option<&'static SyncSender<Vec<u8>>> {
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE_LINES);
            std::thread::Builder::new()
                .name("stderr".into())
                .spawn(move || {
                    for line in rx {
                        let _ = io::stderr().write_all(&line);
                        PENDING.fetch_sub(1, Ordering::SeqCst);
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// `text` as one line: inner newlines become spaces, and it ends with exactly one newline.
fn one_line(text: &[u8]) -> Vec<u8> {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    let mut line: Vec<u8> = body
        .iter()
        .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b })
        .collect();
    line.push(b'\n');
    line
}

/// Queues one line for stderr, or drops it if the queue is full.
fn send(text: &[u8]) {
    let line = one_line(text);
    match queue() {
        Some(tx) => {
            PENDING.fetch_add(1, Ordering::SeqCst);
            if tx.try_send(line).is_err() {
                PENDING.fetch_sub(1, Ordering::SeqCst);
            }
        }
        // No thread could be started: write here, as before.
        None => {
            let _ = io::stderr().write_all(&line);
        }
    }
}

/// Waits until every queued line is written, or `limit` has passed: what stderr does not take
/// by then is lost with the process.
pub fn drain(limit: Duration) {
    let until = Instant::now() + limit;
    while PENDING.load(Ordering::SeqCst) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A [`tracing_subscriber::fmt::MakeWriter`] for stderr that never fails and never blocks: each
/// event (tracing-subscriber writes one in a single call) is queued as one line, or dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        send(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LossyStderr {
    type Writer = LossyStderr;

    fn make_writer(&'a self) -> Self::Writer {
        LossyStderr
    }
}

/// Writes `leasehold: error: MESSAGE` as one line to stderr, or nothing if stderr is gone. A
/// message may quote text from the store or a server: its line breaks become spaces, and its
/// other control and bidi characters are written visibly (`\x1b`, `\u{202e}`).
pub fn error_line(message: &str) {
    let message = message.replace(['\r', '\n'], " ");
    line(&format!(
        "leasehold: error: {}",
        leasehold::text::visible(&message)
    ));
}

/// Writes one line to stderr, or nothing if stderr is gone.
pub fn line(text: &str) {
    send(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_is_one_line() {
        assert_eq!(one_line(b"a"), b"a\n");
        assert_eq!(one_line(b"a\n"), b"a\n");
        assert_eq!(
            one_line(b"NOAUTH\nAuthentication required.\r\n"),
            b"NOAUTH Authentication required.\n"
        );
    }
}
