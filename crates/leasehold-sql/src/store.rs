//! [`SqlStore`]: every store operation written once over a [`Dialect`], the statements of one
//! SQL server and how its driver binds them and reads their rows.
//!
//! The control flow is here: the retries when a concurrent writer changed a row between what a
//! statement wrote and what it read, the refusal of values no column can hold, the decoding of
//! column values into the core's records (see [`column`](mod@column)). A dialect runs one statement (or one
//! short transaction) per method and answers the columns as its driver decoded them; a new
//! dialect adds statements, not control flow. The statements every dialect binds and reads
//! alike ([`Statement`]) it only runs ([`Dialect::run`]): their rows are read here, through
//! [`Columns`].

use std::collections::HashSet;
use std::collections::btree_map::{BTreeMap, Entry};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use leasehold::catalog::{
    ControlRead, Forgetting, LeaseRecord, Registration, TaskRecord, Versioned,
};
use leasehold::store::{
    Acquisition, Operation as Op, ReleaseSubscription, Renewal, SlotClaim, StoreResult,
};
use leasehold::{
    Catalog, FencingToken, HolderId, LeaseName, LeaseState, Membership, Purge, Release, Slots,
    Store, StoreError,
};
use tokio::task::JoinHandle;
use tokio_util::task::AbortOnDropHandle;

use crate::column;

/// How often an acquire or a slot claim runs again when a concurrent writer changed the row
/// between what its statement wrote and what it read.
pub const MAX_ATTEMPTS: usize = 4;

