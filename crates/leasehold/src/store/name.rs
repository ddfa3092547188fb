//! Validated lease names and holder identities.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Longest accepted lease name, in bytes. Keys built from it must stay short on every store.
pub const MAX_NAME_LEN: usize = 128;

/// Longest accepted holder id, in bytes.
pub const MAX_HOLDER_LEN: usize = 255;

/// Why a lease name or holder id was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name was empty.
    #[error("lease name is empty")]
    Empty,
    /// The name was longer than [`MAX_NAME_LEN`] bytes.
    #[error("lease name is {len} bytes long, the limit is {max}")]
    TooLong {
        /// Length of the rejected name.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The name held a character outside `A-Z a-z 0-9 - _ . : /`.
    #[error("lease name {name:?} has {ch:?}; use only letters, digits and - _ . : /")]
    BadChar {
        /// The rejected name.
        name: String,
        /// The first offending character.
        ch: char,
    },
    /// The holder id was empty, too long, or held whitespace, control or bidi characters.
    #[error(
        "holder id {0:?} must be 1 to 255 bytes without whitespace, control or bidi characters"
    )]
    BadHolder(String),
}

/// The name of a lease (or task, or leader group): 1 to 128 bytes of `A-Z a-z 0-9 - _ . : /`.
///
/// The character set keeps names safe inside Redis keys, PostgreSQL text and file names alike.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseName(Arc<str>);

impl LeaseName {
    /// Checks `name` and wraps it.
    pub fn new(name: impl AsRef<str>) -> Result<Self, NameError> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong {
                len: name.len(),
                max: MAX_NAME_LEN,
            });
        }
        if let Some(ch) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/')))
        {
            return Err(NameError::BadChar {
                name: name.to_owned(),
                ch,
            });
        }
        Ok(Self(name.into()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::str::FromStr for LeaseName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl AsRef<str> for LeaseName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Who holds a lease. Defaults to `host:pid:` and 128 bits (random per process, counted per
/// identity), so two processes on one host, or two [`Lease`](crate::Lease) handles in one
/// process, never share an identity.
///
/// Ordered by its text, byte by byte (so [`Membership::members`](crate::Membership::members) answers
/// sorted).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId(Arc<str>);

impl HolderId {
    /// A fresh identity: `host:pid:` followed by 128 bits in hex, a random number drawn once
    /// per process plus a count of the identities made before (a sidecar makes one per request:
    /// no system call each time).
    pub fn generate() -> Self {
        static BASE: OnceLock<u128> = OnceLock::new();
        static MADE: AtomicU64 = AtomicU64::new(0);
        let host = host_name();
        let base = BASE.get_or_init(|| {
            let mut bytes = [0u8; 16];
            if getrandom::fill(&mut bytes).is_err() {
                // No OS randomness: a seeded generator; pid and host still separate us.
                bytes = fastrand::u128(..).to_le_bytes();
            }
            u128::from_le_bytes(bytes)
        });
        let n = base.wrapping_add(u128::from(MADE.fetch_add(1, Ordering::Relaxed)));
        Self(format!("{host}:{}:{n:032x}", std::process::id()).into())
    }

    /// Uses `id` as the identity after checking it (1 to 255 bytes, no whitespace, nothing
    /// [`text::is_hidden`](crate::text::is_hidden) names: operators read it in tables).
    pub fn new(id: impl AsRef<str>) -> Result<Self, NameError> {
        let id = id.as_ref();
        if id.is_empty()
            || id.len() > MAX_HOLDER_LEN
            || id
                .chars()
                .any(|c| c.is_whitespace() || crate::store::text::is_hidden(c))
        {
            return Err(NameError::BadHolder(id.to_owned()));
        }
        Ok(Self(id.into()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// This host's name as generated holder ids and the catalog show it: `$HOSTNAME`, else the
/// kernel's host name, without whitespace, control or bidi characters or `:`, at most 64 characters,
/// `localhost` if none. Read once per process.
pub fn host_name() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(read_host_name)
}

fn read_host_name() -> String {
    let raw = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .filter(|&c| !c.is_whitespace() && !crate::store::text::is_hidden(c) && c != ':')
        .take(64)
        .collect();
    if clean.is_empty() {
        "localhost".to_owned()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for ok in [
            "sweep",
            "billing:expire-gigs",
            "a/b.c_d",
            &"x".repeat(MAX_NAME_LEN),
        ] {
            assert_eq!(LeaseName::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn rejects_bad_names() {
        assert_eq!(LeaseName::new(""), Err(NameError::Empty));
        assert!(matches!(
            LeaseName::new("x".repeat(MAX_NAME_LEN + 1)),
            Err(NameError::TooLong { len: 129, max: 128 })
        ));
        for bad in ["has space", "new\nline", "brace{tag}", "ünï", "semi;colon"] {
            assert!(
                matches!(LeaseName::new(bad), Err(NameError::BadChar { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn generated_holders_are_unique_and_shaped() {
        let a = HolderId::generate();
        let b = HolderId::generate();
        assert_ne!(a, b);
        let parts: Vec<&str> = a.as_str().rsplitn(3, ':').collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].len(), 32);
        assert_eq!(parts[1], std::process::id().to_string());
        assert!(HolderId::new(a.as_str()).is_ok());
    }

    #[test]
    fn rejects_bad_holders() {
        for bad in [
            "",
            "a b",
            "tab\t",
            "esc\u{1b}[2J",
            "bidi\u{202e}",
            &"h".repeat(MAX_HOLDER_LEN + 1),
        ] {
            assert!(HolderId::new(bad).is_err(), "{bad:?}");
        }
    }
}
