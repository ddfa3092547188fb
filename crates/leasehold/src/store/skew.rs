//! Versions side by side on one store (the version-skew policy, docs/version-skew.md).
//!
//! Any release works beside the previous one on one store, in both orders of upgrade. Store
//! schemas change by expand and contract: a release adds tables, columns, keys and record fields
//! that older ones ignore, and removes or reinterprets only what the previous release no longer
//! needs. Each store records, beside its schema version, the oldest release that may still write
//! to it ([`MIN_WRITER_KEY`]); a release older than that refuses the store with [`TooOld`]
//! before writing anything. A release raises the record to its own [`OLDEST_WRITER`] when it
//! contracts the schema, and never lowers it.
//!
//! ```
//! use leasehold::skew::{self, Version};
//!
//! assert!(skew::check_writer("0.1.0").is_ok());
//! let err = skew::check_writer("99.0.0").unwrap_err();
//! assert_eq!(err.required, "99.0.0");
//! assert!(err.to_string().contains("upgrade leasehold to at least 99.0.0"));
//! assert!(Version::parse("0.10.0") > Version::parse("0.9.1"));
//! ```

use std::fmt;

/// The record key (or column, or row name) a store keeps the oldest release that may still write
/// to it under.
pub const MIN_WRITER_KEY: &str = "min_writer";
/// The record key a store keeps its schema version under.
pub const SCHEMA_VERSION_KEY: &str = "schema_version";

/// A release's version, `MAJOR.MINOR.PATCH`, ordered as semantic versions are (a pre-release
/// or build suffix is ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major version.
    pub major: u64,
    /// Minor version.
    pub minor: u64,
    /// Patch version.
    pub patch: u64,
}

impl Version {
    /// `MAJOR.MINOR.PATCH`, with an optional suffix after `-` or `+`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let core = text.trim().split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
        let version = Self {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next()??,
        };
        parts.next().is_none().then_some(version)
    }

    /// The version as one number, `MAJOR × 10⁶ + MINOR × 10³ + PATCH`, for a store that keeps
    /// numbers only; ordered as versions are while MINOR and PATCH stay below 1000.
    pub fn number(self) -> u64 {
        self.major
            .saturating_mul(1_000_000)
            .saturating_add(self.minor.min(999) * 1_000)
            .saturating_add(self.patch.min(999))
    }

    /// The version a [`number`](Self::number) stands for.
    pub fn from_number(number: u64) -> Self {
        Self {
            major: number / 1_000_000,
            minor: number / 1_000 % 1_000,
            patch: number % 1_000,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// This release: the version of the `leasehold` crate (every crate and the command share it).
pub const THIS_RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The oldest release that may write to a store this release uses: the previous release, whose
/// schema this one only expanded. What this release records in a store that has no record yet.
pub const OLDEST_WRITER: &str = "0.1.0";

/// This release, parsed.
pub fn this_release() -> Version {
    // The crate's own version is always MAJOR.MINOR.PATCH; the zero fallback is unreachable.
    Version::parse(THIS_RELEASE).unwrap_or(Version {
        major: 0,
        minor: 0,
        patch: 0,
    })
}

/// This release is older than the oldest release the store lets write to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the store is in use by a newer leasehold that needs at least release {required} \
     (this is {this}); upgrade leasehold to at least {required}"
)]
#[non_exhaustive]
pub struct TooOld {
    /// The oldest release the store lets write, as recorded.
    pub required: String,
    /// This release.
    pub this: &'static str,
}

/// Checks a store's recorded oldest writer against this release. A record this release cannot
/// read was written by a newer one, so it refuses too.
pub fn check_writer(recorded: &str) -> Result<(), TooOld> {
    match Version::parse(recorded) {
        Some(required) if required <= this_release() => Ok(()),
        _ => Err(TooOld {
            required: recorded.trim().to_owned(),
            this: THIS_RELEASE,
        }),
    }
}

/// The oldest-writer value this release writes over `recorded` (absent: `None`): its own
/// [`OLDEST_WRITER`] when the store has none or a lower one, else `None` (leave it; a record is
/// never lowered).
pub fn raised_min_writer(recorded: Option<&str>) -> Option<&'static str> {
    let ours = Version::parse(OLDEST_WRITER);
    match recorded.map(Version::parse) {
        None => Some(OLDEST_WRITER),
        Some(theirs) if theirs < ours => Some(OLDEST_WRITER),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_numerically_and_ignore_suffixes() {
        let v = |s| Version::parse(s).unwrap();
        assert!(v("0.10.0") > v("0.9.9"));
        assert!(v("1.0.0") > v("0.99.99"));
        assert_eq!(v("0.2.0-rc.1"), v("0.2.0"));
        assert_eq!(v(" 0.2.0+build "), v("0.2.0"));
        for bad in ["", "1", "1.2", "1.2.3.4", "a.b.c", "1..3", "-1.0.0"] {
            assert_eq!(Version::parse(bad), None, "{bad:?}");
        }
        assert_eq!(v("3.20.1").to_string(), "3.20.1");
        assert_eq!(v("3.20.1").number(), 3_020_001);
        assert_eq!(Version::from_number(3_020_001), v("3.20.1"));
        assert!(v("0.10.0").number() > v("0.9.999").number());
    }

    #[test]
    fn this_release_may_write_where_it_or_an_older_one_is_the_minimum() {
        assert!(check_writer(OLDEST_WRITER).is_ok());
        assert!(check_writer(THIS_RELEASE).is_ok());
        assert!(Version::parse(OLDEST_WRITER) <= Some(this_release()));
        let next = this_release();
        let newer = format!("{}.{}.{}", next.major, next.minor, next.patch + 1);
        let err = check_writer(&newer).unwrap_err();
        assert_eq!(err.required, newer);
        assert!(
            err.to_string()
                .ends_with(&format!("upgrade leasehold to at least {newer}")),
            "{err}"
        );
        // Unreadable: written by a release that changed the format.
        assert!(check_writer("two").is_err());
    }

    #[test]
    fn the_minimum_is_raised_never_lowered() {
        assert_eq!(raised_min_writer(None), Some(OLDEST_WRITER));
        assert_eq!(raised_min_writer(Some("0.0.1")), Some(OLDEST_WRITER));
        assert_eq!(raised_min_writer(Some(OLDEST_WRITER)), None);
        assert_eq!(raised_min_writer(Some("7.0.0")), None);
    }
}
