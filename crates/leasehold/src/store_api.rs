//! The [`Store`] trait (the atomic operations on one lease that every backend provides), the
//! capability traits beside it ([`Slots`], [`Purge`], [`Membership`],
//! [`Catalog`]), and the two ways to wrap
//! any store: [`Layer`] (the same thing around every operation) and [`BoxStore`] (type erasure).
//!
//! Each operation is one round trip and all timing happens on the store's own clock; the client
//! clock is never compared with the store's. "Not acquired" is a value ([`Acquisition::Busy`]),
//! never an error: `Err` means the store could not answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::catalog::{ControlRead, LeaseRecord, Registration, TaskRecord, Versioned};
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

/// Answer to [`Slots::claim_slot`].
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

/// What [`Slots::tick`] is asked: the store's half of a gated tick of `task`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct TickRequest<'a> {
    /// The task: its lease, slot record and control record.
    pub task: &'a LeaseName,
    /// Who takes the task lease.
    pub holder: &'a HolderId,
    /// The task lease's ttl.
    pub ttl: Duration,
    /// The slot to claim (ms on the store's clock), named by the caller's idea of that clock.
    pub slot: u64,
    /// The slot after it, if there is one. The claim is made only while the store's clock is
    /// at or past `slot` and before `next`, so a slot named from a stale idea of the clock is
    /// never claimed in place of the one due.
    pub next: Option<u64>,
}

impl<'a> TickRequest<'a> {
    /// A tick of `task` by `holder` (task lease ttl `ttl`) for `slot`, before `next`.
    pub fn new(
        task: &'a LeaseName,
        holder: &'a HolderId,
        ttl: Duration,
        slot: u64,
        next: Option<u64>,
    ) -> Self {
        Self {
            task,
            holder,
            ttl,
            slot,
            next,
        }
    }
}

/// Answer to [`Slots::tick`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickAnswer {
    /// The store's clock when it decided, ms since the Unix epoch.
    pub now_ms: u64,
    /// The task's control record, where the store read it ([`Capabilities::TICK`]).
    pub control: Option<crate::catalog::Versioned>,
    /// What happened.
    pub claim: TickClaim,
}

impl TickAnswer {
    /// The store's clock `now_ms`, the control record if read, and what happened.
    pub fn new(now_ms: u64, control: Option<crate::catalog::Versioned>, claim: TickClaim) -> Self {
        Self {
            now_ms,
            control,
            claim,
        }
    }
}

/// What [`Slots::tick`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickClaim {
    /// The task lease is taken (a new tenure with this token) and the slot claimed: run it.
    Claimed {
        /// The task lease's fencing token.
        token: FencingToken,
    },
    /// The store's clock is not in `[slot, next)`: nothing was done; `now_ms` names the slot.
    OutsideSlot,
    /// The task's control record pauses it: nothing was done (the caller records the slot).
    Paused,
    /// Another holder has the task lease: nothing was done.
    Busy {
        /// The current holder.
        holder: HolderId,
        /// Time left on its lease.
        remaining: Duration,
        /// The highest slot claimed so far, if any.
        last: Option<u64>,
    },
    /// This slot, or a later one, was already claimed: the task lease was not taken.
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

/// What a store implements beyond leases: the capability traits whose operations it answers.
/// Declared by [`Store::capabilities`] and checked where they are needed (a
/// [`Scheduler`](crate::Scheduler) checks when it starts), so a store that lacks one is named at
/// start, not met as [`StoreError::Unsupported`] in the middle of a run.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities(u8);

impl Capabilities {
    /// No capability beyond leases.
    pub const NONE: Self = Self(0);
    /// [`Slots`]: slot claims and run history, for a scheduler's gated ticks.
    pub const SLOTS: Self = Self(1);
    /// [`Purge`]: deleting the records of leases free for long.
    pub const PURGE: Self = Self(1 << 1);
    /// [`Membership`]: the live members of a group, for spreading tasks over instances.
    pub const MEMBERSHIP: Self = Self(1 << 2);
    /// [`Catalog`]: the tasks instances run, and fleet-wide pause and trigger.
    pub const CATALOG: Self = Self(1 << 3);
    /// Every capability of records a store keeps (slots, purge, membership, catalog).
    /// [`TICK`](Self::TICK), a property of how a store answers, is declared on its own.
    pub const ALL: Self = Self(0b1111);
    /// [`Slots::tick`] reads the task's control record (pause) itself, with the clock, the task
    /// lease and the slot claim: a gated tick is then one call (on a server, one round trip).
    /// Without it the gate reads the control record first, then acquires and claims.
    pub const TICK: Self = Self(1 << 4);

