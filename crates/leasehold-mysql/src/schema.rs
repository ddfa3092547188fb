//! The tables, the SQL of every operation, and the migration that checks and creates the tables.

use leasehold::skew;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

/// The schema version this build writes and reads: 1 the leases, slots, history and membership,
/// 2 adds the fleet catalog (`{prefix}tasks`, `{prefix}task_instances`).
///
/// `{prefix}schema` keeps two numbers. Row 2 is the version the tables are at: the highest
/// that migrated them. Row 1 is the oldest version a build may know and still use them: a
/// build refuses tables whose row 1 is above its `SCHEMA_VERSION`. A version that only adds
/// (tables, nullable columns) raises row 2 alone, so the builds before it keep working beside
/// it; one that changes or removes what an older build relies on raises row 1 as well (expand,
/// then contract). Tables of version 1 have row 1 only.
///
/// Row 3 is the oldest *release* that may still write to the tables, as
/// [`Version::number`](leasehold::skew::Version::number) (see [`leasehold::skew`]): a release
/// below it refuses the tables before writing anything. Raised, never lowered.
pub const SCHEMA_VERSION: i64 = 2;

/// The oldest schema version whose builds can use the tables this build creates: version 2
/// only added tables, which version 1 never reads.
const OLDEST_USER: i64 = 1;

/// The store's clock: the server's time when the function runs, in microseconds, in UTC (every
/// connection sets `time_zone = '+00:00'`). `SYSDATE(6)`, not `NOW(6)`: `NOW()` is the
/// statement's start, fixed before any lock wait and movable by `SET timestamp`; `SYSDATE()` is
/// read when evaluated.
const NOW: &str = "SYSDATE(6)";

/// The store's clock in microseconds since the Unix epoch, by date arithmetic on the UTC time
/// (no time zone conversion anywhere).
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', SYSDATE(6))";

/// What each table must hold: its suffix, `(column, information_schema DATA_TYPE)` pairs and
/// its primary key, in order.
pub(crate) struct Shape {
    pub(crate) suffix: &'static str,
    pub(crate) what: &'static str,
    pub(crate) columns: &'static [(&'static str, &'static str)],
    pub(crate) key: &'static [&'static str],
}

pub(crate) const SHAPES: [Shape; 7] = [
    Shape {
        suffix: "leases",
        what: "lease",
        columns: &[
            ("name", "varbinary"),
            ("holder", "varbinary"),
            ("token", "bigint"),
            ("expires_at", "datetime"),
            ("released_at", "datetime"),
        ],
        key: &["name"],
    },
    Shape {
        suffix: "slots",
        what: "slot",
        columns: &[("task", "varbinary"), ("last_slot", "bigint")],
        key: &["task"],
    },
    Shape {
        suffix: "history",
        what: "run history",
        columns: &[
            ("task", "varbinary"),
            ("entry_key", "bigint"),
            ("entry", "mediumtext"),
        ],
        key: &["task", "entry_key"],
    },
    Shape {
        suffix: "members",
        what: "membership",
        columns: &[
            ("group_name", "varbinary"),
            ("member", "varbinary"),
            ("expires_at", "datetime"),
        ],
        key: &["group_name", "member"],
    },
    Shape {
        suffix: "tasks",
        what: "catalog task",
        columns: &[
            ("task", "varbinary"),
            ("definition", "mediumtext"),
            ("seen_until", "datetime"),
            ("control_version", "bigint"),
            ("control", "mediumtext"),
        ],
        key: &["task"],
    },
    Shape {
        suffix: "task_instances",
        what: "catalog instance",
        columns: &[
            ("task", "varbinary"),
            ("instance", "varbinary"),
            ("about", "mediumtext"),
            ("expires_at", "datetime"),
        ],
        key: &["task", "instance"],
    },
    Shape {
        suffix: "schema",
        what: "schema version",
        columns: &[("id", "tinyint"), ("version", "int")],
        key: &["id"],
    },
];

