//! [`PgConfig`]: the settings of a [`PgStore`](crate::PgStore), and URL/TLS handling.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::SslMode;

use crate::conninfo::{check_url, describe, parse_reason, take_params};
use crate::error::{PgSetupError, Result};

/// Default schema of the lease, slot and fence tables.
pub const DEFAULT_SCHEMA: &str = "leasehold";
/// Default name of the lease table.
pub const DEFAULT_LEASE_TABLE: &str = "leases";
/// Default name of the slot table.
pub const DEFAULT_SLOT_TABLE: &str = "slots";
/// Default name of the run history table.
pub const DEFAULT_HISTORY_TABLE: &str = "history";
/// Default name of the spread-group membership table.
pub const DEFAULT_MEMBERS_TABLE: &str = "members";
/// Default name of the catalog's task table (definitions and control records).
pub const DEFAULT_TASKS_TABLE: &str = "tasks";
/// Default name of the catalog's instance table (each instance's registration of a task).
pub const DEFAULT_INSTANCES_TABLE: &str = "task_instances";
/// Default name of the table that records the schema version and the oldest release that may
/// still write to the tables (see [`leasehold::skew`]).
pub const DEFAULT_META_TABLE: &str = "meta";
/// Default name of the fence table (see [`Fence`](crate::Fence)).
pub const DEFAULT_FENCE_TABLE: &str = "fences";
/// Default time limit of one store operation.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Default `application_name` of the store's connections.
pub const DEFAULT_APPLICATION_NAME: &str = "leasehold";

/// Longest PostgreSQL identifier (NAMEDATALEN - 1).
const MAX_IDENT_LEN: usize = 63;

/// Settings of a PostgreSQL store. Build with [`PgConfig::new`], adjust the fields, then
/// [`connect`](PgConfig::connect).
#[derive(Clone)]
#[non_exhaustive]
pub struct PgConfig {
    /// Server URL, `postgres://[user[:password]@]host[:port]/dbname[?sslmode=...]`, or a
    /// `key=value` connection string. No default.
    pub url: String,
    /// Schema of the tables; created if missing (when [`migrate`](Self::migrate) is on).
    /// Default [`DEFAULT_SCHEMA`] (`leasehold`). A plain identifier: ASCII letters, digits and
    /// underscores, not starting with a digit, at most 63 bytes.
    pub schema: String,
    /// The lease table: `name text PRIMARY KEY, holder text, token bigint, expires_at
    /// timestamptz`. Default [`DEFAULT_LEASE_TABLE`] (`leases`). A plain identifier.
    pub lease_table: String,
    /// The slot table: `task text PRIMARY KEY, last_slot bigint`. Default
    /// [`DEFAULT_SLOT_TABLE`] (`slots`). A plain identifier.
    pub slot_table: String,
    /// The run history table: `task text, key bigint, entry text, PRIMARY KEY (task, key)`.
    /// Default [`DEFAULT_HISTORY_TABLE`] (`history`). A plain identifier.
    pub history_table: String,
    /// The spread-group membership table: `group_name text, member text, expires_at
    /// timestamptz, PRIMARY KEY (group_name, member)`. Default [`DEFAULT_MEMBERS_TABLE`]
    /// (`members`). A plain identifier.
    pub members_table: String,
    /// The catalog's task table: `task text PRIMARY KEY, definition text, registered_at
    /// timestamptz, control_version bigint, control text`. Default [`DEFAULT_TASKS_TABLE`]
    /// (`tasks`). A plain identifier.
    pub tasks_table: String,
    /// The catalog's instance table: `task text, instance text, about text, expires_at
    /// timestamptz, PRIMARY KEY (task, instance)`. Default [`DEFAULT_INSTANCES_TABLE`]
    /// (`task_instances`). A plain identifier.
    pub instances_table: String,
    /// What the tables record about the releases that use them: `key text PRIMARY KEY, value
    /// text NOT NULL`, rows `schema_version` and `min_writer` (see [`leasehold::skew`]).
    /// Default [`DEFAULT_META_TABLE`] (`meta`). A plain identifier.
    pub meta_table: String,
    /// The LISTEN/NOTIFY channel releases are announced on. Default `None`: `SCHEMA.LEASE_TABLE`
    /// (`leasehold.leases`), so stores on different tables do not wake each other. At most 63
    /// bytes.
    pub channel: Option<String>,
    /// Whether [`connect`](Self::connect) creates the schema and tables if they are missing
    /// (an idempotent migration, safe when many instances start at once). Default `true`; turn
    /// it off when the application's role may not run DDL and the tables were created in
    /// advance (the SQL is in the README).
    pub migrate: bool,
    /// Most connections in the pool (the release listener has one more of its own). Default 4.
    pub pool_size: usize,
    /// Time limit of each store operation, after which it fails with
    /// [`StoreError::Timeout`](leasehold::StoreError::Timeout). It is also set as the
    /// connections' `statement_timeout`, so the server gives up on the statement too. Default
    /// [`DEFAULT_OP_TIMEOUT`] (2 s).
    pub op_timeout: Duration,
    /// Time limit of establishing a connection (TCP, TLS, authentication), at start and on each
    /// reconnect. Default 5 s.
    pub connect_timeout: Duration,
    /// `application_name` of the store's connections, as shown in `pg_stat_activity` (the
    /// release listener's connection gets `-listen` appended). Default
    /// [`DEFAULT_APPLICATION_NAME`] (`leasehold`); an `application_name` in the URL wins.
    pub application_name: String,
    /// Whether to LISTEN for release notifications so waiters take over right after a graceful
    /// release. Without them waiters retry at the lease's expiry. Default `true`.
    pub notifications: bool,
    /// Longest pause between attempts to re-establish the notification connection. Default 5 s.
    pub max_reconnect_delay: Duration,
    /// How often the notification connection is checked with a query, so a silently dead
    /// connection is replaced. Default 15 s.
    pub keepalive: Duration,
    /// PEM root certificates to trust for TLS instead of the system's (for a private CA). An
    /// `sslrootcert=PATH` in the URL sets this from the file. Needs the `tls` feature. Default
    /// `None`: the system's root certificates.
    pub tls_ca_pem: Option<Vec<u8>>,
}

