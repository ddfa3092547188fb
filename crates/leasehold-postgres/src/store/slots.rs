//! Slots and run history, purge, and spread-group membership.

use std::time::Duration;

use leasehold::store::{SlotClaim, StoreResult};
use leasehold::{HolderId, LeaseName, Membership, Purge, Slots, StoreError};
use leasehold_sql::column;

use super::{MAX_ATTEMPTS, Op, PgStore, get, to_i64};

impl Slots for PgStore {
    async fn claim_slot(&self, task: &LeaseName, slot: u64) -> StoreResult<SlotClaim> {
        let op = Op::new("claim_slot", Some(task));
        let Some(slot_i) = to_i64(slot) else {
            return Err(StoreError::Rejected {
                message: format!("{op}: slot {slot} does not fit a bigint"),
                source: None,
            });
        };
        for _ in 0..MAX_ATTEMPTS {
            let rows = self
                .query(op, &self.inner.sql.claim_slot, &[&task.as_str(), &slot_i])
                .await?;
            let Some(row) = rows.first() else {
                continue;
            };
            let claimed: bool = get(row, 0)?;
            let last: i64 = get(row, 1)?;
            if claimed {
                return Ok(SlotClaim::Claimed);
            }
            if last >= slot_i {
                return Ok(SlotClaim::AlreadyRun { last: last as u64 });
            }
            // The snapshot predates a concurrent claim that the upsert saw: ask again.
        }
        Err(StoreError::Unavailable {
            message: format!("{op}: the slot kept changing under concurrent claims"),
            source: None,
        })
    }

    async fn last_slot(&self, task: &LeaseName) -> StoreResult<Option<u64>> {
        let op = Op::new("last_slot", Some(task));
        let rows = self
            .query(op, &self.inner.sql.last_slot, &[&task.as_str()])
            .await?;
        rows.first()
            .map(|row| column::slot(get(row, 0)?))
            .transpose()
    }

    async fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> StoreResult<()> {
        let op = Op::new("record_history", Some(task));
        let Some(key) = to_i64(key) else {
            return Err(StoreError::Rejected {
                message: format!("{op}: history key {key} does not fit a bigint"),
                source: None,
            });
        };
        let keep = i64::try_from(keep.max(1)).unwrap_or(i64::MAX);
        self.query(
            op,
            &self.inner.sql.record_history,
            &[&task.as_str(), &key, &entry, &keep],
        )
        .await?;
        Ok(())
    }

    async fn history(&self, task: &LeaseName, limit: usize) -> StoreResult<Vec<String>> {
        let op = Op::new("history", Some(task));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(op, &self.inner.sql.history, &[&task.as_str(), &limit])
            .await?;
        rows.iter().map(|row| get::<String>(row, 0)).collect()
    }
}

impl Purge for PgStore {
    async fn purge(&self, retention: Duration) -> StoreResult<u64> {
        let retention_ms = retention.as_millis().clamp(0, i64::MAX as u128) as i64;
        let op = Op::new("purge", None);
        let rows = self
            .query(op, &self.inner.sql.purge, &[&retention_ms])
            .await?;
        let deleted: i64 = match rows.first() {
            Some(row) => get(row, 0)?,
            None => 0,
        };
        Ok(deleted.max(0) as u64)
    }
}

impl Membership for PgStore {
    async fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Vec<HolderId>> {
        let ttl_ms = ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        let op = Op::new("members", Some(group));
        let rows = self
            .query(
                op,
                &self.inner.sql.members,
                &[&group.as_str(), &member.as_str(), &ttl_ms],
            )
            .await?;
        let mut members = rows
            .iter()
            .map(|row| column::member(get(row, 0)?))
            .collect::<StoreResult<Vec<_>>>()?;
        members.sort();
        Ok(members)
    }

    async fn leave(&self, group: &LeaseName, member: &HolderId) -> StoreResult<()> {
        let op = Op::new("leave", Some(group));
        self.query(
            op,
            &self.inner.sql.leave,
            &[&group.as_str(), &member.as_str()],
        )
        .await?;
        Ok(())
    }
}
