//! One task's timer loop, its gated ticks, and the runs of its job (timer and manual).

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use super::placement::{Placement, View};
use super::task::{CatchUp, RunResult, StoreDownPolicy, Task, TaskContext, TickOutcome, Trigger};
use super::{SchedulerError, TaskStatus};
use crate::catalog::{CATALOG_RETENTION, Control, Registration, TaskDefinition, TaskSource};
use crate::gate::{Contender, Decision, Gate, Reading, Skip, Ticket};
use crate::history::{
    HistoryWriter, MissReason, RecordTrigger, RecordedSchedule, RunOutcome, RunRecord, RunRequest,
};
use crate::leader::{LeaderHandle, LeaderState, MAX_REFUSALS};
use crate::lease::{HeldProbe, Lease, TryAcquire};

use crate::store::within;
use crate::store_api::{Catalog, Slots, StoreError};
use crate::{FencingToken, HolderId, LeaseName};

/// What every task of one scheduler shares.
pub(super) struct Common {
    pub(super) stop: CancellationToken,
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
            leader,
            placement,
            holder,
            grace,
            has_store,
            failure: OnceLock::new(),
            store_state: AtomicU8::new(STORE_UNKNOWN),
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
    policy: StoreDownPolicy,
    catch_up: CatchUp,
    common: Arc<Common>,
    stats: TaskStats,
    /// Manual runs, owned here so a caller that stops waiting does not detach them.
    manual: TaskTracker,
    /// Refusals in a row, for giving up after [`MAX_REFUSALS`].
    refusals: AtomicU32,
    /// The store's clock: its last reading and the local instant of it (the local wall clock
    /// until the store first answers).
    clock: Mutex<(u64, Instant)>,
    /// Slots this instance skipped for a reason it knows, until a catch-up check records them.
    known_misses: Mutex<Vec<(u64, MissReason)>>,
}

