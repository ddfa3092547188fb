//! PostgreSQL URLs: `--postgres-url` parsed once by the driver's own parser
//! (`tokio_postgres::Config`), and the URLs the harness hands out built from that parsed form.
//!
//! The harness never splits URL text: it reads the server's address from the parsed config and
//! writes a new URL for each address it needs (the server itself for its own view of the lease,
//! the fault proxy for the replicas). Errors say what is wrong without the text the user typed,
//! and no URL is printed: the replicas get theirs in their environment, not on their command
//! line.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use tokio_postgres::Config;
use tokio_postgres::config::{Host, SslMode};

/// Why a `--postgres-url` cannot be used. No variant carries the URL or any part of it but the
/// host name, so none can show a password.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PgUrlError {
    /// The driver's parser refused it.
    #[error(
        "--postgres-url is not a PostgreSQL URL (postgres://user[:password]@host[:port]/database) or connection string"
    )]
    Unparsable,
    /// It names no server, or a Unix socket (the fault proxy forwards TCP).
    #[error("--postgres-url must name one server by TCP host (and port), not a Unix socket")]
    NotTcp,
    /// It names more than one server.
    #[error("--postgres-url must name one server, not {0}")]
    SeveralHosts(usize),
    /// The host name does not resolve.
    #[error("cannot resolve {0}")]
    Unresolved(String),
    /// The host is not on this machine.
    #[error("{0} is not a loopback address; chaos runs stay on this machine")]
    NotLoopback(String),
}

/// `--postgres-url`, parsed: the server's address, and everything else a client needs.
#[derive(Debug, Clone)]
pub(crate) struct PgTarget {
    /// The server's loopback address.
    pub(crate) addr: SocketAddr,
    config: Config,
}

impl PgTarget {
    /// Parses a URL (or key=value connection string) with the driver's parser.
    pub(crate) fn parse(url: &str) -> Result<Self, PgUrlError> {
        let config = Config::from_str(url).map_err(|_| PgUrlError::Unparsable)?;
        Self::of(config)
    }

    /// A server of this machine's, with a user and a database (no password).
    pub(crate) fn local(addr: SocketAddr, user: &str, dbname: &str) -> Self {
        let mut config = Config::new();
        config
            .host(addr.ip().to_string())
            .port(addr.port())
            .user(user)
            .dbname(dbname);
        Self { addr, config }
    }

    /// A parsed config naming one TCP server on this machine.
    pub(crate) fn of(config: Config) -> Result<Self, PgUrlError> {
        let host = match config.get_hosts() {
            [] => return Err(PgUrlError::NotTcp),
            [Host::Tcp(h)] => h.clone(),
            [_] => return Err(PgUrlError::NotTcp),
            many => return Err(PgUrlError::SeveralHosts(many.len())),
        };
        let port = match config.get_ports() {
            [] => 5432,
            [p] => *p,
            many => return Err(PgUrlError::SeveralHosts(many.len())),
        };
        let ip = match config.get_hostaddrs() {
            [] => None,
            [ip] => Some(*ip),
            many => return Err(PgUrlError::SeveralHosts(many.len())),
        };
        let addr = loopback_addr(&host, ip, port)?;
        Ok(Self { addr, config })
    }

    /// A URL for the same database, user, password and options at `addr`.
    pub(crate) fn url_at(&self, addr: SocketAddr) -> String {
        let c = &self.config;
        let enc = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
        let mut url = String::from("postgres://");
        if let Some(user) = c.get_user() {
            url += &enc(user);
            if let Some(pw) = c.get_password() {
                url.push(':');
                url += &percent_encoding::percent_encode(pw, NON_ALPHANUMERIC).to_string();
            }
            url.push('@');
        }
        url += &addr.to_string();
        if let Some(db) = c.get_dbname() {
            url.push('/');
            url += &enc(db);
        }
        let mut params = Vec::new();
        if let Some(o) = c.get_options() {
            params.push(format!("options={}", enc(o)));
        }
        if let Some(a) = c.get_application_name() {
            params.push(format!("application_name={}", enc(a)));
        }
        if c.get_ssl_mode() == SslMode::Require {
            params.push("sslmode=require".into());
        }
        if !params.is_empty() {
            url.push('?');
            url += &params.join("&");
        }
        url
    }
}

