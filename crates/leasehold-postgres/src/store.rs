//! [`PgStore`]: the [`Store`] implementation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use leasehold::catalog::{ControlRead, LeaseRecord, Registration, TaskRecord, Versioned};
use leasehold::skew;
pub(crate) use leasehold::store::Operation as Op;
use leasehold::{
    Capabilities, Catalog, FencingToken, HolderId, LeaseName, LeaseState, Membership, Purge,
    Release, Slots, Store, StoreError,
    store::{
        Acquisition, ReleaseFeed, ReleaseSubscription, Renewal, SlotClaim, StoreResult, within,
    },
};
use leasehold_sql::lazy::{self, Failure, Readiness};
use leasehold_sql::{Causes, column};
use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};
use tokio_util::task::AbortOnDropHandle;

use crate::config::{PgConfig, Tls, qualified};
use crate::error::{Error, Result};
use crate::listener;

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

/// The SQL this store runs, one statement per operation, for review and for tests that run a
/// statement inside a transaction of their own. Every timing decision uses
/// `clock_timestamp()`, the server's current time, never `now()` (the start of the
/// transaction).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Statements {
    /// Acquire: `$1` name, `$2` holder, `$3` ttl in milliseconds. One row: `(token bigint,
    /// holder text, remaining_us bigint)`; `token` is set when acquired, otherwise `holder` and
    /// `remaining_us` describe the current holder as of the statement's snapshot. If that
    /// snapshot does not show a live holder (a concurrent writer committed in between) the store
    /// runs the statement again. `remaining_us` is NULL for an infinite `expires_at`.
    pub acquire: String,
    /// Renew: `$1` name, `$2` holder, `$3` token, `$4` ttl in milliseconds. One row when renewed.
    pub renew: String,
    /// Renew many: `$1` names `text[]`, `$2` holder, `$3` tokens `bigint[]` (pairwise with the
    /// names), `$4` ttl in milliseconds. `(name text, token bigint)` per lease renewed.
    pub renew_many: String,
    /// Release, with `pg_notify` in the same statement: `$1` name, `$2` holder, `$3` token,
    /// `$4` channel. One row when released.
    pub release: String,
    /// Purge: `$1` retention in milliseconds. Deletes the leases free (released or expired) for
    /// at least that long. One row: `(count bigint)`.
    pub purge: String,
    /// Inspect: `$1` name. `(holder text, token bigint, remaining_us bigint)`, no row when the
    /// name was never acquired; `remaining_us` is NULL for an infinite `expires_at`.
    pub inspect: String,
    /// Claim a slot: `$1` task, `$2` slot. One row `(claimed bool, last_slot bigint)`.
    pub claim_slot: String,
    /// The server's clock in milliseconds since the Unix epoch.
    pub now_millis: String,
    /// The highest claimed slot: `$1` task. `(last_slot bigint)`, no row if none.
    pub last_slot: String,
    /// Record a history entry and keep the newest: `$1` task, `$2` key, `$3` entry, `$4` how
    /// many to keep (the store passes at least 1). One statement: the entry is written only if
    /// its key is among the `$4` highest, and the task's other keys beyond those are deleted.
    pub record_history: String,
    /// The newest history entries: `$1` task, `$2` limit. `(entry text)`, newest first.
    pub history: String,
    /// Refresh a spread-group membership and read it: `$1` group, `$2` member, `$3` ttl in
    /// milliseconds. One statement: the member's entry is upserted to expire `$3` from now, the
    /// group's expired entries are deleted, and `(member text)` is returned per live member.
    pub members: String,
    /// Leave a spread group: `$1` group, `$2` member.
    pub leave: String,
    /// Register a task: `$1` task, `$2` definition, `$3` instance, `$4` what the instance says
    /// about itself, `$5` heartbeat ttl in milliseconds, `$6` forget-after in milliseconds. One
    /// statement: the instance's heartbeat is upserted to expire `$5` from now, then the task's
    /// definition (and `registered_at`), the task's other instances expired for longer than `$6`
    /// are deleted, and one row `(control_version bigint, control text)` answers the control
    /// record (NULLs when there is none).
    pub register: String,
    /// Unregister: `$1` task, `$2` instance.
    pub unregister: String,
    /// The catalog: `$1` forget-after in milliseconds. One statement: deletes the instances
    /// expired for longer than that and the tasks with no control record, no instance left and
    /// no registration within it; answers `(task text, definition text, control_version bigint,
    /// control text, instance text, about text, remaining_us bigint)` per instance seen within
    /// it (instance columns NULL for a task with none), for the tasks with a control record or
    /// such an instance, sorted by task, live before expired, then instance (bytewise).
    pub tasks: String,
    /// A task's control record with the server's clock: `$1` task. One row `(now_ms bigint,
    /// control_version bigint, control text)`, the last two NULL when there is none.
    pub control: String,
    /// Write a task's first control record: `$1` task, `$2` value. `(control_version bigint)`
    /// (1) when written, no row when the task has one already.
    pub create_control: String,
    /// Replace a task's control record by compare-and-set: `$1` task, `$2` expected version,
    /// `$3` value. `(control_version bigint)` when written, no row when the version differed.
    pub update_control: String,
    /// Lease records: `$1` limit. `(name text, holder text, token bigint, remaining_us bigint)`
    /// per lease, sorted by name (bytewise).
    pub leases: String,
    /// The names released within the last `$1` milliseconds (at most 1000): the release
    /// listener announces them after it reconnects, since notifications sent while it was away
    /// are lost.
    pub recent_releases: String,
    /// What the tables record about the releases that use them: `(key text, value text)` for
    /// the `schema_version` and `min_writer` rows (see [`leasehold::skew`]).
    pub read_meta: String,
    /// Records a meta row: `$1` key, `$2` value (an insert, or an update of the row).
    pub write_meta: String,
    /// The migration: creates the schema's tables if missing (run after the schema exists,
    /// under `pg_advisory_xact_lock`).
    pub create_tables: String,
}

