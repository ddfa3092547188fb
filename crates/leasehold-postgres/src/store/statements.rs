//! [`Statements`]: the SQL the store runs.

use crate::config::{PgConfig, qualified};

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
    /// Forget a task: `$1` task, `$2` whether to delete its history too. One row `(live bigint,
    /// had_task bool, task_gone bool, instances_gone bigint)`: `live` instances seen (nothing
    /// deleted when above 0); else the task row (when its version is the one read), its
    /// instances (skipping rows a registration holds) and the history when asked.
    pub forget: String,
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
    pub(super) fn new(config: &PgConfig) -> Self {
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
            // A registration committed before the statement's snapshot is seen live. One that
            // commits later rewrites the task row, so the task row is deleted only in the
            // version read (`xmin`, re-checked when the row is locked): a registration that
            // wrote it first keeps the task and everything with it. One that writes it after
            // finds it deleted and inserts it afresh; an instance row it holds is skipped, not
            // waited for (it would wait for the task row: a deadlock).
            forget: format!(
                "WITH live AS (
  SELECT count(*) AS n FROM {instances}
   WHERE task = $1::text AND expires_at > clock_timestamp()
), seen AS (
  SELECT xmin::text AS version FROM {tasks} WHERE task = $1::text
), gone_task AS (
  DELETE FROM {tasks} WHERE task = $1::text AND xmin::text = (SELECT version FROM seen)
     AND (SELECT n FROM live) = 0
  RETURNING 1
), clear AS (
  SELECT (SELECT n FROM live) = 0
     AND (NOT EXISTS (SELECT 1 FROM seen) OR EXISTS (SELECT 1 FROM gone_task)) AS ok
), gone_instances AS (
  DELETE FROM {instances} WHERE (task, instance) IN (
    SELECT task, instance FROM {instances} WHERE task = $1::text AND (SELECT ok FROM clear)
       FOR UPDATE SKIP LOCKED)
  RETURNING 1
), gone_history AS (
  DELETE FROM {history} WHERE task = $1::text AND $2::boolean AND (SELECT ok FROM clear)
)
SELECT (SELECT n FROM live), EXISTS (SELECT 1 FROM seen), EXISTS (SELECT 1 FROM gone_task),
       (SELECT count(*) FROM gone_instances)"
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
