#![doc = include_str!("../README.md")]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod column;
pub mod lazy;
pub mod store;

pub use store::{Dialect, SqlStore};

use std::fmt;
use std::time::Duration;

/// An error followed by its causes ("error connecting to server: Connection refused"), for log
/// lines and for messages quoting a driver, whose `Display` alone leaves out why. A cause
/// already quoted is not repeated, nor a label a driver nests in itself (mysql_async's
/// "Input/output error: Input/output error: Connection refused").
pub struct Causes<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = without_repeated_labels(&self.0.to_string());
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = without_repeated_labels(&c.to_string());
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            cause = c.source();
        }
        f.write_str(&out)
    }
}

/// `text` with each `: `-separated part that repeats the one before it left out.
fn without_repeated_labels(text: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in text.split(": ") {
        if parts.last() != Some(&part) {
            parts.push(part);
        }
    }
    parts.join(": ")
}

/// Checks the settings every SQL store has: a pool of at least one connection, and no zero
/// among `durations` (named by their setting). The error is the message for the store's own
/// configuration error.
pub fn check_pool(pool_size: usize, durations: &[(&'static str, Duration)]) -> Result<(), String> {
    if pool_size == 0 {
        return Err("pool_size must be at least 1".to_owned());
    }
    leasehold::store::check_nonzero(durations).map_err(|e| e.to_string())
}

/// The builder methods of a store's settings, one per field: `field: Type` takes the value as
/// it is, `field: into Type` anything `Into<Type>`, `field: some into Type` that too, stored as
/// `Some`. Each is documented as setting its field. For use inside the settings' `impl`.
///
/// ```
/// struct Settings {
///     /// Whether to migrate.
///     pub migrate: bool,
///     /// The prefix.
///     pub prefix: String,
///     /// A CA, if any.
///     pub ca: Option<Vec<u8>>,
/// }
///
/// impl Settings {
///     leasehold_sql::setters! {
///         migrate: bool,
///         prefix: into String,
///         ca: some into Vec<u8>,
///     }
/// }
///
/// let s = Settings { migrate: true, prefix: String::new(), ca: None };
/// let s = s.migrate(false).prefix("lh_").ca(*b"pem");
/// assert_eq!((s.migrate, s.prefix.as_str(), s.ca.as_deref()), (false, "lh_", Some(&b"pem"[..])));
/// ```
#[macro_export]
macro_rules! setters {
    () => {};
    ($field:ident: some into $ty:ty $(, $($rest:tt)*)?) => {
        #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
        pub fn $field(mut self, value: impl Into<$ty>) -> Self {
            self.$field = Some(value.into());
            self
        }
        $crate::setters!($($($rest)*)?);
    };
    ($field:ident: into $ty:ty $(, $($rest:tt)*)?) => {
        #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
        pub fn $field(mut self, value: impl Into<$ty>) -> Self {
            self.$field = value.into();
            self
        }
        $crate::setters!($($($rest)*)?);
    };
    ($field:ident: $ty:ty $(, $($rest:tt)*)?) => {
        #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
        pub fn $field(mut self, value: $ty) -> Self {
            self.$field = value;
            self
        }
        $crate::setters!($($($rest)*)?);
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn causes_are_chained_once() {
        let e = Layer(
            "error connecting to server: refused",
            Some(Box::new(Layer(
                "refused",
                Some(Box::new(Layer("os error 111", None))),
            ))),
        );
        assert_eq!(
            Causes(&e).to_string(),
            "error connecting to server: refused: os error 111"
        );
    }

    #[test]
    fn pool_and_durations_are_checked() {
        let second = Duration::from_secs(1);
        assert_eq!(check_pool(1, &[("op_timeout", second)]), Ok(()));
        let zero_pool = check_pool(0, &[("op_timeout", second)]).unwrap_err();
        assert!(zero_pool.contains("pool_size"), "{zero_pool}");
        let zero = check_pool(4, &[("op_timeout", second), ("keepalive", Duration::ZERO)]);
        assert!(zero.unwrap_err().contains("keepalive"));
    }
}