impl Statements {
    fn new(config: &PgConfig) -> Self {
        let schema = &config.schema;
        let leases = qualified(schema, &config.lease_table);
        let slots = qualified(schema, &config.slot_table);
        let history = qualified(schema, &config.history_table);
        let members = qualified(schema, &config.members_table);
        let tasks = qualified(schema, &config.tasks_table);
        let instances = qualified(schema, &config.instances_table);
        let meta = qualified(schema, &config.meta_table);
        let ms = "* interval '1 millisecond'";
        Self {
            // Every acquisition is a new tenure, the holder's own included: the token goes up.
            // A name seen for the first time starts from the clock in ms x 1000 + 1, so a
            // dropped and recreated table never hands out a token below an earlier one.
            // The row is locked by the upsert; a concurrent acquirer waits for this statement's
            // commit and then re-checks the WHERE against the committed row (READ COMMITTED),
            // so exactly one of them takes a free or expired lease. EXCLUDED.expires_at - ttl
            // is this statement's clock_timestamp(), evaluated once.
            acquire: format!(
                "WITH acq AS (
  INSERT INTO {leases} AS l (name, holder, token, expires_at)
  VALUES ($1::text, $2::text,
          floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint * 1000 + 1,
          clock_timestamp() + $3::bigint {ms})
  ON CONFLICT (name) DO UPDATE SET
    holder = EXCLUDED.holder,
    token = l.token + 1,
    expires_at = EXCLUDED.expires_at
  WHERE l.holder IS NULL
     OR l.holder = EXCLUDED.holder
     OR l.expires_at <= EXCLUDED.expires_at - $3::bigint {ms}
  RETURNING l.token
)
SELECT acq.token, NULL::text AS holder, NULL::bigint AS remaining_us FROM acq
UNION ALL
SELECT NULL::bigint, cur.holder,
       CASE WHEN isfinite(cur.expires_at)
            THEN floor(extract(epoch FROM cur.expires_at - clock_timestamp()) * 1000000)::bigint
       END
  FROM {leases} cur
 WHERE cur.name = $1::text AND NOT EXISTS (SELECT 1 FROM acq)"
            ),
            renew: format!(
                "UPDATE {leases} SET expires_at = clock_timestamp() + $4::bigint {ms}
 WHERE name = $1::text AND holder = $2::text AND token = $3::bigint
   AND expires_at > clock_timestamp()
RETURNING 1"
            ),
            renew_many: format!(
                "UPDATE {leases} l SET expires_at = clock_timestamp() + $4::bigint {ms}
  FROM unnest($1::text[], $3::bigint[]) AS r(name, token)
 WHERE l.name = r.name AND l.holder = $2::text AND l.token = r.token
   AND l.expires_at > clock_timestamp()
RETURNING l.name, l.token"
            ),
            release: format!(
                "WITH rel AS (
  UPDATE {leases} SET holder = NULL, expires_at = clock_timestamp()
   WHERE name = $1::text AND holder = $2::text AND token = $3::bigint
     AND expires_at > clock_timestamp()
  RETURNING name
)
SELECT pg_notify($4::text, rel.name)::text FROM rel"
            ),
            // A released lease's expiry is its release time, so one comparison covers both.
            purge: format!(
                "WITH gone AS (
  DELETE FROM {leases} WHERE expires_at <= clock_timestamp() - $1::bigint {ms} RETURNING 1
)
SELECT count(*) FROM gone"
            ),
            inspect: format!(
                "SELECT l.holder, l.token,
       CASE WHEN isfinite(l.expires_at)
            THEN floor(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000000)::bigint
       END
  FROM {leases} l WHERE l.name = $1::text"
            ),
            claim_slot: format!(
                "WITH c AS (
  INSERT INTO {slots} AS s (task, last_slot) VALUES ($1::text, $2::bigint)
  ON CONFLICT (task) DO UPDATE SET last_slot = EXCLUDED.last_slot
  WHERE s.last_slot < EXCLUDED.last_slot
  RETURNING s.last_slot
)
SELECT true AS claimed, c.last_slot FROM c
UNION ALL
SELECT false, s.last_slot FROM {slots} s
 WHERE s.task = $1::text AND NOT EXISTS (SELECT 1 FROM c)"
            ),
            now_millis: "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
                .to_owned(),
            last_slot: format!("SELECT last_slot FROM {slots} WHERE task = $1::text"),
            // `kept`: the keep highest keys once this entry is in (the statement's snapshot does
            // not show the row `put` writes, so the new key is added by hand). The entry is
            // written only if its key is among them, and every other key of the task is
            // deleted; the two never touch the same row.
            record_history: format!(
                "WITH kept AS (
  SELECT k.key FROM (
    SELECT key FROM {history} WHERE task = $1::text AND key <> $2::bigint
    UNION ALL SELECT $2::bigint
  ) k ORDER BY k.key DESC LIMIT $4::bigint
), put AS (
  INSERT INTO {history} (task, key, entry)
  SELECT $1::text, $2::bigint, $3::text WHERE $2::bigint IN (SELECT key FROM kept)
  ON CONFLICT (task, key) DO UPDATE SET entry = EXCLUDED.entry
  RETURNING key
)
DELETE FROM {history} h
 WHERE h.task = $1::text AND h.key NOT IN (SELECT key FROM kept)"
            ),
            history: format!(
                "SELECT entry FROM {history} WHERE task = $1::text ORDER BY key DESC LIMIT $2::bigint"
            ),
            // The outer SELECT sees the rows as they were before the statement, so the caller's
            // entry comes from the upsert's RETURNING instead.
            members: format!(
                "WITH up AS (
  INSERT INTO {members} AS m (group_name, member, expires_at)
  VALUES ($1::text, $2::text, clock_timestamp() + $3::bigint {ms})
  ON CONFLICT (group_name, member) DO UPDATE SET expires_at = EXCLUDED.expires_at
  RETURNING m.member
), gone AS (
  DELETE FROM {members}
   WHERE group_name = $1::text AND member <> $2::text AND expires_at <= clock_timestamp()
)
SELECT member FROM up
UNION ALL
SELECT member FROM {members}
 WHERE group_name = $1::text AND member <> $2::text AND expires_at > clock_timestamp()"
            ),
            leave: format!(
                "DELETE FROM {members} WHERE group_name = $1::text AND member = $2::text"
            ),
            // The heartbeat comes first and the definition selects from it, so every statement
            // that locks both an instance row and its task row locks them in that order. The
            // deletes skip rows another statement holds: a row being refreshed is not
            // forgotten, and no statement waits on another's deletion.
            register: format!(
                "WITH beat AS (
  INSERT INTO {instances} AS i (task, instance, about, expires_at)
  VALUES ($1::text, $3::text, $4::text, clock_timestamp() + $5::bigint {ms})
  ON CONFLICT (task, instance) DO UPDATE SET about = EXCLUDED.about,
    expires_at = EXCLUDED.expires_at
  RETURNING i.task
), def AS (
  INSERT INTO {tasks} AS t (task, definition, registered_at)
  SELECT beat.task, $2::text, clock_timestamp() FROM beat
  ON CONFLICT (task) DO UPDATE SET definition = EXCLUDED.definition,
    registered_at = EXCLUDED.registered_at
  RETURNING t.control_version, t.control
), forgotten AS (
  DELETE FROM {instances} WHERE (task, instance) IN (
    SELECT task, instance FROM {instances}
     WHERE task = $1::text AND instance <> $3::text
       AND expires_at <= clock_timestamp() - $6::bigint {ms}
       FOR UPDATE SKIP LOCKED)
)
SELECT control_version, control FROM def"
            ),
            unregister: format!(
                "DELETE FROM {instances} WHERE task = $1::text AND instance = $2::text"
            ),
            // The listing reads the statement's snapshot, so it applies the limits the deletes
            // apply. A registration committed after the snapshot is not in it, but a task row
            // is re-checked as it is when locked: its fresh `registered_at` keeps it.
            tasks: format!(
                "WITH n AS (SELECT clock_timestamp() AS at), forgotten AS (
  DELETE FROM {instances} WHERE (task, instance) IN (
    SELECT task, instance FROM {instances}
     WHERE expires_at <= clock_timestamp() - $1::bigint {ms}
       FOR UPDATE SKIP LOCKED)
), dropped AS (
  DELETE FROM {tasks} WHERE task IN (
    SELECT t.task FROM {tasks} t
     WHERE t.control_version IS NULL
       AND t.registered_at <= clock_timestamp() - $1::bigint {ms}
       AND NOT EXISTS (SELECT 1 FROM {instances} s WHERE s.task = t.task
                          AND s.expires_at > clock_timestamp() - $1::bigint {ms})
       FOR UPDATE OF t SKIP LOCKED)
)
SELECT t.task, t.definition, t.control_version, t.control, i.instance, i.about, i.remaining_us
  FROM {tasks} t
  LEFT JOIN (
    SELECT s.task, s.instance, s.about,
           floor(extract(epoch FROM s.expires_at - n.at) * 1000000)::bigint AS remaining_us
      FROM {instances} s, n
     WHERE s.expires_at > n.at - $1::bigint {ms}
  ) i ON i.task = t.task
 WHERE t.control_version IS NOT NULL OR i.task IS NOT NULL
 ORDER BY t.task COLLATE \"C\", i.remaining_us <= 0, i.instance COLLATE \"C\""
            ),
            control: format!(
                "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
       t.control_version, t.control
  FROM (SELECT 1) AS one LEFT JOIN {tasks} t ON t.task = $1::text"
            ),
            create_control: format!(
                "INSERT INTO {tasks} AS t (task, control_version, control)
VALUES ($1::text, 1, $2::text)
ON CONFLICT (task) DO UPDATE SET control_version = 1, control = EXCLUDED.control
 WHERE t.control_version IS NULL
RETURNING t.control_version"
            ),
            update_control: format!(
                "UPDATE {tasks} SET control_version = control_version + 1, control = $3::text
 WHERE task = $1::text AND control_version = $2::bigint
RETURNING control_version"
            ),
            leases: format!(
                "WITH n AS (SELECT clock_timestamp() AS at)
SELECT l.name, l.holder, l.token,
       floor(extract(epoch FROM l.expires_at - n.at) * 1000000)::bigint
  FROM {leases} l, n
 ORDER BY l.name COLLATE \"C\" LIMIT $1::bigint"
            ),
            // A release sets `holder = NULL, expires_at = clock_timestamp()`.
            recent_releases: format!(
                "SELECT name FROM {leases}
 WHERE holder IS NULL AND expires_at > clock_timestamp() - $1::bigint {ms}
 ORDER BY expires_at DESC LIMIT 1000"
            ),
            read_meta: format!(
                "SELECT key, value FROM {meta} WHERE key IN ('schema_version', 'min_writer')"
            ),
            write_meta: format!(
                "INSERT INTO {meta} (key, value) VALUES ($1::text, $2::text)
  ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
            ),
            create_tables: format!(
                "CREATE TABLE IF NOT EXISTS {leases} (
  name text PRIMARY KEY,
  holder text NULL,
  token bigint NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS {slots} (
  task text PRIMARY KEY,
  last_slot bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS {history} (
  task text NOT NULL,
  key bigint NOT NULL,
  entry text NOT NULL,
  PRIMARY KEY (task, key)
);
CREATE TABLE IF NOT EXISTS {members} (
  group_name text NOT NULL,
  member text NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (group_name, member)
);
CREATE TABLE IF NOT EXISTS {tasks} (
  task text PRIMARY KEY,
  definition text NULL,
  registered_at timestamptz NULL,
  control_version bigint NULL,
  control text NULL
);
CREATE TABLE IF NOT EXISTS {instances} (
  task text NOT NULL,
  instance text NOT NULL,
  about text NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (task, instance)
);
CREATE TABLE IF NOT EXISTS {meta} (
  key text PRIMARY KEY,
  value text NOT NULL
);"
            ),
        }
    }
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

