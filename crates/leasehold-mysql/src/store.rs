//! [`MySqlStore`]: the [`SqlStore`] on MySQL or MariaDB, and its [`MySql`] dialect.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use leasehold::StoreError;
use leasehold::catalog::{Forgetting, Registration};
use leasehold::store::{Operation as Op, ReleaseSubscription, StoreResult, within};
use leasehold::{HolderId, LeaseName};
use leasehold_sql::lazy::{self, Readiness};
use leasehold_sql::store::{
    Arg, Attempt, ControlColumns, LeaseRow, Renewed, Rows, SlotRow, Statement, TaskRow,
    control_columns, forgetting,
};
use leasehold_sql::{Causes, Dialect, SqlStore};
use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{
    Conn, Opts, OptsBuilder, Params, Pool, PoolConstraints, PoolOpts, Row, SslOpts, Transaction,
    TxOpts, Value,
};
use tokio::sync::watch;

use crate::config::{MySqlConfig, ServerUrl, SslMode};
use crate::error::{Error, MySqlSetupError, Result};
use crate::poller::{self, Feed, LocalReleases};
use crate::schema::{self, MigrateError, Statements};

/// How often a statement runs in all when the server picks it as a deadlock victim (it was
/// rolled back whole).
const MAX_ATTEMPTS: usize = 4;

/// The longest ttl or retention passed to the server: about 35 years, so `now + ttl` stays far
/// inside DATETIME's range.
const MAX_MICROS: u128 = 1 << 50;

/// Leases in MySQL or MariaDB: each operation one conditional statement on a pooled connection,
/// timed by the server's `SYSDATE(6)` in UTC. Its own methods ([`sql`](MySql::sql),
/// [`pool`](MySql::pool), ...) are its [`MySql`] dialect's.
///
/// Cheap to clone: clones share one connection pool and one release poller.
pub type MySqlStore = SqlStore<MySql>;

/// The MySQL/MariaDB dialect of a [`MySqlStore`]: its [`Statements`], the connection pool they
/// run on, and the release poller.
pub struct MySql {
    pool: Pool,
    sql: Statements,
    op_timeout: Duration,
    /// The server as parsed, without its password ([`MySqlConfig::describe`]).
    url: String,
    prefix: String,
    /// Present when notifications are on.
    releases: Option<Feed>,
    /// Releases this handle made that its poller has not seen yet.
    local: LocalReleases,
    /// Whether the tables are known to be usable; until they are, operations answer as
    /// [`Readiness`] says (a store from [`MySqlConfig::connect_lazy`]).
    ready: watch::Receiver<Readiness>,
}

impl Drop for MySql {
    fn drop(&mut self) {
        // Closes the idle connections politely (COM_QUIT) instead of leaving the server to
        // notice dropped sockets.
        let pool = self.pool.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = pool.disconnect().await;
            });
        }
    }
}

/// What a write statement reported.
struct Written {
    /// Rows matched (the connections set `CLIENT_FOUND_ROWS`).
    rows: u64,
    /// The statement's `LAST_INSERT_ID(expr)`, 0 when it set none.
    insert_id: u64,
}

