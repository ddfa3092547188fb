//! [`EtcdConfig`]: the settings of an [`EtcdStore`](crate::EtcdStore), and the one parser of
//! `etcd://` URLs.

use std::fmt;
use std::time::Duration;

use leasehold::store::{percent_decode, percent_encode};

use crate::error::{Error, EtcdSetupError, Result};

/// Default key prefix: keys are `leasehold/lease/NAME`, `leasehold/slot/TASK` and
/// `leasehold/hist/TASK\0KEY`.
pub const DEFAULT_PREFIX: &str = "leasehold/";

/// Default time limit of one store operation.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(3);

/// Default client port of an etcd member.
pub const DEFAULT_PORT: u16 = 2379;

/// One etcd member's client address.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Endpoint {
    /// Host name or IP address (an IPv6 address without brackets).
    pub host: String,
    /// Client port.
    pub port: u16,
}

impl Endpoint {
    /// The member at `host:port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A password that never prints: its `Debug` is `"***"` and it has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Self(password.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// Settings of an etcd store. Build with [`EtcdConfig::from_url`] (or [`EtcdConfig::new`]),
/// adjust the fields, then [`connect`](EtcdConfig::connect).
///
/// Its `Debug` and [`describe`](EtcdConfig::describe) show the endpoints, user and options,
/// never the password.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// The members' client addresses; operations go to one and move to the next when it cannot
    /// be reached. At least one.
    pub endpoints: Vec<Endpoint>,
    /// Whether to speak TLS (`etcds://`). Needs the `tls` feature. Default `false`.
    pub tls: bool,
    /// PEM root certificates to trust instead of the system's (a private CA); the URL's
    /// `ca=PATH` fills it. Default `None`.
    pub tls_ca_pem: Option<Vec<u8>>,
    /// User for etcd's authentication (`etcd://user:password@…`). Default `None`: no auth.
    pub user: Option<String>,
    /// The user's password. Default `None`.
    pub password: Option<Password>,
    /// Prefix of every key. Default [`DEFAULT_PREFIX`] (`leasehold/`); the URL's `prefix=`
    /// sets it. Must be non-empty.
    pub prefix: String,
    /// Time limit of each store operation, end to end (failover to another member included),
    /// after which it fails with [`StoreError::Timeout`](leasehold::StoreError::Timeout). Default
    /// [`DEFAULT_OP_TIMEOUT`] (3 s); the URL's `timeout_ms=` sets it.
    pub op_timeout: Duration,
    /// Time limit of opening one connection (TCP and TLS). Default 1 s; the URL's
    /// `connect_timeout_ms=` sets it.
    pub connect_timeout: Duration,
    /// Whether to watch for releases so waiters take over right after a graceful release.
    /// Without it waiters retry at the lease's expiry. Default `true`.
    pub notifications: bool,
    /// Longest pause between attempts to re-establish the watch. Default 2 s.
    pub max_reconnect_delay: Duration,
}

impl EtcdConfig {
    /// Defaults for a cluster with these members.
    pub fn new(endpoints: Vec<Endpoint>) -> Self {
        Self {
            endpoints,
            tls: false,
            tls_ca_pem: None,
            user: None,
            password: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            op_timeout: DEFAULT_OP_TIMEOUT,
            connect_timeout: Duration::from_secs(1),
            notifications: true,
            max_reconnect_delay: Duration::from_secs(2),
        }
    }

