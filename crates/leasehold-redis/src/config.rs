//! [`RedisConfig`]: the settings of a [`RedisStore`](crate::RedisStore).

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
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
    pub url: String,
    /// Prefix of every key and of the release channel. Default [`DEFAULT_PREFIX`]
    /// (`leasehold`). Must be non-empty and free of braces and whitespace.
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
            return Err(Error::InvalidUrl {
                url: format!("{scheme}://…"),
                reason: "TLS to Sentinel and Cluster deployments is not supported yet: \
                         redis+sentinel:// and redis+cluster:// speak plain TCP, rediss:// is \
                         for one server"
                    .into(),
            });
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

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.prefix.is_empty()
            || self
                .prefix
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
        {
            return Err(Error::Config(format!(
                "key prefix {:?} must be non-empty, without braces or whitespace",
                self.prefix
            )));
        }
        leasehold::store::check_nonzero(&[
            ("op_timeout", self.op_timeout.unwrap_or(DEFAULT_OP_TIMEOUT)),
            ("connect_timeout", self.connect_timeout),
            ("max_reconnect_delay", self.max_reconnect_delay),
            ("keepalive", self.keepalive),
        ])
        .map_err(|e| Error::Config(e.to_string()))?;
        Ok(())
    }
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

    /// The replicated forms are refused before any connection when a setting cannot apply.
    #[tokio::test]
    async fn replicated_forms_refuse_what_they_cannot_do() {
        for url in ["redis+sentinel://h/m", "redis+cluster://h:7000"] {
            let err = RedisConfig::new(url)
                .tls_ca_pem(b"-----BEGIN CERTIFICATE-----".to_vec())
                .connect()
                .await
                .unwrap_err();
            assert!(matches!(err, crate::Error::Config(_)), "{url}: {err}");
            assert!(err.to_string().contains("no TLS support"), "{err}");
        }
        for url in ["rediss+sentinel://:s3cret@h/m", "REDISS+CLUSTER://h:7000"] {
            let err = RedisConfig::new(url).connect().await.unwrap_err();
            assert!(
                matches!(err, crate::Error::InvalidUrl { .. }),
                "{url}: {err}"
            );
            assert!(err.to_string().contains("not supported yet"), "{err}");
            assert!(!err.to_string().contains("s3"), "{err}");
        }
        let err = RedisConfig::new("redis+sentinel://:s3cret@h:26379/")
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(err, crate::Error::InvalidUrl { .. }), "{err}");
        assert!(!err.to_string().contains("s3"), "{err}");
    }
}