impl PgConfig {
    /// Defaults for the server at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: DEFAULT_SCHEMA.to_owned(),
            lease_table: DEFAULT_LEASE_TABLE.to_owned(),
            slot_table: DEFAULT_SLOT_TABLE.to_owned(),
            history_table: DEFAULT_HISTORY_TABLE.to_owned(),
            members_table: DEFAULT_MEMBERS_TABLE.to_owned(),
            tasks_table: DEFAULT_TASKS_TABLE.to_owned(),
            instances_table: DEFAULT_INSTANCES_TABLE.to_owned(),
            meta_table: DEFAULT_META_TABLE.to_owned(),
            channel: None,
            migrate: true,
            pool_size: 4,
            op_timeout: DEFAULT_OP_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
            application_name: DEFAULT_APPLICATION_NAME.to_owned(),
            notifications: true,
            max_reconnect_delay: Duration::from_secs(5),
            keepalive: Duration::from_secs(15),
            tls_ca_pem: None,
        }
    }

    leasehold_sql::setters! {
        schema: into String,
        lease_table: into String,
        slot_table: into String,
        history_table: into String,
        members_table: into String,
        tasks_table: into String,
        instances_table: into String,
        meta_table: into String,
        channel: some into String,
        migrate: bool,
        pool_size: usize,
        op_timeout: Duration,
        connect_timeout: Duration,
        application_name: into String,
        notifications: bool,
        tls_ca_pem: some into Vec<u8>,
    }

    /// The server as the driver reads [`url`](Self::url), without its password:
    /// `postgres://user@host:port/dbname` (a Unix socket directory percent-encoded,
    /// `?sslmode=` when given), built from the parsed settings, never from the text. A URL that
    /// cannot be read shows as `postgres (invalid url)`. `Debug`, [`PgStore`](crate::PgStore)'s `describe()`,
    /// log lines and errors show this.
    pub fn describe(&self) -> String {
        self.parse()
            .map_or_else(|_| "postgres (invalid url)".to_owned(), |p| p.shown)
    }

    /// The release channel in use: [`channel`](Self::channel), or `SCHEMA.LEASE_TABLE`.
    pub fn channel_name(&self) -> String {
        self.channel
            .clone()
            .unwrap_or_else(|| format!("{}.{}", self.schema, self.lease_table))
    }

    /// The store's tables (not the fence's), as configured.
    pub(crate) fn tables(&self) -> [&str; 7] {
        [
            &self.lease_table,
            &self.slot_table,
            &self.history_table,
            &self.members_table,
            &self.tasks_table,
            &self.instances_table,
            &self.meta_table,
        ]
    }

    /// Checks the settings (identifiers, durations, pool size); does not parse the URL.
    pub fn validate(&self) -> Result<()> {
        check_identifier("schema", &self.schema)?;
        check_identifier("lease_table", &self.lease_table)?;
        check_identifier("slot_table", &self.slot_table)?;
        check_identifier("history_table", &self.history_table)?;
        check_identifier("members_table", &self.members_table)?;
        check_identifier("tasks_table", &self.tasks_table)?;
        check_identifier("instances_table", &self.instances_table)?;
        check_identifier("meta_table", &self.meta_table)?;
        let tables = self.tables();
        if (1..tables.len()).any(|i| tables[..i].contains(&tables[i])) {
            return Err(PgSetupError::Config(
                "lease_table, slot_table, history_table, members_table, tasks_table and \
                 instances_table must differ"
                    .to_owned(),
            )
            .into());
        }
        let channel = self.channel_name();
        if channel.is_empty()
            || channel.len() > MAX_IDENT_LEN
            || channel.chars().any(|c| c == '"' || c.is_control())
        {
            return Err(PgSetupError::Config(format!(
                "release channel {channel:?} must be 1 to 63 bytes without quotes; set `channel`"
            ))
            .into());
        }
        leasehold_sql::check_pool(
            self.pool_size,
            &[
                ("op_timeout", self.op_timeout),
                ("connect_timeout", self.connect_timeout),
                ("max_reconnect_delay", self.max_reconnect_delay),
                ("keepalive", self.keepalive),
            ],
        )
        .map_err(PgSetupError::Config)?;
        if self.application_name.len() > MAX_IDENT_LEN - "-listen".len() {
            return Err(PgSetupError::Config(
                "application_name must be at most 56 bytes".to_owned(),
            )
            .into());
        }
        Ok(())
    }

    /// Reads the URL with the driver's parser (after taking out `sslmode` and `sslrootcert`,
    /// which the store handles) and checks what the driver does not.
    fn parse(&self) -> Result<Parsed> {
        let invalid = |reason: String| PgSetupError::InvalidUrl { reason };
        check_url(&self.url).map_err(|reason| invalid(reason.to_owned()))?;
        let (rest, params) = take_params(&self.url, &["sslmode", "sslrootcert"]);
        let pg = tokio_postgres::Config::from_str(&rest)
            .map_err(|e| invalid(parse_reason(&e, &self.url)))?;
        let sslmode = params[0].clone();
        let tls_wanted = match sslmode.as_deref() {
            None | Some("disable" | "allow" | "prefer") => false,
            Some("require" | "verify-ca" | "verify-full") => true,
            Some(_) => {
                return Err(invalid(
                    "unknown sslmode (use disable, require, verify-ca or verify-full)".to_owned(),
                )
                .into());
            }
        };
        Ok(Parsed {
            shown: describe(&pg, sslmode.as_deref()),
            pg,
            tls_wanted,
            rootcert: params[1].clone(),
        })
    }

    /// Parses the URL into the driver's config, the TLS choice and the password-free form to
    /// show.
    pub(crate) fn driver_config(&self) -> Result<(tokio_postgres::Config, Tls, String)> {
        let Parsed {
            mut pg,
            tls_wanted,
            rootcert,
            shown,
        } = self.parse()?;
        if pg.get_application_name().is_none() {
            pg.application_name(&self.application_name);
        }
        // The server cancels a statement that runs past the operation timeout, so an abandoned
        // statement never holds a row lock for long.
        let timeout_opt = format!("-c statement_timeout={}", self.op_timeout.as_millis());
        let options = match pg.get_options() {
            Some(existing) if !existing.is_empty() => format!("{existing} {timeout_opt}"),
            _ => timeout_opt,
        };
        pg.options(&options);
        pg.connect_timeout(self.connect_timeout);
        pg.keepalives(true);
        pg.keepalives_idle(Duration::from_secs(30));
        if !tls_wanted {
            pg.ssl_mode(SslMode::Disable);
            return Ok((pg, Tls::None, shown));
        }
        pg.ssl_mode(SslMode::Require);
        #[cfg(feature = "tls")]
        {
            let pem = match (&self.tls_ca_pem, rootcert) {
                (Some(pem), _) => Some(pem.clone()),
                (None, Some(path)) => Some(std::fs::read(&path).map_err(|e| {
                    PgSetupError::Tls(format!("cannot read sslrootcert {path}: {e}"))
                })?),
                (None, None) => None,
            };
            Ok((pg, Tls::Rustls(tls::connector(pem.as_deref())?), shown))
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = (rootcert, shown);
            Err(PgSetupError::Config(
                "sslmode=require/verify-* needs the `tls` feature of leasehold-postgres".to_owned(),
            )
            .into())
        }
    }
}