/// The SQL this store runs, for review and for tests. `?` placeholders, bound in the order each
/// field's doc gives. Every timing decision reads `SYSDATE(6)` on the server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Statements {
    /// Acquire: name, holder, then the ttl in microseconds five times. One `INSERT … ON
    /// DUPLICATE KEY UPDATE`. A taken lease's token comes back as the statement's
    /// `LAST_INSERT_ID`; `0` means it is busy. The token is the old one + 1, or the server's
    /// clock in ms × 1000 + 1 if that is higher (always for a new name), so a server that lost
    /// recent writes (a failover to a lagging replica) still hands out tokens above the lost
    /// ones. Each assignment repeats the whole condition, which the assignments
    /// before it cannot change, so the statement means the same whether the server applies the
    /// assignments left to right (MySQL) or at once (MariaDB's `SIMULTANEOUS_ASSIGNMENT`).
    pub acquire: String,
    /// Renew: ttl in microseconds, name, holder, token. One row matched when renewed (the
    /// connection sets `CLIENT_FOUND_ROWS`, so a renewal that happens to write the same expiry
    /// still counts).
    pub renew: String,
    /// Renew many: the batch as JSON `[["name", token], ...]`, ttl in microseconds, holder. One
    /// `UPDATE … JOIN JSON_TABLE(…)`; rows matched = leases renewed.
    pub renew_many: String,
    /// Which of a batch the holder still holds: the batch as JSON, holder. `(name, token)` per
    /// lease. Read only when `renew_many` matched fewer rows than leases were asked for.
    pub held_of_many: String,
    /// Release: name, holder, token. One row matched when released; sets `released_at`, which
    /// the release poller reads.
    pub release: String,
    /// Purge: retention in microseconds. Deletes the leases free (released or expired) for at
    /// least that long.
    pub purge: String,
    /// Inspect: name. `(holder, token, remaining microseconds)`, no row for a name never
    /// acquired.
    pub inspect: String,
    /// Claim a slot: task, slot. `LAST_INSERT_ID` 0 when claimed, the highest claimed slot + 1
    /// when not.
    pub claim_slot: String,
    /// The server's clock in milliseconds since the Unix epoch.
    pub now_millis: String,
    /// The highest claimed slot: task.
    pub last_slot: String,
    /// Record a history entry: task, key, entry.
    pub record_history: String,
    /// Keep a task's newest history entries: task, task, how many to keep − 1.
    pub trim_history: String,
    /// The newest history entries: task, limit.
    pub history: String,
    /// Refresh a membership: group, member, ttl in microseconds.
    pub join: String,
    /// A group's entries: group. `(member, live 0/1)`, sorted.
    pub members: String,
    /// Delete a group's expired entries: group.
    pub drop_expired_members: String,
    /// Leave a group: group, member.
    pub leave: String,
    /// The releases after an instant: microseconds since the epoch. `(name, released at in
    /// microseconds)` per free lease released since, then one row `(NULL, server now)`.
    pub releases_since: String,
    /// Register, first statement of its transaction: task, definition, ttl in microseconds.
    /// Upserts the task's definition (the last writer's is kept) and raises `seen_until`, the
    /// latest heartbeat expiry of any of its instances, to now + ttl. Locks the task's row, so
    /// registrations of one task take turns.
    pub register_task: String,
    /// Register, second: instance, about, ttl in microseconds, task. Upserts the heartbeat; its
    /// expiry is now + ttl but never past the `seen_until` the first statement wrote, so a task
    /// whose `seen_until` is forgotten has no instance still seen.
    pub heartbeat: String,
    /// Register, third: task, forget-after in microseconds. `(instance)` per instance of the task
    /// whose heartbeat expired longer ago than that, locked, skipping rows another transaction
    /// holds (a heartbeat in flight is not forgotten, and the registration never waits there).
    /// Each is then deleted with [`unregister`](Self::unregister).
    pub forgotten_instances: String,
    /// Register, last: task. `(control_version, control)`, the row the transaction holds.
    pub task_control: String,
    /// Unregister: task, instance.
    pub unregister: String,
    /// Forget, first statement of its transaction: task. `(1)` if the task has a row, which it
    /// locks (as a registration's first statement does), so registrations wait for the
    /// transaction and the next statements see every one that committed before it.
    pub lock_task: String,
    /// Forget, second: task. `(count)` of its live instances.
    pub live_instances: String,
    /// Forget's deletes, each of a task: its instances, its row, its history.
    pub delete_instances: String,
    /// See [`delete_instances`](Self::delete_instances).
    pub delete_task: String,
    /// See [`delete_instances`](Self::delete_instances).
    pub delete_history: String,
    /// The catalog, first statement of its transaction: forget-after in microseconds. Deletes
    /// the tasks without a control record none of whose instances was seen within it (their
    /// `seen_until` is that old): decided on the task's row alone, read as it is once locked, so
    /// a registration that committed meanwhile keeps its task.
    pub forget_tasks: String,
    /// The catalog, second: forget-after in microseconds. Deletes every instance whose heartbeat
    /// expired longer ago than that.
    pub forget_instances: String,
    /// The catalog, last: forget-after in microseconds. `(task, definition, control_version,
    /// control, instance, about, remaining microseconds)` per instance seen within it (the
    /// instance columns NULL for a task with none), for the tasks with a control record or
    /// such an instance, in no order (the store sorts them: an `ORDER BY` over both tables
    /// would need an on-disk temporary table for their text columns). One reading of the clock
    /// for all rows.
    pub tasks: String,
    /// A task's control record with the server's clock: task. One row `(now ms,
    /// control_version, control)`, the last two NULL when there is none.
    pub control: String,
    /// Write a task's first control record: task, value. Version 1; `LAST_INSERT_ID` 1 when
    /// written, 0 when the task had a control record already.
    pub create_control: String,
    /// Replace a task's control record: value, task, expected version. One row matched when
    /// written (the version is then the expected one + 1).
    pub update_control: String,
    /// Every lease record, held or free: limit. `(name, holder, token, remaining
    /// microseconds)`, by name (bytes).
    pub leases: String,
    /// The migration's `CREATE TABLE IF NOT EXISTS`, one statement per table.
    pub create_tables: Vec<String>,
}

