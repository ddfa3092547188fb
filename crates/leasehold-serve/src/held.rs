//! The leases and runs the sidecar holds for applications, each kept only while its
//! application keeps calling.
//!
//! Every grant is an [`Entry`] with a supervisor task that ends it at the first of: the
//! application's release, the guard's expiring signal (renewal overdue, or the store said it is
//! no longer ours), the application's silence for `keepalive`, the sidecar's shutdown. An ended
//! entry leaves a tombstone (its name, token and end reason: a few dozen bytes) for a while, so
//! that a late keepalive learns *why* it was lost; the tombstones are bounded in number, so a
//! high rate of grants does not grow the sidecar's memory.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use leasehold::history::{
    HistoryWriter, Outcome, RecordTrigger, RecordedSchedule, RetryNote, RunOutcome, RunRecord,
    RunRequest,
};
use leasehold::lifecycle::{TaskPlan, TaskTicks};
use leasehold::policy::NextAttempt;
use leasehold::{CancellationToken, FencingToken, LeaseGuard, LeaseName, LossReason, Release};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::error::EndReason;
use crate::owed::{OwedRun, OwedRuns};

/// How long an ended entry is remembered, so a keepalive after the end gets its reason.
const TOMBSTONE: Duration = Duration::from_secs(120);
/// The most tombstones kept: beyond it the oldest go first (a call naming one then hears
/// `unknown`). A few hundred bytes each with their names: a couple of MB at most, where
/// a sidecar granting 10,000 leases a second would otherwise keep over a million.
const MAX_TOMBSTONES: usize = 10_000;

/// The longest a run's end record is waited for before its lease is released anyway.
const RECORD_BEFORE_RELEASE: Duration = Duration::from_secs(1);

/// A run of a task's slot, or a manual run asked for through the catalog, granted by a tick.
#[derive(Clone)]
pub(crate) struct RunInfo {
    /// The task (the entry's lease is another for a run beside another, overlap `allow`).
    pub(crate) task: LeaseName,
    /// The slot (for a manual run: when it was asked for, which `done` names).
    pub(crate) slot: u64,
    pub(crate) trigger: RecordTrigger,
    /// For a manual run: the request's id and who asked.
    pub(crate) request: Option<RunRequest>,
    pub(crate) started_ms: u64,
    pub(crate) started_at: Instant,
    pub(crate) schedule: RecordedSchedule,
    /// Its attempt (1, or more for a retry or the re-run of a cut-off run).
    pub(crate) attempt: u32,
    /// The task's ticks and plan as the tick that granted it gave them: what follows its end.
    pub(crate) ticks: Arc<TaskTicks>,
    pub(crate) plan: Arc<TaskPlan>,
}

