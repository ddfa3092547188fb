//! [`SqliteStore`]: the [`Store`] on one SQLite file.

use std::collections::HashSet;
use std::fmt;
use std::fs::OpenOptions;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use leasehold::catalog::{
    ControlRead, Forgetting, InstanceRecord, LeaseRecord, Registration, TaskRecord, Versioned,
};
use leasehold::skew;
use leasehold::store::{
    Acquisition, ReleaseHub, ReleaseSubscription, Renewal, SlotClaim, StoreResult, within,
};
use leasehold::{
    Catalog, FencingToken, HolderId, LeaseName, LeaseState, Membership, Purge, Release, Slots,
    Store, StoreError,
};
use leasehold_sql::column;
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior};
use tokio::sync::Mutex;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::SqliteConfig;
use crate::error::{Error, FileContents, Result, SqliteSetupError};
use crate::host_clock;
use crate::poller::{self, LocalReleases, Poller};
use crate::schema::{self, open_connection};

/// Leases in one SQLite file, shared by every process on this host that opens it.
///
/// Cheap to clone: clones share one connection (operations of one handle run one at a time) and
/// one release poller, which stops when the last clone is dropped. Open the file once per
/// process and clone the handle.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    config: SqliteConfig,
    /// Present when notifications are on.
    hub: Option<ReleaseHub>,
    local_releases: LocalReleases,
    /// Stops the poller when the last handle goes.
    _stop_poller: Option<DropGuard>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("config", &self.inner.config)
            .finish()
    }
}

impl SqliteStore {
    /// Opens the database file at `path`, creating the file (not its directory) and the schema
    /// if needed, in WAL mode. With notifications on, starts the release poller (needs a tokio
    /// runtime, as do all operations).
    ///
    /// Errors, each a [`SqliteSetupError`] in [`Error::Store`]: `Config` for bad settings,
    /// `MissingDirectory`, `NotAFile`, `Io` (e.g. permission denied) for an unusable path,
    /// `Open` / `NoWal` / `SchemaTooNew` when SQLite cannot use it; and [`Error::TooOld`] for a
    /// file a newer release does not let this one write.
    pub async fn open(path: impl AsRef<Path>, config: SqliteConfig) -> Result<Self> {
        Self::open_in(path.as_ref(), config, Existing::Create).await
    }

    /// Opens the leasehold store in the file at `path` as [`open`](Self::open) does (an older
    /// schema is brought up to date), but never creates one and writes nothing to a file that
    /// is not a leasehold store: for a program that reads or controls a store others run on,
    /// where a mistyped path must fail rather than answer from a new, empty store.
    ///
    /// Errors: as [`open`](Self::open), and [`SqliteSetupError::NotFound`] when no file is at `path`,
    /// [`SqliteSetupError::NotAStore`] for an empty file, another database or a file that is not SQLite.
    pub async fn open_existing(path: impl AsRef<Path>, config: SqliteConfig) -> Result<Self> {
        Self::open_in(path.as_ref(), config, Existing::Required).await
    }

