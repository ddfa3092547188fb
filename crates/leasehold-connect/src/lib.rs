//! Opens any leasehold store from its URL, so a program (the `leasehold` command, a service
//! configured by an environment variable) can leave the choice of store to its deployment.
//!
//! ```no_run
//! # async fn demo() -> Result<(), leasehold_connect::OpenError> {
//! let store = leasehold_connect::open_store(&leasehold_connect::store_url(None)).await?;
//! # Ok(()) }
//! ```
//!
//! Each store is behind a feature of the same name (`sqlite`, `redis`, `postgres`, `etcd`,
//! `mysql`; all on by default); a URL for a store whose feature is off is reported as such.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use leasehold::BoxStore;
use leasehold::store::BoxError;

/// The store used when neither `--store` nor `LEASEHOLD_STORE` is given: a SQLite file in the
/// working directory. It excludes only processes on one host.
pub const DEFAULT_STORE: &str = "sqlite:leasehold.db";

/// The URL schemes this crate knows, for messages.
const SCHEMES: &str = "sqlite:PATH, redis://, rediss://, redis+unix://, unix://, \
                       redis+sentinel://, redis+cluster://, postgres://, etcd://, etcds://, \
                       mysql://, mariadb://, or a PostgreSQL key=value connection string";

/// Why a store URL could not be opened. No variant carries the URL's text: each store displays
/// its own parsed, password-free form, so no password can reach a message. The store's own
/// error is the source (messages leave their cause to it: print the chain).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL's scheme names no store.
    #[error("unknown store URL scheme {scheme:?}; use {SCHEMES}")]
    UnknownScheme {
        /// The scheme (the text before the first `:`), or empty when there is none.
        scheme: String,
    },
    /// The store's feature was not enabled when this crate was built.
    #[error("this build has no {scheme} store; enable the leasehold-connect feature for it")]
    NotBuilt {
        /// The URL scheme.
        scheme: String,
    },
    /// The store rejected the URL or a setting in it: only a different URL can work.
    #[error("cannot open the {store} store")]
    Invalid {
        /// Which store: `sqlite`, `redis`, `postgres`, `etcd`, `mysql`.
        store: &'static str,
        /// The store crate's error.
        #[source]
        source: BoxError,
    },
    /// The store could not be reached or did not answer in time: retrying may succeed.
    #[error("cannot open the {store} store")]
    Unavailable {
        /// Which store.
        store: &'static str,
        /// The store crate's error.
        #[source]
        source: BoxError,
    },
    /// No store where the URL points, opened with [`open_existing_store`], which never creates
    /// one: a SQLite file that does not exist.
    #[error("cannot open the {store} store")]
    NotFound {
        /// Which store.
        store: &'static str,
        /// The store crate's error.
        #[source]
        source: BoxError,
    },
    /// Something other than a leasehold store where the URL points, opened with
    /// [`open_existing_store`]: an empty file, another application's database. Nothing was
    /// written to it.
    #[error("cannot open the {store} store")]
    NotAStore {
        /// Which store.
        store: &'static str,
        /// The store crate's error.
        #[source]
        source: BoxError,
    },
    /// The server refused the connection: a wrong user or password, a certificate, no
    /// permission to connect. Only another URL (or another grant on the server) can work.
    #[error("cannot open the {store} store")]
    Denied {
        /// Which store.
        store: &'static str,
        /// The store crate's error.
        #[source]
        source: BoxError,
    },
    /// The database the URL names does not exist on its server (a store creates its tables,
    /// never its database).
    #[error("cannot open the {store} store")]
    NoDatabase {
        /// Which store.
        store: &'static str,
        /// The database the URL names, to create.
        database: String,
        /// The store crate's error.
        #[source]
        source: BoxError,
    },
    /// The store answered with a refusal that retrying cannot fix: permissions on the tables,
    /// a read-only or foreign file, a newer release's data.
    #[error("cannot open the {store} store")]
    Refused {
        /// Which store.
        store: &'static str,
        /// The store crate's error.
        #[source]
        source: BoxError,
    },
}

impl OpenError {
    /// Whether retrying later may succeed (the store could not be reached or was too slow).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether the URL itself is at fault (an unknown scheme, a store this build lacks, a URL
    /// or setting the store rejects): bad input rather than a failing store.
    pub fn is_bad_url(&self) -> bool {
        matches!(
            self,
            Self::UnknownScheme { .. } | Self::NotBuilt { .. } | Self::Invalid { .. }
        )
    }