/// The loopback address of `host` (or of its `hostaddr`), or why there is none.
fn loopback_addr(host: &str, ip: Option<IpAddr>, port: u16) -> Result<SocketAddr, PgUrlError> {
    let addr = match ip {
        Some(ip) => SocketAddr::new(ip, port),
        None => {
            let mut addrs = (host, port)
                .to_socket_addrs()
                .map_err(|_| PgUrlError::Unresolved(host.to_owned()))?
                .peekable();
            if addrs.peek().is_none() {
                return Err(PgUrlError::Unresolved(host.to_owned()));
            }
            addrs
                .find(|a| a.ip().is_loopback())
                .ok_or_else(|| PgUrlError::NotLoopback(format!("{host}:{port}")))?
        }
    };
    if !addr.ip().is_loopback() {
        return Err(PgUrlError::NotLoopback(addr.to_string()));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROXY: &str = "127.0.0.1:40001";

    /// Parses the URL the harness built, as the store will.
    fn reparse(url: &str) -> Config {
        Config::from_str(url).expect("the harness's URL parses")
    }

    #[test]
    fn urls_are_rebuilt_at_the_proxy_with_every_credential() {
        let password = "p/w@0rd?#%& :x";
        let url = "postgres://us%40er:p%2Fw%400rd%3F%23%25%26%20%3Ax@127.0.0.1:5433/te%2Fst\
                   ?application_name=chaos%20app&options=-c%20search_path%3Dx";
        let t = PgTarget::parse(url).unwrap();
        assert_eq!(t.addr, "127.0.0.1:5433".parse().unwrap());
        let c = reparse(&t.url_at(PROXY.parse().unwrap()));
        assert_eq!(c.get_hosts(), [Host::Tcp("127.0.0.1".into())]);
        assert_eq!(c.get_ports(), [40001]);
        assert_eq!(c.get_user(), Some("us@er"));
        assert_eq!(c.get_password(), Some(password.as_bytes()));
        assert_eq!(c.get_dbname(), Some("te/st"));
        assert_eq!(c.get_application_name(), Some("chaos app"));
        assert_eq!(c.get_options(), Some("-c search_path=x"));
        // At the server itself (the harness's own view of the lease).
        let c = reparse(&t.url_at(t.addr));
        assert_eq!(c.get_ports(), [5433]);
        assert_eq!(c.get_password(), Some(password.as_bytes()));
    }

    #[test]
    fn every_form_names_its_server() {
        let at = |url: &str| PgTarget::parse(url).map(|t| t.addr);
        let pg = |s: &str| Ok(s.parse::<SocketAddr>().unwrap());
        assert_eq!(
            at("postgres://postgres@127.0.0.1/test"),
            pg("127.0.0.1:5432")
        );
        assert_eq!(at("postgresql://localhost:6000/db"), pg("127.0.0.1:6000"));
        assert_eq!(at("postgres://u:pw@[::1]:5433/db"), pg("[::1]:5433"));
        assert_eq!(
            at("host=127.0.0.1 port=5434 user=postgres password=s3cret dbname=test"),
            pg("127.0.0.1:5434")
        );
        assert_eq!(
            at("postgres://u@db.invalid:5435/x?hostaddr=127.0.0.1"),
            pg("127.0.0.1:5435")
        );
        // Key=value form in, URL form out: what the store crates open.
        let t =
            PgTarget::parse("host=127.0.0.1 user=postgres password=s3cret dbname=test").unwrap();
        let c = reparse(&t.url_at(t.addr));
        assert_eq!(c.get_password(), Some(&b"s3cret"[..]));
        // No user: none in the URL either.
        let t = PgTarget::parse("postgres://127.0.0.1/test").unwrap();
        assert_eq!(t.url_at(t.addr), "postgres://127.0.0.1:5432/test");
    }

    #[test]
    fn bad_urls_are_refused_without_showing_them() {
        let secret = "hunter2secret";
        let cases = [
            (
                format!("postgres://u:{secret}@192.0.2.1:5432/db"),
                PgUrlError::NotLoopback("192.0.2.1:5432".into()),
            ),
            (
                format!("postgres://u:{secret}@/db?host=/var/run/postgresql"),
                PgUrlError::NotTcp,
            ),
            (
                format!("postgres://u:{secret}@127.0.0.1,127.0.0.2/db"),
                PgUrlError::SeveralHosts(2),
            ),
            (format!("postgres://u:{secret}@/db"), PgUrlError::NotTcp),
            (
                format!("postgres://u:{secret}@127.0.0.1:notaport/db"),
                PgUrlError::Unparsable,
            ),
            (
                format!("host=127.0.0.1 password={secret} bogus=1"),
                PgUrlError::Unparsable,
            ),
            (format!("user=u password {secret}"), PgUrlError::Unparsable),
        ];
        for (url, want) in cases {
            let err = PgTarget::parse(&url).unwrap_err();
            assert_eq!(err, want, "{url}");
            assert!(!err.to_string().contains(secret), "{err}");
            assert!(!format!("{err:?}").contains(secret), "{err:?}");
        }
    }

    #[test]
    fn a_local_server_gets_a_plain_url() {
        let t = PgTarget::local("127.0.0.1:5999".parse().unwrap(), "postgres", "chaos");
        assert_eq!(
            t.url_at("127.0.0.1:40002".parse().unwrap()),
            "postgres://postgres@127.0.0.1:40002/chaos"
        );
    }

    #[test]
    fn the_parsed_form_never_prints_the_password() {
        let t = PgTarget::parse("postgres://u:hunter2secret@127.0.0.1/db").unwrap();
        assert!(!format!("{t:?}").contains("hunter2secret"), "{t:?}");
    }
}