    /// Parses `etcd://[user[:password]@]host[:port][,host[:port]…][/][?options]` (`etcds://`
    /// for TLS). The port defaults to 2379; user and password may be percent-encoded. Options:
    /// `prefix=` (key prefix), `timeout_ms=`, `connect_timeout_ms=`, `ca=PATH` (a PEM file of
    /// root certificates, read now), `notifications=false`.
    ///
    /// Errors name what is wrong, never the URL's text, so a password cannot leak through them.
    pub fn from_url(url: &str) -> Result<Self> {
        let invalid = |reason: &str| {
            Error::from(EtcdSetupError::InvalidUrl {
                reason: reason.to_owned(),
            })
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("expected etcd://host:port[,host:port…]"))?;
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(invalid("the scheme must be etcd:// or etcds://")),
        };
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let authority = authority.strip_suffix('/').unwrap_or(authority);
        if authority.contains('/') {
            return Err(invalid(
                "a path is not used; give the key prefix as ?prefix=",
            ));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let mut config = Self::new(Vec::new());
        config.tls = tls;
        if let Some(userinfo) = userinfo {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            let user = percent_decode(user).ok_or_else(|| invalid("bad %-escape in the user"))?;
            if user.is_empty() {
                return Err(invalid("a password needs a user name"));
            }
            config.user = Some(user);
            if let Some(password) = password {
                let password = percent_decode(password)
                    .ok_or_else(|| invalid("bad %-escape in the password"))?;
                config.password = Some(Password(password));
            }
        }
        for host in hosts.split(',') {
            config.endpoints.push(parse_endpoint(host)?);
        }
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value =
                percent_decode(value).ok_or_else(|| invalid("bad %-escape in an option"))?;
            let millis = |what: &str| {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| invalid(&format!("{what} must be a positive number of ms")))
            };
            match key {
                "prefix" => config.prefix = value.clone(),
                "timeout_ms" => config.op_timeout = millis("timeout_ms")?,
                "connect_timeout_ms" => config.connect_timeout = millis("connect_timeout_ms")?,
                "notifications" => {
                    config.notifications = match value.as_str() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(invalid("notifications must be true or false")),
                    }
                }
                "ca" => {
                    let pem = std::fs::read(&value).map_err(|e| {
                        EtcdSetupError::Config(format!("cannot read the CA file {value:?}: {e}"))
                    })?;
                    config.tls_ca_pem = Some(pem);
                }
                // The name is not echoed: a mistyped URL may have a secret there.
                _ => {
                    return Err(invalid(
                        "unknown option; known: prefix, timeout_ms, connect_timeout_ms, ca, notifications",
                    ));
                }
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(EtcdSetupError::Config("no endpoints".into()).into());
        }
        if self.prefix.is_empty() {
            return Err(EtcdSetupError::Config("the key prefix must be non-empty".into()).into());
        }
        leasehold::store::check_nonzero(&[
            ("op_timeout", self.op_timeout),
            ("connect_timeout", self.connect_timeout),
        ])
        .map_err(|e| EtcdSetupError::Config(e.to_string()))?;
        if self.password.is_some() && self.user.is_none() {
            return Err(EtcdSetupError::Config("a password needs a user".into()).into());
        }
        if self.tls && !cfg!(feature = "tls") {
            return Err(EtcdSetupError::Config(
                "etcds:// needs the leasehold-etcd feature `tls`".into(),
            )
            .into());
        }
        Ok(())
    }

    /// The parsed URL without the password: `etcd://user@host:2379,host:2379/?prefix=…`.
    pub fn describe(&self) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        let user = match &self.user {
            Some(user) => format!("{}@", percent_encode(user.as_bytes())),
            None => String::new(),
        };
        let hosts: Vec<String> = self.endpoints.iter().map(ToString::to_string).collect();
        let mut out = format!("{scheme}://{user}{}", hosts.join(","));
        if self.prefix != DEFAULT_PREFIX {
            out.push_str("/?prefix=");
            // A prefix's slashes are shown as they are.
            let segments: Vec<String> = self
                .prefix
                .split('/')
                .map(|s| percent_encode(s.as_bytes()))
                .collect();
            out.push_str(&segments.join("/"));
        }
        out
    }
}

fn parse_endpoint(text: &str) -> Result<Endpoint> {
    let invalid = |reason: &str| {
        Error::from(EtcdSetupError::InvalidUrl {
            reason: reason.to_owned(),
        })
    };
    if text.is_empty() {
        return Err(invalid("empty host"));
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| invalid("unclosed [ in an IPv6 host"))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(invalid("junk after an IPv6 host")),
            },
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let valid_host = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_'));
    if !valid_host {
        return Err(invalid("a host may hold letters, digits, '-', '.', '_'"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid("a port must be a number from 1 to 65535"))?,
    };
    Ok(Endpoint::new(host, port))
}

impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_members_user_and_options() {
        let c = EtcdConfig::from_url(
            "etcd://app:s%40cret@10.0.0.1:2379,etcd-2,[::1]:32379/?prefix=jobs/&timeout_ms=500",
        )
        .unwrap();
        assert_eq!(
            c.endpoints,
            vec![
                Endpoint::new("10.0.0.1", 2379),
                Endpoint::new("etcd-2", 2379),
                Endpoint::new("::1", 32379)
            ]
        );
        assert_eq!(c.user.as_deref(), Some("app"));
        assert_eq!(c.password.as_ref().map(Password::expose), Some("s@cret"));
        assert_eq!(c.prefix, "jobs/");
        assert_eq!(c.op_timeout, Duration::from_millis(500));
        assert!(!c.tls);
        let shown = format!("{} {:?}", c.describe(), c);
        assert!(!shown.contains("cret"), "{shown}");
        assert_eq!(
            c.describe(),
            "etcd://app@10.0.0.1:2379,etcd-2:2379,[::1]:32379/?prefix=jobs/"
        );
        assert!(EtcdConfig::from_url("ETCDS://h").unwrap().tls);
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_them() {
        for url in [
            "http://h:2379",
            "etcd://",
            "etcd://u:SECRET@",
            "etcd://u:SECRET@h:99999",
            "etcd://u:SECRET@h:2379/path",
            "etcd://u:SECRET@h?SECRET=1",
            "etcd://u:SECRET@h?timeout_ms=0",
            "etcd://:SECRET@h",
            "etcd://u:SE%ZZ@h",
            "etcd://u:SECRET@h,,h2",
            "etcd://u:SECRET@h?prefix=",
            "etcd://h:2379 SECRET",
        ] {
            let err = EtcdConfig::from_url(url).expect_err(url);
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("SECRET"), "{url}: {shown}");
        }
    }
}
