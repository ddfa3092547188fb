//! What an operator sees of the fleet, computed once for every door: a task's state, its last
//! run, its next slot and the slots it missed lately, from the catalog ([`Fleet`]), the task
//! lease and the run history. `leasehold status` prints it as a table and as JSON, and the
//! sidecar answers it at `GET /v1/tasks`; the JSON is the same (see the sidecar's
//! openapi.json).
//!
//! ```no_run
//! # async fn demo(store: leasehold::BoxStore) -> Result<(), leasehold::fleet::FleetError> {
//! use leasehold::fleet::Fleet;
//! let fleet = Fleet::new(store);
//! let list = leasehold::overview::tasks(&fleet).await?;
//! for task in &list.tasks {
//!     println!("{} {} next {:?}", task.name, task.state.as_str(), task.next_slot_ms);
//! }
//! # Ok(()) }
//! ```

use std::time::Duration;

use serde::Serialize;

use crate::scheduling::definition::TaskDefinition;
use crate::scheduling::fleet::{Fleet, FleetError, TaskView};
use crate::scheduling::history::{
    DEFAULT_HISTORY_LIMIT, Outcome, RunOutcome, RunRecord, RunRequest,
};
use crate::scheduling::schedule::Schedule;
use crate::store::answers::LeaseState;
use crate::store::catalog::{Pause, TriggerRequest};
use crate::store::error::StoreError;
use crate::store::name::LeaseName;
use crate::store::traits::{Catalog, Slots};

/// How far back [`TaskSummary::missed_24h`] and [`TaskDetail::missed`] look.
pub const MISSED_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The most history entries [`task`] reads.
pub const MAX_HISTORY: usize = 500;

/// What a task is doing, as an operator would say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TaskState {
    /// Its task lease is held: a run is going (also while paused: a run going when the pause
    /// landed finishes).
    Running,
    /// Paused fleet-wide.
    Paused,
    /// No instance's heartbeat is live: nobody would run its slots or take a trigger.
    NoInstance,
    /// Waiting for its next slot, and its last runs failed
    /// ([`TaskSummary::consecutive_failures`] says how many in a row).
    Failing,
    /// Waiting for its next slot.
    Idle,
}

impl TaskState {
    /// `running`, `paused`, `no_instance`, `failing`, `idle`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::NoInstance => "no_instance",
            Self::Failing => "failing",
            Self::Idle => "idle",
        }
    }
}

/// A task's definition as registered (see [`TaskDefinition`]), every field present.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DefinitionView {
    /// `scheduler`, `run`, `sidecar` (or `other`).
    pub source: String,
    /// The schedule as written (`every 30s`, `cron "0 3 * * *"`).
    pub schedule: String,
    /// The schedule's time zone, for cron schedules outside UTC.
    pub time_zone: Option<String>,
    /// `fail-closed`, `fail-open` or `local`.
    pub on_store_down: String,
    /// `skip`, `latest` or `all`, where the source has a catch-up policy.
    pub catch_up: Option<String>,
    /// Whether timer ticks go through the gate.
    pub gated: bool,
    /// The leader group the ticks are gated on.
    pub leader_group: Option<String>,
    /// The spread group the task is placed in.
    pub spread_group: Option<String>,
    /// Each run's time limit, ms.
    pub timeout_ms: Option<u64>,
    /// How many times a failed or timed-out run is tried again.
    pub retries: Option<u32>,
    /// At most how long each slot's start is put off, ms.
    pub jitter_ms: Option<u64>,
    /// `buffer-one`, `buffer-all`, `replace` or `allow`; `None`: `skip`.
    pub overlap: Option<String>,
}

