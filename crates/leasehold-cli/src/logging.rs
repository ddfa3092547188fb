//! Writing to stderr in a way that can never take the process down.
//!
//! `leasehold run … 2>&1 | logger` whose reader exits leaves stderr a pipe with no reader: every
//! write fails with EPIPE (Rust ignores SIGPIPE). `eprintln!` panics then, and so does
//! tracing-subscriber's report of its own write errors, inside whichever task logged: once that
//! was the lease renewer or the signal handler, a lost lease went unnoticed and SIGTERM was
//! ignored. Here a line that cannot be written is dropped: losing log lines is acceptable,
//! losing the loss signal is not.

use std::io::{self, Write};

/// A [`tracing_subscriber::fmt::MakeWriter`] for stderr that never fails: a write that the
/// stream refuses is reported as done and the line is lost.
#[derive(Debug, Clone, Copy, Default)]
pub struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LossyStderr {
    type Writer = LossyStderr;

    fn make_writer(&'a self) -> Self::Writer {
        LossyStderr
    }
}

/// Writes `leasehold: error: MESSAGE` as one line to stderr, or nothing if stderr is gone.
pub fn error_line(message: &str) {
    line(&format!("leasehold: error: {message}"));
}

/// Writes one line to stderr, or nothing if stderr is gone.
pub fn line(text: &str) {
    // One write of the whole line, so lines from several threads do not interleave.
    let _ = io::stderr().write_all(format!("{text}\n").as_bytes());
}
