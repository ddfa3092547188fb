//! A task's life around its gate, written once for every driver: the scheduler's timer
//! ([`Scheduler`](crate::Scheduler)) and the sidecar's ticks (an application's own timer, over
//! HTTP) both hand each firing to a [`TaskTicks`], which
//!
//! - names the slot the firing is for, from the store's clock as last read ([`StoreClock`]): a
//!   firing a little early (a caller whose clock runs ahead of the store's) is for the slot
//!   about to start, which it waits for ([`Schedule::early_tolerance`]), never for the previous one;
//! - takes a manual trigger that a timer run here left waiting before anything else;
//! - looks for missed slots whenever the firing does not follow the last slot decided here
//!   (the first firing, a new term, an outage, a long run, a jump of the wall clock), from one
//!   source: the store's forward-only slot claim. Slots nobody claimed are recorded as missed,
//!   with the reason this instance knows (the store was down, a run here outlived them) or as
//!   not claimed; those the task's [`CatchUp`] policy allows are run, labelled catch-up — and
//!   so is the slot due now when it is older than a firing on time could be (a task's first
//!   firing, a clock that jumped): a slot runs as `timer` only when it is fired on time;
//! - applies the task's store-down policy when the store does not answer;
//! - decides what a slot that falls while a run here is going comes to, under the task's
//!   [`Overlap`] policy ([`TaskTicks::overlapping`]): skipped, left waiting for the run's end,
//!   replacing the run, or run beside it.
//!
//! What a task is comes as values ([`TaskPlan`]), so a timer, an HTTP request and a
//! paused-clock test can all drive it. The task's presence in the store's catalog (its
//! registration, heartbeat and idle expiry) is [`Presence`](super::presence::Presence)'s.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::guard::{Lease, LeaseGuard, TryAcquire};
use crate::metrics_help::TaskCounters;
use crate::scheduling::backfill::{self, HISTORY_LOOKED_AT, MAX_BACKFILL_SLOTS};
use crate::scheduling::definition::{TaskDefinition, TaskSource};
use crate::scheduling::gate::{
    Decision, Gate, Reading, Skip, StoreClock, Ticket, TimerDecision, release_in_background,
};
use crate::scheduling::history::{HistoryWriter, MissReason, Outcome, RecordedSchedule, RunRecord};
use crate::scheduling::interrupted::{self, Rerun};
use crate::scheduling::policy::{CatchUp, NextAttempt, OnInterrupt, Overlap, RunPolicy};
use crate::scheduling::schedule::Schedule;
use crate::scheduling::task::{StoreDownPolicy, Trigger};
use crate::store::answers::SlotClaim;
use crate::store::catalog::TriggerRequest;
use crate::store::error::StoreError;
use crate::store::name::{HolderId, LeaseName};
use crate::store::text::visible;
use crate::store::timeout::within;
use crate::store::token::FencingToken;
use crate::store::traits::{Catalog, Slots};

/// What a task is, as its ticks need it: given as values, by the driver, at each firing.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskPlan {
    /// When it fires.
    pub schedule: Schedule,
    /// What a firing does while the store cannot answer.
    pub on_store_down: StoreDownPolicy,
    /// Which missed slots run late.
    pub catch_up: CatchUp,
    /// How many runs one firing may start.
    pub runs: RunsPerFiring,
    /// Each attempt's timeout, and the retries of a failed one.
    pub run_policy: RunPolicy,
}

impl TaskPlan {
    /// `schedule` with its default catch-up policy ([`CatchUp::default_for`]), fail-closed,
    /// one run per firing.
    pub fn new(schedule: Schedule) -> Self {
        Self {
            catch_up: CatchUp::default_for(&schedule),
            schedule,
            on_store_down: StoreDownPolicy::FailClosed,
            runs: RunsPerFiring::One,
            run_policy: RunPolicy::default(),
        }
    }

    /// With store-down policy `policy`.
    pub fn on_store_down(mut self, policy: StoreDownPolicy) -> Self {
        self.on_store_down = policy;
        self
    }

    /// With catch-up policy `catch_up`.
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// With `runs` per firing.
    pub fn runs(mut self, runs: RunsPerFiring) -> Self {
        self.runs = runs;
        self
    }

    /// With timeout and retries `policy`.
    pub fn run_policy(mut self, policy: RunPolicy) -> Self {
        self.run_policy = policy;
        self
    }

    /// The interval between the slots around `now_ms` (zero for a schedule with none): how
    /// often the task is fired about then, for its idle expiry.
    pub fn interval_near(&self, now_ms: u64) -> Duration {
        self.schedule
            .latest_at_or_before(now_ms)
            .and_then(|slot| Some(self.schedule.next_after(slot)? - slot))
            .map_or(Duration::ZERO, Duration::from_millis)
    }

    /// The task's definition as the catalog shows it: registered from `source`, `gated` or
    /// not, its ticks led by `leader_group` or placed in `spread_group`.
    pub fn definition(
        &self,
        source: TaskSource,
        gated: bool,
        leader_group: Option<&LeaseName>,
        spread_group: Option<&LeaseName>,
    ) -> TaskDefinition {
        TaskDefinition {
            source,
            schedule: self.schedule.to_string(),
            time_zone: self.schedule.time_zone().map(str::to_owned),
            on_store_down: self.on_store_down.as_str().to_owned(),
            catch_up: Some(self.catch_up.as_str().to_owned()),
            gated,
            leader_group: leader_group.map(|g| g.to_string()),
            spread_group: spread_group.map(|g| g.to_string()),
            timeout_ms: self.run_policy.timeout.map(millis),
            retries: Some(self.run_policy.retries).filter(|&n| n > 0),
            jitter_ms: self.run_policy.jitter.map(millis),
            overlap: Some(self.run_policy.overlap)
                .filter(|&o| o != Overlap::Skip)
                .map(|o| o.as_str().to_owned()),
            slot_schedule: Some(RecordedSchedule::of(&self.schedule)),
        }
    }
}

/// How many runs one firing may start, which decides what becomes of missed slots the
/// catch-up policy would run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunsPerFiring {
    /// Every slot the catch-up policy allows runs, oldest first, then the slot due: the
    /// scheduler, which runs its job itself and fires again at once.
    All,
    /// Only the newest slot that may run does: an application's tick, which is answered with
    /// one run; older slots the policy would have run are recorded as missed.
    One,
}

