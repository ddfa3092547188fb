//! The multi-host URL forms, which the `redis` crate's single-server parser does not take:
//! [`SentinelUrl`] (`redis+sentinel://`) and [`ClusterUrl`] (`redis+cluster://`). Each has one
//! parser; the password is kept apart and never displayed.

use std::fmt;

use percent_encoding::percent_decode_str;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, RedisResult};

use crate::error::{Error, RedisSetupError, Result};

/// Scheme of a Sentinel URL.
pub const SENTINEL_SCHEME: &str = "redis+sentinel";
/// Scheme of a Redis Cluster URL.
pub const CLUSTER_SCHEME: &str = "redis+cluster";

/// Credentials from a URL's user part. `Debug` and `Display` never show the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl Credentials {
    /// The settings for a data node, with database `db`.
    pub(crate) fn redis_info(&self, db: i64) -> RedisConnectionInfo {
        let mut info = RedisConnectionInfo::default().set_db(db);
        if let Some(user) = &self.username {
            info = info.set_username(user);
        }
        if let Some(password) = &self.password {
            info = info.set_password(password);
        }
        info
    }
}

/// The connection settings of each TCP node, all with `credentials` and database 0.
pub(crate) fn node_infos(
    hosts: &[(String, u16)],
    credentials: &Credentials,
) -> RedisResult<Vec<ConnectionInfo>> {
    hosts
        .iter()
        .map(|(host, port)| {
            let info = ConnectionAddr::Tcp(host.clone(), *port).into_connection_info()?;
            Ok(info.set_redis_settings(credentials.redis_info(0)))
        })
        .collect()
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "set"))
            .finish()
    }
}

/// `redis+sentinel://[user:password@]host[:port][,host[:port]…]/MASTER[?db=N][&sentinel_user=U]
/// [&sentinel_password=P][&prefix=P]`: the sentinels (default port 26379) that know the primary named
/// `MASTER`. The user and password are those of the primary and its replicas; the sentinels are
/// asked with `sentinel_user`/`sentinel_password` (percent-encoded; a sentinel's `requirepass`),
/// else without credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The sentinels, in the URL's order.
    pub sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the primary under.
    pub master: String,
    /// The database to select on the primary.
    pub db: i64,
    /// The key prefix the URL names (`prefix=`), if any.
    pub prefix: Option<String>,
    pub(crate) credentials: Credentials,
    /// For the sentinels themselves.
    pub(crate) sentinel_credentials: Credentials,
}

/// `redis+cluster://[user:password@]host[:port][,host[:port]…][?prefix=P]`: seed nodes of a
/// Redis Cluster (default port 6379); the client learns the others from them. Database 0 only,
/// as in every cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterUrl {
    /// The seed nodes, in the URL's order.
    pub nodes: Vec<(String, u16)>,
    /// The key prefix the URL names (`prefix=`), if any.
    pub prefix: Option<String>,
    pub(crate) credentials: Credentials,
}

/// A URL split into its parts, not yet checked against its form.
struct Parts<'a> {
    credentials: Credentials,
    hosts: Vec<(String, u16)>,
    /// After the authority, without the leading `/`.
    path: &'a str,
    query: Vec<(&'a str, &'a str)>,
}

fn invalid(scheme: &str, reason: impl Into<String>) -> Error {
    RedisSetupError::InvalidUrl {
        url: format!("{scheme}://…"),
        reason: reason.into(),
    }
    .into()
}

fn decode(scheme: &str, s: &str, what: &str) -> Result<String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            invalid(
                scheme,
                format!("the {what} is not UTF-8 once percent-decoded"),
            )
        })
}

/// Splits `scheme://[userinfo@]h[:p][,h[:p]…][/path][?query]`. The user part ends at the last
/// `@`, so a password may hold any character but must percent-encode none.
fn split<'a>(url: &'a str, scheme: &str, default_port: u16) -> Result<Parts<'a>> {
    let rest = url
        .get(..scheme.len())
        .filter(|s| s.eq_ignore_ascii_case(scheme))
        .and_then(|_| url[scheme.len()..].strip_prefix("://"))
        .ok_or_else(|| invalid(scheme, format!("must start with {scheme}://")))?;
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let credentials = match userinfo {
        None => Credentials::default(),
        Some(info) => {
            let (user, password) = match info.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (info, None),
            };
            Credentials {
                username: (!user.is_empty())
                    .then(|| decode(scheme, user, "user name"))
                    .transpose()?,
                password: password
                    .filter(|p| !p.is_empty())
                    .map(|p| decode(scheme, p, "password"))
                    .transpose()?,
            }
        }
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(end);
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, q),
        None => (rest, ""),
    };
    let path = path.strip_prefix('/').unwrap_or(path);
    let hosts = authority
        .split(',')
        .map(|h| host_port(scheme, h, default_port))
        .collect::<Result<Vec<_>>>()?;
    let query = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
        .collect();
    Ok(Parts {
        credentials,
        hosts,
        path,
        query,
    })
}