/// The driver's settings: the parsed URL, TLS, the pool, and the session every connection
/// starts (UTC, a fixed SQL mode, READ COMMITTED, the server-side limits).
fn driver_opts(config: &MySqlConfig, server: &ServerUrl) -> Opts {
    let lock_wait = config.op_timeout.as_secs_f64().ceil().max(1.0) as u64;
    let statement_time = config.op_timeout.as_secs_f64();
    let setup = vec![
        // `/*M! … */` runs on MariaDB only (MySQL's max_execution_time covers SELECT alone).
        format!(
            "SET time_zone = '+00:00', sql_mode = 'STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION', \
             innodb_lock_wait_timeout = {lock_wait} /*M!100108 , max_statement_time = {statement_time:.3} */"
        ),
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_owned(),
    ];
    let pool = PoolOpts::default()
        .with_constraints(PoolConstraints::new(0, config.pool_size).unwrap_or_default())
        // The statements leave no session state behind; a reset would cost a round trip and
        // the prepared-statement cache.
        .with_reset_connection(false);
    let mut opts = OptsBuilder::default()
        .ip_or_hostname(server.host.clone())
        .tcp_port(server.port)
        .user(server.user.clone())
        .pass(server.password.clone())
        .db_name(Some(server.database.clone()))
        // Matched rows, not changed rows: a renewal writing the expiry it already had is not a
        // loss.
        .client_found_rows(true)
        // The driver would otherwise switch a loopback TCP connection to the server's Unix
        // socket, around any proxy in between.
        .prefer_socket(false)
        .tcp_keepalive(Some(Duration::from_secs(30)))
        .pool_opts(pool)
        .setup(setup);
    let tls = match server.ssl_mode {
        SslMode::Disabled => None,
        mode => {
            let mut tls = SslOpts::default();
            if let Some(pem) = &server.ca_pem {
                tls = tls
                    .with_root_certs(vec![pem.clone().into()])
                    .with_disable_built_in_roots(true);
            }
            // `required` encrypts without checking the certificate unless a CA was given (as
            // MySQL's client does); `verify-ca` and `verify-identity` check the chain and the
            // host name: the driver's switch to leave the name out does not work with the
            // rustls it uses, so `verify-ca` is stricter than MySQL's.
            let check = mode != SslMode::Required || server.ca_pem.is_some();
            tls = tls.with_danger_accept_invalid_certs(!check);
            Some(tls)
        }
    };
    opts = opts.ssl_opts(tls);
    Opts::from(opts)
}

/// Maps a driver error to a [`StoreError`]: lost connections, shutdowns, read-only servers,
/// deadlocks and resource shortages are transient ([`StoreError::Unavailable`]), a statement
/// stopped by a server-side limit is a [`StoreError::Timeout`], anything else the server
/// refused (credentials, privileges, an unknown database or table) is [`StoreError::Rejected`].
pub(crate) fn classify(e: mysql_async::Error, op: Op<'_>, limit: Duration) -> StoreError {
    let mysql_async::Error::Server(server) = &e else {
        // A certificate the client refused, or a server without the TLS the URL asks for, will
        // not change by retrying.
        let rejected = match &e {
            mysql_async::Error::Url(_)
            | mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) => {
                true
            }
            mysql_async::Error::Io(mysql_async::IoError::Io(io)) => {
                io.kind() == std::io::ErrorKind::InvalidData
            }
            _ => false,
        };
        let message = format!("{op} failed: {}", Causes(&e));
        return if rejected {
            StoreError::rejected(message, e)
        } else {
            StoreError::unavailable(message, e)
        };
    };
    let code = server.code;
    let message = format!("{op} failed: {} ({code})", server.message);
    match code {
        // Lock wait timeout; MariaDB's max_statement_time; MySQL's max_execution_time.
        1205 | 1969 | 3024 => StoreError::Timeout(limit),
        // Too many connections, shutdown, network trouble, deadlock victim, read-only server
        // (a replica not promoted yet), query or connection killed, commit failed, a Galera
        // node not ready, disk full, a statement to prepare again, idle disconnect.
        1021
        | 1040
        | 1047
        | 1053
        | 1077..=1080
        | 1114
        | 1152..=1161
        | 1180
        | 1184
        | 1203
        | 1213
        | 1290
        | 1317
        | 1615
        | 1836
        | 1927
        | 4031 => StoreError::unavailable(message, e),
        _ => StoreError::rejected(message, e),
    }
}

/// Whether the server rolled the statement back as a deadlock victim (safe to run again: in
/// autocommit nothing of it stayed).
fn is_deadlock(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if s.code == 1213)
}

fn micros(d: Duration) -> i64 {
    d.as_micros().min(MAX_MICROS) as i64
}

/// Column `i` of `row`, converted; a value of another type is a corrupt record, not a panic.
fn col<T: FromValue>(row: &Row, i: usize) -> StoreResult<T> {
    match row.get_opt::<T, usize>(i) {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(StoreError::Corrupt(format!("unexpected column {i}: {e}"))),
        None => Err(StoreError::Corrupt(format!("missing column {i}"))),
    }
}