    async fn open_in(path: &Path, config: SqliteConfig, existing: Existing) -> Result<Self> {
        config.validate()?;
        let path = path.to_path_buf();
        let (conn, poller) = {
            let (path, config) = (path.clone(), config.clone());
            tokio::task::spawn_blocking(move || open_blocking(&path, &config, existing))
                .await
                .map_err(|e| SqliteSetupError::Runtime(e.to_string()))??
        };
        let local_releases: LocalReleases = Arc::new(StdMutex::new(HashSet::new()));
        let (hub, stop) = match poller {
            Some(poller) => {
                let hub = ReleaseHub::new();
                let stop = CancellationToken::new();
                tokio::spawn(poller::run(
                    poller,
                    hub.clone(),
                    local_releases.clone(),
                    config.notify_poll_interval,
                    stop.clone(),
                ));
                (Some(hub), Some(stop.drop_guard()))
            }
            None => (None, None),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                conn: Arc::new(Mutex::new(conn)),
                path,
                config,
                hub,
                local_releases,
                _stop_poller: stop,
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The settings this store was opened with.
    pub fn config(&self) -> &SqliteConfig {
        &self.inner.config
    }

    /// Runs `op` on this handle's connection on the blocking pool, within the op timeout.
    async fn run<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> std::result::Result<T, Fail> + Send + 'static,
    {
        let conn = self.inner.conn.clone();
        let limit = self.inner.config.op_timeout;
        let work = async move {
            let mut conn = conn.lock_owned().await;
            match tokio::task::spawn_blocking(move || op(&mut conn)).await {
                Err(join) => Err(StoreError::unavailable("sqlite operation failed", join)),
                Ok(result) => result.map_err(Fail::into_store_error),
            }
        };
        within(limit, work).await
    }
}

/// Whether opening may create the file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Existing {
    /// Create the file and the schema if missing ([`SqliteStore::open`]).
    Create,
    /// The file must exist and be a leasehold store ([`SqliteStore::open_existing`]).
    Required,
}

fn open_blocking(
    path: &Path,
    config: &SqliteConfig,
    existing: Existing,
) -> Result<(Connection, Option<Poller>)> {
    // Switching a new file to WAL mode takes an exclusive lock, and SQLite reports some lock
    // conflicts while several processes open the same new file without calling the busy
    // handler; retry those until the busy timeout has passed. A file with nothing in it may be
    // a store another process has just created and not yet given its tables: it is looked at
    // again for a while before being called empty.
    let started = std::time::Instant::now();
    loop {
        match check_path(path, existing).and_then(|()| open_once(path, config, existing)) {
            Err(Error::Store(SqliteSetupError::Open { source, .. }))
                if is_busy(&source) && started.elapsed() < config.busy_timeout =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(Error::Store(SqliteSetupError::NotAStore {
                found: FileContents::Empty,
                ..
            })) if started.elapsed() < CREATION_GRACE => {
                std::thread::sleep(Duration::from_millis(10));
            }
            result => return result,
        }
    }
}

/// How long [`SqliteStore::open_existing`] waits for an empty file to become a store: the
/// creating process writes the file, then its first page, then its tables, within a few
/// milliseconds (more on a loaded host).
const CREATION_GRACE: Duration = Duration::from_secs(1);

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

fn open_once(
    path: &Path,
    config: &SqliteConfig,
    existing: Existing,
) -> Result<(Connection, Option<Poller>)> {
    let open_err = |source| SqliteSetupError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut conn = match open_connection(path, config) {
        Err(e) if existing == Existing::Required => return Err(required_error(e, path)),
        opened => opened.map_err(open_err)?,
    };
    // Before the switch to WAL mode, the first write.
    if existing == Existing::Required {
        check_is_store(&conn, path)?;
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .map_err(open_err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(SqliteSetupError::NoWal {
            path: path.to_path_buf(),
            mode,
        }
        .into());
    }
    // Before anything is written: a newer release may not let this one write to the file.
    if let Some(recorded) = meta_value(&conn, skew::MIN_WRITER_KEY).map_err(open_err)? {
        skew::check_writer(&recorded).map_err(|source| Error::TooOld {
            store: format!("sqlite database {}", path.display()),
            source,
        })?;
    }
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(open_err)?;
    if version != schema::SCHEMA_VERSION {
        // Several processes may open a new file at once: the write lock serializes them and
        // the version is read again under it.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(open_err)?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(open_err)?;
        if version > schema::SCHEMA_VERSION {
            return Err(SqliteSetupError::SchemaTooNew {
                path: path.to_path_buf(),
                found: version,
                supported: schema::SCHEMA_VERSION,
            }
            .into());
        }
        tx.execute_batch(schema::SCHEMA).map_err(open_err)?;
        if version == 1 || version == 2 {
            // Expiries were on the wall clock: move them to the host clock.
            let wall: i64 = tx
                .query_row(schema::NOW, [], |r| r.get(0))
                .map_err(open_err)?;
            let host =
                host_clock::now_ms().map_err(|e| SqliteSetupError::Runtime(e.to_string()))?;
            tx.execute(schema::TO_HOST_CLOCK, [wall, host])
                .map_err(open_err)?;
        }
        tx.pragma_update(None, "user_version", schema::SCHEMA_VERSION)
            .map_err(open_err)?;
        tx.commit().map_err(open_err)?;
    }
    add_catalog(&mut conn).map_err(open_err)?;
    record_release(&mut conn).map_err(open_err)?;
    check_boot(&mut conn).map_err(open_err)?;
    let poller = if config.notifications {
        Some(Poller::open(path, config).map_err(open_err)?)
    } else {
        None
    };
    Ok((conn, poller))
}

/// Creates the catalog's tables if they are missing, whatever `user_version` says: a file that
/// release 0.1.0 created or migrated is at version 4 without them (see
/// [`schema::CATALOG_SCHEMA`]).
fn add_catalog(conn: &mut Connection) -> rusqlite::Result<()> {
    let present = |conn: &Connection| -> rusqlite::Result<bool> {
        conn.query_row(schema::CATALOG_TABLES, [], |r| r.get::<_, i64>(0))
            .map(|n| n == 2)
    };
    if present(conn)? {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(schema::CATALOG_SCHEMA)?;
    tx.commit()
}

/// A `meta` value, `None` when the row or the table is missing.
fn meta_value(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    if conn.query_row(schema::HAS_META, [], |r| r.get::<_, i64>(0))? == 0 {
        return Ok(None);
    }
    conn.query_row(schema::META_VALUE, [key], |r| r.get(0))
        .optional()
}

/// Records the tables' schema version and the oldest release that may still write to the file
/// (`meta`, see [`leasehold::skew`]) where they are missing or lower; never lowers them.
fn record_release(conn: &mut Connection) -> rusqlite::Result<()> {
    let stale = |conn: &Connection| -> rusqlite::Result<(bool, Option<&'static str>)> {
        let tables = meta_value(conn, skew::SCHEMA_VERSION_KEY)?;
        let tables_behind = tables
            .and_then(|v| v.parse::<i64>().ok())
            .is_none_or(|v| v < schema::TABLES_VERSION);
        let min_writer = meta_value(conn, skew::MIN_WRITER_KEY)?;
        Ok((
            tables_behind,
            skew::raised_min_writer(min_writer.as_deref()),
        ))
    };
    if stale(conn)? == (false, None) {
        return Ok(());
    }
    // Again under the write lock, so racing opens (or a newer release) are not overwritten.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (tables_behind, min_writer) = stale(&tx)?;
    if tables_behind {
        let version = schema::TABLES_VERSION.to_string();
        tx.execute(schema::SET_META_VALUE, [skew::SCHEMA_VERSION_KEY, &version])?;
    }
    if let Some(min_writer) = min_writer {
        tx.execute(schema::SET_META_VALUE, [skew::MIN_WRITER_KEY, min_writer])?;
    }
    tx.commit()
}

/// Leases of an earlier boot of this host are over: their expiries are on a clock that restarted.
/// Checked on open (every process using the file on this host started after the boot). The
/// catalog's instances have a boot id of their own, since a release without the catalog may
/// have been first to see the new boot.
fn check_boot(conn: &mut Connection) -> rusqlite::Result<()> {
    let Some(boot) = host_clock::boot_id() else {
        return Ok(());
    };
    let recorded = |conn: &Connection, sql: &str| -> rusqlite::Result<Option<String>> {
        conn.query_row(sql, [], |r| r.get(0)).optional()
    };
    let current = |id: &Option<String>| id.as_deref() == Some(boot.as_str());
    if current(&recorded(conn, schema::BOOT_ID)?)
        && current(&recorded(conn, schema::CATALOG_BOOT_ID)?)
    {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let leases_boot = recorded(&tx, schema::BOOT_ID)?;
    if !current(&leases_boot) {
        if leases_boot.is_some() {
            tx.execute_batch(schema::EXPIRE_ALL)?;
        }
        tx.execute(schema::SET_BOOT_ID, [&boot])?;
    }
    if !current(&recorded(&tx, schema::CATALOG_BOOT_ID)?) {
        tx.execute(schema::EXPIRE_INSTANCES, [])?;
        tx.execute(schema::SET_CATALOG_BOOT_ID, [&boot])?;
    }
    tx.commit()
}

/// Whether the file SQLite opened holds leasehold's `leases` table (every schema version has
/// it, with these columns); reads only.
fn check_is_store(conn: &Connection, path: &Path) -> Result<()> {
    let not_a_store = |found| SqliteSetupError::NotAStore {
        path: absolute(path),
        found,
    };
    let counted = |sql: &str| {
        conn.query_row(sql, [], |r| r.get::<_, i64>(0))
            .map_err(|e| required_error(e, path))
    };
    if counted(schema::LEASES_COLUMNS)? == schema::LEASES_COLUMN_COUNT {
        return Ok(());
    }
    let tables = counted(schema::TABLE_COUNT)?;
    Err(not_a_store(if tables == 0 {
        FileContents::Empty
    } else {
        FileContents::OtherDatabase
    })
    .into())
}

/// SQLite's error on a file that must be a leasehold store: one SQLite cannot read is not a
/// store; the others (a lock held past the busy timeout, say) are as for any open.
fn required_error(source: rusqlite::Error, path: &Path) -> Error {
    let error = match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => SqliteSetupError::NotAStore {
            path: absolute(path),
            found: FileContents::NotSqlite,
        },
        _ => SqliteSetupError::Open {
            path: path.to_path_buf(),
            source,
        },
    };
    error.into()
}

/// `path` from the root, for a message saying where a file was looked for.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Turns the common ways a path is unusable into clear errors before SQLite sees it; creates
/// the file when `existing` allows it (SQLite itself never does, see
/// [`open_connection`](schema::open_connection)).
fn check_path(path: &Path, existing: Existing) -> Result<()> {
    if existing == Existing::Required {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SqliteSetupError::NotFound {
                    path: absolute(path),
                }
                .into());
            }
            // Empty: SQLite would take it for an empty database and write to it.
            Ok(m) if m.is_file() && m.len() == 0 => {
                return Err(SqliteSetupError::NotAStore {
                    path: absolute(path),
                    found: FileContents::Empty,
                }
                .into());
            }
            _ => {}
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(SqliteSetupError::NotAFile {
                path: dir.to_path_buf(),
            }
            .into());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SqliteSetupError::MissingDirectory {
                path: path.to_path_buf(),
                dir: dir.to_path_buf(),
            }
            .into());
        }
        Err(source) => {
            return Err(SqliteSetupError::Io {
                path: path.to_path_buf(),
                source,
            }
            .into());
        }
    }
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(SqliteSetupError::NotAFile {
            path: path.to_path_buf(),
        }
        .into());
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(existing == Existing::Create)
        .truncate(false)
        .open(path)
        .map(drop)
        .map_err(|source| {
            SqliteSetupError::Io {
                path: path.to_path_buf(),
                source,
            }
            .into()
        })
}

