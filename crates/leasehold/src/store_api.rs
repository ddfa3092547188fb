//! The [`Store`] trait: the atomic operations on one lease that every backend provides.
//!
//! Each operation is one round trip and all timing happens on the store's own clock; the client
//! clock is never compared with the store's. "Not acquired" is a value ([`Acquisition::Busy`]),
//! never an error: `Err` means the store could not answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::notify::ReleaseSubscription;
use crate::{FencingToken, HolderId, LeaseName};

/// Boxed error type carried as the source of a [`StoreError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result of a store operation.
pub type StoreResult<T> = std::result::Result<T, StoreError>;

/// The store could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached, or the connection broke mid-request.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What failed, without credentials.
        message: String,
        /// The driver's error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store did not answer within the operation timeout.
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store answered with a refusal: a key of the wrong type, scripts disabled, no permission.
    #[error("store refused the operation: {message}")]
    Rejected {
        /// What the store said, without credentials.
        message: String,
        /// The driver's error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store holds a lease record this library cannot read.
    #[error("unreadable lease record: {0}")]
    Corrupt(String),
    /// This store does not implement the operation (an optional one, such as run history).
    #[error("this store does not implement {0}")]
    Unsupported(&'static str),
}

impl StoreError {
    /// An [`StoreError::Unavailable`] with a source.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A [`StoreError::Rejected`] with a source.
    pub fn rejected(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Rejected {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Whether retrying later may succeed (the store was unreachable or slow, not refusing).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Timeout(_))
    }
}

/// Answer to [`Store::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquisition {
    /// The caller holds the lease with this token: a new tenure, whose token is above every token
    /// handed out for this name before. A holder that acquires again while it still holds the
    /// lease gets a new token too, and its older tenure ends (renew and release with the old
    /// token then answer `Lost` / `NotHeld`).
    Acquired {
        /// The fencing token of this tenure.
        token: FencingToken,
    },
    /// Someone else holds it.
    Busy {
        /// The current holder.
        holder: HolderId,
        /// Time left on the holder's lease, on the store's clock.
        remaining: Duration,
    },
}

/// Answer to [`Store::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended by the requested ttl from the store's now.
    Renewed,
    /// The caller no longer holds the lease with that token (expired, taken over or released).
    Lost,
}

/// Answer to [`Store::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The lease is free now.
    Released,
    /// The caller did not hold it with that token; nothing changed.
    NotHeld,
}

/// Answer to [`Store::claim_slot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotClaim {
    /// First claim of this slot anywhere: run it.
    Claimed,
    /// This slot, or a later one, was already claimed: do not run it.
    AlreadyRun {
        /// The highest slot claimed so far.
        last: u64,
    },
}

/// What [`Store::inspect`] sees of a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseState {
    /// The current holder, if the lease is held and not expired.
    pub holder: Option<HolderId>,
    /// The last token handed out for this name (kept after release and expiry).
    pub token: FencingToken,
    /// Time left on the current holder's lease; zero when free.
    pub remaining: Duration,
}

