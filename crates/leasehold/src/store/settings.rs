//! A check that the settings of every store's own configuration share.

use std::time::Duration;

/// A store's duration setting that must be above zero is zero.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} must be above zero")]
pub struct ZeroDuration {
    /// The setting's name.
    pub setting: &'static str,
}

/// For a store's settings check: the first of `durations` (each a setting's name and value)
/// that is zero.
pub fn check_nonzero(durations: &[(&'static str, Duration)]) -> Result<(), ZeroDuration> {
    match durations.iter().find(|(_, d)| d.is_zero()) {
        Some(&(setting, _)) => Err(ZeroDuration { setting }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_nonzero_names_the_first_zero_duration() {
        let second = Duration::from_secs(1);
        assert_eq!(check_nonzero(&[("a", second), ("b", second)]), Ok(()));
        assert_eq!(
            check_nonzero(&[("a", second), ("b", Duration::ZERO), ("c", Duration::ZERO)]),
            Err(ZeroDuration { setting: "b" })
        );
        assert_eq!(
            ZeroDuration { setting: "b" }.to_string(),
            "b must be above zero"
        );
    }
}