/// Why an operation failed, before it becomes a [`StoreError`].
pub(crate) enum Fail {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl Fail {
    fn into_store_error(self) -> StoreError {
        match self {
            Self::Store(e) => e,
            Self::Sql(e) => store_error(e),
        }
    }
}

/// Maps SQLite's errors: lock contention and I/O trouble are transient (`Unavailable`), a
/// refusal (read-only file, no permission, constraint) is `Rejected`, an unreadable file or row
/// is `Corrupt`.
fn store_error(e: rusqlite::Error) -> StoreError {
    use rusqlite::Error as E;
    match &e {
        E::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => StoreError::unavailable(
                "sqlite database is locked by another connection past the busy timeout",
                e,
            ),
            ErrorCode::ReadOnly
            | ErrorCode::PermissionDenied
            | ErrorCode::AuthorizationForStatementDenied
            | ErrorCode::ConstraintViolation
            | ErrorCode::TooBig
            | ErrorCode::TypeMismatch => {
                StoreError::rejected(format!("sqlite refused the operation: {e}"), e)
            }
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                StoreError::Corrupt(format!("sqlite database: {e}"))
            }
            // Transient: space may be freed.
            ErrorCode::DiskFull => StoreError::unavailable(
                format!("the disk holding the sqlite database is full ({e})"),
                e,
            ),
            _ => StoreError::unavailable(format!("sqlite operation failed: {e}"), e),
        },
        E::FromSqlConversionFailure(..)
        | E::IntegralValueOutOfRange(..)
        | E::InvalidColumnType(..) => StoreError::Corrupt(format!("lease row: {e}")),
        _ => StoreError::unavailable(format!("sqlite operation failed: {e}"), e),
    }
}