    const NAMES: [(Self, &'static str); 5] = [
        (Self::SLOTS, "slots"),
        (Self::PURGE, "purge"),
        (Self::MEMBERSHIP, "membership"),
        (Self::CATALOG, "catalog"),
        (Self::TICK, "tick"),
    ];

    /// Both sets together.
    #[must_use]
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether every capability of `other` is in this set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The capabilities of `needed` that this set lacks.
    #[must_use]
    pub const fn missing(self, needed: Self) -> Self {
        Self(needed.0 & !self.0)
    }

    /// This set less the capabilities of `other`.
    #[must_use]
    pub const fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Capabilities {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        self.union(other)
    }
}

impl fmt::Display for Capabilities {
    /// `slots, purge, membership, catalog`, or `leases only`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("leases only");
        }
        let names = Self::NAMES
            .iter()
            .filter(|(flag, _)| self.contains(*flag))
            .map(|(_, name)| *name);
        for (i, name) in names.enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Capabilities({self})")
    }
}

/// The answer a capability's default method gives: this store does not implement `what`.
pub fn unsupported<T>(what: &'static str) -> std::future::Ready<StoreResult<T>> {
    std::future::ready(Err(StoreError::Unsupported(what)))
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A successful answer, as the `result` label of [`Metered`](crate::store::Metered) names it.
pub trait Answer: Send + 'static {
    /// `acquired`, `busy`, `renewed`, `lost`, ... where the answer has a meaning; `ok` else.
    fn label(&self) -> &'static str {
        "ok"
    }
}

impl Answer for Acquisition {
    fn label(&self) -> &'static str {
        match self {
            Self::Acquired { .. } => "acquired",
            Self::Busy { .. } => "busy",
        }
    }
}

impl Answer for Renewal {
    fn label(&self) -> &'static str {
        match self {
            Self::Renewed => "renewed",
            Self::Lost => "lost",
        }
    }
}

/// A batch is `lost` when any lease in it was.
impl Answer for Vec<Renewal> {
    fn label(&self) -> &'static str {
        match self.contains(&Renewal::Lost) {
            true => "lost",
            false => "renewed",
        }
    }
}

impl Answer for Release {
    fn label(&self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotHeld => "not-held",
        }
    }
}

impl Answer for SlotClaim {
    fn label(&self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::AlreadyRun { .. } => "already-run",
        }
    }
}

impl Answer for () {}
impl Answer for u64 {}
impl Answer for Option<u64> {}
impl Answer for Option<LeaseState> {}

impl Answer for TickAnswer {
    fn label(&self) -> &'static str {
        match self.claim {
            TickClaim::Claimed { .. } => "claimed",
            TickClaim::OutsideSlot => "outside-slot",
            TickClaim::Paused => "paused",
            TickClaim::Busy { .. } => "busy",
            TickClaim::AlreadyRun { .. } => "already-run",
        }
    }
}
impl Answer for Vec<String> {}
impl Answer for Vec<HolderId> {}
impl Answer for Option<Versioned> {}
impl Answer for Vec<TaskRecord> {}
impl Answer for Vec<LeaseRecord> {}
impl Answer for ControlRead {}

/// A wrapper around any store that does the same thing around each of its operations: a time
/// limit ([`Timeout`](crate::store::Timeout)), metrics ([`Metered`](crate::store::Metered)),
/// injected faults. Implement [`around`](Self::around) once; every operation of every
/// capability the inner store has is forwarded through it.
pub trait Layer: Send + Sync + Clone + 'static {
    /// The store inside.
    type Inner: Store;

    /// The store inside.
    fn inner(&self) -> &Self::Inner;

    /// Answers in place of the inner store's operation `op` (`acquire`, `claim_slot`, ...),
    /// which `call` starts. Some stores do their work when the operation is called, not when its
    /// future is polled, so a layer that must not reach the store (an injected outage) does not
    /// call `call` at all.
    fn around<'a, T: Answer, F>(
        &'a self,
        op: &'static str,
        call: impl FnOnce() -> F + Send + 'a,
    ) -> impl Future<Output = StoreResult<T>> + Send + 'a
    where
        F: Future<Output = StoreResult<T>> + Send + 'a;

    /// The one-line description ([`Store::describe`]): the inner store's, unless the layer
    /// says more.
    fn description(&self) -> String {
        Store::describe(self.inner())
    }

    /// The capabilities ([`Store::capabilities`]): the inner store's, unless the layer takes
    /// some away.
    fn capabilities_offered(&self) -> Capabilities {
        Store::capabilities(self.inner())
    }
}

