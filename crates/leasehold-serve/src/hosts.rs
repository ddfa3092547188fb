//! The names a sidecar without a token answers under. A web page the person on this machine
//! opens can reach a loopback sidecar under a DNS name of the page's own that resolves to
//! 127.0.0.1 (DNS rebinding): to the browser the sidecar is then the page's own site, so its
//! requests are same-origin and a GET carries no `Origin`. The one thing such a request cannot
//! hide is the name it was sent to, in `Host`. So without a token every request, whatever its
//! route, method or headers, must name this machine (a loopback address or `localhost`) or a
//! name the operator allowed (`--allow-host`).
//!
//! A request without `Host` (HTTP/1.0) is served: browsers always send one, so it did not come
//! from a web page, and a local program could as well have written `Host: localhost`.
//! With a token the token is the guard; over a unix socket no browser can connect at all.

use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::HOST;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::assets::{wants_html, wrong_host_page};
use crate::error::ApiError;

/// A name (or address) a sidecar without a token also answers under, besides the loopback
/// ones (`leasehold serve --allow-host NAME`): one the applications or the operator's browser
/// reach it by, such as a name `/etc/hosts` maps to 127.0.0.1. Any port.
///
/// Parsed from a host name (`sidecar.internal`) or an IP address (`10.0.0.5`, `fd00::5`,
/// `[fd00::5]`), without scheme or port; case and a trailing dot do not matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost(Host);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// Lowercase, without a trailing dot.
    Name(String),
    Ip(IpAddr),
}

/// An `--allow-host` value that is neither a host name nor an IP address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is neither a host name nor an IP address (give it without scheme or port, e.g. sidecar.internal)"
)]
pub struct BadHost(String);

impl FromStr for AllowedHost {
    type Err = BadHost;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bracketed = s.strip_prefix('[').and_then(|rest| rest.strip_suffix(']'));
        if let Some(ip) = bracketed {
            return ip
                .parse::<Ipv6Addr>()
                .map(|ip| Self(Host::Ip(IpAddr::V6(ip))))
                .map_err(|_| BadHost(s.to_owned()));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self(Host::Ip(ip)));
        }
        match host_name(s) {
            Some(name) => Ok(Self(Host::Name(name))),
            None => Err(BadHost(s.to_owned())),
        }
    }
}

impl std::fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// `text` as a DNS name (labels of letters, digits, `-` and `_`, 1 to 63 bytes each, 253 in
/// all), lowercase and without its trailing dot; `None` if it is not one.
fn host_name(text: &str) -> Option<String> {
    let name = text.strip_suffix('.').unwrap_or(text);
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (!name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok))
        .then(|| name.to_ascii_lowercase())
}

/// What the host check lets through.
#[derive(Debug)]
pub(crate) struct HostRule {
    /// Off with a token or on a unix socket.
    enforced: bool,
    allowed: Vec<AllowedHost>,
}

impl HostRule {
    pub(crate) fn new(enforced: bool, allowed: Vec<AllowedHost>) -> Self {
        Self { enforced, allowed }
    }

    /// Why `request` is refused, if it is.
    fn refusal(&self, request: &Request) -> Option<String> {
        if !self.enforced {
            return None;
        }
        // The absolute form (`GET http://name/ HTTP/1.1`) names its host too; browsers send it
        // only to proxies, but a name there must pass as well.
        let authority = request.uri().authority().map(|a| a.as_str().to_owned());
        let hosts = request
            .headers()
            .get_all(HOST)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        authority
            .into_iter()
            .chain(hosts)
            .find(|host| !self.allows(host))
            .map(|host| {
                format!(
                    "without an auth token this server answers only under a loopback address or \
                     localhost (or a name given with --allow-host); it was reached as {host:?}"
                )
            })
    }

    /// Whether `host` (a `Host` header: a name or address with an optional port) is loopback
    /// or allowed.
    fn allows(&self, host: &str) -> bool {
        let Some(found) = parse_host(host) else {
            return false;
        };
        let loopback = match &found {
            Host::Ip(ip) => is_loopback(*ip),
            Host::Name(name) => name == "localhost" || name.ends_with(".localhost"),
        };
        loopback || self.allowed.iter().any(|a| a.0 == found)
    }
}