/// A ttl in whole milliseconds, rounded up, capped far beyond any real lease so `now + ttl`
/// cannot overflow.
fn ttl_ms(ttl: Duration) -> i64 {
    const CAP: u128 = 1 << 50;
    ttl.as_micros().div_ceil(1000).min(CAP) as i64
}

/// A token as SQLite stores it; tokens past `i64::MAX` never exist, so such a token matches
/// nothing.
fn token_sql(token: FencingToken) -> i64 {
    i64::try_from(token.get()).unwrap_or(-1)
}

fn remaining(expires_at_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(expires_at_ms.saturating_sub(now_ms).max(0) as u64)
}

/// A lease row as [`Store::inspect`] answers it: held only until it expires.
fn lease_state(
    holder: Option<String>,
    token: i64,
    expires_at_ms: i64,
    now_ms: i64,
) -> std::result::Result<LeaseState, StoreError> {
    let remaining_us = expires_at_ms.saturating_sub(now_ms).saturating_mul(1000);
    column::lease_state(holder, token, Some(remaining_us))
}

fn acquire_tx(
    conn: &mut Connection,
    name: &str,
    holder: &HolderId,
    ttl: i64,
) -> std::result::Result<Acquisition, Fail> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let host_now = host_clock::now_ms()?;
    let (now, current, token, expires): (i64, Option<String>, Option<i64>, Option<i64>) = tx
        .prepare_cached(schema::READ_FOR_ACQUIRE)?
        .query_row(rusqlite::params![name, host_now], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?;
    let live = match (current, expires) {
        (Some(h), Some(exp)) if exp > now => Some((h, exp)),
        _ => None,
    };
    // Busy only while another holder's tenure is live; the holder itself gets a new tenure.
    let answer = match live {
        Some((h, exp)) if h != holder.as_str() => Acquisition::Busy {
            holder: column::holder(h)?,
            remaining: remaining(exp, now),
        },
        _ => {
            let next = match token {
                Some(t) => t
                    .checked_add(1)
                    .ok_or_else(|| StoreError::Corrupt("fencing token overflow".to_owned()))?,
                None => tx
                    .prepare_cached(schema::SEED_TOKEN)?
                    .query_row([], |r| r.get(0))?,
            };
            tx.prepare_cached(schema::TAKE)?.execute(rusqlite::params![
                name,
                holder.as_str(),
                next,
                ttl,
                now
            ])?;
            Acquisition::Acquired {
                token: column::token(next)?,
            }
        }
    };
    tx.commit()?;
    Ok(answer)
}

