//! [`PgStore`]: the [`SqlStore`] on PostgreSQL, and its [`Postgres`] dialect.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use leasehold::catalog::{Forgetting, Registration};
pub(crate) use leasehold::store::Operation as Op;
use leasehold::store::{ReleaseFeed, ReleaseSubscription, StoreResult, within};
use leasehold::{HolderId, LeaseName, StoreError};
use leasehold_sql::lazy::{self, Readiness};
use leasehold_sql::store::{
    Arg, Attempt, ControlColumns, LeaseRow, Renewed, Rows, SlotRow, Statement, TaskRow,
    control_columns, forgetting, no_row,
};
use leasehold_sql::{Causes, Dialect, SqlStore};
use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use crate::config::{PgConfig, Tls};
use crate::error::{PgSetupError, Result};
use crate::listener;

mod migration;
mod statements;

pub(crate) use migration::migrate;
use migration::migrate_on;
pub use statements::Statements;

/// Leases in PostgreSQL: each operation is one conditional statement on a pooled connection,
/// timed by the server's `clock_timestamp()`. Its own methods ([`sql`](Postgres::sql),
/// [`pool`](Postgres::pool), ...) are its [`Postgres`] dialect's.
///
/// Cheap to clone: clones share one connection pool and one release listener.
pub type PgStore = SqlStore<Postgres>;

/// The PostgreSQL dialect of a [`PgStore`]: its [`Statements`], the connection pool they run
/// on, and the release listener.
pub struct Postgres {
    pool: Pool,
    sql: Statements,
    channel: String,
    op_timeout: Duration,
    /// The server as parsed, without its password ([`PgConfig::describe`]).
    url: String,
    schema: String,
    lease_table: String,
    /// Present when notifications are on.
    releases: Option<ReleaseFeed>,
    /// Whether the tables are known to exist (the migration ran, or was off); until they are,
    /// operations answer as [`Readiness`] says (a store from [`PgConfig::connect_lazy`]).
    ready: watch::Receiver<Readiness>,
}

/// What connecting needs, parsed and built before any network traffic.
struct Parts {
    pool: Pool,
    pg: tokio_postgres::Config,
    tls: Tls,
    url: String,
    sql: Statements,
}

impl Parts {
    fn new(config: &PgConfig) -> Result<Self> {
        config.validate()?;
        let (pg, tls, url) = config.driver_config()?;
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            Tls::None => Manager::from_config(pg.clone(), NoTls, manager_config),
            #[cfg(feature = "tls")]
            Tls::Rustls(t) => Manager::from_config(pg.clone(), t.clone(), manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            // The pool's own limits on waiting for, opening and recycling a connection (how it
            // hands connections out); `query` bounds each operation as a whole with `within`.
            .wait_timeout(Some(config.op_timeout))
            .create_timeout(Some(config.connect_timeout))
            .recycle_timeout(Some(config.op_timeout))
            .build()
            .map_err(|e| PgSetupError::Config(e.to_string()))?;
        let sql = Statements::new(config);
        Ok(Self {
            pool,
            pg,
            tls,
            url,
            sql,
        })
    }
}

impl Postgres {
    /// A lease row whose `expires_at` is `infinity` or `-infinity`: leasehold never writes one
    /// (it would hold or free the lease for ever), so someone edited the row by hand.
    fn infinite_expiry(&self, name: &str) -> StoreError {
        StoreError::Corrupt(format!(
            "lease {name}: its row in {}.{} has an infinite expires_at, which leasehold never \
             writes; set it to a time or delete the row",
            self.schema, self.lease_table
        ))
    }

    fn new(
        config: &PgConfig,
        parts: Parts,
        releases: Option<ReleaseFeed>,
        ready: watch::Receiver<Readiness>,
    ) -> Self {
        Self {
            pool: parts.pool,
            sql: parts.sql,
            channel: config.channel_name(),
            op_timeout: config.op_timeout,
            url: parts.url,
            schema: config.schema.clone(),
            lease_table: config.lease_table.clone(),
            releases,
            ready,
        }
    }

    /// Starts the release listener, if notifications are on.
    fn listen(config: &PgConfig, parts: &Parts) -> Option<ReleaseFeed> {
        config.notifications.then(|| {
            listener::feed(
                parts.pg.clone(),
                parts.tls.clone(),
                config.channel_name(),
                parts.sql.recent_releases.clone(),
                config,
                &parts.url,
            )
        })
    }

