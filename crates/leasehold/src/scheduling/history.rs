//! Run history: what ran for each task, and which slots did not run and why, kept in the store
//! (bounded per task) so every instance and `leasehold history` see the same record.
//!
//! A store keeps entries as opaque text under a numeric key per task (see
//! [`Slots::record_history`]); this module defines what the text
//! is: one [`RunRecord`] as JSON. Timer and catch-up runs are keyed by their slot, so a record
//! written when a run starts is replaced by the one written when it ends; manual runs by their
//! start time; a gap of missed slots by its first slot.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tokio::sync::{mpsc, oneshot};

use crate::store::catalog::Pause;
use crate::store::error::StoreError;
use crate::store::name::LeaseName;
use crate::store::text;
use crate::store::token::FencingToken;
use crate::store::traits::Slots;

/// Entries kept per task when nothing else is configured.
pub const DEFAULT_HISTORY_LIMIT: usize = 100;

/// The most entries per task `leasehold run --history` and `leasehold serve --history` accept:
/// a store keeps each task's history whole, and readers page through at most
/// [`MAX_HISTORY`](crate::overview::MAX_HISTORY) at once.
pub const MAX_HISTORY_SETTING: usize = 1000;

/// What started a recorded run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RecordTrigger {
    /// A timer tick.
    Timer,
    /// A missed slot run later under the task's catch-up policy.
    CatchUp,
    /// A manual run.
    Manual,
    /// A past slot run on purpose (`leasehold trigger --slots`). The store keeps it as
    /// `manual` with `"backfill": true` ([`RunRecord::to_json`]), which releases before it read.
    Backfill,
}

impl RecordTrigger {
    /// `timer`, `catch-up`, `manual`, `backfill`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timer => "timer",
            Self::CatchUp => "catch-up",
            Self::Manual => "manual",
            Self::Backfill => "backfill",
        }
    }
}

impl fmt::Display for RecordTrigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why slots did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum MissReason {
    /// No instance claimed them: no leader (a crashed leader's lease was running out, or a
    /// handoff), or every instance was down.
    NotClaimed,
    /// The store could not be reached and the policy was fail-closed.
    StoreDown,
    /// The previous run was still going (here or elsewhere).
    Overlap,
    /// Older than the catch-up window, or beyond its cap.
    OutsideCatchUpWindow,
}

impl MissReason {
    /// The metrics and JSON label: `not-claimed`, `store-down`, `overlap`,
    /// `outside-catch-up-window`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotClaimed => "not-claimed",
            Self::StoreDown => "store-down",
            Self::Overlap => "overlap",
            Self::OutsideCatchUpWindow => "outside-catch-up-window",
        }
    }
}

impl fmt::Display for MissReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotClaimed => "not claimed (no leader or no instance)",
            Self::StoreDown => "store down",
            Self::Overlap => "previous run still going",
            Self::OutsideCatchUpWindow => "outside the catch-up window",
        })
    }
}

/// How a run ended, in the five words every door uses (history, `status`, JSON, the page,
/// metrics): [`RunRecord::result`] reads it from any record, old or new.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Outcome {
    /// The job succeeded.
    Ok,
    /// The job failed: an error, a non-zero exit status, a panic.
    Failed,
    /// The job ran past its time limit and was stopped (for the timeout policy; kept in the
    /// store as `cancelled`, so releases before this word read it).
    TimedOut,
    /// The job was told to stop (its lease expiring or lost, a shutdown) and stopped, or was
    /// aborted when it did not.
    Cancelled,
    /// The instance running it went away mid-run (killed, or stopped answering): a started
    /// run whose lease is gone without an end.
    Interrupted,
}

impl Outcome {
    /// Every outcome, in the order of [`as_str`](Self::as_str)'s list.
    pub const ALL: [Outcome; 5] = [
        Self::Ok,
        Self::Failed,
        Self::TimedOut,
        Self::Cancelled,
        Self::Interrupted,
    ];