fn release_tx(
    conn: &mut Connection,
    name: &str,
    holder: &str,
    token: i64,
    local: Option<&LocalReleases>,
) -> std::result::Result<Release, Fail> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = host_clock::now_ms()?;
    let changed = tx
        .prepare_cached(schema::RELEASE)?
        .execute(rusqlite::params![name, holder, token, now])?;
    if changed == 0 {
        tx.commit()?;
        return Ok(Release::NotHeld);
    }
    tx.prepare_cached(schema::LOG_RELEASE)?.execute([name])?;
    let seq = tx.last_insert_rowid();
    if seq % schema::PRUNE_EVERY == 0 {
        tx.prepare_cached(schema::PRUNE_RELEASES)?
            .execute([schema::RELEASE_RETENTION_MS])?;
    }
    // Recorded before the commit makes the row visible to the poller, so it is published once.
    if let Some(local) = local {
        local.lock().unwrap_or_else(|p| p.into_inner()).insert(seq);
    }
    if let Err(e) = tx.commit() {
        if let Some(local) = local {
            local.lock().unwrap_or_else(|p| p.into_inner()).remove(&seq);
        }
        return Err(e.into());
    }
    Ok(Release::Released)
}

fn claim_slot_tx(
    conn: &mut Connection,
    task: &str,
    slot: i64,
) -> std::result::Result<SlotClaim, Fail> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let changed = tx
        .prepare_cached(schema::CLAIM_SLOT)?
        .execute(rusqlite::params![task, slot])?;
    let answer = if changed == 1 {
        SlotClaim::Claimed
    } else {
        let last: i64 = tx
            .prepare_cached(schema::LAST_SLOT)?
            .query_row([task], |r| r.get(0))?;
        SlotClaim::AlreadyRun {
            last: u64::try_from(last)
                .map_err(|_| StoreError::Corrupt(format!("negative slot {last}")))?,
        }
    };
    tx.commit()?;
    Ok(answer)
}

impl Store for SqliteStore {
    fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Acquisition>> + Send {
        let (name, holder, ttl) = (name.as_str().to_owned(), holder.clone(), ttl_ms(ttl));
        self.run(move |conn| acquire_tx(conn, &name, &holder, ttl))
    }

