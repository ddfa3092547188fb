//! The operator's view and hand on every instance sharing a store: what runs where, and
//! fleet-wide pause, resume, trigger and forget. The CLI (`leasehold status`, `pause`, `resume`,
//! `trigger`), the sidecar's HTTP API and applications all act through [`Fleet`]; the instances
//! honour what it writes at their next tick ([`Gate`](crate::gate::Gate)) or catalog heartbeat.
//!
//! ```no_run
//! # async fn demo(store: leasehold::BoxStore) -> Result<(), leasehold::fleet::FleetError> {
//! use leasehold::fleet::Fleet;
//! let fleet = Fleet::new(store);
//! let nightly = "nightly".parse().expect("a task name");
//! fleet.pause(&nightly, "ops@host", Some("vendor API down")).await?;
//! fleet.resume(&nightly).await?;
//! let request = fleet.trigger(&nightly, "ops@host").await?;
//! let run = fleet.wait_for_run(&nightly, &request, std::time::Duration::from_secs(600)).await?;
//! println!("{:?}", run.outcome);
//! // Once no instance runs it any more: out of the catalog, its history kept.
//! fleet.forget(&nightly, false).await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use crate::scheduling::backfill::{self, HISTORY_LOOKED_AT, MAX_BACKFILL_SLOTS};
use crate::scheduling::definition::{InstanceInfo, TaskDefinition, TaskSource};
use crate::scheduling::history::{RunOutcome, RunRecord};
use crate::scheduling::schedule::Schedule;
use crate::store::capabilities::Capabilities;
use crate::store::catalog::{
    CATALOG_RETENTION, Control, Forgetting, LeaseRecord, Pause, SlotRange, TaskRecord,
    TriggerRequest,
};
use crate::store::error::StoreError;
use crate::store::name::{HolderId, LeaseName};
use crate::store::text::{self, TextError};
use crate::store::traits::{Catalog, Slots};

/// How long a trigger waits for an instance to take it before it lapses.
pub const TRIGGER_TTL: Duration = Duration::from_secs(300);

/// How many history entries a wait for a manual run looks among.
const RUN_LOOKED_AT: usize = 50;

/// Compare-and-set attempts before a control write gives up (only under heavy contention).
const CAS_ATTEMPTS: usize = 20;