fn host_port(scheme: &str, s: &str, default_port: u16) -> Result<(String, u16)> {
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| invalid(scheme, format!("host {s:?} lacks its closing ']'")))?;
        (host, after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(invalid(
            scheme,
            "expected host[:port] entries separated by commas, found an empty or blank host",
        ));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| invalid(scheme, format!("port {p:?} of {host} is not 1-65535")))?,
    };
    Ok((host.to_owned(), port))
}

/// Reads a `prefix=` parameter (percent-encoded) into `prefix`, which must not have one yet.
fn set_prefix(prefix: &mut Option<String>, scheme: &str, value: &str) -> Result<()> {
    if prefix.is_some() {
        return Err(invalid(scheme, "prefix= is given twice"));
    }
    *prefix = Some(decode(scheme, value, "prefix")?);
    Ok(())
}

/// The `prefix=` of a one-server URL (`redis://`, `rediss://`, `redis+unix://`, `unix://`),
/// which the `redis` crate's parser passes over. `None` when the URL has none or does not
/// parse (the driver then says why).
pub(crate) fn single_server_prefix(url: &str) -> Result<Option<String>> {
    let scheme = url.split_once("://").map_or("redis", |(s, _)| s);
    let Some(query) = redis::parse_redis_url(url).and_then(|u| u.query().map(str::to_owned)) else {
        return Ok(None);
    };
    let mut prefix = None;
    for pair in query.split('&') {
        if let Some(("prefix", value)) = pair.split_once('=') {
            set_prefix(&mut prefix, scheme, value)?;
        } else if pair == "prefix" {
            return Err(invalid(scheme, "prefix= names no prefix"));
        }
    }
    Ok(prefix)
}

fn hosts_display(hosts: &[(String, u16)]) -> String {
    hosts
        .iter()
        .map(|(h, p)| {
            if h.contains(':') {
                format!("[{h}]:{p}")
            } else {
                format!("{h}:{p}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn user_display(c: &Credentials) -> String {
    c.username
        .as_deref()
        .map(|u| format!("{u}@"))
        .unwrap_or_default()
}

impl SentinelUrl {
    /// Parses a `redis+sentinel://` URL.
    pub fn parse(url: &str) -> Result<Self> {
        let s = SENTINEL_SCHEME;
        let parts = split(url, s, 26379)?;
        if parts.path.is_empty() || parts.path.contains('/') {
            return Err(invalid(
                s,
                "expected the primary's name as the path: redis+sentinel://host:26379/MASTER",
            ));
        }
        let master = decode(s, parts.path, "primary's name")?;
        let mut db = 0;
        let mut sentinel_credentials = Credentials::default();
        let mut prefix = None;
        for (key, value) in parts.query {
            match key {
                "prefix" => set_prefix(&mut prefix, s, value)?,
                "db" => {
                    db = value.parse().ok().filter(|d| *d >= 0).ok_or_else(|| {
                        invalid(s, format!("db={value:?} is not a database number"))
                    })?
                }
                "sentinel_user" => {
                    sentinel_credentials.username = Some(decode(s, value, "sentinel user")?)
                }
                "sentinel_password" => {
                    sentinel_credentials.password = Some(decode(s, value, "sentinel password")?)
                }
                other => {
                    return Err(invalid(
                        s,
                        format!(
                            "unknown query parameter {other:?} (known: db, sentinel_user, \
                             sentinel_password, prefix)"
                        ),
                    ));
                }
            }
        }
        Ok(Self {
            sentinels: parts.hosts,
            master,
            db,
            prefix,
            credentials: parts.credentials,
            sentinel_credentials,
        })
    }
}

impl ClusterUrl {
    /// Parses a `redis+cluster://` URL.
    pub fn parse(url: &str) -> Result<Self> {
        let s = CLUSTER_SCHEME;
        let parts = split(url, s, 6379)?;
        if !parts.path.is_empty() && parts.path != "0" {
            return Err(invalid(
                s,
                format!(
                    "a Redis Cluster has only database 0, so the url takes no path (found /{})",
                    parts.path
                ),
            ));
        }
        let mut prefix = None;
        for (key, value) in parts.query {
            match key {
                "prefix" => set_prefix(&mut prefix, s, value)?,
                other => {
                    return Err(invalid(
                        s,
                        format!("unknown query parameter {other:?} (known: prefix)"),
                    ));
                }
            }
        }
        Ok(Self {
            nodes: parts.hosts,
            prefix,
            credentials: parts.credentials,
        })
    }
}

/// The URL without its password.
impl fmt::Display for SentinelUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SENTINEL_SCHEME}://{}{}/{}?db={}",
            user_display(&self.credentials),
            hosts_display(&self.sentinels),
            self.master,
            self.db
        )
    }
}