    /// `ok`, `failed`, `timed-out`, `cancelled`, `interrupted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::TimedOut => "timed-out",
            Self::Cancelled => "cancelled",
            Self::Interrupted => "interrupted",
        }
    }

    /// Whether the run counts as a failure of the task: `failed` and `timed-out`. A task's
    /// consecutive failures are these runs since its last `ok`; `cancelled` and `interrupted`
    /// runs (the instance's doing, not the job's) neither count nor end a streak.
    pub fn is_failure(self) -> bool {
        matches!(self, Self::Failed | Self::TimedOut)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a recorded run ended (or that it did not run), as the store keeps it: the words of
/// release 0.1.0 (which reads no others), with [`RunRecord::result`] giving the [`Outcome`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RunOutcome {
    /// Started and not (yet) ended: still running, or its holder died mid-run.
    Running,
    /// The job returned `Ok`.
    Ok,
    /// The job returned an error (an exit status for commands).
    Failed {
        /// The error's message.
        error: String,
    },
    /// The job was told to stop (lease expiring or lost, shutdown) and stopped.
    Cancelled {
        /// Why it was told to stop.
        why: String,
    },
    /// The job ignored its cancellation and was aborted.
    Aborted,
    /// The job panicked.
    Panicked,
    /// Recorded as running, but the lease it ran under is gone (its instance was killed, or
    /// stopped answering) and no end was recorded. Readers infer it (see [`read`]); no
    /// instance writes it, so releases that do not know it never meet it.
    Interrupted,
    /// Slots that did not run: `count` firings from the record's slot to `last_slot`.
    Missed {
        /// How many firings.
        count: u64,
        /// The last of them.
        last_slot: u64,
        /// Why, where it is known.
        reason: MissReason,
    },
}

impl RunOutcome {
    /// The word as stored: `running`, `ok`, `failed`, `cancelled`, `aborted`, `panicked`,
    /// `interrupted`, `missed`. People are shown [`RunRecord::word`].
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Ok => "ok",
            Self::Failed { .. } => "failed",
            Self::Cancelled { .. } => "cancelled",
            Self::Aborted => "aborted",
            Self::Panicked => "panicked",
            Self::Interrupted => "interrupted",
            Self::Missed { .. } => "missed",
        }
    }

    /// The outcome of a run that ended, `None` for one still running and for missed slots.
    pub fn ended(&self) -> Option<Outcome> {
        Some(match self {
            Self::Running | Self::Missed { .. } => return None,
            Self::Ok => Outcome::Ok,
            Self::Failed { .. } | Self::Panicked => Outcome::Failed,
            Self::Cancelled { .. } | Self::Aborted => Outcome::Cancelled,
            Self::Interrupted => Outcome::Interrupted,
        })
    }
}

/// A task's schedule as recorded with each run, so a reader can say when the next slot is due.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RecordedSchedule {
    /// `Schedule::Every`, in ms.
    EveryMs(u64),
    /// `Schedule::Cron`, the expression as [`CronSchedule::expr`](crate::CronSchedule::expr)
    /// gives it: `CRON_TZ=ZONE ` before it unless its zone is UTC, so `Schedule::cron` reads
    /// it back with its zone. The zone travels inside the string, so records stay readable
    /// by releases from before zones (and theirs, which carry none, are UTC).
    Cron(String),
}