/// A batch as the JSON array `renew_many` reads: `[["name",token],...]`. Lease names hold only
/// `A-Z a-z 0-9 - _ . : /`, nothing JSON would escape.
fn batch_json(leases: &[(&str, i64)]) -> String {
    let mut out = String::with_capacity(leases.len() * 48 + 2);
    out.push('[');
    for (i, (name, token)) in leases.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!("[\"{name}\",{token}]"));
    }
    out.push(']');
    out
}

/// What connecting needs, parsed and built before any network traffic.
struct Parts {
    opts: Opts,
    pool: Pool,
    url: String,
    sql: Statements,
}

impl Parts {
    fn new(config: &MySqlConfig) -> Result<Self> {
        config.validate()?;
        let server = config.server()?;
        let opts = driver_opts(config, &server);
        Ok(Self {
            pool: Pool::new(opts.clone()),
            opts,
            url: server.shown(),
            sql: Statements::new(&config.table_prefix),
        })
    }
}

impl MySql {
    fn new(config: &MySqlConfig, parts: Parts, ready: watch::Receiver<Readiness>) -> Self {
        let local = LocalReleases::default();
        let releases = config.notifications.then(|| {
            poller::start(
                parts.opts,
                parts.sql.releases_since.clone(),
                config,
                &parts.url,
                local.clone(),
                ready.clone(),
            )
        });
        Self {
            pool: parts.pool,
            sql: parts.sql,
            op_timeout: config.op_timeout,
            url: parts.url,
            prefix: config.table_prefix.clone(),
            releases,
            local,
            ready,
        }
    }

    async fn connect(config: MySqlConfig) -> Result<MySqlStore> {
        let parts = Parts::new(&config)?;
        set_up(&parts.pool, &config, &parts.url, &parts.sql).await?;
        let dialect = Self::new(&config, parts, lazy::ready());
        if let Some(releases) = &dialect.releases {
            // So a subscription taken right after `connect` hears every later release.
            releases.first_attempt(config.connect_timeout).await;
        }
        tracing::debug!(url = %dialect.url, prefix = %config.table_prefix, "connected to mysql");
        Ok(SqlStore::new(Arc::new(dialect)))
    }

    /// A store that connects in the background: returned at once (the URL and settings are
    /// checked now), it answers every operation with [`StoreError::Unavailable`] until a
    /// connection is made and the tables are checked, retrying with backoff up to
    /// `max_reconnect_delay`. While the server refuses the connection (credentials, an unknown
    /// database) operations answer [`StoreError::Rejected`] and attempts go on; tables the
    /// store cannot use, or a refused migration, make every operation answer
    /// [`StoreError::Rejected`] for good. Operations wait for the first attempt to end (within
    /// their timeout). Needs a Tokio runtime.
    fn connect_lazy(config: MySqlConfig) -> Result<MySqlStore> {
        let parts = Parts::new(&config)?;
        let (ready_tx, ready) = lazy::channel().map_err(MySqlSetupError::Config)?;
        let dialect = Arc::new(Self::new(&config, parts, ready));
        let (url, max_delay) = (dialect.url.clone(), config.max_reconnect_delay);
        let config = Arc::new(config);
        let attempt = move |dialect: &Self| {
            let (pool, url) = (dialect.pool.clone(), dialect.url.clone());
            let (sql, config) = (dialect.sql.clone(), Arc::clone(&config));
            async move { set_up(&pool, &config, &url, &sql).await }
        };
        let task = lazy::spawn(
            Arc::downgrade(&dialect),
            ready_tx,
            "mysql",
            url.clone(),
            max_delay,
            attempt,
            lazy::judge("mysql", url),
        );
        Ok(SqlStore::connecting(dialect, task))
    }

    /// The SQL statements this store runs.
    pub fn sql(&self) -> &Statements {
        &self.sql
    }

    /// The prefix of the store's table names.
    pub fn table_prefix(&self) -> &str {
        &self.prefix
    }

    /// The store's connection pool (connections in UTC, READ COMMITTED, with
    /// `CLIENT_FOUND_ROWS`).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Fails unless the store is connected and its tables checked.
    async fn check_ready(&self, op: Op<'_>) -> StoreResult<()> {
        lazy::check(&self.ready, op, &self.url).await
    }

