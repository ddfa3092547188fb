//! One task's timer loop, its gated ticks, and the runs of its job (timer and manual).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use super::status::{SchedulerError, TaskStatus};
use crate::lease::guard::{HeldProbe, Lease, TryAcquire};
use crate::lease::leader::{LeaderHandle, LeaderState, MAX_REFUSALS};
use crate::scheduling::definition::{TaskDefinition, TaskSource};
use crate::scheduling::gate::{Contender, Gate, Skip, StoreClock, Ticket};
use crate::scheduling::history::{
    HistoryWriter, MissReason, Outcome, RecordTrigger, RecordedSchedule, RetryNote, RunOutcome,
    RunRecord, RunRequest,
};
use crate::scheduling::interrupted::Rerun;
use crate::scheduling::lifecycle::{
    Fired, Overlapping, RunsPerFiring, TaskPlan, TaskTicks, Timer, record_run_end,
};
use crate::scheduling::placement::{Placement, View};
use crate::scheduling::policy::{CatchUp, NextAttempt, OnInterrupt, Overlap};
use crate::scheduling::task::{
    RunResult, StoreDownPolicy, Task, TaskContext, TickOutcome, Trigger,
};
use crate::store::catalog::{Control, Versioned};
use crate::store::error::StoreError;
use crate::store::name::{HolderId, LeaseName};
use crate::store::text::visible;
use crate::store::token::FencingToken;
use crate::store::traits::{Catalog, Slots};

/// What every task of one scheduler shares.
pub(super) struct Common {
    pub(super) stop: CancellationToken,
    /// Ends shutdown's grace period early (a second SIGTERM): running jobs are cancelled now.
    pub(super) drain_over: CancellationToken,
    pub(super) leader: Option<LeaderHandle>,
    /// With [`Scheduler::spread`](crate::Scheduler::spread): which tasks this instance owns.
    pub(super) placement: Option<Arc<Placement>>,
    pub(super) holder: HolderId,
    /// How long shutdown lets running jobs finish before cancelling them.
    pub(super) grace: Duration,
    /// False for [`Scheduler::local`](crate::Scheduler::local): no store at all.
    pub(super) has_store: bool,
    /// Why the scheduler stopped itself, if it did.
    pub(super) failure: OnceLock<String>,
    /// `STORE_UNKNOWN`, `STORE_UP` or `STORE_DOWN`, as the last tick found it.
    store_state: AtomicU8,
    pub(super) history: HistoryWriter,
    /// The store's clock as the tasks' ticks last read it.
    pub(super) clock: Arc<StoreClock>,
}

const STORE_UNKNOWN: u8 = 0;
const STORE_UP: u8 = 1;
const STORE_DOWN: u8 = 2;

impl Common {
    pub(super) fn new(
        leader: Option<LeaderHandle>,
        placement: Option<Arc<Placement>>,
        holder: HolderId,
        grace: Duration,
        has_store: bool,
        stop: CancellationToken,
        history: HistoryWriter,
    ) -> Self {
        Self {
            history,
            stop,
            drain_over: CancellationToken::new(),
            leader,
            placement,
            holder,
            grace,
            has_store,
            failure: OnceLock::new(),
            store_state: AtomicU8::new(STORE_UNKNOWN),
            // The local wall clock until the store first answers.
            clock: TaskTicks::timer_clock(),
        }
    }

    /// Stops the scheduler because retrying cannot help; `why` is kept for status.
    pub(super) fn fail(&self, why: String) {
        self.stop.cancel();
        if self.failure.set(why).is_ok() {
            let why = self.failure.get().map(String::as_str).unwrap_or_default();
            tracing::error!(error = why, "scheduler stopped: the store keeps refusing");
        }
    }

    /// Completes when shutdown wants a run stopped: once its grace period, counted from the
    /// start of shutdown, has run out, or the drain was ended early. Until then the run goes on
    /// holding (and renewing) its leases; `draining` is set once shutdown has begun.
    async fn drained(
        &self,
        task: &LeaseName,
        slot: Option<u64>,
        draining: &AtomicBool,
    ) -> &'static str {
        self.stop.cancelled().await;
        draining.store(true, Ordering::Relaxed);
        if !self.grace.is_zero() && !self.drain_over.is_cancelled() {
            tracing::info!(task = %task, "draining: waiting up to {:?} for the run of {} to finish", self.grace, run_of(task, slot));
        }
        tokio::select! {
            () = tokio::time::sleep(self.grace) => "shutdown grace period over",
            () = self.drain_over.cancelled() => "shutdown drain ended early",
        }
    }

    /// Whether the store answered the last tick that asked it; `None` before any did.
    pub(super) fn store_reachable(&self) -> Option<bool> {
        match self.store_state.load(Ordering::Relaxed) {
            STORE_UP => Some(true),
            STORE_DOWN => Some(false),
            _ => None,
        }
    }

    fn store_answered(&self) {
        if self.store_state.swap(STORE_UP, Ordering::Relaxed) == STORE_DOWN {
            tracing::info!("store answers again; timer ticks are gated again");
        }
    }

    /// One warning per outage, not one per tick.
    fn store_unreachable(&self, error: &(dyn fmt::Display + Sync)) {
        if self.store_state.swap(STORE_DOWN, Ordering::Relaxed) != STORE_DOWN {
            tracing::warn!(%error, "store unreachable; timer ticks follow each task's store-down policy until it answers");
        }
    }
}

