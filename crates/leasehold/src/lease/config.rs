//! Lease timing and its invariants.

use std::time::Duration;

/// The longest lease ttl: a year.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// A timing setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `ttl` was zero.
    #[error("ttl must be greater than zero")]
    ZeroTtl,
    /// `ttl` was below the 10 ms the local deadline and the drift margin need.
    #[error("ttl of {0:?} is too short; use at least 10ms")]
    TtlTooShort(Duration),
    /// `ttl` was above [`MAX_TTL`]: deadlines that far out do not fit every store's (or the
    /// monotonic clock's) arithmetic.
    #[error("ttl of {0:?} is too long; use at most {MAX_TTL:?} (a year)")]
    TtlTooLong(Duration),
    /// `renew_interval` was zero or not below `ttl`: the lease would expire before renewal.
    #[error("renew interval ({renew:?}) must be greater than zero and less than the ttl ({ttl:?})")]
    RenewNotBelowTtl {
        /// The renew interval asked for.
        renew: Duration,
        /// The ttl.
        ttl: Duration,
    },
    /// `retry_interval` was zero or above `renew_interval`.
    #[error(
        "retry interval ({retry:?}) must be greater than zero and at most the renew interval ({renew:?})"
    )]
    RetryAboveRenew {
        /// The retry interval asked for.
        retry: Duration,
        /// The renew interval.
        renew: Duration,
    },
    /// `stop_margin` left no time to renew before work is told to stop: it must be below
    /// `ttl - renew_interval - drift_margin`.
    #[error(
        "stop margin ({stop:?}) must be less than ttl minus renew interval minus drift margin ({room:?}), or work is told to stop before every renewal"
    )]
    StopMarginTooLarge {
        /// The stop margin asked for.
        stop: Duration,
        /// `ttl - renew_interval - drift_margin`.
        room: Duration,
    },
    /// `drift_margin` left no time to renew: it must be below `ttl - renew_interval`.
    #[error(
        "drift margin ({drift:?}) must be less than ttl minus renew interval ({room:?}), or the lease is lost before each renewal"
    )]
    DriftTooLarge {
        /// The drift margin asked for.
        drift: Duration,
        /// `ttl - renew_interval`.
        room: Duration,
    },
}

/// How long a lease lasts and how it is kept alive.
///
/// Build it with [`LeaseConfig::new`], which derives every interval from the ttl, then adjust
/// fields; [`LeaseConfig::validate`] (called by [`Lease::new`](crate::Lease::new)) checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseConfig {
    /// How long the store keeps the lease without a renewal. Default: 15 s.
    pub ttl: Duration,
    /// Time between renewals. Default: ttl / 3.
    pub renew_interval: Duration,
    /// Time between retries after a failed renewal or acquire. Default: ttl / 15, at most 1 s.
    pub retry_interval: Duration,
    /// Subtracted from the local deadline to allow for the client clock running faster than the
    /// store's over one ttl. Default: ttl / 100 + 2 ms.
    pub drift_margin: Duration,
    /// How long before the local deadline a guard whose renewal is overdue tells its work to
    /// stop ([`LeaseGuard::cancellation_token`](crate::LeaseGuard::cancellation_token)), so the work has ended
    /// before the store can grant the lease to anyone else. Default: ttl / 5.
    pub stop_margin: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self::new(Duration::from_secs(15))
    }
}

impl LeaseConfig {
    /// Timing for `ttl`, every other interval derived from it.
    pub fn new(ttl: Duration) -> Self {
        let renew_interval = ttl / 3;
        Self {
            ttl,
            renew_interval,
            retry_interval: (ttl / 15).min(Duration::from_secs(1)).min(renew_interval),
            drift_margin: ttl / 100 + Duration::from_millis(2),
            stop_margin: ttl / 5,
        }
    }

    /// Sets the renew interval.
    pub fn renew_interval(mut self, every: Duration) -> Self {
        self.renew_interval = every;
        self
    }