/// What a firing comes to.
#[derive(Debug)]
#[non_exhaustive]
pub enum Fired {
    /// Run this here (a timer slot, a catch-up, or a manual trigger a timer run left waiting).
    /// With [`RunsPerFiring::All`], fire again once it ended: a firing may hold more.
    Run(Ticket),
    /// The slot does not run here.
    Skipped {
        /// The slot.
        slot: u64,
        /// Why.
        skip: Skip,
    },
    /// No slot is due: the schedule's first slot is still to come, or the slot due now is
    /// older than the catch-up policy runs (a task's first firing long after it).
    NotDue {
        /// The next slot, if the schedule has one.
        next: Option<u64>,
    },
    /// The store's clock has not reached the slot the driver's timer was armed for (the
    /// estimate it was armed on ran ahead): fire again when it starts.
    Early {
        /// The slot.
        slot: u64,
        /// How long until the store's clock reaches it, as the store's reading tells.
        starts_in: Duration,
    },
    /// The store could not answer: the store-down policy decides.
    StoreDown {
        /// The slot due on this instance's estimate of the store's clock.
        slot: Option<u64>,
        /// Whether the policy runs it anyway, ungated, on this instance.
        runs: bool,
        /// The store's error.
        error: StoreError,
    },
    /// The store refused (retrying cannot help).
    Refused {
        /// The slot.
        slot: u64,
        /// The store's error.
        error: StoreError,
    },
}

/// What a slot that falls while a run of the task is going here comes to
/// ([`TaskTicks::overlapping`]), for the driver to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overlapping {
    /// Skipped, recorded missed with reason `overlap` (for [`Overlap::Skip`], by the next look
    /// back, as a slot the run outlived).
    Skipped,
    /// Waits for the run going to end; [`TaskTicks::fire_queued`] then decides it.
    Waits,
    /// Waits, and the run going is to be cancelled now.
    Replaces,
    /// Runs now, beside the run going, under a run lease of its own
    /// ([`TaskTicks::claim_beside`]).
    Beside,
}

/// One task's firings in one process: see the module documentation. Cheap to share; firings
/// of one task are decided one at a time.
pub struct TaskTicks {
    task: LeaseName,
    /// Named in the miss records this instance writes.
    holder: HolderId,
    history: HistoryWriter,
    clock: std::sync::Arc<StoreClock>,
    state: tokio::sync::Mutex<State>,
    /// Its series, which end with it.
    counters: TaskCounters,
}

#[derive(Default)]
struct State {
    /// The newest slot decided here: run, claimed elsewhere, paused, or recorded as missed.
    /// A firing whose slot does not follow it looks for missed slots first.
    handled: Option<u64>,
    /// Slots skipped here for a reason this instance knows, until a look back records them.
    known: Vec<(u64, u64, MissReason)>,
    /// Slots a look back left to run (oldest first), then the slot due, for
    /// [`RunsPerFiring::All`].
    queued: Vec<(u64, Trigger)>,
    /// Slots that fell while a run here was going and wait for its end (overlap policies
    /// `buffer-one`, `buffer-all`, `replace`), oldest first.
    waiting: std::collections::VecDeque<u64>,
    /// A slot a look back decided not to run (too late for the catch-up policy): firings of it
    /// are not decided again.
    passed: Option<u64>,
    /// A timer run here saw a manual trigger pending: the next firing (or the end of that
    /// run) takes it first.
    trigger_waits: bool,
    /// The last catch-up queued was decided: once it ran, the slot after it may be due.
    resume: bool,
    /// Every slot since the history was last looked at for cut-off runs ran here and ended:
    /// no other instance's run (nor this instance's before a restart) can have been cut off.
    history_known: bool,
}

/// The most skipped slots remembered with their reason between two looks back.
const KNOWN_MISSES: usize = 1024;

impl Drop for TaskTicks {
    /// The task is given up here: its run series go with it.
    fn drop(&mut self) {
        crate::scheduling::run_metrics::forget(&self.task);
    }
}

impl TaskTicks {
    /// The ticks of `task` as `holder`, recording misses to `history`, naming slots from
    /// `clock` (share one per process: the store's clock is the same for every task).
    pub fn new(
        task: LeaseName,
        holder: HolderId,
        history: HistoryWriter,
        clock: std::sync::Arc<StoreClock>,
    ) -> Self {
        Self {
            task,
            holder,
            history,
            clock,
            state: tokio::sync::Mutex::default(),
            counters: TaskCounters::default(),
        }
    }

    /// The task.
    pub fn task(&self) -> &LeaseName {
        &self.task
    }

    /// The counter of `metric` (`ticks`, `store_down_ticks`, …) about this task with the other
    /// label's value `value`, made by `make` on first use: held for as long as the task's
    /// ticks live, so a recorder that drops the series nobody holds keeps them that long.
    pub(crate) fn counter(
        &self,
        metric: &'static str,
        value: &'static str,
        make: impl FnOnce() -> metrics::Counter,
    ) -> metrics::Counter {
        self.counters.get(metric, value, make)
    }

    /// The store's clock as this process estimates it, `None` before any reading.
    pub fn store_now(&self) -> Option<u64> {
        self.clock.now_ms()
    }

    /// The store's clock as this process estimates it, the local wall clock before any reading.
    pub fn store_now_or_wall(&self) -> u64 {
        self.clock.now_ms().unwrap_or_else(wall_millis)
    }

    /// An estimate of the store's clock for a driver that arms timers before the store first
    /// answers (the scheduler's): the local wall clock until then. Share one per process.
    pub fn timer_clock() -> std::sync::Arc<StoreClock> {
        std::sync::Arc::new(StoreClock::starting_at(wall_millis()))
    }