    /// Whether there is no store where the URL points ([`OpenError::NotFound`]).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// Whether what the URL points to is not a leasehold store ([`OpenError::NotAStore`]).
    pub fn is_not_a_store(&self) -> bool {
        matches!(self, Self::NotAStore { .. })
    }

    /// A store crate's error, sorted by whether the URL is at fault (`invalid`) or retrying may
    /// help (`transient`).
    #[cfg(any(
        feature = "sqlite",
        feature = "redis",
        feature = "postgres",
        feature = "etcd",
        feature = "mysql"
    ))]
    fn of<E: leasehold::store::StoreSetupError>(
        store: StoreKind,
        e: leasehold::store::SetupError<E>,
    ) -> Self {
        use leasehold::store::SetupError;
        let (invalid, transient) = (e.is_invalid(), e.is_transient());
        let store = store.as_str();
        match (&e, invalid, transient) {
            (SetupError::MissingDatabase { database, .. }, _, _) => Self::NoDatabase {
                store,
                database: database.clone(),
                source: Box::new(e),
            },
            (_, true, _) => Self::Invalid {
                store,
                source: Box::new(e),
            },
            (_, false, true) => Self::Unavailable {
                store,
                source: Box::new(e),
            },
            (SetupError::Connect { .. }, false, false) => Self::Denied {
                store,
                source: Box::new(e),
            },
            (_, false, false) => Self::Refused {
                store,
                source: Box::new(e),
            },
        }
    }
}

/// The store URL from `--store`, else `LEASEHOLD_STORE`; `None` when neither is given.
pub fn configured_store_url(flag: Option<String>) -> Option<String> {
    flag.filter(|s| !s.is_empty()).or_else(|| {
        std::env::var("LEASEHOLD_STORE")
            .ok()
            .filter(|s| !s.is_empty())
    })
}

/// The store URL from `--store`, else `LEASEHOLD_STORE`, else [`DEFAULT_STORE`].
pub fn store_url(flag: Option<String>) -> String {
    configured_store_url(flag).unwrap_or_else(|| DEFAULT_STORE.to_owned())
}

/// Which store a URL names, by its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreKind {
    /// `sqlite:PATH`.
    Sqlite,
    /// `redis://`, `rediss://`, `redis+unix://`, `unix://`, `redis+sentinel://` (a primary
    /// behind Sentinel), `redis+cluster://` (a Redis Cluster).
    Redis,
    /// `postgres://`, `postgresql://`, or a libpq `key=value` connection string
    /// (`host=/run/postgresql user=app dbname=app`).
    Postgres,
    /// `etcd://`, `etcds://`.
    Etcd,
    /// `mysql://`, `mariadb://` (MySQL or MariaDB).
    Mysql,
}

impl StoreKind {
    /// The store a URL names, from its scheme alone; a string that starts with a `key=` is a
    /// PostgreSQL `key=value` connection string.
    pub fn of(url: &str) -> Result<Self, OpenError> {
        if is_conninfo(url) {
            return Ok(Self::Postgres);
        }
        let scheme = url
            .split_once(':')
            .map(|(scheme, _)| scheme.to_ascii_lowercase())
            .unwrap_or_default();
        match scheme.as_str() {
            "sqlite" => Ok(Self::Sqlite),
            // `rediss+…`: the Redis store says TLS is not supported for these yet.
            "redis" | "rediss" | "redis+unix" | "unix" | "redis+sentinel" | "redis+cluster"
            | "rediss+sentinel" | "rediss+cluster" => Ok(Self::Redis),
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "etcd" | "etcds" => Ok(Self::Etcd),
            "mysql" | "mariadb" => Ok(Self::Mysql),
            // A scheme is letters, digits, `+ - .`; anything else is not one, so not shown.
            _ if scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
            {
                Err(OpenError::UnknownScheme { scheme })
            }
            _ => Err(OpenError::UnknownScheme {
                scheme: String::new(),
            }),
        }
    }

    /// The store's short name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Redis => "redis",
            Self::Postgres => "postgres",
            Self::Etcd => "etcd",
            Self::Mysql => "mysql",
        }
    }
}

