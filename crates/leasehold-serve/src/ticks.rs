//! Gated ticks for applications that keep their own timer: which slot a tick belongs to, whether
//! this caller runs it, and the end of the run.
//!
//! A tick follows the scheduler's gate (crates/leasehold's `Scheduler`): the store's clock names
//! the slot, the task lease excludes overlapping runs, the forward-only slot claim lets exactly
//! one caller per slot run it, and the run holds the task lease until the application says it is
//! done (or goes silent). Lease and slot names are the task's own, so `leasehold history` and
//! `leasehold run` on the same task see the same runs.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use leasehold::history::{RecordedSchedule, RunOutcome};
use leasehold::{
    CancellationToken, Leader, LeaderHandle, LeaderState, Lease, LeaseGuard, LeaseName, Schedule,
    Slots, Store, StoreDownPolicy, StoreError, TryAcquire, store::SlotClaim,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::error::{ApiError, EndReason, in_range, not_null, parse};
use crate::held::{Grant, RunInfo, ms};
use crate::leases::{keepalive, lease_config, lease_name, token};
use crate::{Shared, Sidecar};

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
            let schedule =
                Schedule::cron(expr).map_err(|e| ApiError::field("cron", e.to_string()))?;
            Ok((schedule, RecordedSchedule::Cron(expr.clone())))
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

    // The store's clock names the slot.
    let limit = config.renew_interval;
    let now = tokio::time::timeout(limit, shared.store.now_millis())
        .await
        .unwrap_or(Err(StoreError::Timeout(limit)));
    shared.saw_store(matches!(&now, Err(e) if e.is_transient()));
    let now = match now {
        Ok(now) => now,
        Err(e) if e.is_transient() => return Ok(Json(store_down(&e))),
        Err(e) => return Err(ApiError::store(&e.into())),
    };
    let Some(slot) = schedule.latest_at_or_before(now) else {
        return Ok(Json(answer(false, None, Some("not-due"))));
    };

    if let Some(group) = &group {
        let interval = schedule
            .next_after(slot)
            .map_or(Duration::ZERO, |next| Duration::from_millis(next - slot));
        if !shared.groups.leads(shared, group, config, interval).await? {
            return Ok(Json(answer(false, Some(slot), Some("not-leader"))));
        }
    }

    let lease = Lease::new(shared.store.clone(), task.clone(), config)
        .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?
        .with_holder(shared.holder_id(None));
    let attempt = lease.try_acquire().await;
    shared.saw_store(matches!(&attempt, Err(e) if e.is_transient()));
    let guard = match attempt {
        Ok(TryAcquire::Acquired(guard)) => guard,
        Ok(TryAcquire::Busy { .. }) => {
            // Busy is usually another instance running this very slot; the slot record tells.
            let ran = tokio::time::timeout(limit, shared.store.last_slot(&task)).await;
            let reason = match ran {
                Ok(Ok(Some(last))) if last >= slot => "already-run",
                _ => "busy",
            };
            return Ok(Json(answer(false, Some(slot), Some(reason))));
        }
        Err(e) if e.is_transient() => return Ok(Json(store_down(&e))),
        Err(e) => return Err(ApiError::store(&e)),
    };

    match claim(shared, &task, slot, &guard, limit).await {
        Ok(SlotClaim::Claimed) => {}
        Ok(_) => {
            release_in_background(guard);
            return Ok(Json(answer(false, Some(slot), Some("already-run"))));
        }
        Err(e) => {
            release_in_background(guard);
            if e.is_transient() {
                return Ok(Json(store_down(&e)));
            }
            return Err(ApiError::store(&e.into()));
        }
    }
    let token = guard.token();
    let entry = shared.registry.insert(Grant {
        guard,
        keepalive,
        stop_margin: config.stop_margin,
        granted: Instant::now(),
        run: Some(RunInfo {
            slot,
            started_ms: now,
            started_at: arrival,
            schedule: recorded,
        }),
    });
    // The claim took so long that the lease is expiring: the slot stays claimed but unrun,
    // rather than run by a holder about to lose it (as the scheduler does).
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

/// Claims `slot` unless the task lease starts expiring first.
async fn claim(
    shared: &Shared,
    task: &LeaseName,
    slot: u64,
    guard: &LeaseGuard,
    limit: Duration,
) -> Result<SlotClaim, StoreError> {
    let expiring = guard.expiring_token();
    let claimed = tokio::select! {
        biased;
        () = expiring.cancelled() => Err(StoreError::Timeout(limit)),
        claim = tokio::time::timeout(limit, shared.store.claim_slot(task, slot)) => {
            claim.unwrap_or(Err(StoreError::Timeout(limit)))
        }
    };
    shared.saw_store(matches!(&claimed, Err(e) if e.is_transient()));
    claimed
}

fn release_in_background(guard: LeaseGuard) {
    tokio::spawn(async move {
        if let Err(e) = guard.release().await {
            tracing::debug!(error = %e, "task lease release failed; it expires after its ttl");
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
    let Some(entry) = shared.registry.get(&task, token) else {
        return Ok(crate::leases::released(false));
    };
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

/// Leadership of groups held on behalf of the applications that tick in them.
///
/// The sidecar campaigns for a group from the first tick that names it and keeps campaigning
/// (and leading) while ticks in the group keep arriving: for twice the longest interval between
/// slots seen plus the lease's ttl. An application that stops ticking (hung, or shut down) so
/// lets the group pass to an instance whose application is alive.
#[derive(Default)]
pub(crate) struct TickGroups {
    groups: Mutex<HashMap<LeaseName, Arc<TickGroup>>>,
}

struct TickGroup {
    leader: LeaderHandle,
    started: Instant,
    /// The last tick and the idle time after which the campaign stops.
    activity: Mutex<(Instant, Duration)>,
    stop: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How long a new campaign may take to settle before a tick answers not-leader.
const FIRST_ELECTION: Duration = Duration::from_secs(1);

impl TickGroups {
    /// Whether this sidecar leads `group` now, campaigning for it if it was not.
    async fn leads(
        &self,
        shared: &Arc<Shared>,
        group: &LeaseName,
        config: leasehold::LeaseConfig,
        interval: Duration,
    ) -> Result<bool, ApiError> {
        let idle = interval.saturating_mul(2) + config.ttl;
        let entry = {
            let mut groups = lock(&self.groups);
            match groups.get(group) {
                Some(g) if !g.stop.is_cancelled() => {
                    let mut activity = lock(&g.activity);
                    *activity = (Instant::now(), activity.1.max(idle));
                    g.clone()
                }
                _ => {
                    let g = Arc::new(self.start(shared, group, config, idle)?);
                    groups.insert(group.clone(), g.clone());
                    let watched = g.clone();
                    tokio::spawn(async move { watched.expire_when_idle().await });
                    g
                }
            }
        };
        let mut states = entry.leader.watch();
        let settle = (entry.started + FIRST_ELECTION).min(entry.started + config.ttl);
        loop {
            let state = states.borrow_and_update().clone();
            match state {
                LeaderState::Leading { cancel, .. } if !cancel.is_cancelled() => return Ok(true),
                LeaderState::Campaigning if Instant::now() < settle => {}
                _ => return Ok(false),
            }
            if tokio::time::timeout_at(settle, states.changed())
                .await
                .is_err()
            {
                return Ok(entry.leader.is_leader());
            }
        }
    }

    fn start(
        &self,
        shared: &Arc<Shared>,
        group: &LeaseName,
        config: leasehold::LeaseConfig,
        idle: Duration,
    ) -> Result<TickGroup, ApiError> {
        let stop = shared.stop.child_token();
        let holder = shared.group_holder();
        let lease = Lease::new(shared.store.clone(), group.clone(), config)
            .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?
            .with_holder(holder);
        let shutdown = stop.clone().cancelled_owned();
        Ok(TickGroup {
            leader: Leader::new(lease).start(shutdown),
            started: Instant::now(),
            activity: Mutex::new((Instant::now(), idle)),
            stop,
        })
    }

    /// Steps down from every group (releasing its lease), waiting at most `limit`.
    pub(crate) async fn shut_down(&self, limit: Duration) {
        let groups: Vec<_> = lock(&self.groups).drain().map(|(_, g)| g).collect();
        for g in &groups {
            g.stop.cancel();
        }
        let stopped = async {
            for g in &groups {
                let mut states = g.leader.watch();
                let _ = states
                    .wait_for(|s| matches!(s, LeaderState::Stopped | LeaderState::Failed { .. }))
                    .await;
            }
        };
        let _ = tokio::time::timeout(limit, stopped).await;
    }
}

impl TickGroup {
    async fn expire_when_idle(self: Arc<Self>) {
        loop {
            let (last, idle) = *lock(&self.activity);
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep_until(last + idle) => {}
            }
            let (last, idle) = *lock(&self.activity);
            if last + idle <= Instant::now() {
                tracing::info!(group = %self.leader.group(), "no ticks in the group lately; stepping down");
                self.stop.cancel();
                return;
            }
        }
    }
}
