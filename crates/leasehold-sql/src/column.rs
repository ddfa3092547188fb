//! Column values, as a SQL driver decodes them, turned into the core's records. A value that
//! leasehold never writes (a negative token, a holder that is not a holder id) is a
//! [`StoreError::Corrupt`] naming it, never a panic.
//!
//! Tokens, slots and versions are `BIGINT` columns, so `i64` here; remaining times are
//! microseconds on the server's clock.

use std::collections::HashSet;
use std::time::Duration;

use leasehold::catalog::{InstanceRecord, Versioned};
use leasehold::store::{Acquisition, Renewal, StoreResult};
use leasehold::{FencingToken, HolderId, LeaseName, LeaseState, StoreError};

/// A token as stored. Tokens past `i64::MAX` are never handed out, so such a token is left out
/// of a statement (`None`): it can match no row.
pub fn token_param(token: FencingToken) -> Option<i64> {
    i64::try_from(token.get()).ok()
}

/// A token read back.
pub fn token(raw: i64) -> StoreResult<FencingToken> {
    u64::try_from(raw)
        .map(FencingToken)
        .map_err(|_| StoreError::Corrupt(format!("negative fencing token {raw}")))
}

/// A lease holder read back.
pub fn holder(raw: String) -> StoreResult<HolderId> {
    HolderId::new(&raw).map_err(|e| StoreError::Corrupt(format!("holder {raw:?}: {e}")))
}

/// A spread-group member read back.
pub fn member(raw: String) -> StoreResult<HolderId> {
    HolderId::new(&raw)
        .map_err(|_| StoreError::Corrupt(format!("member {raw:?} is not a holder id")))
}

/// A task or lease name read back.
pub fn name(raw: String) -> StoreResult<LeaseName> {
    LeaseName::new(&raw).map_err(|e| StoreError::Corrupt(format!("name {raw:?}: {e}")))
}

/// Microseconds left (negative once past, `NULL` for none) as a duration, zero when none is left.
pub fn remaining(micros: Option<i64>) -> Duration {
    Duration::from_micros(micros.unwrap_or(0).max(0) as u64)
}

/// The server's clock in ms since the Unix epoch.
pub fn clock_ms(ms: i64) -> StoreResult<u64> {
    u64::try_from(ms).map_err(|_| StoreError::Corrupt(format!("server clock at {ms} ms")))
}

/// A task's last claimed slot.
pub fn slot(last: i64) -> StoreResult<u64> {
    u64::try_from(last).map_err(|_| StoreError::Corrupt(format!("negative slot {last}")))
}

/// A control record's version.
pub fn version(raw: i64) -> StoreResult<u64> {
    u64::try_from(raw)
        .map_err(|_| StoreError::Corrupt(format!("negative control record version {raw}")))
}

/// A control record from its two columns, both `NULL` when the task has none.
pub fn control(version: Option<i64>, value: Option<String>) -> StoreResult<Option<Versioned>> {
    match (version, value) {
        (None, _) => Ok(None),
        (Some(raw), Some(value)) => Ok(Some(Versioned {
            version: self::version(raw)?,
            value,
        })),
        (Some(raw), None) => Err(StoreError::Corrupt(format!(
            "control record version {raw} without a value"
        ))),
    }
}

/// A lease row as [`Store::inspect`](leasehold::Store::inspect) answers it: held only while
/// time remains.
pub fn lease_state(
    holder: Option<String>,
    token: i64,
    remaining_us: Option<i64>,
) -> StoreResult<LeaseState> {
    let holder = match holder {
        Some(h) if remaining_us.is_some_and(|r| r > 0) => Some(self::holder(h)?),
        _ => None,
    };
    Ok(LeaseState {
        remaining: if holder.is_some() {
            remaining(remaining_us)
        } else {
            Duration::ZERO
        },
        holder,
        token: self::token(token)?,
    })
}

/// An instance's registration of a task, from its instance, about and remaining-time columns.
pub fn instance(
    instance: String,
    about: String,
    remaining_us: Option<i64>,
) -> StoreResult<InstanceRecord> {
    Ok(InstanceRecord {
        instance: holder(instance)?,
        about,
        remaining: remaining(remaining_us),
    })
}

