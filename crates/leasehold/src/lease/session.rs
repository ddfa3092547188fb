//! Many leases renewed together; see [`LeaseSession`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::lease::config::{ConfigError, LeaseConfig};
use crate::lease::guard::{LeaseError, LeaseGuard, TryAcquire, acquire_once};
use crate::lease::renewer::{self, Command, Link, Member, Members, Renewer, Reply};
use crate::lease::tenure::{LossReason, Tenure, lock};
use crate::store::error::StoreError;
use crate::store::name::{HolderId, LeaseName};
use crate::store::token::FencingToken;
use crate::store::traits::Purge;

/// The most leases a [`LeaseSession`] renews in one [`Store::renew_many`](crate::Store::renew_many) call.
pub const MAX_RENEW_BATCH: usize = 1000;

/// How long a free lease record is kept before a [`LeaseSession`] purges it, unless told
/// otherwise.
pub const DEFAULT_SESSION_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How often a session purges.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

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
    retention: Retention,
}

/// The names held (or being acquired), shared by the handles and the renewer.
type Names = Arc<Mutex<HashSet<LeaseName>>>;

/// How long free records are kept before a purge; `None`: no purging.
type Retention = Arc<Mutex<Option<Duration>>>;

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
        let retention = Arc::new(Mutex::new(Some(DEFAULT_SESSION_RETENTION)));
        let members = SessionMembers {
            members: HashMap::new(),
            names: names.clone(),
            held: held.clone(),
            retention: retention.clone(),
            next_purge: Instant::now() + PURGE_EVERY,
        };
        let renewer = Renewer::new(store.clone(), holder.clone(), config, members);
        tokio::spawn(renewer.run(rx));
        Ok(Self {
            store,
            holder,
            config,
            tx,
            next_id: Arc::default(),
            held,
            names,
            retention,
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

    /// Sets how long free lease records are kept before this session purges them (hourly,
    /// from the session's start); `None` stops purging. Default [`DEFAULT_SESSION_RETENTION`].
    pub fn purge_after(&self, retention: Option<Duration>) {
        *lock(&self.retention) = retention;
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
        let tenure = Tenure::new(deadline);
        let member = Member::new(id, name.clone(), token, tenure.clone());
        // The task is gone only if the runtime is shutting down: the guard is then lost at once.
        self.held.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(Command::Add(member)).is_err() {
            self.held.fetch_sub(1, Ordering::Relaxed);
            lock(&self.names).remove(&name);
            tenure.end(LossReason::Expired);
        }
        let renewer = Link::Member {
            id,
            tx: self.tx.clone(),
        };
        Ok(TryAcquire::Acquired(LeaseGuard::renewed_by(
            name,
            self.holder.clone(),
            token,
            tenure,
            renewer,
        )))
    }
}

/// A session's members, renewed with [`Store::renew_many`](crate::Store::renew_many), and what
/// the session keeps beside them: the names and count it holds, and the hourly purge.
struct SessionMembers {
    members: HashMap<u64, Member>,
    names: Names,
    held: Arc<AtomicUsize>,
    retention: Retention,
    next_purge: Instant,
}

impl<S: Purge> Members<S> for SessionMembers {
    fn iter(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Member> {
        self.members.get_mut(&id)
    }

    fn insert(&mut self, member: Member) {
        self.members.insert(member.id, member);
    }

    fn remove(&mut self, id: u64) -> Option<Member> {
        self.members.remove(&id)
    }

    /// [`MAX_RENEW_BATCH`] leases per store call, the calls one after another.
    async fn renew(
        store: S,
        holder: HolderId,
        leases: Vec<(u64, LeaseName, FencingToken)>,
        ttl: Duration,
        deadline: Instant,
    ) -> Vec<(u64, Reply)> {
        let mut replies = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(MAX_RENEW_BATCH) {
            let batch: Vec<(LeaseName, FencingToken)> =
                chunk.iter().map(|(_, n, t)| (n.clone(), *t)).collect();
            let answer = renewer::within(deadline, store.renew_many(&holder, &batch, ttl)).await;
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
        replies
    }

    /// Frees the name for a new acquisition, and counts the lease out.
    fn ended(&mut self, id: u64) {
        if let Some(member) = self.members.get(&id) {
            lock(&self.names).remove(&member.name);
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn chore_at(&self) -> Option<Instant> {
        Some(self.next_purge)
    }

    /// Purges old free records in the background, if purging is on; a store without purge is
    /// left alone.
    fn chore(&mut self, store: &S) {
        self.next_purge = Instant::now() + PURGE_EVERY;
        let Some(retention) = *lock(&self.retention) else {
            return;
        };
        let store = store.clone();
        tokio::spawn(async move {
            match store.purge(retention).await {
                Ok(n) => tracing::debug!(purged = n, "free lease records purged"),
                Err(StoreError::Unsupported(_)) => {}
                Err(e) => tracing::debug!(error = %e, "purge failed; trying again in an hour"),
            }
        });
    }
}