impl From<&TaskDefinition> for DefinitionView {
    fn from(d: &TaskDefinition) -> Self {
        Self {
            source: serde_json::to_value(d.source)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| "other".to_owned()),
            schedule: d.schedule.clone(),
            time_zone: d.time_zone.clone(),
            on_store_down: d.on_store_down.clone(),
            catch_up: d.catch_up.clone(),
            gated: d.gated,
            leader_group: d.leader_group.clone(),
            spread_group: d.spread_group.clone(),
            timeout_ms: d.timeout_ms,
            retries: d.retries,
            jitter_ms: d.jitter_ms,
            overlap: d.overlap.clone(),
        }
    }
}

/// One instance running a task.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct InstanceSummary {
    /// Its holder id.
    pub instance: String,
    /// Whether its heartbeat is live.
    pub live: bool,
    /// Time left on its heartbeat, ms.
    pub remaining_ms: u64,
    /// Its leasehold release.
    pub version: Option<String>,
    /// Its host name.
    pub host: Option<String>,
    /// Its process id, where known.
    pub pid: Option<u32>,
    /// For an application instance registered by a sidecar it ticks through: the sidecar.
    pub via: Option<String>,
}

/// A held lease.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct HeldLease {
    /// Who holds it.
    pub holder: String,
    /// Its fencing token (a string: tokens may pass 2^53).
    pub token: String,
    /// Time left, ms.
    pub remaining_ms: u64,
}

impl HeldLease {
    fn of(state: &LeaseState) -> Option<Self> {
        Some(Self {
            holder: state.holder.as_ref()?.to_string(),
            token: state.token.get().to_string(),
            remaining_ms: millis(state.remaining),
        })
    }
}

/// Slots that did not run, as one history entry covers them.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct MissedSlots {
    /// How many slots.
    pub count: u64,
    /// The last of them (the entry's `slot_ms` is the first).
    pub last_slot_ms: u64,
    /// Why: a [`MissReason`](crate::history::MissReason) label, or `paused`.
    pub reason: String,
}

/// One history entry: a run, or slots that did not run.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RunSummary {
    /// The slot, for timer and catch-up runs and misses.
    pub slot_ms: Option<u64>,
    /// `timer`, `catch-up`, `manual`, `backfill`; `None` for misses.
    pub trigger: Option<String>,
    /// The instance that ran it (or recorded the miss).
    pub holder: String,
    /// The fencing token it ran under.
    pub token: Option<String>,
    /// When it started.
    pub started_ms: Option<u64>,
    /// When it ended.
    pub ended_ms: Option<u64>,
    /// How long it ran.
    pub duration_ms: Option<u64>,
    /// [`RunRecord::word`]: `ok`, `failed`, `timed-out`, `cancelled`, `interrupted` for runs
    /// that ended, `running`, `missed`.
    pub outcome: String,
    /// A failed run's error (`panicked` for a job that panicked), or why a cancelled run was
    /// told to stop.
    pub error: Option<String>,
    /// For slots that fell while paused: who paused, why.
    pub paused: Option<Pause>,
    /// For a manual run asked for through the catalog: the request's id and who asked.
    pub request: Option<RunRequest>,
    /// For slots that did not run.
    pub missed: Option<MissedSlots>,
    /// What the run printed, as its job kept it ([`RunRecord::output`]): untrusted text.
    pub output: Option<String>,
    /// Which attempt of its slot the run was (the record's `attempt`), when numbered: a task
    /// with retries, or a slot run again. Left out of the JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

impl From<&RunRecord> for RunSummary {
    fn from(r: &RunRecord) -> Self {
        Self {
            slot_ms: r.slot,
            trigger: r.trigger.map(|t| t.to_string()),
            holder: r.holder.clone(),
            token: r.token.map(|t| t.get().to_string()),
            started_ms: r.started_ms,
            ended_ms: r.ended_ms,
            duration_ms: r.duration().map(millis),
            outcome: r.word().to_owned(),
            error: r.error().map(str::to_owned),
            paused: r.paused.clone(),
            request: r.request.clone(),
            missed: miss_of(r),
            output: r.output.clone(),
            attempt: r.attempt,
        }
    }
}