    async fn connect(config: PgConfig) -> Result<PgStore> {
        let parts = Parts::new(&config)?;
        migrate_on(&parts.pool, &config, &parts.url, &parts.sql).await?;
        let releases = Self::listen(&config, &parts);
        if let Some(releases) = &releases {
            // So a subscription taken right after `connect` hears every later release.
            releases.first_attempt(config.connect_timeout).await;
        }
        tracing::debug!(url = %parts.url, schema = %config.schema, "connected to postgres");
        let dialect = Self::new(&config, parts, releases, lazy::ready());
        Ok(SqlStore::new(Arc::new(dialect)))
    }

    /// [`PgConfig::connect_lazy`].
    fn connect_lazy(config: PgConfig) -> Result<PgStore> {
        let parts = Parts::new(&config)?;
        let (ready_tx, ready) = lazy::channel().map_err(PgSetupError::Config)?;
        let releases = Self::listen(&config, &parts);
        let dialect = Arc::new(Self::new(&config, parts, releases, ready));
        let (url, max_delay) = (dialect.url.clone(), config.max_reconnect_delay);
        let config = Arc::new(config);
        let attempt = move |dialect: &Self| {
            let (pool, url) = (dialect.pool.clone(), dialect.url.clone());
            let (sql, config) = (dialect.sql.clone(), Arc::clone(&config));
            async move { migrate_on(&pool, &config, &url, &sql).await }
        };
        let task = lazy::spawn(
            Arc::downgrade(&dialect),
            ready_tx,
            "postgres",
            url.clone(),
            max_delay,
            attempt,
            lazy::judge("postgres", url),
        );
        Ok(SqlStore::connecting(dialect, task))
    }

    /// The SQL statements this store runs.
    pub fn sql(&self) -> &Statements {
        &self.sql
    }

    /// The schema of the store's tables.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The LISTEN/NOTIFY channel releases are announced on.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The store's connection pool (connections carry the store's `statement_timeout`).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Runs `sql` on a pooled connection (a cached prepared statement: one round trip once the
    /// connection has seen it), all within the operation timeout.
    async fn query(
        &self,
        op: Op<'_>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<Vec<Row>> {
        let limit = self.op_timeout;
        let work = async {
            lazy::check(&self.ready, op, &self.url).await?;
            let client = self
                .pool
                .get()
                .await
                .map_err(|e| pool_error(e, op, limit))?;
            let statement = client
                .prepare_cached(sql)
                .await
                .map_err(|e| classify(e, op, limit))?;
            client
                .query(&statement, params)
                .await
                .map_err(|e| classify(e, op, limit))
        };
        within(limit, work).await
    }
}

fn pool_error(e: PoolError, op: Op<'_>, limit: Duration) -> StoreError {
    match e {
        PoolError::Timeout(_) => StoreError::Timeout(limit),
        PoolError::Backend(e) => classify(e, op, limit),
        other => StoreError::unavailable(format!("{op}: connection pool: {other}"), other),
    }
}

/// Maps a driver error to a [`StoreError`]: lost connections, shutdowns and resource shortages
/// are transient ([`StoreError::Unavailable`]), a cancelled statement is a
/// [`StoreError::Timeout`], anything else the server refused is [`StoreError::Rejected`].
pub(crate) fn classify(e: tokio_postgres::Error, op: Op<'_>, limit: Duration) -> StoreError {
    let Some(db) = e.as_db_error() else {
        let message = format!("{op} failed: {}", Causes(&e));
        // The server asked for a password the URL does not give, or for an authentication
        // method the driver cannot do: the driver's own refusals, which retrying cannot fix.
        // (Its error kinds are private; these are its messages for them.)
        let text = e.to_string();
        if text.starts_with("authentication error") || text.starts_with("invalid configuration") {
            return StoreError::rejected(message, e);
        }
        return StoreError::unavailable(message, e);
    };
    let code = db.code().clone();
    let message = format!("{op} failed: {} ({})", db.message(), code.code());
    if code == SqlState::QUERY_CANCELED {
        return StoreError::Timeout(limit);
    }
    let class = &code.code()[..2];
    let transient = matches!(class, "08" | "53" | "57" | "58" | "40")
        || code == SqlState::READ_ONLY_SQL_TRANSACTION;
    if transient {
        StoreError::unavailable(message, e)
    } else {
        StoreError::rejected(message, e)
    }
}

/// A ttl in whole milliseconds, at least 1.
fn ttl_ms(ttl: Duration) -> i64 {
    ttl.as_millis().clamp(1, i64::MAX as u128) as i64
}

/// A duration in whole milliseconds.
fn millis(d: Duration) -> i64 {
    d.as_millis().clamp(0, i64::MAX as u128) as i64
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, i: usize) -> StoreResult<T> {
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("unexpected column {i}: {e}")))
}