/// Runs the migration on a pooled connection: `Err(Connect)` if no connection could be made,
/// `Err(Migrate)` if the server refused it.
async fn migrate_on(pool: &Pool, config: &PgConfig, url: &str, sql: &Statements) -> Result<()> {
    let connect_err = |source| Error::Connect {
        url: url.to_owned(),
        source,
    };
    let op = Op::new("connect", None);
    let mut client = tokio::time::timeout(config.connect_timeout * 2, pool.get())
        .await
        .map_err(|_| connect_err(StoreError::Timeout(config.connect_timeout)))?
        .map_err(|e| match e {
            // Establishing the connection took too long: that is the connect timeout.
            PoolError::Timeout(TimeoutType::Create) => {
                connect_err(StoreError::Timeout(config.connect_timeout))
            }
            e => connect_err(pool_error(e, op, config.op_timeout)),
        })?;
    let migrate_err = |e| Error::Migrate {
        url: url.to_owned(),
        source: classify(e, Op::new("migration", None), config.op_timeout),
    };
    // Before anything is written: a newer release may not let this one write to the tables.
    let recorded = read_meta(&client, &sql.read_meta)
        .await
        .map_err(migrate_err)?;
    if let Some(min_writer) = recorded.min_writer.as_deref() {
        skew::check_writer(min_writer).map_err(|source| Error::TooOld {
            url: url.to_owned(),
            source,
        })?;
    }
    if !config.migrate {
        return Ok(());
    }
    migrate(
        &mut client,
        &config.schema,
        &config.tables(),
        &sql.create_tables,
    )
    .await
    .map_err(migrate_err)?;
    let tables_behind = recorded.schema_version.is_none_or(|v| v < TABLES_VERSION);
    if tables_behind {
        let version = TABLES_VERSION.to_string();
        client
            .execute(&sql.write_meta, &[&skew::SCHEMA_VERSION_KEY, &version])
            .await
            .map_err(migrate_err)?;
    }
    if let Some(min_writer) = skew::raised_min_writer(recorded.min_writer.as_deref()) {
        client
            .execute(&sql.write_meta, &[&skew::MIN_WRITER_KEY, &min_writer])
            .await
            .map_err(migrate_err)?;
    }
    Ok(())
}