    /// A pooled connection, or why none.
    async fn conn(&self, op: Op<'_>) -> StoreResult<Conn> {
        self.pool
            .get_conn()
            .await
            .map_err(|e| classify(e, op, self.op_timeout))
    }

    /// Runs a write (a cached prepared statement, one round trip), again if the server picked
    /// it as a deadlock victim, all within the operation timeout.
    async fn write(&self, op: Op<'_>, sql: &str, params: Params) -> StoreResult<Written> {
        let limit = self.op_timeout;
        within(limit, async {
            self.check_ready(op).await?;
            let mut conn = self.conn(op).await?;
            let mut attempt = 1;
            loop {
                match conn.exec_drop(sql, params.clone()).await {
                    Ok(()) => {
                        return Ok(Written {
                            rows: conn.affected_rows(),
                            insert_id: conn.last_insert_id().unwrap_or(0),
                        });
                    }
                    Err(e) if is_deadlock(&e) && attempt < MAX_ATTEMPTS => attempt += 1,
                    Err(e) => return Err(classify(e, op, limit)),
                }
            }
        })
        .await
    }

    /// Runs a read (a cached prepared statement, one round trip) within the operation timeout.
    async fn read(&self, op: Op<'_>, sql: &str, params: Params) -> StoreResult<Vec<Row>> {
        let limit = self.op_timeout;
        within(limit, async {
            self.check_ready(op).await?;
            let mut conn = self.conn(op).await?;
            conn.exec(sql, params)
                .await
                .map_err(|e| classify(e, op, limit))
        })
        .await
    }

