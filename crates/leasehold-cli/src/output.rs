//! Standard output for the commands that print results.
//!
//! Rust ignores SIGPIPE, so when the reader goes away (`leasehold history … | head -1`) a write
//! fails with EPIPE, and `println!` panics. Here that failure is [`StdoutClosed`], which ends
//! the command quietly with status 0, as a tool that SIGPIPE ends says nothing either; the
//! demo stops its instances first. Any other write error is an error like any other.

use std::fmt;
use std::io::{self, Write};

/// The reader of standard output has gone.
#[derive(Debug)]
pub struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("standard output is closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes one line to stdout.
pub fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(|e| match e.kind() {
            io::ErrorKind::BrokenPipe => anyhow::Error::new(StdoutClosed),
            _ => anyhow::Error::new(e).context("cannot write to standard output"),
        })
}

/// `println!` that returns an error instead of panicking; see [`line()`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;