/// The tables' schema version in the meta table: 1 was release 0.1.0's four tables, 2 added
/// the catalog's two and the meta table itself.
pub(crate) const TABLES_VERSION: i64 = 2;

/// What the meta table says; nothing when it does not exist yet (tables of release 0.1.0).
#[derive(Debug, Default)]
struct MetaRecord {
    schema_version: Option<i64>,
    min_writer: Option<String>,
}

async fn read_meta(
    client: &tokio_postgres::Client,
    sql: &str,
) -> std::result::Result<MetaRecord, tokio_postgres::Error> {
    let rows = match client.query(sql, &[]).await {
        Ok(rows) => rows,
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
            return Ok(MetaRecord::default());
        }
        Err(e) => return Err(e),
    };
    let mut record = MetaRecord::default();
    for row in rows {
        let value: String = row.try_get(1)?;
        match row.try_get::<_, String>(0)?.as_str() {
            "schema_version" => record.schema_version = value.parse().ok(),
            _ => record.min_writer = Some(value),
        }
    }
    Ok(record)
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

/// Creates the schema (if missing) and the tables, under a transaction-scoped advisory lock so
/// instances starting at once do not race on the catalog. When all of `tables` exist already it
/// creates nothing, so a role with only USAGE on the schema and row privileges on the tables
/// (no CREATE) can leave the migration on.
pub(crate) async fn migrate(
    client: &mut tokio_postgres::Client,
    schema: &str,
    tables: &[&str],
    create_tables: &str,
) -> std::result::Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('leasehold migration')::bigint)",
        &[],
    )
    .await?;
    let present: i64 = tx
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = ANY($2)",
            &[&schema, &tables],
        )
        .await?
        .get(0);
    if usize::try_from(present).is_ok_and(|n| n == tables.len()) {
        return tx.commit().await;
    }
    // CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the database even when the
    // schema exists (and CREATE TABLE IF NOT EXISTS the CREATE privilege on the schema), so
    // each runs only when something is missing.
    let exists = tx
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
        .await?
        .is_some();
    if !exists {
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .await?;
    }
    tx.batch_execute(create_tables).await?;
    tx.commit().await
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

