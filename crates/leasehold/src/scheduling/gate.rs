//! The tick decision, written once: whether a timer firing of a task runs on this instance. The
//! [`Scheduler`](crate::Scheduler) asks it for every gated tick, and the sidecar for every tick
//! an application reports; fleet-wide pause (and any rule to come) is honoured here once.
//!
//! A decision goes, in order: the store's clock (read with the task's control record in one
//! round trip where the store keeps a [`Catalog`]) → is this instance entitled (every instance,
//! the group's leader, or the task's owner under spreading) → is the task paused → is a gated
//! run of the task already going here → the task lease → the forward-only slot claim → is the
//! lease still safe to run under. The answer is a [`Ticket`] to run (holding the task lease) or
//! the reason not to ([`Skip`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::guard::{Lease, LeaseGuard, TryAcquire};
use crate::lease::leader::LeaderState;
pub use crate::scheduling::campaigns::{Campaign, Campaigns};
use crate::scheduling::history::{HistoryWriter, MissReason, RunRecord};
use crate::scheduling::placement::Placement;
use crate::scheduling::task::Trigger;
use crate::store::answers::{SlotClaim, TickAnswer, TickClaim, TickRequest};
use crate::store::capabilities::Capabilities;
use crate::store::catalog::{Control, Pause, TriggerRequest};
use crate::store::error::StoreError;
use crate::store::name::{HolderId, LeaseName};
use crate::store::token::FencingToken;
use crate::store::traits::{Catalog, Slots};

/// The store's clock as a tick read it, with the task's control record when the store keeps
/// one.
#[derive(Debug, Clone)]
pub struct Reading {
    /// The store's clock, ms since the Unix epoch.
    pub now_ms: u64,
    /// The local instant the reading corresponds to (the middle of the round trip).
    pub at: Instant,
    /// The task's control record (pause, pending trigger), if the store has one for it.
    pub control: Option<Control>,
    /// Its version, for compare-and-set.
    pub control_version: Option<u64>,
}

impl Reading {
    /// The manual trigger the control record holds, not yet lapsed, with the record's version.
    pub fn pending_trigger(&self) -> Option<(&Control, u64)> {
        let control = self.control.as_ref()?;
        let trigger = control.trigger.as_ref()?;
        (trigger.expires_ms > self.now_ms).then_some((control, self.control_version?))
    }
}

/// The store's clock as a gate last read it, so the next tick can name its slot before it asks
/// the store (and ask only once, where the store answers [`Slots::tick`] in one round trip).
/// Share one between the gates of a process: the store's clock is the same for every task.
#[derive(Debug, Default)]
pub struct StoreClock(Mutex<Option<(u64, Instant)>>);

impl StoreClock {
    /// No reading yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// An estimate to start from before any reading: `now_ms` (the local wall clock, say) now.
    pub fn starting_at(now_ms: u64) -> Self {
        Self(Mutex::new(Some((now_ms, Instant::now()))))
    }

    /// The store's clock now, ms since the Unix epoch, as the last reading and the local
    /// monotonic clock since then tell; `None` before the first reading.
    pub fn now_ms(&self) -> Option<u64> {
        let (ms, at) = (*lock(&self.0))?;
        Some(ms.saturating_add(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX)))
    }

    pub(crate) fn saw(&self, reading: &Reading) {
        *lock(&self.0) = Some((reading.now_ms, reading.at));
    }
}

/// [`Gate::decide_timer`]'s answer.
#[derive(Debug)]
pub enum TimerDecision {
    /// The slot was decided, at this reading of the store's clock.
    Decided(Reading, Decision),
    /// The store's clock (read) is not in the slot asked about: before it (the estimate ran
    /// ahead), or past the next one (it moved on: a long delay, or a jump of the clock).
    Outside(Reading),
}

/// [`Gate::one_call`]'s answer.
enum OneCall {
    /// Nothing done, the run lock handed back: the store's clock (read) was not in the slot
    /// asked about, or the store refused the call (decide with the separate calls).
    Undecided(Option<Reading>, OwnedMutexGuard<()>),
    /// Decided, with the store's clock where the store answered.
    Decided(Option<Reading>, Result<Ticket, Skip>),
}