    /// A firing of the task's timer (the scheduler's, or an application's tick): see the
    /// module documentation. `gate` decides; `plan` is the task as it is now; `aim` is the slot
    /// the driver's timer was armed for, if it knows one (the store's clock as last read names
    /// it otherwise).
    pub async fn fire<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
        aim: Option<u64>,
    ) -> Fired {
        let fired = self.fire_once(gate, plan, aim).await;
        self.note_elsewhere(&fired).await;
        fired
    }

    /// A slot that another instance may have run (or that nobody ran for a reason this
    /// instance cannot see) means the history must be looked at before the next run here.
    async fn note_elsewhere(&self, fired: &Fired) {
        let elsewhere = match fired {
            Fired::Run(_) | Fired::NotDue { .. } | Fired::Early { .. } => false,
            Fired::Skipped { skip, .. } => {
                !matches!(skip, Skip::Overlap | Skip::Paused(_) | Skip::Expiring)
            }
            Fired::StoreDown { .. } | Fired::Refused { .. } => true,
        };
        if elsewhere {
            self.state.lock().await.history_known = false;
        }
    }

    async fn fire_once<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
        aim: Option<u64>,
    ) -> Fired {
        let mut state = self.state.lock().await;
        if let Some((slot, trigger)) = pop_front(&mut state.queued) {
            return self
                .decide_queued(gate, plan, &mut state, slot, trigger)
                .await;
        }
        if state.trigger_waits
            && let Some(ticket) = self.take_waiting_trigger(gate, &mut state).await
        {
            return Fired::Run(ticket);
        }
        if let Err(skip) = gate.entitled().await {
            // Not this instance's to run; but whether the store answers decides between that
            // and the store-down policy (no leader can be elected while it is down), in every
            // state: leader, follower, not yet connected.
            let now = match gate.read_clock().await {
                Ok(reading) => {
                    self.clock.saw(&reading);
                    reading.now_ms
                }
                Err(e) => return self.refused_or_down(plan, aim, e),
            };
            let slot = aim.or_else(|| plan.schedule.slot_meant(now).map(|(s, _)| s));
            return Fired::Skipped {
                slot: slot.unwrap_or_default(),
                skip,
            };
        }
        let mut aim = aim;
        let mut reading: Option<Reading> = None;
        // At most three rounds: a stale estimate costs one more, a clock that moved one more.
        for _ in 0..3 {
            let due = match aim {
                Some(slot) => slot,
                None => {
                    let now = match reading.as_ref().map(|r| r.now_ms).or(self.clock.now_ms()) {
                        Some(now) => now,
                        None => match gate.read_clock().await {
                            Ok(read) => {
                                self.clock.saw(&read);
                                let now = read.now_ms;
                                reading = Some(read);
                                now
                            }
                            Err(e) => return self.refused_or_down(plan, None, e),
                        },
                    };
                    let Some((due, starts_in)) = plan.schedule.slot_meant(now) else {
                        return Fired::NotDue {
                            next: plan.schedule.next_after(now),
                        };
                    };
                    if !starts_in.is_zero() {
                        tokio::time::sleep(starts_in).await;
                        // A reading from before the wait is before the slot.
                        reading = None;
                    }
                    due
                }
            };
            if state.passed == Some(due) {
                return Fired::NotDue {
                    next: plan.schedule.next_after(due),
                };
            }
            if !follows(&plan.schedule, state.handled, due) {
                return self
                    .after_a_gap(gate, plan, &mut state, due, reading.take())
                    .await;
            }
            let next = plan.schedule.next_after(due);
            match gate.decide_timer(due, next, &self.clock).await {
                Ok(TimerDecision::Decided(read, decision)) => {
                    return self
                        .decided(gate, &mut state, &read, due, Trigger::Timer, decision, plan)
                        .await;
                }
                Ok(TimerDecision::Outside(read)) => {
                    if read.now_ms < due {
                        if aim.is_some() {
                            // The store's clock has not reached the slot this timer was
                            // armed for: the driver waits for it.
                            return Fired::Early {
                                slot: due,
                                starts_in: Duration::from_millis(due - read.now_ms),
                            };
                        }
                    } else if let Some(estimate) = aim.or(self.clock.now_ms()) {
                        let moved = read.now_ms.saturating_sub(estimate);
                        if next.is_some_and(|next| read.now_ms >= next) && moved > 1000 {
                            tracing::warn!(task = %self.task, slot = due, store_now = read.now_ms, "the store's clock is past the slot this firing was for: a jump of the clock, or a firing long delayed; the slot due now is decided instead, the ones between are looked for");
                        }
                    }
                    aim = None;
                    reading = Some(read);
                }
                Err(e) => return self.refused_or_down(plan, Some(due), e),
            }
        }
        Fired::NotDue {
            next: reading.and_then(|r| plan.schedule.next_after(r.now_ms)),
        }
    }

    /// A firing of `due` that does not follow the last slot decided here: the slots between
    /// are looked for first.
    async fn after_a_gap<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
        state: &mut State,
        due: u64,
        fresh: Option<Reading>,
    ) -> Fired {
        let (reading, late) = match self.look_back(gate, plan, state, Some(due), fresh).await {
            Ok(looked) => looked,
            Err(e) => return self.refused_or_down(plan, Some(due), e),
        };
        if reading.now_ms < due {
            // The store's clock has not reached the slot (the estimate ran ahead of it): never
            // claim a slot of the future.
            state.queued.clear();
            return Fired::Early {
                slot: due,
                starts_in: Duration::from_millis(due - reading.now_ms),
            };
        }
        if !late {
            state.queued.push((due, Trigger::Timer));
        }
        match pop_front(&mut state.queued) {
            Some((slot, trigger)) => {
                self.decide_at(gate, plan, state, &reading, slot, trigger)
                    .await
            }
            // The slot due is older than the catch-up policy runs.
            None => {
                state.passed = Some(due);
                Fired::NotDue {
                    next: plan.schedule.next_after(reading.now_ms),
                }
            }
        }
    }

    /// The next slot a look back queued (a catch-up, or the slot due after them), decided;
    /// `None` when none is queued. For [`RunsPerFiring::All`] drivers, after each run.
    pub async fn fire_queued<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
    ) -> Option<Fired> {
        let mut state = self.state.lock().await;
        if let Some((slot, trigger)) = pop_front(&mut state.queued) {
            return Some(
                self.decide_queued(gate, plan, &mut state, slot, trigger)
                    .await,
            );
        }
        // A slot that waited for the run before it: run late, but as its timer's.
        if let Some(slot) = state.waiting.pop_front() {
            return Some(
                self.decide_queued(gate, plan, &mut state, slot, Trigger::Timer)
                    .await,
            );
        }
        if !std::mem::take(&mut state.resume) {
            return None;
        }
        // Slots may have fallen due after the look back, before the last catch-up ran (it was
        // decided, or started, late): the newest of them runs now as `timer` if it is on time,
        // and those before it are missed for the catch-up's sake, rather than a timer armed
        // past them finding a new gap and catching up again. A slot that fell due while the
        // catch-up ran is missed for the overlap, as after any run. A store that does not
        // answer is the next firing's concern.
        let reading = gate.read_clock().await.ok()?;
        self.clock.saw(&reading);
        let schedule = &plan.schedule;
        let handled = state.handled?;
        let first = schedule.next_after(handled)?;
        let newest = schedule.latest_at_or_before(reading.now_ms)?;
        if newest < first
            || overlapped(&state.known, newest)
            || !on_time(schedule, newest, reading.now_ms)
        {
            return None;
        }
        if newest > first {
            let (count, last) = schedule.firings_between(handled, newest - 1, 1);
            let last = last.first().copied().unwrap_or(first);
            self.record_miss(schedule, first, count, last, MissReason::Overlap);
            state.handled = Some(last);
        }
        Some(
            self.decide_at(gate, plan, &mut state, &reading, newest, Trigger::Timer)
                .await,
        )
    }

    /// Looks for missed slots now (a new term, the store back after an outage), before the
    /// next firing: records them and queues those the catch-up policy runs; the next
    /// [`fire`](Self::fire)s return them. `Ok(true)` if any were queued.
    pub async fn look_for_missed<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
    ) -> Result<bool, StoreError> {
        let mut state = self.state.lock().await;
        self.look_back(gate, plan, &mut state, None, None).await?;
        Ok(!state.queued.is_empty())
    }

    /// `slot` fell due while a run of the task is going here: what it comes to under the plan's
    /// [`Overlap`] policy, decided here for every driver. A slot skipped for the policy (one
    /// more than `buffer-one` or `buffer-all` keep waiting, a waiting one a newer slot
    /// replaces) is recorded missed with reason `overlap` at once; under `skip` it is left to
    /// the next look back, as before.
    pub async fn overlapping(&self, plan: &TaskPlan, slot: u64) -> Overlapping {
        let overlap = plan.run_policy.overlap;
        let mut state = self.state.lock().await;
        match overlap {
            Overlap::Skip => {
                remember(&mut state.known, slot, MissReason::Overlap);
                return Overlapping::Skipped;
            }
            Overlap::Allow => return Overlapping::Beside,
            Overlap::BufferOne | Overlap::BufferAll | Overlap::Replace => {}
        }
        if overlap == Overlap::Replace {
            // The run going has not stopped yet: the newest slot replaces it.
            while let Some(older) = state.waiting.pop_front() {
                self.skip_overlapping(&plan.schedule, &mut state, older);
            }
            state.waiting.push_back(slot);
            return Overlapping::Replaces;
        }
        if state.waiting.len() >= overlap.waiting_cap() {
            self.skip_overlapping(&plan.schedule, &mut state, slot);
            return Overlapping::Skipped;
        }
        state.waiting.push_back(slot);
        Overlapping::Waits
    }

    /// Claims `slot` for a run beside the one going here ([`Overlapping::Beside`]), unless the
    /// task is paused: takes a run lease of the run's own, named after the task and the slot
    /// (`TASK/slot/SLOT`: its own fencing token and expiry), then claims the slot (the
    /// forward-only claim every instance makes, so the slot still runs once fleet-wide).
    /// `None`: the slot does not run here (paused, claimed already, the store did not answer,
    /// or a task name too long for the run lease's: recorded missed, reason overlap).
    pub async fn claim_beside<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
        slot: u64,
    ) -> Option<LeaseGuard> {
        let lease = gate.lease();
        let limit = lease.config().renew_interval;
        match gate.read_clock().await {
            Ok(reading) => {
                self.clock.saw(&reading);
                if let Some(pause) = reading.control.as_ref().and_then(|c| c.paused.as_ref()) {
                    gate.paused(slot, pause).await;
                    return None;
                }
            }
            Err(e) => {
                tracing::warn!(task = %self.task, slot, error = %e, "slot not run beside the run going: the store did not answer");
                self.skipped(slot, MissReason::StoreDown).await;
                return None;
            }
        }
        let run_lease = LeaseName::new(format!("{}/slot/{slot}", self.task))
            .ok()
            .and_then(|name| {
                Lease::held_as(
                    lease.store().clone(),
                    name,
                    *lease.config(),
                    lease.holder().clone(),
                )
                .ok()
            });
        let Some(run_lease) = run_lease else {
            tracing::warn!(task = %self.task, slot, "the task's name is too long for a run lease of its own: the slot is skipped");
            self.skip_overlapping(&plan.schedule, &mut *self.state.lock().await, slot);
            return None;
        };
        let guard = match run_lease.try_acquire().await {
            Ok(TryAcquire::Acquired(guard)) => guard,
            Ok(TryAcquire::Busy { .. }) => return None,
            Err(e) => {
                tracing::warn!(task = %self.task, slot, error = %e, "slot not run beside the run going: no run lease");
                self.skipped(slot, MissReason::StoreDown).await;
                return None;
            }
        };
        let claim = within(limit, lease.store().claim_slot(&self.task, slot)).await;
        match claim {
            Ok(SlotClaim::Claimed) if guard.is_held() => {
                let mut state = self.state.lock().await;
                state.handled = state.handled.max(Some(slot));
                return Some(guard);
            }
            Ok(SlotClaim::Claimed) => {
                tracing::warn!(task = %self.task, slot, "run lease expiring before the run could start; slot not run");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(task = %self.task, slot, error = %e, "slot not run beside the run going: not claimed");
                self.skipped(slot, MissReason::StoreDown).await;
            }
        }
        if let Err(e) = guard.release().await {
            tracing::debug!(task = %self.task, error = %e, "run lease release failed; it expires after its ttl");
        }
        None
    }

    /// Records `slot` missed for the overlap, as decided (no look back records it again).
    fn skip_overlapping(&self, schedule: &Schedule, state: &mut State, slot: u64) {
        tracing::info!(task = %self.task, slot, "slot skipped: a run is going and the overlap policy keeps no more waiting");
        self.record_miss(schedule, slot, 1, slot, MissReason::Overlap);
        state.handled = state.handled.max(Some(slot));
    }

    /// A run of `slot` here starts now: see [`run_ended`](Self::run_ended).
    pub fn run_starts(&self, slot: u64) -> RunStart {
        RunStart {
            at: Instant::now(),
            ms: self.store_now_or_wall().max(slot),
        }
    }

    /// A run here that started at `start` ended now: the slots that fell due meanwhile were not
    /// fired here, for a reason this instance knows; the next look back records those no other
    /// instance claimed meanwhile as missed for the overlap, and does not catch them up. (The
    /// run's duration is measured on the monotonic clock, so a jump of the wall clock during
    /// the run is not taken for a long run.)
    pub async fn run_ended(&self, schedule: &Schedule, start: RunStart) {
        let started_ms = start.ms;
        let until = started_ms.saturating_add(millis(start.at.elapsed()));
        let (count, newest) = schedule.firings_between(started_ms, until, 1);
        if let (Some(first), Some(&last)) = (schedule.next_after(started_ms), newest.first())
            && count > 0
        {
            let known = &mut self.state.lock().await.known;
            if known.len() < KNOWN_MISSES {
                known.push((first, last, MissReason::Overlap));
            }
        }
    }

    /// Takes the manual trigger a timer run here left waiting, if any (the end of that run, for
    /// a driver that runs the job itself).
    pub async fn take_left_trigger<S: Slots + Catalog>(&self, gate: &Gate<S>) -> Option<Ticket> {
        let mut state = self.state.lock().await;
        if !state.trigger_waits {
            return None;
        }
        self.take_waiting_trigger(gate, &mut state).await
    }

    /// The pending trigger of the task's control record, taken if this instance may run it now.
    async fn take_waiting_trigger<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        state: &mut State,
    ) -> Option<Ticket> {
        let reading = gate.read_clock().await.ok()?;
        self.clock.saw(&reading);
        let Some((control, version)) = reading.pending_trigger() else {
            state.trigger_waits = false;
            return None;
        };
        let ticket = match gate.take_trigger(control, version, reading.now_ms).await {
            Ok(ticket) => ticket,
            Err(e) => {
                tracing::debug!(task = %self.task, error = %e, "manual trigger not taken");
                None
            }
        };
        if ticket.is_some() {
            state.trigger_waits = false;
        }
        ticket
    }

    /// Compares the highest slot claimed with the slots due on the store's clock (up to and
    /// including `due`, when a firing names one): records the ones that did not run, and
    /// queues those the catch-up policy runs. `Ok((reading, late))`: `late` when `due` is one
    /// the policy decided on (older than a firing on time could be), not a timer slot.
    async fn look_back<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
        state: &mut State,
        due: Option<u64>,
        fresh: Option<Reading>,
    ) -> Result<(Reading, bool), StoreError> {
        let reading = match fresh {
            Some(reading) => reading,
            None => {
                let reading = gate.read_clock().await?;
                self.clock.saw(&reading);
                reading
            }
        };
        let now = reading.now_ms;
        let limit = gate.lease().config().renew_interval;
        let claimed = within(limit, gate.lease().store().last_slot(&self.task)).await;
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => {
                tracing::debug!(task = %self.task, error = %e, "no slot record to catch up from");
                None
            }
        };
        let known = std::mem::take(&mut state.known);
        state.queued.clear();
        let schedule = &plan.schedule;
        // A late slot due goes with the missed slots.
        let on_time = due.filter(|&due| on_time(schedule, due, now));
        let horizon = match (due, on_time) {
            (Some(due), Some(_)) => due.saturating_sub(1),
            (Some(due), None) => due,
            (None, _) => now,
        };
        let window = match plan.catch_up {
            CatchUp::Skip => None,
            CatchUp::Latest { window } | CatchUp::All { window, .. } => Some(millis(window)),
        };
        let max = match (plan.catch_up, plan.runs) {
            (CatchUp::Skip, _) => 0,
            // One run per firing, and the slot due runs on time: older slots are only recorded.
            (_, RunsPerFiring::One) if on_time.is_some() => 0,
            (_, RunsPerFiring::One) | (CatchUp::Latest { .. }, _) => 1,
            (CatchUp::All { max, .. }, RunsPerFiring::All) => max,
        };
        let from = match (claimed, state.handled) {
            (Some(c), Some(h)) => Some(c.max(h)),
            (c, h) => c.or(h),
        };
        let Some(from) = from else {
            // Never ran anywhere: nothing was missed. A first firing long after its slot runs
            // it only within the catch-up window.
            let late_due = due.filter(|_| on_time.is_none());
            if let Some(due) = late_due {
                state.handled = Some(due);
                if window.is_some_and(|w| now.saturating_sub(due) <= w) && max > 0 {
                    state.queued.push((due, Trigger::CatchUp));
                }
            }
            return Ok((reading, late_due.is_some()));
        };
        let (count, newest) = schedule.firings_between(from, horizon, max);
        if count == 0 {
            return Ok((reading, false));
        }
        let oldest_runnable = window.map_or(u64::MAX, |w| now.saturating_sub(w));
        let to_run: Vec<u64> = newest
            .into_iter()
            .filter(|&slot| slot >= oldest_runnable && !overlapped(&known, slot))
            .collect();
        let missed = count - to_run.len() as u64;
        if missed > 0 {
            let first = schedule.next_after(from).unwrap_or(from);
            let last_missed = schedule
                .firings_between(
                    from,
                    to_run.first().map_or(horizon, |&run| run.saturating_sub(1)),
                    1,
                )
                .1
                .first()
                .copied()
                .unwrap_or(first);
            let reason = known
                .iter()
                .find(|&&(from, to, _)| from <= last_missed && first <= to)
                .map_or(MissReason::NotClaimed, |&(_, _, reason)| reason);
            self.record_miss(schedule, first, missed, last_missed, reason);
            state.handled = state.handled.max(Some(last_missed));
        }
        state
            .queued
            .extend(to_run.into_iter().map(|slot| (slot, Trigger::CatchUp)));
        Ok((reading, on_time.is_none() && due.is_some()))
    }

    /// Decides a slot a look back queued, reading the store's clock for it.
    async fn decide_queued<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
        state: &mut State,
        slot: u64,
        trigger: Trigger,
    ) -> Fired {
        let reading = match gate.read_clock().await {
            Ok(reading) => reading,
            Err(e) if e.is_transient() => {
                state.queued.clear();
                return self.store_down(plan, Some(slot), e);
            }
            Err(error) => return Fired::Refused { slot, error },
        };
        self.clock.saw(&reading);
        state.resume = trigger == Trigger::CatchUp
            && state.queued.is_empty()
            && plan.runs == RunsPerFiring::All;
        self.decide_at(gate, plan, state, &reading, slot, trigger)
            .await
    }

    /// Decides `slot` at `reading` (logging catch-ups).
    async fn decide_at<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
        state: &mut State,
        reading: &Reading,
        slot: u64,
        trigger: Trigger,
    ) -> Fired {
        if trigger == Trigger::CatchUp {
            tracing::info!(task = %self.task, slot, policy = plan.catch_up.as_str(), "catching up a missed slot");
        }
        let decision = gate.decide(reading, slot, trigger).await;
        self.decided(gate, state, reading, slot, trigger, decision, plan)
            .await
    }

    /// Notes what a decision of `slot` tells about the slots decided here, and orders a
    /// pending manual trigger after a timer run here, or takes it now when the slot does not
    /// run here (an application ticks about once per slot: a trigger that waited for a tick
    /// whose slot does not run would wait long).
    #[allow(clippy::too_many_arguments)]
    async fn decided<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        state: &mut State,
        reading: &Reading,
        slot: u64,
        trigger: Trigger,
        decision: Decision,
        plan: &TaskPlan,
    ) -> Fired {
        let pending = reading.pending_trigger();
        match decision {
            Decision::Run(ticket) => {
                state.handled = state.handled.max(Some(slot));
                // The trigger is taken once this run ended (or at the next firing): catalog
                // heartbeats in step with the runs would never find the task lease free.
                if pending.is_some() {
                    state.trigger_waits = true;
                }
                Fired::Run(ticket)
            }
            Decision::Skip(skip) => {
                match &skip {
                    Skip::AlreadyRun { last } => state.handled = state.handled.max(Some(*last)),
                    Skip::Paused(_) | Skip::Expiring => {
                        state.handled = state.handled.max(Some(slot))
                    }
                    Skip::Overlap | Skip::Busy { .. } => {
                        remember(&mut state.known, slot, MissReason::Overlap)
                    }
                    Skip::StoreDown(_) | Skip::Refused(_) => {
                        remember(&mut state.known, slot, MissReason::StoreDown)
                    }
                    Skip::NotLeader | Skip::NotOwner => {}
                }
                if let Some((control, version)) = pending
                    && trigger == Trigger::Timer
                    && !matches!(skip, Skip::StoreDown(_) | Skip::Refused(_))
                {
                    match gate.take_trigger(control, version, reading.now_ms).await {
                        Ok(Some(ticket)) => {
                            state.trigger_waits = false;
                            return Fired::Run(ticket);
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::debug!(task = %self.task, error = %e, "manual trigger not taken")
                        }
                    }
                }
                match skip {
                    Skip::StoreDown(error) => self.store_down(plan, Some(slot), error),
                    Skip::Refused(error) => Fired::Refused { slot, error },
                    skip => Fired::Skipped { slot, skip },
                }
            }
        }
    }

    /// The store's error: a refusal, or an outage the store-down policy decides on.
    fn refused_or_down(&self, plan: &TaskPlan, slot: Option<u64>, error: StoreError) -> Fired {
        if !error.is_transient()
            && let Some(slot) = slot
        {
            return Fired::Refused { slot, error };
        }
        self.store_down(plan, slot, error)
    }

    fn store_down(&self, plan: &TaskPlan, slot: Option<u64>, error: StoreError) -> Fired {
        let slot = slot.or_else(|| plan.schedule.latest_at_or_before(self.store_now_or_wall()));
        Fired::StoreDown {
            slot,
            runs: plan.on_store_down.runs_when_down() && slot.is_some(),
            error,
        }
    }

    /// What follows attempt `attempt` of the run of `slot` that ended `outcome` now (the
    /// store's clock as estimated here), under the plan's [`RunPolicy`]: another attempt after
    /// a wait, nothing, or a retry dropped because it would not start before the next slot
    /// (logged and counted in `leasehold_retries_dropped_total`). The driver runs the next
    /// attempt while it still holds the task (its lease, its leadership), and says so in the
    /// ended attempt's record ([`RunRecord::retry`]).
    pub fn next_attempt(
        &self,
        plan: &TaskPlan,
        slot: Option<u64>,
        attempt: u32,
        outcome: Outcome,
    ) -> NextAttempt {
        let now = self.store_now_or_wall();
        let next =
            plan.run_policy
                .next_attempt(&self.task, &plan.schedule, slot, attempt, outcome, now);
        if let NextAttempt::Dropped { attempt, next } = next {
            tracing::warn!(task = %self.task, ?slot, attempt, next, "retry dropped: it would not start before the next slot");
            let dropped = || metrics::counter!("leasehold_retries_dropped_total", "task" => self.task.as_str().to_owned());
            self.counters
                .get("retries_dropped", "", dropped)
                .increment(1);
        }
        next
    }

    /// The runs to make again once `ticket`'s run ended, while its task lease is still held:
    /// slots whose run was cut off ([`interrupted`](crate::scheduling::interrupted)), found in
    /// the task's history. The history is read only when a slot since it was last read may
    /// have run elsewhere (or this instance just started): a task that runs on one instance
    /// pays nothing for it. A history that cannot be read is looked at again next time.
    pub async fn cut_off_runs<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
        ticket: &Ticket,
    ) -> Vec<Rerun> {
        if matches!(ticket.trigger(), Trigger::Manual | Trigger::Backfill) {
            return Vec::new();
        }
        self.cut_off_before(gate, plan, ticket.slot(), ticket.guard().token())
            .await
    }

    /// [`cut_off_runs`](Self::cut_off_runs) for a driver that holds the task lease (its
    /// tenure `held`) without a slot granted: the sidecar, when a tick's slot already ran and
    /// the application that ran it went silent. Slots before `before` are looked at.
    pub async fn cut_off_before<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        plan: &TaskPlan,
        before: u64,
        held: FencingToken,
    ) -> Vec<Rerun> {
        if plan.run_policy.on_interrupt == OnInterrupt::Skip
            || std::mem::replace(&mut self.state.lock().await.history_known, true)
        {
            return Vec::new();
        }
        let limit = gate.lease().config().renew_interval;
        let store = gate.lease().store();
        let read = within(limit, store.history(&self.task, interrupted::LOOKED_AT)).await;
        let texts = match read {
            Ok(texts) => texts,
            Err(e) => {
                tracing::debug!(task = %self.task, error = %e, "history not read for cut-off runs");
                self.state.lock().await.history_known = false;
                return Vec::new();
            }
        };
        let records: Vec<RunRecord> = texts
            .iter()
            .filter_map(|text| RunRecord::from_json(text).ok())
            .collect();
        // A run still recorded `running` by another instance is cut off only once that
        // instance is gone (a live one may yet record how it ended): the catalog says.
        let live: Vec<String> = if interrupted::running_elsewhere(
            &records,
            held,
            self.holder.as_str(),
        ) {
            match within(limit, store.tasks(Duration::ZERO)).await {
                Ok(tasks) => tasks
                    .into_iter()
                    .filter(|t| t.task == self.task)
                    .flat_map(|t| t.instances)
                    .filter(|i| !i.remaining.is_zero() && i.instance != self.holder)
                    .map(|i| i.instance.to_string())
                    .collect(),
                // Without a catalog whether it is live cannot be told: it is taken for gone.
                Err(StoreError::Unsupported(_)) => Vec::new(),
                Err(e) => {
                    tracing::debug!(task = %self.task, error = %e, "catalog not read for cut-off runs");
                    self.state.lock().await.history_known = false;
                    return Vec::new();
                }
            }
        } else {
            Vec::new()
        };
        // Under `allow`, this instance's runs beside the granted one may still be going.
        let beside = plan.run_policy.overlap == Overlap::Allow;
        let found = interrupted::cut_off(
            &records,
            before,
            held,
            self.store_now_or_wall(),
            interrupted::rerun_window(plan.catch_up),
            plan.run_policy.retries,
            |holder| (beside && holder == self.holder.as_str()) || live.iter().any(|l| l == holder),
        );
        if found.deferred {
            self.state.lock().await.history_known = false;
        }
        for rerun in &found.reruns {
            tracing::info!(task = %self.task, slot = rerun.slot, attempt = rerun.attempt, "a run of this task was cut off: running its slot again");
        }
        found.reruns
    }

    /// Whether the history may hold a cut-off run this instance has not looked for yet (a
    /// driver may skip taking the task lease to look when not).
    pub async fn may_have_cut_off(&self) -> bool {
        !self.state.lock().await.history_known
    }

    /// The backfill `ticket` took (a ticket of [`Trigger::Backfill`]): the slots of the plan's
    /// schedule in its range, oldest first, and the task lease the take holds. A range of more
    /// than [`MAX_BACKFILL_SLOTS`] slots (which the fleet refuses: this instance's schedule
    /// differs from the one the catalog gave), or another ticket, runs nothing.
    pub fn backfill(&self, plan: &TaskPlan, ticket: Ticket) -> BackfillRun {
        let request = ticket
            .request()
            .filter(|_| ticket.trigger() == Trigger::Backfill)
            .cloned();
        let range = request.as_ref().and_then(|r| r.slots);
        let slots = match range.map(|range| backfill::slots_in(&plan.schedule, range)) {
            Some(Ok(slots)) => slots,
            Some(Err(count)) => {
                tracing::warn!(task = %self.task, count, max = MAX_BACKFILL_SLOTS, "backfill not run: its range holds too many slots of this instance's schedule");
                Vec::new()
            }
            None => Vec::new(),
        };
        if let Some(request) = &request {
            tracing::info!(task = %self.task, id = %request.id, by = %visible(&request.by), slots = slots.len(), "backfill asked for through the catalog");
        }
        BackfillRun {
            request,
            slots: slots.into(),
            held: Some(ticket),
            ran: false,
        }
    }

    /// The next slot of `backfill` to run, with the task lease held for it
    /// ([`Gate::hold_for_backfill`]): the oldest slot left with no `ok` run in the task's
    /// history, read while the lease is held (so a slot another backfill ran meanwhile is not
    /// run again). `None` once no slot is left, or when this instance cannot go on (no longer
    /// entitled, stopping, the store not answering): the rest is not run here, and the same
    /// backfill asked for again runs it.
    pub async fn backfill_next<S: Slots + Catalog>(
        &self,
        gate: &Gate<S>,
        backfill: &mut BackfillRun,
    ) -> Option<Ticket> {
        let limit = gate.lease().config().renew_interval;
        if backfill.ran {
            // A backfill run's history entry is filed under its start (not to replace its
            // slot's entry): the next starts a millisecond later at least, so two quick runs
            // do not share one entry.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let request = backfill.request.clone()?;
        while let Some(slot) = backfill.slots.pop_front() {
            let held = match backfill.held.take() {
                Some(ticket) => Some(ticket),
                None => gate.hold_for_backfill(slot, &request).await,
            };
            let Some(ticket) = held else {
                tracing::warn!(task = %self.task, id = %request.id, left = backfill.slots.len() + 1, "backfill stopped: this instance no longer runs the task (or is stopping); the same backfill asked for again runs the rest");
                return None;
            };
            let read = within(
                limit,
                gate.lease().store().history(&self.task, HISTORY_LOOKED_AT),
            );
            let records: Vec<RunRecord> = match read.await {
                Ok(texts) => texts
                    .iter()
                    .filter_map(|text| RunRecord::from_json(text).ok())
                    .collect(),
                Err(e) => {
                    tracing::warn!(task = %self.task, slot, error = %e, left = backfill.slots.len() + 1, "backfill stopped: the history could not be read");
                    release_in_background(ticket.into_guard());
                    return None;
                }
            };
            if backfill::ran_ok(&records, slot) {
                tracing::debug!(task = %self.task, slot, "backfill: the slot already ran ok");
                backfill.held = Some(ticket);
                continue;
            }
            backfill.ran = true;
            return Some(ticket.for_slot(slot));
        }
        None
    }

    /// A run here was cut off (its lease or leadership ended): the next run here looks for it.
    pub async fn run_cut_off(&self) {
        self.state.lock().await.history_known = false;
    }

    /// Remembers why this instance skipped `slot`, for the next look back.
    pub async fn skipped(&self, slot: u64, reason: MissReason) {
        remember(&mut self.state.lock().await.known, slot, reason);
    }

    fn record_miss(
        &self,
        schedule: &Schedule,
        first: u64,
        count: u64,
        last_slot: u64,
        reason: MissReason,
    ) {
        let reason_label = reason.as_str();
        let missed = || metrics::counter!("leasehold_slots_missed_total", "task" => self.task.as_str().to_owned(), "reason" => reason_label);
        self.counters
            .get("slots_missed", reason_label, missed)
            .increment(count);
        tracing::info!(task = %self.task, first, count, %reason, "slots missed");
        let mut record = RunRecord::missed(first, count, last_slot, reason, &self.holder);
        record.schedule = Some(RecordedSchedule::of(schedule));
        self.history.record(&self.task, record);
    }
}