impl RecordedSchedule {
    /// How `schedule` is recorded.
    pub fn of(schedule: &crate::scheduling::schedule::Schedule) -> Self {
        match schedule {
            crate::scheduling::schedule::Schedule::Every(d) => {
                Self::EveryMs(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }
            #[cfg(feature = "cron")]
            crate::scheduling::schedule::Schedule::Cron(c) => Self::Cron(c.expr().to_owned()),
        }
    }

    /// The schedule read back; `None` for a cron expression this build cannot read (built
    /// without the `cron` feature, or an expression a later release wrote).
    pub fn schedule(&self) -> Option<crate::scheduling::schedule::Schedule> {
        use crate::scheduling::schedule::Schedule;
        match self {
            Self::EveryMs(ms) => Schedule::every(Duration::from_millis(*ms)).ok(),
            #[cfg(feature = "cron")]
            Self::Cron(expr) => Schedule::cron(expr).ok(),
            #[cfg(not(feature = "cron"))]
            Self::Cron(_) => None,
        }
    }
}

/// The field that marks a `manual` record as a backfill run in the store ([`RunRecord::to_json`]).
const BACKFILL_FIELD: &str = "backfill";

/// One entry of a task's run history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunRecord {
    /// The slot (ms since the epoch, store clock) for timer and catch-up runs and misses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u64>,
    /// What started it; `None` for missed slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<RecordTrigger>,
    /// The instance that ran it (or recorded the miss).
    pub holder: String,
    /// The fencing token the run held, if any. A string in JSON: tokens are 64-bit and can exceed 2^53.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "token_as_string"
    )]
    pub token: Option<FencingToken>,
    /// When it started, ms since the epoch (the store's clock as this instance estimates it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: RunOutcome,
    /// The task's schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<RecordedSchedule>,
    /// For a slot that fell while the task was paused: who paused it and why. (Such a slot is
    /// recorded as missed, not claimed by a run, which releases without this field read.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
    /// For a manual run asked for through the catalog (`leasehold trigger`): the request's id
    /// and who asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RunRequest>,
    /// How the run ended, in the five words, written with every end (releases before it ignore
    /// the field; records without it are read from [`outcome`](Self::outcome)). It says more
    /// than `outcome` for a timed-out run, kept as `cancelled`. Use [`result`](Self::result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Outcome>,
    /// Which attempt of its slot this run was, for a task with retries (absent: the first).
    /// Use [`attempt`](Self::attempt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// For an attempt that failed or timed out with retries left: when the next one starts, or
    /// that it was dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryNote>,
    /// What the run printed, as its job kept it ([`TaskContext::keep_output`](crate::TaskContext::keep_output),
    /// a command's stdout and stderr under `leasehold run --output-tail`, the sidecar's `done`):
    /// its end, at most [`text::OUTPUT`]'s limit, cut when recorded. Untrusted: show it through
    /// [`text::visible`]. Releases before it ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// For a run cancelled because a newer slot replaced it (overlap policy `replace`): that
    /// slot. Such a run is not run again as a cut-off one. Releases before it ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<u64>,
}

/// What became of the retry a failed or timed-out attempt was due ([`RunRecord::retry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RetryNote {
    /// The next attempt starts at this time (ms since the epoch, store clock).
    AtMs(u64),
    /// The next attempt would not have started before the task's next slot, at this time: it
    /// was not run.
    DroppedBeforeSlot(u64),
}

/// Who asked for a manual run, as its history record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The trigger's id ([`TriggerRequest::id`](crate::catalog::TriggerRequest::id)).
    pub id: String,
    /// Who asked.
    pub by: String,
}

impl RunRecord {
    /// `count` slots from `first` to `last_slot` that did not run, for `reason`, as `holder`
    /// saw it.
    pub fn missed(
        first: u64,
        count: u64,
        last_slot: u64,
        reason: MissReason,
        holder: impl fmt::Display,
    ) -> Self {
        Self {
            slot: Some(first),
            trigger: None,
            holder: holder.to_string(),
            token: None,
            started_ms: None,
            ended_ms: None,
            outcome: RunOutcome::Missed {
                count,
                last_slot,
                reason,
            },
            schedule: None,
            paused: None,
            request: None,
            result: None,
            attempt: None,
            retry: None,
            output: None,
            replaced_by: None,
        }
    }

    /// A run that started at `started_ms` and is still running: of `slot` for timer and
    /// catch-up runs, `None` for manual ones. (For code outside the scheduler that runs gated
    /// work, such as the sidecar, to keep the same history.)
    pub fn started(
        slot: Option<u64>,
        trigger: RecordTrigger,
        holder: impl Into<String>,
        token: Option<FencingToken>,
        started_ms: u64,
        schedule: Option<RecordedSchedule>,
    ) -> Self {
        Self {
            slot,
            trigger: Some(trigger),
            holder: holder.into(),
            token,
            started_ms: Some(started_ms),
            ended_ms: None,
            outcome: RunOutcome::Running,
            schedule,
            paused: None,
            request: None,
            result: None,
            attempt: None,
            retry: None,
            output: None,
            replaced_by: None,
        }
    }

    /// This run, ended at `ended_ms` with `outcome`.
    pub fn ended(mut self, ended_ms: u64, outcome: RunOutcome) -> Self {
        self.ended_ms = Some(ended_ms);
        self.result = outcome.ended();
        self.outcome = outcome;
        self
    }

    /// How the run ended; `None` while it runs, and for missed slots.
    pub fn result(&self) -> Option<Outcome> {
        self.outcome
            .ended()
            .and(self.result)
            .or(self.outcome.ended())
    }