/// Why a tick does not run here.
#[derive(Debug)]
#[non_exhaustive]
pub enum Skip {
    /// A leader gate is in use and this instance does not lead.
    NotLeader,
    /// Tasks are spread over instances and another one owns this task.
    NotOwner,
    /// The task is paused fleet-wide; the slot is claimed (so it is never caught up) and
    /// recorded as paused.
    Paused(Pause),
    /// A gated run of this task is already going in this process.
    Overlap,
    /// Another holder has the task lease: a run going elsewhere.
    Busy {
        /// Who holds it.
        holder: HolderId,
    },
    /// This slot, or a later one, was already claimed.
    AlreadyRun {
        /// The highest slot claimed.
        last: u64,
    },
    /// The slot was claimed, but the task lease started expiring before the run could start:
    /// the slot stays claimed and unrun rather than run by a holder about to lose the lease.
    Expiring,
    /// The store could not answer (the task's store-down policy applies).
    StoreDown(StoreError),
    /// The store refused (retrying cannot help).
    Refused(StoreError),
}

impl Skip {
    /// A label for logs, metrics and the sidecar's answers: `not-leader`, `not-owner`,
    /// `paused`, `overlap`, `busy`, `already-run`, `expiring`, `store-down`, `refused`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NotLeader => "not-leader",
            Self::NotOwner => "not-owner",
            Self::Paused(_) => "paused",
            Self::Overlap => "overlap",
            Self::Busy { .. } => "busy",
            Self::AlreadyRun { .. } => "already-run",
            Self::Expiring => "expiring",
            Self::StoreDown(_) => "store-down",
            Self::Refused(_) => "refused",
        }
    }

    fn from_store(error: StoreError) -> Self {
        match error.is_transient() {
            true => Self::StoreDown(error),
            false => Self::Refused(error),
        }
    }
}

/// A tick that runs here: the task lease is held and the slot claimed.
#[derive(Debug)]
pub struct Ticket {
    guard: LeaseGuard,
    slot: u64,
    trigger: Trigger,
    request: Option<TriggerRequest>,
    leader: Option<CancellationToken>,
    _exclusive: OwnedMutexGuard<()>,
}

impl Ticket {
    /// The slot the run is for.
    pub fn slot(&self) -> u64 {
        self.slot
    }

    /// What started it.
    pub fn trigger(&self) -> Trigger {
        self.trigger
    }

    /// For a manual run asked for through the catalog (`leasehold trigger`): the request.
    pub fn request(&self) -> Option<&TriggerRequest> {
        self.request.as_ref()
    }

    /// This ticket, for the run of `slot` (a backfill's, under the lease its take held).
    pub(crate) fn for_slot(mut self, slot: u64) -> Self {
        self.slot = slot;
        self
    }

    /// The task lease held for the run (its token fences the run's writes).
    pub fn guard(&self) -> &LeaseGuard {
        &self.guard
    }

    /// Fires when leadership of the task's group starts expiring, for runs gated on a leader.
    pub fn leader_signal(&self) -> Option<&CancellationToken> {
        self.leader.as_ref()
    }

    /// The task lease, to hand over once the run ended (or to keep it past the gate, as the
    /// sidecar does for the application's run).
    pub fn into_guard(self) -> LeaseGuard {
        self.guard
    }
}

/// The gate's answer.
#[derive(Debug)]
pub enum Decision {
    /// Run it here.
    Run(Ticket),
    /// Do not.
    Skip(Skip),
}

/// Which instances may contend for a task's slots.
#[derive(Clone, Default)]
pub(crate) enum Contender {
    /// Every instance: the task lease and the slot claim pick one.
    #[default]
    Anyone,
    /// The leader of a group only.
    Leader(watch::Receiver<LeaderState>),
    /// The owner of the task among a spread group's members only.
    Owner(Arc<Placement>),
    /// The leader of a group campaigned for on demand ([`Campaigns`]).
    Campaign(Arc<Campaign>),
}