/// One lease (or run) held for an application.
pub(crate) struct Entry {
    pub(crate) name: LeaseName,
    pub(crate) token: FencingToken,
    pub(crate) holder: String,
    pub(crate) keepalive: Duration,
    stop_margin: Duration,
    /// A run's timeout: ended `timed-out` at it.
    deadline: Option<Instant>,
    guard: Mutex<Option<LeaseGuard>>,
    /// The arrival of the application's last call.
    contact: Mutex<Instant>,
    ended: OnceLock<EndReason>,
    ended_signal: CancellationToken,
    pub(crate) run: Option<RunInfo>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Values behind these locks are replaced whole: a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Entry {
    /// Until when the application may act, or why it may not: the earlier of the lease's
    /// deadline less its stop margin and the application's keepalive deadline.
    pub(crate) fn valid_until(&self) -> Result<Instant, EndReason> {
        if let Some(reason) = self.ended.get() {
            return Err(*reason);
        }
        let lease_until = {
            let guard = lock(&self.guard);
            let Some(guard) = guard.as_ref() else {
                return Err(EndReason::Released);
            };
            if !guard.is_held() {
                return Err(loss(guard.loss_reason()));
            }
            guard.deadline().checked_sub(self.stop_margin)
        };
        let app_until = *lock(&self.contact) + self.keepalive;
        let now = Instant::now();
        if let Some(deadline) = self.deadline
            && deadline <= now
        {
            return Err(EndReason::TimedOut);
        }
        let until = lease_until.map_or(app_until, |l| l.min(app_until));
        let until = self.deadline.map_or(until, |d| d.min(until));
        if until <= now {
            return Err(EndReason::Expired);
        }
        Ok(until)
    }

    /// Milliseconds the application may act for, measured from `arrival`.
    pub(crate) fn valid_for_ms(&self, arrival: Instant) -> Result<u64, EndReason> {
        let until = self.valid_until()?;
        Ok(ms(until.saturating_duration_since(arrival)))
    }

    /// The application called (at `arrival`): it is alive. Refused once the entry ended.
    pub(crate) fn touch(&self, arrival: Instant) -> Result<(), EndReason> {
        self.valid_until()?;
        let mut contact = lock(&self.contact);
        *contact = (*contact).max(arrival);
        Ok(())
    }

    /// Ends the entry for `reason` unless it ended (or its lease was lost) before, answering
    /// why then: of two calls that race, one wins. [`end`](Self::end) releases the lease after.
    pub(crate) fn close(&self, reason: EndReason) -> Result<(), EndReason> {
        self.valid_until()?;
        match self.ended.set(reason) {
            Ok(()) => {
                self.ended_signal.cancel();
                Ok(())
            }
            Err(_) => Err(self.ended.get().copied().unwrap_or(reason)),
        }
    }

    /// Ends the entry for `reason` (the first reason wins) without releasing its lease yet:
    /// calls about it hear the reason from now on.
    fn mark_ended(&self, reason: EndReason) {
        if self.ended.set(reason).is_ok() {
            self.ended_signal.cancel();
        }
    }

    /// Completes when the entry ends.
    pub(crate) async fn end_signal(&self) {
        self.ended_signal.cancelled().await;
    }

    /// Ends the entry for `reason` (the first reason wins) and releases its lease. Returns
    /// whether the store released it (false when it was no longer ours or ended before), or
    /// why the store could not be told (the lease then expires there after its ttl).
    pub(crate) async fn end(&self, reason: EndReason) -> Result<bool, String> {
        self.mark_ended(reason);
        let guard = lock(&self.guard).take();
        let Some(guard) = guard else {
            return Ok(false);
        };
        match guard.release().await {
            Ok(Release::Released) => Ok(true),
            Ok(_) => Ok(false),
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "release failed; the lease expires in the store after its ttl");
                Err(e.to_string())
            }
        }
    }

    /// The history record of this entry's run ending with `outcome`.
    pub(crate) fn run_record(&self, outcome: RunOutcome) -> Option<RunRecord> {
        let run = self.run.as_ref()?;
        // Manual runs are filed by their start, as the scheduler files them.
        let slot = (run.trigger != RecordTrigger::Manual).then_some(run.slot);
        let mut record = RunRecord::started(
            slot,
            run.trigger,
            self.holder.clone(),
            Some(self.token),
            run.started_ms,
            Some(run.schedule.clone()),
        );
        record.request = run.request.clone();
        // Numbered only for a task that retries, or past the first attempt, as the runner does.
        record.attempt =
            (run.plan.run_policy.retries > 0 || run.attempt > 1).then_some(run.attempt);
        Some(match outcome {
            RunOutcome::Running => record,
            outcome => record.ended(run.started_ms + ms(run.started_at.elapsed()), outcome),
        })
    }
}

