//! The run policy flags of `leasehold run` and the `# leasehold:` keys of `leasehold crontab`:
//! `--timeout`, `--retries`, `--retry-backoff D[,MAX]`, `--jitter`, `--on-interrupt`, `--overlap`, each read by one parser with a typed
//! error, so both doors accept and refuse the same text.

use std::fmt;
use std::time::Duration;

use leasehold::policy::{MAX_JITTER, MAX_RETRIES};
use leasehold::{Backoff, RunPolicy};

use crate::durations::{MAX_INTERVAL, parse_duration};

/// Why a policy value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyArgError {
    /// Not a duration, or above the maximum.
    Duration(String),
    /// A zero timeout (leave the option out for none).
    ZeroTimeout,
    /// Not a whole number from 0 to [`MAX_RETRIES`].
    Retries(String),
    /// A first wait of zero.
    ZeroBackoff,
    /// More than `D,MAX`.
    BackoffShape(String),
    /// A jitter above [`MAX_JITTER`].
    JitterTooLong(String),
    /// A cap below the first wait.
    CapBelowBase {
        /// The first wait as written.
        base: String,
        /// The cap as written.
        max: String,
    },
}

impl fmt::Display for PolicyArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Duration(e) => f.write_str(e),
            Self::ZeroTimeout => f.write_str(
                "a timeout of zero would stop every run at once; leave it out for no time limit",
            ),
            Self::Retries(text) => {
                write!(
                    f,
                    "{text:?} is not a number of retries from 0 to {MAX_RETRIES}"
                )
            }
            Self::ZeroBackoff => f.write_str("the first wait between attempts must be above zero"),
            Self::BackoffShape(text) => write!(
                f,
                "{text:?} is not D or D,MAX (the first wait, then the longest), e.g. 10s or 10s,5m"
            ),
            Self::JitterTooLong(text) => write!(
                f,
                "jitter {text:?} is above {}: a slot started that late would be taken for a \
                 late one",
                humantime::format_duration(MAX_JITTER)
            ),
            Self::CapBelowBase { base, max } => {
                write!(f, "the longest wait {max} is below the first wait {base}")
            }
        }
    }
}

impl std::error::Error for PolicyArgError {}

fn duration(text: &str) -> Result<Duration, PolicyArgError> {
    let d = parse_duration(text).map_err(PolicyArgError::Duration)?;
    if d > MAX_INTERVAL {
        return Err(PolicyArgError::Duration(format!(
            "{:?} is above the maximum of {}",
            text.trim(),
            humantime::format_duration(MAX_INTERVAL)
        )));
    }
    Ok(d)
}

/// `--timeout D`, `timeout=D`: above zero, at most a year.
pub fn timeout_arg(text: &str) -> Result<Duration, PolicyArgError> {
    match duration(text)? {
        d if d.is_zero() => Err(PolicyArgError::ZeroTimeout),
        d => Ok(d),
    }
}

/// `--retries N`, `retries=N`: 0 to [`MAX_RETRIES`].
pub fn retries_arg(text: &str) -> Result<u32, PolicyArgError> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|&n| n <= MAX_RETRIES)
        .ok_or_else(|| PolicyArgError::Retries(text.to_owned()))
}

/// `--retry-backoff D[,MAX]`, `retry-backoff=D[,MAX]`: the first wait, above zero, and the
/// longest (default [`Backoff::DEFAULT_MAX`], or D if longer), not below it.
pub fn backoff_arg(text: &str) -> Result<Backoff, PolicyArgError> {
    let mut parts = text.split(',');
    let (base_text, max_text) = (parts.next().unwrap_or_default(), parts.next());
    if parts.next().is_some() {
        return Err(PolicyArgError::BackoffShape(text.to_owned()));
    }
    let base = duration(base_text)?;
    if base.is_zero() {
        return Err(PolicyArgError::ZeroBackoff);
    }
    let max = max_text.map(duration).transpose()?;
    if let (Some(max), Some(max_text)) = (max, max_text)
        && max < base
    {
        return Err(PolicyArgError::CapBelowBase {
            base: base_text.trim().to_owned(),
            max: max_text.trim().to_owned(),
        });
    }
    Ok(Backoff::new(base, max))
}

/// `--jitter D`, `jitter=D`: at most [`MAX_JITTER`]; zero for none.
pub fn jitter_arg(text: &str) -> Result<Duration, PolicyArgError> {
    match duration(text)? {
        d if d > MAX_JITTER => Err(PolicyArgError::JitterTooLong(text.trim().to_owned())),
        d => Ok(d),
    }
}

/// `--on-interrupt rerun|skip`, `on-interrupt=rerun|skip`.
pub fn on_interrupt_arg(text: &str) -> Result<leasehold::OnInterrupt, String> {
    text.trim().parse()
}

/// `--overlap skip|buffer-one|buffer-all|replace|allow`, `overlap=…`.
pub fn overlap_arg(text: &str) -> Result<leasehold::Overlap, leasehold::policy::OverlapError> {
    text.trim().parse()
}

/// The policy the values make (none given: no timeout, no retries, no jitter).
pub fn run_policy(
    timeout: Option<Duration>,
    retries: u32,
    backoff: Option<Backoff>,
    jitter: Option<Duration>,
) -> RunPolicy {
    RunPolicy::default()
        .timeout(timeout)
        .retries(retries)
        .backoff(backoff.unwrap_or_default())
        .jitter(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_or_refused_with_their_reason() {
        assert_eq!(timeout_arg("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(timeout_arg("0s"), Err(PolicyArgError::ZeroTimeout));
        assert!(matches!(
            timeout_arg("soon"),
            Err(PolicyArgError::Duration(_))
        ));
        assert_eq!(jitter_arg("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(jitter_arg("0s"), Ok(Duration::ZERO));
        assert!(matches!(
            jitter_arg("2h"),
            Err(PolicyArgError::JitterTooLong(_))
        ));
        assert_eq!(retries_arg("3"), Ok(3));
        assert!(matches!(
            retries_arg("101"),
            Err(PolicyArgError::Retries(_))
        ));
        assert!(matches!(retries_arg("-1"), Err(PolicyArgError::Retries(_))));
        let b = backoff_arg("100ms").unwrap();
        assert_eq!(
            (b.base, b.max),
            (Duration::from_millis(100), Backoff::DEFAULT_MAX)
        );
        let b = backoff_arg("10s,5m").unwrap();
        assert_eq!(
            (b.base, b.max),
            (Duration::from_secs(10), Duration::from_secs(300))
        );
        assert_eq!(backoff_arg("0s"), Err(PolicyArgError::ZeroBackoff));
        assert!(matches!(
            backoff_arg("1s,2s,3s"),
            Err(PolicyArgError::BackoffShape(_))
        ));
        let e = backoff_arg("1m,10s").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the longest wait 10s is below the first wait 1m"
        );
    }
}
