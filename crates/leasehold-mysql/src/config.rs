//! [`MySqlConfig`]: the settings of a [`MySqlStore`](crate::MySqlStore), and the URL it reads.

use std::fmt;
use std::time::Duration;

use leasehold::store::{percent_decode, percent_encode};

use crate::error::{Error, MySqlSetupError, Result};

/// Default prefix of the store's table names (`leasehold_leases`, `leasehold_slots`, ...).
pub const DEFAULT_TABLE_PREFIX: &str = "leasehold_";
/// Default time limit of one store operation.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Default pause between two polls of the release log (see
/// [`MySqlConfig::notify_poll_interval`]).
pub const DEFAULT_NOTIFY_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Longest table prefix: the longest table name it makes (`{prefix}task_instances`, 14 more
/// bytes) stays below MySQL's 64.
const MAX_PREFIX_LEN: usize = 40;

/// Settings of a MySQL or MariaDB store. Build with [`MySqlConfig::new`], adjust the fields,
/// then [`connect`](MySqlConfig::connect).
#[derive(Clone)]
#[non_exhaustive]
pub struct MySqlConfig {
    /// Server URL, `mysql://[user[:password]@]host[:port]/database[?ssl-mode=...&ssl-ca=PATH]`
    /// (`mariadb://` is the same). No default.
    pub url: String,
    /// Prefix of the store's tables in the URL's database: `{prefix}leases`, `{prefix}slots`,
    /// `{prefix}history`, `{prefix}members`, `{prefix}tasks` and `{prefix}task_instances` (the
    /// fleet catalog) and `{prefix}schema` (the schema version). Default
    /// [`DEFAULT_TABLE_PREFIX`] (`leasehold_`). ASCII letters, digits and underscores, at most
    /// 40 bytes.
    pub table_prefix: String,
    /// Whether [`connect`](Self::connect) creates missing tables (an idempotent migration, safe
    /// when many instances start at once). Default `true`; with it off the tables must exist
    /// (the SQL is in the README). Tables that exist are checked either way, and when all of
    /// them are there and current nothing is written.
    pub migrate: bool,
    /// Most connections in the pool (the release poller has one more of its own). Default 4.
    pub pool_size: usize,
    /// Time limit of each store operation, after which it fails with
    /// [`StoreError::Timeout`](leasehold::StoreError::Timeout). The connections' lock wait
    /// limit (`innodb_lock_wait_timeout`, whole seconds, rounded up) and, on MariaDB, their
    /// `max_statement_time` are set from it, so the server gives up on the statement too.
    /// Default [`DEFAULT_OP_TIMEOUT`] (2 s).
    pub op_timeout: Duration,
    /// Time limit of establishing a connection (TCP, TLS, authentication, session setup), at
    /// start and on each reconnect. Default 5 s.
    pub connect_timeout: Duration,
    /// Whether to poll for releases so waiters take over right after a graceful release.
    /// Without it waiters retry at the lease's expiry. Default `true`.
    pub notifications: bool,
    /// How often the release poller reads the releases since its last read (one indexed query
    /// on its own connection). It bounds the graceful handoff: a waiter hears of a release
    /// within one interval plus a round trip. Default [`DEFAULT_NOTIFY_POLL_INTERVAL`] (50 ms).
    pub notify_poll_interval: Duration,
    /// Longest pause between attempts to re-open the poller's connection (and, for a lazy
    /// store, the first connection). Default 5 s.
    pub max_reconnect_delay: Duration,
    /// PEM root certificates to verify the server with, instead of the built-in Mozilla roots
    /// (for a private CA). An `ssl-ca=PATH` in the URL sets this from the file. Default `None`.
    pub tls_ca_pem: Option<Vec<u8>>,
}

impl MySqlConfig {
    /// Defaults for the server at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            table_prefix: DEFAULT_TABLE_PREFIX.to_owned(),
            migrate: true,
            pool_size: 4,
            op_timeout: DEFAULT_OP_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
            notifications: true,
            notify_poll_interval: DEFAULT_NOTIFY_POLL_INTERVAL,
            max_reconnect_delay: Duration::from_secs(5),
            tls_ca_pem: None,
        }
    }

    leasehold_sql::setters! {
        table_prefix: into String,
        migrate: bool,
        pool_size: usize,
        op_timeout: Duration,
        connect_timeout: Duration,
        notifications: bool,
        notify_poll_interval: Duration,
        tls_ca_pem: some into Vec<u8>,
    }

    /// The server as read from [`url`](Self::url), without its password:
    /// `mysql://user@host:port/database` (with `?ssl-mode=` when given), built from the parsed
    /// parts, never from the text. A URL that cannot be read shows as `mysql (invalid url)`.
    /// `Debug`, the store's `describe()`, log lines and errors show this.
    pub fn describe(&self) -> String {
        ServerUrl::parse(&self.url).map_or_else(|_| "mysql (invalid url)".to_owned(), |u| u.shown())
    }

    /// Checks the settings (table prefix, durations, pool size); does not parse the URL.
    pub fn validate(&self) -> Result<()> {
        let prefix = &self.table_prefix;
        let ok = !prefix.is_empty()
            && prefix.len() <= MAX_PREFIX_LEN
            && prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(MySqlSetupError::InvalidPrefix(prefix.clone()).into());
        }
        leasehold_sql::check_pool(
            self.pool_size,
            &[
                ("op_timeout", self.op_timeout),
                ("connect_timeout", self.connect_timeout),
                ("notify_poll_interval", self.notify_poll_interval),
                ("max_reconnect_delay", self.max_reconnect_delay),
            ],
        )
        .map_err(|e| MySqlSetupError::Config(e).into())
    }

    /// The URL, parsed, with the CA of `ssl-ca` (or [`tls_ca_pem`](Self::tls_ca_pem)) read.
    pub(crate) fn server(&self) -> Result<ServerUrl> {
        let mut url = ServerUrl::parse(&self.url)?;
        if let Some(pem) = &self.tls_ca_pem {
            url.ca_pem = Some(pem.clone());
        } else if let Some(path) = &url.ca_path {
            let pem = std::fs::read(path)
                .map_err(|e| MySqlSetupError::Tls(format!("cannot read ssl-ca {path}: {e}")))?;
            url.ca_pem = Some(pem);
        }
        if let Some(pem) = &url.ca_pem
            && !String::from_utf8_lossy(pem).contains("-----BEGIN CERTIFICATE-----")
        {
            return Err(MySqlSetupError::Tls(
                "the CA file holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned(),
            )
            .into());
        }
        if url.ca_pem.is_some() && url.ssl_mode == SslMode::Disabled {
            return Err(MySqlSetupError::InvalidUrl {
                reason: "ssl-ca needs ssl-mode=verify-ca or verify-identity".to_owned(),
            }
            .into());
        }
        Ok(url)
    }
}