/// Whether `url` is a libpq `key=value` connection string: its first word is a keyword (letters
/// and `_`) followed by `=`, which no URL (a scheme ends at `:`) or `sqlite:PATH` is.
fn is_conninfo(url: &str) -> bool {
    let first = url.trim_start();
    match first.split_once('=') {
        Some((key, _)) => {
            let key = key.trim_end();
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphabetic() || c == '_')
        }
        None => false,
    }
}

#[cfg(feature = "sqlite")]
fn sqlite_error(e: leasehold_sqlite::Error) -> OpenError {
    use leasehold_sqlite::SqliteSetupError as E;
    let store = StoreKind::Sqlite.as_str();
    match e {
        leasehold_sqlite::Error::Store(E::NotFound { .. }) => OpenError::NotFound {
            store,
            source: Box::new(e),
        },
        leasehold_sqlite::Error::Store(E::NotAStore { .. }) => OpenError::NotAStore {
            store,
            source: Box::new(e),
        },
        e => OpenError::of(StoreKind::Sqlite, e),
    }
}

/// Opens the store a URL names and checks that it answers: `sqlite:PATH`, `redis://…`,
/// `rediss://…`, `redis+unix://…`, `redis+sentinel://[user:pw@]host:26379[,…]/MASTER[?db=N]`,
/// `redis+cluster://[user:pw@]host:port[,…]`, `postgres://…` (or `postgresql://…`, or a libpq
/// `key=value` connection string such as `host=/run/postgresql user=app dbname=app`),
/// `etcd://…` (or `etcds://…`), `mysql://…` (or `mariadb://…`).
pub async fn open_store(url: &str) -> Result<BoxStore, OpenError> {
    match StoreKind::of(url)? {
        #[cfg(feature = "sqlite")]
        StoreKind::Sqlite => leasehold_sqlite::connect(url)
            .await
            .map(BoxStore::new)
            .map_err(|e| OpenError::of(StoreKind::Sqlite, e)),
        #[cfg(feature = "redis")]
        StoreKind::Redis => leasehold_redis::connect(url)
            .await
            .map(BoxStore::new)
            .map_err(|e| OpenError::of(StoreKind::Redis, e)),
        #[cfg(feature = "postgres")]
        StoreKind::Postgres => leasehold_postgres::connect(url)
            .await
            .map(BoxStore::new)
            .map_err(|e| OpenError::of(StoreKind::Postgres, e)),
        #[cfg(feature = "etcd")]
        StoreKind::Etcd => leasehold_etcd::connect(url)
            .await
            .map(BoxStore::new)
            .map_err(|e| OpenError::of(StoreKind::Etcd, e)),
        #[cfg(feature = "mysql")]
        StoreKind::Mysql => leasehold_mysql::connect(url)
            .await
            .map(BoxStore::new)
            .map_err(|e| OpenError::of(StoreKind::Mysql, e)),
        // Reached only for a store whose feature is off.
        #[allow(unreachable_patterns)]
        other => Err(OpenError::NotBuilt {
            scheme: other.as_str().to_owned(),
        }),
    }
}

/// Opens the store a URL names as [`open_store`] does, but never creates one: for a program
/// that reads or controls a store others run on (`leasehold status`, `history`, `pause`), where
/// a mistyped SQLite path must fail ([`OpenError::NotFound`]) rather than answer from a new,
/// empty file, and a file that is not a leasehold store ([`OpenError::NotAStore`]: empty,
/// another application's database) is left untouched. A server store is opened as by
/// [`open_store`]: its server says whether the database exists.
pub async fn open_existing_store(url: &str) -> Result<BoxStore, OpenError> {
    match StoreKind::of(url)? {
        #[cfg(feature = "sqlite")]
        StoreKind::Sqlite => leasehold_sqlite::connect_existing(url)
            .await
            .map(BoxStore::new)
            .map_err(sqlite_error),
        _ => open_store(url).await,
    }
}