fn wall_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Milliseconds of a clock that read `ms` at `at`, extrapolated to now on the monotonic clock.
fn extrapolate((ms, at): (u64, Instant)) -> u64 {
    let elapsed = Instant::now().saturating_duration_since(at).as_millis();
    ms.saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
        }
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
        let gate = Gate::new(lease)
            .contender(contender)
            .recording(common.history.clone())
            .stopping_on(common.stop.clone());
        let catch_up = task
            .catch_up
            .unwrap_or_else(|| CatchUp::default_for(&task.schedule));
        Self {
            task,
            gate,
            policy,
            catch_up,
            common,
            stats: TaskStats::default(),
            manual: TaskTracker::new(),
            refusals: AtomicU32::new(0),
            clock: Mutex::new((wall_millis(), Instant::now())),
            known_misses: Mutex::default(),
        }
    }

    pub(super) fn manual_runs(&self) -> TaskTracker {
        self.manual.clone()
    }

    /// Whether this task's ticks go through the store.
    fn coordinated(&self) -> bool {
        self.common.has_store && self.task.gated
    }

    /// The store's clock now, as this instance estimates it.
    fn store_now(&self) -> u64 {
        extrapolate(*lock(&self.clock))
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
    /// the monotonic clock; the local wall clock before any reading). A gated tick reads the
    /// store's clock again when it fires and claims its slot only once the store's clock has
    /// reached it, so a host whose clock runs ahead never claims a future slot.
    ///
    /// Missed slots are looked for (and caught up) on start, when this instance wins leadership,
    /// and when the store answers again after an outage.
    pub(super) async fn timer_loop(self: Arc<Self>) {
        let name = self.task.name.clone();
        let mut leader_rx = self.common.leader.as_ref().map(|l| l.watch());
        let mut view_rx: Option<tokio::sync::watch::Receiver<View>> =
            self.common.placement.as_ref().map(|p| p.watch());
        // The term whose missed slots were looked for.
        let mut checked: Option<Term> = None;
        let mut store_was_down = false;
        let mut last: Option<u64> = None;
        // Whether the last firing ran the job here: slots that fell due while it ran were not
        // fired at all, and this instance is the one that knows it.
        let mut ran_last = false;
        let mut early: Option<u64> = None;
        while !self.common.stop.is_cancelled() {
            if self.coordinated()
                && let Some(term) = self.term()
                && checked != Some(term)
            {
                match self.look_for_missed_slots(None).await {
                    Ok(caught_up) => {
                        checked = Some(term);
                        // Slots that fell due while a catch-up ran were not fired: the
                        // overlap check below records them.
                        if let Some(slot) = caught_up {
                            last = Some(slot);
                            ran_last = true;
                        }
                    }
                    Err(e) => {
                        store_was_down = true;
                        self.common.store_unreachable(&e);
                    }
                }
            }
            let now = self.store_now();
            // A slot the store's clock had not reached when its timer fired is fired again (the
            // estimate, carried forward from the middle of the round trip, may already be past
            // it, and the slot would be skipped without a trace).
            let mut next = early.take().or_else(|| self.task.schedule.next_after(now));
            // A timer that fired a hair early must not pick the slot it just ran again.
            if let (Some(slot), Some(last)) = (next, last)
                && slot <= last
            {
                next = self.task.schedule.next_after(last);
            }
            let Some(slot) = next else {
                tracing::warn!(task = %name, "schedule has no further firing; timer stopped");
                return;
            };
            if let Some(last) = last
                && std::mem::take(&mut ran_last)
            {
                self.record_overlap(last, slot).await;
            }
            let fire_at = Instant::now() + Duration::from_millis(slot.saturating_sub(now));
            tokio::select! {
                // A firing that is due wins over a change seen at the same instant: the check
                // below looks for missed slots before it claims.
                biased;
                () = self.common.stop.cancelled() => return,
                () = tokio::time::sleep_until(fire_at) => {}
                // A new term (or a task moving here) looks for missed slots at once, not at the
                // next firing.
                () = changed(&mut leader_rx) => continue,
                () = changed(&mut view_rx) => continue,
            }
            // Elected just as this slot fell due: the slots before it were missed (or are to be
            // caught up) before this one claims past them.
            if self.coordinated()
                && let Some(term) = self.term()
                && checked != Some(term)
                && self
                    .look_for_missed_slots(Some(slot.saturating_sub(1)))
                    .await
                    .is_ok()
            {
                checked = Some(term);
            }
            let outcome = if !self.coordinated() {
                self.run(Trigger::Timer, Some(slot), Held::default()).await;
                TickOutcome::RanUngated
            } else {
                match self.read_clock().await {
                    Ok(reading) => {
                        self.common.store_answered();
                        if std::mem::take(&mut store_was_down) {
                            // Back after an outage: look for what it made us miss, before
                            // this slot's claim moves the last claimed slot past it.
                            checked = None;
                            if let Some(term) = self.term()
                                && let Ok(caught_up) = self
                                    .look_for_missed_slots(Some(slot.saturating_sub(1)))
                                    .await
                            {
                                checked = Some(term);
                                if caught_up.is_some() {
                                    // Slots that fell due meanwhile are the next firings.
                                    last = caught_up.max(last);
                                }
                            }
                        }
                        if reading.now_ms < slot {
                            // Our estimate ran ahead of the store: wait for the store's time.
                            // Slots fired on that estimate (while the store was down) are no
                            // guide to what comes next; the store's slot claim still is.
                            last = last.filter(|&l| l <= reading.now_ms);
                            early = (self.task.schedule.next_after(reading.now_ms) == Some(slot))
                                .then_some(slot);
                            continue;
                        }
                        let outcome = self.tick(&reading, slot, Trigger::Timer).await;
                        // A trigger pending beside this run is taken now that it ended: catalog
                        // beats in step with the runs would never find the task lease free.
                        if outcome == TickOutcome::Ran
                            && let (Some(control), Some(version)) =
                                (&reading.control, reading.control_version)
                        {
                            self.take_pending(control, version).await;
                        }
                        outcome
                    }
                    Err(e) if e.is_transient() => {
                        store_was_down = true;
                        self.store_down(slot, &e).await
                    }
                    Err(e) => self.refused(slot, &e),
                }
            };
            last = Some(slot);
            ran_last = outcome == TickOutcome::Ran;
            self.stats.ticks.fetch_add(1, Ordering::Relaxed);
            *lock(&self.stats.last) = Some((outcome, Some(slot)));
            metrics::counter!("leasehold_ticks_total", "task" => name.as_str().to_owned(), "outcome" => outcome.as_str())
                .increment(1);
            tracing::debug!(task = %name, slot, outcome = outcome.as_str(), "tick");
        }
    }

    /// The store's clock (with the task's control record where the store keeps a catalog),
    /// kept as the clock estimate.
    async fn read_clock(&self) -> Result<Reading, StoreError> {
        let reading = self.gate.read_clock().await?;
        *lock(&self.clock) = (reading.now_ms, reading.at);
        Ok(reading)
    }

    /// Compares the highest claimed slot with the slots due on the store's clock: records the
    /// ones that did not run and runs those the catch-up policy asks for. Every slot due by now
    /// counts, the one that fired a moment ago included (a handoff at 03:00:00 must not lose the
    /// 03:00 run): should another instance be claiming it right now, the forward-only claim lets
    /// only one of the two run it, and its run record replaces the miss record (same key).
    /// `until` bounds the slots looked at (the one about to fire is not missed).
    async fn look_for_missed_slots(&self, until: Option<u64>) -> Result<Option<u64>, StoreError> {
        let reading = self.read_clock().await?;
        let now = reading.now_ms;
        let horizon = until.map_or(now, |u| u.min(now));
        self.common.store_answered();
        let limit = self.gate.lease().config().renew_interval;
        let last = within(limit, self.gate.lease().store().last_slot(&self.task.name)).await;
        let last = match last {
            Ok(Some(last)) => last,
            // Never ran anywhere: nothing was missed.
            Ok(None) => return Ok(None),
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => {
                tracing::debug!(task = %self.task.name, error = %e, "no slot record to catch up from");
                return Ok(None);
            }
        };
        let (window, max) = match self.catch_up {
            CatchUp::Skip => (0, 0),
            CatchUp::Latest { window } => (millis(window), 1),
            CatchUp::All { window, max } => (millis(window), max),
        };
        let (count, newest) = self.task.schedule.firings_between(last, horizon, max);
        let known = std::mem::take(&mut *lock(&self.known_misses));
        if count == 0 {
            return Ok(None);
        }
        let oldest_runnable = now.saturating_sub(window);
        let to_run: Vec<u64> = newest
            .into_iter()
            .filter(|&slot| slot >= oldest_runnable)
            .collect();
        let missed = count - to_run.len() as u64;
        if missed > 0 {
            let first = self.task.schedule.next_after(last).unwrap_or(last);
            let last_missed = match to_run.first() {
                Some(&run) => self
                    .task
                    .schedule
                    .firings_between(last, run.saturating_sub(1), 1)
                    .1
                    .first()
                    .copied()
                    .unwrap_or(first),
                None => self
                    .task
                    .schedule
                    .firings_between(last, horizon, 1)
                    .1
                    .first()
                    .copied()
                    .unwrap_or(first),
            };
            let reason = known
                .iter()
                .find(|(slot, _)| (first..=last_missed).contains(slot))
                .map_or(MissReason::NotClaimed, |(_, reason)| *reason);
            self.record_miss(first, missed, last_missed, reason);
        }
        let mut caught_up = None;
        for slot in to_run {
            tracing::info!(task = %self.task.name, slot, policy = self.catch_up.as_str(), "catching up a missed slot");
            let outcome = self.tick(&reading, slot, Trigger::CatchUp).await;
            if outcome != TickOutcome::Ran {
                break;
            }
            caught_up = Some(slot);
        }
        Ok(caught_up)
    }

    fn record_miss(&self, first: u64, count: u64, last_slot: u64, reason: MissReason) {
        metrics::counter!("leasehold_slots_missed_total", "task" => self.task.name.as_str().to_owned(), "reason" => reason.as_str())
            .increment(count);
        tracing::info!(task = %self.task.name, first, count, %reason, "slots missed");
        let mut record = RunRecord::missed(first, count, last_slot, reason, &self.common.holder);
        record.schedule = Some(RecordedSchedule::of(&self.task.schedule));
        self.common.history.record(&self.task.name, record);
    }

    /// The slots after `last` (which ran here) and before `slot` were not fired here: the run
    /// outlived them. Those no instance claimed meanwhile are missed for the overlap; those
    /// claimed elsewhere ran there (this instance may have been paused, and lost its lease, for
    /// longer than the run), so they are not. The store's claim says which: no answer, no record.
    async fn record_overlap(&self, last: u64, slot: u64) {
        let schedule = &self.task.schedule;
        if schedule.firings_between(last, slot.saturating_sub(1), 1).0 == 0 || !self.coordinated() {
            return;
        }
        let limit = self.gate.lease().config().renew_interval;
        let claimed = within(limit, self.gate.lease().store().last_slot(&self.task.name)).await;
        let Ok(claimed) = claimed else {
            return;
        };
        let from = claimed.map_or(last, |c| c.max(last));
        let (count, newest) = schedule.firings_between(from, slot.saturating_sub(1), 1);
        if let (Some(first), Some(&last_missed)) = (schedule.next_after(from), newest.first())
            && count > 0
        {
            self.record_miss(first, count, last_missed, MissReason::Overlap);
        }
    }

    /// Remembers why this instance skipped `slot`, for the next look for missed slots.
    fn skipped(&self, slot: u64, reason: MissReason) {
        let mut known = lock(&self.known_misses);
        if known.len() < 1024 {
            known.push((slot, reason));
        }
    }

    /// A gated tick (or catch-up), once the store's clock has reached `slot`: the gate's
    /// decision, then the run and the task lease's release.
    async fn tick(&self, reading: &Reading, slot: u64, trigger: Trigger) -> TickOutcome {
        let ticket = match self.gate.decide(reading, slot, trigger).await {
            Decision::Run(ticket) => ticket,
            Decision::Skip(skip) => {
                return match skip {
                    Skip::NotLeader => TickOutcome::SkippedNotLeader,
                    Skip::NotOwner => TickOutcome::SkippedNotOwner,
                    Skip::Paused(_) => self.answered(TickOutcome::SkippedPaused),
                    Skip::Expiring => self.answered(TickOutcome::SkippedLeaseLost),
                    Skip::StoreDown(e) => self.store_down(slot, &e).await,
                    Skip::Refused(e) => self.refused(slot, &e),
                    // Overlap (a run here), busy, already run.
                    _ => self.answered(TickOutcome::SkippedClaimed),
                };
            }
        };
        self.answered(TickOutcome::Ran);
        self.run(trigger, Some(slot), Held::of(&ticket)).await;
        if let Err(e) = ticket.into_guard().release().await {
            tracing::warn!(task = %self.task.name, error = %e, "task lease release failed");
        }
        TickOutcome::Ran
    }

    /// Registers the task in the store's catalog (a heartbeat) and, when a manual run was
    /// asked for through the catalog and this instance may run the task now, takes the request
    /// and runs it, holding the task lease, as a manual run of the scheduler's own.
    pub(super) async fn beat(self: &Arc<Self>, definition: &str, about: &str) {
        let lease = self.gate.lease();
        let registration = Registration {
            task: &self.task.name,
            definition,
            instance: &self.common.holder,
            about,
            ttl: lease.config().ttl,
            forget_after: CATALOG_RETENTION,
        };
        let limit = lease.config().renew_interval;
        let control = match within(limit, lease.store().register(&registration)).await {
            Ok(Some(control)) => control,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(task = %self.task.name, error = %e, "catalog heartbeat failed");
                return;
            }
        };
        let Ok(parsed) = Control::from_json(&control.value) else {
            return;
        };
        self.take_pending(&parsed, control.version).await;
    }

    /// Takes the manual trigger pending in `control` (at `version`) if this instance may run
    /// the task now, and runs it beside the timer loop, holding the task lease.
    async fn take_pending(self: &Arc<Self>, control: &Control, version: u64) {
        if control.trigger.is_none() {
            return;
        }
        let ticket = match self
            .gate
            .take_trigger(control, version, self.store_now())
            .await
        {
            Ok(Some(ticket)) => ticket,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(task = %self.task.name, error = %e, "manual trigger not taken");
                return;
            }
        };
        if let Some(request) = ticket.request() {
            tracing::info!(task = %self.task.name, id = %request.id, by = %request.by, "manual run asked for through the catalog");
        }
        let runner = self.clone();
        self.manual.spawn(async move {
            runner.run(Trigger::Manual, None, Held::of(&ticket)).await;
            if let Err(e) = ticket.into_guard().release().await {
                tracing::warn!(task = %runner.task.name, error = %e, "task lease release failed");
            }
        });
    }

    /// The task's definition as the catalog shows it.
    pub(super) fn definition(
        &self,
        source: TaskSource,
        leader_group: Option<&LeaseName>,
        spread_group: Option<&LeaseName>,
    ) -> TaskDefinition {
        TaskDefinition {
            source,
            schedule: self.task.schedule.to_string(),
            time_zone: self.task.schedule.time_zone().map(str::to_owned),
            on_store_down: self.policy.as_str().to_owned(),
            catch_up: Some(self.catch_up.as_str().to_owned()),
            gated: self.task.gated,
            leader_group: leader_group.map(|g| g.to_string()),
            spread_group: spread_group.map(|g| g.to_string()),
        }
    }

    /// The task's name.
    pub(super) fn name(&self) -> &LeaseName {
        &self.task.name
    }

    /// The store answered (whatever it said): refusals in a row start again from zero.
    fn answered(&self, outcome: TickOutcome) -> TickOutcome {
        self.refusals.store(0, Ordering::Relaxed);
        outcome
    }

    /// The store refused: a full disk, a permission lost. The slot is missed because the store
    /// could not serve it, as when it is down.
    fn refused(&self, slot: u64, error: &(dyn fmt::Display + Sync)) -> TickOutcome {
        self.skipped(slot, MissReason::StoreDown);
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

    async fn store_down(&self, slot: u64, error: &(dyn fmt::Display + Sync)) -> TickOutcome {
        self.common.store_unreachable(error);
        self.stats.store_down_ticks.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("leasehold_store_down_ticks_total", "task" => self.task.name.as_str().to_owned(), "policy" => self.policy.as_str())
            .increment(1);
        if !self.policy.runs_when_down() {
            self.skipped(slot, MissReason::StoreDown);
            return TickOutcome::SkippedStoreDown;
        }
        self.run(Trigger::Timer, Some(slot), Held::default()).await;
        TickOutcome::RanStoreDown
    }

    /// Runs the job in its own task (so a panic is contained). Its token is cancelled when the
    /// task lease or leadership starts expiring, or when shutdown's grace period ends; a job
    /// still running a stop margin later is aborted. Gated and manual runs are recorded in the
    /// run history (ungated and store-down runs, which every instance may make, are not).
    async fn run(&self, trigger: Trigger, slot: Option<u64>, held: Held) -> RunResult {
        let cancel = CancellationToken::new();
        let (lease_cancel, lease_probe) = held.lease.unzip();
        let mut probes: Vec<HeldProbe> = lease_probe.into_iter().collect();
        probes.extend(held.leader.clone().map(HeldProbe::Token));
        let ctx = TaskContext {
            task: self.task.name.clone(),
            trigger,
            slot,
            token: held.token,
            holder: self.common.holder.clone(),
            cancel: cancel.clone(),
            held: probes,
        };
        let recorded_trigger = match trigger {
            Trigger::Manual => Some(RecordTrigger::Manual),
            Trigger::CatchUp => Some(RecordTrigger::CatchUp),
            Trigger::Timer if held.token.is_some() => Some(RecordTrigger::Timer),
            _ => None,
        };
        let mut record = recorded_trigger.map(|trigger| RunRecord {
            slot,
            trigger: Some(trigger),
            holder: self.common.holder.to_string(),
            token: held.token,
            started_ms: Some(self.store_now()),
            ended_ms: None,
            outcome: RunOutcome::Running,
            schedule: Some(RecordedSchedule::of(&self.task.schedule)),
            paused: None,
            request: held.request.clone(),
        });
        if let Some(r) = &record {
            self.common.history.record(&self.task.name, r.clone());
        }
        let _active = Active::new(&self.stats.active);
        // Aborted if this future is dropped, so a job never outlives its run.
        let mut job = AbortOnDropHandle::new(tokio::spawn((self.task.job)(ctx)));
        let stop = async {
            tokio::select! {
                () = fired(lease_cancel.as_ref()) => "task lease expiring",
                () = fired(held.leader.as_ref()) => "leadership ending",
                () = async {
                    self.common.stop.cancelled().await;
                    tokio::time::sleep(self.common.grace).await;
                } => "shutdown grace period over",
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
        let result = match joined {
            Some(Ok(Ok(()))) => RunResult::Succeeded,
            Some(Ok(Err(e))) => RunResult::Failed(e.to_string()),
            Some(Err(e)) if e.is_panic() => RunResult::Panicked,
            _ => RunResult::Aborted,
        };
        self.stats.runs.fetch_add(1, Ordering::Relaxed);
        if result != RunResult::Succeeded {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(task = %self.task.name, ?slot, ?result, "run did not succeed");
        }
        if let Some(r) = &mut record {
            r.ended_ms = Some(self.store_now());
            r.outcome = match (&result, stopped) {
                (RunResult::Aborted, _) => RunOutcome::Aborted,
                (RunResult::Panicked, _) => RunOutcome::Panicked,
                (_, Some(why)) => RunOutcome::Cancelled {
                    why: why.to_owned(),
                },
                (RunResult::Succeeded, None) => RunOutcome::Ok,
                (RunResult::Failed(error), None) => RunOutcome::Failed {
                    error: error.clone(),
                },
            };
            self.common.history.record(&self.task.name, r.clone());
        }
        result
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
            leader: None,
            request: None,
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

    fn status(&self) -> TaskStatus {
        TaskStatus {
            name: self.task.name.clone(),
            schedule: self.task.schedule.to_string(),
            policy: self.policy,
            gated: self.task.gated,
            catch_up: self.catch_up,
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
            crate::history::read(self.gate.lease().store(), &self.task.name, limit).await
        })
    }
}
