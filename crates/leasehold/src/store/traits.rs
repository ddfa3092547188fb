//! The [`Store`] trait (the atomic operations on one lease that every backend provides) and the
//! capability traits beside it ([`Slots`], [`Purge`], [`Membership`], [`Catalog`]), defined from
//! one list of operations, [`store_operations!`]. The same list forwards every operation through
//! [`Layer`](crate::store::Layer)s and [`BoxStore`](crate::store::BoxStore), so adding an operation
//! is one entry here (plus its implementation in each store).
//!
//! Each operation is one round trip and all timing happens on the store's own clock; the client
//! clock is never compared with the store's. "Not acquired" is a value ([`Acquisition::Busy`]),
//! never an error: `Err` means the store could not answer.

pub(crate) mod define;

use std::future::Future;
use std::time::Duration;

use crate::store::answers::{
    Acquisition, LeaseState, Release, Renewal, SlotClaim, TickAnswer, TickRequest, Versioned,
};
use crate::store::capabilities::{Capabilities, DeclaredCapabilities};
use crate::store::catalog::{ControlRead, Forgetting, LeaseRecord, Registration, TaskRecord};
use crate::store::compose::{TickCalls, compose_tick};
use crate::store::error::{StoreResult, unsupported};
use crate::store::name::{HolderId, LeaseName};
use crate::store::notify::ReleaseSubscription;
use crate::store::token::FencingToken;