/// A backfill taken here ([`TaskTicks::backfill`]): the slots of its range left to look at,
/// oldest first, and the task lease its take held, until a slot runs under it. Dropped, it lets
/// that lease go.
#[derive(Debug)]
pub struct BackfillRun {
    /// `None` for a ticket that was not a backfill's: nothing to run.
    request: Option<TriggerRequest>,
    slots: std::collections::VecDeque<u64>,
    held: Option<Ticket>,
    /// A slot of it ran here.
    ran: bool,
}

impl BackfillRun {
    /// The request it runs.
    pub fn request(&self) -> Option<&TriggerRequest> {
        self.request.as_ref()
    }
}

impl Drop for BackfillRun {
    fn drop(&mut self) {
        if let Some(ticket) = self.held.take() {
            release_in_background(ticket.into_guard());
        }
    }
}

/// When a run here started ([`TaskTicks::run_starts`]): on the store's clock as estimated here
/// (never before its slot), and on the monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct RunStart {
    at: Instant,
    ms: u64,
}

/// Which slot a driver's own timer (the scheduler's) fires next, and when: armed on the
/// store's clock as [`TaskTicks`] estimates it (its last reading carried forward on the
/// monotonic clock), so the driver keeps no estimate of its own.
#[derive(Debug, Default)]
pub struct Timer {
    /// The slot fired last.
    last: Option<u64>,
    /// A slot to fire again next (fired before the store's clock reached it, or put off for a
    /// manual trigger).
    again: Option<u64>,
}

