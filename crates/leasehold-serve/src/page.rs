//! The live page's reads of the fleet: `GET /tasks/NAME` (one task; its files, and `GET /`, are
//! `assets`'), and `GET /v1/tasks/{task}/history.svg`, a task's run history as the timeline picture
//! `leasehold history --svg` draws. The page is plain HTML, CSS and JavaScript embedded in the
//! binary (nothing is fetched from elsewhere); it reads the fleet endpoints once a second and
//! sends the bearer token the person gave it, kept in the tab's `sessionStorage`.
//!
//! The page itself carries no data, so it is served without the token (a browser cannot send
//! one with a navigation); everything it shows comes through the API and its auth.

use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use leasehold::Store;
use leasehold::fleet::FleetError;

use crate::assets::{HTML, INDEX, asset, not_found_page};
use crate::error::ApiError;
use crate::fleet::history_limit;
use crate::leases::lease_name;
use crate::sidecar::Sidecar;

/// `/tasks/NAME`: the page, when the catalog knows the task (as `NAME` or `NAME:run`); the
/// 404 page when it does not or the name cannot be one. When the catalog cannot be read the
/// page is served and says so itself.
pub(crate) async fn task_page(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
) -> Response {
    let Ok(name) = lease_name("task", &task) else {
        return not_found_page();
    };
    match sidecar.0.fleet.task(&name).await {
        Err(FleetError::UnknownTask(_)) => not_found_page(),
        _ => asset(HTML, INDEX),
    }
}

/// `GET /v1/tasks/{task}/history.svg?limit=N`: the newest N records of the task's history
/// (as many as `GET /v1/tasks/{task}` lists: default 50, at most 500) as the timeline picture,
/// drawn by `leasehold-timeline` like `leasehold history --svg`.
pub(crate) async fn history_svg(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let limit = history_limit(query.as_deref())?;
    let name = lease_name("task", &task)?;
    let fleet = &sidecar.0.fleet;
    let view = sidecar.answered(fleet.task(&name).await)?;
    let store = fleet.store();
    let records = leasehold::history::read(store, &view.name, limit).await;
    let records = sidecar.answered(records.map_err(FleetError::from))?;
    let now = sidecar.answered(store.now_millis().await.map_err(FleetError::from))?;
    let svg = leasehold_timeline::history_svg(view.name.as_str(), &records, now);
    Ok((
        [
            (CONTENT_TYPE, HeaderValue::from_static("image/svg+xml")),
            (CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        svg,
    )
        .into_response())
}