    fn renew(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Renewal>> + Send {
        let (name, holder) = (name.as_str().to_owned(), holder.as_str().to_owned());
        let (token, ttl) = (token_sql(token), ttl_ms(ttl));
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = host_clock::now_ms()?;
            let changed = tx
                .prepare_cached(schema::RENEW)?
                .execute(rusqlite::params![name, holder, token, ttl, now])?;
            tx.commit()?;
            Ok(if changed == 1 {
                Renewal::Renewed
            } else {
                Renewal::Lost
            })
        })
    }

    fn release(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
    ) -> impl Future<Output = StoreResult<Release>> + Send {
        let (name, holder, token) = (name.clone(), holder.as_str().to_owned(), token_sql(token));
        let local = self
            .inner
            .hub
            .as_ref()
            .map(|_| self.inner.local_releases.clone());
        let hub = self.inner.hub.clone();
        let op = {
            let name = name.as_str().to_owned();
            self.run(move |conn| release_tx(conn, &name, &holder, token, local.as_ref()))
        };
        async move {
            let answer = op.await?;
            if let (Release::Released, Some(hub)) = (answer, hub) {
                hub.publish(name.as_str());
            }
            Ok(answer)
        }
    }

    fn inspect(
        &self,
        name: &LeaseName,
    ) -> impl Future<Output = StoreResult<Option<LeaseState>>> + Send {
        let name = name.as_str().to_owned();
        self.run(move |conn| {
            let now = host_clock::now_ms()?;
            let row: Option<(Option<String>, i64, i64, i64)> = conn
                .prepare_cached(schema::INSPECT)?
                .query_row(rusqlite::params![name, now], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .optional()?;
            let Some((holder, token, expires, now)) = row else {
                return Ok(None);
            };
            Ok(Some(lease_state(holder, token, expires, now)?))
        })
    }

    fn now_millis(&self) -> impl Future<Output = StoreResult<u64>> + Send {
        self.run(|conn| {
            let now: i64 = conn
                .prepare_cached(schema::NOW)?
                .query_row([], |r| r.get(0))?;
            u64::try_from(now)
                .map_err(|_| Fail::Store(StoreError::Corrupt(format!("store clock {now}"))))
        })
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.inner.hub.as_ref().map(ReleaseHub::subscribe)
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.inner.path.display())
    }

    /// One transaction for the whole batch.
    fn renew_many(
        &self,
        holder: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<Renewal>>> + Send {
        let holder = holder.as_str().to_owned();
        let leases: Vec<(String, i64)> = leases
            .iter()
            .map(|(name, token)| (name.as_str().to_owned(), token_sql(*token)))
            .collect();
        let ttl = ttl_ms(ttl);
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = host_clock::now_ms()?;
            let mut renewals = Vec::with_capacity(leases.len());
            {
                let mut renew = tx.prepare_cached(schema::RENEW)?;
                for (name, token) in &leases {
                    let changed =
                        renew.execute(rusqlite::params![name, holder, token, ttl, now])?;
                    renewals.push(if changed == 1 {
                        Renewal::Renewed
                    } else {
                        Renewal::Lost
                    });
                }
            }
            tx.commit()?;
            Ok(renewals)
        })
    }
}

leasehold::declare_capabilities!(SqliteStore: SLOTS | PURGE | MEMBERSHIP | CATALOG);

impl Slots for SqliteStore {
    fn claim_slot(
        &self,
        task: &LeaseName,
        slot: u64,
    ) -> impl Future<Output = StoreResult<SlotClaim>> + Send {
        let task = task.as_str().to_owned();
        let slot = i64::try_from(slot);
        async move {
            let Ok(slot) = slot else {
                return Err(StoreError::Rejected {
                    message: "slot numbers above 2^63-1 do not fit in sqlite".to_owned(),
                    source: None,
                });
            };
            self.run(move |conn| claim_slot_tx(conn, &task, slot)).await
        }
    }

    fn last_slot(&self, task: &LeaseName) -> impl Future<Output = StoreResult<Option<u64>>> + Send {
        let task = task.as_str().to_owned();
        self.run(move |conn| {
            let last: Option<i64> = conn
                .prepare_cached(schema::LAST_SLOT)?
                .query_row([&task], |r| r.get(0))
                .optional()?;
            Ok(last.map(column::slot).transpose()?)
        })
    }

    fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let (task, entry) = (task.as_str().to_owned(), entry.to_owned());
        let keep = i64::try_from(keep.max(1)).unwrap_or(i64::MAX);
        let key = i64::try_from(key);
        async move {
            // Keys are slot times and start times in ms: far below 2^63.
            let Ok(key) = key else {
                return Err(StoreError::Rejected {
                    message: "history keys above 2^63-1 do not fit in sqlite".to_owned(),
                    source: None,
                });
            };
            self.run(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                tx.prepare_cached(schema::RECORD_HISTORY)?
                    .execute(rusqlite::params![task, key, entry])?;
                tx.prepare_cached(schema::TRIM_HISTORY)?
                    .execute(rusqlite::params![task, keep])?;
                tx.commit()?;
                Ok(())
            })
            .await
        }
    }

    fn history(
        &self,
        task: &LeaseName,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<String>>> + Send {
        let task = task.as_str().to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(schema::HISTORY)?;
            let rows = stmt.query_map(rusqlite::params![task, limit], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<String>>>()?)
        })
    }
}

