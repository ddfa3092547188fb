//! Connection strings: the store reads them with tokio-postgres's own parser and shows only the
//! parsed result ([`describe`]: user, hosts, ports, database, sslmode), which has no password in
//! it. Two jobs the driver does not do are here: taking out the parameters the store handles
//! itself (`sslmode=verify-*`, `sslrootcert`), which must agree with the driver on where each
//! parameter (and the password) is, and refusing the URLs the driver would split in the wrong
//! place, putting part of a password where a user or host name is shown.

use std::borrow::Cow;
use std::ops::Range;

use leasehold::store::percent_encode;

/// A `postgres://` or `postgresql://` URL, split where tokio-postgres splits it: the
/// credentials run to the *first* `@` anywhere in the rest, and the query starts at the first
/// `?` after them.
struct Url<'a> {
    /// `postgres://` or `postgresql://`.
    scheme: &'a str,
    /// `user[:password]`, without the `@`.
    creds: Option<&'a str>,
    /// `host[:port][/dbname]`.
    location: &'a str,
    /// After the `?`.
    query: Option<&'a str>,
}

impl<'a> Url<'a> {
    fn parse(s: &'a str) -> Option<Self> {
        let scheme_len = ["postgres://", "postgresql://"]
            .iter()
            .find(|p| s.starts_with(**p))?
            .len();
        let (scheme, rest) = s.split_at(scheme_len);
        let (creds, after) = match rest.split_once('@') {
            Some((creds, after)) => (Some(creds), after),
            None => (None, rest),
        };
        let (location, query) = match after.split_once('?') {
            Some((location, query)) => (location, Some(query)),
            None => (after, None),
        };
        Some(Self {
            scheme,
            creds,
            location,
            query,
        })
    }
}

/// One parameter of a URL query, as the driver reads it: the key runs to the next `=` (even
/// past an `&`), the value to the next `&`. `value` is `None` for a tail without `=` (the
/// driver rejects it).
struct QueryParam<'a> {
    key: &'a str,
    value: Option<&'a str>,
}

fn query_params(query: &str) -> Vec<QueryParam<'_>> {
    let mut out = Vec::new();
    let mut rest = query;
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            out.push(QueryParam {
                key: rest,
                value: None,
            });
            break;
        };
        let (value, after) = after.split_once('&').unwrap_or((after, ""));
        out.push(QueryParam {
            key,
            value: Some(value),
        });
        rest = after;
    }
    out
}