impl fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConfig")
            .field("url", &self.describe())
            .field("schema", &self.schema)
            .field("lease_table", &self.lease_table)
            .field("slot_table", &self.slot_table)
            .field("history_table", &self.history_table)
            .field("members_table", &self.members_table)
            .field("tasks_table", &self.tasks_table)
            .field("instances_table", &self.instances_table)
            .field("meta_table", &self.meta_table)
            .field("channel", &self.channel)
            .field("migrate", &self.migrate)
            .field("pool_size", &self.pool_size)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("application_name", &self.application_name)
            .field("notifications", &self.notifications)
            .field("max_reconnect_delay", &self.max_reconnect_delay)
            .field("keepalive", &self.keepalive)
            .field("tls_ca_pem", &self.tls_ca_pem.as_ref().map(|_| "set"))
            .finish()
    }
}

/// The URL as the driver read it.
struct Parsed {
    pg: tokio_postgres::Config,
    tls_wanted: bool,
    rootcert: Option<String>,
    /// [`describe`] of `pg`.
    shown: String,
}

/// How connections are encrypted.
#[derive(Clone)]
pub(crate) enum Tls {
    /// Plain TCP (or a Unix socket).
    None,
    /// rustls on the ring provider.
    #[cfg(feature = "tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

#[cfg(feature = "tls")]
mod tls {
    use std::sync::Arc;

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    use crate::error::{PgSetupError, Result};