/// Opens the store a URL names without waiting for its server: a Redis, PostgreSQL, etcd or MySQL store is
/// returned at once and connects (and reconnects) in the background, answering every operation
/// with [`StoreError::Unavailable`](leasehold::StoreError::Unavailable) until its server answers,
/// so a scheduler can start during an outage and apply its store-down policy. A SQLite file is
/// opened at once (it has no server). Fails only on a URL that can never work
/// ([`OpenError::Invalid`]), or for SQLite a file it cannot use.
pub async fn open_store_lazy(url: &str) -> Result<BoxStore, OpenError> {
    match StoreKind::of(url)? {
        StoreKind::Sqlite => open_store(url).await,
        #[cfg(feature = "redis")]
        StoreKind::Redis => leasehold_redis::connect_lazy(url)
            .map(BoxStore::new)
            .map_err(|e| OpenError::of(StoreKind::Redis, e)),
        #[cfg(feature = "postgres")]
        StoreKind::Postgres => leasehold_postgres::connect_lazy(url)
            .map(BoxStore::new)
            .map_err(|e| OpenError::of(StoreKind::Postgres, e)),
        #[cfg(feature = "etcd")]
        StoreKind::Etcd => leasehold_etcd::connect_lazy(url)
            .map(BoxStore::new)
            .map_err(|e| OpenError::of(StoreKind::Etcd, e)),
        #[cfg(feature = "mysql")]
        StoreKind::Mysql => leasehold_mysql::connect_lazy(url)
            .map(BoxStore::new)
            .map_err(|e| OpenError::of(StoreKind::Mysql, e)),
        // Reached only for a store whose feature is off.
        #[allow(unreachable_patterns)]
        other => Err(OpenError::NotBuilt {
            scheme: other.as_str().to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error and its causes, as the `leasehold` command prints them.
    fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
        let mut out = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            out.push_str(&format!(": {c}"));
            cause = c.source();
        }
        out
    }

    #[tokio::test]
    async fn unknown_schemes_are_named_without_the_rest_of_the_url() {
        for (url, scheme) in [
            ("mssql://root:pw@localhost/db", "mssql"),
            ("http://x/?pass=SECRET", "http"),
            ("leases.db", ""),
            ("pw SECRET:x", ""),
        ] {
            let err = open_store(url).await.unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(
                matches!(&err, OpenError::UnknownScheme { scheme: s } if s == scheme),
                "{url}: {shown}"
            );
            assert!(err.is_bad_url());
            assert!(
                !shown.contains("pw") && !shown.contains("SECRET"),
                "{shown}"
            );
        }
    }

    /// Sentinel and Cluster URLs reach leasehold-redis's parsers: an unreachable deployment is
    /// a transient error whose cause shows the parsed URL, never its password; a URL the store
    /// cannot parse is bad input.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn replicated_redis_urls_open_without_showing_the_password() {
        for (url, shown) in [
            (
                "redis+sentinel://app:SECRET@127.0.0.1:1/main",
                "redis+sentinel://app@127.0.0.1:1/main?db=0",
            ),
            (
                "redis+cluster://:SECRET@127.0.0.1:1,127.0.0.1:2",
                "redis+cluster://127.0.0.1:1,127.0.0.1:2",
            ),
        ] {
            let err = open_store(url).await.unwrap_err();
            let message = format!("{} {err:?}", with_causes(&err));
            assert!(
                matches!(err, OpenError::Unavailable { store: "redis", .. }),
                "{message}"
            );
            assert!(err.is_transient());
            assert!(message.contains(shown), "{message}");
            assert!(!message.contains("SECRET"), "{message}");
        }
        let err = open_store("redis+sentinel://h:26379").await.unwrap_err();
        assert!(matches!(err, OpenError::Invalid { .. }), "{err:?}");
        assert!(err.is_bad_url());
        assert!(with_causes(&err).contains("primary's name"), "{err:?}");
    }

    /// The store's error stays the source, so the chain names the cause once.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn unparsable_urls_are_bad_input_and_keep_their_cause() {
        for url in ["postgres://h:notaport/db", "etcd://", "redis://h:x"] {
            let err = open_store_lazy(url).await.unwrap_err();
            assert!(err.is_bad_url(), "{url}: {err:?}");
            assert!(!err.is_transient());
            let line = with_causes(&err);
            assert!(std::error::Error::source(&err).is_some(), "{line}");
            let cause = std::error::Error::source(&err).unwrap().to_string();
            assert_eq!(line.matches(&cause).count(), 1, "{line}");
        }
    }

    /// A SQLite path without a file is not found, a file that is no store is refused, and
    /// neither is created or written; a store made by `open_store` opens.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn open_existing_store_never_creates_a_sqlite_file() {
        let dir = std::env::temp_dir().join(format!("lh-connect-existing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("typo.db");
        let err = open_existing_store(&format!("sqlite:{}", missing.display()))
            .await
            .unwrap_err();
        assert!(err.is_not_found(), "{err:?}");
        assert!(!err.is_transient() && !err.is_bad_url() && !err.is_not_a_store());
        assert!(with_causes(&err).contains("does not exist"), "{err:?}");
        assert!(!missing.exists());

        let empty = dir.join("empty.db");
        std::fs::write(&empty, b"").unwrap();
        let err = open_existing_store(&format!("sqlite:{}", empty.display()))
            .await
            .unwrap_err();
        assert!(err.is_not_a_store(), "{err:?}");
        assert!(!err.is_not_found());
        assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);

        let url = format!("sqlite:{}", dir.join("leases.db").display());
        drop(open_store(&url).await.unwrap());
        open_existing_store(&url).await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn schemes_name_their_store() {
        assert_eq!(StoreKind::of("sqlite:x.db").unwrap(), StoreKind::Sqlite);
        assert_eq!(StoreKind::of("REDISS://h").unwrap(), StoreKind::Redis);
        assert_eq!(StoreKind::of("redis+unix:///s").unwrap(), StoreKind::Redis);
        assert_eq!(
            StoreKind::of("redis+sentinel://h:26379/m").unwrap(),
            StoreKind::Redis
        );
        assert_eq!(
            StoreKind::of("redis+cluster://h:7000,i:7001").unwrap(),
            StoreKind::Redis
        );
        assert_eq!(
            StoreKind::of("postgresql://h/db").unwrap(),
            StoreKind::Postgres
        );
        assert_eq!(StoreKind::of("mysql://h/db").unwrap(), StoreKind::Mysql);
        assert_eq!(StoreKind::of("MariaDB://h/db").unwrap(), StoreKind::Mysql);
    }

    /// MySQL URLs reach leasehold-mysql: an unreachable server is a connect error that shows
    /// the parsed URL, never its password; a lazy store opens at once.
    #[cfg(feature = "mysql")]
    #[tokio::test]
    async fn mysql_urls_open_without_showing_the_password() {
        let err = open_store("mariadb://app:SECRET@127.0.0.1:1/db")
            .await
            .unwrap_err();
        let message = format!("{} {err:?}", with_causes(&err));
        assert!(
            matches!(err, OpenError::Unavailable { store: "mysql", .. }),
            "{message}"
        );
        assert!(message.contains("mysql://app@127.0.0.1:1/db"), "{message}");
        assert!(!message.contains("SECRET"), "{message}");
        let lazy = open_store_lazy("mysql://app:SECRET@127.0.0.1:1/db")
            .await
            .unwrap();
        assert!(!format!("{lazy:?}").contains("SECRET"));
        let err = open_store("mysql://app:SECRET@127.0.0.1:1/db?ssl-mode=preferred")
            .await
            .unwrap_err();
        assert!(with_causes(&err).contains("plain text"), "{err:?}");
    }

    /// Issue 31: the PostgreSQL README documents libpq's `key=value` form, which used to be
    /// refused as `unknown store URL scheme ""`.
    #[test]
    fn key_value_connection_strings_are_postgres() {
        for conninfo in [
            "host=/run/postgresql user=app dbname=app",
            "dbname=app",
            " host = db.internal port=5432 password=a:b@c",
            "application_name=x host=h",
        ] {
            assert_eq!(
                StoreKind::of(conninfo).unwrap(),
                StoreKind::Postgres,
                "{conninfo}"
            );
        }
        for not in [
            "leases.db",
            "sqlite:a=b.db",
            "redis://h/?x=1",
            "=x",
            "a-b=c",
        ] {
            assert_ne!(StoreKind::of(not).ok(), Some(StoreKind::Postgres), "{not}");
        }
    }

    /// A connection string reaches the PostgreSQL store, which shows it without its password.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn key_value_connection_strings_open_without_showing_the_password() {
        let err = open_store("host=127.0.0.1 port=1 user=app password=SECRET dbname=app")
            .await
            .unwrap_err();
        let message = format!("{} {err:?}", with_causes(&err));
        assert!(
            matches!(
                err,
                OpenError::Unavailable {
                    store: "postgres",
                    ..
                }
            ),
            "{message}"
        );
        assert!(!message.contains("SECRET"), "{message}");
    }
}