/// The list of store operations, handed to `callback!` one group per trait (see
/// `define::each_trait!`): each trait with its documentation, its object-safe mirror's name (for
/// [`BoxStore`](crate::store::BoxStore)) and its flag in [`Capabilities`], and its operations (arguments as `name: &'a Type` for
/// borrowed ones, the answer after `->`, a default body where there is one); the lease trait also
/// has the items that are not operations (`also`). `define::define_store_traits!` defines the
/// traits from it, and the layer and box files forward each operation from it.
macro_rules! store_operations {
    ([$($callback:tt)*]) => {
        $crate::store::traits::define::each_trait! {
            [$($callback)*]
            /// A lease store: the atomic operations on one lease. Every method is one round trip
            /// and all timing uses the store's clock. What a store does beyond leases is in the
            /// capability traits ([`Slots`], [`Purge`], [`Membership`], [`Catalog`]). A store
            /// declares the ones it has once, with
            /// [`declare_capabilities!`](crate::declare_capabilities), and implements those; the
            /// macro implements the others, whose operations answer
            /// [`StoreError::Unsupported`](crate::store::StoreError::Unsupported).
            ///
            /// Implementations are cheap to clone (they share a connection or pool). Implement the
            /// methods as `async fn` with ordinary (elided) lifetimes.
            lease trait Store: [DeclaredCapabilities + Send + Sync + Clone + 'static]
                [DynStore NONE] {
                /// Takes the lease for `ttl` if it is free, expired, or held by `holder` itself; it
                /// is busy only while another holder's tenure is live.
                ///
                /// **Every `Acquired` starts a new tenure with a new token**, strictly above every
                /// token handed out for this name before; re-acquiring by the current holder
                /// replaces its older tenure rather than renewing it. This makes a token name
                /// exactly one tenure: an old guard's renew or release (say, one dropped just
                /// before this acquire) can never touch the new one. The first token of a name the
                /// store has never seen is seeded from the store's clock (milliseconds since the
                /// epoch × 1000), so a recreated table, file or key space never hands out a token
                /// below one handed out before.
                fn acquire(
                    &self,
                    name: &'a LeaseName,
                    holder: &'a HolderId,
                    ttl: Duration,
                ) -> Acquisition;

                /// Extends the lease to `ttl` from now if `holder` holds it with `token` and it has
                /// not expired.
                fn renew(
                    &self,
                    name: &'a LeaseName,
                    holder: &'a HolderId,
                    token: FencingToken,
                    ttl: Duration,
                ) -> Renewal;

                /// Renews many leases of `holder` at once, answering in the order given: each as
                /// [`renew`](Self::renew) would. A [`LeaseSession`](crate::LeaseSession) calls it
                /// with up to [`MAX_RENEW_BATCH`](crate::MAX_RENEW_BATCH) leases; stores override
                /// it to do that in one round trip. The default renews one after another.
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
                fn release(
                    &self,
                    name: &'a LeaseName,
                    holder: &'a HolderId,
                    token: FencingToken,
                ) -> Release;

                /// Reads the lease without changing it. `None` when the name was never acquired.
                fn inspect(&self, name: &'a LeaseName) -> Option<LeaseState>;

                /// The store's clock, in milliseconds since the Unix epoch. Schedules derive slots
                /// from it.
                fn now_millis(&self) -> u64;
            } also {
                /// A subscription to release notifications, or `None` if this store has none (then
                /// waiters poll). Subscribe *before* the acquire attempt whose `Busy` you will wait
                /// on.
                fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
                    None
                }

                /// A one-line description for logs and status, with any password removed.
                fn describe(&self) -> String;

                /// The capability traits whose operations this store answers; the others answer
                /// [`StoreError::Unsupported`](crate::store::StoreError::Unsupported). A store
                /// answers what it declared ([`DeclaredCapabilities`]); a wrapper
                /// ([`Layer`](crate::store::Layer), [`BoxStore`](crate::store::BoxStore)) what the
                /// store inside it answers, less what it withdraws.
                fn capabilities(&self) -> Capabilities {
                    <Self as DeclaredCapabilities>::CAPABILITIES
                }
            }

            /// Slot claims and run history: what a [`Scheduler`](crate::Scheduler) needs so that a
            /// timer tick runs on one instance only, and what `leasehold history` reads.
            /// [`Capabilities::SLOTS`].
            capability trait Slots [DynSlots SLOTS] {
                /// Records `slot` as run for `task` if it is above every slot claimed so far.
                fn claim_slot(&self, task: &'a LeaseName, slot: u64) -> SlotClaim {
                    let _ = (task, slot);
                    unsupported("claim_slot")
                }

                /// The highest slot claimed for `task`, `None` if none was. Catch-up and the run
                /// history compare it with the slots due.
                fn last_slot(&self, task: &'a LeaseName) -> Option<u64> {
                    let _ = task;
                    unsupported("last_slot")
                }

                /// Stores `entry` (opaque text: a [`RunRecord`](crate::history::RunRecord) as JSON)
                /// under `key` in `task`'s history, replacing an entry with the same key, and keeps
                /// only the `keep` entries with the highest keys (at least one: `keep` 0 keeps
                /// one). One round trip.
                fn record_history(
                    &self,
                    task: &'a LeaseName,
                    key: u64,
                    entry: &'a str,
                    keep: usize,
                ) -> () {
                    let _ = (task, key, entry, keep);
                    unsupported("record_history")
                }

                /// Up to `limit` entries of `task`'s history, highest key first.
                fn history(&self, task: &'a LeaseName, limit: usize) -> Vec<String> {
                    let _ = (task, limit);
                    unsupported("history")
                }

                /// The store's half of a gated tick, as one operation: the clock (is it in the
                /// request's slot?), then, where the store declares [`Capabilities::TICK`], the
                /// task's control record (paused?), then the slot record (already run?) and the
                /// task lease (busy?), and only if all agree the task lease (a new tenure) and the
                /// forward-only slot claim. Nothing is written unless both are.
                ///
                /// The default composes the calls above ([`now_millis`](Store::now_millis),
                /// [`acquire`](Store::acquire), [`claim_slot`](Self::claim_slot), and
                /// [`last_slot`](Self::last_slot) or [`release`](Store::release) when the claim or
                /// the lease says no), reads no control record, and may consume a token without a
                /// claim; stores override it to answer in one round trip.
                fn tick(&self, request: &'a TickRequest<'a>) -> TickAnswer {
                    compose_tick(self, request, None)
                }
            }

            /// Deleting long-free lease records: what a [`LeaseSession`](crate::LeaseSession) that
            /// sees many distinct names (a lease per job) calls so the store does not grow without
            /// bound. [`Capabilities::PURGE`]. Stores whose records expire by themselves (Redis)
            /// leave it out.
            capability trait Purge [DynPurge PURGE] {
                /// Deletes the records of leases that have been free (released or expired) for at
                /// least `retention`, so a store that sees many distinct names (a lease per job)
                /// does not grow without bound; returns how many it deleted. Slot claims and
                /// history are kept.
                ///
                /// Fencing stays safe: a purged name's next token is seeded from the store's clock
                /// (ms × 1000) like any new name's, above every token handed out for it before,
                /// unless the store's clock stepped back by more than `retention` or the name was
                /// acquired more than a thousand times per millisecond on average.
                fn purge(&self, retention: Duration) -> u64 {
                    let _ = retention;
                    unsupported("purge")
                }
            }

            /// Group membership with a heartbeat: what
            /// [`Scheduler::spread`](crate::Scheduler::spread) places tasks over.
            /// [`Capabilities::MEMBERSHIP`].
            capability trait Membership [DynMembership MEMBERSHIP] {
                /// Refreshes `member`'s entry in `group`'s membership, to expire `ttl` from now on
                /// the store's clock, drops the entries that have expired, and answers the live
                /// members, sorted. One round trip.
                fn members(
                    &self,
                    group: &'a LeaseName,
                    member: &'a HolderId,
                    ttl: Duration,
                ) -> Vec<HolderId> {
                    let _ = (group, member, ttl);
                    unsupported("members")
                }

                /// Removes `member` from `group`'s membership at once (a graceful shutdown), so the
                /// others need not wait for its entry to expire. Removing an absent member is not
                /// an error.
                fn leave(&self, group: &'a LeaseName, member: &'a HolderId) -> () {
                    let _ = (group, member);
                    unsupported("leave")
                }
            }

            /// The fleet's view and hand: which tasks run where (each instance registers its tasks
            /// with a heartbeat), and each task's control record (pause, a pending manual trigger)
            /// written by compare-and-set. The records are JSON text the store keeps as given (see
            /// [`catalog`](crate::catalog)). [`Capabilities::CATALOG`].
            capability trait Catalog [DynCatalog CATALOG] {
                /// Writes the task's definition (the last writer's is kept) and refreshes the
                /// instance's heartbeat to expire `ttl` from now on the store's clock; drops this
                /// task's instances whose heartbeat expired more than `forget_after` ago; answers
                /// the task's control record. One round trip.
                fn register(&self, registration: &'a Registration<'a>) -> Option<Versioned> {
                    let _ = registration;
                    unsupported("register")
                }

                /// Removes `instance` from `task`'s instances at once (a graceful shutdown).
                /// Removing an absent one is not an error.
                fn unregister(&self, task: &'a LeaseName, instance: &'a HolderId) -> () {
                    let _ = (task, instance);
                    unsupported("unregister")
                }

                /// Every task with a definition or a control record, sorted by name; each with its
                /// instances seen within `forget_after` (expired heartbeats show zero remaining). A
                /// task without a control record none of whose instances was seen within
                /// `forget_after` is left out (and may be deleted).
                fn tasks(&self, forget_after: Duration) -> Vec<TaskRecord> {
                    let _ = forget_after;
                    unsupported("tasks")
                }

                /// The store's clock and `task`'s control record, in one round trip (a gated tick
                /// reads both at once).
                fn control(&self, task: &'a LeaseName) -> ControlRead {
                    let _ = task;
                    unsupported("control")
                }

                /// Writes `task`'s control record if its version is `expected` (`None`: if it has
                /// none yet), answering the new version, or `None` (nothing written) if the version
                /// differed.
                fn set_control(
                    &self,
                    task: &'a LeaseName,
                    expected: Option<u64>,
                    value: &'a str,
                ) -> Option<u64> {
                    let _ = (task, expected, value);
                    unsupported("set_control")
                }

                /// Removes a task no instance runs: its definition, its instances (all expired)
                /// and its control record, and with `history` its run history; answers
                /// [`Forgetting::Live`] (nothing removed) while any instance's heartbeat is live
                /// on the store's clock. Its slot claims and its lease record are kept, so a task
                /// of the same name registered later neither runs a claimed slot again nor hands
                /// out a lower fencing token.
                ///
                /// The check and the removal are one atomic step against `register`: a
                /// registration either lands before it (and is seen live, so nothing is
                /// removed) or after it (and registers the task afresh, with no control
                /// record); never half a task. Each store says how it does this.
                fn forget(&self, task: &'a LeaseName, history: bool) -> Forgetting {
                    let _ = (task, history);
                    unsupported("forget")
                }

                /// Up to `limit` lease records (held, or free with their last token), sorted by
                /// name: the leases of tasks, leader groups and applications alike.
                fn leases(&self, limit: usize) -> Vec<LeaseRecord> {
                    let _ = limit;
                    unsupported("leases")
                }
            }
        }
    };
}

pub(crate) use store_operations;

store_operations!([crate::store::traits::define::define_store_traits]);

/// The separate calls [`compose_tick`] makes, as every [`Slots`] store answers them.
impl<S: Slots> TickCalls for S {
    fn clock(&self) -> impl Future<Output = StoreResult<u64>> + Send {
        Store::now_millis(self)
    }

    fn take<'a>(
        &'a self,
        task: &'a LeaseName,
        holder: &'a HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Acquisition>> + Send + 'a {
        Store::acquire(self, task, holder, ttl)
    }

    fn hand_back<'a>(
        &'a self,
        task: &'a LeaseName,
        holder: &'a HolderId,
        token: FencingToken,
    ) -> impl Future<Output = StoreResult<Release>> + Send + 'a {
        Store::release(self, task, holder, token)
    }

    fn highest_slot<'a>(
        &'a self,
        task: &'a LeaseName,
    ) -> impl Future<Output = StoreResult<Option<u64>>> + Send + 'a {
        Slots::last_slot(self, task)
    }

    fn claim<'a>(
        &'a self,
        task: &'a LeaseName,
        slot: u64,
    ) -> impl Future<Output = StoreResult<SlotClaim>> + Send + 'a {
        Slots::claim_slot(self, task, slot)
    }
}
