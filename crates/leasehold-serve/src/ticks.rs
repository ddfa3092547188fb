//! Gated ticks for applications that keep their own timer: which slot a tick belongs to, whether
//! this caller runs it, and the end of the run.
//!
//! A tick follows the scheduler's gate (crates/leasehold's `Scheduler`): the store's clock names
//! the slot, the task lease excludes overlapping runs, the forward-only slot claim lets exactly
//! one caller per slot run it, and the run holds the task lease until the application says it is
//! done (or goes silent). Lease and slot names are the task's own, so `leasehold history` and
//! `leasehold run` on the same task see the same runs.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use leasehold::catalog::{Control, TaskDefinition, TaskSource};
use leasehold::gate::{Decision, Due, Gate, Reading, Skip, Ticket};
use leasehold::history::{self, RecordTrigger, RecordedSchedule, RunOutcome, RunRequest};
use leasehold::{Lease, LeaseConfig, LeaseName, Schedule, ScheduleError, StoreDownPolicy, Trigger};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::Sidecar;
use crate::error::{ApiError, EndReason, in_range, not_null, parse};
use crate::held::{Found, Grant, RunInfo, ms};
use crate::leases::{keepalive, lease_config, lease_name, token};

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
    token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    valid_for_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    keepalive_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
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

fn wall_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, ms)
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
        .map(|g| lease_name("group", g))
        .transpose()?;
    let shared = &sidecar.0;
    let policy = match &request.on_store_down {
        Some(p) => StoreDownPolicy::from_str(p)
            .map_err(|e| ApiError::field("on_store_down", e.to_string()))?,
        None => shared.on_store_down,
    };
    let answer = |run: bool, slot: Option<u64>, reason: Option<&'static str>| TickResponse {
        run,
        task: task.to_string(),
        slot,
        reason,
        ..TickResponse::default()
    };
    // What the policy says while the store cannot answer; the slot then is the local clock's.
    let store_down = |e: &dyn std::fmt::Display| {
        tracing::warn!(task = %task, error = %e, %policy, "store unreachable for a tick");
        let slot = schedule.latest_at_or_before(wall_millis());
        if policy.runs_when_down() {
            TickResponse {
                gated: Some(false),
                ..answer(slot.is_some(), slot, slot.is_none().then_some("not-due"))
            }
        } else {
            answer(false, slot, Some("store-down"))
        }
    };

    // The gate decides, as the scheduler's does: the store's clock (with the task's control
    // record) names the slot, then leadership, pause, task lease, slot claim; in one store
    // round trip where the store can (the slot named from the store's clock as last read).
    let holder = shared.holder_id(None);
    let lease = Lease::held_as(shared.store.clone(), task.clone(), config, holder)
        .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?;
    let mut gate = Gate::new(lease).recording(shared.history.clone());
    // How long ticks may stop before this sidecar gives up the group and the catalog entry:
    // the interval between the slots around the store's clock as last read.
    let near = shared.clock.now_ms().unwrap_or_else(wall_millis);
    let interval = schedule
        .latest_at_or_before(near)
        .and_then(|slot| Some(schedule.next_after(slot)? - slot))
        .map_or(Duration::ZERO, Duration::from_millis);
    let definition = TaskDefinition {
        source: TaskSource::Sidecar,
        schedule: schedule.to_string(),
        time_zone: schedule.time_zone().map(str::to_owned),
        on_store_down: policy.as_str().to_owned(),
        catch_up: None,
        gated: true,
        leader_group: group.as_ref().map(ToString::to_string),
        spread_group: None,
    };
    let idle = interval.saturating_mul(2) + config.ttl;
    shared.catalog.ticked(&task, &definition, config.ttl, idle);
    if let Some(group) = &group {
        let campaign = shared
            .campaigns
            .campaign(group, config, interval)
            .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?;
        gate = gate.led_by(campaign);
    }
    let granting = |started_ms| Granting {
        sidecar: &sidecar,
        task: &task,
        arrival,
        keepalive,
        config,
        started_ms,
        schedule: &recorded,
    };
    // A trigger this sidecar's last tick of the task left pending (its timer slot ran then) is
    // taken first, before the timer slot is decided: an application ticks about once per slot,
    // and on the only instance every tick's slot is due, so a trigger that waited for a tick
    // whose slot does not run would lapse. The slot given up runs elsewhere or is recorded as
    // missed at the next grant.
    let mut asked_first = false;
    if shared.catalog.trigger_waits(&task)
        && let Ok(reading) = gate.read_clock().await
    {
        match pending(&reading) {
            None => shared.catalog.passed_over(&task, false),
            Some((control, version)) => {
                asked_first = true;
                if let Some(ticket) = take(&gate, control, version, reading.now_ms).await {
                    shared.catalog.passed_over(&task, false);
                    return Ok(Json(granting(reading.now_ms).run(ticket).await));
                }
            }
        }
    }
    let due = gate.decide_due(&schedule, &shared.clock).await;
    shared.saw_store(matches!(&due, Err(e) if e.is_transient()));
    let (reading, decided) = match due {
        Ok(Due::Decided {
            reading,
            slot,
            decision,
        }) => (reading, Some((slot, decision))),
        Ok(Due::NotDue(reading)) => (reading, None),
        Err(e) if e.is_transient() => return Ok(Json(store_down(&e))),
        Err(e) => return Err(ApiError::store(&e.into())),
    };
    let grant = granting(reading.now_ms);
    // A manual run asked for through the catalog (`leasehold trigger`) is taken by a tick
    // whose timer slot does not run here: the application hears of it only when it ticks, and
    // a trigger waits at most one tick rather than cost a timer slot (see above).
    let timer_runs = matches!(decided, Some((_, Decision::Run(_))));
    if let Some((control, version)) = pending(&reading) {
        if timer_runs {
            shared.catalog.passed_over(&task, true);
        } else if !asked_first
            && let Some(ticket) = take(&gate, control, version, reading.now_ms).await
        {
            shared.catalog.passed_over(&task, false);
            return Ok(Json(grant.run(ticket).await));
        }
    }
    let Some((slot, decision)) = decided else {
        return Ok(Json(answer(false, None, Some("not-due"))));
    };
    let ticket = match decision {
        Decision::Run(ticket) => ticket,
        Decision::Skip(skip) => {
            shared.saw_store(matches!(skip, Skip::StoreDown(_)));
            let reason = match skip {
                Skip::StoreDown(e) => return Ok(Json(store_down(&e))),
                Skip::Refused(e) => return Err(ApiError::store(&e.into())),
                // The claim took so long that the lease is expiring: the slot stays claimed
                // but unrun, rather than run by a holder about to lose it.
                Skip::Expiring => "store-down",
                Skip::Overlap => "busy",
                other => other.as_str(),
            };
            return Ok(Json(answer(false, Some(slot), Some(reason))));
        }
    };
    // The previous firing was not granted here: record the slots nobody accounted for (a
    // crash, an outage, every instance down), as the scheduler's timer does.
    let previous = slot
        .checked_sub(1)
        .and_then(|s| schedule.latest_at_or_before(s));
    if previous.is_some() && shared.catalog.granted(&task, slot) != previous {
        record_gap(&sidecar, &task, &schedule, slot);
    }
    Ok(Json(grant.run(ticket).await))
}

