//! What `leasehold run` and its command's supervisor (src/supervise.rs) tell each other over the
//! socket pair that ties them, one line per message.
//!
//! `leasehold run` → supervisor: `at TERM KILL`, when to send SIGTERM and SIGKILL to the
//! command's group, each an instant of CLOCK_MONOTONIC in nanoseconds, or `-` for none. Each
//! line replaces the one before: a renewal moves both later, a stop brings them forward. They
//! are instants rather than durations so that a line read late (the supervisor busy, the socket
//! full) does not shift them; CLOCK_MONOTONIC is the same clock in every process of the host.
//!
//! Supervisor → `leasehold run`: `term` and `kill` when it sends those signals by its orders,
//! then how the command ended: `exit N`, `signal N`, or `error TEXT` when it could not start.

use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use tokio::time::Instant;

/// When the supervisor stops the command's group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Orders {
    /// SIGTERM to the group (once).
    pub term: Option<Instant>,
    /// SIGKILL to the group, the supervisor included.
    pub kill: Option<Instant>,
}

impl Orders {
    /// The line that carries these orders, or `None` if the clock cannot be read.
    pub fn line(&self) -> Option<String> {
        let wire = |at: Option<Instant>| match at {
            Some(at) => to_wire(at).map(|ns| ns.to_string()),
            None => Some("-".to_owned()),
        };
        Some(format!("at {} {}\n", wire(self.term)?, wire(self.kill)?))
    }

    /// The orders a line carries, or `None` if it is not an `at` line.
    pub fn parse(line: &str) -> Option<Self> {
        let mut words = line.strip_prefix("at ")?.split_whitespace();
        let mut instant = || match words.next()? {
            "-" => Some(None),
            ns => from_wire(ns.parse().ok()?).map(Some),
        };
        Some(Self {
            term: instant()?,
            kill: instant()?,
        })
    }
}

fn monotonic_now() -> Option<Duration> {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .ok()
        .map(Duration::from)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `at` as CLOCK_MONOTONIC nanoseconds. The clock is read before `Instant::now()`, so the result
/// errs early (by the few nanoseconds between the two readings), never late.
fn to_wire(at: Instant) -> Option<u64> {
    let clock = nanos(monotonic_now()?);
    let now = Instant::now();
    Some(if at >= now {
        clock.saturating_add(nanos(at - now))
    } else {
        clock.saturating_sub(nanos(now - at))
    })
}

/// The instant of CLOCK_MONOTONIC nanoseconds `ns`. The clock is read after `Instant::now()`,
/// so the result errs early, never late.
fn from_wire(ns: u64) -> Option<Instant> {
    let now = Instant::now();
    let clock = nanos(monotonic_now()?);
    Some(if ns >= clock {
        now + Duration::from_nanos(ns - clock)
    } else {
        now.checked_sub(Duration::from_nanos(clock - ns))
            .unwrap_or(now)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_cross_the_link_unchanged_or_a_little_early() {
        let now = Instant::now();
        for orders in [
            Orders::default(),
            Orders {
                term: Some(now + Duration::from_secs(2)),
                kill: Some(now + Duration::from_secs(3)),
            },
            Orders {
                term: Some(now - Duration::from_millis(5)),
                kill: None,
            },
        ] {
            let line = orders.line().unwrap();
            assert!(line.starts_with("at ") && line.ends_with('\n'), "{line:?}");
            let read = Orders::parse(line.trim_end()).unwrap();
            for (sent, got) in [(orders.term, read.term), (orders.kill, read.kill)] {
                match (sent, got) {
                    (None, None) => {}
                    (Some(sent), Some(got)) => {
                        assert!(got <= sent, "{got:?} later than {sent:?}");
                        assert!(sent - got < Duration::from_millis(50), "{sent:?} {got:?}");
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn other_lines_are_not_orders() {
        for line in ["", "at", "at 1", "at x 2", "exit 0", "at - -x"] {
            assert_eq!(Orders::parse(line), None, "{line:?}");
        }
        assert_eq!(Orders::parse("at - -"), Some(Orders::default()));
    }
}
