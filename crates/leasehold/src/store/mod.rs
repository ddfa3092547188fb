//! What a [`Store`] implementation works with beyond the items at the crate root: the answers of
//! its operations, its error helpers and its release notifications; and the wrappers that work
//! around any store ([`Layer`]s): an operation time limit ([`Timeout`]) and metrics per call
//! ([`Metered`]). Applications need these only to call a store's operations directly or to wrap
//! a store.
//!
//! This is the crate's lowest layer: names, tokens, the store traits and their records, the
//! in-process store, and the conformance checks every store passes. It imports nothing from the
//! layers above (`lease`, `scheduling`).

pub(crate) mod answers;
pub(crate) mod boxed;
// Its macro, `declare_capabilities!`, is used by name in the modules after it.
#[macro_use]
pub(crate) mod capabilities;
pub mod catalog;
pub(crate) mod compose;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub(crate) mod error;
#[cfg(any(test, feature = "faults"))]
pub mod faults;
pub(crate) mod feed;
pub(crate) mod layer;
pub(crate) mod memory;
pub(crate) mod metered;
pub(crate) mod name;
pub(crate) mod notify;
pub(crate) mod percent;
pub(crate) mod settings;
pub(crate) mod setup_error;
pub mod skew;
pub mod text;
pub(crate) mod timeout;
pub(crate) mod token;
pub(crate) mod traits;

pub use answers::{
    Acquisition, Answer, LeaseState, Release, Renewal, SlotClaim, TickAnswer, TickClaim,
    TickRequest,
};
pub use boxed::BoxStore;
pub use capabilities::{Capabilities, DeclaredCapabilities};
pub use error::{BoxError, Operation, StoreError, StoreResult, unsupported};
pub use feed::{FeedLink, ReleaseFeed, ReleaseSource};
pub use layer::Layer;
pub use metered::Metered;
pub use notify::{ReleaseHub, ReleaseSubscription};
pub use percent::{percent_decode, percent_encode};
pub use settings::{ZeroDuration, check_nonzero};
pub use setup_error::{SetupError, StoreSetupError};
pub use timeout::{Timeout, within};
pub use traits::{Catalog, Membership, Purge, Slots, Store};
