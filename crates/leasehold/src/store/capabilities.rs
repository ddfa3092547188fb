//! [`Capabilities`]: which capability traits a store answers, beyond leases; and their one
//! declaration per store, [`declare_capabilities!`](crate::declare_capabilities).

use std::fmt;

/// What a store implements beyond leases: the capability traits whose operations it answers.
/// A store type declares them once, with [`declare_capabilities!`](crate::declare_capabilities);
/// a store value says them as [`Store::capabilities`](crate::store::Store::capabilities) (a
/// wrapper may offer fewer than the store inside it), where they are needed (a
/// [`Scheduler`](crate::Scheduler) checks when it starts), so a store that lacks one is named at
/// start, not met as [`StoreError::Unsupported`](crate::store::StoreError::Unsupported) in the
/// middle of a run.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities(u8);

impl Capabilities {
    /// No capability beyond leases.
    pub const NONE: Self = Self(0);
    /// [`Slots`](crate::store::Slots): slot claims and run history, for a scheduler's gated ticks.
    pub const SLOTS: Self = Self(1);
    /// [`Purge`](crate::store::Purge): deleting the records of leases free for long.
    pub const PURGE: Self = Self(1 << 1);
    /// [`Membership`](crate::store::Membership): the live members of a group, for spreading tasks over instances.
    pub const MEMBERSHIP: Self = Self(1 << 2);
    /// [`Catalog`](crate::store::Catalog): the tasks instances run, and fleet-wide pause and trigger.
    pub const CATALOG: Self = Self(1 << 3);
    /// Every capability of records a store keeps (slots, purge, membership, catalog).
    /// [`TICK`](Self::TICK), a property of how a store answers, is declared on its own.
    pub const ALL: Self = Self(0b1111);
    /// [`Slots::tick`](crate::store::Slots::tick) reads the task's control record (pause) itself, with the clock, the task
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

/// The capabilities a store type declares: for a store, exactly the capability traits it
/// implements (and [`Capabilities::TICK`] if its tick reads the control record itself); for a
/// wrapper, at most what the store inside it may answer. The default of
/// [`Store::capabilities`](crate::store::Store::capabilities).
///
/// A store does not implement this by hand: [`declare_capabilities!`](crate::declare_capabilities)
/// does, from the one list that also implements the capability traits the store leaves out.
pub trait DeclaredCapabilities {
    /// The capabilities declared.
    const CAPABILITIES: Capabilities;
}

/// Declares, once, which capabilities a store type has: `SLOTS`, `PURGE`, `MEMBERSHIP`,
/// `CATALOG` (the capability traits it implements itself) and `TICK` (its
/// [`Slots::tick`](crate::store::Slots::tick) reads the control record in the same call), as the
/// [`Capabilities`] constants are named:
///
/// ```text
/// leasehold::declare_capabilities!(RedisStore: SLOTS | MEMBERSHIP | CATALOG | TICK);
/// leasehold::declare_capabilities!(impl<D: Dialect> SqlStore<D>: SLOTS | PURGE | MEMBERSHIP | CATALOG);
/// ```
///
/// It implements [`DeclaredCapabilities`] (so [`Store::capabilities`](crate::store::Store::capabilities)
/// answers the list), and, for every capability trait left out, that trait with every operation
/// answering [`StoreError::Unsupported`](crate::store::StoreError::Unsupported). So the two
/// cannot disagree at compile time: a listed capability whose trait the store does not implement
/// fails to compile for want of the impl, and an impl of an unlisted one conflicts with the
/// generated one. What the compiler cannot see (a listed capability's impl that leaves an
/// operation to its default) the conformance check `capabilities_are_declared_truly` finds,
/// against the real server.
#[macro_export]
macro_rules! declare_capabilities {
    (impl<$($param:ident: $bound:path),+> $store:ty: $($capability:ident)|+) => {
        $crate::declare_capabilities!(@declare [$($param: $bound),+] $store; $($capability)+);
    };
    ($store:ty: $($capability:ident)|+) => {
        $crate::declare_capabilities!(@declare [] $store; $($capability)+);
    };

    (@declare [$($generics:tt)*] $store:ty; $($capability:ident)+) => {
        impl<$($generics)*> $crate::store::DeclaredCapabilities for $store {
            const CAPABILITIES: $crate::store::Capabilities = $crate::store::Capabilities::NONE
                $(.union($crate::store::Capabilities::$capability))+;
        }
        $crate::declare_capabilities!(@unless SLOTS [$($generics)*] $store; $($capability)+);
        $crate::declare_capabilities!(@unless PURGE [$($generics)*] $store; $($capability)+);
        $crate::declare_capabilities!(@unless MEMBERSHIP [$($generics)*] $store; $($capability)+);
        $crate::declare_capabilities!(@unless CATALOG [$($generics)*] $store; $($capability)+);
    };

    // Listed: the store implements the trait itself.
    (@unless SLOTS [$($generics:tt)*] $store:ty; SLOTS $($rest:ident)*) => {};
    (@unless PURGE [$($generics:tt)*] $store:ty; PURGE $($rest:ident)*) => {};
    (@unless MEMBERSHIP [$($generics:tt)*] $store:ty; MEMBERSHIP $($rest:ident)*) => {};
    (@unless CATALOG [$($generics:tt)*] $store:ty; CATALOG $($rest:ident)*) => {};
    (@unless $wanted:ident [$($generics:tt)*] $store:ty; $other:ident $($rest:ident)*) => {
        $crate::declare_capabilities!(@unless $wanted [$($generics)*] $store; $($rest)*);
    };
    // Not listed: every operation answers `Unsupported` (a tick too, before it writes anything).
    (@unless SLOTS [$($generics:tt)*] $store:ty;) => {
        impl<$($generics)*> $crate::store::Slots for $store {
            fn tick<'a>(
                &'a self,
                request: &'a $crate::store::TickRequest<'a>,
            ) -> impl ::core::future::Future<Output = $crate::store::StoreResult<$crate::store::TickAnswer>>
                   + ::core::marker::Send
                   + 'a {
                let _ = request;
                $crate::store::unsupported("tick")
            }
        }
    };
    (@unless PURGE [$($generics:tt)*] $store:ty;) => {
        impl<$($generics)*> $crate::store::Purge for $store {}
    };
    (@unless MEMBERSHIP [$($generics:tt)*] $store:ty;) => {
        impl<$($generics)*> $crate::store::Membership for $store {}
    };
    (@unless CATALOG [$($generics:tt)*] $store:ty;) => {
        impl<$($generics)*> $crate::store::Catalog for $store {}
    };
}