/// A lease store. Every method is atomic and one round trip; timing uses the store's clock.
///
/// Implementations are cheap to clone (they share a connection or pool).
pub trait Store: Send + Sync + Clone + 'static {
    /// Takes the lease for `ttl` if it is free, expired, or held by `holder` itself; it is busy
    /// only while another holder's tenure is live.
    ///
    /// **Every `Acquired` starts a new tenure with a new token**, strictly above every token
    /// handed out for this name before; re-acquiring by the current holder replaces its older
    /// tenure rather than renewing it. This makes a token name exactly one tenure: an old guard's
    /// renew or release (say, one dropped just before this acquire) can never touch the new one.
    /// The first token of a name the store has never seen is seeded from the store's clock
    /// (milliseconds since the epoch × 1000), so a recreated table, file or key space never hands
    /// out a token below one handed out before.
    fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Acquisition>> + Send;

    /// Extends the lease to `ttl` from now if `holder` holds it with `token` and it has not
    /// expired.
    fn renew(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Renewal>> + Send;

    /// Renews many leases of `holder` at once, answering in the order given: each as
    /// [`renew`](Self::renew) would. A [`LeaseSession`](crate::LeaseSession) calls it with up to
    /// [`MAX_RENEW_BATCH`](crate::MAX_RENEW_BATCH) leases; stores override it to do that in one
    /// round trip. The default renews one after another.
    fn renew_many(
        &self,
        holder: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<Renewal>>> + Send {
        async move {
            let mut renewals = Vec::with_capacity(leases.len());
            for (name, token) in leases {
                renewals.push(self.renew(name, holder, *token, ttl).await?);
            }
            Ok(renewals)
        }
    }

    /// Frees the lease if `holder` holds it with `token`. The token counter is kept.
    fn release(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
    ) -> impl Future<Output = StoreResult<Release>> + Send;

    /// Deletes the records of leases that have been free (released or expired) for at least
    /// `retention`, so a store that sees many distinct names (a lease per job) does not grow
    /// without bound; returns how many it deleted. Slot claims and history are kept.
    ///
    /// Fencing stays safe: a purged name's next token is seeded from the store's clock
    /// (ms × 1000) like any new name's, above every token handed out for it before, unless the
    /// store's clock stepped back by more than `retention` or the name was acquired more than a
    /// thousand times per millisecond on average.
    fn purge(&self, retention: Duration) -> impl Future<Output = StoreResult<u64>> + Send {
        let _ = retention;
        std::future::ready(Err(unsupported("purge")))
    }

    /// Reads the lease without changing it. `None` when the name was never acquired.
    fn inspect(
        &self,
        name: &LeaseName,
    ) -> impl Future<Output = StoreResult<Option<LeaseState>>> + Send;

    /// Records `slot` as run for `task` if it is above every slot claimed so far.
    fn claim_slot(
        &self,
        task: &LeaseName,
        slot: u64,
    ) -> impl Future<Output = StoreResult<SlotClaim>> + Send;

    /// The store's clock, in milliseconds since the Unix epoch. Schedules derive slots from it.
    fn now_millis(&self) -> impl Future<Output = StoreResult<u64>> + Send;

    /// The highest slot claimed for `task`, `None` if none was. Catch-up and the run history
    /// compare it with the slots due.
    fn last_slot(&self, task: &LeaseName) -> impl Future<Output = StoreResult<Option<u64>>> + Send {
        let _ = task;
        std::future::ready(Err(unsupported("last_slot")))
    }

    /// Stores `entry` (opaque text: a [`RunRecord`](crate::history::RunRecord) as JSON) under
    /// `key` in `task`'s history, replacing an entry with the same key, and keeps only the `keep`
    /// entries with the highest keys; `keep` 0 counts as 1, so a write never empties a history.
    /// One round trip.
    fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let _ = (task, key, entry, keep);
        std::future::ready(Err(unsupported("record_history")))
    }

    /// Up to `limit` entries of `task`'s history, highest key first.
    fn history(
        &self,
        task: &LeaseName,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<String>>> + Send {
        let _ = (task, limit);
        std::future::ready(Err(unsupported("history")))
    }

    /// Refreshes `member`'s entry in `group`'s membership, to expire `ttl` from now on the store's
    /// clock, drops the entries that have expired, and answers the live members, sorted. One round
    /// trip. A [`Scheduler::spread`](crate::Scheduler::spread) heartbeats through it and places
    /// its tasks over the answer. Optional: the default answers [`StoreError::Unsupported`].
    fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<HolderId>>> + Send {
        let _ = (group, member, ttl);
        std::future::ready(Err(unsupported("members")))
    }

    /// Removes `member` from `group`'s membership at once (a graceful shutdown), so the others
    /// need not wait for its entry to expire. Removing an absent member is not an error.
    fn leave(
        &self,
        group: &LeaseName,
        member: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let _ = (group, member);
        std::future::ready(Err(unsupported("leave")))
    }

    /// A subscription to release notifications, or `None` if this store has none (then waiters
    /// poll). Subscribe *before* the acquire attempt whose `Busy` you will wait on.
    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        None
    }

    /// A one-line description for logs and status, with any password removed.
    fn describe(&self) -> String;
}