/// A run's name in log lines: the task and, for a slot's run, the slot.
fn run_of(task: &LeaseName, slot: Option<u64>) -> String {
    match slot {
        Some(slot) => format!("{task} slot {slot}"),
        None => task.to_string(),
    }
}

/// Counters per task, for status.
#[derive(Default)]
struct TaskStats {
    ticks: AtomicU64,
    runs: AtomicU64,
    failures: AtomicU64,
    store_down_ticks: AtomicU64,
    /// Runs in progress here (timer and manual).
    active: AtomicUsize,
    last: Mutex<Option<(TickOutcome, Option<u64>)>>,
    /// The last firing here found the task paused (logged once, and its resume once).
    paused: AtomicBool,
}

/// Counts a run as active for as long as it lives, however it ends.
struct Active<'a>(&'a AtomicUsize);

impl<'a> Active<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(super) struct TaskRunner<S> {
    task: Task,
    /// The tick decision; its task lease is held for the whole of a gated run.
    gate: Gate<S>,
    /// The task as its ticks need it: schedule and policies.
    plan: TaskPlan,
    /// The task's life between firings: slot naming, missed slots, catch-up, store-down.
    ticks: TaskTicks,
    common: Arc<Common>,
    stats: TaskStats,
    /// Manual runs, owned here so a caller that stops waiting does not detach them, and runs
    /// beside another (overlap policy `allow`): both drained on shutdown.
    manual: TaskTracker,
    /// Refusals in a row, for giving up after [`MAX_REFUSALS`].
    refusals: AtomicU32,
    /// Fires when the task is removed or the scheduler stops: no more slots are taken (a run
    /// in progress goes on; only shutdown's grace period cancels it).
    retired: CancellationToken,
}

/// Why an attempt was cancelled at the task's timeout.
const TIMED_OUT: &str = "timeout reached";

/// Why an attempt was cancelled for a newer slot (overlap policy `replace`).
const REPLACED: &str = "replaced by a newer slot";

/// A run that a newer slot replaces (overlap policy `replace`): its token is cancelled, and the
/// slot kept for its record.
#[derive(Default)]
struct Replacement {
    token: CancellationToken,
    by: OnceLock<u64>,
}

impl Replacement {
    fn replace(&self, slot: u64) {
        // The first slot to replace the run is the one its record names.
        let _ = self.by.set(slot);
        self.token.cancel();
    }
}