/// Defines the lease trait and each capability trait from one list of operations, and from the
/// same list forwards every operation through [`Layer`]s and [`BoxStore`]. Adding an operation is
/// one entry here (plus its implementation in each store).
macro_rules! store_traits {
    (
        $(#[$lease_meta:meta])*
        lease trait Store [$lease_dyn:ident] { $($lease_ops:tt)* }
        $(
            $(#[$cap_meta:meta])*
            capability trait $cap:ident [$cap_dyn:ident] { $($cap_ops:tt)* }
        )*
    ) => {
        store_traits!(@ops Store [$lease_dyn] [$(#[$lease_meta])*] [Send + Sync + Clone + 'static]
            [
                /// A subscription to release notifications, or `None` if this store has none
                /// (then waiters poll). Subscribe *before* the acquire attempt whose `Busy` you
                /// will wait on.
                fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
                    None
                }

                /// A one-line description for logs and status, with any password removed.
                fn describe(&self) -> String;

                /// The capability traits whose operations this store implements; the others
                /// answer [`StoreError::Unsupported`]. Default: none.
                fn capabilities(&self) -> Capabilities {
                    Capabilities::NONE
                }
            ]
            [
                fn subscribe_releases(&self) -> Option<ReleaseSubscription>;
                fn describe(&self) -> String;
                fn capabilities(&self) -> Capabilities;
            ]
            [
                fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
                    Store::subscribe_releases(self)
                }
                fn describe(&self) -> String {
                    Store::describe(self)
                }
                fn capabilities(&self) -> Capabilities {
                    Store::capabilities(self)
                }
            ]
            [
                fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
                    self.0.subscribe_releases()
                }
                fn describe(&self) -> String {
                    self.0.describe()
                }
                fn capabilities(&self) -> Capabilities {
                    self.0.capabilities()
                }
            ]
            [
                fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
                    Store::subscribe_releases(self.inner())
                }
                fn describe(&self) -> String {
                    Layer::description(self)
                }
                fn capabilities(&self) -> Capabilities {
                    Layer::capabilities_offered(self)
                }
            ]
            $($lease_ops)*
        );
        $(
            store_traits!(@ops $cap [$cap_dyn] [$(#[$cap_meta])*] [Store] [] [] [] [] [] $($cap_ops)*);
        )*

        /// Every operation of every capability, object-safe, for [`BoxStore`].
        trait AnyStore: $lease_dyn $(+ $cap_dyn)* {}
        impl<S: Store $(+ $cap)*> AnyStore for S {}
    };

    // One trait: its definition, its object-safe mirror and that mirror's blanket impl, and its
    // impls for `BoxStore` and for every `Layer`. The bracketed groups are the lease trait's
    // items that are not operations (empty for a capability).
    (@ops $trait:ident [$dyn:ident] [$($meta:tt)*] [$($super:tt)*]
        [$($extra:tt)*] [$($extra_dyn:tt)*] [$($extra_blanket:tt)*] [$($extra_box:tt)*] [$($extra_layer:tt)*]
        $(
            $(#[$op_meta:meta])*
            fn $op:ident(&$self:ident $(, $arg:ident : $ty:ty)* $(,)?) -> $out:ty
                $({ $($default:tt)* })? $(;)?
        )*
    ) => {
        $($meta)*
        pub trait $trait: $($super)* {
            $(
                store_traits!(@decl [$(#[$op_meta])*] $op $self [$($arg : $ty),*] $out [$($($default)*)?]);
            )*
            $($extra)*
        }

        trait $dyn: Send + Sync {
            $(
                fn $op<'a>(&'a $self $(, $arg: $ty)*) -> BoxFuture<'a, StoreResult<$out>>;
            )*
            $($extra_dyn)*
        }

        impl<S: $trait> $dyn for S {
            $(
                fn $op<'a>(&'a $self $(, $arg: $ty)*) -> BoxFuture<'a, StoreResult<$out>> {
                    Box::pin(<S as $trait>::$op($self $(, $arg)*))
                }
            )*
            $($extra_blanket)*
        }

        impl $trait for BoxStore {
            $(
                fn $op<'a>(&'a $self $(, $arg: $ty)*)
                    -> impl Future<Output = StoreResult<$out>> + Send + 'a {
                    $dyn::$op(&*$self.0 $(, $arg)*)
                }
            )*
            $($extra_box)*
        }

        impl<L: Layer> $trait for L
        where
            L::Inner: $trait,
        {
            $(
                fn $op<'a>(&'a $self $(, $arg: $ty)*)
                    -> impl Future<Output = StoreResult<$out>> + Send + 'a {
                    Layer::around($self, stringify!($op), move || <L::Inner as $trait>::$op($self.inner() $(, $arg)*))
                }
            )*
            $($extra_layer)*
        }
    };

    (@decl [$($meta:tt)*] $op:ident $self:ident [$($arg:ident : $ty:ty),*] $out:ty []) => {
        $($meta)*
        fn $op<'a>(&'a $self $(, $arg: $ty)*) -> impl Future<Output = StoreResult<$out>> + Send + 'a;
    };
    (@decl [$($meta:tt)*] $op:ident $self:ident [$($arg:ident : $ty:ty),*] $out:ty [$($default:tt)+]) => {
        $($meta)*
        fn $op<'a>(&'a $self $(, $arg: $ty)*) -> impl Future<Output = StoreResult<$out>> + Send + 'a {
            $($default)+
        }
    };
}

