//! [`Fence`]: the resource side of fencing tokens, a check in the caller's own transaction.

use leasehold::FencingToken;
use tokio_postgres::GenericClient;
use tokio_postgres::types::Type;

use crate::config::{DEFAULT_FENCE_TABLE, DEFAULT_SCHEMA, check_identifier, qualified};
use crate::error::Result;

/// Why [`Fence::check`] refused a write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A newer holder already wrote to `resource` with token `current`: the caller's lease was
    /// taken over (it was paused, partitioned, or its lease expired), so its write must not
    /// happen. Roll back the transaction.
    #[error("stale fencing token {token} for resource {resource:?}: token {current} already wrote")]
    Stale {
        /// The resource the write was for.
        resource: String,
        /// The token the caller presented.
        token: FencingToken,
        /// The highest token that has written to the resource.
        current: FencingToken,
    },
    /// The token is above `i64::MAX` and cannot be stored in a `bigint`.
    #[error("fencing token {0} does not fit a bigint")]
    OutOfRange(FencingToken),
    /// The check itself failed (connection lost, no fence table, serialization failure under
    /// REPEATABLE READ/SERIALIZABLE, ...). Treat it like any failed statement: roll back.
    #[error("fence check failed: {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

/// Makes writes to a resource conditional on a [`FencingToken`]: a table `fences(resource text
/// PRIMARY KEY, max_token bigint NOT NULL)` remembers the highest token that wrote to each
/// resource, and [`check`](Self::check) — run inside the same transaction as the write —
/// rejects a token below it.
///
/// A token *equal* to the highest one passes, so one holder may write many times during one
/// tenure; a lower one (an older tenure) fails with [`FenceError::Stale`]. The check takes the
/// resource's fence row lock until the transaction ends, so a concurrent writer with another
/// token waits and then sees the committed value: two tenures never both write.
#[derive(Debug, Clone)]
pub struct Fence {
    schema: String,
    table: String,
    check_sql: String,
    current_sql: String,
}

impl Default for Fence {
    /// The table `leasehold.fences`.
    fn default() -> Self {
        // The defaults are plain identifiers: nothing to check.
        Self::checked(DEFAULT_SCHEMA, DEFAULT_FENCE_TABLE)
    }
}

impl Fence {
    /// A fence on the table `schema.table`. Both must be plain identifiers (ASCII letters,
    /// digits, underscores, not starting with a digit, at most 63 bytes), otherwise
    /// [`PgSetupError::InvalidIdentifier`](crate::PgSetupError::InvalidIdentifier).
    pub fn new(schema: &str, table: &str) -> Result<Self> {
        check_identifier("schema", schema)?;
        check_identifier("fence_table", table)?;
        Ok(Self::checked(schema, table))
    }

    /// A fence on identifiers already checked.
    fn checked(schema: &str, table: &str) -> Self {
        let fences = qualified(schema, table);
        Self {
            schema: schema.to_owned(),
            table: table.to_owned(),
            check_sql: format!(
                "INSERT INTO {fences} AS f (resource, max_token) VALUES ($1, $2)
 ON CONFLICT (resource) DO UPDATE SET max_token = EXCLUDED.max_token
 WHERE f.max_token <= EXCLUDED.max_token
 RETURNING f.max_token"
            ),
            current_sql: format!("SELECT max_token FROM {fences} WHERE resource = $1"),
        }
    }

    /// The schema of the fence table.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The fence table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The statement [`check`](Self::check) runs (`$1` resource text, `$2` token bigint; a row
    /// when the write may go ahead, none when a higher token has written), for callers on
    /// another PostgreSQL driver.
    pub fn check_sql(&self) -> &str {
        &self.check_sql
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement of the fence table (for running it by hand).
    pub fn create_table_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n  resource text PRIMARY KEY,\n  max_token bigint NOT NULL\n);",
            qualified(&self.schema, &self.table)
        )
    }

    /// Creates the schema (if missing) and the fence table, idempotently, in a transaction of
    /// its own under an advisory lock (safe when many instances start at once). Creates nothing,
    /// and so needs no CREATE privilege, when the table exists.
    pub async fn migrate(
        &self,
        client: &mut tokio_postgres::Client,
    ) -> std::result::Result<(), tokio_postgres::Error> {
        crate::store::migrate(
            client,
            &self.schema,
            &[&self.table],
            &self.create_table_sql(),
        )
        .await
    }

    /// Records that `token` writes to `resource`, or fails with [`FenceError::Stale`] if a
    /// higher token already did. Run it inside the transaction that does the write
    /// (`client` is a [`tokio_postgres::Transaction`], or a deadpool one via `&*tx`), before
    /// or after the write, and roll back on error. One round trip when the write may go ahead.
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     pool: leasehold_postgres::deadpool_postgres::Pool,
    /// #     token: leasehold::FencingToken,
    /// # ) -> Result<(), Box<dyn std::error::Error>> {
    /// let fence = leasehold_postgres::Fence::default();
    /// let mut client = pool.get().await?;
    /// let tx = client.transaction().await?;
    /// fence.check(&*tx, "invoice:42", token).await?; // Stale: roll back (drop tx)
    /// tx.execute("UPDATE invoices SET sent = true WHERE id = 42", &[]).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn check<C>(
        &self,
        client: &C,
        resource: &str,
        token: FencingToken,
    ) -> std::result::Result<(), FenceError>
    where
        C: GenericClient + Sync,
    {
        let t = i64::try_from(token.get()).map_err(|_| FenceError::OutOfRange(token))?;
        let accepted = client
            .query_typed_opt(
                &self.check_sql,
                &[(&resource, Type::TEXT), (&t, Type::INT8)],
            )
            .await?;
        if accepted.is_some() {
            return Ok(());
        }
        // Rejected: the conflicting row is locked by us or committed, so a fresh read sees the
        // value that beat us (under READ COMMITTED; a stricter isolation level fails above).
        let current: i64 = client
            .query_typed_opt(&self.current_sql, &[(&resource, Type::TEXT)])
            .await?
            .map_or(t, |row| row.get(0));
        Err(FenceError::Stale {
            resource: resource.to_owned(),
            token,
            current: FencingToken(current.max(0) as u64),
        })
    }
}
