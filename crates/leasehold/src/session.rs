//! Many leases renewed together; see [`LeaseSession`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};

use crate::config::{ConfigError, LeaseConfig};
use crate::lease::{
    LeaseError, LeaseGuard, LossReason, Shared, TryAcquire, acquire_once, in_flight_reply,
};
use crate::store_api::{Purge, Release, Renewal, StoreError};
use crate::{FencingToken, HolderId, LeaseName};

/// The most leases a [`LeaseSession`] renews in one [`Store::renew_many`](crate::Store::renew_many) call.
pub const MAX_RENEW_BATCH: usize = 1000;

/// How long a free lease record is kept before a [`LeaseSession`] purges it, unless told
/// otherwise.
pub const DEFAULT_SESSION_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How often a session purges.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

pub(crate) type ReleaseReply = oneshot::Sender<Result<Release, StoreError>>;

/// What guards and handles tell the session's task.
pub(crate) enum Command {
    Add(Member),
    Retention(Option<Duration>),
    Release(u64, ReleaseReply),
    Drop(u64),
}

/// One lease held by the session.
pub(crate) struct Member {
    id: u64,
    name: LeaseName,
    token: FencingToken,
    shared: Arc<Shared>,
}

/// A member's timing, known only to the session's task.
struct Held {
    member: Member,
    deadline: Instant,
}

/// Leases of one holder on one store, renewed together: one store round trip per renewal
/// interval for all of them. Cheap to clone.
///
/// A service that holds a lease per job (a worker claiming rows, each with its own lease) would
/// otherwise run a renewer task and a round trip per lease per interval. A session holds every
/// lease it grants on one timer and renews them with [`Store::renew_many`](crate::Store::renew_many) (one script,
/// statement or transaction per [`MAX_RENEW_BATCH`] leases); each guard keeps its own token,
/// deadline, stop signal and loss reason, exactly as a guard of a [`Lease`](crate::Lease).
///
/// Names that come and go (a lease per job) would leave a record each behind: a session also
/// purges the records free for longer than a retention ([`DEFAULT_SESSION_RETENTION`], hourly;
/// see [`Purge::purge`](crate::Purge::purge) for why fencing tokens stay safe).
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use leasehold::{LeaseConfig, LeaseName, LeaseSession, MemoryStore, TryAcquire};
/// use std::time::Duration;
///
/// let session = LeaseSession::new(MemoryStore::new(), LeaseConfig::new(Duration::from_secs(60)))?;
/// for job in 0..100 {
///     if let TryAcquire::Acquired(guard) = session.try_acquire(LeaseName::new(format!("job:{job}"))?).await? {
///         // hand `guard` to the job: guard.cancellation_token() fires when the job must stop
///         # drop(guard);
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseSession<S> {
    store: S,
    holder: HolderId,
    config: LeaseConfig,
    tx: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
    names: Names,
}

type Names = Arc<Mutex<HashSet<LeaseName>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<S: Purge> LeaseSession<S> {
    /// A session on `store` whose leases all have `config`'s timing, under a generated holder
    /// id. Starts its renewal task (a tokio runtime must be running).
    pub fn new(store: S, config: LeaseConfig) -> Result<Self, ConfigError> {
        Self::with_holder(store, config, HolderId::generate())
    }

    /// As [`new`](Self::new), under `holder`.
    pub fn with_holder(
        store: S,
        config: LeaseConfig,
        holder: HolderId,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let held = Arc::new(AtomicUsize::new(0));
        let names = Names::default();
        let renewer = SessionRenewer {
            store: store.clone(),
            holder: holder.clone(),
            config,
            members: HashMap::new(),
            names: names.clone(),
            held: held.clone(),
            retention: Some(DEFAULT_SESSION_RETENTION),
        };
        tokio::spawn(renewer.run(rx));
        Ok(Self {
            store,
            holder,
            config,
            tx,
            next_id: Arc::default(),
            held,
            names,
        })
    }

    /// The holder id of every lease of this session.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// The store this session's leases are kept in, for calls of your own (`inspect`, say).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use leasehold::{LeaseConfig, LeaseName, LeaseSession, MemoryStore, Store, TryAcquire};
    ///
    /// let session = LeaseSession::new(MemoryStore::new(), LeaseConfig::default())?;
    /// let job = LeaseName::new("job:7")?;
    /// if let TryAcquire::Acquired(guard) = session.try_acquire(job.clone()).await? {
    ///     let state = session.store().inspect(&job).await?.expect("just acquired");
    ///     assert_eq!(state.token, guard.token());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Sets how long free lease records are kept before this session purges them (hourly);
    /// `None` stops purging. Default [`DEFAULT_SESSION_RETENTION`].
    pub fn purge_after(&self, retention: Option<Duration>) {
        let _ = self.tx.send(Command::Retention(retention));
    }

    /// Leases held now.
    pub fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One attempt to take `name`. A name this session already holds is busy (held by this
    /// session's holder): two jobs of one worker never share a lease.
    pub async fn try_acquire(&self, name: LeaseName) -> Result<TryAcquire, LeaseError> {
        if !lock(&self.names).insert(name.clone()) {
            return Ok(TryAcquire::Busy {
                holder: self.holder.clone(),
                remaining: self.config.ttl,
            });
        }
        let (token, deadline) =
            match acquire_once(&self.store, &name, &self.holder, &self.config).await {
                Ok(Ok(granted)) => granted,
                Ok(Err(busy)) => {
                    lock(&self.names).remove(&name);
                    return Ok(busy);
                }
                Err(e) => {
                    lock(&self.names).remove(&name);
                    return Err(e);
                }
            };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) as u64;
        let shared = Shared::new(deadline);
        let member = Member {
            id,
            name: name.clone(),
            token,
            shared: shared.clone(),
        };
        // The task is gone only if the runtime is shutting down: the guard is then lost at once.
        self.held.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(Command::Add(member)).is_err() {
            self.held.fetch_sub(1, Ordering::Relaxed);
            lock(&self.names).remove(&name);
            shared.end(LossReason::Expired);
        }
        Ok(TryAcquire::Acquired(LeaseGuard::of_session(
            name,
            self.holder.clone(),
            token,
            shared,
            id,
            self.tx.clone(),
        )))
    }
}