fn unsupported(what: &'static str) -> StoreError {
    StoreError::Unsupported(what)
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe mirror of [`Store`], so a store chosen at run time (from a URL) fits in a
/// [`BoxStore`].
trait DynStore: Send + Sync {
    fn acquire<'a>(
        &'a self,
        name: &'a LeaseName,
        holder: &'a HolderId,
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquisition>>;
    fn renew<'a>(
        &'a self,
        name: &'a LeaseName,
        holder: &'a HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Renewal>>;
    fn renew_many<'a>(
        &'a self,
        holder: &'a HolderId,
        leases: &'a [(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Vec<Renewal>>>;
    fn release<'a>(
        &'a self,
        name: &'a LeaseName,
        holder: &'a HolderId,
        token: FencingToken,
    ) -> BoxFuture<'a, StoreResult<Release>>;
    fn purge(&self, retention: Duration) -> BoxFuture<'_, StoreResult<u64>>;
    fn inspect<'a>(&'a self, name: &'a LeaseName)
    -> BoxFuture<'a, StoreResult<Option<LeaseState>>>;
    fn claim_slot<'a>(
        &'a self,
        task: &'a LeaseName,
        slot: u64,
    ) -> BoxFuture<'a, StoreResult<SlotClaim>>;
    fn now_millis(&self) -> BoxFuture<'_, StoreResult<u64>>;
    fn last_slot<'a>(&'a self, task: &'a LeaseName) -> BoxFuture<'a, StoreResult<Option<u64>>>;
    fn record_history<'a>(
        &'a self,
        task: &'a LeaseName,
        key: u64,
        entry: &'a str,
        keep: usize,
    ) -> BoxFuture<'a, StoreResult<()>>;
    fn history<'a>(
        &'a self,
        task: &'a LeaseName,
        limit: usize,
    ) -> BoxFuture<'a, StoreResult<Vec<String>>>;
    fn members<'a>(
        &'a self,
        group: &'a LeaseName,
        member: &'a HolderId,
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Vec<HolderId>>>;
    fn leave<'a>(
        &'a self,
        group: &'a LeaseName,
        member: &'a HolderId,
    ) -> BoxFuture<'a, StoreResult<()>>;
    fn subscribe_releases(&self) -> Option<ReleaseSubscription>;
    fn describe(&self) -> String;
}

impl<S: Store> DynStore for S {
    fn acquire<'a>(
        &'a self,
        name: &'a LeaseName,
        holder: &'a HolderId,
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquisition>> {
        Box::pin(Store::acquire(self, name, holder, ttl))
    }
    fn renew<'a>(
        &'a self,
        name: &'a LeaseName,
        holder: &'a HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Renewal>> {
        Box::pin(Store::renew(self, name, holder, token, ttl))
    }
    fn renew_many<'a>(
        &'a self,
        holder: &'a HolderId,
        leases: &'a [(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Vec<Renewal>>> {
        Box::pin(Store::renew_many(self, holder, leases, ttl))
    }
    fn release<'a>(
        &'a self,
        name: &'a LeaseName,
        holder: &'a HolderId,
        token: FencingToken,
    ) -> BoxFuture<'a, StoreResult<Release>> {
        Box::pin(Store::release(self, name, holder, token))
    }
    fn purge(&self, retention: Duration) -> BoxFuture<'_, StoreResult<u64>> {
        Box::pin(Store::purge(self, retention))
    }
    fn inspect<'a>(
        &'a self,
        name: &'a LeaseName,
    ) -> BoxFuture<'a, StoreResult<Option<LeaseState>>> {
        Box::pin(Store::inspect(self, name))
    }
    fn claim_slot<'a>(
        &'a self,
        task: &'a LeaseName,
        slot: u64,
    ) -> BoxFuture<'a, StoreResult<SlotClaim>> {
        Box::pin(Store::claim_slot(self, task, slot))
    }
    fn now_millis(&self) -> BoxFuture<'_, StoreResult<u64>> {
        Box::pin(Store::now_millis(self))
    }
    fn last_slot<'a>(&'a self, task: &'a LeaseName) -> BoxFuture<'a, StoreResult<Option<u64>>> {
        Box::pin(Store::last_slot(self, task))
    }
    fn record_history<'a>(
        &'a self,
        task: &'a LeaseName,
        key: u64,
        entry: &'a str,
        keep: usize,
    ) -> BoxFuture<'a, StoreResult<()>> {
        Box::pin(Store::record_history(self, task, key, entry, keep))
    }
    fn history<'a>(
        &'a self,
        task: &'a LeaseName,
        limit: usize,
    ) -> BoxFuture<'a, StoreResult<Vec<String>>> {
        Box::pin(Store::history(self, task, limit))
    }
    fn members<'a>(
        &'a self,
        group: &'a LeaseName,
        member: &'a HolderId,
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Vec<HolderId>>> {
        Box::pin(Store::members(self, group, member, ttl))
    }
    fn leave<'a>(
        &'a self,
        group: &'a LeaseName,
        member: &'a HolderId,
    ) -> BoxFuture<'a, StoreResult<()>> {
        Box::pin(Store::leave(self, group, member))
    }
    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        Store::subscribe_releases(self)
    }
    fn describe(&self) -> String {
        Store::describe(self)
    }
}

