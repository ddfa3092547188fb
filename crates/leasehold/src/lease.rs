//! [`Lease`] (a handle to acquire one named lease) and [`LeaseGuard`] (a held lease that renews
//! itself and says the moment it is lost).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, LeaseConfig};
use crate::session;
use crate::store_api::{Acquisition, Release, Renewal, Store, StoreError, StoreResult};
use crate::{FencingToken, HolderId, LeaseName};

/// Why acquiring or releasing a lease failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The store could not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store granted the lease, but the reply arrived after the local deadline computed from
    /// when the request was sent, so the lease may already have expired: it is not treated as held.
    #[error(
        "the store's grant arrived {elapsed:?} after the request, past the lease's local deadline"
    )]
    LateReply {
        /// Time from sending the request to reading the reply.
        elapsed: Duration,
    },
    /// The lease timing is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl LeaseError {
    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Store(e) => e.is_transient(),
            Self::LateReply { .. } => true,
            Self::Config(_) => false,
        }
    }
}

/// Why a [`LeaseGuard`] stopped holding its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The store answered a renewal with "not yours": the lease expired there, was taken over,
    /// or the store lost it.
    TakenOver,
    /// No renewal was confirmed before the local deadline (store unreachable, too slow, or this
    /// process was paused).
    Expired,
    /// The same [`Lease`] handle acquired the lease again, which starts a new tenure and ends
    /// this one.
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

/// Answer to [`Lease::try_acquire`].
#[derive(Debug)]
pub enum TryAcquire {
    /// We hold the lease.
    Acquired(LeaseGuard),
    /// Someone else does.
    Busy {
        /// The current holder.
        holder: HolderId,
        /// Time left on their lease, on the store's clock.
        remaining: Duration,
    },
}

/// A named lease on a store, with this process's holder id and timing. Cheap to clone.
///
/// A handle (and its clones) holds at most one tenure at a time: acquiring again through it ends
/// the previous guard's tenure first ([`LossReason::Superseded`]), and the store hands out a new
/// token, so the older guard's renewals and release cannot touch the new tenure.
#[derive(Debug, Clone)]
pub struct Lease<S> {
    store: S,
    name: LeaseName,
    holder: HolderId,
    config: LeaseConfig,
    /// The tenure of the last guard this handle made, to end it before a new acquisition.
    current: Arc<Mutex<Option<Arc<Shared>>>>,
    /// Held across one acquisition, so that acquisitions through clones of the handle take
    /// turns: each ends the guard of the one before, and never two guards both hold.
    acquiring: Arc<tokio::sync::Mutex<()>>,
}

impl<S: Store> Lease<S> {
    /// A lease handle with a fresh holder id. Fails if `config` is invalid.
    pub fn new(store: S, name: LeaseName, config: LeaseConfig) -> Result<Self, ConfigError> {
        Self::held_as(store, name, config, HolderId::generate())
    }

