//! [`SetupError`]: why a store could not be set up, one type that every store crate's error is.

use crate::store::error::StoreError;
use crate::store::skew::TooOld;

/// The errors a store crate has of its own while it is set up (a bad URL or setting, a file or
/// tables it cannot use), beside those every store shares in [`SetupError`].
pub trait StoreSetupError: std::error::Error + Send + Sync + 'static {
    /// Whether retrying later may succeed.
    fn is_transient(&self) -> bool;

    /// Whether the URL or a setting is at fault: only another URL or setting can work.
    fn is_invalid(&self) -> bool;
}

/// Why a store could not be set up: what every store crate can meet (its server unreachable
/// or refusing, its tables not created, its data a newer release's), or an error `E` of the
/// store's own. Each store crate's `Error` is this type with its own `E`, as deadpool's
/// `CreatePoolError<C>` is for its backends.
///
/// Messages name the store as the store crate shows it (a server without its password, a
/// SQLite file), never the URL's text; each is one line and leaves its cause to its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError<E> {
    /// An error of the store's own (a bad URL or setting, a file or tables it cannot use).
    #[error(transparent)]
    Store(#[from] E),
    /// The server could not be reached, timed out, or refused the connection or credentials
    /// (the source says which: [`StoreError::is_transient`] tells an outage from a refusal).
    #[error("could not connect to {store}")]
    Connect {
        /// The store, as its crate shows it (without a password).
        store: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
    /// The server refused the connection because the database the URL names does not exist
    /// (the store creates its tables, never its database).
    #[error("database {database:?} does not exist on {store}")]
    MissingDatabase {
        /// The store, as its crate shows it (without a password).
        store: String,
        /// The database the URL names.
        database: String,
        /// What the server said.
        #[source]
        source: StoreError,
    },
    /// Creating the tables failed (for example: no permission to create them).
    #[error("could not create the lease tables on {store}")]
    Migrate {
        /// The store, as its crate shows it.
        store: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
    /// The store is in use by a newer release that does not let this one write to it (see
    /// [`skew`](crate::skew)). Nothing was written.
    #[error("{store}")]
    TooOld {
        /// The store, as its crate shows it.
        store: String,
        /// The release the store needs.
        #[source]
        source: TooOld,
    },
}

impl<E: StoreSetupError> SetupError<E> {
    /// Whether retrying later may succeed: the server could not be reached or did not answer
    /// in time. A refusal (credentials, permissions), a newer release's data and a bad URL or
    /// setting are not transient.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Store(e) => e.is_transient(),
            Self::Connect { source, .. } | Self::Migrate { source, .. } => source.is_transient(),
            Self::MissingDatabase { .. } | Self::TooOld { .. } => false,
        }
    }

    /// Whether the URL or a setting is at fault: only another URL or setting can work.
    pub fn is_invalid(&self) -> bool {
        matches!(self, Self::Store(e) if e.is_invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("bad url")]
    struct BadUrl(#[source] std::io::Error);

    impl StoreSetupError for BadUrl {
        fn is_transient(&self) -> bool {
            false
        }
        fn is_invalid(&self) -> bool {
            true
        }
    }

    /// The store's own error is shown as it is, its cause kept as the source; the shared ones
    /// name the store and leave their cause to the source.
    #[test]
    fn messages_and_sources() {
        let own = SetupError::from(BadUrl(std::io::Error::other("cause")));
        assert_eq!(own.to_string(), "bad url");
        let cause = std::error::Error::source(&own).map(ToString::to_string);
        assert_eq!(cause.as_deref(), Some("cause"));
        assert!(own.is_invalid() && !own.is_transient());

        let down = SetupError::<BadUrl>::Connect {
            store: "postgres://app@db:5432/app".to_owned(),
            source: StoreError::Timeout(std::time::Duration::from_secs(1)),
        };
        assert_eq!(
            down.to_string(),
            "could not connect to postgres://app@db:5432/app"
        );
        assert!(down.is_transient() && !down.is_invalid());
        let refused = SetupError::<BadUrl>::Migrate {
            store: "s".to_owned(),
            source: StoreError::Rejected {
                message: "permission denied".to_owned(),
                source: None,
            },
        };
        assert_eq!(
            refused.to_string(),
            "could not create the lease tables on s"
        );
        assert!(!refused.is_transient());
        let old = SetupError::<BadUrl>::TooOld {
            store: "sqlite database /x.db".to_owned(),
            source: crate::skew::check_writer("99.0.0").unwrap_err(),
        };
        assert_eq!(old.to_string(), "sqlite database /x.db");
        assert!(!old.is_transient() && !old.is_invalid());
    }
}