impl Statements {
    pub(crate) fn new(prefix: &str) -> Self {
        let t = |suffix: &str| format!("`{prefix}{suffix}`");
        let (leases, slots, history, members, schema) = (
            t("leases"),
            t("slots"),
            t("history"),
            t("members"),
            t("schema"),
        );
        let (tasks, instances) = (t("tasks"), t("task_instances"));
        // The lease is free, expired, or the caller's own: it is taken. VALUES(expires_at) is
        // this statement's SYSDATE(6) + ttl, read once, so `- ttl` is the statement's now.
        let take = "(holder IS NULL OR holder = VALUES(holder) \
                    OR expires_at <= VALUES(expires_at) - INTERVAL ? MICROSECOND)";
        let json_table = "JSON_TABLE(?, '$[*]' COLUMNS (name VARBINARY(128) PATH '$[0]', \
                          token BIGINT PATH '$[1]')) AS r";
        Self {
            acquire: format!(
                "INSERT INTO {leases} (name, holder, token, expires_at, released_at)
VALUES (?, ?, LAST_INSERT_ID(({NOW_US} DIV 1000) * 1000 + 1),
        {NOW} + INTERVAL ? MICROSECOND, NULL)
ON DUPLICATE KEY UPDATE
  holder = IF({take}, VALUES(holder), holder),
  token = IF({take}, LAST_INSERT_ID(GREATEST(token + 1, VALUES(token))), token + LAST_INSERT_ID(0)),
  expires_at = IF({take}, VALUES(expires_at), expires_at),
  released_at = IF({take}, NULL, released_at)"
            ),
            renew: format!(
                "UPDATE {leases} SET expires_at = {NOW} + INTERVAL ? MICROSECOND
 WHERE name = ? AND holder = ? AND token = ? AND expires_at > {NOW}"
            ),
            renew_many: format!(
                "UPDATE {leases} l JOIN {json_table} ON l.name = r.name AND l.token = r.token
   SET l.expires_at = {NOW} + INTERVAL ? MICROSECOND
 WHERE l.holder = ? AND l.expires_at > {NOW}"
            ),
            held_of_many: format!(
                "SELECT l.name, l.token FROM {leases} l
  JOIN {json_table} ON l.name = r.name AND l.token = r.token
 WHERE l.holder = ? AND l.expires_at > {NOW}"
            ),
            // A released lease's expiry is its release time, so purge needs one comparison.
            release: format!(
                "UPDATE {leases} SET holder = NULL, expires_at = {NOW}, released_at = {NOW}
 WHERE name = ? AND holder = ? AND token = ? AND expires_at > {NOW}"
            ),
            purge: format!(
                "DELETE FROM {leases} WHERE expires_at <= {NOW} - INTERVAL ? MICROSECOND"
            ),
            inspect: format!(
                "SELECT holder, token, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)
  FROM {leases} WHERE name = ?"
            ),
            claim_slot: format!(
                "INSERT INTO {slots} (task, last_slot) VALUES (?, ?)
ON DUPLICATE KEY UPDATE last_slot = IF(last_slot < VALUES(last_slot), VALUES(last_slot),
                                       LAST_INSERT_ID(last_slot + 1) - 1)"
            ),
            now_millis: format!("SELECT {NOW_US} DIV 1000"),
            last_slot: format!("SELECT last_slot FROM {slots} WHERE task = ?"),
            record_history: format!(
                "INSERT INTO {history} (task, entry_key, entry) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE entry = VALUES(entry)"
            ),
            // The derived table is materialized (it has a LIMIT), so the DELETE may read the
            // table it deletes from. Fewer entries than `keep`: the bound is NULL, nothing goes.
            trim_history: format!(
                "DELETE FROM {history} WHERE task = ? AND entry_key < (
  SELECT k FROM (SELECT entry_key AS k FROM {history} WHERE task = ?
                 ORDER BY entry_key DESC LIMIT 1 OFFSET ?) AS kth)"
            ),
            history: format!(
                "SELECT entry FROM {history} WHERE task = ? ORDER BY entry_key DESC LIMIT ?"
            ),
            join: format!(
                "INSERT INTO {members} (group_name, member, expires_at)
VALUES (?, ?, {NOW} + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)"
            ),
            members: format!(
                "SELECT member, expires_at > {NOW} FROM {members} WHERE group_name = ? ORDER BY member"
            ),
            drop_expired_members: format!(
                "DELETE FROM {members} WHERE group_name = ? AND expires_at <= {NOW}"
            ),
            leave: format!("DELETE FROM {members} WHERE group_name = ? AND member = ?"),
            releases_since: format!(
                "SELECT name, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', released_at) FROM {leases}
 WHERE released_at > CAST('1970-01-01' AS DATETIME(6)) + INTERVAL ? MICROSECOND
UNION ALL SELECT NULL, {NOW_US}"
            ),
            register_task: format!(
                "INSERT INTO {tasks} (task, definition, seen_until)
VALUES (?, ?, {NOW} + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE definition = VALUES(definition),
  seen_until = GREATEST(COALESCE(seen_until, VALUES(seen_until)), VALUES(seen_until))"
            ),
            heartbeat: format!(
                "INSERT INTO {instances} (task, instance, about, expires_at)
SELECT task, ?, ?, LEAST({NOW} + INTERVAL ? MICROSECOND, seen_until) FROM {tasks} WHERE task = ?
ON DUPLICATE KEY UPDATE about = VALUES(about), expires_at = VALUES(expires_at)"
            ),
            forgotten_instances: format!(
                "SELECT instance FROM {instances}
 WHERE task = ? AND expires_at <= {NOW} - INTERVAL ? MICROSECOND
   FOR UPDATE SKIP LOCKED"
            ),
            task_control: format!("SELECT control_version, control FROM {tasks} WHERE task = ?"),
            unregister: format!("DELETE FROM {instances} WHERE task = ? AND instance = ?"),
            lock_task: format!("SELECT 1 FROM {tasks} WHERE task = ? FOR UPDATE"),
            live_instances: format!(
                "SELECT count(*) FROM {instances} WHERE task = ? AND expires_at > {NOW}"
            ),
            delete_instances: format!("DELETE FROM {instances} WHERE task = ?"),
            delete_task: format!("DELETE FROM {tasks} WHERE task = ?"),
            delete_history: format!("DELETE FROM {history} WHERE task = ?"),
            forget_tasks: format!(
                "DELETE FROM {tasks} WHERE control_version IS NULL
   AND (seen_until IS NULL OR seen_until <= {NOW} - INTERVAL ? MICROSECOND)"
            ),
            forget_instances: format!(
                "DELETE FROM {instances} WHERE expires_at <= {NOW} - INTERVAL ? MICROSECOND"
            ),
            // The derived table is materialized (it has a LIMIT): one reading of the clock for
            // the filter and every remaining time.
            tasks: format!(
                "SELECT t.task, t.definition, t.control_version, t.control, i.instance, i.about,
       TIMESTAMPDIFF(MICROSECOND, n.at, i.expires_at)
  FROM (SELECT {NOW} AS at LIMIT 1) AS n
  CROSS JOIN {tasks} t
  LEFT JOIN {instances} i
    ON i.task = t.task AND i.expires_at > n.at - INTERVAL ? MICROSECOND
 WHERE t.control_version IS NOT NULL OR i.task IS NOT NULL"
            ),
            control: format!(
                "SELECT {NOW_US} DIV 1000, t.control_version, t.control
  FROM (SELECT 1) AS one LEFT JOIN {tasks} t ON t.task = ?"
            ),
            // `control` is assigned before `control_version`, the only column the condition
            // reads, so the statement means the same under left-to-right and simultaneous
            // assignment.
            create_control: format!(
                "INSERT INTO {tasks} (task, control_version, control) VALUES (?, LAST_INSERT_ID(1), ?)
ON DUPLICATE KEY UPDATE
  control = IF(control_version IS NULL, VALUES(control), control),
  control_version = IF(control_version IS NULL, VALUES(control_version),
                       control_version + LAST_INSERT_ID(0))"
            ),
            update_control: format!(
                "UPDATE {tasks} SET control = ?, control_version = control_version + 1
 WHERE task = ? AND control_version = ?"
            ),
            leases: format!(
                "SELECT name, holder, token, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)
  FROM {leases} ORDER BY name LIMIT ?"
            ),
            create_tables: vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {leases} (
  name VARBINARY(128) NOT NULL,
  holder VARBINARY(255) NULL,
  token BIGINT NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  released_at DATETIME(6) NULL,
  PRIMARY KEY (name),
  KEY released_at (released_at)
) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {slots} (
  task VARBINARY(128) NOT NULL,
  last_slot BIGINT NOT NULL,
  PRIMARY KEY (task)
) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {history} (
  task VARBINARY(128) NOT NULL,
  entry_key BIGINT NOT NULL,
  entry MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  PRIMARY KEY (task, entry_key)
) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {members} (
  group_name VARBINARY(128) NOT NULL,
  member VARBINARY(255) NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  PRIMARY KEY (group_name, member)
) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {tasks} (
  task VARBINARY(128) NOT NULL,
  definition MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  seen_until DATETIME(6) NULL,
  control_version BIGINT NULL,
  control MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  PRIMARY KEY (task)
) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {instances} (
  task VARBINARY(128) NOT NULL,
  instance VARBINARY(255) NOT NULL,
  about MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  PRIMARY KEY (task, instance)
) ENGINE=InnoDB"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {schema} (
  id TINYINT NOT NULL,
  version INT NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB"
                ),
            ],
        }
    }
}