fn miss_of(r: &RunRecord) -> Option<MissedSlots> {
    match &r.outcome {
        RunOutcome::Missed {
            count,
            last_slot,
            reason,
        } => Some(MissedSlots {
            count: *count,
            last_slot_ms: *last_slot,
            reason: match r.paused {
                Some(_) => "paused".to_owned(),
                None => reason.as_str().to_owned(),
            },
        }),
        _ => None,
    }
}

/// Slots that did not run, from one history entry.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Miss {
    /// The first slot.
    pub slot_ms: u64,
    /// How many slots from it.
    pub count: u64,
    /// The last of them.
    pub last_slot_ms: u64,
    /// Why (`paused` for slots that fell while paused).
    pub reason: String,
}

/// One task: the catalog's view of it, and what its lease and history say.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct TaskSummary {
    /// Its name in the catalog.
    pub name: String,
    /// What it is doing.
    pub state: TaskState,
    /// Its definition, once an instance registered it.
    pub definition: Option<DefinitionView>,
    /// Set while paused.
    pub paused: Option<Pause>,
    /// A manual run asked for and not taken yet.
    pub trigger: Option<TriggerRequest>,
    /// The instances that registered it, live ones first.
    pub instances: Vec<InstanceSummary>,
    /// The task lease, while held (a run going).
    pub lease: Option<HeldLease>,
    /// The newest run (not a miss).
    pub last_run: Option<RunSummary>,
    /// The next slot after now, while some instance runs the task.
    pub next_slot_ms: Option<u64>,
    /// Slots that did not run in the last 24 hours (not those skipped while the task was
    /// paused: the history shows them as paused).
    pub missed_24h: u64,
    /// The newest runs that failed (or timed out) in a row, as far as the history read goes
    /// (cancelled and interrupted runs are passed over): 0 when the last one that counts
    /// succeeded.
    pub consecutive_failures: u64,
    /// When the newest `ok` run the history read goes back to ended.
    pub last_success_ms: Option<u64>,
}

impl TaskSummary {
    /// The name people know the task by ([`shown_name`](crate::fleet::shown_name)).
    pub fn shown_name(&self) -> &str {
        let from_run = self.definition.as_ref().is_some_and(|d| d.source == "run");
        crate::scheduling::fleet::shown_name(&self.name, from_run)
    }
}

/// Every task, at the store's clock.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct TaskList {
    /// The store's clock, ms.
    pub now_ms: u64,
    /// The tasks, sorted by name.
    pub tasks: Vec<TaskSummary>,
}

/// One task with its history.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct TaskDetail {
    /// The store's clock, ms.
    pub now_ms: u64,
    /// The task.
    #[serde(flatten)]
    pub task: TaskSummary,
    /// Its history, newest first.
    pub history: Vec<RunSummary>,
    /// Slots missed in the last 24 hours, newest first.
    pub missed: Vec<Miss>,
}

/// One lease record.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct LeaseSummary {
    /// The lease's name.
    pub name: String,
    /// Its holder, while held.
    pub holder: Option<String>,
    /// The last token handed out.
    pub token: Option<String>,
    /// Time left, while held.
    pub remaining_ms: Option<u64>,
}

/// Lease records, at the store's clock.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct LeaseList {
    /// The store's clock, ms.
    pub now_ms: u64,
    /// The leases, sorted by name.
    pub leases: Vec<LeaseSummary>,
}

/// Every task in the catalog.
pub async fn tasks<S: Catalog + Slots>(fleet: &Fleet<S>) -> Result<TaskList, FleetError> {
    let views = fleet.tasks().await?;
    let now_ms = fleet.store().now_millis().await?;
    let mut tasks = Vec::with_capacity(views.len());
    for view in views {
        let records = history(fleet.store(), &view.name, DEFAULT_HISTORY_LIMIT).await?;
        tasks.push(summarize(fleet.store(), view, &records, now_ms).await?);
    }
    Ok(TaskList { now_ms, tasks })
}