    /// Runs `body` on a transaction of its own, which it commits; all again (on another
    /// transaction) if the server picked it as a deadlock victim and rolled it back, within the
    /// operation timeout. A transaction dropped uncommitted, by an error or the timeout, is
    /// rolled back before its connection is used again.
    async fn transaction<T, F, Fut>(&self, op: Op<'_>, mut body: F) -> StoreResult<T>
    where
        F: FnMut(Transaction<'static>) -> Fut,
        Fut: Future<Output = mysql_async::Result<T>>,
    {
        let limit = self.op_timeout;
        within(limit, async {
            self.check_ready(op).await?;
            let mut attempt = 1;
            loop {
                let outcome = match self.pool.start_transaction(TxOpts::default()).await {
                    Ok(tx) => body(tx).await,
                    Err(e) => Err(e),
                };
                match outcome {
                    Ok(value) => return Ok(value),
                    Err(e) if is_deadlock(&e) && attempt < MAX_ATTEMPTS => attempt += 1,
                    Err(e) => return Err(classify(e, op, limit)),
                }
            }
        })
        .await
    }

    /// The current holder, token and remaining time of `name` (as `inspect` answers).
    async fn state(&self, op: Op<'_>, name: &LeaseName) -> StoreResult<Option<LeaseRow>> {
        let rows = self
            .run(op, Statement::Inspect, &[Arg::Text(name.as_str())])
            .await?;
        rows.first().map(|row| LeaseRow::read(row, 0)).transpose()
    }
}

/// Connects once, checks (and with `migrate` creates) the tables, checks that this user may
/// write them, and notes a binary log that would replicate `SYSDATE()` by re-running it.
async fn set_up(pool: &Pool, config: &MySqlConfig, url: &str, sql: &Statements) -> Result<()> {
    let op = Op::new("connect", None);
    let limit = config.connect_timeout;
    let connect_err = |source| Error::Connect {
        store: url.to_owned(),
        source,
    };
    let mut conn = match tokio::time::timeout(limit, pool.get_conn()).await {
        Err(_) => return Err(connect_err(StoreError::Timeout(limit))),
        // 1049: the URL's database does not exist (the store creates tables, not databases).
        Ok(Err(e)) if matches!(&e, mysql_async::Error::Server(s) if s.code == 1049) => {
            return Err(Error::MissingDatabase {
                store: url.to_owned(),
                database: ServerUrl::parse(&config.url)
                    .map(|u| u.database)
                    .unwrap_or_default(),
                source: classify(e, op, config.op_timeout),
            });
        }
        Ok(Err(e)) => return Err(connect_err(classify(e, op, config.op_timeout))),
        Ok(Ok(conn)) => conn,
    };
    let checks = async {
        match schema::migrate(&mut conn, &config.table_prefix, sql, config.migrate).await {
            Ok(()) => {}
            Err(MigrateError::Shape(problem)) => {
                return Err(MySqlSetupError::Schema {
                    url: url.to_owned(),
                    problem,
                }
                .into());
            }
            Err(MigrateError::TooOld(source)) => {
                return Err(Error::TooOld {
                    store: url.to_owned(),
                    source,
                });
            }
            Err(MigrateError::Sql(e)) => {
                return Err(Error::Migrate {
                    store: url.to_owned(),
                    source: classify(e, Op::new("migration", None), config.op_timeout),
                });
            }
        }
        schema::check_writable(&mut conn, &config.table_prefix)
            .await
            .map_err(|e| MySqlSetupError::NotWritable {
                url: url.to_owned(),
                source: classify(e, Op::new("write check", None), config.op_timeout),
            })?;
        warn_on_statement_binlog(&mut conn, url).await;
        Ok(())
    };
    // A handful of catalog reads and, once, the DDL: bounded like a connect.
    tokio::time::timeout(limit * 2, checks)
        .await
        .unwrap_or_else(|_| Err(connect_err(StoreError::Timeout(limit * 2))))
}

/// Logs a warning when the server writes a statement-based binary log: a replica would run
/// `SYSDATE()` again at its own time (MIXED and ROW log the rows the primary wrote).
async fn warn_on_statement_binlog(conn: &mut Conn, url: &str) {
    let row: Option<Row> = conn
        .query_first("SELECT @@log_bin, @@binlog_format")
        .await
        .ok()
        .flatten();
    let Some(row) = row else { return };
    let log_bin = row
        .get_opt::<i64, usize>(0)
        .and_then(Result::ok)
        .unwrap_or(0);
    let format = row
        .get_opt::<String, usize>(1)
        .and_then(Result::ok)
        .unwrap_or_default();
    if log_bin != 0 && format.eq_ignore_ascii_case("STATEMENT") {
        tracing::warn!(url = %url, "binlog_format is STATEMENT: replicas re-run SYSDATE() at their own time and keep other expiries and tokens than the primary; use ROW or MIXED");
    }
}

/// A row as the driver answers it, read through [`col`].
pub struct MySqlRow(Row);

leasehold_sql::columns!(MySqlRow, col);

impl fmt::Debug for MySql {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("url", &self.url)
            .field("table_prefix", &self.prefix)
            .finish()
    }
}

/// Each operation one statement, but `acquire` when busy and `renew_many` when it renewed fewer
/// than it was given (a read after the write), `members` (a write, a read, and a delete when it
/// read expired entries), `record_history` (the entry, then the trim), and `register` and
/// `tasks`, one short transaction each. Every statement that locks both a task's row and
/// instance rows locks the task's row first, and a registration skips the instance rows others
/// hold, so the catalog's writers wait on each other only in one order.
impl Dialect for MySql {
    const BIGINT: &'static str = "BIGINT";

    /// A refused claim answers `last + 1`, so the highest slot must stay below i64::MAX.
    const MAX_SLOT: i64 = i64::MAX - 1;

    type Row = MySqlRow;

    /// The writes among them run again when picked as a deadlock victim.
    async fn run(&self, op: Op<'_>, sql: Statement, args: &[Arg<'_>]) -> StoreResult<Rows<Self>> {
        let values = args.iter().map(|arg| match *arg {
            Arg::Text(text) => Value::from(text),
            Arg::Int(int) => Value::from(int),
        });
        let params = Params::Positional(values.collect());
        let text = leasehold_sql::shared_statement!(self.sql, sql);
        if matches!(sql, Statement::Unregister | Statement::Leave) {
            self.write(op, text, params).await?;
            return Ok(Vec::new());
        }
        let rows = self.read(op, text, params).await?;
        Ok(rows.into_iter().map(MySqlRow).collect())
    }