async fn fired(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

/// Completes when the leader's state (or the membership view) changes; never without one.
async fn changed<T>(rx: &mut Option<tokio::sync::watch::Receiver<T>>) {
    let changed = match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

/// What entitles this instance to contend for a task's ticks; missed slots are looked for once
/// per term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Term {
    /// Neither a leader gate nor placement says otherwise: every instance contends.
    Everyone,
    /// This instance leads the group in the term with this token.
    Leader(FencingToken),
    /// This instance owns the task in this generation of the membership view.
    Owner(u64),
}

/// The leases a gated run holds.
#[derive(Default)]
struct Held {
    token: Option<FencingToken>,
    lease: Option<(CancellationToken, HeldProbe)>,
    leader: Option<CancellationToken>,
    /// For a run asked for through the catalog: who asked, and the request's id.
    request: Option<RunRequest>,
    /// For a slot run again because its run was cut off: which attempt, and what started it.
    rerun: Option<Rerun>,
    /// Cancelled when a newer slot replaces the run (overlap policy `replace`).
    replaced: Option<Arc<Replacement>>,
}

impl Held {
    /// What a gate's ticket holds.
    fn of(ticket: &Ticket) -> Self {
        Self {
            token: Some(ticket.guard().token()),
            lease: Some((ticket.guard().cancellation_token(), ticket.guard().probe())),
            leader: ticket.leader_signal().cloned(),
            request: ticket.request().map(|r| RunRequest {
                id: r.id.clone(),
                by: r.by.clone(),
            }),
            rerun: None,
            replaced: None,
        }
    }

    /// Whether what the run holds started ending (a lease or leadership lost).
    fn ending(&self) -> bool {
        let lost = |token: Option<&CancellationToken>| token.is_some_and(|t| t.is_cancelled());
        lost(self.lease.as_ref().map(|(cancel, _)| cancel)) || lost(self.leader.as_ref())
    }
}

impl<S: Slots + Catalog> TaskRunner<S> {
    pub(super) fn new(
        task: Task,
        lease: Lease<S>,
        policy: StoreDownPolicy,
        common: Arc<Common>,
    ) -> Self {
        let contender = match (&common.leader, &common.placement) {
            (Some(leader), _) => Contender::Leader(leader.watch()),
            (None, Some(placement)) => Contender::Owner(placement.clone()),
            (None, None) => Contender::Anyone,
        };
        let retired = common.stop.child_token();
        let gate = Gate::new(lease)
            .contender(contender)
            .recording(common.history.clone())
            .stopping_on(retired.clone());
        let plan = TaskPlan::new(task.schedule.clone())
            .on_store_down(policy)
            .catch_up(
                task.catch_up
                    .unwrap_or_else(|| CatchUp::default_for(&task.schedule)),
            )
            .runs(RunsPerFiring::All)
            .run_policy(task.run_policy);
        let ticks = TaskTicks::new(
            task.name.clone(),
            common.holder.clone(),
            common.history.clone(),
            common.clock.clone(),
        );
        Self {
            task,
            gate,
            plan,
            ticks,
            common,
            stats: TaskStats::default(),
            manual: TaskTracker::new(),
            refusals: AtomicU32::new(0),
            retired,
        }
    }

    /// Whether this task's ticks go through the store.
    fn coordinated(&self) -> bool {
        self.common.has_store && self.task.gated
    }

    /// The term in which this instance contends for this task's ticks, `None` when it does
    /// not (another instance leads the group, or owns the task).
    fn term(&self) -> Option<Term> {
        if let Some(leader) = &self.common.leader {
            return match leader.state() {
                LeaderState::Leading { token, cancel } if !cancel.is_cancelled() => {
                    Some(Term::Leader(token))
                }
                _ => None,
            };
        }
        match &self.common.placement {
            Some(placement) => match placement.owns(&self.task.name)? {
                0 => Some(Term::Everyone),
                generation => Some(Term::Owner(generation)),
            },
            None => Some(Term::Everyone),
        }
    }

    /// Arms the timer for the next slot, fires it, repeats until shutdown.
    ///
    /// Timers are armed on an estimate of the store's clock (its last reading, carried forward on
    /// the monotonic clock; the local wall clock before any reading). Each firing goes to the
    /// task's [`TaskTicks`], which claims the slot only once the store's clock has reached it
    /// (a host whose clock runs ahead never claims a future slot), and looks for missed slots
    /// whenever a firing does not follow the last slot decided here.
    ///
    /// Missed slots are also looked for (and caught up) at once on start and when this
    /// instance wins leadership or the task (after an outage, at the first firing the store
    /// answers); and a
    /// manual trigger is taken when a catalog heartbeat reads it (`control`) and the task lease
    /// is free.
    pub(super) async fn timer_loop(
        self: Arc<Self>,
        mut control: Option<watch::Receiver<Option<Versioned>>>,
    ) {
        let name = self.task.name.clone();
        let mut leader_rx = self.common.leader.as_ref().map(|l| l.watch());
        let mut view_rx: Option<watch::Receiver<View>> =
            self.common.placement.as_ref().map(|p| p.watch());
        // The term whose missed slots were looked for.
        let mut checked: Option<Term> = None;
        let mut timer = Timer::default();
        while !self.retired.is_cancelled() {
            // (After an outage the first firing the store answers looks back by itself: the
            // slots decided here stopped following each other.)
            if self.coordinated()
                && let Some(term) = self.term()
                && checked != Some(term)
            {
                match self.ticks.look_for_missed(&self.gate, &self.plan).await {
                    Ok(_) => {
                        checked = Some(term);
                        self.common.store_answered();
                        self.run_queued().await;
                    }
                    Err(e) => self.common.store_unreachable(&e),
                }
            }
            let Some((slot, fire_at)) = timer.next(&self.ticks, &self.plan) else {
                tracing::warn!(task = %name, "schedule has no further firing; timer stopped");
                return;
            };
            tokio::select! {
                // A firing that is due wins over a change seen at the same instant.
                biased;
                () = self.retired.cancelled() => return,
                () = tokio::time::sleep_until(fire_at) => {}
                // A new term (or a task moving here) looks for missed slots at once, not at the
                // next firing.
                () = changed(&mut leader_rx) => continue,
                () = changed(&mut view_rx) => continue,
                () = changed(&mut control) => {
                    self.take_pending_from(control.as_ref()).await;
                    timer.again(slot);
                    continue;
                }
            }
            let outcome = if !self.coordinated() {
                self.run(Trigger::Timer, Some(slot), Held::default()).await;
                TickOutcome::RanUngated
            } else {
                let fired = self.ticks.fire(&self.gate, &self.plan, Some(slot)).await;
                if let Fired::Early { slot, .. } = fired {
                    // The estimate ran ahead of the store: wait for the store's time.
                    timer.early(&self.ticks, &self.task.schedule, slot);
                    continue;
                }
                if !matches!(fired, Fired::StoreDown { .. } | Fired::Refused { .. }) {
                    self.common.store_answered();
                }
                self.note_pause(&fired);
                let outcome = self.outcome_of(fired).await;
                if outcome == TickOutcome::Ran {
                    self.run_queued().await;
                }
                outcome
            };
            timer.fired(slot);
            self.stats.ticks.fetch_add(1, Ordering::Relaxed);
            *lock(&self.stats.last) = Some((outcome, Some(slot)));
            let ticked = || metrics::counter!("leasehold_ticks_total", "task" => name.as_str().to_owned(), "outcome" => outcome.as_str());
            self.ticks
                .counter("ticks", outcome.as_str(), ticked)
                .increment(1);
            tracing::debug!(task = %name, slot, outcome = outcome.as_str(), "tick");
        }
    }

    /// Runs what the task's ticks queued (catch-ups, then the slot due after them), each
    /// once the one before ended.
    async fn run_queued(self: &Arc<Self>) {
        while !self.retired.is_cancelled() {
            let Some(fired) = self.ticks.fire_queued(&self.gate, &self.plan).await else {
                return;
            };
            if self.outcome_of(fired).await != TickOutcome::Ran {
                return;
            }
        }
    }

    /// Acts on a firing: runs a ticket (then hands the task lease over, and takes a manual
    /// trigger the run left waiting), or applies the store-down policy.
    async fn outcome_of(self: &Arc<Self>, fired: Fired) -> TickOutcome {
        match fired {
            Fired::Run(ticket) if ticket.trigger() == Trigger::Backfill => {
                self.answered(TickOutcome::Ran);
                self.run_backfill(ticket).await;
                TickOutcome::Ran
            }
            Fired::Run(ticket) => {
                self.answered(TickOutcome::Ran);
                let (slot, trigger) = (ticket.slot(), ticket.trigger());
                let start = self.ticks.run_starts(slot);
                let slot_run = (trigger != Trigger::Manual).then_some(slot);
                let replaced = Arc::new(Replacement::default());
                let held = Held {
                    replaced: Some(replaced.clone()),
                    ..Held::of(&ticket)
                };
                let work = async {
                    self.run(trigger, slot_run, held).await;
                    if replaced.token.is_cancelled() {
                        // The slot replacing it runs first; cut-off runs are looked for after it.
                        self.ticks.run_cut_off().await;
                    } else {
                        self.run_cut_off(&ticket).await;
                    }
                };
                let leader = ticket.leader_signal().cloned();
                self.watching(work, slot, &replaced, leader).await;
                if let Err(e) = ticket.into_guard().release().await {
                    tracing::warn!(task = %self.task.name, error = %e, "task lease release failed");
                }
                self.ticks.run_ended(&self.task.schedule, start).await;
                // A trigger left waiting is not taken once shutdown has begun.
                if !self.retired.is_cancelled()
                    && let Some(ticket) = self.ticks.take_left_trigger(&self.gate).await
                {
                    self.run_taken(ticket).await;
                }
                TickOutcome::Ran
            }
            Fired::Skipped { skip, .. } => match skip {
                Skip::NotLeader => TickOutcome::SkippedNotLeader,
                Skip::NotOwner => TickOutcome::SkippedNotOwner,
                Skip::Paused(_) => self.answered(TickOutcome::SkippedPaused),
                Skip::Expiring => self.answered(TickOutcome::SkippedLeaseLost),
                // Overlap (a run here), busy, already run.
                _ => self.answered(TickOutcome::SkippedClaimed),
            },
            Fired::NotDue { .. } | Fired::Early { .. } => {
                self.answered(TickOutcome::SkippedClaimed)
            }
            Fired::StoreDown { slot, runs, error } => self.store_down(slot, runs, &error).await,
            Fired::Refused { slot, error } => self.refused(slot, &error).await,
        }
    }

    /// Runs `work` (the run of `slot`), and, unless the overlap policy is `skip` (whose slots
    /// falling meanwhile the next look back records), the timer slots that fall meanwhile as
    /// [`watch_overlaps`](Self::watch_overlaps) decides them.
    async fn watching(
        self: &Arc<Self>,
        work: impl Future<Output = ()>,
        slot: u64,
        replaced: &Replacement,
        leader: Option<CancellationToken>,
    ) {
        if self.plan.run_policy.overlap == Overlap::Skip {
            return work.await;
        }
        tokio::select! {
            biased;
            () = work => {}
            () = self.watch_overlaps(slot, replaced, leader) => {}
        }
    }

    /// While a run that started for `slot` goes on: fires each slot that falls meanwhile (at its
    /// time, as the timer loop would) and acts on what the task's lifecycle decides for it
    /// under the overlap policy ([`TaskTicks::overlapping`]): nothing more for a slot skipped or
    /// left waiting (the lifecycle queues it), cancels the run for a slot replacing it, starts
    /// a run beside it for `allow`. Never completes by itself.
    async fn watch_overlaps(
        self: &Arc<Self>,
        slot: u64,
        replaced: &Replacement,
        leader: Option<CancellationToken>,
    ) {
        let mut timer = Timer::default();
        timer.fired(slot);
        while !self.retired.is_cancelled() {
            let Some((next, at)) = timer.next(&self.ticks, &self.plan) else {
                break;
            };
            tokio::select! {
                () = self.retired.cancelled() => break,
                () = tokio::time::sleep_until(at) => {}
            }
            timer.fired(next);
            match self.ticks.overlapping(&self.plan, next).await {
                Overlapping::Replaces => {
                    tracing::info!(task = %self.task.name, slot = next, "overlap replace: cancelling the run going for the new slot");
                    replaced.replace(next);
                }
                Overlapping::Beside => self.run_beside(next, leader.clone()),
                _ => {}
            }
        }
        std::future::pending().await
    }

    /// Runs `slot` beside the run going (overlap policy `allow`), under a run lease of its own
    /// ([`TaskTicks::claim_beside`]), in the task's tracker so shutdown drains it.
    fn run_beside(self: &Arc<Self>, slot: u64, leader: Option<CancellationToken>) {
        let runner = self.clone();
        self.manual.spawn(async move {
            let Some(guard) = runner
                .ticks
                .claim_beside(&runner.gate, &runner.plan, slot)
                .await
            else {
                return;
            };
            let held = Held {
                token: Some(guard.token()),
                lease: Some((guard.cancellation_token(), guard.probe())),
                leader,
                ..Held::default()
            };
            runner.run(Trigger::Timer, Some(slot), held).await;
            if let Err(e) = guard.release().await {
                tracing::warn!(task = %runner.task.name, error = %e, "run lease release failed");
            }
        });
    }

    /// Runs again, under `ticket`'s task lease once its own run ended, the slots whose run was
    /// cut off ([`TaskTicks::cut_off_runs`]), while the lease holds and the task is not retired.
    async fn run_cut_off(&self, ticket: &Ticket) {
        if Held::of(ticket).ending() {
            self.ticks.run_cut_off().await;
            return;
        }
        for rerun in self
            .ticks
            .cut_off_runs(&self.gate, &self.plan, ticket)
            .await
        {
            let held = Held::of(ticket);
            if self.retired.is_cancelled() || held.ending() {
                self.ticks.run_cut_off().await;
                return;
            }
            let held = Held {
                rerun: Some(rerun),
                ..held
            };
            self.run(Trigger::Retry, Some(rerun.slot), held).await;
        }
        if Held::of(ticket).ending() {
            self.ticks.run_cut_off().await;
        }
    }

    /// The task's catalog heartbeat read a control record: its pending manual trigger is
    /// taken if this instance may run the task now.
    async fn take_pending_from(
        self: &Arc<Self>,
        control: Option<&watch::Receiver<Option<Versioned>>>,
    ) {
        let Some(record) = control.and_then(|c| c.borrow().clone()) else {
            return;
        };
        let Ok(parsed) = Control::from_json(&record.value) else {
            return;
        };
        self.take_pending(&parsed, record.version).await;
    }

    /// Takes the manual trigger pending in `control` (at `version`) if this instance may run
    /// the task now, and runs it beside the timer loop, holding the task lease.
    async fn take_pending(self: &Arc<Self>, control: &Control, version: u64) {
        if control.trigger.is_none() {
            return;
        }
        let ticket = match self
            .gate
            .take_trigger(control, version, self.ticks.store_now_or_wall())
            .await
        {
            Ok(Some(ticket)) => ticket,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(task = %self.task.name, error = %e, "manual trigger not taken");
                return;
            }
        };
        if let Some(request) = ticket.request().filter(|r| r.slots.is_none()) {
            tracing::info!(task = %self.task.name, id = %request.id, by = %request.by, "manual run asked for through the catalog");
        }
        self.run_taken(ticket).await;
    }

    /// Runs a trigger's ticket: a backfill's slots in the timer loop
    /// ([`run_backfill`](Self::run_backfill)), a manual run beside it.
    async fn run_taken(self: &Arc<Self>, ticket: Ticket) {
        if ticket.trigger() == Trigger::Backfill {
            return self.run_backfill(ticket).await;
        }
        self.run_manual_ticket(ticket);
    }

    /// Runs a manual trigger's ticket beside the timer loop, holding the task lease.
    fn run_manual_ticket(self: &Arc<Self>, ticket: Ticket) {
        let runner = self.clone();
        self.manual.spawn(async move {
            runner.run(Trigger::Manual, None, Held::of(&ticket)).await;
            if let Err(e) = ticket.into_guard().release().await {
                tracing::warn!(task = %runner.task.name, error = %e, "task lease release failed");
            }
        });
    }

    /// Runs the slots of the backfill `ticket` took, oldest first, one at a time, each under
    /// the task lease ([`TaskTicks::backfill_next`]), until none is left or the task is
    /// retired. It runs in the timer loop, as a timer run does: a timer slot that falls while a
    /// backfill run goes is decided under the overlap policy ([`watching`](Self::watching)),
    /// and one left waiting (`buffer-one`, `buffer-all`, `replace`) runs before the next
    /// backfill slot. Boxed: a timer run it lets through may take another backfill.
    fn run_backfill(self: &Arc<Self>, ticket: Ticket) -> BoxFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            let mut backfill = this.ticks.backfill(&this.plan, ticket);
            let limit = this.gate.lease().config().renew_interval;
            while !this.retired.is_cancelled()
                && let Some(ticket) = this.ticks.backfill_next(&this.gate, &mut backfill).await
            {
                let slot = ticket.slot();
                let start = this.ticks.run_starts(slot);
                let replaced = Arc::new(Replacement::default());
                let held = Held {
                    replaced: Some(replaced.clone()),
                    ..Held::of(&ticket)
                };
                let work = async {
                    this.run(Trigger::Backfill, Some(slot), held).await;
                };
                let leader = ticket.leader_signal().cloned();
                this.watching(work, slot, &replaced, leader).await;
                // The run's end is in the store before the lease is let go: whoever takes it
                // next (another backfill of the same range) reads that the slot ran.
                this.common.history.flush(limit).await;
                if let Err(e) = ticket.into_guard().release().await {
                    tracing::warn!(task = %this.task.name, error = %e, "task lease release failed");
                }
                this.ticks.run_ended(&this.task.schedule, start).await;
                this.run_queued().await;
            }
            if let Some(request) = backfill.request() {
                tracing::info!(task = %this.task.name, id = %request.id, "backfill over");
            }
        })
    }

    /// The task's definition as the catalog shows it.
    pub(super) fn definition(
        &self,
        source: TaskSource,
        leader_group: Option<&LeaseName>,
        spread_group: Option<&LeaseName>,
    ) -> TaskDefinition {
        self.plan
            .definition(source, self.task.gated, leader_group, spread_group)
    }

    /// Logs once when a firing here finds the task paused (who paused it, and why), and once
    /// when a slot runs here again.
    fn note_pause(&self, fired: &Fired) {
        let paused = match fired {
            Fired::Skipped {
                skip: Skip::Paused(pause),
                ..
            } => Some(pause),
            Fired::Run(_) => None,
            _ => return,
        };
        match (
            self.stats.paused.swap(paused.is_some(), Ordering::Relaxed),
            paused,
        ) {
            (false, Some(pause)) => tracing::info!(
                task = %self.task.name,
                by = %visible(&pause.by),
                reason = %visible(pause.reason.as_deref().unwrap_or("")),
                "task paused: its slots are skipped until it is resumed"
            ),
            (true, None) => {
                tracing::info!(task = %self.task.name, "task resumed: its slots run again")
            }
            _ => {}
        }
    }

    /// The store answered (whatever it said): refusals in a row start again from zero.
    fn answered(&self, outcome: TickOutcome) -> TickOutcome {
        self.refusals.store(0, Ordering::Relaxed);
        outcome
    }

    /// The store refused: a full disk, a permission lost. The slot is missed because the store
    /// could not serve it, as when it is down.
    async fn refused(&self, slot: u64, error: &(dyn fmt::Display + Sync)) -> TickOutcome {
        self.ticks.skipped(slot, MissReason::StoreDown).await;
        let refusals = self.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(task = %self.task.name, %error, refusals, "the store refused the task lease or slot claim");
        if refusals >= MAX_REFUSALS {
            self.common.fail(format!(
                "task {}: the store refused {refusals} times in a row: {error}",
                self.task.name
            ));
        }
        TickOutcome::SkippedRefused
    }

    /// The store could not answer a firing of `slot`; the store-down policy said whether it
    /// `runs` here anyway (ungated).
    async fn store_down(
        &self,
        slot: Option<u64>,
        runs: bool,
        error: &(dyn fmt::Display + Sync),
    ) -> TickOutcome {
        self.common.store_unreachable(error);
        self.stats.store_down_ticks.fetch_add(1, Ordering::Relaxed);
        let policy = self.plan.on_store_down.as_str();
        let down = || metrics::counter!("leasehold_store_down_ticks_total", "task" => self.task.name.as_str().to_owned(), "policy" => policy);
        self.ticks
            .counter("store_down_ticks", policy, down)
            .increment(1);
        if !runs {
            if let Some(slot) = slot {
                self.ticks.skipped(slot, MissReason::StoreDown).await;
            }
            return TickOutcome::SkippedStoreDown;
        }
        self.run(Trigger::Timer, slot, Held::default()).await;
        TickOutcome::RanStoreDown
    }

    /// Runs the job, and again after a failed or timed-out attempt as the task's retries say
    /// ([`TaskTicks::next_attempt`]), while this instance still holds what the run holds (its
    /// task lease, its leadership), the task is not retired and the scheduler is not shutting
    /// down: the waits end early on any of these, and the retry is not run. Returns the last
    /// attempt's result.
    async fn run(&self, trigger: Trigger, slot: Option<u64>, held: Held) -> RunResult {
        let mut attempt = held.rerun.map_or(1, |rerun| rerun.attempt);
        loop {
            let (result, next) = self.attempt(trigger, slot, &held, attempt).await;
            let NextAttempt::After {
                attempt: next,
                wait,
            } = next
            else {
                return result;
            };
            let lease_cancel = held.lease.as_ref().map(|(cancel, _)| cancel);
            tokio::select! {
                biased;
                () = self.retired.cancelled() => return result,
                // A drain lets a run finish; it starts no new attempt.
                () = self.common.stop.cancelled() => return result,
                () = fired(lease_cancel) => return result,
                () = fired(held.leader.as_ref()) => return result,
                () = fired(held.replaced.as_ref().map(|r| &r.token)) => return result,
                () = tokio::time::sleep(wait) => {}
            }
            tracing::info!(task = %self.task.name, attempt = next, "retrying the run of {}", run_of(&self.task.name, slot));
            attempt = next;
        }
    }

    /// Runs one attempt of the job in its own task (so a panic is contained). Its token is
    /// cancelled when the task lease or leadership starts expiring, when shutdown's grace
    /// period ends (or [`SchedulerHandle::end_drain`](super::SchedulerHandle::end_drain) is
    /// called), or at the task's timeout; a job still running a stop margin later is
    /// aborted. Gated and manual runs are recorded in the run history (ungated and store-down
    /// runs, which every instance may make, are not), each attempt with what follows it.
    async fn attempt(
        &self,
        trigger: Trigger,
        slot: Option<u64>,
        held: &Held,
        attempt: u32,
    ) -> (RunResult, NextAttempt) {
        let cancel = CancellationToken::new();
        let (lease_cancel, lease_probe) = held.lease.clone().unzip();
        let mut probes: Vec<HeldProbe> = lease_probe.into_iter().collect();
        probes.extend(held.leader.clone().map(HeldProbe::Token));
        let output = Arc::default();
        let ctx = TaskContext {
            task: self.task.name.clone(),
            trigger,
            slot,
            token: held.token,
            holder: self.common.holder.clone(),
            cancel: cancel.clone(),
            held: probes,
            attempt,
            output: Arc::clone(&output),
        };
        let recorded_trigger = match trigger {
            Trigger::Manual => Some(RecordTrigger::Manual),
            Trigger::Backfill => Some(RecordTrigger::Backfill),
            Trigger::CatchUp => Some(RecordTrigger::CatchUp),
            Trigger::Timer if held.token.is_some() => Some(RecordTrigger::Timer),
            Trigger::Retry => held.rerun.map(|rerun| rerun.trigger),
            _ => None,
        };
        // Every run is counted in the task's run series; gated and manual ones are also kept
        // in the history.
        let mut record = RunRecord::started(
            slot,
            recorded_trigger.unwrap_or(RecordTrigger::Timer),
            self.common.holder.to_string(),
            held.token,
            self.ticks.store_now_or_wall(),
            Some(RecordedSchedule::of(&self.task.schedule)),
        );
        record.request = held.request.clone();
        // Numbered only for a task that retries: other records keep their shape.
        record.attempt = (self.plan.run_policy.retries > 0 || attempt > 1).then_some(attempt);
        let history = recorded_trigger.map(|_| &self.common.history);
        if let Some(history) = history {
            history.record(&self.task.name, record.clone());
            // A gated run's start is in the store before its job starts, so that if this
            // instance is killed mid-run the next holder finds the run cut off.
            if held.token.is_some()
                && slot.is_some()
                && self.plan.run_policy.on_interrupt == OnInterrupt::Rerun
            {
                history
                    .flush(self.gate.lease().config().renew_interval)
                    .await;
            }
        }
        let _active = Active::new(&self.stats.active);
        // Aborted if this future is dropped, so a job never outlives its run.
        let mut job = AbortOnDropHandle::new(tokio::spawn((self.task.job)(ctx)));
        let timeout = self.plan.run_policy.timeout;
        // Shutdown drains the run: it goes on for up to the grace period, still stopped at once
        // should a lease start expiring, so the stop-before-re-grant margin holds throughout.
        let draining = AtomicBool::new(false);
        let stop = async {
            tokio::select! {
                () = fired(lease_cancel.as_ref()) => "task lease expiring",
                () = fired(held.leader.as_ref()) => "leadership ending",
                () = fired(held.replaced.as_ref().map(|r| &r.token)) => REPLACED,
                why = self.common.drained(&self.task.name, slot, &draining) => why,
                () = async {
                    match timeout {
                        Some(limit) => tokio::time::sleep(limit).await,
                        None => std::future::pending().await,
                    }
                } => TIMED_OUT,
            }
        };
        let mut stopped = None;
        let joined = tokio::select! {
            joined = &mut job => Some(joined),
            why = stop => {
                // Cancel first: a log write that fails must never delay the stop.
                cancel.cancel();
                stopped = Some(why);
                tracing::warn!(task = %self.task.name, why, "cancelling run");
                tokio::time::timeout(self.gate.lease().config().stop_margin, &mut job).await.ok()
            }
        };
        if draining.load(Ordering::Relaxed) && !self.common.grace.is_zero() {
            let run = run_of(&self.task.name, slot);
            match stopped {
                None => {
                    tracing::info!(task = %self.task.name, "draining over: the run of {run} finished")
                }
                Some(why) => {
                    tracing::info!(task = %self.task.name, why, "draining over: the run of {run} was stopped ({why})")
                }
            }
        }
        let replaced_by = held
            .replaced
            .as_ref()
            .filter(|_| stopped == Some(REPLACED))
            .and_then(|r| r.by.get().copied());
        let mut result = match joined {
            Some(Ok(Ok(()))) => RunResult::Succeeded,
            Some(Ok(Err(e))) => RunResult::Failed(e.to_string()),
            Some(Err(e)) if e.is_panic() => RunResult::Panicked,
            _ => RunResult::Aborted,
        };
        let outcome = match (&result, stopped) {
            (RunResult::Aborted, _) => RunOutcome::Aborted,
            (RunResult::Panicked, _) => RunOutcome::Panicked,
            (_, Some(TIMED_OUT)) => RunOutcome::Cancelled {
                why: format!("{TIMED_OUT} ({:?})", timeout.unwrap_or_default()),
            },
            (_, Some(REPLACED)) => RunOutcome::Cancelled {
                why: format!(
                    "replaced by the slot at {} (overlap replace)",
                    replaced_by.unwrap_or_default()
                ),
            },
            (_, Some(why)) => RunOutcome::Cancelled {
                why: why.to_owned(),
            },
            (RunResult::Succeeded, None) => RunOutcome::Ok,
            (RunResult::Failed(error), None) => RunOutcome::Failed {
                error: error.clone(),
            },
            // Only set below, from `stopped`.
            (RunResult::TimedOut, None) => RunOutcome::Ok,
        };
        record.output = lock(&output).take();
        let now = self.ticks.store_now_or_wall();
        let mut ended = record.ended(now, outcome);
        ended.replaced_by = replaced_by;
        if stopped == Some(TIMED_OUT) && result != RunResult::Panicked {
            // Kept as `cancelled` (or `aborted`) in `outcome`, which older releases read.
            ended.result = Some(Outcome::TimedOut);
            result = RunResult::TimedOut;
        }
        self.stats.runs.fetch_add(1, Ordering::Relaxed);
        if result != RunResult::Succeeded {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
            match slot {
                Some(slot) => {
                    tracing::warn!(task = %self.task.name, slot, attempt, %result, "run did not succeed")
                }
                None => {
                    tracing::warn!(task = %self.task.name, attempt, %result, "manual run did not succeed")
                }
            }
        }
        // A backfill run is not retried (its slot's next is past): asked for again, a slot
        // without an ok run runs again.
        let retried_slot = slot.filter(|_| trigger != Trigger::Backfill);
        let next = match ended.result() {
            Some(outcome) => self
                .ticks
                .next_attempt(&self.plan, retried_slot, attempt, outcome),
            None => NextAttempt::Done,
        };
        ended.retry = match next {
            NextAttempt::After { wait, .. } => Some(RetryNote::AtMs(
                now.saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
            )),
            NextAttempt::Dropped { next, .. } => Some(RetryNote::DroppedBeforeSlot(next)),
            _ => None,
        };
        record_run_end(history, &self.task.name, ended);
        (result, next)
    }

    /// A manual run in a task of the scheduler's own (so it is drained on shutdown even if the
    /// caller stops waiting). `exclusive`: hold the task lease for the run, so it never overlaps
    /// a run of this task anywhere.
    async fn manual_run(self: Arc<Self>, exclusive: bool) -> Result<RunResult, SchedulerError> {
        if !exclusive {
            return Ok(self.run(Trigger::Manual, None, Held::default()).await);
        }
        let Ok(_exclusive) = self.gate.exclusive().try_lock_owned() else {
            return Err(SchedulerError::Busy {
                holder: self.common.holder.clone(),
            });
        };
        let guard = match self.gate.lease().try_acquire().await? {
            TryAcquire::Acquired(guard) => guard,
            TryAcquire::Busy { holder, .. } => return Err(SchedulerError::Busy { holder }),
        };
        let held = Held {
            token: Some(guard.token()),
            lease: Some((guard.cancellation_token(), guard.probe())),
            ..Held::default()
        };
        let result = self.run(Trigger::Manual, None, held).await;
        if let Err(e) = guard.release().await {
            tracing::warn!(task = %self.task.name, error = %e, "task lease release failed");
        }
        Ok(result)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The object-safe part of a task runner the handle needs.
pub(super) trait RunNow: Send + Sync {
    fn start_manual(
        self: Arc<Self>,
        exclusive: bool,
    ) -> tokio::task::JoinHandle<Result<RunResult, SchedulerError>>;
    fn status(&self) -> TaskStatus;
    /// Takes no more slots (see `retired`).
    fn retire(&self);
    /// The task's manual runs, to drain.
    fn manual_runs(&self) -> TaskTracker;
    fn history(self: Arc<Self>, limit: usize) -> BoxFuture<Result<Vec<RunRecord>, StoreError>>;
}

impl<S: Slots + Catalog> RunNow for TaskRunner<S> {
    fn start_manual(
        self: Arc<Self>,
        exclusive: bool,
    ) -> tokio::task::JoinHandle<Result<RunResult, SchedulerError>> {
        let tracker = self.manual.clone();
        tracker.spawn(self.manual_run(exclusive))
    }

    fn retire(&self) {
        self.retired.cancel();
    }

    fn manual_runs(&self) -> TaskTracker {
        self.manual.clone()
    }

    fn status(&self) -> TaskStatus {
        TaskStatus {
            name: self.task.name.clone(),
            schedule: self.task.schedule.to_string(),
            policy: self.plan.on_store_down,
            gated: self.task.gated,
            catch_up: self.plan.catch_up,
            ticks: self.stats.ticks.load(Ordering::Relaxed),
            runs: self.stats.runs.load(Ordering::Relaxed),
            failures: self.stats.failures.load(Ordering::Relaxed),
            store_down_ticks: self.stats.store_down_ticks.load(Ordering::Relaxed),
            running: self.stats.active.load(Ordering::Relaxed) > 0,
            owned: self
                .common
                .placement
                .as_ref()
                .and_then(|p| p.owned(&self.task.name)),
            last: *lock(&self.stats.last),
        }
    }

    fn history(self: Arc<Self>, limit: usize) -> BoxFuture<Result<Vec<RunRecord>, StoreError>> {
        Box::pin(async move {
            crate::scheduling::history::read(self.gate.lease().store(), &self.task.name, limit)
                .await
        })
    }
}
