//! Gated ticks for applications that keep their own timer: which slot a tick belongs to, whether
//! this caller runs it, and the end of the run.
//!
//! A tick follows the scheduler's gate (crates/leasehold's `Scheduler`): the store's clock names
//! the slot, the task lease excludes overlapping runs, the forward-only slot claim lets exactly
//! one caller per slot run it, and the run holds the task lease until the application says it is
//! done (or goes silent). Lease and slot names are the task's own, so `leasehold history` and
//! `leasehold run` on the same task see the same runs.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use leasehold::catalog::TaskSource;
use leasehold::gate::{Gate, Skip, Ticket};
use leasehold::history::{
    MAX_HISTORY_SETTING, RecordTrigger, RecordedSchedule, RunOutcome, RunRequest,
};
use leasehold::lifecycle::{Fired, Overlapping, TaskPlan, TaskTicks};
use leasehold::policy::{MAX_JITTER, MAX_RETRIES};
use leasehold::presence::idle_expiry;
use leasehold::{
    Backoff, BoxStore, CatchUp, HolderId, Lease, LeaseConfig, LeaseGuard, LeaseName, OnInterrupt,
    Overlap, RunPolicy, Schedule, ScheduleError, Store, StoreDownPolicy, Trigger, TryAcquire,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::error::{ApiError, EndReason, in_range, not_null, parse};
use crate::held::{Found, Grant, RunInfo, ms};
use crate::leases::{instance_field, keepalive, lease_config, lease_name, name_field, token};
use crate::owed::{Owed, OwedRun};
use crate::sidecar::Sidecar;

/// The task lease's ttl when a tick does not say.
const DEFAULT_TICK_TTL_MS: u64 = 30_000;
/// The longest interval: a leap year.
const MAX_EVERY_MS: u64 = 31_622_400_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TickRequest {
    #[serde(default, deserialize_with = "not_null")]
    every_ms: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    cron: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    time_zone: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    group: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    ttl_ms: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    keepalive_ms: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    on_store_down: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    catch_up_window_ms: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    instance: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    retries: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    retry_backoff_ms: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    retry_backoff_max_ms: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    overlap: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    jitter_ms: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    on_interrupt: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    history: Option<u64>,
}

/// How many of a task's newest history entries a retry is checked against: its slot's
/// attempts, and a few slots' more.
const RETRY_LOOK: usize = 12;

/// The longest retry backoff: a day.
const MAX_BACKOFF_MS: u64 = 86_400_000;

/// The task's run policies as a tick gives them: timeout, retries, overlap, jitter, what
/// becomes of a cut-off run. Each value is checked here, naming its field.
fn run_policy(request: &TickRequest) -> Result<RunPolicy, ApiError> {
    let mut policy = RunPolicy::default();
    if let Some(timeout) = request.timeout_ms {
        let timeout = in_range("timeout_ms", timeout, 1..=MAX_EVERY_MS)?;
        policy = policy.timeout(Some(Duration::from_millis(timeout)));
    }
    if let Some(retries) = request.retries {
        let retries = in_range("retries", retries, 0..=u64::from(MAX_RETRIES))?;
        policy = policy.retries(u32::try_from(retries).unwrap_or(MAX_RETRIES));
    }
    let base = request
        .retry_backoff_ms
        .map(|b| in_range("retry_backoff_ms", b, 1..=MAX_BACKOFF_MS))
        .transpose()?;
    let max = request
        .retry_backoff_max_ms
        .map(|m| {
            in_range(
                "retry_backoff_max_ms",
                m,
                base.unwrap_or(1)..=MAX_BACKOFF_MS,
            )
        })
        .transpose()?;
    if base.is_some() || max.is_some() {
        let base = base.map_or(Backoff::default().base, Duration::from_millis);
        policy = policy.backoff(Backoff::new(base, max.map(Duration::from_millis)));
    }
    if let Some(jitter) = request.jitter_ms {
        let most = ms(MAX_JITTER);
        let jitter = in_range("jitter_ms", jitter, 0..=most)?;
        policy = policy.jitter(Some(Duration::from_millis(jitter)));
    }
    if let Some(overlap) = &request.overlap {
        let overlap =
            Overlap::from_str(overlap).map_err(|e| ApiError::field("overlap", e.to_string()))?;
        if !matches!(overlap, Overlap::Skip | Overlap::Allow) {
            // The application runs the job, not the sidecar: it can neither hold a slot back
            // for the run's end (nor answer a tick later) nor stop the run for a newer slot.
            return Err(ApiError::field(
                "overlap",
                format!(
                    "overlap {overlap} cannot be honoured for a tick: the application, not the \
                     sidecar, runs the job; use skip (a tick while a run is held answers busy, \
                     and a later tick of the slot runs it once that run ended) or allow (the \
                     slot runs beside it, under a run lease of its own)"
                ),
            ));
        }
        policy = policy.overlap(overlap);
    }
    if let Some(on_interrupt) = &request.on_interrupt {
        let on_interrupt =
            OnInterrupt::from_str(on_interrupt).map_err(|e| ApiError::field("on_interrupt", e))?;
        policy = policy.on_interrupt(on_interrupt);
    }
    Ok(policy)
}

#[derive(Serialize, Default)]
pub(crate) struct TickResponse {
    run: bool,
    task: String,
    slot: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trigger: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    /// The lease to keep alive, when not the task's: a run beside another (overlap allow).
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    valid_for_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    keepalive_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    starts_in_ms: Option<u64>,
}

fn schedule(request: &TickRequest) -> Result<(Schedule, RecordedSchedule), ApiError> {
    if request.time_zone.is_some() && request.cron.is_none() {
        return Err(ApiError::field(
            "time_zone",
            "time_zone goes with cron (every_ms slots are the same in every zone)",
        ));
    }
    match (&request.every_ms, &request.cron) {
        (Some(every), None) => {
            let every = in_range("every_ms", *every, 1..=MAX_EVERY_MS)?;
            let schedule = Schedule::every(Duration::from_millis(every))
                .map_err(|e| ApiError::field("every_ms", e.to_string()))?;
            Ok((schedule, RecordedSchedule::EveryMs(every)))
        }
        (None, Some(expr)) => {
            if expr.len() > 200 {
                return Err(ApiError::field("cron", "cron must be at most 200 bytes"));
            }
            let schedule = match &request.time_zone {
                Some(zone) if zone.len() > 64 => {
                    return Err(ApiError::field(
                        "time_zone",
                        "time_zone must be at most 64 bytes",
                    ));
                }
                Some(zone) => Schedule::cron_in(expr, zone),
                None => Schedule::cron(expr),
            }
            .map_err(|e| match e {
                ScheduleError::UnknownZone { .. } => ApiError::field("time_zone", e.to_string()),
                e => ApiError::field("cron", e.to_string()),
            })?;
            // With its zone (`CRON_TZ=ZONE ...`), so readers of the history find the same slots.
            let recorded = RecordedSchedule::of(&schedule);
            Ok((schedule, recorded))
        }
        (Some(_), Some(_)) => Err(ApiError::field(
            "cron",
            "give either every_ms or cron, not both",
        )),
        (None, None) => Err(ApiError::field(
            "every_ms",
            "give the task's schedule: every_ms or cron",
        )),
    }
}

pub(crate) async fn tick(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TickResponse>, ApiError> {
    let arrival = Instant::now();
    let task = lease_name("task", &task)?;
    let request: TickRequest = parse(body)?;
    let (schedule, recorded) = schedule(&request)?;
    let ttl_ms = request.ttl_ms.unwrap_or(DEFAULT_TICK_TTL_MS);
    let config = lease_config(ttl_ms)?;
    let keepalive = keepalive(request.keepalive_ms, ttl_ms)?;
    let group = request
        .group
        .as_deref()
        .map(|g| name_field("group", g))
        .transpose()?;
    let instance = request
        .instance
        .as_deref()
        .map(instance_field)
        .transpose()?;
    let shared = &sidecar.0;
    let policy = match &request.on_store_down {
        Some(p) => StoreDownPolicy::from_str(p)
            .map_err(|e| ApiError::field("on_store_down", e.to_string()))?,
        None => shared.on_store_down,
    };
    let run_policy = run_policy(&request)?;
    let history = request
        .history
        .map(|n| in_range("history", n, 1..=MAX_HISTORY_SETTING as u64))
        .transpose()?;
    let mut plan = TaskPlan::new(schedule.clone())
        .on_store_down(policy)
        .run_policy(run_policy);
    if let Some(window) = request.catch_up_window_ms {
        let window = in_range("catch_up_window_ms", window, 0..=MAX_EVERY_MS)?;
        plan = plan.catch_up(match window {
            0 => CatchUp::Skip,
            ms => CatchUp::Latest {
                window: Duration::from_millis(ms),
            },
        });
    }
    let answer = |run: bool, slot: Option<u64>, reason: Option<&'static str>| TickResponse {
        run,
        task: task.to_string(),
        slot,
        reason,
        ..TickResponse::default()
    };

    // The task's life between ticks (slot naming, missed slots, triggers, store-down policy)
    // is the core's; here only what the request says and what the answer carries.
    let ticks = &shared.ticked;
    let interval = plan.interval_near(ticks.store_now_or_wall());
    let idle = idle_expiry(interval, config.ttl);
    let definition = plan.definition(TaskSource::Sidecar, true, group.as_ref(), None);
    // The application replica that ticks is the task's instance (each with its own idle
    // expiry); a tick that names none is the sidecar's own.
    match &instance {
        Some(instance) => {
            shared
                .presence
                .keep_for(&task, instance, &definition, config, Some(idle))
        }
        None => shared.presence.keep(&task, &definition, config, Some(idle)),
    };
    let holder = shared.holder_id(instance.as_ref().map(HolderId::as_str));
    let lease = Lease::held_as(shared.store.clone(), task.clone(), config, holder)
        .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?;
    let mut gate = Gate::new(lease).recording(shared.history.clone());
    if let Some(group) = &group {
        let campaign = shared
            .campaigns
            .campaign(group, config, interval)
            .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?;
        gate = gate.led_by(campaign);
    }
    if let Some(keep) = history {
        shared
            .history
            .keep_for(&task, usize::try_from(keep).unwrap_or(MAX_HISTORY_SETTING));
    }
    let task_ticks = ticks.fired(&task, idle);
    // Each slot's start put off by the task's jitter, alike on every instance: on the store's
    // clock (read once if this sidecar has no estimate of it yet; an unreachable store is the
    // gate's to answer).
    let estimate = match task_ticks.store_now() {
        Some(now) => Some(now),
        None if run_policy.jitter.is_some() => shared.store.now_millis().await.ok(),
        None => None,
    };
    if let Some(estimate) = estimate
        && let Some(due) = schedule.latest_at_or_before(estimate)
    {
        let starts = due.saturating_add(ms(run_policy.start_delay(&task, &schedule, due)));
        if estimate < starts {
            return Ok(Json(TickResponse {
                starts_in_ms: Some(starts - estimate),
                ..answer(false, Some(due), Some("not-due"))
            }));
        }
    }
    let plan = Arc::new(plan);
    let fired = task_ticks.fire(&gate, &plan, None).await;
    shared.saw_store(matches!(fired, Fired::StoreDown { .. }));
    let now = ticks.store_now_or_wall();
    let starts_in = |next: Option<u64>| next.map(|next| next.saturating_sub(now));
    let grant = Granting {
        sidecar: &sidecar,
        task: &task,
        arrival,
        keepalive,
        config,
        started_ms: now,
        schedule: &recorded,
        ticks: &task_ticks,
        plan: &plan,
    };
    Ok(Json(match fired {
        // The slot due runs first; a slot whose run was cut off is looked for by the ticks
        // whose slot already ran (`Granting::owed`).
        Fired::Run(ticket) => grant.run(ticket).await,
        Fired::Skipped {
            slot,
            skip: Skip::AlreadyRun { last },
        } => match grant.owed(&gate, last).await {
            Some(answer) => answer,
            None => answer(false, Some(slot), Some("already-run")),
        },
        Fired::Skipped {
            slot,
            skip: Skip::Busy { .. } | Skip::Overlap,
        } if plan.run_policy.overlap == Overlap::Allow => {
            // Beside the run going, under a run lease of its own; the slot still claimed once.
            let beside = match task_ticks.overlapping(&plan, slot).await {
                Overlapping::Beside => task_ticks.claim_beside(&gate, &plan, slot).await,
                _ => None,
            };
            match beside {
                Some(guard) => grant.hold(guard, slot, RecordTrigger::Timer, None, 1).await,
                None => answer(false, Some(slot), Some("busy")),
            }
        }
        Fired::Skipped { slot, skip } => {
            let reason = match skip {
                // The claim took so long that the lease is expiring: the slot stays claimed
                // but unrun, rather than run by a holder about to lose it.
                Skip::Expiring => "store-down",
                Skip::Overlap => "busy",
                other => other.as_str(),
            };
            answer(false, Some(slot), Some(reason))
        }
        Fired::NotDue { next } => TickResponse {
            starts_in_ms: starts_in(next),
            ..answer(false, None, Some("not-due"))
        },
        Fired::Early { slot, starts_in } => TickResponse {
            starts_in_ms: Some(ms(starts_in)),
            ..answer(false, Some(slot), Some("not-due"))
        },
        Fired::StoreDown { slot, runs, error } => {
            tracing::warn!(task = %task, %error, %policy, "store unreachable for a tick");
            if runs {
                TickResponse {
                    gated: Some(false),
                    ..answer(true, slot, None)
                }
            } else {
                answer(false, slot, Some("store-down"))
            }
        }
        Fired::Refused { error, .. } => return Err(ApiError::store(&error.into())),
        // A firing this release does not know how to answer runs nothing.
        _ => answer(false, None, Some("not-due")),
    }))
}

/// What a granted tick answers with, and holds for the application.
struct Granting<'a> {
    sidecar: &'a Sidecar,
    task: &'a LeaseName,
    arrival: Instant,
    keepalive: Duration,
    config: LeaseConfig,
    started_ms: u64,
    schedule: &'a RecordedSchedule,
    ticks: &'a Arc<TaskTicks>,
    plan: &'a Arc<TaskPlan>,
}

