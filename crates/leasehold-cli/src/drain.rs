//! `--drain` for `run` and `crontab`: the first SIGTERM or SIGINT begins the scheduler's
//! shutdown, which takes no new slot and lets a running command finish for up to the drain (its
//! grace period, see `Scheduler::grace_period`); a second one ends the drain at once.

use std::time::Duration;

use leasehold::{Catalog, Membership, Scheduler, SchedulerError, SchedulerHandle, Slots};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::task::JoinHandle;

/// A started scheduler and the task that follows the signals for it (stopped when dropped).
pub struct Draining {
    pub handle: SchedulerHandle,
    signals: JoinHandle<()>,
}

impl Drop for Draining {
    fn drop(&mut self) {
        self.signals.abort();
    }
}

/// Starts `sched` with shutdown on SIGTERM or SIGINT, draining running commands for up to
/// `drain`.
pub fn start<S: Slots + Membership + Catalog>(
    sched: Scheduler<S>,
    drain: Duration,
) -> Result<Draining, SchedulerError> {
    // Installed before the scheduler starts: a signal from then on is never missed, and the
    // same handlers see the first signal and the second.
    let signals = Signals::install();
    let handle = sched.grace_period(drain).start(std::future::pending())?;
    let signals = tokio::spawn(follow(signals, handle.clone(), drain));
    Ok(Draining { handle, signals })
}

/// SIGTERM and SIGINT, or nothing if their handlers cannot be installed.
struct Signals(Option<(Signal, Signal)>);

impl Signals {
    fn install() -> Self {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Self(Some((term, int))),
            _ => {
                tracing::error!("cannot install signal handlers; stop with SIGKILL");
                Self(None)
            }
        }
    }

    /// The next signal's name.
    async fn next(&mut self) -> &'static str {
        let Some((term, int)) = &mut self.0 else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    }
}

async fn follow(mut signals: Signals, handle: SchedulerHandle, drain: Duration) {
    let first = signals.next().await;
    if drain.is_zero() {
        tracing::info!("{first}: shutting down");
    } else {
        tracing::info!(
            "{first}: shutting down; a running command may finish within the drain ({}), \
             another SIGTERM or SIGINT stops it now",
            humantime::format_duration(drain)
        );
    }
    // Not `shutdown().await`: the second signal must be heard while the drain goes on.
    let stopping = handle.clone();
    tokio::spawn(async move { stopping.shutdown().await });
    let second = signals.next().await;
    if !drain.is_zero() {
        tracing::info!("{second} again: ending the drain, stopping the command now");
    }
    handle.end_drain();
}