/// A row as the driver answers it, read through [`get`].
pub struct PgRow(Row);

leasehold_sql::columns!(PgRow, get);

impl fmt::Debug for Postgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.url)
            .field("schema", &self.schema)
            .field("lease_table", &self.lease_table)
            .field("channel", &self.channel)
            .finish()
    }
}

/// Each operation one statement, timed by `clock_timestamp()`.
impl Dialect for Postgres {
    const BIGINT: &'static str = "bigint";

    type Row = PgRow;

    async fn run(&self, op: Op<'_>, sql: Statement, args: &[Arg<'_>]) -> StoreResult<Rows<Self>> {
        let params: Vec<&(dyn ToSql + Sync)> = args
            .iter()
            .map(|arg| match arg {
                Arg::Text(text) => text as &(dyn ToSql + Sync),
                Arg::Int(int) => int,
            })
            .collect();
        let sql = leasehold_sql::shared_statement!(self.sql, sql);
        let rows = self.query(op, sql, &params).await?;
        Ok(rows.into_iter().map(PgRow).collect())
    }

    /// An infinite `expires_at` (its `remaining_us` `NULL`) is corrupt.
    fn checked(&self, name: &str, row: LeaseRow) -> StoreResult<LeaseRow> {
        match row.remaining_us {
            Some(_) => Ok(row),
            None => Err(self.infinite_expiry(name)),
        }
    }

    fn describe(&self) -> String {
        format!(
            "postgres {} (table {}.{})",
            self.url, self.schema, self.lease_table
        )
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.releases.as_ref().map(ReleaseFeed::subscribe)
    }

    async fn acquire(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Attempt> {
        let params: [&(dyn ToSql + Sync); 3] = [&name.as_str(), &holder.as_str(), &ttl_ms(ttl)];
        let rows = self.query(op, &self.sql.acquire, &params).await?;
        let Some(row) = rows.first() else {
            // The row was inserted after this statement's snapshot: nothing read.
            return Ok(Attempt::Held {
                holder: None,
                remaining_us: None,
            });
        };
        if let Some(token) = get::<Option<i64>>(row, 0)? {
            return Ok(Attempt::Acquired(token));
        }
        let current = get::<Option<String>>(row, 1)?;
        let remaining_us = get::<Option<i64>>(row, 2)?;
        if current.is_some() && remaining_us.is_none() {
            return Err(self.infinite_expiry(name.as_str()));
        }
        // A free or expired lease in the snapshot, yet the upsert saw a live one: another
        // acquirer committed in between.
        Ok(Attempt::Held {
            holder: current,
            remaining_us,
        })
    }

    async fn renew(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        token: i64,
        ttl: Duration,
    ) -> StoreResult<bool> {
        let params: [&(dyn ToSql + Sync); 4] =
            [&name.as_str(), &holder.as_str(), &token, &ttl_ms(ttl)];
        let rows = self.query(op, &self.sql.renew, &params).await?;
        Ok(!rows.is_empty())
    }

    async fn renew_many(
        &self,
        op: Op<'_>,
        holder: &HolderId,
        batch: &[(&str, i64)],
        ttl: Duration,
    ) -> StoreResult<Renewed> {
        let (names, tokens): (Vec<&str>, Vec<i64>) = batch.iter().copied().unzip();
        let params: [&(dyn ToSql + Sync); 4] = [&names, &holder.as_str(), &tokens, &ttl_ms(ttl)];
        let rows = self.query(op, &self.sql.renew_many, &params).await?;
        Renewed::read(rows.into_iter().map(PgRow))
    }

    /// `pg_notify` in the same statement.
    async fn release(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        token: i64,
    ) -> StoreResult<bool> {
        let params: [&(dyn ToSql + Sync); 4] = [
            &name.as_str(),
            &holder.as_str(),
            &token,
            &self.channel.as_str(),
        ];
        let rows = self.query(op, &self.sql.release, &params).await?;
        Ok(!rows.is_empty())
    }

    async fn claim_slot(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        slot: i64,
    ) -> StoreResult<Option<SlotRow>> {
        let rows = self
            .query(op, &self.sql.claim_slot, &[&task.as_str(), &slot])
            .await?;
        rows.first()
            .map(|row| {
                let claimed: bool = get(row, 0)?;
                let last: i64 = get(row, 1)?;
                Ok(if claimed {
                    SlotRow::Claimed
                } else {
                    SlotRow::Last(last)
                })
            })
            .transpose()
    }

    async fn record_history(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        key: i64,
        entry: &str,
        keep: i64,
    ) -> StoreResult<()> {
        let params: [&(dyn ToSql + Sync); 4] = [&task.as_str(), &key, &entry, &keep];
        self.query(op, &self.sql.record_history, &params).await?;
        Ok(())
    }

    async fn purge(&self, op: Op<'_>, retention: Duration) -> StoreResult<u64> {
        let rows = self
            .query(op, &self.sql.purge, &[&millis(retention)])
            .await?;
        let deleted: i64 = match rows.first() {
            Some(row) => get(row, 0)?,
            None => 0,
        };
        Ok(deleted.max(0) as u64)
    }

    async fn members(
        &self,
        op: Op<'_>,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Vec<String>> {
        let params: [&(dyn ToSql + Sync); 3] = [&group.as_str(), &member.as_str(), &ttl_ms(ttl)];
        let rows = self.query(op, &self.sql.members, &params).await?;
        rows.iter().map(|row| get(row, 0)).collect()
    }

    async fn register(
        &self,
        op: Op<'_>,
        r: &Registration<'_>,
    ) -> StoreResult<Option<ControlColumns>> {
        let params: [&(dyn ToSql + Sync); 6] = [
            &r.task.as_str(),
            &r.definition,
            &r.instance.as_str(),
            &r.about,
            &ttl_ms(r.ttl),
            &millis(r.forget_after),
        ];
        let rows = self.query(op, &self.sql.register, &params).await?;
        let row = rows.into_iter().next().map(PgRow);
        row.map(|row| control_columns(&row, 0)).transpose()
    }

    async fn tasks(&self, op: Op<'_>, forget_after: Duration) -> StoreResult<Vec<TaskRow>> {
        let rows = self
            .query(op, &self.sql.tasks, &[&millis(forget_after)])
            .await?;
        rows.into_iter()
            .map(|row| TaskRow::read(&PgRow(row)))
            .collect()
    }

    async fn create_control(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        value: &str,
    ) -> StoreResult<Option<i64>> {
        let rows = self
            .query(op, &self.sql.create_control, &[&task.as_str(), &value])
            .await?;
        rows.first().map(|row| get(row, 0)).transpose()
    }

    async fn update_control(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        expected: i64,
        value: &str,
    ) -> StoreResult<Option<i64>> {
        let params: [&(dyn ToSql + Sync); 3] = [&task.as_str(), &expected, &value];
        let rows = self.query(op, &self.sql.update_control, &params).await?;
        rows.first().map(|row| get(row, 0)).transpose()
    }

    async fn forget(&self, op: Op<'_>, task: &LeaseName, history: bool) -> StoreResult<Forgetting> {
        let params: [&(dyn ToSql + Sync); 2] = [&task.as_str(), &history];
        let rows = self.query(op, &self.sql.forget, &params).await?;
        let row = rows.first().ok_or_else(|| no_row(op))?;
        let (live, had_task): (i64, bool) = (get(row, 0)?, get(row, 1)?);
        let (task_gone, instances_gone): (bool, i64) = (get(row, 2)?, get(row, 3)?);
        Ok(forgetting(live, had_task, task_gone, instances_gone > 0))
    }
}

