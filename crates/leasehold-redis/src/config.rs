//! [`RedisConfig`]: the settings of a [`RedisStore`](crate::RedisStore).

use std::fmt;
use std::time::Duration;

use crate::error::{RedisSetupError, Result};
use crate::url::{CLUSTER_SCHEME, ClusterUrl, SENTINEL_SCHEME, SentinelUrl};

/// The deployment a URL names, picked by its scheme.
pub(crate) enum Target {
    /// One server (`redis://`, `rediss://`, Unix sockets): parsed by the `redis` crate.
    Single,
    Sentinel(SentinelUrl),
    Cluster(ClusterUrl),
}

/// Default key prefix: keys are `leasehold:{NAME}:lease`, `leasehold:{NAME}:fence`,
/// `leasehold:{TASK}:slot`, and releases are announced on `leasehold:released`.
pub const DEFAULT_PREFIX: &str = "leasehold";

/// Time limit of a store operation without a ttl, and the most one with a ttl gets, unless
/// [`RedisConfig::op_timeout`] is set.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings of a Redis store. Build with [`RedisConfig::new`], adjust the fields, then
/// [`connect`](RedisConfig::connect).
#[derive(Clone)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Server URL: `redis://[[user]:password@]host[:port][/db]`, `rediss://…` for TLS,
    /// `redis+sentinel://…` ([`SentinelUrl`]) or `redis+cluster://…` ([`ClusterUrl`]). No default.
    /// Any form may end in `?prefix=P` (`&prefix=P` after other parameters, percent-encoded),
    /// which sets [`prefix`](Self::prefix): so a URL alone, as `leasehold --store` or an
    /// environment variable gives it, keeps two applications on one database apart.
    pub url: String,
    /// Prefix of every key and of the release channel. Default [`DEFAULT_PREFIX`]
    /// (`leasehold`), or the URL's `prefix=`; setting both to different values is refused
    /// ([`RedisSetupError::Config`]). Must be non-empty and free of braces and whitespace.
    pub prefix: String,
    /// Time limit of each store operation, end to end (retries and the driver's response timeout,
    /// which is set to it, included), after which it fails with
    /// [`StoreError::Timeout`](leasehold::StoreError::Timeout).
    ///
    /// Default `None`: derived from the lease's ttl. An operation that carries one (acquire,
    /// renew, a batch renewal, a membership refresh) gets a third of it, the default renew
    /// interval, and at most [`DEFAULT_OP_TIMEOUT`] (2 s), so a renewal sent into a dead
    /// connection is given up and retried while the lease can still be kept (with a 1 s ttl, a
    /// fixed 2 s limit outlived the lease); the others (release, inspect, slots, history, the
    /// clock) get [`DEFAULT_OP_TIMEOUT`]. `Some(limit)`: that limit for every operation.
    pub op_timeout: Option<Duration>,
    /// Time limit of establishing a connection (TCP, TLS, AUTH), at start and on each reconnect.
    /// Default 2 s.
    pub connect_timeout: Duration,
    /// Whether to listen for release notifications (pub/sub) so waiters take over right after a
    /// graceful release. Without them waiters retry at the lease's expiry. Default `true`.
    pub notifications: bool,
    /// Longest pause between attempts to re-establish the notification connection. Default 5 s.
    pub max_reconnect_delay: Duration,
    /// How often the notification connection is checked with a PING, so a silently dead
    /// connection is replaced. Default 15 s.
    pub keepalive: Duration,
    /// How long a name's fencing counter lives after the name's last acquisition before Redis
    /// expires it, so names that come and go (a lease per job) do not leave a key each behind
    /// for ever. Safe for fencing: a token is never below the server's clock (ms × 1000), so a
    /// name whose counter expired (or was lost, or set back by a failover) still gets tokens
    /// above every one it had, unless the server's clock stepped back by more than the time
    /// since (or a name was acquired more than a thousand times per millisecond just before).
    /// Never shorter than the lease's ttl. Default one day.
    pub retention: Duration,
    /// PEM root certificates to trust for `rediss://` instead of the system's (for a private CA).
    /// Needs the `tls` feature. Default `None`: the system's root certificates.
    pub tls_ca_pem: Option<Vec<u8>>,
}