impl Slots for PgStore {
    async fn claim_slot(&self, task: &LeaseName, slot: u64) -> StoreResult<SlotClaim> {
        let op = Op::new("claim_slot", Some(task));
        let Some(slot_i) = to_i64(slot) else {
            return Err(StoreError::Rejected {
                message: format!("{op}: slot {slot} does not fit a bigint"),
                source: None,
            });
        };
        for _ in 0..MAX_ATTEMPTS {
            let rows = self
                .query(op, &self.inner.sql.claim_slot, &[&task.as_str(), &slot_i])
                .await?;
            let Some(row) = rows.first() else {
                continue;
            };
            let claimed: bool = get(row, 0)?;
            let last: i64 = get(row, 1)?;
            if claimed {
                return Ok(SlotClaim::Claimed);
            }
            if last >= slot_i {
                return Ok(SlotClaim::AlreadyRun { last: last as u64 });
            }
            // The snapshot predates a concurrent claim that the upsert saw: ask again.
        }
        Err(StoreError::Unavailable {
            message: format!("{op}: the slot kept changing under concurrent claims"),
            source: None,
        })
    }

    async fn last_slot(&self, task: &LeaseName) -> StoreResult<Option<u64>> {
        let op = Op::new("last_slot", Some(task));
        let rows = self
            .query(op, &self.inner.sql.last_slot, &[&task.as_str()])
            .await?;
        rows.first()
            .map(|row| column::slot(get(row, 0)?))
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
        let Some(key) = to_i64(key) else {
            return Err(StoreError::Rejected {
                message: format!("{op}: history key {key} does not fit a bigint"),
                source: None,
            });
        };
        let keep = i64::try_from(keep.max(1)).unwrap_or(i64::MAX);
        self.query(
            op,
            &self.inner.sql.record_history,
            &[&task.as_str(), &key, &entry, &keep],
        )
        .await?;
        Ok(())
    }