impl fmt::Debug for MySqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlConfig")
            .field("url", &self.describe())
            .field("table_prefix", &self.table_prefix)
            .field("migrate", &self.migrate)
            .field("pool_size", &self.pool_size)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("notifications", &self.notifications)
            .field("notify_poll_interval", &self.notify_poll_interval)
            .field("max_reconnect_delay", &self.max_reconnect_delay)
            .field("tls_ca_pem", &self.tls_ca_pem.as_ref().map(|_| "set"))
            .finish()
    }
}

/// How the connection is encrypted: MySQL's `--ssl-mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Plain TCP (no `ssl-mode`, or `disabled`).
    Disabled,
    /// TLS without checking the server's certificate (as MySQL's client does; with a CA it
    /// checks the chain, as `verify-ca`).
    Required,
    /// TLS, the certificate chain checked against the CA, and (stricter than MySQL's client,
    /// whose `VERIFY_CA` leaves it out) the host name.
    VerifyCa,
    /// TLS, the chain and the host name checked.
    VerifyIdentity,
}

impl SslMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Required => "required",
            Self::VerifyCa => "verify-ca",
            Self::VerifyIdentity => "verify-identity",
        }
    }
}

/// The URL's parts. Its `Debug` leaves out the password.
#[derive(Clone)]
pub(crate) struct ServerUrl {
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    /// A name, an IPv4 address or an IPv6 address (without brackets).
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) database: String,
    pub(crate) ssl_mode: SslMode,
    ca_path: Option<String>,
    pub(crate) ca_pem: Option<Vec<u8>>,
}