/// The statements of one SQL server, run: each method binds its arguments to its statement
/// (or short transaction), runs it within the operation's time limit on the dialect's
/// connections, and answers the columns it read as the driver decoded them, with driver errors
/// classified as [`StoreError`]s naming `op`. [`SqlStore`] does the rest.
pub trait Dialect: Send + Sync + 'static {
    /// How the dialect spells its 64-bit integer type, for the refusal of a value beyond it
    /// (`slot 9223372036854775808 does not fit a bigint`).
    const BIGINT: &'static str;

    /// The highest slot [`claim_slot`](Self::claim_slot) can record.
    const MAX_SLOT: i64 = i64::MAX;

    /// A row as the dialect's driver answers it.
    type Row: Columns + Send;

    /// Runs `sql`, one of the statements every dialect binds and reads alike (its text is
    /// [`shared_statement!`](crate::shared_statement)), with `args` bound in the order
    /// [`Statement`] gives: the rows it answered (none for a write).
    fn run(
        &self,
        op: Op<'_>,
        sql: Statement,
        args: &[Arg<'_>],
    ) -> impl Future<Output = StoreResult<Rows<Self>>> + Send;

    /// A lease row as read, checked for what the dialect's columns cannot mean (a PostgreSQL
    /// `infinity`): by default taken as it is.
    fn checked(&self, _name: &str, row: LeaseRow) -> StoreResult<LeaseRow> {
        Ok(row)
    }

    /// [`Store::describe`].
    fn describe(&self) -> String;

    /// [`Store::subscribe_releases`]: how this server's releases are heard of.
    fn subscribe_releases(&self) -> Option<ReleaseSubscription>;

    /// Takes the lease for `ttl` if it is free, expired or `holder`'s own; else reads who holds
    /// it.
    fn acquire(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Attempt>> + Send;

    /// Extends the lease to `ttl` from now if `holder` holds it with `token`: whether it did.
    fn renew(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        token: i64,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Renews each `(name, token)` of `batch` that `holder` holds: which it renewed.
    fn renew_many(
        &self,
        op: Op<'_>,
        holder: &HolderId,
        batch: &[(&str, i64)],
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Renewed>> + Send;

    /// Frees the lease if `holder` holds it with `token`: whether it did. The dialect announces
    /// the release to its waiters.
    fn release(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        token: i64,
    ) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Records `slot` (at most [`MAX_SLOT`](Self::MAX_SLOT)) as `task`'s last if it is above
    /// the last; `None` when the statement read nothing to compare (a concurrent claim).
    fn claim_slot(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        slot: i64,
    ) -> impl Future<Output = StoreResult<Option<SlotRow>>> + Send;

    /// Writes `entry` under `key` and keeps `task`'s `keep` (at least 1) highest keys.
    fn record_history(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        key: i64,
        entry: &str,
        keep: i64,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Deletes the leases free for at least `retention`: how many.
    fn purge(
        &self,
        op: Op<'_>,
        retention: Duration,
    ) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Refreshes `member`'s entry in `group` to expire `ttl` from now, drops the expired
    /// entries, and answers the live members, in any order.
    fn members(
        &self,
        op: Op<'_>,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<String>>> + Send;

    /// [`Catalog::register`]: answers the task's control record; `None` when the statement
    /// answered no row.
    fn register(
        &self,
        op: Op<'_>,
        registration: &Registration<'_>,
    ) -> impl Future<Output = StoreResult<Option<ControlColumns>>> + Send;

    /// Forgets what [`Catalog::tasks`] says is due, then answers a row per instance seen
    /// within `forget_after` (and one for each task without one), in any order.
    fn tasks(
        &self,
        op: Op<'_>,
        forget_after: Duration,
    ) -> impl Future<Output = StoreResult<Vec<TaskRow>>> + Send;

    /// Writes `task`'s first control record: its version (1) if written, `None` if the task
    /// has one already.
    fn create_control(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        value: &str,
    ) -> impl Future<Output = StoreResult<Option<i64>>> + Send;

    /// Replaces `task`'s control record if its version is `expected`: the new version if
    /// written, `None` if the version differed.
    fn update_control(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        expected: i64,
        value: &str,
    ) -> impl Future<Output = StoreResult<Option<i64>>> + Send;

    /// [`Catalog::forget`], the check and the deletes as one atomic step against a
    /// registration (each dialect says how).
    fn forget(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        history: bool,
    ) -> impl Future<Output = StoreResult<Forgetting>> + Send;
}

/// A statement every dialect binds to the same parameters, in this order, and reads the same
/// columns from; each dialect has its own text of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Statement {
    /// The server's clock: no parameters; one row `(now_ms)`, ms since the Unix epoch.
    NowMillis,
    /// A lease: name; `(holder, token, remaining_us)`, no row when it was never acquired.
    Inspect,
    /// The highest claimed slot: task; `(last_slot)`, no row if none.
    LastSlot,
    /// The newest history entries: task, limit; `(entry)` per entry, highest key first.
    History,
    /// A task's control record with the server's clock: task; one row `(now_ms,
    /// control_version, control)`, the last two `NULL` when there is none.
    Control,
    /// Lease records: limit; `(name, holder, token, remaining_us)` per lease, by name (bytewise).
    Leases,
    /// Removes an instance from a task's instances: task, instance.
    Unregister,
    /// Removes a member from a spread group: group, member.
    Leave,
}

/// The rows a [`Statement`] answered.
pub type Rows<D> = Vec<<D as Dialect>::Row>;

/// A value bound to a [`Statement`]'s parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    /// Text (a name, a holder).
    Text(&'a str),
    /// A 64-bit integer (a limit).
    Int(i64),
}

/// The text of the shared statement `$which` (a [`Statement`]) in `$statements`, a dialect's
/// statements, which name their fields after the variants: `now_millis`, `inspect`, ...
#[macro_export]
macro_rules! shared_statement {
    ($statements:expr, $which:expr) => {
        match $which {
            $crate::store::Statement::NowMillis => &$statements.now_millis,
            $crate::store::Statement::Inspect => &$statements.inspect,
            $crate::store::Statement::LastSlot => &$statements.last_slot,
            $crate::store::Statement::History => &$statements.history,
            $crate::store::Statement::Control => &$statements.control,
            $crate::store::Statement::Leases => &$statements.leases,
            $crate::store::Statement::Unregister => &$statements.unregister,
            $crate::store::Statement::Leave => &$statements.leave,
        }
    };
}

/// A row a statement answered, column by column: a value of another type than asked for, or a
/// `NULL` where none may be, is a corrupt record ([`StoreError::Corrupt`]).
pub trait Columns {
    /// Column `i` as text.
    fn text(&self, i: usize) -> StoreResult<String>;
    /// Column `i` as text or `NULL`.
    fn text_or_null(&self, i: usize) -> StoreResult<Option<String>>;
    /// Column `i` as a 64-bit integer.
    fn int(&self, i: usize) -> StoreResult<i64>;
    /// Column `i` as a 64-bit integer or `NULL`.
    fn int_or_null(&self, i: usize) -> StoreResult<Option<i64>>;
}

/// Implements [`Columns`] for `$row`, a newtype over a driver's row, with `$get`, a function
/// generic over the column's type: `fn get<T>(row: &DriverRow, i: usize) -> StoreResult<T>`.
#[macro_export]
macro_rules! columns {
    ($row:ty, $get:path) => {
        impl $crate::store::Columns for $row {
            fn text(&self, i: usize) -> leasehold::store::StoreResult<String> {
                $get(&self.0, i)
            }
            fn text_or_null(&self, i: usize) -> leasehold::store::StoreResult<Option<String>> {
                $get(&self.0, i)
            }
            fn int(&self, i: usize) -> leasehold::store::StoreResult<i64> {
                $get(&self.0, i)
            }
            fn int_or_null(&self, i: usize) -> leasehold::store::StoreResult<Option<i64>> {
                $get(&self.0, i)
            }
        }
    };
}

/// A control record's columns, version and value, both `NULL` when the task has none.
pub type ControlColumns = (Option<i64>, Option<String>);

/// What one run of [`Dialect::acquire`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// It took the lease, with this token.
    Acquired(i64),
    /// It did not: the holder and the microseconds left that it read. A free or expired lease
    /// here (or none read) means a concurrent writer changed the row in between: ask again.
    Held {
        /// The holder read, if any.
        holder: Option<String>,
        /// Microseconds left, negative once past.
        remaining_us: Option<i64>,
    },
}

/// What [`Dialect::renew_many`] renewed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewed {
    /// Every lease of the batch.
    All,
    /// These `(name, token)` pairs.
    Only(HashSet<(String, i64)>),
}

impl Renewed {
    /// The `(name, token)` pairs of `rows`, the leases a renewal reports renewed.
    pub fn read<R: Columns>(rows: impl IntoIterator<Item = R>) -> StoreResult<Self> {
        let pairs = rows.into_iter().map(|row| Ok((row.text(0)?, row.int(1)?)));
        Ok(Self::Only(pairs.collect::<StoreResult<_>>()?))
    }
}

/// What [`Dialect::claim_slot`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRow {
    /// The slot is recorded as the task's last.
    Claimed,
    /// It is not: this is the task's last slot.
    Last(i64),
}

/// A lease's columns: holder, token and microseconds left (negative once past).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    /// The holder, `None` once released.
    pub holder: Option<String>,
    /// The last token handed out.
    pub token: i64,
    /// Microseconds left, negative once past.
    pub remaining_us: Option<i64>,
}