impl Timer {
    /// The slot to fire next and the instant to fire it: when the store's clock reaches it,
    /// put off by the plan's jitter ([`RunPolicy::start_delay`]); `None` once the schedule has
    /// no further firing.
    pub fn next(&mut self, ticks: &TaskTicks, plan: &TaskPlan) -> Option<(u64, Instant)> {
        let schedule = &plan.schedule;
        let now = ticks.store_now_or_wall();
        let mut next = self.again.take().or_else(|| schedule.next_after(now));
        // A timer that fired a hair early must not pick the slot it just fired again.
        if let (Some(slot), Some(last)) = (next, self.last)
            && slot <= last
        {
            next = schedule.next_after(last);
        }
        let slot = next?;
        // At the slot put off by its delay, or at once if that time has passed (a slot fired
        // again after a manual trigger is not put off a second time).
        let delay = millis(plan.run_policy.start_delay(&ticks.task, schedule, slot));
        let at = slot.saturating_add(delay);
        Some((
            slot,
            Instant::now() + Duration::from_millis(at.saturating_sub(now)),
        ))
    }

    /// `slot` was fired (decided, or run ungated).
    pub fn fired(&mut self, slot: u64) {
        self.last = Some(slot);
    }

    /// `slot` is fired again next, at once (its firing was put off for a manual trigger).
    pub fn again(&mut self, slot: u64) {
        self.again = Some(slot);
    }

