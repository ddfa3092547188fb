//! The value of a lease key.
//!
//! Held: `TOKEN\0HOLDER\0TTL_MS`; free: `TOKEN\0\0FREED_AT_MS`, with the token as 20 decimal
//! digits. Because the token and holder come first and a holder never contains `\0`, "this
//! tenure" is a byte range of values — `[TOKEN\0HOLDER\0, TOKEN\0HOLDER\x01)` — that an etcd
//! transaction can compare against, so renew and release are one round trip each.

use std::time::Duration;

use leasehold::StoreError;

/// A decoded lease value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    Held {
        token: u64,
        holder: String,
        ttl: Duration,
    },
    Free {
        token: u64,
        /// Wall-clock ms of the release, for `purge`.
        freed_at_ms: u64,
    },
}

impl Record {
    pub(crate) fn token(&self) -> u64 {
        match self {
            Self::Held { token, .. } | Self::Free { token, .. } => *token,
        }
    }

    pub(crate) fn held(token: u64, holder: &str, ttl: Duration) -> Vec<u8> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        format!("{token:020}\0{holder}\0{ttl_ms}").into_bytes()
    }

    pub(crate) fn free(token: u64, freed_at_ms: u64) -> Vec<u8> {
        format!("{token:020}\0\0{freed_at_ms}").into_bytes()
    }

    /// The start of every value of the tenure `(token, holder)`; its end is
    /// [`prefix_end`](crate::wire::prefix_end) of it.
    pub(crate) fn tenure(token: u64, holder: &str) -> Vec<u8> {
        format!("{token:020}\0{holder}\0").into_bytes()
    }

    pub(crate) fn decode(value: &[u8]) -> Result<Self, StoreError> {
        let bad = || {
            StoreError::Corrupt(format!(
                "lease value {:?} is not TOKEN\\0HOLDER\\0NUMBER",
                String::from_utf8_lossy(&value[..value.len().min(80)])
            ))
        };
        let text = std::str::from_utf8(value).map_err(|_| bad())?;
        let mut parts = text.split('\0');
        let (Some(token), Some(holder), Some(number), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let token: u64 = token.parse().map_err(|_| bad())?;
        let number: u64 = number.parse().map_err(|_| bad())?;
        Ok(if holder.is_empty() {
            Self::Free {
                token,
                freed_at_ms: number,
            }
        } else {
            Self::Held {
                token,
                holder: holder.to_owned(),
                ttl: Duration::from_millis(number),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::prefix_end;

    #[test]
    fn round_trips_and_tenure_ranges_hold_only_their_tenure() {
        let held = Record::held(42, "h-1", Duration::from_millis(300));
        assert_eq!(
            Record::decode(&held).unwrap(),
            Record::Held {
                token: 42,
                holder: "h-1".into(),
                ttl: Duration::from_millis(300)
            }
        );
        let free = Record::free(42, 7);
        assert_eq!(
            Record::decode(&free).unwrap(),
            Record::Free {
                token: 42,
                freed_at_ms: 7
            }
        );
        let (start, end) = (
            Record::tenure(42, "h-1"),
            prefix_end(&Record::tenure(42, "h-1")),
        );
        let inside = |v: &[u8]| v > start.as_slice() && v < end.as_slice();
        assert!(inside(&held));
        assert!(inside(&Record::held(42, "h-1", Duration::from_secs(30))));
        assert!(!inside(&free));
        assert!(!inside(&Record::held(43, "h-1", Duration::from_secs(1))));
        assert!(!inside(&Record::held(42, "h-10", Duration::from_secs(1))));
        assert!(!inside(&Record::held(42, "h-", Duration::from_secs(1))));
        assert!(!inside(&Record::held(4, "2", Duration::from_secs(1))));
        assert!(Record::decode(b"x\0y").is_err());
    }
}
