//! [`PgStore`]: the [`Store`] implementation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
pub(crate) use leasehold::store::Operation as Op;
use leasehold::{
    Capabilities, FencingToken, HolderId, LeaseName, LeaseState, Release, Store, StoreError,
    store::{Acquisition, ReleaseFeed, ReleaseSubscription, Renewal, StoreResult, within},
};
use leasehold_sql::lazy::{self, Failure, Readiness};
use leasehold_sql::{Causes, column};
use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};
use tokio_util::task::AbortOnDropHandle;

use crate::config::{PgConfig, Tls};
use crate::error::{Error, Result};
use crate::listener;

mod catalog;
mod migration;
mod slots;
mod statements;

pub(crate) use migration::migrate;
use migration::migrate_on;
pub use statements::Statements;

/// How often an acquire or slot claim is re-run when a concurrent writer changed the row after
/// the statement's snapshot was taken (see [`Statements::acquire`]).
const MAX_ATTEMPTS: usize = 4;

/// Leases in PostgreSQL: each operation is one conditional statement on a pooled connection,
/// timed by the server's `clock_timestamp()`.
///
/// Cheap to clone: clones share one connection pool and one release listener.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
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
    /// operations answer as [`Readiness`] says (a store from [`PgStore::connect_lazy`]).
    ready: watch::Receiver<Readiness>,
    /// The background connect of a lazy store.
    migration: std::sync::OnceLock<AbortOnDropHandle<()>>,
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
            .map_err(|e| Error::Config(e.to_string()))?;
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

impl PgStore {
    /// A lease row whose `expires_at` is `infinity` or `-infinity`: leasehold never writes one
    /// (it would hold or free the lease for ever), so someone edited the row by hand.
    fn infinite_expiry(&self, name: &LeaseName) -> StoreError {
        StoreError::Corrupt(format!(
            "lease {name}: its row in {}.{} has an infinite expires_at, which leasehold never \
             writes; set it to a time or delete the row",
            self.inner.schema, self.inner.lease_table
        ))
    }

    /// A lease's state from its row: holder, token, and microseconds left (`None` for an
    /// infinite `expires_at`, which is corrupt).
    fn lease_state(
        &self,
        name: &LeaseName,
        holder: Option<String>,
        token: i64,
        remaining_us: Option<i64>,
    ) -> StoreResult<LeaseState> {
        if remaining_us.is_none() {
            return Err(self.infinite_expiry(name));
        }
        column::lease_state(holder, token, remaining_us)
    }

    fn assemble(
        config: &PgConfig,
        parts: Parts,
        releases: Option<ReleaseFeed>,
        ready: watch::Receiver<Readiness>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool: parts.pool,
                sql: parts.sql,
                channel: config.channel_name(),
                op_timeout: config.op_timeout,
                url: parts.url,
                schema: config.schema.clone(),
                lease_table: config.lease_table.clone(),
                releases,
                ready,
                migration: std::sync::OnceLock::new(),
            }),
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

    pub(crate) async fn connect(config: PgConfig) -> Result<Self> {
        let parts = Parts::new(&config)?;
        migrate_on(&parts.pool, &config, &parts.url, &parts.sql).await?;
        let releases = Self::listen(&config, &parts);
        if let Some(releases) = &releases {
            // So a subscription taken right after `connect` hears every later release.
            releases.first_attempt(config.connect_timeout).await;
        }
        tracing::debug!(url = %parts.url, schema = %config.schema, "connected to postgres");
        Ok(Self::assemble(&config, parts, releases, lazy::ready()))
    }

    /// [`PgConfig::connect_lazy`].
    pub(crate) fn open_lazy(config: PgConfig) -> Result<Self> {
        let parts = Parts::new(&config)?;
        let (ready_tx, ready) = lazy::channel().map_err(Error::Config)?;
        let releases = Self::listen(&config, &parts);
        let store = Self::assemble(&config, parts, releases, ready);
        let url = store.inner.url.clone();
        let max_delay = config.max_reconnect_delay;
        let config = Arc::new(config);
        let task = lazy::spawn(
            Arc::downgrade(&store.inner),
            ready_tx,
            "postgres",
            url.clone(),
            max_delay,
            move |inner: &Inner| {
                let (pool, url, sql) = (inner.pool.clone(), inner.url.clone(), inner.sql.clone());
                let config = Arc::clone(&config);
                async move { migrate_on(&pool, &config, &url, &sql).await }
            },
            move |e| match e {
                Error::TooOld { source, .. } => {
                    tracing::error!(url = %url, error = %source, "every operation will be refused");
                    Failure::Unusable(source.to_string())
                }
                Error::Migrate { source, .. } if !source.is_transient() => {
                    tracing::error!(url = %url, error = %source, "postgres refused the migration; every operation will be refused");
                    Failure::Unusable(format!("migration refused: {source}"))
                }
                Error::Connect { source, .. } if !source.is_transient() => Failure::Refused(source),
                e => Failure::Unreachable(Causes(&e).to_string()),
            },
        );
        let _ = store.inner.migration.set(AbortOnDropHandle::new(task));
        Ok(store)
    }

    /// The SQL statements this store runs.
    pub fn sql(&self) -> &Statements {
        &self.inner.sql
    }

    /// The schema of the store's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The LISTEN/NOTIFY channel releases are announced on.
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// The store's connection pool (connections carry the store's `statement_timeout`).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Runs `sql` on a pooled connection (a cached prepared statement: one round trip once the
    /// connection has seen it), all within the operation timeout.
    async fn query(
        &self,
        op: Op<'_>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<Vec<Row>> {
        let limit = self.inner.op_timeout;
        let work = async {
            lazy::check(&self.inner.ready, op, &self.inner.url).await?;
            let client = self
                .inner
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

fn to_i64(n: u64) -> Option<i64> {
    i64::try_from(n).ok()
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, i: usize) -> StoreResult<T> {
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("unexpected column {i}: {e}")))
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &self.inner.url)
            .field("schema", &self.inner.schema)
            .field("lease_table", &self.inner.lease_table)
            .field("channel", &self.inner.channel)
            .finish()
    }
}