    /// The firing of `slot` came before the store's clock reached it ([`Fired::Early`]): the
    /// estimate ran ahead of the store. Slots fired on that estimate are no guide to what comes
    /// next (the store's slot claim still is); `slot` is fired again when the store's clock
    /// reaches it, if it is still the next one.
    pub fn early(&mut self, ticks: &TaskTicks, schedule: &Schedule, slot: u64) {
        let now = ticks.store_now_or_wall();
        self.last = self.last.filter(|&l| l <= now);
        self.again = (schedule.next_after(now) == Some(slot)).then_some(slot);
    }
}

/// A run of `task` ended as `record` says: its outcome is counted in the task's run series
/// (docs/metrics.md, "Runs") and the record written to `history` (`None` for a run the history
/// does not keep: ungated, or run while the store was down). Every driver records every run's
/// end through here, so the scheduler's runs and the ones the sidecar's applications report are
/// counted alike.
pub fn record_run_end(history: Option<&HistoryWriter>, task: &LeaseName, record: RunRecord) {
    crate::scheduling::run_metrics::run_ended(task, &record);
    if let Some(history) = history {
        history.record(task, record);
    }
}

/// The [`TaskTicks`] of the tasks a process is fired for from outside (an application's ticks
/// through the sidecar), each kept while it is fired and dropped once it has not been for its
/// idle expiry ([`idle_expiry`](super::presence::idle_expiry)), so one-off task names do not
/// accumulate.
pub struct TickedTasks {
    holder: HolderId,
    history: HistoryWriter,
    clock: std::sync::Arc<StoreClock>,
    tasks: std::sync::Mutex<(HashMap<LeaseName, Kept>, Instant)>,
}

