//! Opens any leasehold store from its URL, so a program (the `leasehold` command, a service
//! configured by an environment variable) can leave the choice of store to its deployment.
//!
//! ```no_run
//! # async fn demo() -> Result<(), leasehold_connect::OpenError> {
//! let store = leasehold_connect::open_store(&leasehold_connect::store_url(None)).await?;
//! # Ok(()) }
//! ```
//!
//! Each store is behind a feature of the same name (`sqlite`, `redis`, `postgres`; all on by
//! default); a URL for a store whose feature is off is reported as such.

use leasehold::BoxStore;
use leasehold::store::redact_url;

/// The store used when neither `--store` nor `LEASEHOLD_STORE` is given: a SQLite file in the
/// working directory.
pub const DEFAULT_STORE: &str = "sqlite:leasehold.db";

/// Why a store URL could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL's scheme names no store.
    #[error(
        "unknown store URL scheme in {url:?}; use sqlite:PATH, redis://, rediss:// or postgres://"
    )]
    UnknownScheme {
        /// The URL, password removed.
        url: String,
    },
    /// The store's feature was not enabled when this crate was built.
    #[error("this build has no {scheme} store; enable the leasehold-connect feature for it")]
    NotBuilt {
        /// The URL scheme.
        scheme: String,
    },
    /// The store rejected the URL or could not be reached.
    #[error("cannot open store {url}: {message}")]
    Connect {
        /// The URL, password removed.
        url: String,
        /// What went wrong, without credentials.
        message: String,
    },
}

/// The store URL from `--store`, else `LEASEHOLD_STORE`, else [`DEFAULT_STORE`].
pub fn store_url(flag: Option<String>) -> String {
    flag.or_else(|| {
        std::env::var("LEASEHOLD_STORE")
            .ok()
            .filter(|s| !s.is_empty())
    })
    .unwrap_or_else(|| DEFAULT_STORE.to_owned())
}

/// Opens the store a URL names: `sqlite:PATH`, `redis://…`, `rediss://…`, `postgres://…` (or
/// `postgresql://…`).
pub async fn open_store(url: &str) -> Result<BoxStore, OpenError> {
    let shown = redact_url(url);
    let connect_err = |message: String| OpenError::Connect {
        url: shown.clone(),
        message: redact_message(&message, url),
    };
    let scheme = url
        .split(':')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match scheme.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => leasehold_sqlite::connect(url)
            .await
            .map(BoxStore::new)
            .map_err(|e| connect_err(e.to_string())),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => leasehold_redis::connect(url)
            .await
            .map(BoxStore::new)
            .map_err(|e| connect_err(e.to_string())),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => leasehold_postgres::connect(url)
            .await
            .map(BoxStore::new)
            .map_err(|e| connect_err(e.to_string())),
        // Reached only for a store whose feature is off.
        #[allow(unreachable_patterns)]
        "sqlite" | "redis" | "rediss" | "postgres" | "postgresql" => Err(OpenError::NotBuilt {
            scheme: scheme.clone(),
        }),
        _ => Err(OpenError::UnknownScheme { url: shown }),
    }
}

/// Belt and braces: strips the URL's password from a driver message, should one ever echo it.
fn redact_message(message: &str, url: &str) -> String {
    let one_line = message.replace('\n', " ");
    match password_of(url) {
        Some(pw) if !pw.is_empty() => one_line.replace(pw, "***"),
        _ => one_line,
    }
}

fn password_of(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    Some(userinfo.split_once(':').map_or(userinfo, |(_, pw)| pw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unknown_schemes_are_named() {
        let err = open_store("mysql://root:pw@localhost/db")
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown store URL scheme in \"mysql://root:***@localhost/db\"; use sqlite:PATH, redis://, rediss:// or postgres://"
        );
    }

    #[test]
    fn messages_lose_the_password() {
        assert_eq!(
            redact_message("auth failed for s3cret\nat host", "redis://u:s3cret@h"),
            "auth failed for *** at host"
        );
    }
}