impl Store for PgStore {
    async fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Acquisition> {
        let op = Op::new("acquire", Some(name));
        let ttl_ms = ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        for _ in 0..MAX_ATTEMPTS {
            let rows = self
                .query(
                    op,
                    &self.inner.sql.acquire,
                    &[&name.as_str(), &holder.as_str(), &ttl_ms],
                )
                .await?;
            let Some(row) = rows.first() else {
                // The row was inserted after this statement's snapshot: run it again.
                continue;
            };
            if let Some(token) = get::<Option<i64>>(row, 0)? {
                return Ok(Acquisition::Acquired {
                    token: column::token(token)?,
                });
            }
            let current = get::<Option<String>>(row, 1)?;
            let remaining = get::<Option<i64>>(row, 2)?;
            if current.is_some() && remaining.is_none() {
                return Err(self.infinite_expiry(name));
            }
            if let Some(busy) = column::busy(current, remaining, holder)? {
                return Ok(busy);
            }
            // The snapshot shows a free or expired lease, yet the upsert saw a live one:
            // another acquirer committed in between. Ask again.
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
        let ttl_ms = ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        let op = Op::new("renew", Some(name));
        let rows = self
            .query(
                op,
                &self.inner.sql.renew,
                &[&name.as_str(), &holder.as_str(), &token, &ttl_ms],
            )
            .await?;
        Ok(if rows.is_empty() {
            Renewal::Lost
        } else {
            Renewal::Renewed
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
        let rows = self
            .query(
                op,
                &self.inner.sql.release,
                &[
                    &name.as_str(),
                    &holder.as_str(),
                    &token,
                    &self.inner.channel.as_str(),
                ],
            )
            .await?;
        Ok(if rows.is_empty() {
            Release::NotHeld
        } else {
            Release::Released
        })
    }

    async fn inspect(&self, name: &LeaseName) -> StoreResult<Option<LeaseState>> {
        let op = Op::new("inspect", Some(name));
        let rows = self
            .query(op, &self.inner.sql.inspect, &[&name.as_str()])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        Ok(Some(self.lease_state(
            name,
            get(row, 0)?,
            get(row, 1)?,
            get(row, 2)?,
        )?))
    }

    async fn now_millis(&self) -> StoreResult<u64> {
        let op = Op::new("clock", None);
        let rows = self.query(op, &self.inner.sql.now_millis, &[]).await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt("clock query returned no row".to_owned()))?;
        column::clock_ms(get(row, 0)?)
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.inner.releases.as_ref().map(ReleaseFeed::subscribe)
    }

    fn describe(&self) -> String {
        format!(
            "postgres {} (table {}.{})",
            self.inner.url, self.inner.schema, self.inner.lease_table
        )
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    /// One statement for the whole batch.
    async fn renew_many(
        &self,
        holder: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> StoreResult<Vec<Renewal>> {
        // A token beyond i64 was never handed out here: it stays out of the statement (Lost).
        let (names, tokens): (Vec<&str>, Vec<i64>) = leases
            .iter()
            .filter_map(|(name, token)| Some((name.as_str(), column::token_param(*token)?)))
            .unzip();
        let ttl_ms = ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        let op = Op::new("renew_many", None);
        let rows = self
            .query(
                op,
                &self.inner.sql.renew_many,
                &[&names, &holder.as_str(), &tokens, &ttl_ms],
            )
            .await?;
        let mut renewed = std::collections::HashSet::with_capacity(rows.len());
        for row in &rows {
            renewed.insert((get::<String>(row, 0)?, get::<i64>(row, 1)?));
        }
        Ok(column::renewals(leases, &renewed))
    }
}

/// Opening a store from its settings: here rather than in `config`, which is plain data.
impl PgConfig {
    /// Checks the settings, connects, runs the migration (with [`migrate`](Self::migrate)) and
    /// (with [`notifications`](Self::notifications)) starts listening for releases.
    pub async fn connect(self) -> Result<PgStore> {
        PgStore::connect(self).await
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
    /// runtime; never with [`Error::Connect`].
    pub fn connect_lazy(self) -> Result<PgStore> {
        PgStore::open_lazy(self)
    }
}