store_traits! {
    /// A lease store: the atomic operations on one lease. Every method is one round trip and all
    /// timing uses the store's clock. What a store does beyond leases is in the capability
    /// traits ([`Slots`], [`Purge`], [`Membership`], [`Catalog`]); a store implements each (an empty `impl`
    /// takes the defaults, which answer [`StoreError::Unsupported`]) and declares the ones it
    /// really answers in [`capabilities`](Self::capabilities).
    ///
    /// Implementations are cheap to clone (they share a connection or pool). Implement the
    /// methods as `async fn` with ordinary (elided) lifetimes.
    lease trait Store [DynStore] {
        /// Takes the lease for `ttl` if it is free, expired, or held by `holder` itself; it is
        /// busy only while another holder's tenure is live.
        ///
        /// **Every `Acquired` starts a new tenure with a new token**, strictly above every token
        /// handed out for this name before; re-acquiring by the current holder replaces its older
        /// tenure rather than renewing it. This makes a token name exactly one tenure: an old
        /// guard's renew or release (say, one dropped just before this acquire) can never touch
        /// the new one. The first token of a name the store has never seen is seeded from the
        /// store's clock (milliseconds since the epoch × 1000), so a recreated table, file or key
        /// space never hands out a token below one handed out before.
        fn acquire(&self, name: &'a LeaseName, holder: &'a HolderId, ttl: Duration) -> Acquisition;

        /// Extends the lease to `ttl` from now if `holder` holds it with `token` and it has not
        /// expired.
        fn renew(
            &self,
            name: &'a LeaseName,
            holder: &'a HolderId,
            token: FencingToken,
            ttl: Duration,
        ) -> Renewal;

        /// Renews many leases of `holder` at once, answering in the order given: each as
        /// [`renew`](Self::renew) would. A [`LeaseSession`](crate::LeaseSession) calls it with
        /// up to [`MAX_RENEW_BATCH`](crate::MAX_RENEW_BATCH) leases; stores override it to do that
        /// in one round trip. The default renews one after another.
        fn renew_many(
            &self,
            holder: &'a HolderId,
            leases: &'a [(LeaseName, FencingToken)],
            ttl: Duration,
        ) -> Vec<Renewal> {
            async move {
                let mut renewals = Vec::with_capacity(leases.len());
                for (name, token) in leases {
                    renewals.push(self.renew(name, holder, *token, ttl).await?);
                }
                Ok(renewals)
            }
        }

        /// Frees the lease if `holder` holds it with `token`. The token counter is kept.
        fn release(&self, name: &'a LeaseName, holder: &'a HolderId, token: FencingToken) -> Release;

        /// Reads the lease without changing it. `None` when the name was never acquired.
        fn inspect(&self, name: &'a LeaseName) -> Option<LeaseState>;

        /// The store's clock, in milliseconds since the Unix epoch. Schedules derive slots from it.
        fn now_millis(&self) -> u64;
    }

    /// Slot claims and run history: what a [`Scheduler`](crate::Scheduler) needs so that a
    /// timer tick runs on one instance only, and what `leasehold history` reads.
    /// [`Capabilities::SLOTS`].
    capability trait Slots [DynSlots] {
        /// Records `slot` as run for `task` if it is above every slot claimed so far.
        fn claim_slot(&self, task: &'a LeaseName, slot: u64) -> SlotClaim {
            let _ = (task, slot);
            unsupported("claim_slot")
        }

        /// The highest slot claimed for `task`, `None` if none was. Catch-up and the run history
        /// compare it with the slots due.
        fn last_slot(&self, task: &'a LeaseName) -> Option<u64> {
            let _ = task;
            unsupported("last_slot")
        }

        /// Stores `entry` (opaque text: a [`RunRecord`](crate::history::RunRecord) as JSON)
        /// under `key` in `task`'s history, replacing an entry with the same key, and keeps only
        /// the `keep` entries with the highest keys (at least one: `keep` 0 keeps one). One round
        /// trip.
        fn record_history(&self, task: &'a LeaseName, key: u64, entry: &'a str, keep: usize) -> () {
            let _ = (task, key, entry, keep);
            unsupported("record_history")
        }

        /// Up to `limit` entries of `task`'s history, highest key first.
        fn history(&self, task: &'a LeaseName, limit: usize) -> Vec<String> {
            let _ = (task, limit);
            unsupported("history")
        }

        /// The store's half of a gated tick, as one operation: the clock (is it in the
        /// request's slot?), then, where the store declares [`Capabilities::TICK`], the task's
        /// control record (paused?), then the slot record (already run?) and the task lease
        /// (busy?), and only if all agree the task lease (a new tenure) and the forward-only slot
        /// claim. Nothing is written unless both are.
        ///
        /// The default composes the calls above ([`now_millis`](Store::now_millis),
        /// [`acquire`](Store::acquire), [`claim_slot`](Self::claim_slot), and
        /// [`last_slot`](Self::last_slot) or [`release`](Store::release) when the claim or the
        /// lease says no), reads no control record, and may consume a token without a claim;
        /// stores override it to answer in one round trip.
        fn tick(&self, request: &'a TickRequest<'a>) -> TickAnswer {
            compose_tick(self, request, None)
        }
    }

    /// Deleting long-free lease records: what a [`LeaseSession`](crate::LeaseSession) that sees
    /// many distinct names (a lease per job) calls so the store does not grow without bound.
    /// [`Capabilities::PURGE`]. Stores whose records expire by themselves (Redis) leave it out.
    capability trait Purge [DynPurge] {
        /// Deletes the records of leases that have been free (released or expired) for at least
        /// `retention`, so a store that sees many distinct names (a lease per job) does not grow
        /// without bound; returns how many it deleted. Slot claims and history are kept.
        ///
        /// Fencing stays safe: a purged name's next token is seeded from the store's clock
        /// (ms × 1000) like any new name's, above every token handed out for it before, unless
        /// the store's clock stepped back by more than `retention` or the name was acquired more
        /// than a thousand times per millisecond on average.
        fn purge(&self, retention: Duration) -> u64 {
            let _ = retention;
            unsupported("purge")
        }
    }

    /// Group membership with a heartbeat: what [`Scheduler::spread`](crate::Scheduler::spread)
    /// places tasks over. [`Capabilities::MEMBERSHIP`].
    capability trait Membership [DynMembership] {
        /// Refreshes `member`'s entry in `group`'s membership, to expire `ttl` from now on the
        /// store's clock, drops the entries that have expired, and answers the live members,
        /// sorted. One round trip.
        fn members(&self, group: &'a LeaseName, member: &'a HolderId, ttl: Duration) -> Vec<HolderId> {
            let _ = (group, member, ttl);
            unsupported("members")
        }

        /// Removes `member` from `group`'s membership at once (a graceful shutdown), so the
        /// others need not wait for its entry to expire. Removing an absent member is not an
        /// error.
        fn leave(&self, group: &'a LeaseName, member: &'a HolderId) -> () {
            let _ = (group, member);
            unsupported("leave")
        }
    }

    /// The fleet's view and hand: which tasks run where (each instance registers its tasks with
    /// a heartbeat), and each task's control record (pause, a pending manual trigger) written
    /// by compare-and-set. The records are JSON text the store keeps as given (see
    /// [`catalog`](crate::catalog)). [`Capabilities::CATALOG`].
    capability trait Catalog [DynCatalog] {
        /// Writes the task's definition (the last writer's is kept) and refreshes the instance's
        /// heartbeat to expire `ttl` from now on the store's clock; drops this task's instances
        /// whose heartbeat expired more than `forget_after` ago; answers the task's control
        /// record. One round trip.
        fn register(&self, registration: &'a Registration<'a>) -> Option<Versioned> {
            let _ = registration;
            unsupported("register")
        }

        /// Removes `instance` from `task`'s instances at once (a graceful shutdown). Removing an
        /// absent one is not an error.
        fn unregister(&self, task: &'a LeaseName, instance: &'a HolderId) -> () {
            let _ = (task, instance);
            unsupported("unregister")
        }

        /// Every task with a definition or a control record, sorted by name; each with its
        /// instances seen within `forget_after` (expired heartbeats show zero remaining). A task
        /// without a control record none of whose instances was seen within `forget_after` is
        /// left out (and may be deleted).
        fn tasks(&self, forget_after: Duration) -> Vec<TaskRecord> {
            let _ = forget_after;
            unsupported("tasks")
        }

        /// The store's clock and `task`'s control record, in one round trip (a gated tick reads
        /// both at once).
        fn control(&self, task: &'a LeaseName) -> ControlRead {
            let _ = task;
            unsupported("control")
        }

        /// Writes `task`'s control record if its version is `expected` (`None`: if it has none
        /// yet), answering the new version, or `None` (nothing written) if the version differed.
        fn set_control(&self, task: &'a LeaseName, expected: Option<u64>, value: &'a str) -> Option<u64> {
            let _ = (task, expected, value);
            unsupported("set_control")
        }

        /// Up to `limit` lease records (held, or free with their last token), sorted by name:
        /// the leases of tasks, leader groups and applications alike.
        fn leases(&self, limit: usize) -> Vec<LeaseRecord> {
            let _ = limit;
            unsupported("leases")
        }
    }
}

/// [`Slots::tick`] from the separate calls (see there); with `read` (the clock and the task's
/// control record, read by the caller) the control record is honoured too.
pub(crate) async fn compose_tick<S: Slots>(
    store: &S,
    request: &TickRequest<'_>,
    read: Option<ControlRead>,
) -> StoreResult<TickAnswer> {
    let TickRequest {
        task,
        holder,
        ttl,
        slot,
        next,
    } = *request;
    let (now_ms, control) = match read {
        Some(read) => (read.now_ms, read.control),
        None => (store.now_millis().await?, None),
    };
    let paused = match &control {
        Some(v) => crate::catalog::Control::from_json(&v.value)?
            .paused
            .is_some(),
        None => false,
    };
    let answer = |claim| TickAnswer {
        now_ms,
        control: control.clone(),
        claim,
    };
    if now_ms < slot || next.is_some_and(|next| now_ms >= next) {
        return Ok(answer(TickClaim::OutsideSlot));
    }
    if paused {
        return Ok(answer(TickClaim::Paused));
    }
    let token = match store.acquire(task, holder, ttl).await? {
        Acquisition::Acquired { token } => token,
        Acquisition::Busy { holder, remaining } => {
            let last = store.last_slot(task).await?;
            return Ok(answer(TickClaim::Busy {
                holder,
                remaining,
                last,
            }));
        }
    };
    let claim = store.claim_slot(task, slot).await;
    if !matches!(claim, Ok(SlotClaim::Claimed)) {
        // Not ours to run: hand the lease back (it expires after its ttl if this fails).
        let _ = store.release(task, holder, token).await;
    }
    Ok(answer(match claim? {
        SlotClaim::Claimed => TickClaim::Claimed { token },
        SlotClaim::AlreadyRun { last } => TickClaim::AlreadyRun { last },
    }))
}

/// Any store behind one type, for stores chosen at run time (the CLI picks one from a URL). It
/// forwards every operation of every capability; [`capabilities`](Store::capabilities) says
/// which the store inside really answers.
#[derive(Clone)]
pub struct BoxStore(Arc<dyn AnyStore>);

impl BoxStore {
    /// Erases the type of `store`.
    pub fn new(store: impl Slots + Purge + Membership + Catalog) -> Self {
        Self(Arc::new(store))
    }
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxStore").field(&self.0.describe()).finish()
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