/// Why a fleet operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// No instance has registered the task (and nobody paused it): a typo, or it never ran on
    /// this store.
    #[error("no task {0} in this store's catalog (see `leasehold status` for the tasks it has)")]
    UnknownTask(LeaseName),
    /// The task is known, but no instance runs it now: a trigger would never be taken.
    #[error("no instance runs task {0} now: nobody would take the trigger")]
    NoInstance(LeaseName),
    /// The store keeps no catalog.
    #[error("this store keeps no catalog ({0}): there is nothing to list, pause or trigger")]
    NoCatalog(String),
    /// A run asked for was not seen ending in time.
    #[error("the run {id} of task {task} did not end within {waited:?} ({state})")]
    NotEnded {
        /// The task.
        task: LeaseName,
        /// The trigger's id.
        id: String,
        /// How long it was waited for.
        waited: Duration,
        /// What was seen of it last.
        state: String,
    },
    /// `forget` of a task an instance still runs: nothing was removed.
    #[error(
        "task {task} is run by {instances} live instance(s): stop them first (forget removes only a task no instance runs)"
    )]
    Live {
        /// The task.
        task: LeaseName,
        /// How many instances' heartbeats are live.
        instances: u64,
    },
    /// The control record kept changing under this write.
    #[error("task {0}'s control record kept changing; try again")]
    Contended(LeaseName),
    /// A backfill range whose end comes before its start.
    #[error("the range {from_ms}..{to_ms} ends before it starts")]
    BadRange {
        /// Its start (ms since the Unix epoch).
        from_ms: u64,
        /// Its end.
        to_ms: u64,
    },
    /// A backfill range that ends after the store's clock: a slot still to come is the
    /// timer's, not a backfill's.
    #[error(
        "the range ends at {to_ms}, after the store's clock ({now_ms}): a backfill runs past slots only"
    )]
    FutureRange {
        /// Its end (ms since the Unix epoch).
        to_ms: u64,
        /// The store's clock.
        now_ms: u64,
    },
    /// A backfill range holding more slots of the task's schedule than one backfill runs.
    #[error(
        "the range holds {slots} slots of task {task}'s schedule; one backfill runs at most {max}: split it"
    )]
    TooManySlots {
        /// The task.
        task: LeaseName,
        /// How many slots the range holds (counted up to 100,000 for cron).
        slots: u64,
        /// [`MAX_BACKFILL_SLOTS`].
        max: usize,
    },
    /// A task that cannot be backfilled: why.
    #[error("task {task} cannot be backfilled: {why}")]
    NoBackfill {
        /// The task.
        task: LeaseName,
        /// Why.
        why: &'static str,
    },
    /// Another trigger (a manual run, or a backfill of another range) waits to be taken:
    /// nothing was written.
    #[error("another trigger of task {task} ({id}) waits to be taken; try again once it is")]
    TriggerWaiting {
        /// The task.
        task: LeaseName,
        /// The waiting trigger's id.
        id: String,
    },
    /// A `by` or `reason` that breaks [`text`](crate::text)'s rule (too long, or holding a
    /// control or bidi character); nothing was written.
    #[error(transparent)]
    Text(#[from] TextError),
    /// The store could not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FleetError {
    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Store(e) => e.is_transient(),
            Self::Contended(_) | Self::NotEnded { .. } | Self::TriggerWaiting { .. } => true,
            _ => false,
        }
    }
}

/// What a backfill asked for ([`Fleet::backfill`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Backfill {
    /// The request written to the task's control record; `None` when every slot of the range
    /// already ran ok (nothing was asked for).
    pub request: Option<TriggerRequest>,
    /// Every slot of the range, oldest first.
    pub slots: Vec<u64>,
    /// Those with no `ok` run in the history as read now, oldest first: the instance that
    /// takes the request runs them (reading the history again before each).
    pub to_run: Vec<u64>,
}

/// One task as the catalog describes it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TaskView {
    /// Its name.
    pub name: LeaseName,
    /// Its definition, when an instance registered it (`None`: only paused so far).
    pub definition: Option<TaskDefinition>,
    /// The instances that registered it, live ones first.
    pub instances: Vec<InstanceView>,
    /// Set while it is paused.
    pub paused: Option<Pause>,
    /// A manual run asked for and not taken yet.
    pub trigger: Option<TriggerRequest>,
}

impl TaskView {
    /// Whether some instance's heartbeat is live.
    pub fn has_live_instance(&self) -> bool {
        self.instances.iter().any(|i| i.live)
    }

    /// The name people know the task by ([`shown_name`]).
    pub fn shown_name(&self) -> &str {
        let from_run = self
            .definition
            .as_ref()
            .is_some_and(|d| d.source == TaskSource::Run);
        shown_name(self.name.as_str(), from_run)
    }

    /// [`shown_name`](Self::shown_name) as a name, for errors.
    fn shown(&self) -> LeaseName {
        LeaseName::new(self.shown_name()).unwrap_or_else(|_| self.name.clone())
    }
}

/// The name a task is shown by, in the CLI's tables and messages and on the page.
/// `leasehold run --lease NAME` files its task in the catalog and the history as `NAME:run`
/// (the lease `NAME` is its leader group), and people know it as `NAME`: that is the name
/// shown. Both are accepted wherever a task is named ([`Fleet::task`]); JSON carries the
/// catalog's own name, exact.
pub fn shown_name(name: &str, from_run: bool) -> &str {
    match from_run {
        true => name.strip_suffix(RUN_SUFFIX).unwrap_or(name),
        false => name,
    }
}