    fn describe(&self) -> String {
        format!("mysql {} (table {}leases)", self.url, self.prefix)
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.releases.as_ref().map(|feed| feed.hub.subscribe())
    }

    async fn acquire(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Attempt> {
        let ttl = micros(ttl).max(1);
        let params = Params::from((name.as_str(), holder.as_str(), ttl, ttl, ttl, ttl, ttl));
        let written = self.write(op, &self.sql.acquire, params).await?;
        if written.insert_id > 0 {
            let token = i64::try_from(written.insert_id).map_err(|_| {
                StoreError::Corrupt(format!("token {} beyond i64", written.insert_id))
            })?;
            return Ok(Attempt::Acquired(token));
        }
        // Busy: who holds it, for how long. A release or expiry between the two statements
        // shows a free lease here.
        let state = self.state(op, name).await?;
        let (holder, remaining_us) = state.map_or((None, None), |s| (s.holder, s.remaining_us));
        Ok(Attempt::Held {
            holder,
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
        let params = Params::from((micros(ttl).max(1), name.as_str(), holder.as_str(), token));
        let written = self.write(op, &self.sql.renew, params).await?;
        Ok(written.rows != 0)
    }

    async fn renew_many(
        &self,
        op: Op<'_>,
        holder: &HolderId,
        batch: &[(&str, i64)],
        ttl: Duration,
    ) -> StoreResult<Renewed> {
        if batch.is_empty() {
            return Ok(Renewed::Only(HashSet::new()));
        }
        let json = batch_json(batch);
        let params = Params::from((json.as_str(), micros(ttl).max(1), holder.as_str()));
        let written = self.write(op, &self.sql.renew_many, params).await?;
        if written.rows == batch.len() as u64 {
            // Every lease matched a row of its own: each was renewed.
            return Ok(Renewed::All);
        }
        // Which ones. A lease the update did not renew had expired, been released or been
        // taken: none of those comes back with the same holder and token, so this read cannot
        // call it renewed. (A renewed lease that a concurrent release of the same holder ended
        // since reads as lost: the safe side.)
        let params = Params::from((json.as_str(), holder.as_str()));
        let rows = self.read(op, &self.sql.held_of_many, params).await?;
        Renewed::read(rows.into_iter().map(MySqlRow))
    }

    async fn release(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        token: i64,
    ) -> StoreResult<bool> {
        let params = Params::from((name.as_str(), holder.as_str(), token));
        let written = self.write(op, &self.sql.release, params).await?;
        if written.rows == 0 {
            return Ok(false);
        }
        if let Some(feed) = &self.releases {
            // Waiters in this process hear of it now; the poller skips it when it reads it.
            self.local.note(name.as_str());
            feed.hub.publish(name.as_str());
        }
        Ok(true)
    }

    async fn claim_slot(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        slot: i64,
    ) -> StoreResult<Option<SlotRow>> {
        let params = Params::from((task.as_str(), slot));
        let written = self.write(op, &self.sql.claim_slot, params).await?;
        Ok(Some(match written.insert_id {
            0 => SlotRow::Claimed,
            above => SlotRow::Last(
                i64::try_from(above - 1)
                    .map_err(|_| StoreError::Corrupt(format!("slot {} beyond i64", above - 1)))?,
            ),
        }))
    }

    /// Two statements: the entry, then the trim to the `keep` newest (which also removes the
    /// entry again when its key is older than those).
    async fn record_history(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        key: i64,
        entry: &str,
        keep: i64,
    ) -> StoreResult<()> {
        let put = Params::from((task.as_str(), key, entry));
        self.write(op, &self.sql.record_history, put).await?;
        let trim = Params::from((task.as_str(), task.as_str(), keep - 1));
        self.write(op, &self.sql.trim_history, trim).await?;
        Ok(())
    }

    async fn purge(&self, op: Op<'_>, retention: Duration) -> StoreResult<u64> {
        let params = Params::from((micros(retention),));
        Ok(self.write(op, &self.sql.purge, params).await?.rows)
    }

    /// An upsert of the caller's entry and a read of the group; a delete of the expired entries
    /// when the read saw any.
    async fn members(
        &self,
        op: Op<'_>,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Vec<String>> {
        let join = Params::from((group.as_str(), member.as_str(), micros(ttl).max(1)));
        self.write(op, &self.sql.join, join).await?;
        let params = Params::from((group.as_str(),));
        let rows = self.read(op, &self.sql.members, params).await?;
        let mut members = Vec::with_capacity(rows.len());
        let mut expired = false;
        for row in &rows {
            let m: String = col(row, 0)?;
            if col::<i64>(row, 1)? == 0 {
                expired = true;
            } else {
                members.push(m);
            }
        }
        if expired {
            let params = Params::from((group.as_str(),));
            self.write(op, &self.sql.drop_expired_members, params)
                .await?;
        }
        Ok(members)
    }

    async fn register(
        &self,
        op: Op<'_>,
        r: &Registration<'_>,
    ) -> StoreResult<Option<ControlColumns>> {
        let sql = &self.sql;
        let (task, ttl, forget) = (
            r.task.as_str(),
            micros(r.ttl).max(1),
            micros(r.forget_after),
        );
        let (control, beats) = self
            .transaction(op, |mut tx| async move {
                tx.exec_drop(&sql.register_task, (task, r.definition, ttl))
                    .await?;
                let params = (r.instance.as_str(), r.about, ttl, task);
                tx.exec_drop(&sql.heartbeat, params).await?;
                let beats = tx.affected_rows();
                let forgotten: Vec<Row> = tx.exec(&sql.forgotten_instances, (task, forget)).await?;
                for row in &forgotten {
                    // Bytes as stored, whatever the instance registered with.
                    if let Some(Ok(instance)) = row.get_opt::<Vec<u8>, usize>(0) {
                        tx.exec_drop(&sql.unregister, (task, instance)).await?;
                    }
                }
                let control: Option<Row> = tx.exec_first(&sql.task_control, (task,)).await?;
                tx.commit().await?;
                Ok((control, beats))
            })
            .await?;
        if beats == 0 {
            return Err(StoreError::Corrupt(format!(
                "{op}: the heartbeat wrote no row"
            )));
        }
        match control {
            Some(row) => Ok(Some(control_columns(&MySqlRow(row), 0)?)),
            None => Err(StoreError::Corrupt(format!("{op}: the task row is gone"))),
        }
    }

    /// Forgets what is due, then lists what is left, in one transaction. In no order: an
    /// ORDER BY over both tables, with their text columns, would need an on-disk temporary
    /// table.
    async fn tasks(&self, op: Op<'_>, forget_after: Duration) -> StoreResult<Vec<TaskRow>> {
        let sql = &self.sql;
        let forget = micros(forget_after);
        let rows = self
            .transaction(op, |mut tx| async move {
                tx.exec_drop(&sql.forget_tasks, (forget,)).await?;
                tx.exec_drop(&sql.forget_instances, (forget,)).await?;
                let rows: Vec<Row> = tx.exec(&sql.tasks, (forget,)).await?;
                tx.commit().await?;
                Ok(rows)
            })
            .await?;
        rows.into_iter()
            .map(|row| TaskRow::read(&MySqlRow(row)))
            .collect()
    }

    async fn create_control(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        value: &str,
    ) -> StoreResult<Option<i64>> {
        let params = Params::from((task.as_str(), value));
        let written = self.write(op, &self.sql.create_control, params).await?;
        Ok((written.insert_id == 1).then_some(1))
    }

    async fn update_control(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        expected: i64,
        value: &str,
    ) -> StoreResult<Option<i64>> {
        let params = Params::from((value, task.as_str(), expected));
        let written = self.write(op, &self.sql.update_control, params).await?;
        // Written means the server raised the version within a BIGINT: no overflow.
        Ok((written.rows == 1).then(|| expected.saturating_add(1)))
    }

    /// One transaction that first locks the task's row, as a registration's first statement
    /// does: a registration either committed before (its heartbeat is seen live) or waits and
    /// then writes the task afresh. Instances exist only beside their task's row (a heartbeat
    /// is inserted from it), so a task without one has none to remove.
    async fn forget(&self, op: Op<'_>, task: &LeaseName, history: bool) -> StoreResult<Forgetting> {
        let sql = &self.sql;
        let task = task.as_str();
        let (live, had_task, removed) = self
            .transaction(op, |mut tx| async move {
                let had_task = tx.exec_first::<i64, _, _>(&sql.lock_task, (task,)).await?;
                let live: i64 = match had_task {
                    Some(_) => tx
                        .exec_first(&sql.live_instances, (task,))
                        .await?
                        .unwrap_or(0),
                    None => 0,
                };
                if live > 0 {
                    tx.rollback().await?;
                    return Ok((live, true, false));
                }
                let mut removed = false;
                if had_task.is_some() {
                    tx.exec_drop(&sql.delete_instances, (task,)).await?;
                    tx.exec_drop(&sql.delete_task, (task,)).await?;
                    removed = tx.affected_rows() > 0;
                }
                if history {
                    tx.exec_drop(&sql.delete_history, (task,)).await?;
                }
                tx.commit().await?;
                Ok((live, had_task.is_some(), removed))
            })
            .await?;
        Ok(forgetting(live, had_task, removed, removed))
    }
}

/// Opening a store from its settings: here rather than in `config`, which is plain data.
impl MySqlConfig {
    /// Checks the settings, connects, checks the tables (creating the missing ones with
    /// [`migrate`](Self::migrate)), checks that the user may write them and (with
    /// [`notifications`](Self::notifications)) starts the release poller.
    pub async fn connect(self) -> Result<MySqlStore> {
        MySql::connect(self).await
    }

    /// Returns the store at once and connects in the background (see
    /// [`connect`](Self::connect)): every operation answers
    /// [`StoreError::Unavailable`](leasehold::StoreError::Unavailable) until the server is
    /// reached and the tables are checked. For a service that must start while its database is
    /// down. Fails only on settings or a URL that can never work, or outside a Tokio runtime.
    pub fn connect_lazy(self) -> Result<MySqlStore> {
        MySql::connect_lazy(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_json_arrays() {
        assert_eq!(batch_json(&[]), "[]");
        assert_eq!(
            batch_json(&[("a/b:c", 1), ("d", 1_796_000_000_000_001)]),
            r#"[["a/b:c",1],["d",1796000000000001]]"#
        );
    }

    #[test]
    fn server_errors_are_classified() {
        let server = |code: u16| {
            mysql_async::Error::Server(mysql_async::ServerError {
                code,
                message: format!("code {code}"),
                state: "HY000".to_owned(),
            })
        };
        let op = Op::new("renew", None);
        let limit = Duration::from_secs(2);
        // Credentials, privileges, a missing database or table: refused, not retried.
        for code in [1044, 1045, 1049, 1142, 1146] {
            let e = classify(server(code), op, limit);
            assert!(matches!(e, StoreError::Rejected { .. }), "{code}: {e:?}");
            assert!(e.to_string().contains(&format!("({code})")), "{e}");
        }
        // Shutdown, deadlock, read-only replica, killed connection: try again later.
        for code in [1053, 1213, 1290, 1927] {
            let e = classify(server(code), op, limit);
            assert!(e.is_transient(), "{code}: {e:?}");
        }
        assert!(matches!(
            classify(server(1205), op, limit),
            StoreError::Timeout(_)
        ));
        // TLS the client cannot accept: refused; a lost connection: transient.
        let no_tls =
            mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer);
        assert!(matches!(
            classify(no_tls, op, limit),
            StoreError::Rejected { .. }
        ));
        let io =
            |kind| mysql_async::Error::Io(mysql_async::IoError::Io(std::io::Error::new(kind, "x")));
        let bad_cert = classify(io(std::io::ErrorKind::InvalidData), op, limit);
        assert!(
            matches!(bad_cert, StoreError::Rejected { .. }),
            "{bad_cert:?}"
        );
        assert!(classify(io(std::io::ErrorKind::ConnectionReset), op, limit).is_transient());
    }
}