/// Why the migration stopped.
pub(crate) enum MigrateError {
    /// The server refused or failed a statement.
    Sql(mysql_async::Error),
    /// The tables cannot be used as they are; nothing was written.
    Shape(String),
    /// The tables need a newer release; nothing was written.
    TooOld(leasehold::skew::TooOld),
}

impl From<mysql_async::Error> for MigrateError {
    fn from(e: mysql_async::Error) -> Self {
        Self::Sql(e)
    }
}

/// Checks the tables that exist (columns, types, primary key, engine) and the schema version
/// (see [`SCHEMA_VERSION`]), then, with `create` on, creates the missing ones and records the
/// version. When every table exists at this version, or at a later one this build can use,
/// nothing is written, so a user with only row privileges can run it.
/// Every check runs before the first write: a table of another shape stops it with nothing
/// written.
pub(crate) async fn migrate(
    conn: &mut Conn,
    prefix: &str,
    sql: &Statements,
    create: bool,
) -> Result<(), MigrateError> {
    let names: Vec<String> = SHAPES
        .iter()
        .map(|s| format!("{prefix}{}", s.suffix))
        .collect();
    let in_list = vec!["?"; names.len()].join(", ");
    let engines = texts(
        conn,
        format!(
            "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({in_list})"
        ),
        &names,
    )
    .await?;
    let columns = texts(
        conn,
        format!(
            "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({in_list})"
        ),
        &names,
    )
    .await?;
    let keys = texts(
        conn,
        format!(
            "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE
  WHERE TABLE_SCHEMA = DATABASE() AND CONSTRAINT_NAME = 'PRIMARY' AND TABLE_NAME IN ({in_list})
  ORDER BY TABLE_NAME, ORDINAL_POSITION"
        ),
        &names,
    )
    .await?;
    let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    let mut missing = Vec::new();
    for (shape, name) in SHAPES.iter().zip(&names) {
        let Some(engine) = engines.iter().find(|r| same(&r[0], name)).map(|r| &r[1]) else {
            missing.push(name.as_str());
            continue;
        };
        let not_ours = |why: String| {
            MigrateError::Shape(format!(
                "table `{name}` is not a leasehold {} table ({why}); drop or rename it, or set another table_prefix",
                shape.what
            ))
        };
        if !same(engine, "InnoDB") {
            let engine = if engine.is_empty() {
                "none: a view"
            } else {
                engine
            };
            return Err(not_ours(format!("engine {engine}, not InnoDB")));
        }
        for (column, data_type) in shape.columns {
            let found = columns
                .iter()
                .find(|r| same(&r[0], name) && same(&r[1], column))
                .map(|r| &r[2]);
            match found {
                None => return Err(not_ours(format!("no column {column}"))),
                Some(ty) if !same(ty, data_type) => {
                    return Err(not_ours(format!(
                        "column {column} is {ty}, not {data_type}"
                    )));
                }
                Some(_) => {}
            }
        }
        let key: Vec<&str> = keys
            .iter()
            .filter(|r| same(&r[0], name))
            .map(|r| r[1].as_str())
            .collect();
        let key_matches =
            key.len() == shape.key.len() && key.iter().zip(shape.key).all(|(a, b)| same(a, b));
        if !key_matches {
            return Err(not_ours(format!(
                "primary key ({}), not ({})",
                key.join(", "),
                shape.key.join(", ")
            )));
        }
    }
    let schema_table = &names[SHAPES.len() - 1];
    // Row 1: the oldest version that can use the tables; row 2: the version they are at
    // (tables of version 1 have row 1 only, which then says both); row 3: the oldest release
    // that may write.
    let (oldest_user, at, min_writer) = if missing.contains(&schema_table.as_str()) {
        (None, None, None)
    } else {
        let rows: Vec<Row> = conn
            .exec(
                format!("SELECT id, version FROM `{schema_table}` WHERE id IN (1, 2, 3)"),
                (),
            )
            .await?;
        let row_of = |id: i64| {
            rows.iter()
                .find(|r| r.get_opt::<i64, usize>(0).and_then(Result::ok) == Some(id))
                .and_then(|r| r.get_opt::<i64, usize>(1))
                .and_then(Result::ok)
        };
        let oldest_user = row_of(1);
        (oldest_user, row_of(2).or(oldest_user), row_of(3))
    };
    let min_writer = min_writer.map(|n| skew::Version::from_number(n.unsigned_abs()));
    if let Some(min_writer) = min_writer {
        skew::check_writer(&min_writer.to_string()).map_err(MigrateError::TooOld)?;
    }
    let ours = skew::Version::parse(skew::OLDEST_WRITER).map_or(0, skew::Version::number);
    let writer_recorded = min_writer.is_some_and(|v| v.number() >= ours);
    if let Some(oldest) = oldest_user
        && oldest > SCHEMA_VERSION
    {
        let at = at.unwrap_or(oldest).max(oldest);
        return Err(MigrateError::Shape(format!(
            "the tables are at schema version {at} and need a build of version {oldest} or later, this build knows up to {SCHEMA_VERSION}; upgrade leasehold"
        )));
    }
    let current = oldest_user.is_some() && at.is_some_and(|v| v >= SCHEMA_VERSION);
    if missing.is_empty() && current && (writer_recorded || !create) {
        return Ok(());
    }
    if !create {
        let problem = match (oldest_user, at) {
            _ if !missing.is_empty() => format!("missing {}", missing.join(", ")),
            (Some(_), Some(v)) => {
                format!("`{schema_table}` records schema version {v}, not {SCHEMA_VERSION}")
            }
            _ => format!("`{schema_table}` records no schema version"),
        };
        return Err(MigrateError::Shape(format!(
            "{problem}, and migrate is off; create the tables (the SQL is in the README) or turn migrate on"
        )));
    }
    // Idempotent: instances starting at once each run these; the server serializes DDL on a
    // table name, and GREATEST keeps a newer build's numbers.
    if !missing.is_empty() || !current {
        for create in &sql.create_tables {
            conn.query_drop(create.as_str()).await?;
        }
    }
    conn.exec_drop(
        format!(
            "INSERT INTO `{schema_table}` (id, version) VALUES (1, ?), (2, ?), (3, ?)
ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version))"
        ),
        (OLDEST_USER, SCHEMA_VERSION, ours),
    )
    .await?;
    Ok(())
}