impl Purge for SqliteStore {
    fn purge(&self, retention: Duration) -> impl Future<Output = StoreResult<u64>> + Send {
        let retention = ttl_ms(retention);
        self.run(move |conn| {
            let now = host_clock::now_ms()?;
            let deleted = conn
                .prepare_cached(schema::PURGE)?
                .execute(rusqlite::params![now, retention])?;
            Ok(deleted as u64)
        })
    }
}

impl Membership for SqliteStore {
    /// One transaction: refresh, drop the expired, read; expiries on the host's clock as leases'.
    fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<HolderId>>> + Send {
        let (group, member) = (group.as_str().to_owned(), member.as_str().to_owned());
        let ttl = ttl_ms(ttl);
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = host_clock::now_ms()?;
            tx.prepare_cached(schema::JOIN)?
                .execute(rusqlite::params![group, member, now, ttl])?;
            tx.prepare_cached(schema::DROP_EXPIRED_MEMBERS)?
                .execute(rusqlite::params![group, now])?;
            let members = tx
                .prepare_cached(schema::MEMBERS)?
                .query_map([&group], |r| r.get::<_, String>(0))?
                .map(|m| Ok(column::member(m?)?))
                .collect::<std::result::Result<Vec<_>, Fail>>()?;
            tx.commit()?;
            Ok(members)
        })
    }

    fn leave(
        &self,
        group: &LeaseName,
        member: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let (group, member) = (group.as_str().to_owned(), member.as_str().to_owned());
        self.run(move |conn| {
            conn.prepare_cached(schema::LEAVE)?
                .execute([&group, &member])?;
            Ok(())
        })
    }
}