struct SessionRenewer<S> {
    store: S,
    holder: HolderId,
    config: LeaseConfig,
    members: HashMap<u64, Held>,
    /// The names held (or being acquired), shared with the handles.
    names: Names,
    held: Arc<AtomicUsize>,
    retention: Option<Duration>,
}

/// One member's answer; a failed store call is shared by its whole batch.
type Reply = Result<Renewal, Arc<StoreError>>;

/// A batch of renewals on its way: when it was sent, and per member the store's answer.
type InFlight =
    std::pin::Pin<Box<dyn std::future::Future<Output = (Instant, Vec<(u64, Reply)>)> + Send>>;

impl<S: Purge> SessionRenewer<S> {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let mut in_flight: Option<InFlight> = None;
        let mut next_renewal = Instant::now() + self.config.renew_interval;
        let mut next_purge = Instant::now() + PURGE_EVERY;
        loop {
            // Members share one renewal cadence; their deadlines differ only by when they
            // joined or last failed, so the earliest is found by a scan at each event.
            let earliest = self.members.values().map(|h| h.deadline).min();
            let warn_at = self
                .members
                .values()
                .filter(|h| !h.member.shared.is_expiring())
                .map(|h| {
                    h.deadline
                        .checked_sub(self.config.stop_margin)
                        .unwrap_or(h.deadline)
                })
                .min();
            let renewing = in_flight.is_some();
            let due = !self.members.is_empty() && !renewing;
            tokio::select! {
                biased;
                () = sleep_until(earliest.unwrap_or(next_renewal)), if earliest.is_some() => {
                    self.expire_overdue();
                }
                cmd = rx.recv() => match cmd {
                    Some(cmd) => {
                        // The first member starts the cadence: an idle session's next renewal
                        // time is long past.
                        if self.members.is_empty() && matches!(cmd, Command::Add(_)) {
                            next_renewal = Instant::now() + self.config.renew_interval;
                        }
                        self.command(cmd);
                    }
                    // Every guard and handle is gone.
                    None => return,
                },
                () = sleep_until(warn_at.unwrap_or(next_renewal)), if warn_at.is_some() => {
                    self.warn_overdue();
                }
                (sent, replies) = in_flight_reply(&mut in_flight), if renewing => {
                    in_flight = None;
                    next_renewal = self.renewed(sent, replies);
                }
                () = sleep_until(next_renewal), if due => {
                    in_flight = Some(self.send_renewals());
                }
                () = sleep_until(next_purge), if self.retention.is_some() => {
                    next_purge = Instant::now() + PURGE_EVERY;
                    self.purge();
                }
            }
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Add(member) => {
                let deadline = member.shared.deadline();
                self.members.insert(member.id, Held { member, deadline });
            }
            Command::Retention(retention) => self.retention = retention,
            Command::Release(id, reply) => {
                // Answered from its own task: many releases at once must not hold up renewals.
                let Some(held) = self.remove(id) else {
                    let _ = reply.send(Ok(Release::NotHeld));
                    return;
                };
                let release = self.releasing(held);
                tokio::spawn(async move {
                    let _ = reply.send(release.await);
                });
            }
            Command::Drop(id) => {
                // Best effort, as a dropped guard of a `Lease`: others need not wait for expiry.
                if let Some(held) = self.remove(id) {
                    tokio::spawn(self.releasing(held));
                }
            }
        }
    }

    /// Frees a removed member's lease in the store, at most a ttl.
    fn releasing(
        &self,
        held: Held,
    ) -> impl std::future::Future<Output = Result<Release, StoreError>> + Send + 'static {
        let (store, holder, ttl) = (self.store.clone(), self.holder.clone(), self.config.ttl);
        async move {
            let release = store.release(&held.member.name, &holder, held.member.token);
            tokio::time::timeout(ttl, release)
                .await
                .unwrap_or(Err(StoreError::Timeout(ttl)))
        }
    }

    /// Purges old free records in the background; a store without purge is left alone.
    fn purge(&mut self) {
        let Some(retention) = self.retention else {
            return;
        };
        let store = self.store.clone();
        tokio::spawn(async move {
            match store.purge(retention).await {
                Ok(n) => tracing::debug!(purged = n, "free lease records purged"),
                Err(StoreError::Unsupported(_)) => {}
                Err(e) => tracing::debug!(error = %e, "purge failed; trying again in an hour"),
            }
        });
    }

    /// Takes a member out of the session (it is no longer renewed).
    fn take(&mut self, id: u64) -> Option<Held> {
        let held = self.members.remove(&id)?;
        lock(&self.names).remove(&held.member.name);
        self.held.fetch_sub(1, Ordering::Relaxed);
        Some(held)
    }

    /// Takes a member out for its release: its work is told to stop first.
    fn remove(&mut self, id: u64) -> Option<Held> {
        let held = self.take(id)?;
        held.member.shared.stop();
        Some(held)
    }

    fn lose(&mut self, held: Held, reason: LossReason) {
        if held.member.shared.end(reason) {
            metrics::counter!("leasehold_leases_lost_total", "reason" => reason.as_str())
                .increment(1);
            tracing::warn!(lease = %held.member.name, token = %held.member.token, %reason, "lease lost");
        }
    }

    fn expire_overdue(&mut self) {
        let now = Instant::now();
        let overdue: Vec<u64> = self
            .members
            .iter()
            .filter(|(_, h)| h.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in overdue {
            if let Some(held) = self.take(id) {
                self.lose(held, LossReason::Expired);
            }
        }
    }

    fn warn_overdue(&mut self) {
        let now = Instant::now();
        let mut told = 0;
        for held in self.members.values() {
            let stop_at = held
                .deadline
                .checked_sub(self.config.stop_margin)
                .unwrap_or(held.deadline);
            if stop_at <= now && !held.member.shared.is_expiring() {
                held.member.shared.warn_expiring();
                told += 1;
            }
        }
        if told > 0 {
            tracing::warn!(
                leases = told,
                "renewal overdue; telling the work to stop before the leases can expire"
            );
        }
    }

    /// Renews every member, [`MAX_RENEW_BATCH`] per store call, the calls one after another.
    fn send_renewals(&self) -> InFlight {
        let leases: Vec<(u64, LeaseName, FencingToken)> = self
            .members
            .iter()
            .map(|(id, h)| (*id, h.member.name.clone(), h.member.token))
            .collect();
        let earliest = self.members.values().map(|h| h.deadline).min();
        let (store, holder, ttl) = (self.store.clone(), self.holder.clone(), self.config.ttl);
        Box::pin(async move {
            let sent = Instant::now();
            let deadline = earliest.unwrap_or(sent + ttl);
            let mut replies = Vec::with_capacity(leases.len());
            for chunk in leases.chunks(MAX_RENEW_BATCH) {
                let batch: Vec<(LeaseName, FencingToken)> =
                    chunk.iter().map(|(_, n, t)| (n.clone(), *t)).collect();
                let answer =
                    tokio::time::timeout_at(deadline, store.renew_many(&holder, &batch, ttl))
                        .await
                        .unwrap_or(Err(StoreError::Timeout(deadline - sent)));
                match answer {
                    Ok(renewals) if renewals.len() == chunk.len() => replies.extend(
                        chunk
                            .iter()
                            .zip(renewals)
                            .map(|((id, _, _), r)| (*id, Ok(r))),
                    ),
                    Ok(renewals) => {
                        let e = Arc::new(StoreError::Corrupt(format!(
                            "renew_many answered {} renewals for {} leases",
                            renewals.len(),
                            chunk.len()
                        )));
                        replies.extend(chunk.iter().map(|(id, _, _)| (*id, Err(e.clone()))));
                    }
                    Err(e) => {
                        let e = Arc::new(e);
                        replies.extend(chunk.iter().map(|(id, _, _)| (*id, Err(e.clone()))));
                    }
                }
            }
            (sent, replies)
        })
    }

    /// Applies a batch's answers; returns when to renew next.
    fn renewed(&mut self, sent: Instant, replies: Vec<(u64, Reply)>) -> Instant {
        let now = Instant::now();
        let mut failed = false;
        for (id, reply) in replies {
            let Some(held) = self.members.get_mut(&id) else {
                continue; // released meanwhile
            };
            // A reply read after the member's deadline is not trusted.
            if now >= held.deadline {
                continue; // expire_overdue ends it
            }
            match reply {
                Ok(Renewal::Renewed) => {
                    held.deadline = sent + self.config.ttl - self.config.drift_margin;
                    held.member.shared.set_deadline(held.deadline);
                }
                Ok(Renewal::Lost) => {
                    if let Some(held) = self.take(id) {
                        self.lose(held, LossReason::TakenOver);
                    }
                }
                Err(e) => {
                    if !failed {
                        tracing::warn!(error = %e, "session renewal failed; retrying");
                    }
                    failed = true;
                }
            }
        }
        if failed {
            now + self.config.retry_interval
        } else {
            sent + self.config.renew_interval
        }
    }
}
