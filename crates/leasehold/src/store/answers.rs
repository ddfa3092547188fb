//! What the store operations answer: each is a value a caller matches on (`Busy` and `Lost` are
//! answers, not errors), and each has a label ([`Answer`]) that [`Metered`](crate::store::Metered)
//! counts it under.

use std::time::Duration;

use crate::store::name::{HolderId, LeaseName};
use crate::store::token::FencingToken;

/// Answer to [`Store::acquire`](crate::store::Store::acquire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquisition {
    /// The caller holds the lease with this token: a new tenure, whose token is above every token
    /// handed out for this name before. A holder that acquires again while it still holds the
    /// lease gets a new token too, and its older tenure ends (renew and release with the old
    /// token then answer `Lost` / `NotHeld`).
    Acquired {
        /// The fencing token of this tenure.
        token: FencingToken,
    },
    /// Someone else holds it.
    Busy {
        /// The current holder.
        holder: HolderId,
        /// Time left on the holder's lease, on the store's clock.
        remaining: Duration,
    },
}

/// Answer to [`Store::renew`](crate::store::Store::renew).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended by the requested ttl from the store's now.
    Renewed,
    /// The caller no longer holds the lease with that token (expired, taken over or released).
    Lost,
}

/// Answer to [`Store::release`](crate::store::Store::release).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The lease is free now.
    Released,
    /// The caller did not hold it with that token; nothing changed.
    NotHeld,
}

/// What [`Store::inspect`](crate::store::Store::inspect) sees of a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseState {
    /// The current holder, if the lease is held and not expired.
    pub holder: Option<HolderId>,
    /// The last token handed out for this name (kept after release and expiry).
    pub token: FencingToken,
    /// Time left on the current holder's lease; zero when free.
    pub remaining: Duration,
}

/// Answer to [`Slots::claim_slot`](crate::store::Slots::claim_slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotClaim {
    /// First claim of this slot anywhere: run it.
    Claimed,
    /// This slot, or a later one, was already claimed: do not run it.
    AlreadyRun {
        /// The highest slot claimed so far.
        last: u64,
    },
}

/// A value and the version the store gave it, for compare-and-set: a task's control record as
/// [`Catalog`](crate::store::Catalog) keeps it and a tick reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// Starts at 1 and goes up by one with every write.
    pub version: u64,
    /// The value (JSON text).
    pub value: String,
}

/// What [`Slots::tick`](crate::store::Slots::tick) is asked: the store's half of a gated tick of
/// `task`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct TickRequest<'a> {
    /// The task: its lease, slot record and control record.
    pub task: &'a LeaseName,
    /// Who takes the task lease.
    pub holder: &'a HolderId,
    /// The task lease's ttl.
    pub ttl: Duration,
    /// The slot to claim (ms on the store's clock), named by the caller's idea of that clock.
    pub slot: u64,
    /// The slot after it, if there is one. The claim is made only while the store's clock is
    /// at or past `slot` and before `next`, so a slot named from a stale idea of the clock is
    /// never claimed in place of the one due.
    pub next: Option<u64>,
}

impl<'a> TickRequest<'a> {
    /// A tick of `task` by `holder` (task lease ttl `ttl`) for `slot`, before `next`.
    pub fn new(
        task: &'a LeaseName,
        holder: &'a HolderId,
        ttl: Duration,
        slot: u64,
        next: Option<u64>,
    ) -> Self {
        Self {
            task,
            holder,
            ttl,
            slot,
            next,
        }
    }
}

/// Answer to [`Slots::tick`](crate::store::Slots::tick).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickAnswer {
    /// The store's clock when it decided, ms since the Unix epoch.
    pub now_ms: u64,
    /// The task's control record, where the store read it
    /// ([`Capabilities::TICK`](crate::store::Capabilities::TICK)).
    pub control: Option<Versioned>,
    /// What happened.
    pub claim: TickClaim,
}

impl TickAnswer {
    /// The store's clock `now_ms`, the control record if read, and what happened.
    pub fn new(now_ms: u64, control: Option<Versioned>, claim: TickClaim) -> Self {
        Self {
            now_ms,
            control,
            claim,
        }
    }
}

/// What [`Slots::tick`](crate::store::Slots::tick) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickClaim {
    /// The task lease is taken (a new tenure with this token) and the slot claimed: run it.
    Claimed {
        /// The task lease's fencing token.
        token: FencingToken,
    },
    /// The store's clock is not in `[slot, next)`: nothing was done; `now_ms` names the slot.
    OutsideSlot,
    /// The task's control record pauses it: nothing was done (the caller records the slot).
    Paused,
    /// Another holder has the task lease: nothing was done.
    Busy {
        /// The current holder.
        holder: HolderId,
        /// Time left on its lease.
        remaining: Duration,
        /// The highest slot claimed so far, if any.
        last: Option<u64>,
    },
    /// This slot, or a later one, was already claimed: the task lease was not taken.
    AlreadyRun {
        /// The highest slot claimed so far.
        last: u64,
    },
}

/// A successful answer, as the `result` label of [`Metered`](crate::store::Metered) names it.
pub trait Answer: Send + 'static {
    /// `acquired`, `busy`, `renewed`, `lost`, ... where the answer has a meaning; `ok` else.
    fn label(&self) -> &'static str {
        "ok"
    }
}

impl Answer for Acquisition {
    fn label(&self) -> &'static str {
        match self {
            Self::Acquired { .. } => "acquired",
            Self::Busy { .. } => "busy",
        }
    }
}

impl Answer for Renewal {
    fn label(&self) -> &'static str {
        match self {
            Self::Renewed => "renewed",
            Self::Lost => "lost",
        }
    }
}

/// A batch is `lost` when any lease in it was.
impl Answer for Vec<Renewal> {
    fn label(&self) -> &'static str {
        match self.contains(&Renewal::Lost) {
            true => "lost",
            false => "renewed",
        }
    }
}

impl Answer for Release {
    fn label(&self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotHeld => "not-held",
        }
    }
}

impl Answer for SlotClaim {
    fn label(&self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::AlreadyRun { .. } => "already-run",
        }
    }
}

impl Answer for TickAnswer {
    fn label(&self) -> &'static str {
        match self.claim {
            TickClaim::Claimed { .. } => "claimed",
            TickClaim::OutsideSlot => "outside-slot",
            TickClaim::Paused => "paused",
            TickClaim::Busy { .. } => "busy",
            TickClaim::AlreadyRun { .. } => "already-run",
        }
    }
}

impl Answer for () {}
impl Answer for u64 {}
impl Answer for Option<u64> {}
impl Answer for Option<LeaseState> {}
impl Answer for Option<Versioned> {}
impl Answer for Vec<String> {}
impl Answer for Vec<HolderId> {}
