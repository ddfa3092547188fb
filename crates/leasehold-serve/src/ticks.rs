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
use leasehold::gate::{Decision, Due, Gate, Skip};
use leasehold::history::{RecordedSchedule, RunOutcome};
use leasehold::{Lease, Schedule, ScheduleError, StoreDownPolicy};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::Sidecar;
use crate::error::{ApiError, EndReason, in_range, not_null, parse};
use crate::held::{Grant, RunInfo, ms};
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
    let lease = Lease::new(shared.store.clone(), task.clone(), config)
        .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?
        .with_holder(shared.holder_id(None));
    let mut gate = Gate::new(lease).recording(shared.history.clone());
    if let Some(group) = &group {
        // The interval between the slots around the store's clock as last read.
        let near = shared.clock.now_ms().unwrap_or_else(wall_millis);
        let interval = schedule
            .latest_at_or_before(near)
            .and_then(|slot| Some(schedule.next_after(slot)? - slot))
            .map_or(Duration::ZERO, Duration::from_millis);
        let campaign = shared
            .campaigns
            .campaign(group, config, interval)
            .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?;
        gate = gate.led_by(campaign);
    }
    let due = gate.decide_due(&schedule, &shared.clock).await;
    shared.saw_store(matches!(&due, Err(e) if e.is_transient()));
    let (reading, slot, decision) = match due {
        Ok(Due::Decided {
            reading,
            slot,
            decision,
        }) => (reading, slot, decision),
        Ok(Due::NotDue(_)) => return Ok(Json(answer(false, None, Some("not-due")))),
        Err(e) if e.is_transient() => return Ok(Json(store_down(&e))),
        Err(e) => return Err(ApiError::store(&e.into())),
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
    let guard = ticket.into_guard();
    let token = guard.token();
    let entry = shared.registry.insert(Grant {
        guard,
        keepalive,
        stop_margin: config.stop_margin,
        granted: Instant::now(),
        run: Some(RunInfo {
            slot,
            started_ms: reading.now_ms,
            started_at: arrival,
            schedule: recorded,
        }),
    });
    let Ok(valid_for_ms) = entry.valid_for_ms(arrival) else {
        let _ = entry.end(EndReason::Expired).await;
        return Ok(Json(answer(false, Some(slot), Some("store-down"))));
    };
    Ok(Json(TickResponse {
        gated: Some(true),
        token: Some(token.to_string()),
        valid_for_ms: Some(valid_for_ms),
        keepalive_ms: Some(ms(keepalive)),
        ..answer(true, Some(slot), None)
    }))
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
    let Some(entry) = shared.registry.get(&task, token) else {
        return Ok(crate::leases::released(false));
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