impl LeaseRow {
    /// The lease columns `(holder, token, remaining_us)` of `row`, from column `first` on.
    pub fn read(row: &impl Columns, first: usize) -> StoreResult<Self> {
        Ok(Self {
            holder: row.text_or_null(first)?,
            token: row.int(first + 1)?,
            remaining_us: row.int_or_null(first + 2)?,
        })
    }

    fn state(self) -> StoreResult<LeaseState> {
        column::lease_state(self.holder, self.token, self.remaining_us)
    }
}

/// A catalog row: a task, and one instance that registered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRow {
    /// The task's name.
    pub task: String,
    /// Its definition, if an instance registered it.
    pub definition: Option<String>,
    /// Its control record's version, if it has one.
    pub control_version: Option<i64>,
    /// Its control record.
    pub control: Option<String>,
    /// The instance, with what it says about itself and the microseconds its heartbeat has
    /// left; `None` for a task no instance registered within the retention.
    pub instance: Option<(String, String, Option<i64>)>,
}

impl TaskRow {
    /// The columns of a catalog row: `(task, definition, control_version, control, instance,
    /// about, remaining_us)`, the last three `NULL` for a task without an instance.
    pub fn read(row: &impl Columns) -> StoreResult<Self> {
        let instance = match row.text_or_null(4)? {
            Some(instance) => Some((instance, row.text(5)?, row.int_or_null(6)?)),
            None => None,
        };
        Ok(Self {
            task: row.text(0)?,
            definition: row.text_or_null(1)?,
            control_version: row.int_or_null(2)?,
            control: row.text_or_null(3)?,
            instance,
        })
    }
}

/// The control record's columns `(control_version, control)` of `row`, from column `first` on.
pub fn control_columns(row: &impl Columns, first: usize) -> StoreResult<ControlColumns> {
    Ok((row.int_or_null(first)?, row.text_or_null(first + 1)?))
}