/// A loopback address, IPv4-mapped ones (`::ffff:127.0.0.1`) included.
fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        IpAddr::V4(v4) => v4.is_loopback(),
    }
}

/// The host of a `Host` value (`name`, `name:port`, `1.2.3.4:port`, `[v6]:port`), or `None`
/// for anything else.
fn parse_host(value: &str) -> Option<Host> {
    let (host, port) = match value.strip_prefix('[') {
        Some(rest) => {
            let (ip, after) = rest.split_once(']')?;
            let ip = ip.parse::<Ipv6Addr>().ok()?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':')?),
            };
            (Host::Ip(IpAddr::V6(ip)), port)
        }
        None => {
            let (name, port) = match value.split_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (value, None),
            };
            let host = match name.parse::<std::net::Ipv4Addr>() {
                Ok(ip) => Host::Ip(IpAddr::V4(ip)),
                Err(_) => Host::Name(host_name(name)?),
            };
            (host, port)
        }
    };
    match port {
        Some(port) if port.parse::<u16>().is_err() => None,
        _ => Some(host),
    }
}

/// Refuses every request the rule refuses: 403, the API's JSON error for programs and a page
/// that says where to open the sidecar for a browser.
pub(crate) async fn check_host(
    State(rule): State<Arc<HostRule>>,
    request: Request,
    next: Next,
) -> Response {
    match rule.refusal(&request) {
        None => next.run(request).await,
        Some(_) if wants_html(&request) => wrong_host_page(),
        Some(why) => ApiError::host_not_allowed(why).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(allowed: &[&str]) -> HostRule {
        HostRule::new(true, allowed.iter().map(|a| a.parse().unwrap()).collect())
    }

    #[test]
    fn loopback_names_and_addresses_pass_with_or_without_a_port() {
        let rule = rule(&[]);
        for host in [
            "127.0.0.1",
            "127.0.0.1:7070",
            "127.8.9.10:1",
            "[::1]",
            "[::1]:7070",
            "[::ffff:127.0.0.1]:7070",
            "localhost",
            "LOCALHOST:7070",
            "localhost.:7070",
            "app.localhost:7070",
            "a.b.localhost",
        ] {
            assert!(rule.allows(host), "{host}");
        }
    }

    #[test]
    fn other_names_addresses_and_malformed_values_are_refused() {
        let rule = rule(&[]);
        for host in [
            "evil.example",
            "evil.example:7070",
            "localhost.evil.example",
            "evillocalhost",
            "127.0.0.1.nip.io",
            "0.0.0.0:7070",
            "10.0.0.5:7070",
            "[::]:7070",
            "[fd00::1]",
            "2130706433",
            "::1",
            "localhost:70:70",
            "localhost:port",
            "localhost:99999",
            "[::1]x",
            "",
            ":7070",
            "local host",
            "localhost/x",
        ] {
            assert!(!rule.allows(host), "{host}");
        }
    }

    #[test]
    fn allowed_names_pass_under_any_port_and_case() {
        let rule = rule(&["Sidecar.Internal.", "10.0.0.5", "[fd00::5]", "fd00::6"]);
        for host in [
            "sidecar.internal",
            "SIDECAR.internal:7070",
            "sidecar.internal.:1",
            "10.0.0.5:7070",
            "[fd00::5]:7070",
            "[fd00::6]",
        ] {
            assert!(rule.allows(host), "{host}");
        }
        for host in ["sidecar.internal.evil", "x.sidecar.internal", "10.0.0.6"] {
            assert!(!rule.allows(host), "{host}");
        }
    }

    #[test]
    fn allow_host_values_are_names_or_addresses_only() {
        for bad in [
            "",
            "http://sidecar",
            "sidecar:7070",
            "[fd00::5]:7070",
            "*.example",
            "a..b",
            "side car",
            "[10.0.0.5]",
            &"a".repeat(64),
        ] {
            assert!(bad.parse::<AllowedHost>().is_err(), "{bad:?}");
        }
        let shown: Vec<String> = ["Sidecar.Internal.", "fd00::5", "10.0.0.5"]
            .iter()
            .map(|h| h.parse::<AllowedHost>().unwrap().to_string())
            .collect();
        assert_eq!(shown, ["sidecar.internal", "[fd00::5]", "10.0.0.5"]);
    }
}