fn join_query(params: &[QueryParam<'_>]) -> String {
    params
        .iter()
        .map(|p| match p.value {
            Some(v) => format!("{}={v}", p.key),
            None => p.key.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-decodes `s` as the driver does: a `%` without two hex digits after it is kept as it
/// is.
fn percent_decode(s: &str) -> Cow<'_, str> {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy()
}

/// One `key = value` of a `key=value` connection string, as byte ranges into it.
struct KvParam {
    /// The whole parameter, from the key to the end of the value.
    span: Range<usize>,
    key: Range<usize>,
    /// The value as written (with its quotes and backslashes).
    value: Range<usize>,
}

/// Splits a `key=value` connection string as tokio-postgres does (whitespace around `=`,
/// `'quoted values'`, backslash escapes). Also returns where the driver would stop
/// understanding it (a parse error, or a stray `=`), if it does.
fn kv_params(s: &str) -> (Vec<KvParam>, Option<usize>) {
    let at = |i: usize| s[i..].chars().next();
    let skip_ws = |mut i: usize| {
        while let Some(c) = at(i).filter(|c| c.is_whitespace()) {
            i += c.len_utf8();
        }
        i
    };
    let mut params = Vec::new();
    let mut i = 0;
    loop {
        i = skip_ws(i);
        if i == s.len() {
            return (params, None);
        }
        let start = i;
        let mut key_end = i;
        while let Some(c) = at(key_end).filter(|c| !c.is_whitespace() && *c != '=') {
            key_end += c.len_utf8();
        }
        if key_end == start {
            return (params, Some(start));
        }
        let mut j = skip_ws(key_end);
        if at(j) != Some('=') {
            return (params, Some(start));
        }
        j = skip_ws(j + 1);
        let value_start = j;
        if at(j) == Some('\'') {
            j += 1;
            loop {
                match at(j) {
                    None => return (params, Some(start)),
                    Some('\'') => {
                        j += 1;
                        break;
                    }
                    Some('\\') => {
                        j += 1;
                        if let Some(c) = at(j) {
                            j += c.len_utf8();
                        }
                    }
                    Some(c) => j += c.len_utf8(),
                }
            }
        } else {
            while let Some(c) = at(j).filter(|c| !c.is_whitespace()) {
                j += c.len_utf8();
                if c == '\\'
                    && let Some(c) = at(j)
                {
                    j += c.len_utf8();
                }
            }
            if j == value_start {
                return (params, Some(start));
            }
        }
        params.push(KvParam {
            span: start..j,
            key: start..key_end,
            value: value_start..j,
        });
        i = j;
    }
}

/// A value as written in a `key=value` string, without its quotes and backslashes.
fn kv_unescape(raw: &str) -> String {
    let inner = raw
        .strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .unwrap_or(raw);
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Removes the parameters `keys` (any case) from a URL's query string or a `key=value` string,
/// returning the rest and the values found (in the order of `keys`), decoded.
pub(crate) fn take_params(conn: &str, keys: &[&str]) -> (String, Vec<Option<String>>) {
    let mut found = vec![None; keys.len()];
    let wanted = |key: &str| keys.iter().position(|k| k.eq_ignore_ascii_case(key));
    if let Some(url) = Url::parse(conn) {
        let Some(query) = url.query else {
            return (conn.to_owned(), found);
        };
        let mut kept = Vec::new();
        for p in query_params(query) {
            match (wanted(&percent_decode(p.key)), p.value) {
                (Some(i), Some(v)) => found[i] = Some(percent_decode(v).into_owned()),
                _ => kept.push(p),
            }
        }
        let mut out = String::from(url.scheme);
        if let Some(creds) = url.creds {
            out.push_str(creds);
            out.push('@');
        }
        out.push_str(url.location);
        if !kept.is_empty() {
            out.push('?');
            out.push_str(&join_query(&kept));
        }
        return (out, found);
    }
    if conn.contains("://") {
        // Not a URL the driver knows; let it report that.
        return (conn.to_owned(), found);
    }
    let (params, _) = kv_params(conn);
    let mut out = String::with_capacity(conn.len());
    let mut copied = 0;
    for p in &params {
        if let Some(i) = wanted(&conn[p.key.clone()]) {
            found[i] = Some(kv_unescape(&conn[p.value.clone()]));
            out.push_str(&conn[copied..p.span.start]);
            // Drop the whitespace after it too (values keep theirs: a quoted password may
            // have any).
            copied =
                p.span.end + (conn[p.span.end..].len() - conn[p.span.end..].trim_start().len());
        }
    }
    out.push_str(&conn[copied..]);
    (out.trim_end().to_owned(), found)
}

/// Refuses a URL that tokio-postgres would split so that part of the password lands in a name
/// the store shows. The driver ends the credentials at the *first* `@` in the whole string, so
/// an unencoded `@` in a password leaves the rest of the password in the host, database or
/// parameters, and an `@` after the host (with no credentials before it) makes the host, path
/// and query the user name. Unencoded `/ ? # :` in a password are fine: the credentials run to
/// the first `@` whatever they contain. Not a URL: nothing to check.
pub(crate) fn check_url(conn: &str) -> Result<(), &'static str> {
    let Some(url) = Url::parse(conn) else {
        return Ok(());
    };
    let Some(creds) = url.creds else {
        return Ok(());
    };
    let user = creds.split_once(':').map_or(creds, |(user, _)| user);
    if user.contains(['/', '?']) {
        return Err("an `@` after the host or database name: percent-encode it as %40");
    }
    let after = &conn[url.scheme.len() + creds.len() + 1..];
    if creds.contains(':') && after.contains('@') {
        return Err(
            "more than one `@`: percent-encode an `@` in the password (or anywhere after it) as %40",
        );
    }
    Ok(())
}

/// Whether `conn` may carry a password: a `password` parameter or a URL's `user:password@`.
/// Parse errors then leave out text quoted from it (an unquoted space or `&` in a password
/// makes its tail look like an option name to the driver).
fn holds_password(conn: &str) -> bool {
    conn.to_ascii_lowercase().contains("password")
        || Url::parse(conn).is_some_and(|u| u.creds.is_some_and(|c| c.contains(':')))
}

/// Why the driver could not read `conn`, without quoting any of it: "unexpected character at
/// byte 9: expected `=`" (not the character), "unknown option `x`" only when `conn` has no
/// password.
pub(crate) fn parse_reason(e: &tokio_postgres::Error, conn: &str) -> String {
    let text = std::error::Error::source(e).map_or_else(|| e.to_string(), ToString::to_string);
    let text = text.split(" but got").next().unwrap_or_default();
    if text.starts_with("unknown option") && holds_password(conn) {
        return "unknown option (its name is not shown: it may be part of the password)".to_owned();
    }
    text.to_owned()
}

/// The parsed connection as a URL without a password: `postgres://user@host:port/dbname`
/// (several hosts comma-separated, a Unix socket directory percent-encoded as libpq writes it,
/// `?sslmode=` when one was given). Built from the driver's parsed config, never from the text
/// the user typed, and without reading its password.
pub(crate) fn describe(pg: &tokio_postgres::Config, sslmode: Option<&str>) -> String {
    use tokio_postgres::config::Host;
    let mut out = String::from("postgres://");
    if let Some(user) = pg.get_user() {
        out.push_str(&percent_encode(user.as_bytes()));
        out.push('@');
    }
    let ports = pg.get_ports();
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let name = match host {
                Host::Tcp(h) if h.contains(':') => format!("[{h}]"),
                Host::Tcp(h) => h.clone(),
                #[cfg(unix)]
                Host::Unix(path) => {
                    use std::os::unix::ffi::OsStrExt;
                    percent_encode(path.as_os_str().as_bytes())
                }
            };
            let port = ports
                .get(i)
                .or_else(|| (ports.len() == 1).then(|| &ports[0]))
                .copied()
                .unwrap_or(5432);
            format!("{name}:{port}")
        })
        .collect();
    out.push_str(&hosts.join(","));
    if let Some(db) = pg.get_dbname() {
        out.push('/');
        out.push_str(&percent_encode(db.as_bytes()));
    }
    let addrs: Vec<String> = pg.get_hostaddrs().iter().map(ToString::to_string).collect();
    let mut query = Vec::new();
    if !addrs.is_empty() {
        query.push(format!("hostaddr={}", addrs.join(",")));
    }
    if let Some(mode) = sslmode {
        query.push(format!("sslmode={}", percent_encode(mode.as_bytes())));
    }
    if !query.is_empty() {
        out.push('?');
        out.push_str(&query.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(conn: &str) -> tokio_postgres::Config {
        conn.parse().unwrap()
    }

    #[test]
    fn describes_the_parsed_form_without_the_password() {
        for (conn, shown) in [
            ("postgres://u:pw@h/db", "postgres://u@h:5432/db"),
            ("postgresql://u:pw@h:5433", "postgres://u@h:5433"),
            ("postgres://u:p/w@h/db", "postgres://u@h:5432/db"),
            ("postgres://u:p?w@h/db", "postgres://u@h:5432/db"),
            ("postgres://u:p#w@h/db", "postgres://u@h:5432/db"),
            ("postgres://u:p:w@h/db", "postgres://u@h:5432/db"),
            ("postgres://u:p%40w@h/db", "postgres://u@h:5432/db"),
            (
                "postgres://u@h/db?password=pw&dbname=x",
                "postgres://u@h:5432/x",
            ),
            (
                "postgres://u@h1:1,[::1]:2/db",
                "postgres://u@h1:1,[::1]:2/db",
            ),
            (
                "postgres://u@%2Frun%2Fpostgresql/db",
                "postgres://u@%2Frun%2Fpostgresql:5432/db",
            ),
            (
                "host=/run/postgresql user=app dbname=a",
                "postgres://app@%2Frun%2Fpostgresql:5432/a",
            ),
            ("host=h port=6 password='p w' user=u", "postgres://u@h:6"),
            (
                "hostaddr=127.0.0.1 user=u",
                "postgres://u@?hostaddr=127.0.0.1",
            ),
        ] {
            let config = parsed(conn);
            assert_eq!(describe(&config, None), shown, "{conn}");
        }
        assert_eq!(
            describe(&parsed("postgres://u@h/d b"), Some("verify-full")),
            "postgres://u@h:5432/d%20b?sslmode=verify-full"
        );
    }

    #[test]
    fn refuses_urls_the_driver_splits_inside_a_password() {
        for conn in [
            "postgres://u:p@w@h/db",
            "postgres://u:p@w/x@h/db",
            "postgres://u:p@w?application_name=x@h/db",
            "postgres://h/db?password=p@w",
        ] {
            assert!(check_url(conn).is_err(), "{conn}");
        }
        for conn in [
            "postgres://u:p/w?x#y:z@h/db",
            "postgres://u@h/db?password=p@w",
            "postgres://h/db",
            "host=h password=p@w",
        ] {
            assert_eq!(check_url(conn), Ok(()), "{conn}");
        }
    }

    #[test]
    fn takes_out_the_store_s_own_parameters() {
        let keys = &["sslmode", "sslrootcert"];
        let (rest, found) = take_params(
            "postgres://u:p@h/db?sslmode=verify-full&application_name=x",
            keys,
        );
        assert_eq!(rest, "postgres://u:p@h/db?application_name=x");
        assert_eq!(found, vec![Some("verify-full".to_owned()), None]);
        // A `?` in an unescaped password is not the query.
        let (rest, found) = take_params("postgres://u:p?x@h/db?sslmode=require", keys);
        assert_eq!(rest, "postgres://u:p?x@h/db");
        assert_eq!(found[0].as_deref(), Some("require"));
        let (rest, found) = take_params(
            "postgres://h/db?sslrootcert=%2Fetc%2Fca.pem&sslmode=verify-ca",
            keys,
        );
        assert_eq!(rest, "postgres://h/db");
        assert_eq!(found[1].as_deref(), Some("/etc/ca.pem"));
        let (rest, found) = take_params("host=h sslmode = require user=u", keys);
        assert_eq!(rest, "host=h user=u");
        assert_eq!(found[0].as_deref(), Some("require"));
        let (rest, found) = take_params(
            "host=h password='a sslmode=require b' sslrootcert='/my ca.pem'",
            keys,
        );
        assert_eq!(rest, "host=h password='a sslmode=require b'");
        assert_eq!(found, vec![None, Some("/my ca.pem".to_owned())]);
        let (rest, _) = take_params("postgres://h/db?sslmode=disable", keys);
        assert_eq!(rest, "postgres://h/db");
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
        assert_eq!(percent_decode("plain"), "plain");
    }
}