/// The gate of one task: see the module documentation.
pub struct Gate<S> {
    lease: Lease<S>,
    contender: Contender,
    /// Held by a gated run of this task in this process, so two never use the task lease at
    /// once.
    exclusive: Arc<tokio::sync::Mutex<()>>,
    history: Option<HistoryWriter>,
    /// Ends a catch-up's wait for the task lease.
    stop: CancellationToken,
}

impl<S: Slots + Catalog> Gate<S> {
    /// The gate of the task `lease` names, where every instance contends.
    pub fn new(lease: Lease<S>) -> Self {
        Self {
            lease,
            contender: Contender::Anyone,
            exclusive: Arc::default(),
            history: None,
            stop: CancellationToken::new(),
        }
    }

    /// Only the instance that leads the group `campaign` stands for contends.
    pub fn led_by(mut self, campaign: Arc<Campaign>) -> Self {
        self.contender = Contender::Campaign(campaign);
        self
    }

    pub(crate) fn contender(mut self, contender: Contender) -> Self {
        self.contender = contender;
        self
    }

    /// Records the slots the gate knows were missed (paused, or overlapping a run) here.
    pub fn recording(mut self, history: HistoryWriter) -> Self {
        self.history = Some(history);
        self
    }

    /// A catch-up tick's wait for the task lease ends when `stop` fires.
    pub fn stopping_on(mut self, stop: CancellationToken) -> Self {
        self.stop = stop;
        self
    }

    /// The task lease.
    pub fn lease(&self) -> &Lease<S> {
        &self.lease
    }

    /// Held by a gated run of the task in this process (a manual exclusive run takes it too).
    pub(crate) fn exclusive(&self) -> Arc<tokio::sync::Mutex<()>> {
        self.exclusive.clone()
    }

    fn task(&self) -> &LeaseName {
        self.lease.name()
    }

    fn limit(&self) -> Duration {
        self.lease.config().renew_interval
    }