/// What `leasehold run --lease NAME` appends to `NAME` for its task's catalog name.
const RUN_SUFFIX: &str = ":run";

/// One instance of a task.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InstanceView {
    /// Its holder id.
    pub instance: HolderId,
    /// What it said about itself (version, host, pid); `None` if unreadable.
    pub info: Option<InstanceInfo>,
    /// Whether its heartbeat is live.
    pub live: bool,
    /// Time left on its heartbeat.
    pub remaining: Duration,
}

impl TaskView {
    fn of(record: TaskRecord) -> Result<Self, StoreError> {
        let control = match &record.control {
            Some(c) => Control::from_json(&c.value)?,
            None => Control::default(),
        };
        Ok(Self {
            definition: record
                .definition
                .as_deref()
                .map(TaskDefinition::from_json)
                .transpose()?,
            instances: record
                .instances
                .into_iter()
                .map(|i| InstanceView {
                    info: InstanceInfo::from_json(&i.about).ok(),
                    live: !i.remaining.is_zero(),
                    remaining: i.remaining,
                    instance: i.instance,
                })
                .collect(),
            paused: control.paused,
            trigger: control.trigger,
            name: record.task,
        })
    }
}

/// The fleet sharing one store: see the module documentation.
#[derive(Debug, Clone)]
pub struct Fleet<S> {
    store: S,
}

