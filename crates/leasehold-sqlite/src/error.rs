//! Errors from opening and configuring; store operations report [`leasehold::StoreError`].

use std::path::PathBuf;

use leasehold::store::{SetupError, StoreSetupError};

/// Why a [`SqliteStore`](crate::SqliteStore) could not be set up: the file is in use by a newer
/// release ([`TooOld`](SetupError::TooOld), which names the file as `sqlite database PATH`), or
/// one of [`SqliteSetupError`]. A file has no server to connect to nor tables to create
/// apart from opening it, so [`Connect`](SetupError::Connect) and
/// [`Migrate`](SetupError::Migrate) never happen here.
pub type Error = SetupError<SqliteSetupError>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The SQLite store's own setup errors: a bad URL or setting, a file it cannot use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteSetupError {
    /// The URL is not a `sqlite:PATH` URL this crate accepts.
    #[error("invalid sqlite url {url}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value is out of range.
    #[error("invalid sqlite store configuration: {0}")]
    Config(String),
    /// The directory that should hold the database file does not exist (it is not created).
    #[error("directory {} of sqlite database {} does not exist", dir.display(), path.display())]
    MissingDirectory {
        /// The database file.
        path: PathBuf,
        /// Its missing parent directory.
        dir: PathBuf,
    },
    /// No file at the path, for [`SqliteStore::open_existing`](crate::SqliteStore::open_existing),
    /// which never creates one (a mistyped path must not become a new, empty store). The path
    /// is made absolute, so the message says where it was looked for.
    #[error("sqlite database {} does not exist", path.display())]
    NotFound {
        /// The database file, absolute.
        path: PathBuf,
    },
    /// The file exists but is not a leasehold store, for
    /// [`SqliteStore::open_existing`](crate::SqliteStore::open_existing), which neither adds
    /// leasehold's tables to another database nor writes anything to it.
    #[error("{} is not a leasehold store: {found}", path.display())]
    NotAStore {
        /// The file, absolute.
        path: PathBuf,
        /// What it holds instead.
        found: FileContents,
    },
    /// The path exists but is not a regular file.
    #[error("sqlite database path {} is not a file", path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The file (or its directory, which must hold the `-wal` and `-shm` files) cannot be
    /// opened for reading and writing, e.g. for lack of permission.
    #[error("cannot open sqlite database {}", path.display())]
    Io {
        /// The database file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite could not open the file, switch it to WAL mode or create the schema (not a
    /// database, locked past the busy timeout, read-only directory, …).
    #[error("cannot open sqlite database {}", path.display())]
    Open {
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// SQLite would not switch the file to WAL mode (e.g. a filesystem without shared memory
    /// support); several processes could then not share it safely.
    #[error("sqlite database {} cannot use WAL mode (journal mode is {mode})", path.display())]
    NoWal {
        /// The database file.
        path: PathBuf,
        /// The journal mode SQLite kept.
        mode: String,
    },
    /// The file holds a newer schema than this version of the crate understands.
    #[error(
        "sqlite database {} has schema version {found}; this build supports up to {supported}",
        path.display()
    )]
    SchemaTooNew {
        /// The database file.
        path: PathBuf,
        /// The file's `user_version`.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// A background task could not be started (no tokio runtime, or it panicked).
    #[error("sqlite store setup failed: {0}")]
    Runtime(String),
}

/// What a file that is not a leasehold store holds ([`SqliteSetupError::NotAStore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileContents {
    /// Nothing: an empty file, or a SQLite database without tables, still so after a second
    /// (a store another process is creating gets its tables within it).
    Empty,
    /// A SQLite database without leasehold's `leases` table: another application's.
    OtherDatabase,
    /// Something SQLite cannot read as a database.
    NotSqlite,
}

impl std::fmt::Display for FileContents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Empty => "the file is empty",
            Self::OtherDatabase => "it is a SQLite database without leasehold's tables",
            Self::NotSqlite => "it is not a SQLite database",
        })
    }
}

impl StoreSetupError for SqliteSetupError {
    /// The file is locked past the busy timeout, the disk is full or failing. A file this
    /// process may not write (permissions, a read-only file or filesystem), a foreign or newer
    /// file, a missing directory and a bad URL or setting are not transient.
    fn is_transient(&self) -> bool {
        use rusqlite::ErrorCode as C;
        use std::io::ErrorKind as K;
        match self {
            Self::Io { source, .. } => !matches!(
                source.kind(),
                K::PermissionDenied | K::ReadOnlyFilesystem | K::IsADirectory
            ),
            Self::Open { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(C::DatabaseBusy | C::DatabaseLocked | C::DiskFull | C::SystemIoFailure)
            ),
            _ => false,
        }
    }

    fn is_invalid(&self) -> bool {
        matches!(self, Self::InvalidUrl { .. } | Self::Config(_))
    }
}