/// What an acquire that did not take the lease answers, from the holder and time left it read:
/// `Busy` while another holder has time left, `None` when the read shows a free or expired
/// lease (or the asker's own), which a concurrent writer changed after the write: ask again.
pub fn busy(
    current: Option<String>,
    remaining_us: Option<i64>,
    asking: &HolderId,
) -> StoreResult<Option<Acquisition>> {
    match current {
        Some(current) if remaining_us.is_some_and(|r| r > 0) && current != asking.as_str() => {
            Ok(Some(Acquisition::Busy {
                holder: holder(current)?,
                remaining: remaining(remaining_us),
            }))
        }
        _ => Ok(None),
    }
}

/// A batch renewal's answer: `Renewed` for each lease whose `(name, token)` the store reports
/// renewed (or still held), `Lost` for the others.
pub fn renewals(
    leases: &[(LeaseName, FencingToken)],
    renewed: &HashSet<(String, i64)>,
) -> Vec<Renewal> {
    leases
        .iter()
        .map(|(name, token)| {
            let key = token_param(*token).map(|t| (name.as_str().to_owned(), t));
            if key.is_some_and(|k| renewed.contains(&k)) {
                Renewal::Renewed
            } else {
                Renewal::Lost
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corrupt<T: std::fmt::Debug>(r: StoreResult<T>, says: &str) {
        match r {
            Err(StoreError::Corrupt(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("expected Corrupt({says}), got {other:?}"),
        }
    }

    #[test]
    fn values_leasehold_never_writes_are_corrupt() {
        corrupt(token(-1), "negative fencing token -1");
        corrupt(holder(String::new()), "holder \"\"");
        corrupt(member(String::new()), "is not a holder id");
        corrupt(name("a b".to_owned()), "name \"a b\"");
        corrupt(clock_ms(-5), "server clock at -5 ms");
        corrupt(slot(-2), "negative slot -2");
        corrupt(control(Some(-1), Some("{}".to_owned())), "negative control");
        corrupt(control(Some(3), None), "version 3 without a value");
        assert_eq!(token_param(FencingToken(u64::MAX)), None);
        assert_eq!(token_param(FencingToken(9)), Some(9));
    }

    #[test]
    fn a_lease_is_held_only_while_time_remains() {
        let held = lease_state(Some("h:1:a".to_owned()), 4, Some(2_000)).unwrap();
        assert_eq!(held.holder.as_ref().map(HolderId::as_str), Some("h:1:a"));
        assert_eq!(held.remaining, Duration::from_millis(2));
        for past in [Some(0), Some(-10), None] {
            let free = lease_state(Some("h:1:a".to_owned()), 4, past).unwrap();
            assert_eq!((free.holder, free.remaining), (None, Duration::ZERO));
        }
        assert_eq!(
            control(Some(2), Some("v".to_owned())).unwrap(),
            Some(Versioned {
                version: 2,
                value: "v".to_owned()
            })
        );
        assert_eq!(control(None, Some("v".to_owned())).unwrap(), None);
    }

    #[test]
    fn busy_only_for_another_live_holder() {
        let me = HolderId::new("me:1:a").unwrap();
        let busy_with = |h: &str, r| busy(Some(h.to_owned()), r, &me).unwrap();
        assert!(matches!(
            busy_with("you:2:b", Some(1_000)),
            Some(Acquisition::Busy { remaining, .. }) if remaining == Duration::from_millis(1)
        ));
        assert!(busy_with("you:2:b", Some(0)).is_none());
        assert!(busy_with("me:1:a", Some(1_000)).is_none());
        assert!(busy(None, Some(1_000), &me).unwrap().is_none());
    }

    #[test]
    fn renewals_match_name_and_token() {
        let name = |n: &str| LeaseName::new(n).unwrap();
        let leases = [
            (name("a"), FencingToken(1)),
            (name("b"), FencingToken(2)),
            (name("c"), FencingToken(u64::MAX)),
        ];
        let renewed = HashSet::from([("a".to_owned(), 1), ("b".to_owned(), 3)]);
        assert_eq!(
            renewals(&leases, &renewed),
            vec![Renewal::Renewed, Renewal::Lost, Renewal::Lost]
        );
    }
}
