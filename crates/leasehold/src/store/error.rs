//! What a store operation answers when the store could not answer: [`StoreError`], and
//! [`Operation`], which names the operation in a store implementation's error messages.
//!
//! "Not acquired" is not an error but an answer ([`Acquisition::Busy`](crate::store::Acquisition)):
//! `Err` means the store could not answer.

use std::fmt;
use std::time::Duration;

use crate::store::name::LeaseName;

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

/// The answer a capability's default method gives: this store does not implement `what`.
pub fn unsupported<T>(what: &'static str) -> std::future::Ready<StoreResult<T>> {
    std::future::ready(Err(StoreError::Unsupported(what)))
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