    async fn history(&self, task: &LeaseName, limit: usize) -> StoreResult<Vec<String>> {
        let op = Op::new("history", Some(task));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(op, &self.inner.sql.history, &[&task.as_str(), &limit])
            .await?;
        rows.iter().map(|row| get::<String>(row, 0)).collect()
    }
}

impl Purge for PgStore {
    async fn purge(&self, retention: Duration) -> StoreResult<u64> {
        let retention_ms = retention.as_millis().clamp(0, i64::MAX as u128) as i64;
        let op = Op::new("purge", None);
        let rows = self
            .query(op, &self.inner.sql.purge, &[&retention_ms])
            .await?;
        let deleted: i64 = match rows.first() {
            Some(row) => get(row, 0)?,
            None => 0,
        };
        Ok(deleted.max(0) as u64)
    }
}

impl Membership for PgStore {
    async fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Vec<HolderId>> {
        let ttl_ms = ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        let op = Op::new("members", Some(group));
        let rows = self
            .query(
                op,
                &self.inner.sql.members,
                &[&group.as_str(), &member.as_str(), &ttl_ms],
            )
            .await?;
        let mut members = rows
            .iter()
            .map(|row| column::member(get(row, 0)?))
            .collect::<StoreResult<Vec<_>>>()?;
        members.sort();
        Ok(members)
    }