    /// Sets the retry interval.
    pub fn retry_interval(mut self, every: Duration) -> Self {
        self.retry_interval = every;
        self
    }

    /// Sets the drift margin.
    pub fn drift_margin(mut self, margin: Duration) -> Self {
        self.drift_margin = margin;
        self
    }

    /// Sets the stop margin.
    pub fn stop_margin(mut self, margin: Duration) -> Self {
        self.stop_margin = margin;
        self
    }

    /// Checks the invariants: ttl ≥ 10 ms, 0 < renew < ttl, 0 < retry ≤ renew,
    /// drift < ttl − renew, stop < ttl − renew − drift.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ttl.is_zero() {
            return Err(ConfigError::ZeroTtl);
        }
        if self.ttl < Duration::from_millis(10) {
            return Err(ConfigError::TtlTooShort(self.ttl));
        }
        if self.ttl > MAX_TTL {
            return Err(ConfigError::TtlTooLong(self.ttl));
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.ttl {
            return Err(ConfigError::RenewNotBelowTtl {
                renew: self.renew_interval,
                ttl: self.ttl,
            });
        }
        if self.retry_interval.is_zero() || self.retry_interval > self.renew_interval {
            return Err(ConfigError::RetryAboveRenew {
                retry: self.retry_interval,
                renew: self.renew_interval,
            });
        }
        let room = self.ttl - self.renew_interval;
        if self.drift_margin >= room {
            return Err(ConfigError::DriftTooLarge {
                drift: self.drift_margin,
                room,
            });
        }
        let room = room - self.drift_margin;
        if self.stop_margin >= room {
            return Err(ConfigError::StopMarginTooLarge {
                stop: self.stop_margin,
                room,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn defaults_are_valid_for_many_ttls() {
        for ms in [10, 50, 300, 1_000, 15_000, 600_000] {
            let c = LeaseConfig::new(MS * ms);
            assert_eq!(c.validate(), Ok(()), "ttl {ms}ms: {c:?}");
            assert_eq!(c.renew_interval, MS * ms / 3);
        }
        let d = LeaseConfig::default();
        assert_eq!(d.ttl, Duration::from_secs(15));
        assert_eq!(d.retry_interval, Duration::from_secs(1));
    }

    #[test]
    fn rejects_each_broken_invariant() {
        assert_eq!(
            LeaseConfig::new(Duration::ZERO).validate(),
            Err(ConfigError::ZeroTtl)
        );
        assert_eq!(
            LeaseConfig::new(MS * 5).validate(),
            Err(ConfigError::TtlTooShort(MS * 5))
        );
        assert_eq!(
            LeaseConfig::new(Duration::MAX).validate(),
            Err(ConfigError::TtlTooLong(Duration::MAX))
        );
        let ttl = Duration::from_secs(1);
        assert!(matches!(
            LeaseConfig::new(ttl).renew_interval(ttl).validate(),
            Err(ConfigError::RenewNotBelowTtl { .. })
        ));
        assert!(matches!(
            LeaseConfig::new(ttl)
                .renew_interval(Duration::ZERO)
                .validate(),
            Err(ConfigError::RenewNotBelowTtl { .. })
        ));
        assert!(matches!(
            LeaseConfig::new(ttl).retry_interval(ttl / 2).validate(),
            Err(ConfigError::RetryAboveRenew { .. })
        ));
        assert!(matches!(
            LeaseConfig::new(ttl).drift_margin(ttl).validate(),
            Err(ConfigError::DriftTooLarge { .. })
        ));
        // 1 s − 333 ms − 12 ms leaves 655 ms.
        assert!(matches!(
            LeaseConfig::new(ttl).stop_margin(MS * 655).validate(),
            Err(ConfigError::StopMarginTooLarge { .. })
        ));
        assert_eq!(
            LeaseConfig::new(ttl).stop_margin(MS * 654).validate(),
            Ok(())
        );
    }
}
