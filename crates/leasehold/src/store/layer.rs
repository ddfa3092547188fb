//! [`Layer`]: a wrapper around any store that does the same thing around each of its
//! operations, and the forwarding of every operation of every capability through it.

use std::future::Future;
use std::time::Duration;

use crate::store::answers::{
    Acquisition, Answer, LeaseState, Release, Renewal, SlotClaim, TickAnswer, TickRequest,
    Versioned,
};
use crate::store::capabilities::{Capabilities, DeclaredCapabilities};
use crate::store::catalog::{ControlRead, Forgetting, LeaseRecord, Registration, TaskRecord};
use crate::store::error::{StoreError, StoreResult};
use crate::store::name::{HolderId, LeaseName};
use crate::store::notify::ReleaseSubscription;
use crate::store::token::FencingToken;
use crate::store::traits::{Catalog, Membership, Purge, Slots, Store, store_operations};

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
    /// some away; the operations of a capability taken away answer `Unsupported`.
    fn capabilities_offered(&self) -> Capabilities {
        Store::capabilities(self.inner())
    }
}

/// A layer declares what the store inside it declares; what it offers at run time is
/// [`Layer::capabilities_offered`].
impl<L: Layer> DeclaredCapabilities for L {
    const CAPABILITIES: Capabilities = <L::Inner as DeclaredCapabilities>::CAPABILITIES;
}

/// Whether `layer` withdraws `capability`: the store inside answers it and the layer does not
/// offer it. The operations of a withdrawn capability answer `Unsupported` without reaching the
/// store, as a store that never had it does.
fn withdraws<L: Layer>(layer: &L, capability: Capabilities) -> bool {
    !capability.is_empty()
        && !Layer::capabilities_offered(layer).contains(capability)
        && Store::capabilities(layer.inner()).contains(capability)
}

/// Implements the lease trait and every capability trait for every [`Layer`] whose inner store
/// implements it, each operation going through [`Layer::around`] (or answering `Unsupported`
/// where the layer withdraws its capability).
macro_rules! forward_through_layers {
    ({ $($lease:tt)* } $({ $($cap:tt)* })*) => {
        forward_through_layers!(@impl [
            fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
                Store::subscribe_releases(self.inner())
            }
            fn describe(&self) -> String {
                Layer::description(self)
            }
            fn capabilities(&self) -> Capabilities {
                Layer::capabilities_offered(self)
            }
        ] $($lease)*);
        $(
            forward_through_layers!(@impl [] $($cap)*);
        )*
    };

    (@impl [$($also:tt)*] [$($meta:tt)*] $trait:ident [$($super:tt)*] [$dyn:ident $flag:ident]
        [$($items:tt)*]
        $([$($op_meta:tt)*] $op:ident $self:ident [$($arg:ident : $ty:ty),*] $out:ty
            [$($default:tt)*])*
    ) => {
        impl<L: Layer> $trait for L
        where
            L::Inner: $trait,
        {
            $(
                fn $op<'a>(&'a $self $(, $arg: $ty)*)
                    -> impl Future<Output = StoreResult<$out>> + Send + 'a {
                    let withdrawn = withdraws($self, Capabilities::$flag);
                    async move {
                        if withdrawn {
                            return Err(StoreError::Unsupported(stringify!($op)));
                        }
                        Layer::around($self, stringify!($op), move || {
                            <L::Inner as $trait>::$op($self.inner() $(, $arg)*)
                        })
                        .await
                    }
                }
            )*
            $($also)*
        }
    };
}

store_operations!([forward_through_layers]);