/// Each operation one transaction (or one statement); heartbeats on the host's boot-time clock
/// like leases and memberships, the clock `control` answers on SQLite's wall clock like
/// `now_millis`.
impl Catalog for SqliteStore {
    fn register(
        &self,
        r: &Registration<'_>,
    ) -> impl Future<Output = StoreResult<Option<Versioned>>> + Send {
        let (task, definition) = (r.task.as_str().to_owned(), r.definition.to_owned());
        let (instance, about) = (r.instance.as_str().to_owned(), r.about.to_owned());
        let (ttl, forget_after) = (ttl_ms(r.ttl), ttl_ms(r.forget_after));
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = host_clock::now_ms()?;
            tx.prepare_cached(schema::PUT_DEFINITION)?
                .execute([&task, &definition])?;
            tx.prepare_cached(schema::HEARTBEAT)?
                .execute(rusqlite::params![task, instance, about, now, ttl])?;
            tx.prepare_cached(schema::FORGET_TASK_INSTANCES)?
                .execute(rusqlite::params![task, now, forget_after])?;
            let (version, value) = tx
                .prepare_cached(schema::TASK_CONTROL)?
                .query_row([&task], |r| Ok((r.get(0)?, r.get(1)?)))?;
            tx.commit()?;
            Ok(column::control(version, value)?)
        })
    }

    fn unregister(
        &self,
        task: &LeaseName,
        instance: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let (task, instance) = (task.as_str().to_owned(), instance.as_str().to_owned());
        self.run(move |conn| {
            conn.prepare_cached(schema::UNREGISTER)?
                .execute([&task, &instance])?;
            Ok(())
        })
    }

    /// Forgets what is due first (in the same transaction), so everything left is listed.
    fn tasks(
        &self,
        forget_after: Duration,
    ) -> impl Future<Output = StoreResult<Vec<TaskRecord>>> + Send {
        let forget_after = ttl_ms(forget_after);
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = host_clock::now_ms()?;
            tx.prepare_cached(schema::FORGET_INSTANCES)?
                .execute([now, forget_after])?;
            tx.prepare_cached(schema::FORGET_TASKS)?.execute([])?;
            let mut tasks: Vec<TaskRecord> = Vec::new();
            {
                let mut statement = tx.prepare_cached(schema::TASKS)?;
                let mut rows = statement.query([now])?;
                while let Some(row) = rows.next()? {
                    let task: String = row.get(0)?;
                    if tasks.last().is_none_or(|t| t.task.as_str() != task) {
                        tasks.push(TaskRecord {
                            task: column::name(task)?,
                            definition: row.get(1)?,
                            instances: Vec::new(),
                            control: column::control(row.get(2)?, row.get(3)?)?,
                        });
                    }
                    let (Some(record), Some(instance)) =
                        (tasks.last_mut(), row.get::<_, Option<String>>(4)?)
                    else {
                        continue;
                    };
                    record.instances.push(InstanceRecord {
                        instance: column::holder(instance)?,
                        about: row.get(5)?,
                        remaining: remaining(row.get(6)?, now),
                    });
                }
            }
            tx.commit()?;
            Ok(tasks)
        })
    }

    fn control(&self, task: &LeaseName) -> impl Future<Output = StoreResult<ControlRead>> + Send {
        let task = task.as_str().to_owned();
        self.run(move |conn| {
            let (now, version, value): (i64, _, _) = conn
                .prepare_cached(schema::CONTROL)?
                .query_row([&task], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(ControlRead {
                now_ms: u64::try_from(now)
                    .map_err(|_| StoreError::Corrupt(format!("store clock {now}")))?,
                control: column::control(version, value)?,
            })
        })
    }

    fn set_control(
        &self,
        task: &LeaseName,
        expected: Option<u64>,
        value: &str,
    ) -> impl Future<Output = StoreResult<Option<u64>>> + Send {
        let (task, value) = (task.as_str().to_owned(), value.to_owned());
        self.run(move |conn| {
            let written: Option<i64> = match expected.map(i64::try_from) {
                None => conn
                    .prepare_cached(schema::CREATE_CONTROL)?
                    .query_row([&task, &value], |r| r.get(0))
                    .optional()?,
                Some(Ok(expected)) => conn
                    .prepare_cached(schema::UPDATE_CONTROL)?
                    .query_row(rusqlite::params![task, expected, value], |r| r.get(0))
                    .optional()?,
                // No version above i64::MAX was ever written.
                Some(Err(_)) => None,
            };
            Ok(written.map(column::version).transpose()?)
        })
    }

    /// One immediate transaction (the database's write lock from its start): no registration
    /// lands between the check and the deletes.
    fn forget(
        &self,
        task: &LeaseName,
        history: bool,
    ) -> impl Future<Output = StoreResult<Forgetting>> + Send {
        let task = task.as_str().to_owned();
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = host_clock::now_ms()?;
            let live: i64 = tx
                .prepare_cached(schema::LIVE_INSTANCES)?
                .query_row(rusqlite::params![task, now], |r| r.get(0))?;
            if live > 0 {
                return Ok(Forgetting::Live {
                    instances: live as u64,
                });
            }
            let instances = tx
                .prepare_cached(schema::DELETE_INSTANCES)?
                .execute([&task])?;
            let tasks = tx.prepare_cached(schema::DELETE_TASK)?.execute([&task])?;
            if history {
                tx.prepare_cached(schema::DELETE_HISTORY)?
                    .execute([&task])?;
            }
            tx.commit()?;
            Ok(if instances + tasks > 0 {
                Forgetting::Forgotten
            } else {
                Forgetting::Unknown
            })
        })
    }

    fn leases(&self, limit: usize) -> impl Future<Output = StoreResult<Vec<LeaseRecord>>> + Send {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn| {
            let now = host_clock::now_ms()?;
            let mut statement = conn.prepare_cached(schema::LEASES)?;
            let mut rows = statement.query([limit])?;
            let mut leases = Vec::new();
            while let Some(row) = rows.next()? {
                leases.push(LeaseRecord {
                    name: column::name(row.get(0)?)?,
                    state: lease_state(row.get(1)?, row.get(2)?, row.get(3)?, now)?,
                });
            }
            Ok(leases)
        })
    }
}

/// Opening a store from its settings: here rather than in `config`, which is plain data.
impl SqliteConfig {
    /// Opens (creating if needed) the database file at `path` with these settings; see
    /// [`SqliteStore::open`].
    pub async fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore> {
        SqliteStore::open(path, self).await
    }
}

#[cfg(test)]
mod tests {
    use super::store_error;

    /// Issue 18 case 8: a full disk said only "sqlite operation failed".
    #[test]
    fn a_full_disk_says_so() {
        const SQLITE_FULL: i32 = 13;
        let e = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(SQLITE_FULL), None);
        let err = store_error(e);
        assert!(err.is_transient(), "{err:?}");
        assert!(
            err.to_string()
                .contains("disk holding the sqlite database is full"),
            "{err}"
        );
        const SQLITE_IOERR: i32 = 10;
        let e = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(SQLITE_IOERR), None);
        let shown = store_error(e).to_string();
        assert!(
            shown.contains("sqlite operation failed") && shown.contains("disk I/O error"),
            "{shown}"
        );
    }
}