impl Granting<'_> {
    /// Holds `ticket`'s task lease for the application's run and answers the grant.
    async fn run(&self, ticket: Ticket) -> TickResponse {
        let slot = ticket.slot();
        let trigger = match ticket.trigger() {
            Trigger::Manual => RecordTrigger::Manual,
            Trigger::CatchUp => RecordTrigger::CatchUp,
            _ => RecordTrigger::Timer,
        };
        let request = ticket.request().map(|r| RunRequest {
            id: r.id.clone(),
            by: r.by.clone(),
        });
        if let Some(request) = &request {
            tracing::info!(task = %self.task, id = %request.id, by = %request.by, "manual run asked for through the catalog");
        }
        self.hold(ticket.into_guard(), slot, trigger, request, 1)
            .await
    }

    /// A tick whose slot already ran (`last` the newest claimed): the run owed to the task
    /// (a retry, or a slot whose run was cut off), if one is due and the task lease is free.
    /// Cut-off runs are looked for in the history under the task lease, each time afresh (so
    /// two sidecars never both run one again), when the core says the history may hold one;
    /// a retry is checked there too (a slot run again elsewhere meanwhile is not run again
    /// here). `None`: the tick answers `already-run`.
    async fn owed(&self, gate: &Gate<BoxStore>, last: u64) -> Option<TickResponse> {
        let owed = &self.sidecar.0.registry.owed;
        let run = match owed.take(self.task, self.started_ms) {
            Owed::Due(run) => Some(run),
            Owed::Waits(run, wait) => {
                return Some(TickResponse {
                    starts_in_ms: Some(wait),
                    ..self.answer(false, run.slot, Some("not-due"))
                });
            }
            Owed::Nothing if self.ticks.may_have_cut_off().await => None,
            Owed::Nothing => return None,
        };
        let guard = match gate.lease().try_acquire().await {
            Ok(TryAcquire::Acquired(guard)) => guard,
            Ok(TryAcquire::Busy { .. }) | Err(_) => {
                if let Some(run) = run {
                    owed.owe(self.task, run, self.started_ms);
                }
                return None;
            }
        };
        // The ends of runs this sidecar heard of are in the store before it looks.
        let limit = self.config.renew_interval;
        self.sidecar.0.history.flush(limit).await;
        let run = match run {
            Some(run) if self.retry_still_due(gate, &run).await => Some(run),
            Some(_) => None,
            None => {
                let found = self
                    .ticks
                    .cut_off_before(gate, self.plan, last.saturating_add(1), guard.token())
                    .await;
                if found.len() > 1 {
                    // The others are found again by the next look.
                    self.ticks.run_cut_off().await;
                }
                found.first().map(|rerun| OwedRun {
                    slot: rerun.slot,
                    attempt: rerun.attempt,
                    trigger: rerun.trigger,
                    from_ms: self.started_ms,
                    until_ms: u64::MAX,
                })
            }
        };
        let Some(run) = run else {
            release(guard).await;
            return None;
        };
        if self.beside_still_going(gate, run.slot).await {
            release(guard).await;
            return None;
        }
        tracing::info!(task = %self.task, slot = run.slot, attempt = run.attempt, "running a slot again");
        Some(
            self.hold(guard, run.slot, run.trigger, None, run.attempt)
                .await,
        )
    }

    /// Whether the history still shows `retry`'s slot at the attempt before it: not run again
    /// meanwhile by another sidecar (as a cut-off run). A history that cannot be read is
    /// taken for yes (the retry is this sidecar's to run).
    async fn retry_still_due(&self, gate: &Gate<BoxStore>, retry: &OwedRun) -> bool {
        let limit = self.config.renew_interval;
        let history = leasehold::history::read(gate.lease().store(), self.task, RETRY_LOOK);
        let Ok(Ok(records)) = tokio::time::timeout(limit, history).await else {
            return true;
        };
        !records
            .iter()
            .any(|r| r.slot == Some(retry.slot) && r.attempt() >= retry.attempt)
    }

    /// Under overlap `allow`, whether `slot`'s run beside another still holds its run lease:
    /// its `running` record is under that lease's token, which the task lease's tenure does not
    /// order, so the history alone would take it for cut off. A store that does not answer is
    /// taken for yes (the slot is looked at again by a later tick).
    async fn beside_still_going(&self, gate: &Gate<BoxStore>, slot: u64) -> bool {
        if self.plan.run_policy.overlap != Overlap::Allow {
            return false;
        }
        let Ok(lease) = LeaseName::new(format!("{}/slot/{slot}", self.task)) else {
            return false;
        };
        let limit = self.config.renew_interval;
        match tokio::time::timeout(limit, gate.lease().store().inspect(&lease)).await {
            Ok(Ok(state)) => state.is_some_and(|s| s.holder.is_some()),
            _ => true,
        }
    }

    fn answer(&self, run: bool, slot: u64, reason: Option<&'static str>) -> TickResponse {
        TickResponse {
            run,
            task: self.task.to_string(),
            slot: Some(slot),
            reason,
            ..TickResponse::default()
        }
    }

    /// Holds `guard` (the task lease) for the application's run of `slot`, attempt `attempt`,
    /// and answers the grant.
    async fn hold(
        &self,
        guard: LeaseGuard,
        slot: u64,
        trigger: RecordTrigger,
        request: Option<RunRequest>,
        attempt: u32,
    ) -> TickResponse {
        let token = guard.token();
        let lease = (guard.name() != self.task).then(|| guard.name().to_string());
        let entry = self.sidecar.0.registry.insert(Grant {
            guard,
            keepalive: self.keepalive,
            stop_margin: self.config.stop_margin,
            granted: Instant::now(),
            run: Some(RunInfo {
                task: self.task.clone(),
                slot,
                trigger,
                request,
                started_ms: self.started_ms,
                started_at: self.arrival,
                schedule: self.schedule.clone(),
                attempt,
                ticks: self.ticks.clone(),
                plan: self.plan.clone(),
            }),
            timeout: self.plan.run_policy.timeout,
        });
        let answer = TickResponse {
            run: true,
            task: self.task.to_string(),
            slot: Some(slot),
            ..TickResponse::default()
        };
        let Ok(valid_for_ms) = entry.valid_for_ms(self.arrival) else {
            let _ = entry.end(EndReason::Expired).await;
            return TickResponse {
                run: false,
                reason: Some("store-down"),
                ..answer
            };
        };
        TickResponse {
            gated: Some(true),
            // What the runner's command sees in LEASEHOLD_TRIGGER and LEASEHOLD_ATTEMPT.
            trigger: Some(match trigger {
                _ if attempt > 1 => "retry",
                RecordTrigger::Manual => "manual",
                RecordTrigger::CatchUp => "catch-up",
                _ => "timer",
            }),
            attempt: Some(attempt),
            lease,
            token: Some(token.to_string()),
            valid_for_ms: Some(valid_for_ms),
            keepalive_ms: Some(ms(self.keepalive)),
            ..answer
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum Outcome {
    Ok,
    Failed,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DoneRequest {
    token: String,
    outcome: Outcome,
    #[serde(default, deserialize_with = "not_null")]
    error: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    output: Option<String>,
}

pub(crate) async fn done(
    State(sidecar): State<Sidecar>,
    Path((task, slot)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<crate::leases::Released>, ApiError> {
    let task = lease_name("task", &task)?;
    // Slots are milliseconds since the epoch: an int64 in the API document.
    let slot: u64 = slot
        .parse::<i64>()
        .ok()
        .and_then(|s| u64::try_from(s).ok())
        .ok_or_else(|| ApiError::field("slot", "slot must be a number as granted by the tick"))?;
    let request: DoneRequest = parse(body)?;
    let token = token(&request.token)?;
    let shared = &sidecar.0;
    // A run beside another (overlap allow) holds its own run lease, named after its slot.
    let beside = LeaseName::new(format!("{task}/slot/{slot}")).ok();
    let found = match shared.registry.get(&task, token) {
        Found::Unknown => match &beside {
            Some(lease) => shared.registry.get(lease, token),
            None => Found::Unknown,
        },
        found => found,
    };
    let entry = match found {
        Found::Live(entry) => entry,
        Found::Ended(reason) => return Err(ApiError::lost(reason)),
        Found::Unknown => return Ok(crate::leases::released(false)),
    };
    // Accepted once, and only while the run's lease is held: a run that was lost (and recorded
    // so) or already reported stays as it is.
    entry.close(EndReason::Released).map_err(ApiError::lost)?;
    match &entry.run {
        Some(run) if run.slot == slot => {}
        _ => {
            return Err(ApiError::field(
                "slot",
                "this token was not granted for a run of that slot",
            ));
        }
    }
    // The error text is kept as the application wrote it (a command's stderr, newlines and
    // all), cut to `leasehold::text::FAILURE`'s limit when recorded, and shown escaped.
    let outcome = match request.outcome {
        Outcome::Ok => RunOutcome::Ok,
        Outcome::Failed => RunOutcome::Failed {
            error: request.error.unwrap_or_default(),
        },
    };
    // The output as written, its end kept (`leasehold::text::OUTPUT`) when recorded; shown
    // escaped. A failed attempt with retries left is owed to the task's next ticks. Recorded
    // while the task lease is still held, so the next holder sees it.
    shared
        .registry
        .end_run(&entry, outcome, None, request.output)
        .await;
    let released = entry.end(EndReason::Released).await.map_err(|e| {
        ApiError::store_down(format!(
            "the run is over here, but the store could not be told ({e}): its lease expires \
             there after its ttl, and its outcome is recorded once the store answers"
        ))
    })?;
    Ok(crate::leases::released(released))
}

async fn release(guard: LeaseGuard) {
    if let Err(e) = guard.release().await {
        tracing::debug!(error = %e, "task lease not released after a look for cut-off runs; it expires after its ttl");
    }
}