    /// The word people are shown: the [`result`](Self::result), else `running` or `missed`.
    pub fn word(&self) -> &'static str {
        self.result().map_or(self.outcome.as_str(), Outcome::as_str)
    }

    /// The failed run's error, or why a cancelled one was told to stop.
    pub fn error(&self) -> Option<&str> {
        match &self.outcome {
            RunOutcome::Failed { error } => Some(error),
            RunOutcome::Cancelled { why } => Some(why),
            RunOutcome::Panicked => Some("panicked"),
            RunOutcome::Aborted => Some("aborted: it did not stop when told to"),
            _ => None,
        }
    }

    /// The key the store files it under: its slot, else its start time. A retry of a slot
    /// (attempt 2 on) goes under its start time, at least a millisecond per attempt after the
    /// slot, so each attempt keeps an entry of its own (and they stay in order).
    pub fn key(&self) -> u64 {
        // A backfill run goes under its start time: its slot's key may hold the slot's miss
        // or an earlier run, which it must not replace.
        if self.trigger == Some(RecordTrigger::Backfill) {
            return self.started_ms.or(self.slot).unwrap_or_default();
        }
        match (self.slot, self.attempt) {
            (Some(slot), Some(attempt)) if attempt > 1 => self
                .started_ms
                .unwrap_or_default()
                .max(slot.saturating_add(u64::from(attempt) - 1)),
            _ => self.slot.or(self.started_ms).unwrap_or_default(),
        }
    }

    /// Which attempt of its slot the run was: 1 unless recorded otherwise.
    pub fn attempt(&self) -> u32 {
        self.attempt.unwrap_or(1)
    }

    /// How long it ran, if it ended.
    pub fn duration(&self) -> Option<Duration> {
        Some(Duration::from_millis(
            self.ended_ms?.saturating_sub(self.started_ms?),
        ))
    }

    /// This record with its free text cut to [`text`]'s limits: the failure text (a job's
    /// error, a command's stderr: any length) and, for a pause copied from a control record an
    /// older release wrote without limits, its `by` and `reason`, which every paused slot repeats.
    fn with_text_cut(mut self) -> Self {
        let take = std::mem::take::<String>;
        match &mut self.outcome {
            RunOutcome::Failed { error: text } | RunOutcome::Cancelled { why: text } => {
                *text = text::FAILURE.cut(take(text));
            }
            _ => {}
        }
        if let Some(pause) = &mut self.paused {
            pause.by = text::BY.cut(take(&mut pause.by));
            pause.reason = pause.reason.take().map(|r| text::REASON.cut(r));
        }
        if let Some(request) = &mut self.request {
            request.by = text::BY.cut(take(&mut request.by));
        }
        self.output = self.output.take().map(|o| text::OUTPUT.cut_tail(o));
        self
    }

    /// The record as the store keeps it. A backfill run is kept as `manual` with
    /// `"backfill": true`: a release before backfill reads it (a trigger word it does not know
    /// would make it refuse the whole history).
    pub fn to_json(&self) -> String {
        // A struct of strings, numbers and enums always serializes.
        if self.trigger != Some(RecordTrigger::Backfill) {
            return serde_json::to_string(self).unwrap_or_default();
        }
        let as_manual = Self {
            trigger: Some(RecordTrigger::Manual),
            ..self.clone()
        };
        let mut value = serde_json::to_value(as_manual).unwrap_or_default();
        if let Some(fields) = value.as_object_mut() {
            fields.insert(BACKFILL_FIELD.to_owned(), true.into());
        }
        value.to_string()
    }

    /// Reads a record the store kept.
    pub fn from_json(text: &str) -> Result<Self, StoreError> {
        let corrupt = |e: serde_json::Error| {
            StoreError::Corrupt(format!("history entry is not a run record: {e}"))
        };
        let value: serde_json::Value = serde_json::from_str(text).map_err(corrupt)?;
        let backfill = value.get(BACKFILL_FIELD) == Some(&serde_json::Value::Bool(true));
        let mut record: Self = serde_json::from_value(value).map_err(corrupt)?;
        if backfill && record.trigger == Some(RecordTrigger::Manual) {
            record.trigger = Some(RecordTrigger::Backfill);
        }
        Ok(record)
    }
}

