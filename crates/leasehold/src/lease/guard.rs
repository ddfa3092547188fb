//! [`Lease`] (a handle to acquire one named lease) and [`LeaseGuard`] (a held lease that renews
//! itself and says the moment it is lost).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::config::{ConfigError, LeaseConfig};
use crate::lease::renewer::{self, LONE, Link, Member, Members, Renewer, Reply};
use crate::lease::tenure::{LossReason, Tenure, lock};
use crate::store::answers::{Acquisition, Release};
use crate::store::error::StoreError;
use crate::store::name::{HolderId, LeaseName};
use crate::store::notify::ReleaseSubscription;
use crate::store::token::FencingToken;
use crate::store::traits::Store;

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
    current: Arc<Mutex<Option<Arc<Tenure>>>>,
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
        let guard = LeaseGuard::start(
            self.store.clone(),
            self.name.clone(),
            self.holder.clone(),
            token,
            self.config,
            deadline,
        );
        *lock(&self.current) = Some(guard.tenure.clone());
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
            let live = releases.as_ref().is_some_and(ReleaseSubscription::is_live);
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
                // A release since the busy answer may not have been heard: once the listener
                // is live (it connects when a waiter first waits, and after each drop), ask
                // again, then wait on it.
                Some(sub) if !live => {
                    let _ = tokio::time::timeout(wait, sub.live()).await;
                }
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

/// A cheap, clonable view of whether a guard still holds its lease, for [`TaskContext`]
/// (crate::TaskContext::is_held) without handing out the guard.
#[derive(Debug, Clone)]
pub(crate) enum HeldProbe {
    /// A guard of this process: its expiring signal and its deadline on the clock.
    Guard(Arc<Tenure>),
    /// Only a token that fires when the lease starts expiring (leadership, from the watch).
    Token(CancellationToken),
}

impl HeldProbe {
    pub(crate) fn is_held(&self) -> bool {
        match self {
            Self::Guard(tenure) => !tenure.is_expiring() && Instant::now() < tenure.deadline(),
            Self::Token(token) => !token.is_cancelled(),
        }
    }
}

/// A held lease. A background task renews it; work under it stops on
/// [`cancellation_token`](Self::cancellation_token), which fires in time for the work to end
/// before anyone else can hold the lease ([`lost_token`](Self::lost_token) fires at the loss). Call [`release`](Self::release) to hand over on shutdown;
/// dropping the guard releases it best-effort.
pub struct LeaseGuard {
    name: LeaseName,
    holder: HolderId,
    token: FencingToken,
    tenure: Arc<Tenure>,
    /// The line to its renewer (its own task, or a [`LeaseSession`](crate::LeaseSession)'s),
    /// which releases it. `None` once released.
    renewer: Option<Link>,
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
    /// A guard with a renewer task of its own.
    fn start<S: Store>(
        store: S,
        name: LeaseName,
        holder: HolderId,
        token: FencingToken,
        config: LeaseConfig,
        deadline: Instant,
    ) -> Self {
        let tenure = Tenure::new(deadline);
        let (link, inbox) = Link::lone();
        let mut renewer = Renewer::new(store, holder.clone(), config, Lone(None));
        renewer.add(Member::new(LONE, name.clone(), token, tenure.clone()));
        tokio::spawn(renewer.run(inbox));
        Self::renewed_by(name, holder, token, tenure, link)
    }

    /// A guard whose tenure `renewer` renews.
    pub(crate) fn renewed_by(
        name: LeaseName,
        holder: HolderId,
        token: FencingToken,
        tenure: Arc<Tenure>,
        renewer: Link,
    ) -> Self {
        Self {
            name,
            holder,
            token,
            tenure,
            renewer: Some(renewer),
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
        self.tenure.expiring_token().child_token()
    }

    /// Waits until the work should stop (see [`cancellation_token`](Self::cancellation_token)).
    pub async fn cancelled(&self) {
        self.tenure.expiring_token().cancelled().await;
    }

    /// A token cancelled the moment the lease is lost (or released, or dropped): later than
    /// [`cancellation_token`](Self::cancellation_token), for observing the loss itself (metrics,
    /// logs), not for stopping work.
    pub fn lost_token(&self) -> CancellationToken {
        self.tenure.ended_token().child_token()
    }

    /// Waits until the lease is lost (or released), returning the reason if it was lost.
    pub async fn lost(&self) -> Option<LossReason> {
        self.tenure.ended_token().cancelled().await;
        self.loss_reason()
    }

    /// Why the lease was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.tenure.loss_reason()
    }

    /// Whether we still hold the lease: not lost, and the local deadline not passed. Checked
    /// against the clock at each call, so it is false at once after this process resumes from a
    /// pause, before the renewer has run.
    pub fn is_held(&self) -> bool {
        !self.tenure.has_ended() && Instant::now() < self.deadline()
    }

    /// The instant (monotonic clock) until which the lease is known to be ours.
    pub fn deadline(&self) -> Instant {
        self.tenure.deadline()
    }

    /// The local [`deadline`](Self::deadline), updated with every confirmed renewal: for a
    /// watchdog that must stop the work by its own clock should this process be frozen (the
    /// `leasehold run` supervisor). The value only ever moves later while the lease is held.
    pub fn deadline_updates(&self) -> watch::Receiver<Instant> {
        self.tenure.deadline_updates()
    }

    pub(crate) fn probe(&self) -> HeldProbe {
        HeldProbe::Guard(self.tenure.clone())
    }

    /// Stops renewing and frees the lease in the store, so a waiting instance takes over at
    /// once. Drain the work the lease protects first. Returns [`Release::NotHeld`] if the store
    /// no longer had it. A guard whose lease was lost here (its deadline passed) still asks the
    /// store, which may list it until its own expiry.
    pub async fn release(mut self) -> Result<Release, LeaseError> {
        let Some(answer) = self.renewer.take().and_then(Link::release) else {
            return Ok(Release::NotHeld);
        };
        match answer.await {
            Ok(result) => Ok(result?),
            // The renewer ended without answering (its runtime is shutting down).
            Err(_) => Ok(Release::NotHeld),
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.tenure.stop();
        if let Some(renewer) = self.renewer.take() {
            renewer.dropped();
        }
    }
}

/// A lone guard's set of members: its one lease, renewed with [`Store::renew`], until the guard
/// lets go.
struct Lone(Option<Member>);

impl<S: Store> Members<S> for Lone {
    fn iter(&self) -> impl Iterator<Item = &Member> {
        self.0.iter()
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Member> {
        self.0.as_mut().filter(|member| member.id == id)
    }

    fn insert(&mut self, member: Member) {
        self.0 = Some(member);
    }

    fn remove(&mut self, id: u64) -> Option<Member> {
        self.0.take_if(|member| member.id == id)
    }

    async fn renew(
        store: S,
        holder: HolderId,
        leases: Vec<(u64, LeaseName, FencingToken)>,
        ttl: Duration,
        deadline: Instant,
    ) -> Vec<(u64, Reply)> {
        let mut replies = Vec::with_capacity(leases.len());
        for (id, name, token) in leases {
            let reply = renewer::within(deadline, store.renew(&name, &holder, token, ttl)).await;
            replies.push((id, reply.map_err(Arc::new)));
        }
        replies
    }
}