    /// A connector that verifies the server's certificate chain and host name against `ca_pem`
    /// or, without it, the system's root certificates.
    pub(crate) fn connector(
        ca_pem: Option<&[u8]>,
    ) -> Result<tokio_postgres_rustls::MakeRustlsConnect> {
        let mut roots = rustls::RootCertStore::empty();
        match ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert =
                        cert.map_err(|e| PgSetupError::Tls(format!("bad CA certificate: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| PgSetupError::Tls(format!("bad CA certificate: {e}")))?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    // Skip the odd unparsable system certificate; the rest still work.
                    let _ = roots.add(cert);
                }
            }
        }
        if roots.is_empty() {
            return Err(PgSetupError::Tls(
                "no root certificates to verify the server with".to_owned(),
            )
            .into());
        }
        // ring, not aws-lc-rs (which needs a C toolchain to build). rustls 0.23.48 deprecates
        // ring's provider for lacking post-quantum key exchange; 0.23 has no other way to name
        // it, so the deprecation is allowed here on purpose (no warning on older 0.23 either).
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| PgSetupError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }
}

/// Checks that `value` is a plain identifier, safe to put in double quotes in SQL.
pub(crate) fn check_identifier(what: &'static str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= MAX_IDENT_LEN
        && !value.starts_with(|c: char| c.is_ascii_digit())
        && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(PgSetupError::InvalidIdentifier {
            what,
            value: value.to_owned(),
        }
        .into())
    }
}

/// `"schema"."table"`, for identifiers already checked.
pub(crate) fn qualified(schema: &str, table: &str) -> String {
    format!("\"{schema}\".\"{table}\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn identifiers() {
        assert!(check_identifier("schema", "leasehold").is_ok());
        assert!(check_identifier("schema", "Lh_test_2").is_ok());
        for bad in [
            "",
            "1abc",
            "a-b",
            "a\"b",
            "a b",
            "a;drop",
            "ä",
            &"x".repeat(64),
        ] {
            assert!(
                matches!(
                    check_identifier("schema", bad),
                    Err(Error::Store(PgSetupError::InvalidIdentifier {
                        what: "schema",
                        ..
                    }))
                ),
                "{bad:?}"
            );
        }
        let err = PgConfig::new("postgres://h/db")
            .lease_table("leases; drop table x")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("lease_table"), "{err}");
    }

    #[test]
    fn tls_choice() {
        let (_, tls, _) = PgConfig::new("postgres://h/db").driver_config().unwrap();
        assert!(matches!(tls, Tls::None));
        let (_, tls, _) = PgConfig::new("postgres://h/db?sslmode=disable")
            .driver_config()
            .unwrap();
        assert!(matches!(tls, Tls::None));
        let err = PgConfig::new("postgres://h/db?sslmode=sometimes")
            .driver_config()
            .err()
            .unwrap();
        assert!(err.to_string().contains("sslmode"), "{err}");
    }

    #[test]
    fn debug_shows_the_parsed_form() {
        let debug = format!("{:?}", PgConfig::new("postgres://u:s3cretpw@h/db"));
        assert!(debug.contains("postgres://u@h:5432/db"), "{debug}");
        assert!(!debug.contains("s3cretpw"), "{debug}");
        let debug = format!("{:?}", PgConfig::new("host=h password='s3cret pw"));
        assert!(debug.contains("postgres (invalid url)"), "{debug}");
    }
}
