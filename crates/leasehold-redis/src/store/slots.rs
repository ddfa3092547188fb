//! Slots (claims, gated ticks, run history), purge and group membership.

use leasehold::store::{SlotClaim, TickAnswer, TickClaim, TickRequest};
use leasehold::{Membership, Slots};

use super::*;
use crate::scripts::{
    CLAIM_SLOT, HISTORY, HISTORY_KEY_DIGITS, LAST_SLOT, LEAVE, MEMBERS, RECORD_HISTORY, TICK,
};

impl Slots for RedisStore {
    async fn claim_slot(&self, task: &LeaseName, slot: u64) -> StoreResult<SlotClaim> {
        let op = Op::new("claim_slot", Some(task));
        let reply = self
            .eval(
                &CLAIM_SLOT,
                &[self.key(task, SLOT)],
                &[Arg::Int(slot)],
                op,
                false,
                None,
            )
            .await?;
        let reply = items(op, reply)?;
        match int(op, reply.first())? {
            1 => Ok(SlotClaim::Claimed),
            _ => Ok(SlotClaim::AlreadyRun {
                last: slot_number(op, reply.get(1))?,
            }),
        }
    }

    async fn last_slot(&self, task: &LeaseName) -> StoreResult<Option<u64>> {
        let op = Op::new("last_slot", Some(task));
        let reply = self
            .eval(&LAST_SLOT, &[self.key(task, SLOT)], &[], op, true, None)
            .await?;
        if reply == Value::Nil {
            return Ok(None);
        }
        slot_number(op, Some(&reply)).map(Some)
    }

    /// One script (`scripts::TICK`): the clock, the control record, the slot, the lease, and the
    /// lease and the claim if all agree; every key under the task's hash tag.
    async fn tick(&self, request: &TickRequest<'_>) -> StoreResult<TickAnswer> {
        let task = request.task;
        let op = Op::new("tick", Some(task));
        let next = request.next.map_or(Arg::Str(""), Arg::Int);
        let reply = self
            .eval(
                &TICK,
                &[
                    self.key(task, LEASE),
                    self.key(task, FENCE),
                    self.key(task, SLOT),
                    self.key(task, TASK_KIND),
                ],
                &[
                    Arg::Str(request.holder.as_str()),
                    ttl_millis(request.ttl),
                    ttl_millis(self.inner.retention.max(request.ttl)),
                    Arg::Int(request.slot),
                    next,
                ],
                op,
                false,
                Some(request.ttl),
            )
            .await?;
        let reply = items(op, reply)?;
        let now_ms = u64::try_from(int(op, reply.get(1))?).unwrap_or(0);
        let control = control_record(op, reply.get(2), reply.get(3))?;
        let claim = match int(op, reply.first())? {
            1 => TickClaim::Claimed {
                token: token(op, reply.get(4))?,
            },
            2 => TickClaim::OutsideSlot,
            3 => TickClaim::Paused,
            4 => TickClaim::AlreadyRun {
                last: slot_number(op, reply.get(4))?,
            },
            _ => TickClaim::Busy {
                last: match reply.get(4) {
                    None | Some(Value::Nil) => None,
                    last => Some(slot_number(op, last)?),
                },
                holder: holder(op, reply.get(5))?,
                remaining: remaining(op, reply.get(6))?,
            },
        };
        Ok(TickAnswer::new(now_ms, control, claim))
    }

    async fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> StoreResult<()> {
        let op = Op::new("record_history", Some(task));
        // Replacing the entry of one key is idempotent, so a retry after a lost reply is safe.
        self.eval(
            &RECORD_HISTORY,
            &[self.key(task, HISTORY_KIND)],
            &[
                Arg::Str(&format!("{key:0width$}", width = HISTORY_KEY_DIGITS)),
                Arg::Str(entry),
                // `keep` 0 counts as 1 (the trait's rule).
                Arg::Int(keep.max(1) as u64),
            ],
            op,
            true,
            None,
        )
        .await?;
        Ok(())
    }

    async fn history(&self, task: &LeaseName, limit: usize) -> StoreResult<Vec<String>> {
        let op = Op::new("history", Some(task));
        if limit == 0 {
            return Ok(Vec::new());
        }
        let history = self.history_key(task);
        let last_rank = limit.min(i64::MAX as usize) - 1;
        let reply = self
            .eval(
                &HISTORY,
                &[self.key(task, HISTORY_KIND)],
                &[Arg::Int(last_rank as u64)],
                op,
                true,
                None,
            )
            .await?;
        items(op, reply)?
            .iter()
            .map(|member| {
                let member = text(op, Some(member))?;
                match member.as_bytes().get(HISTORY_KEY_DIGITS) {
                    Some(b':')
                        if member.as_bytes()[..HISTORY_KEY_DIGITS]
                            .iter()
                            .all(u8::is_ascii_digit) =>
                    {
                        Ok(member[HISTORY_KEY_DIGITS + 1..].to_owned())
                    }
                    _ => Err(corrupt(
                        op,
                        format_args!(
                            "history key {history} holds a member that is not a leasehold \
                             history entry"
                        ),
                    )),
                }
            })
            .collect()
    }
}

/// No purge: every record expires by itself on the server (a lease when its ttl runs out, its
/// fencing counter a [`retention`](crate::RedisConfig::retention) later).
impl Membership for RedisStore {
    async fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Vec<HolderId>> {
        let op = Op::new("members", Some(group));
        let reply = self
            .eval(
                &MEMBERS,
                &[self.key(group, MEMBERS_KIND)],
                &[Arg::Str(member.as_str()), ttl_millis(ttl)],
                op,
                true,
                Some(ttl),
            )
            .await?;
        let mut members = items(op, reply)?
            .iter()
            .map(|v| holder(op, Some(v)))
            .collect::<StoreResult<Vec<_>>>()?;
        members.sort();
        Ok(members)
    }

    async fn leave(&self, group: &LeaseName, member: &HolderId) -> StoreResult<()> {
        let op = Op::new("leave", Some(group));
        self.eval(
            &LEAVE,
            &[self.key(group, MEMBERS_KIND)],
            &[Arg::Str(member.as_str())],
            op,
            true,
            None,
        )
        .await?;
        Ok(())
    }
}