/// A lease store on a SQL server: [`Store`] and every capability trait, their control flow
/// written once, run through the dialect `D`'s statements.
///
/// Cheap to clone: clones share one dialect (its connection pool and its release listener).
/// Dereferences to the dialect, for its own methods (its pool, its statements).
pub struct SqlStore<D> {
    dialect: Arc<D>,
    /// A lazy store's background connect, stopped once the last clone is dropped (after the
    /// dialect: declared after it).
    connecting: Option<Arc<AbortOnDropHandle<()>>>,
}

impl<D> SqlStore<D> {
    /// The store on `dialect`.
    pub fn new(dialect: Arc<D>) -> Self {
        Self {
            dialect,
            connecting: None,
        }
    }

    /// The store on `dialect` that connects in the background as `task` (from
    /// [`lazy::spawn`](crate::lazy::spawn)), which stops once the store's last clone is dropped.
    pub fn connecting(dialect: Arc<D>, task: JoinHandle<()>) -> Self {
        Self {
            dialect,
            connecting: Some(Arc::new(AbortOnDropHandle::new(task))),
        }
    }
}

impl<D: Dialect> SqlStore<D> {
    /// The first row `statement` answers about the lease or task `name`.
    async fn first(
        &self,
        op: Op<'_>,
        statement: Statement,
        name: &LeaseName,
    ) -> StoreResult<Option<D::Row>> {
        let params = [Arg::Text(name.as_str())];
        let rows = self.dialect.run(op, statement, &params).await?;
        Ok(rows.into_iter().next())
    }
}

impl<D> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        Self {
            dialect: Arc::clone(&self.dialect),
            connecting: self.connecting.clone(),
        }
    }
}

impl<D> Deref for SqlStore<D> {
    type Target = D;

    fn deref(&self) -> &D {
        &self.dialect
    }
}

impl<D: fmt::Debug> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.dialect.fmt(f)
    }
}

/// `value` as the dialect stores it, at most `max`; above that it is refused, naming `what`.
fn fits<D: Dialect>(op: Op<'_>, what: &str, value: u64, max: i64) -> StoreResult<i64> {
    i64::try_from(value)
        .ok()
        .filter(|v| *v <= max)
        .ok_or_else(|| StoreError::Rejected {
            message: format!("{op}: {what} {value} does not fit a {}", D::BIGINT),
            source: None,
        })
}

/// What a dialect's forget did, from what it saw: `live` instances (nothing removed); a task
/// row read but not removed, because a registration rewrote it in between (that instance is
/// live); else forgotten when it removed anything.
pub fn forgetting(live: i64, had_task: bool, task_gone: bool, removed: bool) -> Forgetting {
    match u64::try_from(live) {
        Ok(instances @ 1..) => Forgetting::Live { instances },
        _ if had_task && !task_gone => Forgetting::Live { instances: 1 },
        _ if task_gone || removed => Forgetting::Forgotten,
        _ => Forgetting::Unknown,
    }
}

/// The error of a statement that answered no row where it always answers one.
pub fn no_row(op: Op<'_>) -> StoreError {
    StoreError::Corrupt(format!("{op} returned no row"))
}

impl<D: Dialect> Store for SqlStore<D> {
    async fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Acquisition> {
        let op = Op::new("acquire", Some(name));
        for _ in 0..MAX_ATTEMPTS {
            match self.dialect.acquire(op, name, holder, ttl).await? {
                Attempt::Acquired(token) => {
                    return Ok(Acquisition::Acquired {
                        token: column::token(token)?,
                    });
                }
                Attempt::Held {
                    holder: current,
                    remaining_us,
                } => {
                    if let Some(busy) = column::busy(current, remaining_us, holder)? {
                        return Ok(busy);
                    }
                }
            }
        }
        Err(StoreError::Unavailable {
            message: format!("{op}: the lease kept changing under concurrent acquirers"),
            source: None,
        })
    }