/// One task (found as [`Fleet::task`] finds it) with its newest `limit` history entries (at
/// most [`MAX_HISTORY`]) and the slots it missed in the last 24 hours.
pub async fn task<S: Catalog + Slots>(
    fleet: &Fleet<S>,
    name: &LeaseName,
    limit: usize,
) -> Result<TaskDetail, FleetError> {
    let view = fleet.task(name).await?;
    let now_ms = fleet.store().now_millis().await?;
    let limit = limit.min(MAX_HISTORY);
    let records = history(fleet.store(), &view.name, limit.max(DEFAULT_HISTORY_LIMIT)).await?;
    let since = now_ms.saturating_sub(millis(MISSED_WINDOW));
    let missed = records
        .iter()
        .filter_map(|r| Some((r.slot?, miss_of(r)?)))
        .filter(|(_, m)| m.last_slot_ms >= since)
        .map(|(slot_ms, m)| Miss {
            slot_ms,
            count: m.count,
            last_slot_ms: m.last_slot_ms,
            reason: m.reason,
        })
        .collect();
    let history = records.iter().take(limit).map(RunSummary::from).collect();
    Ok(TaskDetail {
        now_ms,
        task: summarize(fleet.store(), view, &records, now_ms).await?,
        history,
        missed,
    })
}

/// Up to `limit` lease records (tasks' run leases, leader groups, applications' leases).
pub async fn leases<S: Catalog + Slots>(
    fleet: &Fleet<S>,
    limit: usize,
) -> Result<LeaseList, FleetError> {
    let records = fleet.leases(limit).await?;
    let now_ms = fleet.store().now_millis().await?;
    let leases = records
        .iter()
        .map(|r| {
            let held = HeldLease::of(&r.state);
            LeaseSummary {
                name: r.name.to_string(),
                token: Some(r.state.token.get().to_string()),
                remaining_ms: held.as_ref().map(|h| h.remaining_ms),
                holder: held.map(|h| h.holder),
            }
        })
        .collect();
    Ok(LeaseList { now_ms, leases })
}

/// The task's history, newest first; empty where the store keeps none.
async fn history<S: Slots>(
    store: &S,
    task: &LeaseName,
    limit: usize,
) -> Result<Vec<RunRecord>, StoreError> {
    match crate::scheduling::history::read(store, task, limit).await {
        Err(StoreError::Unsupported(_)) => Ok(Vec::new()),
        other => other,
    }
}

async fn summarize<S: Catalog + Slots>(
    store: &S,
    view: TaskView,
    records: &[RunRecord],
    now_ms: u64,
) -> Result<TaskSummary, FleetError> {
    let lease = store
        .inspect(&view.name)
        .await?
        .as_ref()
        .and_then(HeldLease::of);
    let live = view.has_live_instance();
    let consecutive_failures = consecutive_failures(records);
    let state = match (&lease, &view.paused, live) {
        (Some(_), ..) => TaskState::Running,
        (None, Some(_), _) => TaskState::Paused,
        (None, None, false) => TaskState::NoInstance,
        (None, None, true) if consecutive_failures > 0 => TaskState::Failing,
        (None, None, true) => TaskState::Idle,
    };
    let schedule = view
        .definition
        .as_ref()
        .and_then(|d| schedule_of_text(&d.schedule))
        .or_else(|| recorded_schedule(records));
    let since = now_ms.saturating_sub(millis(MISSED_WINDOW));
    let missed_24h = records
        .iter()
        .filter_map(|r| match &r.outcome {
            // A slot paused on purpose is recorded as missed but is not one that went wrong.
            RunOutcome::Missed {
                count, last_slot, ..
            } if *last_slot >= since && r.paused.is_none() => {
                // Only the part of a long gap that falls within the window.
                let first = r.slot.unwrap_or(*last_slot);
                Some(match (first >= since, &schedule) {
                    (true, _) | (false, None) => *count,
                    (false, Some(s)) => s.firings_between(since.saturating_sub(1), *last_slot, 0).0,
                })
            }
            _ => None,
        })
        .sum();
    Ok(TaskSummary {
        name: view.name.to_string(),
        state,
        definition: view.definition.as_ref().map(DefinitionView::from),
        instances: view
            .instances
            .iter()
            .map(|i| InstanceSummary {
                instance: i.instance.to_string(),
                live: i.live,
                remaining_ms: millis(i.remaining),
                version: i.info.as_ref().map(|a| a.version.clone()),
                host: i.info.as_ref().map(|a| a.host.clone()),
                pid: i.info.as_ref().map(|a| a.pid).filter(|&pid| pid != 0),
                via: i.info.as_ref().and_then(|a| a.via.clone()),
            })
            .collect(),
        lease,
        last_run: records
            .iter()
            .filter(|r| !matches!(r.outcome, RunOutcome::Missed { .. }))
            .max_by_key(|r| r.started_ms)
            .map(RunSummary::from),
        next_slot_ms: schedule.filter(|_| live).and_then(|s| s.next_after(now_ms)),
        missed_24h,
        consecutive_failures,
        last_success_ms: last_success_ms(records),
        paused: view.paused,
        trigger: view.trigger,
    })
}