    /// The store's clock (and the task's control record, in the same round trip, when the store
    /// keeps a catalog), within the renew interval.
    pub async fn read_clock(&self) -> Result<Reading, StoreError> {
        let store = self.lease.store();
        let limit = self.limit();
        let sent = Instant::now();
        let mut control_read = None;
        if store.capabilities().contains(Capabilities::CATALOG) {
            match crate::store::within(limit, store.control(self.task())).await {
                Ok(read) => control_read = Some(read),
                // A user not allowed the catalog (an ACL from before it existed): ticks go on
                // without pause and trigger.
                Err(e @ (StoreError::Rejected { .. } | StoreError::Unsupported(_))) => {
                    if !CATALOG_REFUSED.swap(true, Ordering::Relaxed) {
                        tracing::warn!(task = %self.task(), error = %e, "the store refuses the catalog: pause and trigger are not honoured until it allows it");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let (now_ms, control) = match control_read {
            Some(read) => (read.now_ms, read.control),
            None => (crate::store::within(limit, store.now_millis()).await?, None),
        };
        let (control, control_version) = match control {
            Some(v) => (Some(Control::from_json(&v.value)?), Some(v.version)),
            None => (None, None),
        };
        Ok(Reading {
            now_ms,
            at: sent + sent.elapsed() / 2,
            control,
            control_version,
        })
    }

    /// Whether this instance may contend for the task's slots now, with the leadership's
    /// expiring signal when it is a leader's.
    pub(crate) async fn entitled(&self) -> Result<Option<CancellationToken>, Skip> {
        match &self.contender {
            Contender::Anyone => Ok(None),
            Contender::Leader(state) => state
                .borrow()
                .term_signal()
                .map(Some)
                .ok_or(Skip::NotLeader),
            Contender::Owner(placement) => match placement.owns(self.task()) {
                Some(_) => Ok(None),
                None => Err(Skip::NotOwner),
            },
            Contender::Campaign(campaign) => {
                campaign.leads().await.map(Some).ok_or(Skip::NotLeader)
            }
        }
    }

    /// Whether `slot` runs here. `reading` is the store's clock read for this tick (the caller
    /// checked that it reached `slot`). A catch-up tick that finds the task lease busy waits
    /// once for it (typically the run lease of a crashed leader, running out within a ttl).
    pub async fn decide(&self, reading: &Reading, slot: u64, trigger: Trigger) -> Decision {
        match self.try_decide(reading, slot, trigger).await {
            Ok(ticket) => Decision::Run(ticket),
            Err(skip) => Decision::Skip(skip),
        }
    }

    /// Whether a timer firing of `slot` (before `next`) runs here: in one store round trip
    /// where the store answers [`Slots::tick`] itself ([`Capabilities::TICK`]), which claims it
    /// only while its own clock is in that slot; else the store's clock is read (with the
    /// control record) and the separate calls decide. Every reading updates `clock`.
    pub async fn decide_timer(
        &self,
        slot: u64,
        next: Option<u64>,
        clock: &StoreClock,
    ) -> Result<TimerDecision, StoreError> {
        if self.one_call_answers() {
            let estimated = Reading {
                now_ms: clock.now_ms().unwrap_or(slot),
                at: Instant::now(),
                control: None,
                control_version: None,
            };
            let leader = match self.entitled().await {
                Ok(leader) => leader,
                Err(skip) => return Ok(TimerDecision::Decided(estimated, Decision::Skip(skip))),
            };
            // A run going here: whether the slot is paused or overlapping needs the control
            // record first, as below.
            if let Ok(exclusive) = self.exclusive.clone().try_lock_owned() {
                match self.one_call(slot, next, leader, exclusive).await {
                    OneCall::Decided(reading, outcome) => {
                        if let Some(reading) = &reading {
                            clock.saw(reading);
                        }
                        let decision = match outcome {
                            Ok(ticket) => Decision::Run(ticket),
                            Err(skip) => Decision::Skip(skip),
                        };
                        return Ok(TimerDecision::Decided(
                            reading.unwrap_or(estimated),
                            decision,
                        ));
                    }
                    OneCall::Undecided(Some(reading), _) => {
                        clock.saw(&reading);
                        return Ok(TimerDecision::Outside(reading));
                    }
                    // The store refused the one call: the separate calls.
                    OneCall::Undecided(None, _) => {}
                }
            }
        }
        let reading = self.read_clock().await?;
        clock.saw(&reading);
        if reading.now_ms < slot || next.is_some_and(|next| reading.now_ms >= next) {
            return Ok(TimerDecision::Outside(reading));
        }
        let decision = self.decide(&reading, slot, Trigger::Timer).await;
        Ok(TimerDecision::Decided(reading, decision))
    }

    /// Whether the store decides a timer tick in one call that reads the control record too.
    fn one_call_answers(&self) -> bool {
        let caps = self.lease.store().capabilities();
        caps.contains(Capabilities::TICK) && !ONE_CALL_REFUSED.load(Ordering::Relaxed)
    }

    /// A timer tick of `slot` (before `next`) in one [`Slots::tick`] call, once this instance
    /// is entitled and holds `exclusive`.
    async fn one_call(
        &self,
        slot: u64,
        next: Option<u64>,
        leader: Option<CancellationToken>,
        exclusive: OwnedMutexGuard<()>,
    ) -> OneCall {
        let config = self.lease.config();
        let request = TickRequest::new(self.task(), self.lease.holder(), config.ttl, slot, next);
        let sent = Instant::now();
        let answer = crate::store::within(self.limit(), self.lease.store().tick(&request)).await;
        let (answer, reading) = match answer.and_then(|a| Ok((reading_of(&a, sent)?, a))) {
            Ok((reading, answer)) => (answer, reading),
            // A user not allowed every command of the one call (an ACL from before it): the
            // separate calls from now on, which honour what this user may do.
            Err(e @ StoreError::Rejected { .. }) => {
                if !ONE_CALL_REFUSED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(task = %self.task(), error = %e, "the store refuses the one-call tick decision: deciding ticks with separate calls");
                }
                return OneCall::Undecided(None, exclusive);
            }
            Err(e) => return OneCall::Decided(None, Err(Skip::from_store(e))),
        };
        let outcome = match answer.claim {
            TickClaim::OutsideSlot => return OneCall::Undecided(Some(reading), exclusive),
            TickClaim::Claimed { token } => self.ticket(token, sent, slot, leader, exclusive).await,
            TickClaim::Paused => {
                drop(exclusive);
                let pause = reading.control.as_ref().and_then(|c| c.paused.clone());
                match pause {
                    Some(pause) => {
                        self.paused(slot, &pause).await;
                        Err(Skip::Paused(pause))
                    }
                    None => Err(Skip::Refused(StoreError::Corrupt(format!(
                        "the store paused {} without a pause in its control record",
                        self.task()
                    )))),
                }
            }
            TickClaim::Busy { holder, last, .. } => Err(self.busy_with(slot, holder, last)),
            TickClaim::AlreadyRun { last } => Err(Skip::AlreadyRun { last }),
        };
        OneCall::Decided(Some(reading), outcome)
    }

    /// The ticket of a timer run whose task lease the store granted with `token` (the request
    /// sent at `sent`) and whose slot it claimed; not one if the lease is already expiring.
    async fn ticket(
        &self,
        token: FencingToken,
        sent: Instant,
        slot: u64,
        leader: Option<CancellationToken>,
        exclusive: OwnedMutexGuard<()>,
    ) -> Result<Ticket, Skip> {
        let guard = match self.lease.adopt(token, sent).await {
            Ok(guard) => guard,
            Err(e) => return Err(self.lease_failed(e)),
        };
        if guard.cancellation_token().is_cancelled() || !guard.is_held() {
            tracing::warn!(task = %self.task(), slot, "task lease expiring before the run could start; slot not run");
            release_in_background(guard);
            return Err(Skip::Expiring);
        }
        Ok(Ticket {
            guard,
            slot,
            trigger: Trigger::Timer,
            request: None,
            leader,
            _exclusive: exclusive,
        })
    }

    /// The skip for a task lease that could not be taken.
    fn lease_failed(&self, e: crate::lease::guard::LeaseError) -> Skip {
        match e {
            crate::lease::guard::LeaseError::Store(e) => Skip::from_store(e),
            // A grant that came too late, or a timing the store cannot hold.
            other => Skip::StoreDown(StoreError::Timeout(match other {
                crate::lease::guard::LeaseError::LateReply { elapsed } => elapsed,
                _ => self.limit(),
            })),
        }
    }

    async fn try_decide(
        &self,
        reading: &Reading,
        slot: u64,
        trigger: Trigger,
    ) -> Result<Ticket, Skip> {
        let leader = self.entitled().await?;
        if let Some(pause) = reading.control.as_ref().and_then(|c| c.paused.clone()) {
            self.paused(slot, &pause).await;
            return Err(Skip::Paused(pause));
        }
        let mut exclusive = self.exclusive.clone().try_lock_owned().map_err(|_| {
            self.missed(slot, MissReason::Overlap);
            Skip::Overlap
        })?;
        if trigger == Trigger::Timer && self.one_call_answers() {
            // The store's clock passed `slot` when `reading` was taken; it is outside it now
            // only if it stepped back, and then the calls below decide as they always did.
            match self.one_call(slot, None, leader.clone(), exclusive).await {
                OneCall::Decided(_, outcome) => return outcome,
                OneCall::Undecided(_, handed_back) => exclusive = handed_back,
            }
        }
        let mut attempt = self.lease.try_acquire().await;
        if trigger == Trigger::CatchUp
            && let Ok(TryAcquire::Busy { remaining, .. }) = &attempt
        {
            let wait = (*remaining).min(self.lease.config().ttl) + Duration::from_millis(10);
            tokio::select! {
                () = self.stop.cancelled() => return Err(Skip::NotLeader),
                () = fired(leader.as_ref()) => return Err(Skip::NotLeader),
                () = tokio::time::sleep(wait) => {}
            }
            attempt = self.lease.try_acquire().await;
        }
        let guard = match attempt {
            Ok(TryAcquire::Acquired(guard)) => guard,
            Ok(TryAcquire::Busy { holder, .. }) => return Err(self.busy(slot, holder).await),
            Err(e) => return Err(self.lease_failed(e)),
        };
        let expiring = guard.cancellation_token();
        let claim = tokio::select! {
            biased;
            () = expiring.cancelled() => None,
            claim = crate::store::within(self.limit(), self.lease.store().claim_slot(self.task(), slot)) => Some(claim),
        };
        let outcome = match claim {
            // The lease started expiring while the claim was on its way.
            None => Err(Skip::Expiring),
            Some(claim) => match claim {
                Ok(SlotClaim::Claimed) if expiring.is_cancelled() || !guard.is_held() => {
                    tracing::warn!(task = %self.task(), slot, "task lease expiring before the run could start; slot not run");
                    Err(Skip::Expiring)
                }
                Ok(SlotClaim::Claimed) => Ok(()),
                Ok(SlotClaim::AlreadyRun { last }) => Err(Skip::AlreadyRun { last }),
                Err(e) => Err(Skip::from_store(e)),
            },
        };
        match outcome {
            Ok(()) => Ok(Ticket {
                guard,
                slot,
                trigger,
                request: None,
                leader,
                _exclusive: exclusive,
            }),
            Err(skip) => {
                release_in_background(guard);
                Err(skip)
            }
        }
    }

    /// Takes the task's pending manual trigger (from `reading`, or a control record read with
    /// the store's clock at `now_ms`) if this instance may run the task now: it is entitled,
    /// no gated run of the task is going here, the task lease is free, and the trigger is still
    /// there when it is taken (compare-and-set, so exactly one instance takes it). The ticket's
    /// slot is the trigger's time. `None`: nothing to take, or not here.
    pub async fn take_trigger(
        &self,
        control: &Control,
        version: u64,
        now_ms: u64,
    ) -> Result<Option<Ticket>, StoreError> {
        let Some(request) = control.trigger.clone().filter(|t| t.expires_ms > now_ms) else {
            return Ok(None);
        };
        let Ok(leader) = self.entitled().await else {
            return Ok(None);
        };
        let Ok(exclusive) = self.exclusive.clone().try_lock_owned() else {
            return Ok(None);
        };
        let guard = match self.lease.try_acquire().await {
            Ok(TryAcquire::Acquired(guard)) => guard,
            Ok(TryAcquire::Busy { .. }) => return Ok(None),
            Err(crate::lease::guard::LeaseError::Store(e)) => return Err(e),
            Err(_) => return Ok(None),
        };
        let taken = Control {
            trigger: None,
            ..control.clone()
        }
        .to_json();
        let write = self
            .lease
            .store()
            .set_control(self.task(), Some(version), &taken);
        // A backfill's ticket holds the lease for its first slot (the lifecycle names it).
        let trigger = match request.slots {
            Some(_) => Trigger::Backfill,
            None => Trigger::Manual,
        };
        match crate::store::within(self.limit(), write).await {
            Ok(Some(_)) => Ok(Some(Ticket {
                guard,
                slot: request.at_ms,
                trigger,
                request: Some(request),
                leader,
                _exclusive: exclusive,
            })),
            // Another instance took it (or the record changed): not ours.
            Ok(None) => {
                release_in_background(guard);
                Ok(None)
            }
            Err(e) => {
                release_in_background(guard);
                Err(e)
            }
        }
    }

    /// The task lease for a backfill run of `slot`, asked for by `request`: once no gated run
    /// of the task is going here and the task lease is free (both waited for, the lease's
    /// holder elsewhere for as long as it holds it). The slot is not claimed: a backfill runs
    /// past slots, and the forward-only claim stays where the timer left it. `None`: this
    /// instance is no longer entitled, the gate was stopped, or the store refused.
    pub async fn hold_for_backfill(&self, slot: u64, request: &TriggerRequest) -> Option<Ticket> {
        let exclusive = tokio::select! {
            () = self.stop.cancelled() => return None,
            held = self.exclusive.clone().lock_owned() => held,
        };
        loop {
            let leader = self.entitled().await.ok()?;
            let wait = match self.lease.try_acquire().await {
                Ok(TryAcquire::Acquired(guard)) => {
                    return Some(Ticket {
                        guard,
                        slot,
                        trigger: Trigger::Backfill,
                        request: Some(request.clone()),
                        leader,
                        _exclusive: exclusive,
                    });
                }
                Ok(TryAcquire::Busy { remaining, .. }) => {
                    remaining.min(self.lease.config().ttl) + Duration::from_millis(10)
                }
                Err(crate::lease::guard::LeaseError::Store(e)) if !e.is_transient() => {
                    tracing::warn!(task = %self.task(), slot, error = %e, "backfill stopped: the store refused the task lease");
                    return None;
                }
                // An outage: tried again after a renew interval.
                Err(_) => self.limit(),
            };
            tokio::select! {
                () = self.stop.cancelled() => return None,
                () = fired(leader.as_ref()) => return None,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Another holder has the task lease. With a leader (or an owner) only this instance ticks,
    /// so that is a run overlapping this slot, and it is missed; with anyone contending it is
    /// usually another instance running this very slot, which the slot record tells.
    async fn busy(&self, slot: u64, holder: HolderId) -> Skip {
        if !matches!(self.contender, Contender::Anyone) {
            return self.busy_with(slot, holder, None);
        }
        let last = crate::store::within(self.limit(), self.lease.store().last_slot(self.task()));
        self.busy_with(slot, holder, last.await.ok().flatten())
    }

    /// [`busy`](Self::busy) with the highest slot claimed already known (`last`).
    fn busy_with(&self, slot: u64, holder: HolderId, last: Option<u64>) -> Skip {
        if !matches!(self.contender, Contender::Anyone) {
            self.missed(slot, MissReason::Overlap);
            return Skip::Busy { holder };
        }
        match last {
            Some(last) if last >= slot => Skip::AlreadyRun { last },
            _ => Skip::Busy { holder },
        }
    }

    /// A paused slot: claimed, so that no instance runs it or catches it up after the resume,
    /// and recorded once (by whoever claims it).
    pub(crate) async fn paused(&self, slot: u64, pause: &Pause) {
        let claim = crate::store::within(
            self.limit(),
            self.lease.store().claim_slot(self.task(), slot),
        );
        if let Ok(SlotClaim::Claimed) = claim.await
            && let Some(history) = &self.history
        {
            let mut record =
                RunRecord::missed(slot, 1, slot, MissReason::NotClaimed, self.lease.holder());
            record.paused = Some(pause.clone());
            history.record(self.task(), record);
        }
    }

    fn missed(&self, slot: u64, reason: MissReason) {
        if let Some(history) = &self.history {
            let record = RunRecord::missed(slot, 1, slot, reason, self.lease.holder());
            history.record(self.task(), record);
        }
    }
}

/// The reading a [`Slots::tick`] answer carries, taken at the middle of the round trip that
/// started at `sent`.
fn reading_of(answer: &TickAnswer, sent: Instant) -> Result<Reading, StoreError> {
    let (control, control_version) = match &answer.control {
        Some(v) => (Some(Control::from_json(&v.value)?), Some(v.version)),
        None => (None, None),
    };
    Ok(Reading {
        now_ms: answer.now_ms,
        at: sent + sent.elapsed() / 2,
        control,
        control_version,
    })
}

async fn fired(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

pub(crate) fn release_in_background(guard: LeaseGuard) {
    tokio::spawn(async move {
        if let Err(e) = guard.release().await {
            tracing::debug!(error = %e, "task lease release failed; it expires after its ttl");
        }
    });
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether a refused catalog was warned about (once per process).
static CATALOG_REFUSED: AtomicBool = AtomicBool::new(false);

/// Whether the store refused the one-call tick decision (then ticks use the separate calls).
static ONE_CALL_REFUSED: AtomicBool = AtomicBool::new(false);
