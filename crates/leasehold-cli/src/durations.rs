//! Duration flags: humantime's forms or bare seconds, each bounded by what it times.

use std::time::Duration;

/// The longest ttl, renew, retry or grace period: a day. A ttl is how long a crashed holder
/// blocks everyone else, so a longer one is a typo rather than a plan; the bound also keeps every
/// deadline (`now + ttl`) far from the clock's range.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(24 * 3600);
/// The longest `--every`: 366 days. A longer interval would not fire in a process's lifetime;
/// calendar schedules belong in `--cron`.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses a duration: humantime's forms (`500ms`, `30s`, `5m`, `1h30m`, `2d`), or a bare number
/// of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(t).map_err(|e| format!("invalid duration {t:?}: {e}"))
}

fn bounded(text: &str, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d > max {
        return Err(format!(
            "{:?} is above the maximum of {}",
            text.trim(),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

/// A lease timing flag (`--ttl`, `--renew`, `--retry`, `--grace`, and the helpers' durations):
/// at most [`MAX_LEASE_DURATION`].
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    bounded(s, MAX_LEASE_DURATION)
}

/// A schedule interval (`--every`): at most [`MAX_INTERVAL`].
pub fn interval_arg(s: &str) -> Result<Duration, String> {
    bounded(s, MAX_INTERVAL)
}
