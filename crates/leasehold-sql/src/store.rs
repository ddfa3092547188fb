//! [`SqlStore`]: every store operation written once over a [`Dialect`], the statements of one
//! SQL server and how its driver binds them and reads their rows.
//!
//! The control flow is here: the retries when a concurrent writer changed a row between what a
//! statement wrote and what it read, the refusal of values no column can hold, the decoding of
//! column values into the core's records (see [`column`](mod@column)). A dialect runs one statement (or one
//! short transaction) per method and answers the columns as its driver decoded them; a new
//! dialect adds statements, not control flow.

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

    /// The lease's row, `None` when the name was never acquired.
    fn inspect(
        &self,
        op: Op<'_>,
        name: &LeaseName,
    ) -> impl Future<Output = StoreResult<Option<LeaseRow>>> + Send;

    /// The server's clock in ms since the Unix epoch; `None` when the query answered no row.
    fn now_millis(&self, op: Op<'_>) -> impl Future<Output = StoreResult<Option<i64>>> + Send;

    /// Records `slot` (at most [`MAX_SLOT`](Self::MAX_SLOT)) as `task`'s last if it is above
    /// the last; `None` when the statement read nothing to compare (a concurrent claim).
    fn claim_slot(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        slot: i64,
    ) -> impl Future<Output = StoreResult<Option<SlotRow>>> + Send;

    /// `task`'s last claimed slot.
    fn last_slot(
        &self,
        op: Op<'_>,
        task: &LeaseName,
    ) -> impl Future<Output = StoreResult<Option<i64>>> + Send;

    /// Writes `entry` under `key` and keeps `task`'s `keep` (at least 1) highest keys.
    fn record_history(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        key: i64,
        entry: &str,
        keep: i64,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Up to `limit` of `task`'s history entries, highest key first.
    fn history(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        limit: i64,
    ) -> impl Future<Output = StoreResult<Vec<String>>> + Send;

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

    /// Removes `member` from `group`.
    fn leave(
        &self,
        op: Op<'_>,
        group: &LeaseName,
        member: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// [`Catalog::register`]: answers the task's control record; `None` when the statement
    /// answered no row.
    fn register(
        &self,
        op: Op<'_>,
        registration: &Registration<'_>,
    ) -> impl Future<Output = StoreResult<Option<ControlColumns>>> + Send;

    /// Removes `instance` from `task`'s instances.
    fn unregister(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        instance: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Forgets what [`Catalog::tasks`] says is due, then answers a row per instance seen
    /// within `forget_after` (and one for each task without one), in any order.
    fn tasks(
        &self,
        op: Op<'_>,
        forget_after: Duration,
    ) -> impl Future<Output = StoreResult<Vec<TaskRow>>> + Send;

    /// The server's clock in ms and `task`'s control record; `None` when the query answered no
    /// row.
    fn control(
        &self,
        op: Op<'_>,
        task: &LeaseName,
    ) -> impl Future<Output = StoreResult<Option<(i64, ControlColumns)>>> + Send;

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

    /// Up to `limit` leases as `(name, row)`, sorted by name, byte by byte.
    fn leases(
        &self,
        op: Op<'_>,
        limit: i64,
    ) -> impl Future<Output = StoreResult<Vec<(String, LeaseRow)>>> + Send;
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

/// A lease store on a SQL server: [`Store`] and every capability trait, their control flow
/// written once, run through the dialect `D`'s statements.
///
/// Cheap to clone: clones share one dialect (its connection pool and its release listener).
/// Dereferences to the dialect, for its own methods (its pool, its statements).
pub struct SqlStore<D> {
    dialect: Arc<D>,
}

impl<D> SqlStore<D> {
    /// The store on `dialect`.
    pub fn new(dialect: Arc<D>) -> Self {
        Self { dialect }
    }
}

impl<D> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        Self {
            dialect: Arc::clone(&self.dialect),
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
        self.dialect
            .inspect(op, name)
            .await?
            .map(LeaseRow::state)
            .transpose()
    }

    async fn now_millis(&self) -> StoreResult<u64> {
        let op = Op::new("clock", None);
        let ms = self
            .dialect
            .now_millis(op)
            .await?
            .ok_or_else(|| StoreError::Corrupt("clock query returned no row".to_owned()))?;
        column::clock_ms(ms)
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
        self.dialect
            .last_slot(op, task)
            .await?
            .map(column::slot)
            .transpose()
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
        self.dialect.history(op, task, limit).await
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
        self.dialect.leave(op, group, member).await
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
        self.dialect.unregister(op, task, instance).await
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
        let (now_ms, (version, value)) = self
            .dialect
            .control(op, task)
            .await?
            .ok_or_else(|| no_row(op))?;
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
        self.dialect
            .leases(op, limit)
            .await?
            .into_iter()
            .map(|(name, row)| {
                Ok(LeaseRecord {
                    name: column::name(name)?,
                    state: row.state()?,
                })
            })
            .collect()
    }
}
