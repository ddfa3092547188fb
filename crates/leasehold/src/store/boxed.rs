//! [`BoxStore`]: any store behind one type, for stores chosen at run time, and the forwarding of
//! every operation of every capability through it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::store::answers::{
    Acquisition, LeaseState, Release, Renewal, SlotClaim, TickAnswer, TickRequest, Versioned,
};
use crate::store::capabilities::{Capabilities, DeclaredCapabilities};
use crate::store::catalog::{ControlRead, Forgetting, LeaseRecord, Registration, TaskRecord};
use crate::store::error::StoreResult;
use crate::store::name::{HolderId, LeaseName};
use crate::store::notify::ReleaseSubscription;
use crate::store::token::FencingToken;
use crate::store::traits::{Catalog, Membership, Purge, Slots, Store, store_operations};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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

/// Any capability: what the store inside answers is [`Store::capabilities`].
impl DeclaredCapabilities for BoxStore {
    const CAPABILITIES: Capabilities = Capabilities::ALL.union(Capabilities::TICK);
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BoxStore").field(&self.0.describe()).finish()
    }
}

/// For each trait of the list: its object-safe mirror (every operation answering a boxed
/// future), that mirror's blanket impl for every store, and the trait's impl for [`BoxStore`]
/// through the mirror; then `AnyStore`, every mirror at once.
macro_rules! forward_through_box {
    ({ $($lease:tt)* } $({ $($cap:tt)* })*) => {
        forward_through_box!(@mirror
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
            $($lease)*);
        $(
            forward_through_box!(@mirror [] [] [] $($cap)*);
        )*
        forward_through_box!(@any [$($lease)*] $([$($cap)*])*);
    };

    // The bracketed groups are the lease trait's items that are not operations, in the mirror,
    // in its blanket impl and in the impl for `BoxStore` (empty for a capability).
    (@mirror [$($also_dyn:tt)*] [$($also_blanket:tt)*] [$($also_box:tt)*]
        [$($meta:tt)*] $trait:ident [$($super:tt)*] [$dyn:ident $flag:ident] [$($items:tt)*]
        $([$($op_meta:tt)*] $op:ident $self:ident [$($arg:ident : $ty:ty),*] $out:ty
            [$($default:tt)*])*
    ) => {
        trait $dyn: Send + Sync {
            $(
                fn $op<'a>(&'a $self $(, $arg: $ty)*) -> BoxFuture<'a, StoreResult<$out>>;
            )*
            $($also_dyn)*
        }

        impl<S: $trait> $dyn for S {
            $(
                fn $op<'a>(&'a $self $(, $arg: $ty)*) -> BoxFuture<'a, StoreResult<$out>> {
                    Box::pin(<S as $trait>::$op($self $(, $arg)*))
                }
            )*
            $($also_blanket)*
        }

        impl $trait for BoxStore {
            $(
                fn $op<'a>(&'a $self $(, $arg: $ty)*)
                    -> impl Future<Output = StoreResult<$out>> + Send + 'a {
                    $dyn::$op(&*$self.0 $(, $arg)*)
                }
            )*
            $($also_box)*
        }
    };

    // Every mirror at once, which `BoxStore` holds.
    (@any $([[$($meta:tt)*] $trait:ident [$($super:tt)*] [$dyn:ident $flag:ident] $($rest:tt)*])*) => {
        trait AnyStore: $($dyn+)* {}
        impl<S: $($trait+)*> AnyStore for S {}
    };
}

store_operations!([forward_through_box]);