/// How many of the newest ended runs in `records` (newest first) failed in a row (see
/// [`Outcome::is_failure`]), passing over cancelled and interrupted ones.
pub fn consecutive_failures(records: &[RunRecord]) -> u64 {
    let mut ended: Vec<(u64, Outcome)> = records
        .iter()
        .filter_map(|r| Some((r.ended_ms.or(r.started_ms)?, r.result()?)))
        .filter(|(_, o)| o.is_failure() || *o == Outcome::Ok)
        .collect();
    // Newest first by when they ended: a manual run is filed by its start, between slots.
    ended.sort_by_key(|&(at, _)| std::cmp::Reverse(at));
    ended.iter().take_while(|(_, o)| o.is_failure()).count() as u64
}

/// When the newest `ok` run in `records` ended.
pub fn last_success_ms(records: &[RunRecord]) -> Option<u64> {
    records
        .iter()
        .filter(|r| r.result() == Some(Outcome::Ok))
        .filter_map(|r| r.ended_ms)
        .max()
}

/// The schedule recorded with the newest history entry that has one.
pub fn recorded_schedule(records: &[RunRecord]) -> Option<Schedule> {
    records.iter().find_map(|r| r.schedule.as_ref())?.schedule()
}

/// A schedule read back from its text as the catalog keeps it ([`Schedule`]'s `Display`:
/// `every 1.5s`, `cron "CRON_TZ=Europe/Berlin 30 2 * * *"`).
pub fn schedule_of_text(text: &str) -> Option<Schedule> {
    if let Some(every) = text.strip_prefix("every ") {
        let split = every.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, unit) = every.split_at(split);
        let number: f64 = number.parse().ok()?;
        let per_second = match unit {
            "s" => 1.0,
            "ms" => 1e3,
            "µs" => 1e6,
            "ns" => 1e9,
            _ => return None,
        };
        return Schedule::every(Duration::try_from_secs_f64(number / per_second).ok()?).ok();
    }
    let quoted = text.strip_prefix("cron ")?;
    crate::scheduling::history::RecordedSchedule::Cron(serde_json::from_str(quoted).ok()?)
        .schedule()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a task's summary says from its catalog entry, lease and history: the last run is
    /// the newest run (not a miss), misses count only their slots within the last 24 hours,
    /// paused ones included, and the next slot is named only while an instance is live.
    #[tokio::test(start_paused = true)]
    async fn a_summary_reads_state_last_run_next_slot_and_recent_misses() {
        use crate::scheduling::history::{MissReason, RecordTrigger};
        use crate::store::catalog::{CATALOG_RETENTION, Registration};
        use crate::store::memory::MemoryStore;
        use crate::store::name::HolderId;
        use crate::store::traits::Store;
        const HOUR: u64 = 3_600_000;
        let store = MemoryStore::new();
        let name = LeaseName::new("hourly").unwrap();
        let who = HolderId::new("a").unwrap();
        let definition = r#"{"source":"scheduler","schedule":"every 3600s","on_store_down":"fail-closed","gated":true}"#;
        let registration = Registration {
            task: &name,
            definition,
            instance: &who,
            about: "{}",
            ttl: Duration::from_secs(10),
            forget_after: CATALOG_RETENTION,
        };
        store.register(&registration).await.unwrap();
        let now = store.now_millis().await.unwrap();
        let hour = now / HOUR * HOUR;
        let record = |r: RunRecord| {
            let store = store.clone();
            let name = name.clone();
            async move {
                store
                    .record_history(&name, r.key(), &r.to_json(), 100)
                    .await
                    .unwrap()
            }
        };
        // Six slots missed from 27 h to 22 h before the hour: two fall within the last 24 hours.
        record(RunRecord::missed(
            hour - 27 * HOUR,
            6,
            hour - 22 * HOUR,
            MissReason::StoreDown,
            "a",
        ))
        .await;
        let ran = RunRecord::started(
            Some(hour - 2 * HOUR),
            RecordTrigger::Timer,
            "a",
            None,
            hour - 2 * HOUR,
            None,
        )
        .ended(hour - 2 * HOUR + 5, RunOutcome::Ok);
        record(ran).await;
        let mut paused =
            RunRecord::missed(hour - HOUR, 1, hour - HOUR, MissReason::NotClaimed, "a");
        paused.paused = Some(Pause {
            by: "ops".into(),
            reason: None,
            at_ms: hour - HOUR - 1,
        });
        record(paused).await;
        let fleet = Fleet::new(store.clone());
        let list = tasks(&fleet).await.unwrap();
        let summary = &list.tasks[0];
        assert_eq!(summary.state, TaskState::Idle);
        // The paused slot is not counted.
        assert_eq!(summary.missed_24h, 2, "{summary:?}");
        assert_eq!(
            summary.last_run.as_ref().unwrap().slot_ms,
            Some(hour - 2 * HOUR)
        );
        assert_eq!(summary.next_slot_ms, Some(hour + HOUR));
        let detail = task(&fleet, &name, 2).await.unwrap();
        assert_eq!(detail.history.len(), 2);
        let reasons: Vec<&str> = detail.missed.iter().map(|m| m.reason.as_str()).collect();
        assert_eq!(reasons, ["paused", "store-down"]);
        // The heartbeat runs out: no instance, no next slot.
        tokio::time::sleep(Duration::from_secs(11)).await;
        let summary = &tasks(&fleet).await.unwrap().tasks[0];
        assert_eq!(summary.state, TaskState::NoInstance);
        assert_eq!(summary.next_slot_ms, None);
    }

    /// The catalog's schedule text reads back as the schedule it was written from.
    #[cfg(feature = "cron")]
    #[test]
    fn schedule_text_reads_back() {
        let cases = [
            Schedule::every(Duration::from_secs(30)).unwrap(),
            Schedule::every(Duration::from_millis(1500)).unwrap(),
            Schedule::every(Duration::from_millis(250)).unwrap(),
            Schedule::cron_in("30 2 * * *", "Europe/Berlin").unwrap(),
            Schedule::cron("*/5 * * * * *").unwrap(),
        ];
        for s in cases {
            let back = schedule_of_text(&s.to_string()).unwrap_or_else(|| panic!("{s}"));
            assert_eq!(
                back.next_after(1_806_184_800_000),
                s.next_after(1_806_184_800_000)
            );
            assert_eq!(back.to_string(), s.to_string());
        }
        assert!(schedule_of_text("every week").is_none());
        assert!(schedule_of_text("hourly").is_none());
    }
}