    async fn leave(&self, group: &LeaseName, member: &HolderId) -> StoreResult<()> {
        let op = Op::new("leave", Some(group));
        self.query(
            op,
            &self.inner.sql.leave,
            &[&group.as_str(), &member.as_str()],
        )
        .await?;
        Ok(())
    }
}

/// The control record in columns `at` (version) and `at + 1` (value) of `row`.
fn control_of(row: &Row, at: usize) -> StoreResult<Option<Versioned>> {
    column::control(get(row, at)?, get(row, at + 1)?)
}

fn millis_of(d: Duration) -> i64 {
    d.as_millis().clamp(0, i64::MAX as u128) as i64
}

/// Each operation one statement, timed by `clock_timestamp()`.
impl Catalog for PgStore {
    async fn register(&self, r: &Registration<'_>) -> StoreResult<Option<Versioned>> {
        let op = Op::new("register", Some(r.task));
        let ttl_ms = r.ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        let rows = self
            .query(
                op,
                &self.inner.sql.register,
                &[
                    &r.task.as_str(),
                    &r.definition,
                    &r.instance.as_str(),
                    &r.about,
                    &ttl_ms,
                    &millis_of(r.forget_after),
                ],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt(format!("{op} returned no row")))?;
        control_of(row, 0)
    }

    async fn unregister(&self, task: &LeaseName, instance: &HolderId) -> StoreResult<()> {
        let op = Op::new("unregister", Some(task));
        self.query(
            op,
            &self.inner.sql.unregister,
            &[&task.as_str(), &instance.as_str()],
        )
        .await?;
        Ok(())
    }

    async fn tasks(&self, forget_after: Duration) -> StoreResult<Vec<TaskRecord>> {
        let op = Op::new("tasks", None);
        let rows = self
            .query(op, &self.inner.sql.tasks, &[&millis_of(forget_after)])
            .await?;
        let mut tasks: Vec<TaskRecord> = Vec::new();
        for row in &rows {
            let task: String = get(row, 0)?;
            if tasks.last().is_none_or(|t| t.task.as_str() != task) {
                tasks.push(TaskRecord {
                    task: column::name(task)?,
                    definition: get(row, 1)?,
                    instances: Vec::new(),
                    control: control_of(row, 2)?,
                });
            }
            let (Some(record), Some(instance)) = (tasks.last_mut(), get::<Option<String>>(row, 4)?)
            else {
                continue;
            };
            record
                .instances
                .push(column::instance(instance, get(row, 5)?, get(row, 6)?)?);
        }
        Ok(tasks)
    }

    async fn control(&self, task: &LeaseName) -> StoreResult<ControlRead> {
        let op = Op::new("control", Some(task));
        let rows = self
            .query(op, &self.inner.sql.control, &[&task.as_str()])
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt(format!("{op} returned no row")))?;
        Ok(ControlRead {
            now_ms: column::clock_ms(get(row, 0)?)?,
            control: control_of(row, 1)?,
        })
    }

    async fn set_control(
        &self,
        task: &LeaseName,
        expected: Option<u64>,
        value: &str,
    ) -> StoreResult<Option<u64>> {
        let op = Op::new("set_control", Some(task));
        let rows = match expected.map(to_i64) {
            None => {
                self.query(
                    op,
                    &self.inner.sql.create_control,
                    &[&task.as_str(), &value],
                )
                .await?
            }
            Some(Some(expected)) => {
                self.query(
                    op,
                    &self.inner.sql.update_control,
                    &[&task.as_str(), &expected, &value],
                )
                .await?
            }
            // No version beyond a bigint was ever written.
            Some(None) => return Ok(None),
        };
        rows.first()
            .map(|row| column::version(get(row, 0)?))
            .transpose()
    }

    async fn leases(&self, limit: usize) -> StoreResult<Vec<LeaseRecord>> {
        let op = Op::new("leases", None);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(op, &self.inner.sql.leases, &[&limit]).await?;
        rows.iter()
            .map(|row| {
                let name = column::name(get(row, 0)?)?;
                Ok(LeaseRecord {
                    state: self.lease_state(&name, get(row, 1)?, get(row, 2)?, get(row, 3)?)?,
                    name,
                })
            })
            .collect()
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