/// Takes the pending trigger of `control` (at `version`) if this instance may run the task now.
async fn take(
    gate: &Gate<leasehold::BoxStore>,
    control: &Control,
    version: u64,
    now_ms: u64,
) -> Option<Ticket> {
    match gate.take_trigger(control, version, now_ms).await {
        Ok(ticket) => ticket,
        Err(e) => {
            tracing::debug!(task = %gate.lease().name(), error = %e, "manual trigger not taken");
            None
        }
    }
}

/// The manual trigger `reading`'s control record holds, not yet lapsed, with the record's
/// version.
fn pending(reading: &Reading) -> Option<(&Control, u64)> {
    let control = reading.control.as_ref()?;
    let trigger = control.trigger.as_ref()?;
    (trigger.expires_ms > reading.now_ms).then_some((control, reading.control_version?))
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
}

impl Granting<'_> {
    /// Holds `ticket`'s task lease for the application's run and answers the grant.
    async fn run(&self, ticket: Ticket) -> TickResponse {
        let slot = ticket.slot();
        let trigger = match ticket.trigger() {
            Trigger::Manual => RecordTrigger::Manual,
            _ => RecordTrigger::Timer,
        };
        let request = ticket.request().map(|r| RunRequest {
            id: r.id.clone(),
            by: r.by.clone(),
        });
        if let Some(request) = &request {
            tracing::info!(task = %self.task, id = %request.id, by = %request.by, "manual run asked for through the catalog");
        }
        let guard = ticket.into_guard();
        let token = guard.token();
        let entry = self.sidecar.0.registry.insert(Grant {
            guard,
            keepalive: self.keepalive,
            stop_margin: self.config.stop_margin,
            granted: Instant::now(),
            run: Some(RunInfo {
                slot,
                trigger,
                request,
                started_ms: self.started_ms,
                started_at: self.arrival,
                schedule: self.schedule.clone(),
            }),
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
            trigger: Some(if trigger == RecordTrigger::Manual {
                "manual"
            } else {
                "timer"
            }),
            token: Some(token.to_string()),
            valid_for_ms: Some(valid_for_ms),
            keepalive_ms: Some(ms(self.keepalive)),
            ..answer
        }
    }
}

/// Records, in the background, the slots of `task` before `slot` that its history does not
/// account for.
fn record_gap(sidecar: &Sidecar, task: &LeaseName, schedule: &Schedule, slot: u64) {
    let shared = sidecar.0.clone();
    let (task, schedule) = (task.clone(), schedule.clone());
    tokio::spawn(async move {
        let holder = shared.holder.clone();
        let gap = history::gap_before(&shared.store, &task, &schedule, slot, &holder);
        match leasehold::store::within(crate::HISTORY_WRITE_LIMIT, gap).await {
            Ok(Some(record)) => shared.history.record(&task, record),
            Ok(None) => {}
            Err(e) => tracing::debug!(task = %task, error = %e, "missed slots not looked for"),
        }
    });
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
    if request.error.as_ref().is_some_and(|e| e.len() > 2000) {
        return Err(ApiError::field("error", "error must be at most 2000 bytes"));
    }
    let shared = &sidecar.0;
    let entry = match shared.registry.get(&task, token) {
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
    let released = entry.end(EndReason::Released).await.map_err(|e| {
        ApiError::store_down(format!(
            "the run is over here, but the store could not be told ({e}): its lease expires \
             there after its ttl, and the outcome is not in the history"
        ))
    })?;
    let outcome = match request.outcome {
        Outcome::Ok => RunOutcome::Ok,
        Outcome::Failed => RunOutcome::Failed {
            error: request.error.unwrap_or_default(),
        },
    };
    if let Some(record) = entry.run_record(outcome) {
        shared.registry.record(&task, record);
    }
    Ok(crate::leases::released(released))
}