/// Any [`Store`] behind one type, for stores chosen at run time (the CLI picks one from a URL).
#[derive(Clone)]
pub struct BoxStore(Arc<dyn DynStore>);

impl BoxStore {
    /// Erases the type of `store`.
    pub fn new(store: impl Store) -> Self {
        Self(Arc::new(store))
    }
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxStore").field(&self.0.describe()).finish()
    }
}

impl Store for BoxStore {
    fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Acquisition>> + Send {
        // Owned copies: the boxed future cannot borrow several caller lifetimes at once.
        let (store, name, holder) = (self.0.clone(), name.clone(), holder.clone());
        async move { store.acquire(&name, &holder, ttl).await }
    }
    fn renew(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Renewal>> + Send {
        let (store, name, holder) = (self.0.clone(), name.clone(), holder.clone());
        async move { store.renew(&name, &holder, token, ttl).await }
    }
    fn renew_many(
        &self,
        holder: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<Renewal>>> + Send {
        let (store, holder, leases) = (self.0.clone(), holder.clone(), leases.to_vec());
        async move { store.renew_many(&holder, &leases, ttl).await }
    }
    fn release(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
    ) -> impl Future<Output = StoreResult<Release>> + Send {
        let (store, name, holder) = (self.0.clone(), name.clone(), holder.clone());
        async move { store.release(&name, &holder, token).await }
    }
    fn purge(&self, retention: Duration) -> impl Future<Output = StoreResult<u64>> + Send {
        let store = self.0.clone();
        async move { store.purge(retention).await }
    }
    fn inspect(
        &self,
        name: &LeaseName,
    ) -> impl Future<Output = StoreResult<Option<LeaseState>>> + Send {
        let (store, name) = (self.0.clone(), name.clone());
        async move { store.inspect(&name).await }
    }
    fn claim_slot(
        &self,
        task: &LeaseName,
        slot: u64,
    ) -> impl Future<Output = StoreResult<SlotClaim>> + Send {
        let (store, task) = (self.0.clone(), task.clone());
        async move { store.claim_slot(&task, slot).await }
    }
    fn now_millis(&self) -> impl Future<Output = StoreResult<u64>> + Send {
        self.0.now_millis()
    }
    fn last_slot(&self, task: &LeaseName) -> impl Future<Output = StoreResult<Option<u64>>> + Send {
        let (store, task) = (self.0.clone(), task.clone());
        async move { store.last_slot(&task).await }
    }
    fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let (store, task, entry) = (self.0.clone(), task.clone(), entry.to_owned());
        async move { store.record_history(&task, key, &entry, keep).await }
    }
    fn history(
        &self,
        task: &LeaseName,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<String>>> + Send {
        let (store, task) = (self.0.clone(), task.clone());
        async move { store.history(&task, limit).await }
    }
    fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<HolderId>>> + Send {
        let (store, group, member) = (self.0.clone(), group.clone(), member.clone());
        async move { store.members(&group, &member, ttl).await }
    }
    fn leave(
        &self,
        group: &LeaseName,
        member: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let (store, group, member) = (self.0.clone(), group.clone(), member.clone());
        async move { store.leave(&group, &member).await }
    }
    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.0.subscribe_releases()
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

/// What a store operation was about, for store implementations' error messages: displays as
/// `acquire of NAME`, or just `what` when no lease is involved.
#[derive(Debug, Clone, Copy)]
pub struct Operation<'a> {
    /// The operation: `acquire`, `renew`, `claim_slot`, ...
    pub what: &'static str,
    /// The lease (or task) it was about, if any.
    pub name: Option<&'a LeaseName>,
}

impl<'a> Operation<'a> {
    /// The operation `what`, about the lease or task `name` if any.
    pub fn new(what: &'static str, name: Option<&'a LeaseName>) -> Self {
        Self { what, name }
    }
}

impl fmt::Display for Operation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name {
            Some(name) => write!(f, "{} of {name}", self.what),
            None => f.write_str(self.what),
        }
    }
}
