//! Standard output for the commands that print results.
//!
//! What they print comes from the store, which anyone who can reach a door (or an older
//! release, or a hand-written row) may have written: every line goes out with the characters
//! `leasehold::text::is_hidden` names written visibly (`\x1b`, `\n`, `\u{202e}`), so no escape
//! sequence reaches the terminal and a newline in a field cannot forge a line of a table. JSON
//! goes out exact ([`json()`]).
//!
//! Rust ignores SIGPIPE, so when the reader goes away (`leasehold history … | head -1`) a write
//! fails with EPIPE, and `println!` panics. Here that failure is [`StdoutClosed`], which ends
//! the command quietly with status 0, as a tool that SIGPIPE ends says nothing either; the
//! demo stops its instances first. Any other write error is an error like any other.

use std::fmt::{self, Write as _};
use std::io::{self, Write};

use leasehold::text::{is_hidden, visible};

/// The reader of standard output has gone.
#[derive(Debug)]
pub struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("standard output is closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes one line to stdout, hidden characters escaped (see the module documentation).
pub fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    write_line(&visible(&args.to_string()))
}

/// Writes `value` as JSON on one line. Exact: parsed back, every string is what the store
/// holds. serde_json escapes the C0 controls; the other hidden characters (DEL, C1, the bidi
/// controls), which it leaves as they are, are written as `\uXXXX` escapes too (all lie below
/// U+10000), so the JSON is as safe on a terminal as the tables.
pub fn json(value: &serde_json::Value) -> anyhow::Result<()> {
    let text = value.to_string();
    if !text.chars().any(is_hidden) {
        return write_line(&text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match is_hidden(c) {
            true => {
                let _ = write!(escaped, "\\u{:04x}", u32::from(c));
            }
            false => escaped.push(c),
        }
    }
    write_line(&escaped)
}

fn write_line(text: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .map_err(stdout_error)
}

/// Writes `text` to stdout as it is: for text the program made itself (completion scripts,
/// manual pages), never for text from the store.
pub fn raw(text: &[u8]) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text)
        .and_then(|()| out.flush())
        .map_err(stdout_error)
}

fn stdout_error(e: io::Error) -> anyhow::Error {
    match e.kind() {
        io::ErrorKind::BrokenPipe => anyhow::Error::new(StdoutClosed),
        _ => anyhow::Error::new(e).context("cannot write to standard output"),
    }
}

/// `println!` that returns an error instead of panicking; see [`line()`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;
