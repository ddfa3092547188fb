//! One tenure's state, shared by its guard, its renewer and the [`Lease`](crate::Lease) handle
//! that made it: the local deadline, why it was lost, and the signals the work waits on.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a [`LeaseGuard`](crate::LeaseGuard) stopped holding its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The store answered a renewal with "not yours": the lease expired there, was taken over,
    /// or the store lost it.
    TakenOver,
    /// No renewal was confirmed before the local deadline (store unreachable, too slow, or this
    /// process was paused).
    Expired,
    /// The same [`Lease`](crate::Lease) handle acquired the lease again, which starts a new
    /// tenure and ends this one.
    Superseded,
}

impl LossReason {
    /// The metrics label: `taken-over`, `expired`, `superseded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TakenOver => "taken-over",
            Self::Expired => "expired",
            Self::Superseded => "superseded",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TakenOver => "the store reports the lease is no longer ours",
            Self::Expired => "no renewal was confirmed before the local deadline",
            Self::Superseded => "this lease handle acquired the lease again",
        })
    }
}

/// State a guard, its renewer and its [`Lease`](crate::Lease) handle share.
#[derive(Debug)]
pub(crate) struct Tenure {
    deadline: Mutex<Instant>,
    lost: OnceLock<LossReason>,
    /// Fires on loss, release or drop.
    ended: Signal,
    /// Fires at `deadline - stop_margin` while renewal is overdue, and with `ended`.
    expiring: Signal,
    /// The deadline's updates, made (like a [`Signal`]'s token) only when someone subscribes.
    deadline_updates: OnceLock<watch::Sender<Instant>>,
}

/// A one-way signal: a flag, and a token made only when someone waits on it (a token is ~128
/// bytes, and most of the many guards of a session are never asked for theirs). Either firing
/// sees the token or the token, once made, sees the flag: the signal is never missed.
#[derive(Debug, Default)]
struct Signal {
    fired: AtomicBool,
    token: OnceLock<CancellationToken>,
}

impl Signal {
    fn fire(&self) {
        self.fired.store(true, Ordering::SeqCst);
        if let Some(token) = self.token.get() {
            token.cancel();
        }
    }

    fn has_fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// The signal as a token, made on first use.
    fn token(&self) -> &CancellationToken {
        let token = self.token.get_or_init(CancellationToken::new);
        if self.has_fired() {
            token.cancel();
        }
        token
    }
}

impl Tenure {
    pub(crate) fn new(deadline: Instant) -> Arc<Self> {
        Arc::new(Self {
            deadline: Mutex::new(deadline),
            lost: OnceLock::new(),
            ended: Signal::default(),
            expiring: Signal::default(),
            deadline_updates: OnceLock::new(),
        })
    }

    /// Records the loss (the first reason wins) and tells the work; whether this call was the
    /// first. The cancellation comes before any logging: a log write that fails must never keep
    /// the work running.
    pub(crate) fn end(&self, reason: LossReason) -> bool {
        let first = self.lost.set(reason).is_ok();
        self.stop();
        first
    }

    /// Why the lease was lost, if it was.
    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.lost.get().copied()
    }

    /// Tells the work to stop (see [`LeaseGuard::cancellation_token`](crate::LeaseGuard::cancellation_token)).
    pub(crate) fn warn_expiring(&self) {
        self.expiring.fire();
    }

    /// Whether the work has been told to stop.
    pub(crate) fn is_expiring(&self) -> bool {
        self.expiring.has_fired()
    }

    /// The token of the expiring signal, made on first use.
    pub(crate) fn expiring_token(&self) -> &CancellationToken {
        self.expiring.token()
    }

    /// Whether the tenure is over here: lost, released or dropped.
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.has_fired()
    }

    /// The token of the ended signal, made on first use.
    pub(crate) fn ended_token(&self) -> &CancellationToken {
        self.ended.token()
    }

    /// Both signals: the work stops and the lease is gone.
    pub(crate) fn stop(&self) {
        self.expiring.fire();
        self.ended.fire();
    }

    pub(crate) fn deadline(&self) -> Instant {
        *lock(&self.deadline)
    }

    /// Records a confirmed renewal's deadline, and tells the subscribers.
    pub(crate) fn set_deadline(&self, deadline: Instant) {
        *lock(&self.deadline) = deadline;
        if let Some(updates) = self.deadline_updates.get() {
            updates.send_replace(deadline);
        }
    }

    /// The deadline and its updates. The current value is read under the watch's lock, so an
    /// update racing with the first subscription is never lost.
    pub(crate) fn deadline_updates(&self) -> watch::Receiver<Instant> {
        let updates = self
            .deadline_updates
            .get_or_init(|| watch::Sender::new(self.deadline()));
        updates.send_if_modified(|seen| {
            let current = self.deadline();
            std::mem::replace(seen, current) != current
        });
        updates.subscribe()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every value behind these locks is replaced whole, so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