/// The URL without its password.
impl fmt::Display for ClusterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{CLUSTER_SCHEME}://{}{}",
            user_display(&self.credentials),
            hosts_display(&self.nodes)
        )
    }
}

impl fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SentinelUrl({self})")
    }
}

impl fmt::Debug for ClusterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_parse_and_hide_the_password() {
        let u = SentinelUrl::parse(
            "redis+sentinel://app:s3cr%40t:x@10.0.0.1,10.0.0.2:26380,[::1]:26381/my%20primary?db=3",
        )
        .unwrap();
        assert_eq!(
            u.sentinels,
            vec![
                ("10.0.0.1".to_owned(), 26379),
                ("10.0.0.2".to_owned(), 26380),
                ("::1".to_owned(), 26381)
            ]
        );
        assert_eq!((u.master.as_str(), u.db), ("my primary", 3));
        assert_eq!(u.credentials.username.as_deref(), Some("app"));
        assert_eq!(u.credentials.password.as_deref(), Some("s3cr@t:x"));
        let shown = format!("{u} {u:?}");
        assert!(!shown.contains("s3"), "{shown}");
        assert!(shown.starts_with(
            "redis+sentinel://app@10.0.0.1:26379,10.0.0.2:26380,[::1]:26381/my primary?db=3"
        ));
        let plain = SentinelUrl::parse("redis+sentinel://:pw@h/m").unwrap();
        assert_eq!(plain.credentials.username, None);
        assert_eq!(plain.to_string(), "redis+sentinel://h:26379/m?db=0");
        let guarded =
            SentinelUrl::parse("redis+sentinel://h/m?sentinel_user=watch&sentinel_password=s3%26x")
                .unwrap();
        assert_eq!(
            guarded.sentinel_credentials.username.as_deref(),
            Some("watch")
        );
        assert_eq!(
            guarded.sentinel_credentials.password.as_deref(),
            Some("s3&x")
        );
        assert_eq!(guarded.credentials, Credentials::default());
        let shown = format!("{guarded} {guarded:?}");
        assert!(!shown.contains("s3"), "{shown}");
        assert_eq!(
            SentinelUrl::parse("REDIS+Sentinel://h/m")
                .unwrap()
                .to_string(),
            plain.to_string()
        );
    }

    #[test]
    fn cluster_urls_parse_and_hide_the_password() {
        let u = ClusterUrl::parse("redis+cluster://:s3cret@a:7000,b,[fe80::1]:7002/").unwrap();
        assert_eq!(
            u.nodes,
            vec![
                ("a".to_owned(), 7000),
                ("b".to_owned(), 6379),
                ("fe80::1".to_owned(), 7002)
            ]
        );
        assert_eq!(u.credentials.password.as_deref(), Some("s3cret"));
        assert_eq!(
            u.to_string(),
            "redis+cluster://a:7000,b:6379,[fe80::1]:7002"
        );
        assert!(!format!("{u:?}").contains("s3"));
    }

    #[test]
    fn malformed_urls_are_refused_with_a_reason() {
        for (url, reason) in [
            ("redis+sentinel://h:26379", "primary's name"),
            ("redis+sentinel://h:26379/", "primary's name"),
            ("redis+sentinel://h/m/x", "primary's name"),
            ("redis+sentinel://h:0/m", "not 1-65535"),
            ("redis+sentinel://h:port/m", "not 1-65535"),
            ("redis+sentinel://h,,i/m", "empty or blank host"),
            ("redis+sentinel://h/m?db=x", "not a database number"),
            (
                "redis+sentinel://h/m?pass=s3cret",
                "unknown query parameter",
            ),
            ("redis+sentinel://[::1/m", "closing ']'"),
            ("redis+cluster://a:7000/2", "only database 0"),
            ("redis+cluster://a:7000?x=1", "unknown query parameter"),
            ("redis+cluster://:s3cret@", "empty or blank host"),
            ("redis+cluster:/a", "must start with redis+cluster://"),
        ] {
            let err = if url.starts_with(SENTINEL_SCHEME) {
                SentinelUrl::parse(url).map(|_| ())
            } else {
                ClusterUrl::parse(url).map(|_| ())
            }
            .expect_err(url)
            .to_string();
            assert!(err.contains(reason), "{url}: {err}");
            assert!(!err.contains("s3"), "{url}: {err}");
        }
    }
}
