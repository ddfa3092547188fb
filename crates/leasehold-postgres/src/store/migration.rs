//! The migration: the tables created if missing, and the meta table's record of the releases
//! that use them checked and raised.

use deadpool_postgres::{Pool, PoolError, TimeoutType};
use leasehold::StoreError;
use leasehold::skew;
use tokio_postgres::error::SqlState;

use super::{Op, Statements, classify, pool_error};
use crate::config::PgConfig;
use crate::error::{Error, Result};

/// Runs the migration on a pooled connection: `Err(Connect)` if no connection could be made,
/// `Err(Migrate)` if the server refused it.
pub(super) async fn migrate_on(
    pool: &Pool,
    config: &PgConfig,
    url: &str,
    sql: &Statements,
) -> Result<()> {
    let connect_err = |source| Error::Connect {
        store: url.to_owned(),
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
            PoolError::Backend(e)
                if e.as_db_error().map(|db| db.code()) == Some(&SqlState::INVALID_CATALOG_NAME) =>
            {
                // The store creates its tables, never its database; with no dbname the
                // server uses the user's name.
                let database = config
                    .driver_config()
                    .ok()
                    .and_then(|(pg, _, _)| {
                        pg.get_dbname().or_else(|| pg.get_user()).map(str::to_owned)
                    })
                    .unwrap_or_default();
                Error::MissingDatabase {
                    store: url.to_owned(),
                    database,
                    source: classify(e, op, config.op_timeout),
                }
            }
            e => connect_err(pool_error(e, op, config.op_timeout)),
        })?;
    let migrate_err = |e| Error::Migrate {
        store: url.to_owned(),
        source: classify(e, Op::new("migration", None), config.op_timeout),
    };
    // Before anything is written: a newer release may not let this one write to the tables.
    let recorded = read_meta(&client, &sql.read_meta)
        .await
        .map_err(migrate_err)?;
    if let Some(min_writer) = recorded.min_writer.as_deref() {
        skew::check_writer(min_writer).map_err(|source| Error::TooOld {
            store: url.to_owned(),
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
