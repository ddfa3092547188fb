//! Connection strings read the way tokio-postgres reads them, for two jobs the driver does not
//! do: taking out the parameters the store handles itself (`sslmode=verify-*`, `sslrootcert`),
//! and hiding the password. Both must agree with the driver on where the password is, or a
//! password the driver accepts (say one with an unescaped `/`, or `password = x` with spaces)
//! would be printed.

use std::borrow::Cow;
use std::ops::Range;

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

/// Percent-decodes `s` (invalid escapes are kept as they are).
fn percent_decode(s: &str) -> Cow<'_, str> {
    if !s.contains('%') {
        return Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
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
                if c == '\\' {
                    if let Some(c) = at(j) {
                        j += c.len_utf8();
                    }
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

/// Whether a parameter name may carry a secret (`password`, any case, or anything containing
/// it): its value is never shown.
fn is_secret(key: &str) -> bool {
    key.to_ascii_lowercase().contains("password")
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

/// The connection string with every password replaced by `***`: the one in a URL's
/// credentials, `password` parameters, and in a `key=value` string anything the driver could
/// not parse (it might be part of a password).
pub(crate) fn redact(conn: &str) -> String {
    if let Some(url) = Url::parse(conn) {
        let mut out = String::from(url.scheme);
        if let Some(creds) = url.creds {
            match creds.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                None => out.push_str(creds),
            }
            out.push('@');
        }
        out.push_str(url.location);
        if let Some(query) = url.query {
            let params: Vec<QueryParam<'_>> = query_params(query)
                .into_iter()
                .map(|p| match p.value {
                    Some(_) if is_secret(&percent_decode(p.key)) => QueryParam {
                        key: p.key,
                        value: Some("***"),
                    },
                    _ => p,
                })
                .collect();
            out.push('?');
            out.push_str(&join_query(&params));
        }
        return out;
    }
    if conn.contains("://") {
        return leasehold::store::redact_url(conn);
    }
    let (params, unparsed) = kv_params(conn);
    let mut out = String::with_capacity(conn.len());
    let mut copied = 0;
    for p in &params {
        if is_secret(&conn[p.key.clone()]) {
            out.push_str(&conn[copied..p.value.start]);
            out.push_str("***");
            copied = p.value.end;
        }
    }
    match unparsed {
        Some(at) => {
            out.push_str(&conn[copied..at]);
            out.push_str("***");
        }
        None => out.push_str(&conn[copied..]),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver's view of the password, to check the redaction hides exactly that.
    fn driver_password(conn: &str) -> Option<String> {
        let config: tokio_postgres::Config = conn.parse().ok()?;
        config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
    }

    #[test]
    fn redacts_what_the_driver_takes_as_the_password() {
        for (conn, shown) in [
            ("postgres://u:pw@h/db", "postgres://u:***@h/db"),
            ("postgresql://u:pw@h:5433", "postgresql://u:***@h:5433"),
            ("postgres://u:p/w@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u:p?w@h/db?sslmode=disable",
                "postgres://u:***@h/db?sslmode=disable",
            ),
            ("postgres://u:p#w@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u@h/db?password=pw&x=1",
                "postgres://u@h/db?password=***&x=1",
            ),
            (
                "postgres://u@h/db?pass%77ord=pw",
                "postgres://u@h/db?pass%77ord=***",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            (
                "postgres://h/db?application_name=a",
                "postgres://h/db?application_name=a",
            ),
            ("host=h password=pw user=u", "host=h password=*** user=u"),
            (
                "host=h password = pw user=u",
                "host=h password = *** user=u",
            ),
            ("host=h password='p w' user=u", "host=h password=*** user=u"),
            (
                "host=h password='it\\'s' user=u",
                "host=h password=*** user=u",
            ),
            ("host=h password=p\\ w user=u", "host=h password=*** user=u"),
            ("host=h password='unterminated", "host=h ***"),
            ("host=h password pw", "host=h ***"),
            ("user=u =pw", "user=u ***"),
        ] {
            assert_eq!(redact(conn), shown, "{conn}");
            if let Some(pw) = driver_password(conn) {
                assert!(!redact(conn).contains(&pw), "{conn}: {pw}");
            }
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