impl RedisConfig {
    /// Defaults for the server at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            op_timeout: None,
            connect_timeout: Duration::from_secs(2),
            notifications: true,
            max_reconnect_delay: Duration::from_secs(5),
            keepalive: Duration::from_secs(15),
            retention: Duration::from_secs(24 * 3600),
            tls_ca_pem: None,
        }
    }

    /// Sets [`prefix`](Self::prefix).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets [`op_timeout`](Self::op_timeout): one limit for every operation, whatever the ttl.
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = Some(timeout);
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`notifications`](Self::notifications).
    pub fn notifications(mut self, on: bool) -> Self {
        self.notifications = on;
        self
    }

    /// Sets [`retention`](Self::retention).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Sets [`tls_ca_pem`](Self::tls_ca_pem).
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca_pem = Some(pem.into());
        self
    }

    /// The limit of an operation that takes longest: the driver's response timeout.
    pub(crate) fn max_op_timeout(&self) -> Duration {
        self.op_timeout.unwrap_or(DEFAULT_OP_TIMEOUT)
    }

    /// The deployment the URL names, parsed by the parser of its form.
    pub(crate) fn target(&self) -> Result<Target> {
        let scheme = self.url.split_once("://").map_or("", |(s, _)| s);
        if ["rediss+sentinel", "rediss+cluster"]
            .iter()
            .any(|tls| scheme.eq_ignore_ascii_case(tls))
        {
            return Err(RedisSetupError::InvalidUrl {
                url: format!("{scheme}://…"),
                reason: "TLS to Sentinel and Cluster deployments is not supported yet: \
                         redis+sentinel:// and redis+cluster:// speak plain TCP, rediss:// is \
                         for one server"
                    .into(),
            }
            .into());
        }
        Ok(if scheme.eq_ignore_ascii_case(SENTINEL_SCHEME) {
            Target::Sentinel(SentinelUrl::parse(&self.url)?)
        } else if scheme.eq_ignore_ascii_case(CLUSTER_SCHEME) {
            Target::Cluster(ClusterUrl::parse(&self.url)?)
        } else {
            Target::Single
        })
    }

    /// The server as the URL's parser read it: scheme, user, addresses and database, built from
    /// the parsed form, which holds the password apart, so no password can be shown however the
    /// URL spells it. `redis (unparsable url)` if it does not parse.
    pub fn describe(&self) -> String {
        use redis::{ConnectionAddr, IntoConnectionInfo};
        match self.target() {
            Ok(Target::Single) => {}
            Ok(Target::Sentinel(url)) => return url.to_string(),
            Ok(Target::Cluster(url)) => return url.to_string(),
            Err(_) => return "redis (unparsable url)".to_owned(),
        }
        let Ok(info) = self.url.as_str().into_connection_info() else {
            return "redis (unparsable url)".to_owned();
        };
        let settings = info.redis_settings();
        let user = settings
            .username()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        let db = settings.db();
        let host = |h: &str| {
            if h.contains(':') {
                format!("[{h}]")
            } else {
                h.to_owned()
            }
        };
        match info.addr() {
            ConnectionAddr::Tcp(h, port) => format!("redis://{user}{}:{port}/{db}", host(h)),
            ConnectionAddr::TcpTls { host: h, port, .. } => {
                format!("rediss://{user}{}:{port}/{db}", host(h))
            }
            ConnectionAddr::Unix(path) => {
                format!("redis+unix://{user}{}?db={db}", path.display())
            }
            #[allow(unreachable_patterns)]
            _ => "redis".to_owned(),
        }
    }

    /// The key prefix in use: the URL's `prefix=`, else [`prefix`](Self::prefix). Refused when
    /// both are set and differ, or when it is not a valid prefix.
    pub(crate) fn key_prefix(&self, target: &Target) -> Result<String> {
        let from_url = match target {
            Target::Single => crate::url::single_server_prefix(&self.url)?,
            Target::Sentinel(url) => url.prefix.clone(),
            Target::Cluster(url) => url.prefix.clone(),
        };
        let prefix = match from_url {
            Some(p) if self.prefix != DEFAULT_PREFIX && self.prefix != p => {
                return Err(RedisSetupError::Config(format!(
                    "the url's prefix={p:?} and the configured key prefix {:?} differ; set it in \
                     one place",
                    self.prefix
                ))
                .into());
            }
            Some(p) => p,
            None => self.prefix.clone(),
        };
        check_prefix(&prefix)?;
        Ok(prefix)
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        check_prefix(&self.prefix)?;
        leasehold::store::check_nonzero(&[
            ("op_timeout", self.op_timeout.unwrap_or(DEFAULT_OP_TIMEOUT)),
            ("connect_timeout", self.connect_timeout),
            ("max_reconnect_delay", self.max_reconnect_delay),
            ("keepalive", self.keepalive),
        ])
        .map_err(|e| RedisSetupError::Config(e.to_string()))?;
        Ok(())
    }
}