struct Kept {
    ticks: std::sync::Arc<TaskTicks>,
    last: Instant,
    idle: Duration,
}

/// How often [`TickedTasks`] looks for tasks to drop.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl TickedTasks {
    /// Tasks fired as `holder`, recording to `history`, naming slots from one estimate of the
    /// store's clock.
    pub fn new(holder: HolderId, history: HistoryWriter) -> Self {
        Self {
            holder,
            history,
            clock: std::sync::Arc::default(),
            tasks: std::sync::Mutex::new((HashMap::new(), Instant::now())),
        }
    }

    /// The ticks of `task`, fired now, kept for `idle` more.
    pub fn fired(&self, task: &LeaseName, idle: Duration) -> std::sync::Arc<TaskTicks> {
        let now = Instant::now();
        let mut guard = self
            .tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (tasks, swept) = &mut *guard;
        if now.saturating_duration_since(*swept) >= SWEEP_EVERY {
            forget_idle(tasks, now);
            *swept = now;
        }
        let kept = tasks.entry(task.clone()).or_insert_with(|| Kept {
            ticks: std::sync::Arc::new(TaskTicks::new(
                task.clone(),
                self.holder.clone(),
                self.history.clone(),
                self.clock.clone(),
            )),
            last: now,
            idle,
        });
        kept.last = now;
        kept.idle = idle;
        kept.ticks.clone()
    }

    /// Drops the tasks not fired for their idle expiry (with their series), as a firing does
    /// at most every second: for a driver to call when firings stop coming, so the last ones
    /// fired do not stay.
    pub fn forget_idle(&self) {
        let now = Instant::now();
        let mut guard = self
            .tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (tasks, swept) = &mut *guard;
        forget_idle(tasks, now);
        *swept = now;
    }

    /// How many tasks are kept.
    pub fn len(&self) -> usize {
        self.tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0
            .len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The store's clock as the tasks' ticks last read it, carried forward; the local wall
    /// clock before any reading.
    pub fn store_now_or_wall(&self) -> u64 {
        self.clock.now_ms().unwrap_or_else(wall_millis)
    }
}