    /// A lease handle whose identity is `holder` (as [`new`](Self::new) then
    /// [`with_holder`](Self::with_holder), without making the id it replaces: a sidecar makes
    /// a handle per request). Fails if `config` is invalid.
    pub fn held_as(
        store: S,
        name: LeaseName,
        config: LeaseConfig,
        holder: HolderId,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            store,
            name,
            holder,
            config,
            current: Arc::default(),
            acquiring: Arc::default(),
        })
    }

    /// Uses `holder` as this handle's identity instead of a generated one.
    pub fn with_holder(mut self, holder: HolderId) -> Self {
        self.holder = holder;
        self
    }

    /// The lease name.
    pub fn name(&self) -> &LeaseName {
        &self.name
    }

    /// This handle's holder id.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// The timing in use.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// One attempt: takes the lease if it is free, else reports who holds it.
    ///
    /// A guard this handle made before, if still held, is ended first ([`LossReason::Superseded`]):
    /// every acquisition is a new tenure with a new token.
    pub async fn try_acquire(&self) -> Result<TryAcquire, LeaseError> {
        let _turn = self.acquiring.lock().await;
        if let Some(previous) = lock(&self.current).take() {
            previous.end(LossReason::Superseded);
        }
        let (token, deadline) =
            match acquire_once(&self.store, &self.name, &self.holder, &self.config).await? {
                Ok(granted) => granted,
                Err(busy) => return Ok(busy),
            };
        Ok(TryAcquire::Acquired(self.start_guard(token, deadline)))
    }

    /// The guard of a tenure the store granted in another call (a gated tick's
    /// [`Slots::tick`](crate::Slots::tick)) sent at `sent`: its local deadline is measured from
    /// then, as [`try_acquire`](Self::try_acquire)'s is, and a grant that arrived after it is
    /// released and reported as [`LeaseError::LateReply`].
    pub(crate) async fn adopt(
        &self,
        token: FencingToken,
        sent: Instant,
    ) -> Result<LeaseGuard, LeaseError> {
        let _turn = self.acquiring.lock().await;
        if let Some(previous) = lock(&self.current).take() {
            previous.end(LossReason::Superseded);
        }
        let deadline = sent + self.config.ttl - self.config.drift_margin;
        if Instant::now() >= deadline {
            return Err(late_grant(
                &self.store,
                &self.name,
                &self.holder,
                token,
                sent,
            ));
        }
        Ok(self.start_guard(token, deadline))
    }

    /// Starts the guard (and its renewer) of a tenure granted with `token`, held here until
    /// `deadline` unless renewed.
    fn start_guard(&self, token: FencingToken, deadline: Instant) -> LeaseGuard {
        tracing::debug!(lease = %self.name, holder = %self.holder, %token, "lease acquired");
        let sent = deadline + self.config.drift_margin - self.config.ttl;
        let guard = LeaseGuard::start(
            self.store.clone(),
            self.name.clone(),
            self.holder.clone(),
            token,
            self.config,
            deadline,
            sent + self.config.renew_interval,
        );
        *lock(&self.current) = Some(guard.shared.clone());
        guard
    }

    /// Waits until the lease is ours. While it is busy, wakes on the store's release
    /// notification or when the holder's lease is due to expire (plus a little jitter), not on a
    /// fixed poll. Transient store errors are retried every `retry_interval`; a refusal
    /// ([`StoreError::Rejected`]) is returned. Drop the future to stop waiting.
    pub async fn acquire(&self) -> Result<LeaseGuard, LeaseError> {
        let mut releases = self.store.subscribe_releases();
        // One warning per outage, not one per retry.
        let mut failing = false;
        loop {
            let wait = match self.try_acquire().await {
                Ok(TryAcquire::Acquired(guard)) => return Ok(guard),
                Ok(TryAcquire::Busy { remaining, .. }) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!(lease = %self.name, "store answers again");
                    }
                    remaining + self.jitter()
                }
                Err(e) if e.is_transient() => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(lease = %self.name, error = %e, "acquire failed; retrying until the store answers");
                    } else {
                        tracing::debug!(lease = %self.name, error = %e, "acquire failed; retrying");
                    }
                    self.config.retry_interval
                }
                Err(e) => return Err(e),
            };
            match releases.as_mut() {
                Some(sub) => {
                    tokio::select! {
                        () = sub.released(&self.name) => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                None => tokio::time::sleep(wait).await,
            }
        }
    }

    /// 1 ms plus up to a tenth of the retry interval (at most 10 ms more), so waiters that were
    /// told the same expiry do not all knock at the same instant.
    fn jitter(&self) -> Duration {
        let spread = (self.config.retry_interval.as_micros() as u64 / 10).min(10_000);
        Duration::from_millis(1) + Duration::from_micros(fastrand::u64(0..=spread))
    }
}

/// One acquire in the store: the token and local deadline of a grant (measured from when the
/// request was sent), or the busy answer. A grant whose reply came after that deadline is handed
/// back and reported as [`LeaseError::LateReply`].
pub(crate) async fn acquire_once<S: Store>(
    store: &S,
    name: &LeaseName,
    holder: &HolderId,
    config: &LeaseConfig,
) -> Result<Result<(FencingToken, Instant), TryAcquire>, LeaseError> {
    let sent = Instant::now();
    let deadline = sent + config.ttl - config.drift_margin;
    let reply = tokio::time::timeout_at(deadline, store.acquire(name, holder, config.ttl))
        .await
        .map_err(|_| StoreError::Timeout(deadline - sent))??;
    match reply {
        Acquisition::Busy { holder, remaining } => Ok(Err(TryAcquire::Busy { holder, remaining })),
        Acquisition::Acquired { token } => {
            if Instant::now() >= deadline {
                return Err(late_grant(store, name, holder, token, sent));
            }
            Ok(Ok((token, deadline)))
        }
    }
}