/// Maps a guard's loss to the reason an application is told.
fn loss(reason: Option<LossReason>) -> EndReason {
    match reason {
        Some(LossReason::TakenOver | LossReason::Superseded) => EndReason::TakenOver,
        _ => EndReason::Expired,
    }
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

type Key = (LeaseName, u64);

/// What the registry knows of a lease name and token.
pub(crate) enum Found {
    Live(Arc<Entry>),
    /// Ended here, for this reason (remembered for [`TOMBSTONE`]).
    Ended(EndReason),
    /// Never granted here, or ended long ago.
    Unknown,
}

/// The end reasons of ended entries, each kept [`TOMBSTONE`] and at most [`MAX_TOMBSTONES`].
#[derive(Default)]
struct Tombstones {
    reasons: HashMap<Key, EndReason>,
    /// Oldest first, with when each is forgotten.
    order: VecDeque<(Instant, Key)>,
}

impl Tombstones {
    /// Forgets the tombstones that are due, and the oldest beyond `keep`.
    fn sweep(&mut self, now: Instant, keep: usize) {
        while let Some((until, _)) = self.order.front()
            && (*until <= now || self.order.len() > keep)
        {
            if let Some((_, old)) = self.order.pop_front() {
                self.reasons.remove(&old);
            }
        }
    }

    /// Forgets the tombstones that are due, giving back the room of many gone at once.
    fn forget_due(&mut self, now: Instant) {
        self.sweep(now, MAX_TOMBSTONES);
        if self.reasons.capacity() > 2 * self.reasons.len() + 64 {
            self.reasons.shrink_to_fit();
            self.order.shrink_to_fit();
        }
    }

    fn bury(&mut self, key: Key, reason: EndReason, now: Instant) {
        self.sweep(now, MAX_TOMBSTONES - 1);
        self.reasons.insert(key.clone(), reason);
        self.order.push_back((now + TOMBSTONE, key));
    }

    fn get(&mut self, key: &Key, now: Instant) -> Option<EndReason> {
        self.sweep(now, MAX_TOMBSTONES);
        self.reasons.get(key).copied()
    }
}

/// The entries of one sidecar, by lease name and token.
pub(crate) struct Registry {
    history: HistoryWriter,
    /// Retries and re-runs of cut-off runs owed to ticked tasks.
    pub(crate) owed: OwedRuns,
    entries: Mutex<HashMap<Key, Arc<Entry>>>,
    ended: Mutex<Tombstones>,
    live: AtomicU64,
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// What a new entry is made of.
pub(crate) struct Grant {
    pub(crate) guard: LeaseGuard,
    pub(crate) keepalive: Duration,
    pub(crate) stop_margin: Duration,
    /// When the store granted it: the application's keepalive interval starts here, since it
    /// was waiting on the answer until then (a grant after a long wait is not already silent).
    pub(crate) granted: Instant,
    pub(crate) run: Option<RunInfo>,
    /// A run's timeout, from `granted`.
    pub(crate) timeout: Option<Duration>,
}

impl Registry {
    pub(crate) fn new(history: HistoryWriter, stop: CancellationToken) -> Self {
        Self {
            history,
            owed: OwedRuns::default(),
            entries: Mutex::default(),
            ended: Mutex::default(),
            live: AtomicU64::new(0),
            stop,
            tasks: TaskTracker::new(),
        }
    }

    /// Leases and runs held now.
    pub(crate) fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    pub(crate) fn get(&self, name: &LeaseName, token: FencingToken) -> Found {
        let key = (name.clone(), token.get());
        if let Some(entry) = lock(&self.entries).get(&key) {
            return Found::Live(entry.clone());
        }
        match lock(&self.ended).get(&key, Instant::now()) {
            Some(reason) => Found::Ended(reason),
            None => Found::Unknown,
        }
    }

    /// Holds `grant` for the application and supervises it.
    pub(crate) fn insert(self: &Arc<Self>, grant: Grant) -> Arc<Entry> {
        let Grant {
            guard,
            keepalive,
            stop_margin,
            granted,
            run,
            timeout,
        } = grant;
        let expiring = guard.cancellation_token();
        let entry = Arc::new(Entry {
            name: guard.name().clone(),
            token: guard.token(),
            holder: guard.holder().to_string(),
            keepalive,
            stop_margin,
            deadline: timeout.map(|t| granted + t),
            guard: Mutex::new(Some(guard)),
            contact: Mutex::new(granted),
            ended: OnceLock::new(),
            ended_signal: CancellationToken::new(),
            run,
        });
        lock(&self.entries).insert((entry.name.clone(), entry.token.get()), entry.clone());
        self.live.fetch_add(1, Ordering::Relaxed);
        let kind = if entry.run.is_some() { "run" } else { "lease" };
        metrics::counter!("leasehold_sidecar_grants_total", "kind" => kind).increment(1);
        if let (Some(run), Some(record)) = (&entry.run, entry.run_record(RunOutcome::Running)) {
            self.record(&run.task, record);
        }
        let registry = self.clone();
        let supervised = entry.clone();
        self.tasks
            .spawn(async move { registry.supervise(supervised, expiring).await });
        entry
    }

    async fn supervise(self: Arc<Self>, entry: Arc<Entry>, expiring: CancellationToken) {
        let reason = loop {
            let app_deadline = *lock(&entry.contact) + entry.keepalive;
            let timed_out = async {
                match entry.deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = entry.ended_signal.cancelled() => break None,
                () = self.stop.cancelled() => break Some(EndReason::Released),
                () = expiring.cancelled() => {
                    let reason = lock(&entry.guard).as_ref().map(LeaseGuard::loss_reason);
                    break Some(loss(reason.flatten()));
                }
                () = timed_out => break Some(EndReason::TimedOut),
                () = tokio::time::sleep_until(app_deadline) => {
                    if *lock(&entry.contact) + entry.keepalive <= Instant::now() {
                        break Some(EndReason::AppSilent);
                    }
                }
            }
        };
        if let Some(reason) = reason {
            tracing::info!(lease = %entry.name, token = %entry.token, reason = reason.as_str(), "lease ended for the application");
            entry.mark_ended(reason);
            if reason == EndReason::TimedOut
                && let Some(run) = &entry.run
            {
                // As the runner words it; kept `cancelled` in `outcome`, which older releases read.
                let timeout = run.plan.run_policy.timeout.unwrap_or_default();
                let why = format!("timeout reached ({timeout:?})");
                self.end_run(
                    &entry,
                    RunOutcome::Cancelled { why },
                    Some(Outcome::TimedOut),
                    None,
                )
                .await;
            } else if reason != EndReason::Released {
                let why = reason.as_str().to_owned();
                self.end_run(&entry, RunOutcome::Cancelled { why }, None, None)
                    .await;
            }
            let _ = entry.end(reason).await;
        }
        self.live.fetch_sub(1, Ordering::Relaxed);
        // Ended by the application's call (release, done) or here (`reason`): the first wins.
        let ended = entry.ended.get().copied().or(reason);
        if let Some(ended) = ended {
            metrics::counter!("leasehold_sidecar_ends_total", "reason" => ended.as_str())
                .increment(1);
        }
        if self.stop.is_cancelled() {
            return;
        }
        let key = (entry.name.clone(), entry.token.get());
        // A call that finds the entry between these two lines hears the same reason from it.
        let ended = ended.unwrap_or(EndReason::Released);
        lock(&self.ended).bury(key.clone(), ended, Instant::now());
        lock(&self.entries).remove(&key);
    }

    /// Forgets the ends remembered past their time, and gives back the room of many entries
    /// gone at once.
    pub(crate) fn forget_ended(&self) {
        lock(&self.ended).forget_due(Instant::now());
        let mut entries = lock(&self.entries);
        if entries.capacity() > 2 * entries.len() + 64 {
            entries.shrink_to_fit();
        }
    }

    /// Entries held and ends remembered.
    pub(crate) fn kept(&self) -> (usize, usize) {
        (lock(&self.entries).len(), lock(&self.ended).reasons.len())
    }

    /// Writes a run record in the background; a lost record never fails a request.
    pub(crate) fn record(&self, task: &LeaseName, record: RunRecord) {
        self.history.record(task, record);
    }

    /// Records the end of `entry`'s run as `outcome` (its result `result` when the outcome
    /// alone does not say it: a timeout), with `output`, and counts it in the task's run
    /// series. What follows is the core's to decide: a failed or timed-out attempt with retries
    /// left is owed to the task as its next attempt (noted in the record); a run cut off (its
    /// application silent, its lease lost) makes the task's next look read the history.
    pub(crate) async fn end_run(
        &self,
        entry: &Entry,
        outcome: RunOutcome,
        result: Option<Outcome>,
        output: Option<String>,
    ) {
        let (Some(run), Some(mut record)) = (&entry.run, entry.run_record(outcome)) else {
            return;
        };
        record.output = output;
        if result.is_some() {
            record.result = result;
        }
        let slot = record.slot;
        let next = match record.result() {
            Some(outcome) => run
                .ticks
                .next_attempt(&run.plan, slot, run.attempt, outcome),
            None => NextAttempt::Done,
        };
        let now = run.ticks.store_now_or_wall();
        record.retry = match (next, slot) {
            (NextAttempt::After { attempt, wait }, Some(slot)) => {
                let from_ms = now.saturating_add(ms(wait));
                let until_ms = run.plan.schedule.next_after(slot).unwrap_or(u64::MAX);
                let trigger = run.trigger;
                let owed = OwedRun {
                    slot,
                    attempt,
                    trigger,
                    from_ms,
                    until_ms,
                };
                self.owed.owe(&run.task, owed, now);
                Some(RetryNote::AtMs(from_ms))
            }
            (NextAttempt::Dropped { next, .. }, _) => Some(RetryNote::DroppedBeforeSlot(next)),
            _ => None,
        };
        if matches!(
            record.result(),
            Some(Outcome::Cancelled | Outcome::Interrupted)
        ) {
            run.ticks.run_cut_off().await;
        }
        leasehold::lifecycle::record_run_end(Some(&self.history), &run.task, record);
        // In the store before the task lease is released: the next holder's look for cut-off
        // runs, or check of a retry, sees how this run ended.
        self.history.flush(RECORD_BEFORE_RELEASE).await;
    }

    /// Ends every entry (releasing its lease) and waits for the releases, at most `limit`.
    pub(crate) async fn shut_down(&self, limit: Duration) {
        self.stop.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(limit, self.tasks.wait()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> Key {
        (LeaseName::new(format!("lease-{}", i % 7)).unwrap(), i)
    }

    #[tokio::test(start_paused = true)]
    async fn tombstones_are_bounded_and_forgotten_after_their_time() {
        let mut t = Tombstones::default();
        let start = Instant::now();
        for i in 0..(MAX_TOMBSTONES as u64 + 500) {
            let reason = if i % 2 == 0 {
                EndReason::Released
            } else {
                EndReason::AppSilent
            };
            t.bury(key(i), reason, start);
        }
        // The oldest went first; the newest are all there, with their own reasons.
        assert_eq!(
            (t.reasons.len(), t.order.len()),
            (MAX_TOMBSTONES, MAX_TOMBSTONES)
        );
        assert_eq!(t.get(&key(0), start), None);
        assert_eq!(t.get(&key(499), start), None);
        assert_eq!(t.get(&key(500), start), Some(EndReason::Released));
        let last = MAX_TOMBSTONES as u64 + 499;
        assert_eq!(t.get(&key(last), start), Some(EndReason::AppSilent));
        // Until their time is up, and not after.
        let almost = start + TOMBSTONE - Duration::from_millis(1);
        assert_eq!(t.get(&key(last), almost), Some(EndReason::AppSilent));
        assert_eq!(t.get(&key(last), start + TOMBSTONE), None);
        assert!(t.reasons.is_empty() && t.order.is_empty());
    }
}
