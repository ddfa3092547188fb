//! Where a sidecar listens: a TCP address or a unix socket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Where the sidecar listens: a TCP address or a unix socket (`unix:/path`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Listen {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A unix socket's path.
    Unix(PathBuf),
}

/// A `--listen` value that is neither `HOST:PORT` with an IP address nor `unix:/path`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("listen address {0:?} is neither IP:PORT (e.g. 127.0.0.1:7070) nor unix:/path/to.sock")]
pub struct BadListen(String);

impl FromStr for Listen {
    type Err = BadListen;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(BadListen(s.to_owned()));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        s.parse()
            .map(Self::Tcp)
            .map_err(|_| BadListen(s.to_owned()))
    }
}

impl Listen {
    /// Whether only this host can connect: a loopback address or a unix socket.
    pub fn is_local(&self) -> bool {
        match self {
            Self::Tcp(addr) => addr.ip().is_loopback(),
            Self::Unix(_) => true,
        }
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "http://{addr}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// Binds a unix socket, replacing a stale socket file that nobody listens on.
pub(crate) fn bind_unix(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    match tokio::net::UnixListener::bind(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(e);
            }
            std::fs::remove_file(path)?;
            tokio::net::UnixListener::bind(path)
        }
        other => other,
    }
}