/// A grant whose reply came after its local deadline: not a lease. The store may still list
/// us, so it is released for others rather than left to expire.
fn late_grant<S: Store>(
    store: &S,
    name: &LeaseName,
    holder: &HolderId,
    token: FencingToken,
    sent: Instant,
) -> LeaseError {
    let (store, name, holder) = (store.clone(), name.clone(), holder.clone());
    tokio::spawn(async move {
        let _ = store.release(&name, &holder, token).await;
    });
    LeaseError::LateReply {
        elapsed: Instant::now() - sent,
    }
}

pub(crate) type ReleaseReply = oneshot::Sender<Result<Release, StoreError>>;

/// State the guard, its renewer and its [`Lease`] handle share.
#[derive(Debug)]
pub(crate) struct Shared {
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

/// A cheap, clonable view of whether a guard still holds its lease, for [`TaskContext`]
/// (crate::TaskContext::is_held) without handing out the guard.
#[derive(Debug, Clone)]
pub(crate) enum HeldProbe {
    /// A guard of this process: its expiring signal and its deadline on the clock.
    Guard(Arc<Shared>),
    /// Only a token that fires when the lease starts expiring (leadership, from the watch).
    Token(CancellationToken),
}

impl HeldProbe {
    pub(crate) fn is_held(&self) -> bool {
        match self {
            Self::Guard(shared) => !shared.is_expiring() && Instant::now() < shared.deadline(),
            Self::Token(token) => !token.is_cancelled(),
        }
    }
}

// Beside the probe whose guard it reads.
impl Shared {
    /// Records the loss (the first reason wins) and tells the work. The cancellation comes
    /// before any logging: a log write that fails must never keep the work running.
    pub(crate) fn new(deadline: Instant) -> Arc<Self> {
        Arc::new(Self {
            deadline: Mutex::new(deadline),
            lost: OnceLock::new(),
            ended: Signal::default(),
            expiring: Signal::default(),
            deadline_updates: OnceLock::new(),
        })
    }

    pub(crate) fn end(&self, reason: LossReason) -> bool {
        let first = self.lost.set(reason).is_ok();
        self.stop();
        first
    }

    /// Tells the work to stop (see [`LeaseGuard::cancellation_token`]).
    pub(crate) fn warn_expiring(&self) {
        self.expiring.fire();
    }

    /// Whether the work has been told to stop.
    pub(crate) fn is_expiring(&self) -> bool {
        self.expiring.has_fired()
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

/// A held lease. A background task renews it; work under it stops on
/// [`cancellation_token`](Self::cancellation_token), which fires in time for the work to end
/// before anyone else can hold the lease ([`lost_token`](Self::lost_token) fires at the loss). Call [`release`](Self::release) to hand over on shutdown;
/// dropping the guard releases it best-effort.
pub struct LeaseGuard {
    name: LeaseName,
    holder: HolderId,
    token: FencingToken,
    shared: Arc<Shared>,
    /// Who renews it, and so who releases it. `None` once released.
    owner: Option<Owner>,
}

/// A guard's renewer: its own task, or a [`LeaseSession`](crate::LeaseSession)'s.
enum Owner {
    /// Dropping the sender tells the task to release best-effort and stop.
    Task(oneshot::Sender<ReleaseReply>),
    Session {
        id: u64,
        tx: mpsc::UnboundedSender<session::Command>,
    },
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("name", &self.name)
            .field("holder", &self.holder)
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish()
    }
}

impl LeaseGuard {
    fn start<S: Store>(
        store: S,
        name: LeaseName,
        holder: HolderId,
        token: FencingToken,
        config: LeaseConfig,
        deadline: Instant,
        first_renewal: Instant,
    ) -> Self {
        let shared = Shared::new(deadline);
        let (release_tx, release_rx) = oneshot::channel();
        let renewer = Renewer {
            store,
            name: name.clone(),
            holder: holder.clone(),
            token,
            config,
            deadline,
            next_renewal: first_renewal,
            shared: shared.clone(),
        };
        tokio::spawn(renewer.run(release_rx));
        Self {
            name,
            holder,
            token,
            shared,
            owner: Some(Owner::Task(release_tx)),
        }
    }

