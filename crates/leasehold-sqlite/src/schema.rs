//! The tables, created idempotently on open, the SQL of each operation, and how a connection to
//! the file is opened.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use crate::config::SqliteConfig;

/// The store's clock in the statements: milliseconds since the Unix epoch, from SQLite itself
/// (stable within one statement).
macro_rules! now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// `PRAGMA user_version` of the schema below.
pub(crate) const SCHEMA_VERSION: i64 = 4;

/// Version 4. Every statement is idempotent, so opening an older file adds what it lacks:
/// version 1 lacked `history`; version 2 lacked `meta` and kept `expires_at_ms` on the wall clock
/// (the upgrade converts it, see [`TO_HOST_CLOCK`]); version 3 lacked `members` (spread groups). A lease row is kept after release and expiry
/// so its token counter survives.
///
/// `expires_at_ms` is on the host's boot-time clock (`CLOCK_BOOTTIME`, which a wall-clock step
/// does not move and which counts suspended time), passed in by the store: every process using
/// the file is on this host, so they share the clock. `meta.boot_id` names the boot it belongs
/// to; after a reboot every lease has expired.
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS leases (
    name          TEXT PRIMARY KEY NOT NULL,
    holder        TEXT NULL,
    token         INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS slots (
    task      TEXT PRIMARY KEY NOT NULL,
    last_slot INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS history (
    task  TEXT NOT NULL,
    key   INTEGER NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (task, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS members (
    group_name    TEXT NOT NULL,
    member        TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (group_name, member)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS releases (
    seq   INTEGER PRIMARY KEY AUTOINCREMENT,
    name  TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);
";

/// The catalog (issue 25), added within version 4: release 0.1.0 refuses a file whose
/// `user_version` is above 4 and migrates only when it differs from 4, so it opens a file with
/// these tables as it is and never reads them. They are created whenever they are missing,
/// whatever the version.
///
/// `tasks` holds a task's definition (the last registration's) and its control record
/// (`control_version` counts its writes from 1; both NULL until the first). `task_instances`
/// holds each instance's registration; `expires_at_ms` is on the host's boot-time clock like
/// the leases', and `meta.catalog_boot_id` names the boot it belongs to (kept apart from
/// `boot_id`, which release 0.1.0 updates without knowing these tables).
pub(crate) const CATALOG_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
    task            TEXT PRIMARY KEY NOT NULL,
    definition      TEXT NULL,
    control_version INTEGER NULL,
    control         TEXT NULL
);
CREATE TABLE IF NOT EXISTS task_instances (
    task          TEXT NOT NULL,
    instance      TEXT NOT NULL,
    about         TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (task, instance)
) WITHOUT ROWID;
";

/// How many of the catalog's tables exist.
pub(crate) const CATALOG_TABLES: &str = "SELECT count(*) FROM sqlite_master \
     WHERE type = 'table' AND name IN ('tasks', 'task_instances')";

/// Release rows older than this are pruned.
pub(crate) const RELEASE_RETENTION_MS: i64 = 60_000;
/// Pruning runs in the release transaction whose log sequence number is a multiple of this.
pub(crate) const PRUNE_EVERY: i64 = 64;

pub(crate) const NOW: &str = concat!("SELECT ", now_ms!());

/// Converts wall-clock expiries of a version 2 file to the host clock: `?1` wall now, `?2` host
/// now.
pub(crate) const TO_HOST_CLOCK: &str = "UPDATE leases SET expires_at_ms = expires_at_ms - ?1 + ?2";

/// What `meta` says about the releases that use the file (see [`leasehold::skew`]): the schema
/// version of its tables (`user_version` stays 4 so release 0.1.0 keeps opening the file; this
/// counts on from it: 5 added the catalog and these rows) and the oldest release that may still
/// write to it.
pub(crate) const TABLES_VERSION: i64 = 5;

/// Whether `meta` exists: a new file, or one older than version 3, has none (and so no record).
pub(crate) const HAS_META: &str =
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'";

pub(crate) const META_VALUE: &str = "SELECT value FROM meta WHERE key = ?1";

pub(crate) const SET_META_VALUE: &str = "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)";

pub(crate) const BOOT_ID: &str = "SELECT value FROM meta WHERE key = 'boot_id'";

pub(crate) const SET_BOOT_ID: &str =
    "INSERT OR REPLACE INTO meta (key, value) VALUES ('boot_id', ?1)";

/// After a reboot the host clock starts again near zero: every lease and membership of the old
/// boot is over.
pub(crate) const EXPIRE_ALL: &str = "UPDATE leases SET expires_at_ms = 0; DELETE FROM members;";

pub(crate) const CATALOG_BOOT_ID: &str = "SELECT value FROM meta WHERE key = 'catalog_boot_id'";

pub(crate) const SET_CATALOG_BOOT_ID: &str =
    "INSERT OR REPLACE INTO meta (key, value) VALUES ('catalog_boot_id', ?1)";

/// After a reboot the instances of the old boot stopped at the latest at the reboot: expired at
/// (about) zero on the new boot's clock, forgotten `forget_after` into it.
pub(crate) const EXPIRE_INSTANCES: &str = "UPDATE task_instances SET expires_at_ms = 0";

/// `?2` (host now) and the lease row (all NULL when there is none).
pub(crate) const READ_FOR_ACQUIRE: &str = "SELECT n.now, l.holder, l.token, l.expires_at_ms \
     FROM (SELECT ?2 AS now) AS n LEFT JOIN leases AS l ON l.name = ?1";

/// The first token of a name this file has never seen: the store's clock in ms × 1000 + 1, so a
/// deleted and recreated file never hands out a token below one handed out before.
pub(crate) const SEED_TOKEN: &str = concat!("SELECT ", now_ms!(), " * 1000 + 1");

/// `?5`: host now.
pub(crate) const TAKE: &str = "INSERT INTO leases (name, holder, token, expires_at_ms) \
     VALUES (?1, ?2, ?3, ?5 + ?4) ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
     token = excluded.token, expires_at_ms = excluded.expires_at_ms";

/// `?5`: host now.
pub(crate) const RENEW: &str = "UPDATE leases SET expires_at_ms = ?5 + ?4 \
     WHERE name = ?1 AND holder = ?2 AND token = ?3 AND expires_at_ms > ?5";

/// `?4`: host now.
pub(crate) const RELEASE: &str = "UPDATE leases SET holder = NULL, expires_at_ms = ?4 \
     WHERE name = ?1 AND holder = ?2 AND token = ?3 AND expires_at_ms > ?4";

/// Leases free since before `?1 - ?2` (`?1`: now on the host's boot-time clock). A released
/// lease's expiry is its release time, so one comparison covers released and expired alike.
pub(crate) const PURGE: &str = "DELETE FROM leases WHERE expires_at_ms <= ?1 - ?2";

pub(crate) const LOG_RELEASE: &str = concat!(
    "INSERT INTO releases (name, at_ms) VALUES (?1, ",
    now_ms!(),
    ")"
);

pub(crate) const PRUNE_RELEASES: &str =
    concat!("DELETE FROM releases WHERE at_ms < ", now_ms!(), " - ?1");

/// `?2`: host now.
pub(crate) const INSPECT: &str =
    "SELECT holder, token, expires_at_ms, ?2 FROM leases WHERE name = ?1";

pub(crate) const CLAIM_SLOT: &str = "INSERT INTO slots (task, last_slot) VALUES (?1, ?2) \
     ON CONFLICT (task) DO UPDATE SET last_slot = excluded.last_slot \
     WHERE slots.last_slot < excluded.last_slot";

pub(crate) const LAST_SLOT: &str = "SELECT last_slot FROM slots WHERE task = ?1";

pub(crate) const LAST_RELEASE: &str = "SELECT COALESCE(MAX(seq), 0) FROM releases";

pub(crate) const RELEASES_AFTER: &str =
    "SELECT seq, name FROM releases WHERE seq > ?1 ORDER BY seq";

pub(crate) const RECORD_HISTORY: &str =
    "INSERT OR REPLACE INTO history (task, key, entry) VALUES (?1, ?2, ?3)";

/// Keeps the `?2` entries with the highest keys.
pub(crate) const TRIM_HISTORY: &str = "DELETE FROM history WHERE task = ?1 AND key < \
     COALESCE((SELECT key FROM history WHERE task = ?1 ORDER BY key DESC LIMIT 1 OFFSET ?2 - 1), 0)";

pub(crate) const HISTORY: &str =
    "SELECT entry FROM history WHERE task = ?1 ORDER BY key DESC LIMIT ?2";

/// `?3`: host now, `?4`: ttl ms.
pub(crate) const JOIN: &str = "INSERT INTO members (group_name, member, expires_at_ms) \
     VALUES (?1, ?2, ?3 + ?4) \
     ON CONFLICT (group_name, member) DO UPDATE SET expires_at_ms = excluded.expires_at_ms";

/// `?2`: host now.
pub(crate) const DROP_EXPIRED_MEMBERS: &str =
    "DELETE FROM members WHERE group_name = ?1 AND expires_at_ms <= ?2";

pub(crate) const MEMBERS: &str = "SELECT member FROM members WHERE group_name = ?1 ORDER BY member";

pub(crate) const LEAVE: &str = "DELETE FROM members WHERE group_name = ?1 AND member = ?2";

/// The definition of `?1`, the last writer's.
pub(crate) const PUT_DEFINITION: &str = "INSERT INTO tasks (task, definition) VALUES (?1, ?2) \
     ON CONFLICT (task) DO UPDATE SET definition = excluded.definition";

/// `?4`: host now, `?5`: ttl ms.
pub(crate) const HEARTBEAT: &str = "INSERT INTO task_instances \
     (task, instance, about, expires_at_ms) VALUES (?1, ?2, ?3, ?4 + ?5) \
     ON CONFLICT (task, instance) DO UPDATE SET about = excluded.about, \
     expires_at_ms = excluded.expires_at_ms";

/// `?1`'s instances expired more than `?3` ms before `?2` (host now).
pub(crate) const FORGET_TASK_INSTANCES: &str =
    "DELETE FROM task_instances WHERE task = ?1 AND expires_at_ms <= ?2 - ?3";

/// Every task's instances expired more than `?2` ms before `?1` (host now).
pub(crate) const FORGET_INSTANCES: &str =
    "DELETE FROM task_instances WHERE expires_at_ms <= ?1 - ?2";

/// Tasks with neither a control record nor an instance left (run after the instances are
/// forgotten).
pub(crate) const FORGET_TASKS: &str = "DELETE FROM tasks WHERE control_version IS NULL \
     AND NOT EXISTS (SELECT 1 FROM task_instances AS i WHERE i.task = tasks.task)";

/// `(control_version, control)` of `?1`, no row when the task is unknown.
pub(crate) const TASK_CONTROL: &str = "SELECT control_version, control FROM tasks WHERE task = ?1";

/// How many of `?1`'s instances are live at host time `?2`.
pub(crate) const LIVE_INSTANCES: &str =
    "SELECT count(*) FROM task_instances WHERE task = ?1 AND expires_at_ms > ?2";

/// `forget`'s deletes, each of `?1`.
pub(crate) const DELETE_INSTANCES: &str = "DELETE FROM task_instances WHERE task = ?1";
pub(crate) const DELETE_TASK: &str = "DELETE FROM tasks WHERE task = ?1";
pub(crate) const DELETE_HISTORY: &str = "DELETE FROM history WHERE task = ?1";

pub(crate) const UNREGISTER: &str = "DELETE FROM task_instances WHERE task = ?1 AND instance = ?2";

/// Every task and its instances, one row per instance (instance columns NULL for a task with
/// none): by task, then live before expired (`?1`: host now), then by instance. Run after the
/// forgetting statements, so every row left is listed.
pub(crate) const TASKS: &str = "SELECT t.task, t.definition, t.control_version, t.control, \
     i.instance, i.about, i.expires_at_ms \
     FROM tasks AS t LEFT JOIN task_instances AS i ON i.task = t.task \
     ORDER BY t.task, i.expires_at_ms <= ?1, i.instance";

/// The wall clock (ms) and `?1`'s control record (NULLs when it has none).
pub(crate) const CONTROL: &str = concat!(
    "SELECT ",
    now_ms!(),
    ", t.control_version, t.control FROM (SELECT 1) LEFT JOIN tasks AS t ON t.task = ?1"
);

/// Writes `?1`'s first control record `?2`, if it has none.
pub(crate) const CREATE_CONTROL: &str = "INSERT INTO tasks (task, control_version, control) \
     VALUES (?1, 1, ?2) ON CONFLICT (task) DO UPDATE SET control_version = 1, \
     control = excluded.control WHERE tasks.control_version IS NULL RETURNING control_version";

/// Replaces `?1`'s control record with `?3` if its version is `?2`.
pub(crate) const UPDATE_CONTROL: &str = "UPDATE tasks SET control_version = control_version + 1, \
     control = ?3 WHERE task = ?1 AND control_version = ?2 RETURNING control_version";

/// Up to `?1` lease records, by name.
pub(crate) const LEASES: &str =
    "SELECT name, holder, token, expires_at_ms FROM leases ORDER BY name LIMIT ?1";

/// How many of leasehold's columns the file's `leases` table has (none without the table).
pub(crate) const LEASES_COLUMNS: &str = "SELECT count(*) FROM pragma_table_info('leases') \
     WHERE name IN ('name', 'holder', 'token', 'expires_at_ms')";

/// [`LEASES_COLUMNS`] of a leasehold store.
pub(crate) const LEASES_COLUMN_COUNT: i64 = 4;

pub(crate) const TABLE_COUNT: &str = "SELECT count(*) FROM sqlite_master WHERE type = 'table'";

/// Opens a connection with the settings every connection of the store uses.
pub(crate) fn open_connection(path: &Path, config: &SqliteConfig) -> rusqlite::Result<Connection> {
    // No SQLITE_OPEN_URI: the path is a file name, never a `file:` URI. No SQLITE_OPEN_CREATE:
    // the store's path check creates the file when the caller may (`SqliteStore::open`), so a
    // file that must exist (`open_existing`) and has gone is an error, never a new store.
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(config.busy_timeout)?;
    conn.pragma_update(
        None,
        "synchronous",
        if config.durable { "FULL" } else { "NORMAL" },
    )?;
    Ok(conn)
}