#[cfg(test)]
mod tests {
    use std::marker::PhantomData;
    use std::time::Duration;

    use super::{Capabilities, DeclaredCapabilities};
    use crate::store::answers::{Acquisition, LeaseState, Release, Renewal, SlotClaim};
    use crate::store::conformance::capabilities_are_declared_truly;
    use crate::store::error::StoreResult;
    use crate::store::memory::MemoryStore;
    use crate::store::name::{HolderId, LeaseName};
    use crate::store::token::FencingToken;
    use crate::store::traits::{Catalog, Slots, Store};

    /// A memory store that declares only some capabilities (`Kind` picks which).
    #[derive(Clone, Default)]
    struct Partial<Kind>(MemoryStore, PhantomData<Kind>);

    /// Declares slots and implements them.
    #[derive(Clone, Default)]
    struct SlotsOnly;

    /// Declares a catalog but leaves its operations to the defaults.
    #[derive(Clone, Default)]
    struct CatalogLeftToDefaults;

    declare_capabilities!(Partial<SlotsOnly>: SLOTS);
    declare_capabilities!(Partial<CatalogLeftToDefaults>: CATALOG);

    impl<Kind: Clone + Send + Sync + 'static> Store for Partial<Kind>
    where
        Self: DeclaredCapabilities,
    {
        async fn acquire(
            &self,
            name: &LeaseName,
            holder: &HolderId,
            ttl: Duration,
        ) -> StoreResult<Acquisition> {
            self.0.acquire(name, holder, ttl).await
        }

        async fn renew(
            &self,
            name: &LeaseName,
            holder: &HolderId,
            token: FencingToken,
            ttl: Duration,
        ) -> StoreResult<Renewal> {
            self.0.renew(name, holder, token, ttl).await
        }

        async fn release(
            &self,
            name: &LeaseName,
            holder: &HolderId,
            token: FencingToken,
        ) -> StoreResult<Release> {
            self.0.release(name, holder, token).await
        }

        async fn inspect(&self, name: &LeaseName) -> StoreResult<Option<LeaseState>> {
            self.0.inspect(name).await
        }

        async fn now_millis(&self) -> StoreResult<u64> {
            self.0.now_millis().await
        }

        fn describe(&self) -> String {
            "partial memory".to_owned()
        }
    }

    impl Slots for Partial<SlotsOnly> {
        async fn claim_slot(&self, task: &LeaseName, slot: u64) -> StoreResult<SlotClaim> {
            self.0.claim_slot(task, slot).await
        }

        async fn last_slot(&self, task: &LeaseName) -> StoreResult<Option<u64>> {
            self.0.last_slot(task).await
        }

        async fn record_history(
            &self,
            task: &LeaseName,
            key: u64,
            entry: &str,
            keep: usize,
        ) -> StoreResult<()> {
            self.0.record_history(task, key, entry, keep).await
        }

        async fn history(&self, task: &LeaseName, limit: usize) -> StoreResult<Vec<String>> {
            self.0.history(task, limit).await
        }
    }

    impl Catalog for Partial<CatalogLeftToDefaults> {}

    /// The list is the declaration: what it names is what the store says it answers, and the
    /// capability traits it leaves out answer `Unsupported` without an impl written for them.
    #[tokio::test]
    async fn a_store_answers_what_it_declares_and_nothing_else() {
        let store = Partial::<SlotsOnly>::default();
        assert_eq!(store.capabilities(), Capabilities::SLOTS);
        assert_eq!(
            MemoryStore::new().capabilities(),
            Capabilities::ALL | Capabilities::TICK
        );
        capabilities_are_declared_truly(store).await;
    }

    /// A declared capability whose operations were left to the defaults is caught, whichever
    /// operation it is (the catalog's were not looked at before).
    #[tokio::test]
    #[should_panic(
        expected = "register (catalog: declared) answered Err(Unsupported(\"register\"))"
    )]
    async fn a_declared_capability_that_answers_unsupported_fails_the_check() {
        capabilities_are_declared_truly(Partial::<CatalogLeftToDefaults>::default()).await;
    }
}