impl fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown())
    }
}

impl ServerUrl {
    /// Reads `mysql://[user[:password]@]host[:port]/database[?ssl-mode=..&ssl-ca=..]`. Errors
    /// quote none of the text (any part of a URL that cannot be read might be a password).
    pub(crate) fn parse(url: &str) -> Result<Self> {
        let invalid = |reason: &str| {
            Error::from(MySqlSetupError::InvalidUrl {
                reason: reason.to_owned(),
            })
        };
        let rest = url
            .strip_prefix("mysql://")
            .or_else(|| url.strip_prefix("mariadb://"))
            .ok_or_else(|| invalid("use mysql://[user[:password]@]host[:port]/database"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        // The password may hold `/` or `@` only percent-encoded, so the last `@` before the
        // path ends the credentials.
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (credentials, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match credentials {
            None => (None, None),
            Some(c) => {
                let (u, p) = match c.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (c, None),
                };
                let user = percent_decode(u)
                    .ok_or_else(|| invalid("the user name is not valid UTF-8 percent-encoding"))?;
                let password = p
                    .map(|p| {
                        percent_decode(p).ok_or_else(|| {
                            invalid("the password is not valid UTF-8 percent-encoding")
                        })
                    })
                    .transpose()?;
                ((!user.is_empty()).then_some(user), password)
            }
        };
        let (host, port) = split_host_port(hostport).ok_or_else(|| {
            invalid("the host must be a name or an address, with an optional :port (1-65535)")
        })?;
        let database = percent_decode(path.trim_end_matches('/'))
            .ok_or_else(|| invalid("the database name is not valid UTF-8 percent-encoding"))?;
        if database.is_empty() {
            return Err(invalid(
                "the URL names no database (mysql://user@host:3306/DATABASE)",
            ));
        }
        if database.contains('/') || database.contains('`') || database.contains('\0') {
            return Err(invalid("the database name may not hold / ` or NUL"));
        }
        let mut ssl_mode = None;
        let mut ca_path = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value)
                .ok_or_else(|| invalid("a parameter value is not valid UTF-8 percent-encoding"))?;
            match key.to_ascii_lowercase().replace('_', "-").as_str() {
                "ssl-mode" | "sslmode" => {
                    ssl_mode = Some(
                        match value.to_ascii_lowercase().replace('_', "-").as_str() {
                            "disabled" => SslMode::Disabled,
                            "required" => SslMode::Required,
                            "verify-ca" => SslMode::VerifyCa,
                            "verify-identity" => SslMode::VerifyIdentity,
                            "preferred" => {
                                return Err(invalid(
                                    "ssl-mode=preferred would fall back to plain text without saying so; use required, verify-ca, verify-identity or disabled",
                                ));
                            }
                            _ => {
                                return Err(invalid(
                                    "unknown ssl-mode (use disabled, required, verify-ca or verify-identity)",
                                ));
                            }
                        },
                    );
                }
                "ssl-ca" => ca_path = Some(value),
                other if other.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => {
                    return Err(MySqlSetupError::InvalidUrl {
                        reason: format!("unknown parameter {other:?} (known: ssl-mode, ssl-ca)"),
                    }
                    .into());
                }
                _ => return Err(invalid("unknown parameter (known: ssl-mode, ssl-ca)")),
            }
        }
        let ssl_mode = match (ssl_mode, &ca_path) {
            (Some(mode), _) => mode,
            // A CA alone asks for a checked chain, as MySQL's client reads `--ssl-ca`.
            (None, Some(_)) => SslMode::VerifyCa,
            (None, None) => SslMode::Disabled,
        };
        Ok(Self {
            user,
            password,
            host,
            port,
            database,
            ssl_mode,
            ca_path,
            ca_pem: None,
        })
    }