    /// A guard renewed by a session's task.
    pub(crate) fn of_session(
        name: LeaseName,
        holder: HolderId,
        token: FencingToken,
        shared: Arc<Shared>,
        id: u64,
        tx: mpsc::UnboundedSender<session::Command>,
    ) -> Self {
        Self {
            name,
            holder,
            token,
            shared,
            owner: Some(Owner::Session { id, tx }),
        }
    }

    /// The lease name.
    pub fn name(&self) -> &LeaseName {
        &self.name
    }

    /// Our holder id.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// The fencing token of this tenure; send it with every write the lease protects.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The token the protected work stops on. It fires `stop_margin` before the local deadline
    /// while renewal is overdue (the store is slow or unreachable, or this process was paused),
    /// and in any case when the lease is lost, released or dropped; it does not fire while
    /// renewals succeed. Stopping on it ends the work *before* the store can grant the lease to
    /// anyone else. Cancelling the returned token yourself does not affect the guard.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.expiring.token().child_token()
    }

    /// Waits until the work should stop (see [`cancellation_token`](Self::cancellation_token)).
    pub async fn cancelled(&self) {
        self.shared.expiring.token().cancelled().await;
    }

    /// A token cancelled the moment the lease is lost (or released, or dropped): later than
    /// [`cancellation_token`](Self::cancellation_token), for observing the loss itself (metrics,
    /// logs), not for stopping work.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.ended.token().child_token()
    }

    /// Waits until the lease is lost (or released), returning the reason if it was lost.
    pub async fn lost(&self) -> Option<LossReason> {
        self.shared.ended.token().cancelled().await;
        self.loss_reason()
    }

    /// Why the lease was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.lost.get().copied()
    }

    /// Whether we still hold the lease: not lost, and the local deadline not passed. Checked
    /// against the clock at each call, so it is false at once after this process resumes from a
    /// pause, before the renewer has run.
    pub fn is_held(&self) -> bool {
        !self.shared.ended.has_fired() && Instant::now() < self.deadline()
    }

    /// The instant (monotonic clock) until which the lease is known to be ours.
    pub fn deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// The local [`deadline`](Self::deadline), updated with every confirmed renewal: for a
    /// watchdog that must stop the work by its own clock should this process be frozen (the
    /// `leasehold run` supervisor). The value only ever moves later while the lease is held.
    pub fn deadline_updates(&self) -> watch::Receiver<Instant> {
        self.shared.deadline_updates()
    }

    pub(crate) fn probe(&self) -> HeldProbe {
        HeldProbe::Guard(self.shared.clone())
    }

    /// Stops renewing and frees the lease in the store, so a waiting instance takes over at
    /// once. Drain the work the lease protects first. Returns [`Release::NotHeld`] if the store
    /// no longer had it.
    pub async fn release(mut self) -> Result<Release, LeaseError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let sent = match self.owner.take() {
            Some(Owner::Task(tx)) => tx.send(reply_tx).is_ok(),
            Some(Owner::Session { id, tx }) => {
                tx.send(session::Command::Release(id, reply_tx)).is_ok()
            }
            None => false,
        };
        if !sent {
            return Ok(Release::NotHeld);
        }
        match reply_rx.await {
            Ok(result) => Ok(result?),
            // The renewer ended without answering (its runtime is shutting down).
            Err(_) => Ok(Release::NotHeld),
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.shared.stop();
        // A task's renewer learns it from its channel closing; a session is told.
        if let Some(Owner::Session { id, tx }) = self.owner.take() {
            let _ = tx.send(session::Command::Drop(id));
        }
    }
}

struct Renewer<S> {
    store: S,
    name: LeaseName,
    holder: HolderId,
    token: FencingToken,
    config: LeaseConfig,
    deadline: Instant,
    next_renewal: Instant,
    shared: Arc<Shared>,
}

/// A renewal on its way: when it was sent, and the store's answer (or the deadline passing).
type InFlight = std::pin::Pin<
    Box<
        dyn Future<
                Output = (
                    Instant,
                    Result<StoreResult<Renewal>, tokio::time::error::Elapsed>,
                ),
            > + Send,
    >,