/// The rows of a catalog query, each column as text (empty for NULL or unreadable).
async fn texts(
    conn: &mut Conn,
    sql: String,
    params: &[String],
) -> mysql_async::Result<Vec<Vec<String>>> {
    let rows: Vec<Row> = conn.exec(sql, params.to_vec()).await?;
    Ok(rows
        .iter()
        .map(|row| {
            (0..row.len())
                .map(|i| {
                    row.get_opt::<Option<String>, usize>(i)
                        .and_then(Result::ok)
                        .flatten()
                        .unwrap_or_default()
                })
                .collect()
        })
        .collect())
}

/// Whether this user may write the lease table: an UPDATE and an INSERT that match no row
/// (`name` is a NOT NULL primary key), so nothing is written; a read-only user or a server in
/// read-only mode refuses them.
pub(crate) async fn check_writable(conn: &mut Conn, prefix: &str) -> mysql_async::Result<()> {
    let leases = format!("`{prefix}leases`");
    conn.query_drop(format!(
        "UPDATE {leases} SET token = token WHERE name IS NULL"
    ))
    .await?;
    conn.query_drop(format!(
        "INSERT INTO {leases} (name, holder, token, expires_at)
SELECT name, holder, token, expires_at FROM {leases} WHERE name IS NULL"
    ))
    .await
}
