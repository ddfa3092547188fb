//! Leader election for a named group: campaign, hold, renew, step down.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::guard::{Lease, LeaseError};
use crate::lease::tenure::LossReason;
use crate::store::name::{HolderId, LeaseName};
use crate::store::token::FencingToken;
use crate::store::traits::Store;

/// Where this instance stands in its group.
///
/// States may be added (`Failed` was), so a `match` outside this crate needs a `_` arm; one
/// without it does not compile:
///
/// ```compile_fail,E0004
/// use leasehold::LeaderState;
///
/// fn leading(state: &LeaderState) -> bool {
///     match state {
///         LeaderState::Leading { .. } => true,
///         LeaderState::Campaigning | LeaderState::Stopped | LeaderState::Failed { .. } => false,
///     }
/// }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LeaderState {
    /// Waiting to be elected.
    Campaigning,
    /// Leading. `cancel` fires the moment leadership is lost or given up.
    Leading {
        /// The fencing token of this term.
        token: FencingToken,
        /// Cancelled when this term ends.
        cancel: CancellationToken,
    },
    /// The election loop ended: shutdown or [`LeaderHandle::step_down`].
    Stopped,
    /// The election loop gave up: the store refused the lease again and again (a key of the
    /// wrong type, no permission, scripts disabled), which retrying cannot fix.
    Failed {
        /// The last refusal.
        error: String,
    },
}

impl LeaderState {
    /// Whether this instance leads now.
    pub fn is_leader(&self) -> bool {
        matches!(self, Self::Leading { cancel, .. } if !cancel.is_cancelled())
    }

    /// While leading: the term's signal, which fires when it ends.
    pub(crate) fn term_signal(&self) -> Option<CancellationToken> {
        match self {
            Self::Leading { cancel, .. } if !cancel.is_cancelled() => Some(cancel.clone()),
            _ => None,
        }
    }
}

/// A change of leadership, as given to [`Leader::on_event`] callbacks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderEvent {
    /// This instance was elected.
    Elected {
        /// The fencing token of the new term.
        token: FencingToken,
    },
    /// This instance stopped leading.
    Revoked {
        /// Why.
        reason: RevokeReason,
    },
    /// The election gave up after repeated refusals (see [`LeaderState::Failed`]).
    Failed {
        /// The last refusal.
        error: String,
    },
}

/// Why a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RevokeReason {
    /// The lease was lost (store said so, or no renewal was confirmed in time).
    Lost(LossReason),
    /// Renewal was overdue by the lease's stop margin: the term ended (and the work under it was
    /// told to stop) before the lease could expire in the store.
    RenewalOverdue,
    /// This instance stepped down (shutdown).
    SteppedDown,
}

impl fmt::Display for RevokeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lost(reason) => write!(f, "lease lost: {reason}"),
            Self::RenewalOverdue => f.write_str("renewal overdue; term ended before expiry"),
            Self::SteppedDown => f.write_str("stepped down"),
        }
    }
}

type Callback = Arc<dyn Fn(&LeaderEvent) + Send + Sync>;

/// Refusals in a row after which the election gives up ([`LeaderState::Failed`]).
pub const MAX_REFUSALS: u32 = 5;

/// An election for one group. Build it, optionally add callbacks, then [`start`](Self::start).
pub struct Leader<S> {
    lease: Lease<S>,
    callbacks: Vec<Callback>,
}

impl<S: Store> Leader<S> {
    /// An election whose term is the lease `lease` (its name is the group's name).
    pub fn new(lease: Lease<S>) -> Self {
        Self {
            lease,
            callbacks: Vec::new(),
        }
    }

    /// Calls `f` on every election and revocation, from the election task; keep it short.
    pub fn on_event(mut self, f: impl Fn(&LeaderEvent) + Send + Sync + 'static) -> Self {
        self.callbacks.push(Arc::new(f));
        self
    }