    /// `mysql://user@host:port/database[?ssl-mode=...]`: no password, whatever the URL held.
    pub(crate) fn shown(&self) -> String {
        let mut out = String::from("mysql://");
        if let Some(user) = &self.user {
            out.push_str(&percent_encode(user.as_bytes()));
            out.push('@');
        }
        if self.host.contains(':') {
            out.push_str(&format!("[{}]", self.host));
        } else {
            out.push_str(&self.host);
        }
        out.push_str(&format!(
            ":{}/{}",
            self.port,
            percent_encode(self.database.as_bytes())
        ));
        if self.ssl_mode != SslMode::Disabled {
            out.push_str(&format!("?ssl-mode={}", self.ssl_mode.as_str()));
        }
        out
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; port 3306 when absent.
fn split_host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        host.parse::<std::net::Ipv6Addr>().ok()?;
        (host.to_owned(), port)
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (s.to_owned(), None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !host_ok {
        return None;
    }
    let port = match port {
        None => 3306,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_and_shown_without_the_password() {
        let u = ServerUrl::parse(
            "mysql://app:s%40cr%2Ft:pw@db.example:3307/prod?ssl-mode=VERIFY_IDENTITY",
        )
        .unwrap();
        assert_eq!(u.user.as_deref(), Some("app"));
        assert_eq!(u.password.as_deref(), Some("s@cr/t:pw"));
        assert_eq!((u.host.as_str(), u.port), ("db.example", 3307));
        assert_eq!(u.database, "prod");
        assert_eq!(u.ssl_mode, SslMode::VerifyIdentity);
        assert_eq!(
            u.shown(),
            "mysql://app@db.example:3307/prod?ssl-mode=verify-identity"
        );
        assert!(!format!("{u:?}").contains("cr"), "{u:?}");

        let u = ServerUrl::parse("mariadb://root@[::1]/test").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 3306));
        assert_eq!(u.shown(), "mysql://root@[::1]:3306/test");
        let u = ServerUrl::parse("mysql://127.0.0.1/test?ssl-ca=/etc/ca.pem").unwrap();
        assert_eq!(u.ssl_mode, SslMode::VerifyCa, "a CA alone checks the chain");
        assert_eq!(u.user, None);
    }

    #[test]
    fn bad_urls_say_why_without_quoting_them() {
        for (url, said) in [
            ("postgres://u:SECRET@h/db", "use mysql://"),
            ("mysql://u:SECRET@h:99999/db", "port"),
            ("mysql://u:SECRET@h/", "names no database"),
            ("mysql://u:SECRET@h/db?ssl-mode=preferred", "plain text"),
            (
                "mysql://u:SECRET@h/db?ssl-mode=sometimes",
                "unknown ssl-mode",
            ),
            ("mysql://u:SECRET@h/db?pool=3", "unknown parameter \"pool\""),
            (
                "mysql://u:SECRET@h/db?SECRET%20x=1",
                "unknown parameter (known",
            ),
            ("mysql://u:SEC%ZZRET@h/db", "password"),
            ("mysql://u:SECRET@h h/db", "host"),
        ] {
            let err = ServerUrl::parse(url).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(shown.contains(said), "{url}: {shown}");
            assert!(
                !shown.contains("SECRET") && !shown.contains("SEC"),
                "{shown}"
            );
        }
    }

    #[test]
    fn settings_are_checked() {
        let config = MySqlConfig::new("mysql://h/db");
        assert!(config.validate().is_ok());
        for bad in ["", "a-b", "x;drop", &"x".repeat(41)] {
            let err = config.clone().table_prefix(bad).validate().unwrap_err();
            assert!(
                matches!(err, Error::Store(MySqlSetupError::InvalidPrefix(_))),
                "{bad:?}: {err}"
            );
        }
        let err = config.clone().pool_size(0).validate().unwrap_err();
        assert!(err.to_string().contains("pool_size"), "{err}");
        let err = config.op_timeout(Duration::ZERO).validate().unwrap_err();
        assert!(err.to_string().contains("op_timeout"), "{err}");
    }

    #[test]
    fn debug_shows_the_parsed_form() {
        let debug = format!("{:?}", MySqlConfig::new("mysql://u:s3cretpw@h/db"));
        assert!(debug.contains("mysql://u@h:3306/db"), "{debug}");
        assert!(!debug.contains("s3cretpw"), "{debug}");
        let debug = format!("{:?}", MySqlConfig::new("mysql://u:s3cretpw@h"));
        assert!(debug.contains("mysql (invalid url)"), "{debug}");
    }
}
