//! The fleet over HTTP: the store's task catalog and leases as `leasehold::overview` computes
//! them, and fleet-wide pause, resume, trigger and backfill through `leasehold::fleet::Fleet` (the same
//! records `leasehold status|pause|resume|trigger` read and write).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use leasehold::catalog::{SlotRange, TriggerRequest};
use leasehold::overview::{self, LeaseList, TaskDetail, TaskList, TaskSummary};
use leasehold::{LeaseName, text};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, in_range, parse};
use crate::leases::lease_name;
use crate::sidecar::Sidecar;

/// History entries a task's page shows when the request does not say.
const DEFAULT_HISTORY: u64 = 50;
/// The most lease records listed.
const MAX_LEASES: usize = 1000;

pub(crate) async fn tasks(State(sidecar): State<Sidecar>) -> Result<Json<TaskList>, ApiError> {
    let list = overview::tasks(&sidecar.0.fleet).await;
    Ok(Json(sidecar.answered(list)?))
}

pub(crate) async fn task(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<TaskDetail>, ApiError> {
    let task = lease_name("task", &task)?;
    let limit = history_limit(query.as_deref())?;
    let detail = overview::task(&sidecar.0.fleet, &task, limit).await;
    Ok(Json(sidecar.answered(detail)?))
}

/// `limit=N` (1 to 500) from the query string; other parameters are refused.
pub(crate) fn history_limit(query: Option<&str>) -> Result<usize, ApiError> {
    let mut limit = DEFAULT_HISTORY;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "limit" {
            return Err(ApiError::field(key, "the only query parameter is limit"));
        }
        let n = value
            .parse::<u64>()
            .map_err(|_| ApiError::field("limit", "limit must be a whole number"))?;
        limit = in_range("limit", n, 1..=overview::MAX_HISTORY as u64)?;
    }
    Ok(usize::try_from(limit).unwrap_or(overview::MAX_HISTORY))
}

pub(crate) async fn leases(State(sidecar): State<Sidecar>) -> Result<Json<LeaseList>, ApiError> {
    let list = overview::leases(&sidecar.0.fleet, MAX_LEASES).await;
    Ok(Json(sidecar.answered(list)?))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PauseRequest {
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    by: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TriggerBody {
    #[serde(default)]
    by: Option<String>,
}

/// A body that may be left out (empty) for its defaults.
fn optional<T: serde::de::DeserializeOwned + Default>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    match &body {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Ok(T::default()),
        _ => parse(body),
    }
}

/// Who asked: as the request says (checked with `reason` by the fleet, see
/// `leasehold::text`), else this sidecar (by its pid if its holder prefix, which a library
/// user may set to anything, breaks the rule).
fn by(sidecar: &Sidecar, by: Option<String>) -> String {
    match by {
        Some(by) if !by.trim().is_empty() => by,
        _ => {
            let by = format!("api@{}", sidecar.0.holder);
            match text::BY.check(&by) {
                Ok(()) => by,
                Err(_) => format!("api@sidecar-{}", std::process::id()),
            }
        }
    }
}

pub(crate) async fn pause(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TaskSummary>, ApiError> {
    let task = lease_name("task", &task)?;
    let request: PauseRequest = optional(body)?;
    let by = by(&sidecar, request.by);
    let paused = sidecar
        .0
        .fleet
        .pause(&task, &by, request.reason.as_deref())
        .await;
    sidecar.answered(paused)?;
    summary(&sidecar, &task).await
}

pub(crate) async fn resume(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TaskSummary>, ApiError> {
    let task = lease_name("task", &task)?;
    let _: Empty = optional(body)?;
    let resumed = sidecar.0.fleet.resume(&task).await;
    sidecar.answered(resumed)?;
    summary(&sidecar, &task).await
}

/// `resume` takes no fields.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Empty {}

pub(crate) async fn trigger(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TriggerRequest>, ApiError> {
    let task = lease_name("task", &task)?;
    let request: TriggerBody = optional(body)?;
    let by = by(&sidecar, request.by);
    let asked = sidecar.0.fleet.trigger(&task, &by).await;
    Ok(Json(sidecar.answered(asked)?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillBody {
    from_ms: u64,
    to_ms: u64,
    #[serde(default)]
    by: Option<String>,
}

/// What `backfill` answers.
#[derive(Serialize)]
pub(crate) struct BackfillAnswer {
    task: String,
    /// `None` when every slot of the range already ran ok: nothing was asked for.
    request: Option<TriggerRequest>,
    slots: Vec<u64>,
    to_run: Vec<u64>,
}

/// Asks for a backfill of the task's slots in `[from_ms, to_ms]` (`leasehold trigger --slots`).
pub(crate) async fn backfill(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<BackfillAnswer>, ApiError> {
    let task = lease_name("task", &task)?;
    let request: BackfillBody = parse(body)?;
    let by = by(&sidecar, request.by);
    let range = SlotRange {
        from_ms: request.from_ms,
        to_ms: request.to_ms,
    };
    let asked = sidecar.0.fleet.backfill(&task, &by, range).await;
    let backfill = sidecar.answered(asked)?;
    Ok(Json(BackfillAnswer {
        task: task.to_string(),
        request: backfill.request,
        slots: backfill.slots,
        to_run: backfill.to_run,
    }))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ForgetBody {
    #[serde(default)]
    history: bool,
}

/// What `forget` answers.
#[derive(Serialize)]
pub(crate) struct Forgotten {
    task: String,
    history_removed: bool,
}

/// Removes a task no instance runs from the catalog (409 `task-live` while one does).
pub(crate) async fn forget(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Forgotten>, ApiError> {
    let task = lease_name("task", &task)?;
    let request: ForgetBody = optional(body)?;
    let forgot = sidecar.0.fleet.forget(&task, request.history).await;
    sidecar.answered(forgot)?;
    Ok(Json(Forgotten {
        task: task.to_string(),
        history_removed: request.history,
    }))
}

/// The task as it is after a control write.
async fn summary(sidecar: &Sidecar, task: &LeaseName) -> Result<Json<TaskSummary>, ApiError> {
    let detail = overview::task(&sidecar.0.fleet, task, 1).await;
    Ok(Json(sidecar.answered(detail)?.task))
}

impl Sidecar {
    /// A fleet answer, noting whether the store could be reached.
    pub(crate) fn answered<T>(
        &self,
        answer: Result<T, leasehold::fleet::FleetError>,
    ) -> Result<T, ApiError> {
        self.0.saw_store(matches!(
            &answer,
            Err(leasehold::fleet::FleetError::Store(e)) if e.is_transient()
        ));
        answer.map_err(|e| ApiError::fleet(&e))
    }
}
