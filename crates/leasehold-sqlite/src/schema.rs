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

/// Release rows older than this are pruned.
pub(crate) const RELEASE_RETENTION_MS: i64 = 60_000;
/// Pruning runs in the release transaction whose log sequence number is a multiple of this.
pub(crate) const PRUNE_EVERY: i64 = 64;

pub(crate) const NOW: &str = concat!("SELECT ", now_ms!());

/// Converts wall-clock expiries of a version 2 file to the host clock: `?1` wall now, `?2` host
/// now.
pub(crate) const TO_HOST_CLOCK: &str = "UPDATE leases SET expires_at_ms = expires_at_ms - ?1 + ?2";

pub(crate) const BOOT_ID: &str = "SELECT value FROM meta WHERE key = 'boot_id'";

pub(crate) const SET_BOOT_ID: &str =
    "INSERT OR REPLACE INTO meta (key, value) VALUES ('boot_id', ?1)";

/// After a reboot the host clock starts again near zero: every lease and membership of the old
/// boot is over.
pub(crate) const EXPIRE_ALL: &str = "UPDATE leases SET expires_at_ms = 0; DELETE FROM members;";

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

/// Opens a connection with the settings every connection of the store uses.
pub(crate) fn open_connection(path: &Path, config: &SqliteConfig) -> rusqlite::Result<Connection> {
    // No SQLITE_OPEN_URI: the path is a file name, never a `file:` URI.
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(config.busy_timeout)?;
    conn.pragma_update(
        None,
        "synchronous",
        if config.durable { "FULL" } else { "NORMAL" },
    )?;
    Ok(conn)
}
