//! Errors from opening and configuring; store operations report [`leasehold::StoreError`].

use std::path::PathBuf;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`SqliteStore`](crate::SqliteStore) could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// The file is in use by a newer release that does not let this one write to it
    /// (`meta.min_writer`, see [`leasehold::skew`]). Nothing was written.
    #[error("sqlite database {}", path.display())]
    TooOld {
        /// The database file.
        path: PathBuf,
        /// The release the file needs.
        #[source]
        source: leasehold::skew::TooOld,
    },
    /// A background task could not be started (no tokio runtime, or it panicked).
    #[error("sqlite store setup failed: {0}")]
    Runtime(String),
}

impl Error {
    /// Whether retrying later may succeed: the file is locked past the busy timeout, the disk
    /// is full or failing. A file this process may not write (permissions, a read-only file or
    /// filesystem), a foreign or newer file, a missing directory and a bad URL or setting are
    /// not transient.
    pub fn is_transient(&self) -> bool {
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
}
