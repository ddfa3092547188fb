//! The default [`Slots::tick`](crate::store::Slots::tick): the store's half of a gated tick
//! composed of the separate calls, for stores that do not answer it in one round trip.

use std::future::Future;
use std::time::Duration;

use crate::store::answers::{Acquisition, Release, SlotClaim, TickAnswer, TickClaim, TickRequest};
use crate::store::catalog::{Control, ControlRead};
use crate::store::error::StoreResult;
use crate::store::name::{HolderId, LeaseName};
use crate::store::token::FencingToken;

/// The separate calls a tick is composed of. Every [`Slots`](crate::store::Slots) store makes
/// them (the blanket impl beside the trait), so this file need not know the store traits.
pub(crate) trait TickCalls: Sync {
    fn clock(&self) -> impl Future<Output = StoreResult<u64>> + Send;
    fn take<'a>(
        &'a self,
        task: &'a LeaseName,
        holder: &'a HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Acquisition>> + Send + 'a;
    fn hand_back<'a>(
        &'a self,
        task: &'a LeaseName,
        holder: &'a HolderId,
        token: FencingToken,
    ) -> impl Future<Output = StoreResult<Release>> + Send + 'a;
    fn highest_slot<'a>(
        &'a self,
        task: &'a LeaseName,
    ) -> impl Future<Output = StoreResult<Option<u64>>> + Send + 'a;
    fn claim<'a>(
        &'a self,
        task: &'a LeaseName,
        slot: u64,
    ) -> impl Future<Output = StoreResult<SlotClaim>> + Send + 'a;
}

/// [`Slots::tick`](crate::store::Slots::tick) from the separate calls (see there); with `read`
/// (the clock and the task's control record, read by the caller) the control record is honoured
/// too.
pub(crate) async fn compose_tick<S: TickCalls>(
    store: &S,
    request: &TickRequest<'_>,
    read: Option<ControlRead>,
) -> StoreResult<TickAnswer> {
    let TickRequest {
        task,
        holder,
        ttl,
        slot,
        next,
    } = *request;
    let (now_ms, control) = match read {
        Some(read) => (read.now_ms, read.control),
        None => (store.clock().await?, None),
    };
    let paused = match &control {
        Some(v) => Control::from_json(&v.value)?.paused.is_some(),
        None => false,
    };
    let answer = |claim| TickAnswer {
        now_ms,
        control: control.clone(),
        claim,
    };
    if now_ms < slot || next.is_some_and(|next| now_ms >= next) {
        return Ok(answer(TickClaim::OutsideSlot));
    }
    if paused {
        return Ok(answer(TickClaim::Paused));
    }
    let token = match store.take(task, holder, ttl).await? {
        Acquisition::Acquired { token } => token,
        Acquisition::Busy { holder, remaining } => {
            let last = store.highest_slot(task).await?;
            return Ok(answer(TickClaim::Busy {
                holder,
                remaining,
                last,
            }));
        }
    };
    let claim = store.claim(task, slot).await;
    if !matches!(claim, Ok(SlotClaim::Claimed)) {
        // Not ours to run: hand the lease back (it expires after its ttl if this fails).
        let _ = store.hand_back(task, holder, token).await;
    }
    Ok(answer(match claim? {
        SlotClaim::Claimed => TickClaim::Claimed { token },
        SlotClaim::AlreadyRun { last } => TickClaim::AlreadyRun { last },
    }))
}