/// The database of a `redis://` or `rediss://` URL, checked before the driver reads it: the
/// driver's own message ("Invalid database number - InvalidClientConfig") names neither the
/// database nor the URL. The URL is shown without its user and password.
pub(crate) fn check_database(url: &str) -> Result<()> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(());
    };
    if !["redis", "rediss"]
        .iter()
        .any(|s| scheme.eq_ignore_ascii_case(s))
    {
        return Ok(());
    }
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let Some((authority, path)) = rest
        .rsplit_once('@')
        .map_or(rest, |(_, a)| a)
        .split_once('/')
    else {
        return Ok(());
    };
    if path.is_empty() || path.parse::<u32>().is_ok() {
        return Ok(());
    }
    Err(RedisSetupError::InvalidUrl {
        url: format!("{scheme}://{authority}"),
        reason: format!(
            "the database {:?} is not a number: end the URL with /0, /1, … (or ?prefix= to \
             keep applications apart in one database)",
            leasehold::store::text::visible(path)
        ),
    }
    .into())
}

/// A key prefix: non-empty, without braces (they would change the keys' hash tags on a
/// cluster), whitespace or control characters.
fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty()
        || prefix
            .chars()
            .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
    {
        return Err(RedisSetupError::Config(format!(
            "key prefix {prefix:?} must be non-empty, without braces or whitespace"
        ))
        .into());
    }
    Ok(())
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.describe())
            .field("prefix", &self.prefix)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("notifications", &self.notifications)
            .field("max_reconnect_delay", &self.max_reconnect_delay)
            .field("keepalive", &self.keepalive)
            .field("tls_ca_pem", &self.tls_ca_pem.as_ref().map(|_| "set"))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::RedisConfig;

    /// The description comes from the parsed URL, so no spelling of a password reaches it
    /// (issue 11 case 8: `rediss://user:pa?ss@…` used to print part of it).
    #[test]
    fn no_password_form_is_described() {
        for (url, shown) in [
            (
                "redis://:s3cret@127.0.0.1:6379/2",
                "redis://127.0.0.1:6379/2",
            ),
            ("redis://app:s3cret@cache:6380", "redis://app@cache:6380/0"),
            (
                "rediss://app:s3cret%3F%23%2F@cache",
                "rediss://app@cache:6379/0",
            ),
            (
                "redis://app:s3%40cret@[::1]:6379/1",
                "redis://app@[::1]:6379/1",
            ),
            (
                "redis+unix:///run/redis.sock?db=3&pass=s3cret",
                "redis+unix:///run/redis.sock?db=3",
            ),
            (
                "unix:///run/redis.sock?password=s3cret",
                "redis+unix:///run/redis.sock?db=0",
            ),
            ("redis://app@cache", "redis://app@cache:6379/0"),
        ] {
            let described = RedisConfig::new(url).describe();
            assert_eq!(described, shown, "{url}");
            assert!(!described.contains("s3"), "{url}: {described}");
            let debug = format!("{:?}", RedisConfig::new(url));
            assert!(!debug.contains("s3"), "{url}: {debug}");
        }
        assert_eq!(
            RedisConfig::new("redis://:s3cret@host:notaport").describe(),
            "redis (unparsable url)"
        );
        assert_eq!(
            RedisConfig::new("redis+cluster://:s3cret@a:7000/1").describe(),
            "redis (unparsable url)"
        );
    }

    /// `prefix=` in any URL form sets the key prefix (percent-decoded); a config that sets a
    /// different one, a second `prefix=`, or a prefix that is not one, are refused.
    #[test]
    fn a_url_prefix_sets_the_key_prefix() {
        let prefix = |config: RedisConfig| config.key_prefix(&config.target()?);
        for (url, expected) in [
            ("redis://127.0.0.1:6379/0?prefix=app1:", "app1:"),
            ("redis://h?prefix=billing", "billing"),
            (
                "rediss://:s3cret@h:6380/2?protocol=resp3&prefix=a%2Fb",
                "a/b",
            ),
            ("redis+unix:///run/redis.sock?db=2&prefix=jobs", "jobs"),
            ("redis+sentinel://h:26379/main?db=1&prefix=app2", "app2"),
            ("redis+cluster://a:7000,b:7001?prefix=app3", "app3"),
            ("redis://h:6379/0", super::DEFAULT_PREFIX),
            ("redis://h:6379/0?protocol=resp2", super::DEFAULT_PREFIX),
        ] {
            assert_eq!(prefix(RedisConfig::new(url)).unwrap(), expected, "{url}");
        }
        // The same value in both places is one setting; two values are refused.
        let both = RedisConfig::new("redis://h?prefix=app1").prefix("app1");
        assert_eq!(prefix(both).unwrap(), "app1");
        let err = prefix(RedisConfig::new("redis://h?prefix=app1").prefix("app2")).unwrap_err();
        assert!(
            matches!(err, crate::Error::Store(crate::RedisSetupError::Config(_))),
            "{err}"
        );
        assert!(err.to_string().contains("set it in one place"), "{err}");
        for (url, reason) in [
            ("redis://h?prefix=a%7Bb%7D", "without braces"),
            ("redis://h?prefix=a%20b", "without braces or whitespace"),
            ("redis://h?prefix=", "must be non-empty"),
            ("redis://h?prefix", "names no prefix"),
            ("redis://:s3cret@h?prefix=a&prefix=b", "given twice"),
            ("redis+sentinel://h/m?prefix=a&prefix=b", "given twice"),
            ("redis+cluster://h?prefix=a%7B", "without braces"),
        ] {
            let err = prefix(RedisConfig::new(url)).unwrap_err().to_string();
            assert!(err.contains(reason), "{url}: {err}");
            assert!(!err.contains("s3"), "{url}: {err}");
        }
    }

    /// The replicated forms are refused before any connection when a setting cannot apply.
    #[tokio::test]
    async fn replicated_forms_refuse_what_they_cannot_do() {
        for url in ["redis+sentinel://h/m", "redis+cluster://h:7000"] {
            let err = RedisConfig::new(url)
                .tls_ca_pem(b"-----BEGIN CERTIFICATE-----".to_vec())
                .connect()
                .await
                .unwrap_err();
            assert!(
                matches!(err, crate::Error::Store(crate::RedisSetupError::Config(_))),
                "{url}: {err}"
            );
            assert!(err.to_string().contains("no TLS support"), "{err}");
        }
        for url in ["rediss+sentinel://:s3cret@h/m", "REDISS+CLUSTER://h:7000"] {
            let err = RedisConfig::new(url).connect().await.unwrap_err();
            assert!(
                matches!(
                    err,
                    crate::Error::Store(crate::RedisSetupError::InvalidUrl { .. })
                ),
                "{url}: {err}"
            );
            assert!(err.to_string().contains("not supported yet"), "{err}");
            assert!(!err.to_string().contains("s3"), "{err}");
        }
        let err = RedisConfig::new("redis+sentinel://:s3cret@h:26379/")
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                crate::Error::Store(crate::RedisSetupError::InvalidUrl { .. })
            ),
            "{err}"
        );
        assert!(!err.to_string().contains("s3"), "{err}");
    }
}