>;

impl<S: Store> Renewer<S> {
    async fn run(mut self, mut release_rx: oneshot::Receiver<ReleaseReply>) {
        // The renewal runs beside the timers rather than inside one of their arms, so a store that
        // never answers still lets the stop margin and the deadline fire on time.
        let mut in_flight: Option<InFlight> = None;
        loop {
            let held = self.shared.lost.get().is_none();
            let warn_work = held && !self.shared.is_expiring();
            let stop_work_at = self
                .deadline
                .checked_sub(self.config.stop_margin)
                .unwrap_or(self.deadline);
            let renewing = in_flight.is_some();
            tokio::select! {
                biased;
                // Checked first, so after a pause an overdue deadline wins over a due renewal.
                () = sleep_until(self.deadline), if held => {
                    in_flight = None;
                    self.lose(LossReason::Expired);
                }
                cmd = &mut release_rx => {
                    self.release(cmd.ok()).await;
                    return;
                }
                () = sleep_until(stop_work_at), if warn_work => {
                    self.shared.warn_expiring();
                    tracing::warn!(lease = %self.name, token = %self.token, "renewal overdue; telling the work to stop before the lease can expire");
                }
                (sent, reply) = in_flight_reply(&mut in_flight), if renewing => {
                    in_flight = None;
                    self.renewed(sent, reply);
                }
                () = sleep_until(self.next_renewal), if held && !renewing => {
                    in_flight = Some(self.send_renewal());
                }
            }
        }
    }

    fn send_renewal(&self) -> InFlight {
        let (store, name, holder, token, ttl, deadline) = (
            self.store.clone(),
            self.name.clone(),
            self.holder.clone(),
            self.token,
            self.config.ttl,
            self.deadline,
        );
        Box::pin(async move {
            let sent = Instant::now();
            let reply =
                tokio::time::timeout_at(deadline, store.renew(&name, &holder, token, ttl)).await;
            (sent, reply)
        })
    }

    fn renewed(
        &mut self,
        sent: Instant,
        reply: Result<StoreResult<Renewal>, tokio::time::error::Elapsed>,
    ) {
        // A reply read after the deadline (this task was late to run) is not trusted.
        if Instant::now() >= self.deadline {
            self.lose(LossReason::Expired);
            return;
        }
        match reply {
            Ok(Ok(Renewal::Renewed)) => {
                self.deadline = sent + self.config.ttl - self.config.drift_margin;
                self.next_renewal = sent + self.config.renew_interval;
                self.shared.set_deadline(self.deadline);
            }
            Ok(Ok(Renewal::Lost)) => self.lose(LossReason::TakenOver),
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, error = %e, "renewal failed; retrying");
                self.next_renewal = Instant::now() + self.config.retry_interval;
            }
            // Timed out at the deadline: the next loop turn records the loss.
            Err(_) => {}
        }
    }

    fn lose(&mut self, reason: LossReason) {
        if self.shared.end(reason) {
            metrics::counter!("leasehold_leases_lost_total", "reason" => reason.as_str())
                .increment(1);
            tracing::warn!(lease = %self.name, token = %self.token, %reason, "lease lost");
        }
    }

    /// Frees the lease in the store, even after a local loss: if the store still lists us (the
    /// deadline passed locally first), others need not wait for expiry.
    async fn release(&mut self, reply: Option<ReleaseReply>) {
        self.shared.stop();
        let result = tokio::time::timeout(
            self.config.ttl,
            self.store.release(&self.name, &self.holder, self.token),
        )
        .await
        .unwrap_or(Err(StoreError::Timeout(self.config.ttl)));
        match &result {
            Ok(outcome) => {
                tracing::debug!(lease = %self.name, token = %self.token, ?outcome, "lease released")
            }
            Err(e) => tracing::warn!(lease = %self.name, error = %e, "release failed"),
        }
        if let Some(reply) = reply {
            let _ = reply.send(result);
        }
    }
}

/// The in-flight renewal's answer; never completes when none is in flight (its select arm is
/// disabled then anyway).
pub(crate) async fn in_flight_reply<T>(
    in_flight: &mut Option<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>>,
) -> T {
    match in_flight.as_mut() {
        Some(renewal) => renewal.await,
        None => std::future::pending().await,
    }
}