mod token_as_string {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::store::token::FencingToken;

    pub fn serialize<S: Serializer>(t: &Option<FencingToken>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&t.get().to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<FencingToken>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| {
            t.parse()
                .map(FencingToken)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

/// How often records the store did not take are offered again.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// The most records kept to offer again: beyond it the oldest is dropped.
const RETRY_MAX: usize = 256;

/// The writer task's side: records a store that was down did not take are offered again, in
/// order, once it answers (a run's end recorded while the store was down must not leave it
/// `running` there: the next holder would take it for a run that was cut off).
struct Writer<S> {
    store: S,
    keep: usize,
    /// Tasks that keep another number of entries ([`HistoryWriter::keep_for`]).
    keeps: std::collections::HashMap<LeaseName, usize>,
    limit: Duration,
    warned: bool,
    again: std::collections::VecDeque<(LeaseName, Box<RunRecord>)>,
}

impl<S: Slots> Writer<S> {
    async fn write(&mut self, task: LeaseName, record: Box<RunRecord>) {
        let record = Box::new(record.with_text_cut());
        let json = record.to_json();
        let keep = self.keeps.get(&task).copied().unwrap_or(self.keep);
        let write = self.store.record_history(&task, record.key(), &json, keep);
        match crate::store::within(self.limit, write).await {
            Ok(()) => {}
            // A store without history: nothing to warn about.
            Err(StoreError::Unsupported(_)) => {}
            Err(e) => {
                if !self.warned {
                    self.warned = true;
                    tracing::warn!(task = %task, error = %e, "run history not recorded (further failures at debug level)");
                } else {
                    tracing::debug!(task = %task, error = %e, "run history not recorded");
                }
                if e.is_transient() {
                    if self.again.len() >= RETRY_MAX {
                        self.again.pop_front();
                        metrics::counter!("leasehold_history_dropped_total").increment(1);
                    }
                    self.again.push_back((task, record));
                }
            }
        }
    }

    /// Offers the records the store did not take again, oldest first, until one fails.
    async fn write_again(&mut self) {
        while let Some((task, record)) = self.again.pop_front() {
            let before = self.again.len();
            self.write(task, record).await;
            if self.again.len() > before {
                // Not taken: it went to the back; put it first again, the store is still down.
                if let Some(last) = self.again.pop_back() {
                    self.again.push_front(last);
                }
                return;
            }
        }
    }
}

/// The most tasks a writer keeps a length of their own for: beyond it, further tasks keep the
/// writer's (a process told of ever more task names does not grow without bound).
const MAX_KEEPS: usize = 10_000;

enum Write {
    Record(LeaseName, Box<RunRecord>),
    Keep(LeaseName, usize),
    Flush(oneshot::Sender<()>),
}

/// Where runs and misses are recorded: a queue to one writer task, so a record never adds a
/// round trip to a run's critical path and the records of one task land in order. A record that
/// cannot be queued (1024 waiting) is dropped (counted in `leasehold_history_dropped_total`);
/// one the store did not take for a transient error is offered again every second, in order
/// (the newest 256 kept). A failed write is warned about once; it never stops a run. Free text is
/// cut to [`text`]'s limits on the way (a failure text to [`text::FAILURE`]).
#[derive(Clone)]
pub struct HistoryWriter(mpsc::Sender<Write>);

impl HistoryWriter {
    /// Starts the writer on `store`, keeping the newest `keep` entries per task and giving each
    /// write at most `limit`.
    pub fn spawn<S: Slots>(store: S, keep: usize, limit: Duration) -> Self {
        let (tx, mut rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            let mut writer = Writer {
                store,
                keep,
                keeps: std::collections::HashMap::new(),
                limit,
                warned: false,
                again: std::collections::VecDeque::new(),
            };
            loop {
                let write = if writer.again.is_empty() {
                    rx.recv().await
                } else {
                    tokio::select! {
                        write = rx.recv() => write,
                        () = tokio::time::sleep(RETRY_EVERY) => {
                            writer.write_again().await;
                            continue;
                        }
                    }
                };
                match write {
                    None => return,
                    Some(Write::Flush(done)) => {
                        writer.write_again().await;
                        let _ = done.send(());
                    }
                    Some(Write::Keep(task, keep)) => {
                        if writer.keeps.len() < MAX_KEEPS || writer.keeps.contains_key(&task) {
                            writer
                                .keeps
                                .insert(task, keep.clamp(1, MAX_HISTORY_SETTING));
                        }
                    }
                    Some(Write::Record(task, record)) => {
                        writer.write_again().await;
                        writer.write(task, record).await;
                    }
                }
            }
        });
        Self(tx)
    }

    /// Queues `record` for `task`.
    pub fn record(&self, task: &LeaseName, record: RunRecord) {
        if self
            .0
            .try_send(Write::Record(task.clone(), Box::new(record)))
            .is_err()
        {
            metrics::counter!("leasehold_history_dropped_total").increment(1);
        }
    }

    /// Keeps the newest `keep` entries of `task` (1 to [`MAX_HISTORY_SETTING`]) from its next
    /// record on, rather than the writer's number: a task's own `--history` (the sidecar's
    /// tick `history`). Every record of the task goes through this writer, misses included, so
    /// one length holds for all of them.
    pub fn keep_for(&self, task: &LeaseName, keep: usize) {
        let _ = self.0.try_send(Write::Keep(task.clone(), keep));
    }

    /// Waits until every record queued so far was written (or given up), at most `limit`.
    pub async fn flush(&self, limit: Duration) {
        let (done, wait) = oneshot::channel();
        if self.0.send(Write::Flush(done)).await.is_ok() {
            let _ = tokio::time::timeout(limit, wait).await;
        }
    }
}

/// The newest `limit` records of `task`, newest first, each with its
/// [`result`](RunRecord::result) filled in. A run recorded as running whose lease is gone
/// (another tenure holds it, or nobody does) is reported [`RunOutcome::Interrupted`]: its
/// instance died before it could record the end. (The lease is `task` itself for runs of a
/// scheduler and the sidecar.)
pub async fn read<S: Slots>(
    store: &S,
    task: &LeaseName,
    limit: usize,
) -> Result<Vec<RunRecord>, StoreError> {
    let mut records: Vec<RunRecord> = store
        .history(task, limit)
        .await?
        .iter()
        .map(|text| RunRecord::from_json(text))
        .collect::<Result<_, _>>()?;
    if records.iter().any(|r| r.outcome == RunOutcome::Running) {
        let lease = store.inspect(task).await?;
        for record in &mut records {
            if record.outcome == RunOutcome::Running && !holds(lease.as_ref(), record) {
                record.outcome = RunOutcome::Interrupted;
            }
        }
    }
    for record in &mut records {
        record.result = record.result();
    }
    Ok(records)
}

/// The slots of `task` that fell between the newest one its history accounts for (run, or
/// recorded missed) and `slot`, as a missed record for `holder` to write, or `None` when there
/// are none or the history says nothing yet. For code that runs gated work without the
/// scheduler's timer (the sidecar): it learns of a gap only when the next slot is granted.
pub async fn gap_before<S: Slots>(
    store: &S,
    task: &LeaseName,
    schedule: &crate::scheduling::schedule::Schedule,
    slot: u64,
    holder: &str,
) -> Result<Option<RunRecord>, StoreError> {
    let newest = read(store, task, 20)
        .await?
        .iter()
        .filter_map(|r| match r.outcome {
            RunOutcome::Missed { last_slot, .. } => Some(last_slot),
            _ => r.slot,
        })
        .filter(|&s| s < slot)
        .max();
    let Some(newest) = newest else {
        return Ok(None);
    };
    let (count, last) = schedule.firings_between(newest, slot.saturating_sub(1), 1);
    Ok(match (schedule.next_after(newest), last.first()) {
        (Some(first), Some(&last)) if count > 0 && first < slot => {
            let mut record = RunRecord::missed(first, count, last, MissReason::NotClaimed, holder);
            record.schedule = Some(RecordedSchedule::of(schedule));
            Some(record)
        }
        _ => None,
    })
}

/// Whether `lease` is still the tenure `record`'s run holds.
fn holds(lease: Option<&crate::store::answers::LeaseState>, record: &RunRecord) -> bool {
    match (lease, record.token) {
        (Some(lease), Some(token)) => lease.holder.is_some() && lease.token == token,
        // A run without a token (ungated) cannot be judged by the lease.
        (_, None) => true,
        (None, Some(_)) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cron schedule's zone is recorded inside the expression: the record's JSON has the
    /// shape it always had (old records read as UTC), and reading it back gives the same slots.
    #[cfg(feature = "cron")]
    #[test]
    fn a_zoned_cron_schedule_is_recorded_in_the_old_shape_and_reads_back() {
        let berlin = crate::Schedule::cron_in("30 2 * * *", "Europe/Berlin").unwrap();
        let recorded = RecordedSchedule::of(&berlin);
        assert_eq!(
            serde_json::to_string(&recorded).unwrap(),
            r#"{"cron":"CRON_TZ=Europe/Berlin 30 2 * * *"}"#
        );
        let RecordedSchedule::Cron(expr) = &recorded else {
            panic!("{recorded:?}")
        };
        let back = crate::Schedule::cron(expr).unwrap();
        let night = 1_806_184_800_000; // 2027-03-27T22:00:00Z
        assert_eq!(back.next_after(night), berlin.next_after(night));
        let old: RecordedSchedule = serde_json::from_str(r#"{"cron":"0 0 3 * * *"}"#).unwrap();
        assert_eq!(old, RecordedSchedule::Cron("0 0 3 * * *".into()));
        let every = crate::Schedule::every(Duration::from_secs(30)).unwrap();
        assert_eq!(
            RecordedSchedule::of(&every),
            RecordedSchedule::EveryMs(30_000)
        );
    }

    /// A backfill run is kept as `manual` plus a flag, so a release before backfill (which
    /// refuses a history holding a trigger word it does not know) still reads it; this release
    /// reads it back as `backfill`, filed under its start time, not its slot.
    #[test]
    fn a_backfill_run_is_kept_as_manual_with_a_flag_and_reads_back() {
        let run = RunRecord::started(
            Some(60_000),
            RecordTrigger::Backfill,
            "host:1:ab",
            Some(FencingToken(7)),
            900_000,
            None,
        )
        .ended(901_000, RunOutcome::Ok);
        let json = run.to_json();
        assert!(json.contains("\"trigger\":\"manual\""), "{json}");
        assert!(json.contains("\"backfill\":true"), "{json}");
        assert_eq!(RunRecord::from_json(&json).unwrap(), run);
        assert_eq!(run.key(), 900_000);
        // What the previous release's reader sees: a manual run of the slot.
        let plain: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(plain["trigger"], "manual");
        assert_eq!(plain["slot"], 60_000);
        // Served as JSON (the sidecar's API, `history --json`), the word is `backfill`.
        assert!(
            serde_json::to_string(&run)
                .unwrap()
                .contains("\"trigger\":\"backfill\"")
        );
    }

    #[test]
    fn records_round_trip_through_json_with_exact_tokens() {
        let run = RunRecord {
            slot: Some(1_767_225_900_000),
            trigger: Some(RecordTrigger::CatchUp),
            holder: "host:1:ab".into(),
            token: Some(FencingToken(9_007_199_254_740_993)),
            started_ms: Some(1_767_225_913_000),
            ended_ms: Some(1_767_225_914_500),
            outcome: RunOutcome::Failed {
                error: "exit status 3".into(),
            },
            schedule: Some(RecordedSchedule::Cron("0 0 3 * * *".into())),
            paused: None,
            request: None,
            result: Some(Outcome::Failed),
            attempt: Some(2),
            retry: Some(RetryNote::AtMs(1_767_225_915_000)),
            replaced_by: Some(1_767_225_960_000),
            output: Some("line one\n\u{1b}[31mred\u{1b}[0m \"quoted\" ünïcode\n".into()),
        };
        let json = run.to_json();
        assert!(json.contains("\"token\":\"9007199254740993\""), "{json}");
        assert!(json.contains("\"outcome\":\"failed\""), "{json}");
        assert!(json.contains("\"trigger\":\"catch-up\""), "{json}");
        assert_eq!(RunRecord::from_json(&json).unwrap(), run);
        assert_eq!(run.duration(), Some(Duration::from_millis(1_500)));
        assert!(json.contains("\"attempt\":2"), "{json}");
        assert!(
            json.contains("\"retry\":{\"at_ms\":1767225915000}"),
            "{json}"
        );
        assert_eq!(
            run.key(),
            1_767_225_913_000,
            "a retry is filed under its start"
        );
        let first = RunRecord {
            attempt: None,
            ..run.clone()
        };
        assert_eq!(first.key(), 1_767_225_900_000);
        assert_eq!(first.attempt(), 1);
        let missed = RunRecord {
            slot: Some(10),
            trigger: None,
            holder: "h".into(),
            token: None,
            started_ms: None,
            ended_ms: None,
            outcome: RunOutcome::Missed {
                count: 3,
                last_slot: 30,
                reason: MissReason::StoreDown,
            },
            schedule: None,
            paused: None,
            request: None,
            result: None,
            attempt: None,
            retry: None,
            output: None,
            replaced_by: None,
        };
        assert_eq!(RunRecord::from_json(&missed.to_json()).unwrap(), missed);
        assert!(matches!(
            RunRecord::from_json("{\"holder\":1}"),
            Err(StoreError::Corrupt(_))
        ));
    }

    /// A run recorded as running reads as running while its lease is held with its token, and
    /// as lost once that tenure is gone (its instance died before recording the end).
    #[tokio::test(start_paused = true)]
    async fn a_running_record_whose_lease_is_gone_reads_lost() {
        use crate::store::Acquisition;
        use crate::store::memory::MemoryStore;
        use crate::store::name::HolderId;
        use crate::store::traits::Store;
        let store = MemoryStore::new();
        let task = LeaseName::new("sweep").unwrap();
        let who = HolderId::new("a").unwrap();
        let ttl = Duration::from_secs(10);
        let Acquisition::Acquired { token } = store.acquire(&task, &who, ttl).await.unwrap() else {
            panic!("a free lease");
        };
        let run = RunRecord::started(Some(5), RecordTrigger::Timer, "a", Some(token), 1, None);
        store
            .record_history(&task, 5, &run.to_json(), 10)
            .await
            .unwrap();
        let ungated = RunRecord::started(Some(6), RecordTrigger::Timer, "b", None, 2, None);
        store
            .record_history(&task, 6, &ungated.to_json(), 10)
            .await
            .unwrap();
        let outcomes = |records: Vec<RunRecord>| -> Vec<RunOutcome> {
            records.into_iter().map(|r| r.outcome).collect()
        };
        let now = outcomes(read(&store, &task, 10).await.unwrap());
        assert_eq!(now, [RunOutcome::Running, RunOutcome::Running]);
        tokio::time::sleep(ttl + Duration::from_secs(1)).await;
        let later = outcomes(read(&store, &task, 10).await.unwrap());
        assert_eq!(
            later,
            [RunOutcome::Running, RunOutcome::Interrupted],
            "ungated runs are not judged"
        );
    }

    /// A gap between the newest slot the history accounts for and a newly granted one is
    /// reported once, from its first to its last slot; no gap, or no history, is none.
    #[tokio::test]
    async fn a_gap_before_a_granted_slot_is_the_slots_nobody_accounted_for() {
        use crate::scheduling::schedule::Schedule;
        use crate::store::memory::MemoryStore;
        let store = MemoryStore::new();
        let task = LeaseName::new("sweep").unwrap();
        let every_10 = Schedule::every(Duration::from_millis(10)).unwrap();
        let none = gap_before(&store, &task, &every_10, 100, "me")
            .await
            .unwrap();
        assert_eq!(none, None, "no history: nothing to compare with");
        let run = RunRecord::started(Some(100), RecordTrigger::Timer, "a", None, 100, None);
        store
            .record_history(&task, 100, &run.to_json(), 10)
            .await
            .unwrap();
        assert_eq!(
            gap_before(&store, &task, &every_10, 110, "me")
                .await
                .unwrap(),
            None
        );
        let gap = gap_before(&store, &task, &every_10, 150, "me")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(gap.slot, Some(110));
        assert_eq!(
            gap.outcome,
            RunOutcome::Missed {
                count: 4,
                last_slot: 140,
                reason: MissReason::NotClaimed
            }
        );
        // Once recorded, the gap is accounted for.
        store
            .record_history(&task, 110, &gap.to_json(), 10)
            .await
            .unwrap();
        assert_eq!(
            gap_before(&store, &task, &every_10, 150, "me")
                .await
                .unwrap(),
            None
        );
    }
}