fn forget_idle(tasks: &mut HashMap<LeaseName, Kept>, now: Instant) {
    tasks.retain(|_, kept| kept.last + kept.idle > now);
    if tasks.capacity() > 2 * tasks.len() + 64 {
        tasks.shrink_to_fit();
    }
}

/// How late any slot may be fired and still run as `timer`, however close its slots are.
const ON_TIME_AT_LEAST: u64 = 5_000;

/// The latest a slot may be fired and still run as `timer` (for slots further apart than
/// this): past it, the catch-up policy decides, as for a missed slot.
const ON_TIME_AT_MOST: u64 = 3_600_000;

/// Whether a firing of `due` at `now` is on time: less than its interval after it (but never
/// less than a few seconds: a loaded host fires a one-second slot a second late), and at most
/// an hour: a caller that ticks on a timer of its own may tick anywhere in the slot, but a
/// daily slot ticked hours later is late, and goes with the missed slots.
fn on_time(schedule: &Schedule, due: u64, now: u64) -> bool {
    let interval = schedule.next_after(due).map_or(u64::MAX, |next| next - due);
    now.saturating_sub(due) < interval.clamp(ON_TIME_AT_LEAST, ON_TIME_AT_MOST)
}

/// Whether a firing of `due` follows the slots decided here: the slot before it was decided
/// (or `due` itself was), or the schedule has none before it.
fn follows(schedule: &Schedule, handled: Option<u64>, due: u64) -> bool {
    match (handled, schedule.latest_at_or_before(due.saturating_sub(1))) {
        (_, None) => true,
        (Some(handled), Some(previous)) => handled >= previous,
        (None, Some(_)) => false,
    }
}

/// Whether `slot` fell due while a run here was going (such a slot is missed for the overlap,
/// not run late beside the next one).
fn overlapped(known: &[(u64, u64, MissReason)], slot: u64) -> bool {
    known
        .iter()
        .any(|&(from, to, reason)| reason == MissReason::Overlap && (from..=to).contains(&slot))
}

fn remember(known: &mut Vec<(u64, u64, MissReason)>, slot: u64, reason: MissReason) {
    if known.len() < KNOWN_MISSES {
        known.push((slot, slot, reason));
    }
}

fn pop_front<T>(queue: &mut Vec<T>) -> Option<T> {
    (!queue.is_empty()).then(|| queue.remove(0))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn wall_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, millis)
}