    async fn renew(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> StoreResult<Renewal> {
        let Some(token) = column::token_param(token) else {
            return Ok(Renewal::Lost);
        };
        let op = Op::new("renew", Some(name));
        Ok(if self.dialect.renew(op, name, holder, token, ttl).await? {
            Renewal::Renewed
        } else {
            Renewal::Lost
        })
    }

    async fn release(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
    ) -> StoreResult<Release> {
        let Some(token) = column::token_param(token) else {
            return Ok(Release::NotHeld);
        };
        let op = Op::new("release", Some(name));
        Ok(if self.dialect.release(op, name, holder, token).await? {
            Release::Released
        } else {
            Release::NotHeld
        })
    }

    async fn inspect(&self, name: &LeaseName) -> StoreResult<Option<LeaseState>> {
        let op = Op::new("inspect", Some(name));
        let Some(row) = self.first(op, Statement::Inspect, name).await? else {
            return Ok(None);
        };
        let lease = self
            .dialect
            .checked(name.as_str(), LeaseRow::read(&row, 0)?)?;
        lease.state().map(Some)
    }

    async fn now_millis(&self) -> StoreResult<u64> {
        let op = Op::new("clock", None);
        let rows = self.dialect.run(op, Statement::NowMillis, &[]).await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt("clock query returned no row".to_owned()))?;
        column::clock_ms(row.int(0)?)
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.dialect.subscribe_releases()
    }

    fn describe(&self) -> String {
        self.dialect.describe()
    }

    /// One statement for the whole batch (MySQL: a read after it, when it renewed fewer than
    /// it was given).
    async fn renew_many(
        &self,
        holder: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> StoreResult<Vec<Renewal>> {
        // A token beyond i64 was never handed out here: it stays out of the batch (Lost).
        let batch: Vec<(&str, i64)> = leases
            .iter()
            .filter_map(|(name, token)| Some((name.as_str(), column::token_param(*token)?)))
            .collect();
        let op = Op::new("renew_many", None);
        Ok(
            match self.dialect.renew_many(op, holder, &batch, ttl).await? {
                Renewed::All => leases
                    .iter()
                    .map(|(_, token)| match column::token_param(*token) {
                        Some(_) => Renewal::Renewed,
                        None => Renewal::Lost,
                    })
                    .collect(),
                Renewed::Only(renewed) => column::renewals(leases, &renewed),
            },
        )
    }
}

leasehold::declare_capabilities!(impl<D: Dialect> SqlStore<D>: SLOTS | PURGE | MEMBERSHIP | CATALOG);

impl<D: Dialect> Slots for SqlStore<D> {
    async fn claim_slot(&self, task: &LeaseName, slot: u64) -> StoreResult<SlotClaim> {
        let op = Op::new("claim_slot", Some(task));
        let slot = fits::<D>(op, "slot", slot, D::MAX_SLOT)?;
        for _ in 0..MAX_ATTEMPTS {
            match self.dialect.claim_slot(op, task, slot).await? {
                Some(SlotRow::Claimed) => return Ok(SlotClaim::Claimed),
                Some(SlotRow::Last(last)) if last >= slot => {
                    return Ok(SlotClaim::AlreadyRun {
                        last: column::slot(last)?,
                    });
                }
                // The statement read a state older than a concurrent claim it ran into: ask
                // again.
                _ => {}
            }
        }
        Err(StoreError::Unavailable {
            message: format!("{op}: the slot kept changing under concurrent claims"),
            source: None,
        })
    }

    async fn last_slot(&self, task: &LeaseName) -> StoreResult<Option<u64>> {
        let op = Op::new("last_slot", Some(task));
        match self.first(op, Statement::LastSlot, task).await? {
            Some(row) => Ok(Some(column::slot(row.int(0)?)?)),
            None => Ok(None),
        }
    }

    async fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> StoreResult<()> {
        let op = Op::new("record_history", Some(task));
        let key = fits::<D>(op, "history key", key, i64::MAX)?;
        let keep = i64::try_from(keep.max(1)).unwrap_or(i64::MAX);
        self.dialect
            .record_history(op, task, key, entry, keep)
            .await
    }

    async fn history(&self, task: &LeaseName, limit: usize) -> StoreResult<Vec<String>> {
        let op = Op::new("history", Some(task));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let params = [Arg::Text(task.as_str()), Arg::Int(limit)];
        let rows = self.dialect.run(op, Statement::History, &params).await?;
        rows.iter().map(|row| row.text(0)).collect()
    }
}

impl<D: Dialect> Purge for SqlStore<D> {
    async fn purge(&self, retention: Duration) -> StoreResult<u64> {
        self.dialect.purge(Op::new("purge", None), retention).await
    }
}

impl<D: Dialect> Membership for SqlStore<D> {
    async fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Vec<HolderId>> {
        let op = Op::new("members", Some(group));
        let mut members = self
            .dialect
            .members(op, group, member, ttl)
            .await?
            .into_iter()
            .map(column::member)
            .collect::<StoreResult<Vec<_>>>()?;
        members.sort();
        Ok(members)
    }