impl<S: Catalog + Slots> Fleet<S> {
    /// The fleet on `store`.
    pub fn new(store: S) -> Self {
        Self { store }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    fn check(&self) -> Result<(), FleetError> {
        match self.store.capabilities().contains(Capabilities::CATALOG) {
            true => Ok(()),
            false => Err(FleetError::NoCatalog(self.store.describe())),
        }
    }

    /// Every task in the catalog, sorted by name.
    pub async fn tasks(&self) -> Result<Vec<TaskView>, FleetError> {
        self.check()?;
        let records = self.store.tasks(CATALOG_RETENTION).await?;
        Ok(records
            .into_iter()
            .map(TaskView::of)
            .collect::<Result<_, _>>()?)
    }

    /// One task, or [`FleetError::UnknownTask`]. `leasehold run --lease NAME` files its task
    /// as `NAME:run` (the lease `NAME` is its leader group): `NAME` finds it too, so the name
    /// given to `run` is the name to pause, resume and trigger.
    pub async fn task(&self, name: &LeaseName) -> Result<TaskView, FleetError> {
        let run_task = format!("{name}{RUN_SUFFIX}");
        let tasks = self.tasks().await?;
        let exact = tasks.iter().position(|t| &t.name == name);
        let of_run = tasks.iter().position(|t| {
            t.name.as_str() == run_task
                && t.definition
                    .as_ref()
                    .is_some_and(|d| d.source == TaskSource::Run)
        });
        exact
            .or(of_run)
            .and_then(|i| tasks.into_iter().nth(i))
            .ok_or_else(|| FleetError::UnknownTask(name.clone()))
    }

    /// Up to `limit` lease records (tasks' run leases, leader groups, applications' leases).
    pub async fn leases(&self, limit: usize) -> Result<Vec<LeaseRecord>, FleetError> {
        self.check()?;
        Ok(self.store.leases(limit).await?)
    }

    /// Pauses `task` on every instance (at their next tick); answers the pause in force (an
    /// earlier one is kept as it was). `by` and `reason` follow [`text::BY`] and
    /// [`text::REASON`] ([`FleetError::Text`] if not).
    pub async fn pause(
        &self,
        task: &LeaseName,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Pause, FleetError> {
        text::BY.check(by)?;
        if let Some(reason) = reason {
            text::REASON.check(reason)?;
        }
        let task = &self.task(task).await?.name;
        let now_ms = self.store.now_millis().await?;
        let pause = Pause {
            by: by.to_owned(),
            reason: reason.map(str::to_owned),
            at_ms: now_ms,
        };
        let mut kept = None;
        self.update(task, |control| match &control.paused {
            Some(earlier) => {
                kept = Some(earlier.clone());
                false
            }
            None => {
                control.paused = Some(pause.clone());
                true
            }
        })
        .await?;
        Ok(kept.unwrap_or(pause))
    }

    /// Lifts a pause; answers whether the task was paused.
    pub async fn resume(&self, task: &LeaseName) -> Result<bool, FleetError> {
        let task = &self.task(task).await?.name;
        let mut was = false;
        self.update(task, |control| {
            was = control.paused.take().is_some();
            was
        })
        .await?;
        Ok(was)
    }

    /// Asks whichever instance runs `task` to run it once, as soon as it can (within its
    /// catalog heartbeat, a third of its lease ttl), holding the task lease; the request lapses
    /// after [`TRIGGER_TTL`] if no instance takes it. A trigger already waiting is answered
    /// instead of a second one ([`FleetError::TriggerWaiting`] if it is a backfill). `by`
    /// follows [`text::BY`] ([`FleetError::Text`] if not).
    pub async fn trigger(&self, task: &LeaseName, by: &str) -> Result<TriggerRequest, FleetError> {
        text::BY.check(by)?;
        let view = self.task(task).await?;
        if !view.has_live_instance() {
            return Err(FleetError::NoInstance(view.name));
        }
        let now_ms = self.store.now_millis().await?;
        self.ask(&view.name, by, now_ms, None).await
    }

    /// Asks whichever instance runs `task` to run each of its slots in `range` (both ends
    /// included) that has no `ok` run in its history, oldest first, one at a time, each
    /// holding the task lease, as trigger `backfill` (see [`backfill`](crate::backfill)).
    /// Refused, nothing written: a range that ends before it starts
    /// ([`FleetError::BadRange`]) or after the store's clock ([`FleetError::FutureRange`]),
    /// one of more than [`MAX_BACKFILL_SLOTS`] slots ([`FleetError::TooManySlots`]), a task
    /// whose schedule the catalog does not give (registered by a release before backfill) or
    /// that an application runs through the sidecar ([`FleetError::NoBackfill`]), another
    /// trigger waiting ([`FleetError::TriggerWaiting`]). When every slot already ran ok,
    /// nothing is asked for ([`Backfill::request`] is `None`). The request lapses like a
    /// trigger's if no instance takes it; an identical one waiting is answered instead.
    pub async fn backfill(
        &self,
        task: &LeaseName,
        by: &str,
        range: SlotRange,
    ) -> Result<Backfill, FleetError> {
        text::BY.check(by)?;
        if range.to_ms < range.from_ms {
            return Err(FleetError::BadRange {
                from_ms: range.from_ms,
                to_ms: range.to_ms,
            });
        }
        let view = self.task(task).await?;
        let task = &view.name;
        let schedule = backfill_schedule(&view)?;
        let now_ms = self.store.now_millis().await?;
        if range.to_ms > now_ms {
            return Err(FleetError::FutureRange {
                to_ms: range.to_ms,
                now_ms,
            });
        }
        let slots =
            backfill::slots_in(&schedule, range).map_err(|slots| FleetError::TooManySlots {
                task: view.shown(),
                slots,
                max: MAX_BACKFILL_SLOTS,
            })?;
        let records =
            crate::scheduling::history::read(&self.store, task, HISTORY_LOOKED_AT).await?;
        let to_run: Vec<u64> = slots
            .iter()
            .copied()
            .filter(|&slot| !backfill::ran_ok(&records, slot))
            .collect();
        if to_run.is_empty() {
            return Ok(Backfill {
                request: None,
                slots,
                to_run,
            });
        }
        if !view.has_live_instance() {
            return Err(FleetError::NoInstance(view.shown()));
        }
        let request = self.ask(task, by, now_ms, Some(range)).await?;
        Ok(Backfill {
            request: Some(request),
            slots,
            to_run,
        })
    }

    /// Writes a trigger request (of `slots`, for a backfill) to `task`'s control record, or
    /// answers the same kind of request already waiting.
    async fn ask(
        &self,
        task: &LeaseName,
        by: &str,
        now_ms: u64,
        slots: Option<SlotRange>,
    ) -> Result<TriggerRequest, FleetError> {
        let request = TriggerRequest {
            id: format!("{now_ms:x}-{:08x}", fastrand::u32(..)),
            by: by.to_owned(),
            at_ms: now_ms,
            expires_ms: now_ms.saturating_add(millis(TRIGGER_TTL)),
            slots,
        };
        let mut answer = Ok(request.clone());
        self.update(task, |control| match &control.trigger {
            Some(pending) if pending.expires_ms > now_ms => {
                answer = match pending.slots == slots {
                    true => Ok(pending.clone()),
                    false => Err(FleetError::TriggerWaiting {
                        task: task.clone(),
                        id: pending.id.clone(),
                    }),
                };
                false
            }
            _ => {
                answer = Ok(request.clone());
                control.trigger = Some(request.clone());
                true
            }
        })
        .await?;
        answer
    }

    /// Removes `task` from the catalog with its control record (a pause, a pending trigger),
    /// and with `history` its run history too; refused with [`FleetError::Live`], nothing
    /// removed, while an instance's heartbeat is live (stop it first). Its slot claims stay, so
    /// a task of the same name started later does not run a slot that already ran. A task the
    /// catalog no longer lists (forgotten, or unseen for 24 h) answers
    /// [`FleetError::UnknownTask`], its history removed all the same when asked.
    pub async fn forget(&self, task: &LeaseName, history: bool) -> Result<(), FleetError> {
        self.check()?;
        // A task whose instances all stopped is no longer listed, so `NAME:run` (see
        // [`task`](Self::task)) is tried in the store itself.
        let (names, shown) = match self.task(task).await {
            Ok(view) => {
                let shown = view.shown();
                (vec![view.name], shown)
            }
            Err(FleetError::UnknownTask(_)) => {
                let run = LeaseName::new(format!("{task}{RUN_SUFFIX}")).ok();
                (
                    std::iter::once(task.clone()).chain(run).collect(),
                    task.clone(),
                )
            }
            Err(e) => return Err(e),
        };
        for name in names {
            match self.store.forget(&name, history).await? {
                Forgetting::Forgotten => return Ok(()),
                Forgetting::Unknown => {}
                Forgetting::Live { instances } => {
                    return Err(FleetError::Live {
                        task: shown,
                        instances,
                    });
                }
            }
        }
        Err(FleetError::UnknownTask(task.clone()))
    }

    /// Waits (polling the history once a second) until the run `request` asked for has ended,
    /// at most `limit`.
    pub async fn wait_for_run(
        &self,
        task: &LeaseName,
        request: &TriggerRequest,
        limit: Duration,
    ) -> Result<RunRecord, FleetError> {
        self.poll(task, request, limit, RUN_LOOKED_AT, |records, state| {
            let run = records
                .iter()
                .find(|r| r.request.as_ref().is_some_and(|q| q.id == request.id))?;
            if run.outcome == RunOutcome::Running {
                *state = "running".to_owned();
                return None;
            }
            Some(run.clone())
        })
        .await
    }

    /// Waits (polling the history once a second) until each slot `backfill` is to run has
    /// ended a run of its request, or has an `ok` run otherwise (another backfill ran it), at
    /// most `limit`: the request's runs, oldest slot first (the last attempt of each).
    pub async fn wait_for_backfill(
        &self,
        task: &LeaseName,
        backfill: &Backfill,
        limit: Duration,
    ) -> Result<Vec<RunRecord>, FleetError> {
        let Some(request) = &backfill.request else {
            return Ok(Vec::new());
        };
        self.poll(task, request, limit, HISTORY_LOOKED_AT, |records, state| {
            // Newest first: the first record of a slot is its last attempt.
            let mut runs: Vec<RunRecord> = Vec::new();
            for r in records {
                let ours = r.request.as_ref().is_some_and(|q| q.id == request.id);
                if ours && !runs.iter().any(|run| run.slot == r.slot) {
                    runs.push(r.clone());
                }
            }
            let ended = |slot: &u64| {
                runs.iter()
                    .any(|r| r.slot == Some(*slot) && r.outcome != RunOutcome::Running)
                    || backfill::ran_ok(records, *slot)
            };
            let done = backfill.to_run.iter().filter(|s| ended(s)).count();
            *state = format!("{done} of {} slots ended", backfill.to_run.len());
            if done < backfill.to_run.len() {
                return None;
            }
            runs.sort_by_key(|r| r.slot);
            Some(runs)
        })
        .await
    }

    /// Reads `task`'s newest `entries` history entries once a second until `done` answers (it
    /// may say what it saw in `state`), at most `limit`; a `request` no instance took before
    /// it lapsed ends the wait.
    async fn poll<T>(
        &self,
        task: &LeaseName,
        request: &TriggerRequest,
        limit: Duration,
        entries: usize,
        mut done: impl FnMut(&[RunRecord], &mut String) -> Option<T>,
    ) -> Result<T, FleetError> {
        let view = self.task(task).await?;
        let task = &view.name;
        let started = tokio::time::Instant::now();
        let mut state = "not taken by an instance yet".to_owned();
        loop {
            let records = crate::scheduling::history::read(&self.store, task, entries).await?;
            if let Some(answer) = done(&records, &mut state) {
                return Ok(answer);
            }
            let taken = records
                .iter()
                .any(|r| r.request.as_ref().is_some_and(|q| q.id == request.id));
            if !taken && self.store.now_millis().await? > request.expires_ms {
                state = "lapsed: no instance took it in time".to_owned();
                break;
            }
            if started.elapsed() >= limit {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1).min(limit)).await;
        }
        Err(FleetError::NotEnded {
            task: view.shown(),
            id: request.id.clone(),
            waited: started.elapsed(),
            state,
        })
    }

    /// Applies `change` to `task`'s control record by compare-and-set, retrying when another
    /// writer got there first. `change` answers whether it changed anything.
    async fn update(
        &self,
        task: &LeaseName,
        mut change: impl FnMut(&mut Control) -> bool,
    ) -> Result<(), FleetError> {
        for _ in 0..CAS_ATTEMPTS {
            let read = self.store.control(task).await?;
            let (version, mut control) = match &read.control {
                Some(v) => (Some(v.version), Control::from_json(&v.value)?),
                None => (None, Control::default()),
            };
            if !change(&mut control) {
                return Ok(());
            }
            let json = control.to_json();
            if self
                .store
                .set_control(task, version, &json)
                .await?
                .is_some()
            {
                return Ok(());
            }
        }
        Err(FleetError::Contended(task.clone()))
    }
}

/// The schedule a backfill of `view` computes its slots from, or why there is none.
fn backfill_schedule(view: &TaskView) -> Result<Schedule, FleetError> {
    let refuse = |why| FleetError::NoBackfill {
        task: view.name.clone(),
        why,
    };
    let definition = view
        .definition
        .as_ref()
        .ok_or_else(|| refuse("no instance registered its schedule"))?;
    if definition.source == TaskSource::Sidecar {
        return Err(refuse(
            "an application runs it through the sidecar, which runs one slot per tick: backfill needs an instance that runs the task itself (the library's Scheduler, `leasehold run`, `leasehold crontab`)",
        ));
    }
    definition
        .slot_schedule
        .as_ref()
        .and_then(|recorded| recorded.schedule())
        .ok_or_else(|| {
            refuse("the instance that registered it predates backfill (upgrade it), or its schedule is one this build cannot read")
        })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