/// Opening a store from its settings: here rather than in `config`, which is plain data.
impl PgConfig {
    /// Checks the settings, connects, runs the migration (with [`migrate`](Self::migrate)) and
    /// (with [`notifications`](Self::notifications)) starts listening for releases.
    pub async fn connect(self) -> Result<PgStore> {
        Postgres::connect(self).await
    }

    /// Checks the settings and returns a store at once, without waiting for the server, for a
    /// service that must start while its database is down: it connects and runs the migration
    /// in the background, retrying with backoff up to
    /// [`max_reconnect_delay`](Self::max_reconnect_delay). Until the server is reached and the
    /// tables exist every operation answers
    /// [`StoreError::Unavailable`](leasehold::StoreError::Unavailable). While the server refuses
    /// the connection (wrong password, unknown role or database, no CONNECT privilege)
    /// operations answer [`StoreError::Rejected`](leasehold::StoreError::Rejected) and attempts
    /// go on, so a fix on the server is picked up; a migration the server refuses (no
    /// permission) makes every operation answer `Rejected` for good. Operations wait for the
    /// first attempt to end (within their timeout), so the first answer already tells a refusal
    /// from an outage. Fails only on settings or a URL that can never work, or outside a Tokio
    /// runtime; never with [`Error::Connect`](crate::Error::Connect).
    pub fn connect_lazy(self) -> Result<PgStore> {
        Postgres::connect_lazy(self)
    }
}