    /// Starts campaigning in a background task. Leadership is given up when `shutdown`
    /// completes or [`LeaderHandle::step_down`] is called.
    pub fn start(self, shutdown: impl Future<Output = ()> + Send + 'static) -> LeaderHandle {
        let (tx, rx) = watch::channel(LeaderState::Campaigning);
        let stop = CancellationToken::new();
        let group = self.lease.name().clone();
        let holder = self.lease.holder().clone();
        let stop_on = stop.clone();
        // Ends with the election too, so step_down leaves no task behind.
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => stop_on.cancel(),
                () = stop_on.cancelled() => {}
            }
        });
        let task = tokio::spawn(self.run(tx, stop.clone()));
        LeaderHandle {
            group,
            holder,
            state: rx,
            stop,
            task: Some(task),
        }
    }

    fn emit(&self, event: LeaderEvent) {
        for cb in &self.callbacks {
            cb(&event);
        }
    }

    async fn run(
        self,
        tx: watch::Sender<LeaderState>,
        stop: CancellationToken,
    ) -> Result<(), LeaseError> {
        let group = self.lease.name().as_str().to_owned();
        // Held for the campaign's life: a recorder that drops the series nobody holds (the
        // sidecar's) removes the group's once it is given up.
        let gauge = metrics::gauge!("leasehold_leader", "group" => group.clone());
        let campaign_seconds =
            metrics::histogram!("leasehold_leader_campaign_seconds", "group" => group.clone());
        let mut refusals = 0;
        loop {
            tx.send_replace(LeaderState::Campaigning);
            gauge.set(0.0);
            let campaign_start = Instant::now();
            let guard = tokio::select! {
                () = stop.cancelled() => break,
                acquired = self.lease.acquire() => match acquired {
                    Ok(guard) => guard,
                    Err(e) => {
                        refusals += 1;
                        if refusals >= MAX_REFUSALS {
                            let error = e.to_string();
                            tracing::error!(group = %group, %error, refusals, "leader election gave up: the store keeps refusing the lease");
                            tx.send_replace(LeaderState::Failed { error: error.clone() });
                            self.emit(LeaderEvent::Failed { error });
                            return Err(e);
                        }
                        tracing::warn!(group = %group, error = %e, refusals, "the store refused the leader lease; retrying");
                        tokio::select! {
                            () = stop.cancelled() => break,
                            () = tokio::time::sleep(self.lease.config().renew_interval) => continue,
                        }
                    }
                },
            };
            refusals = 0;
            let token = guard.token();
            campaign_seconds.record(campaign_start.elapsed().as_secs_f64());
            tracing::info!(group = %group, holder = %guard.holder(), %token, "elected leader");
            gauge.set(1.0);
            // The term's work stops on the guard's early signal, so it has ended before the
            // lease can expire in the store and another instance be elected.
            tx.send_replace(LeaderState::Leading {
                token,
                cancel: guard.cancellation_token(),
            });
            self.emit(LeaderEvent::Elected { token });
            let stepping_down = tokio::select! {
                () = stop.cancelled() => true,
                () = guard.cancelled() => false,
            };
            gauge.set(0.0);
            if stepping_down {
                if let Err(e) = guard.release().await {
                    tracing::warn!(group = %group, error = %e, "release on step-down failed");
                }
                tracing::info!(group = %group, %token, "stepped down");
                self.emit(LeaderEvent::Revoked {
                    reason: RevokeReason::SteppedDown,
                });
                break;
            }
            let reason = match guard.loss_reason() {
                Some(reason) => RevokeReason::Lost(reason),
                None => RevokeReason::RenewalOverdue,
            };
            tracing::warn!(group = %group, %token, %reason, "leadership ended");
            // Frees the lease at once if the store still lists this term; the next campaign
            // is a new tenure with a new token either way.
            drop(guard);
            self.emit(LeaderEvent::Revoked { reason });
        }
        tx.send_replace(LeaderState::Stopped);
        Ok(())
    }
}

/// A running election.
pub struct LeaderHandle {
    group: LeaseName,
    holder: HolderId,
    state: watch::Receiver<LeaderState>,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), LeaseError>>>,
}

impl LeaderHandle {
    /// The group's name.
    pub fn group(&self) -> &LeaseName {
        &self.group
    }

    /// This instance's holder id.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// The current state.
    pub fn state(&self) -> LeaderState {
        self.state.borrow().clone()
    }

    /// Whether this instance leads now.
    pub fn is_leader(&self) -> bool {
        self.state.borrow().is_leader()
    }

    /// A watch on the state, to await changes.
    pub fn watch(&self) -> watch::Receiver<LeaderState> {
        self.state.clone()
    }

    /// Waits until this instance leads, returning the term's token and cancellation token, or
    /// `None` if the election stopped or failed.
    pub async fn elected(&self) -> Option<(FencingToken, CancellationToken)> {
        let mut rx = self.state.clone();
        loop {
            match &*rx.borrow_and_update() {
                LeaderState::Leading { token, cancel } if !cancel.is_cancelled() => {
                    return Some((*token, cancel.clone()));
                }
                LeaderState::Stopped | LeaderState::Failed { .. } => return None,
                _ => {}
            }
            rx.changed().await.ok()?;
        }
    }

    /// Gives up leadership (releasing the lease so another instance takes over at once) and
    /// waits for the election loop to end.
    pub async fn step_down(mut self) -> Result<(), LeaseError> {
        self.stop.cancel();
        match self.task.take() {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for LeaderHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