    async fn leave(&self, group: &LeaseName, member: &HolderId) -> StoreResult<()> {
        let op = Op::new("leave", Some(group));
        let params = [Arg::Text(group.as_str()), Arg::Text(member.as_str())];
        self.dialect.run(op, Statement::Leave, &params).await?;
        Ok(())
    }
}

impl<D: Dialect> Catalog for SqlStore<D> {
    async fn register(&self, r: &Registration<'_>) -> StoreResult<Option<Versioned>> {
        let op = Op::new("register", Some(r.task));
        let (version, value) = self
            .dialect
            .register(op, r)
            .await?
            .ok_or_else(|| no_row(op))?;
        column::control(version, value)
    }

    async fn unregister(&self, task: &LeaseName, instance: &HolderId) -> StoreResult<()> {
        let op = Op::new("unregister", Some(task));
        let params = [Arg::Text(task.as_str()), Arg::Text(instance.as_str())];
        self.dialect.run(op, Statement::Unregister, &params).await?;
        Ok(())
    }

    /// Sorted here: by task name byte by byte, each task's live instances before its expired
    /// ones, each group by instance.
    async fn tasks(&self, forget_after: Duration) -> StoreResult<Vec<TaskRecord>> {
        let op = Op::new("tasks", None);
        let rows = self.dialect.tasks(op, forget_after).await?;
        // A String orders by its bytes, as the stored names do.
        let mut tasks: BTreeMap<String, TaskRecord> = BTreeMap::new();
        for row in rows {
            let record = match tasks.entry(row.task) {
                Entry::Occupied(entry) => entry.into_mut(),
                Entry::Vacant(entry) => {
                    let task = column::name(entry.key().clone())?;
                    entry.insert(TaskRecord {
                        task,
                        definition: row.definition,
                        instances: Vec::new(),
                        control: column::control(row.control_version, row.control)?,
                    })
                }
            };
            if let Some((instance, about, remaining_us)) = row.instance {
                record
                    .instances
                    .push(column::instance(instance, about, remaining_us)?);
            }
        }
        Ok(tasks
            .into_values()
            .map(|mut record| {
                record.instances.sort_by(|a, b| {
                    (a.remaining.is_zero(), &a.instance).cmp(&(b.remaining.is_zero(), &b.instance))
                });
                record
            })
            .collect())
    }

    async fn control(&self, task: &LeaseName) -> StoreResult<ControlRead> {
        let op = Op::new("control", Some(task));
        let row = self.first(op, Statement::Control, task).await?;
        let row = row.ok_or_else(|| no_row(op))?;
        let now_ms = row.int(0)?;
        let (version, value) = control_columns(&row, 1)?;
        Ok(ControlRead {
            now_ms: column::clock_ms(now_ms)?,
            control: column::control(version, value)?,
        })
    }

    async fn set_control(
        &self,
        task: &LeaseName,
        expected: Option<u64>,
        value: &str,
    ) -> StoreResult<Option<u64>> {
        let op = Op::new("set_control", Some(task));
        let written = match expected.map(i64::try_from) {
            None => self.dialect.create_control(op, task, value).await?,
            Some(Ok(expected)) => {
                self.dialect
                    .update_control(op, task, expected, value)
                    .await?
            }
            // No version beyond an i64 was ever written.
            Some(Err(_)) => return Ok(None),
        };
        written.map(column::version).transpose()
    }

    async fn forget(&self, task: &LeaseName, history: bool) -> StoreResult<Forgetting> {
        let op = Op::new("forget", Some(task));
        self.dialect.forget(op, task, history).await
    }

    async fn leases(&self, limit: usize) -> StoreResult<Vec<LeaseRecord>> {
        let op = Op::new("leases", None);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .dialect
            .run(op, Statement::Leases, &[Arg::Int(limit)])
            .await?;
        rows.iter()
            .map(|row| {
                let name = row.text(0)?;
                let lease = self.dialect.checked(&name, LeaseRow::read(row, 1)?)?;
                Ok(LeaseRecord {
                    name: column::name(name)?,
                    state: lease.state()?,
                })
            })
            .collect()
    }
}
