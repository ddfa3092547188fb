//! The live page: `GET /` (the fleet), `GET /tasks/NAME` (one task), their script and style,
//! and `GET /v1/tasks/{task}/history.svg`, a task's run history as the timeline picture
//! `leasehold history --svg` draws. The page is plain HTML, CSS and JavaScript embedded in the
//! binary (nothing is fetched from elsewhere); it reads the fleet endpoints once a second and
//! sends the bearer token the person gave it, kept in the tab's `sessionStorage`.
//!
//! The page itself carries no data, so it is served without the token (a browser cannot send
//! one with a navigation); everything it shows comes through the API and its auth.

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::header::{
    ACCEPT, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use leasehold::fleet::FleetError;
use leasehold::{LeaseName, Store};

use crate::Sidecar;
use crate::error::ApiError;
use crate::fleet::history_limit;
use crate::leases::lease_name;

const INDEX: &str = include_str!("../page/index.html");
const NOT_FOUND: &str = include_str!("../page/not-found.html");
const SCRIPT: &str = include_str!("../page/page.js");
const STYLE: &str = include_str!("../page/page.css");

const HTML: &str = "text/html; charset=utf-8";

/// What the page may load: its own files only (so nothing is ever fetched from elsewhere, even
/// if a bug tried), and no other site may frame it (its buttons act on the fleet).
const CSP: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// An embedded asset, revalidated on every load so a new binary's page is used at once.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
            (X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        ],
        body,
    )
        .into_response()
}

/// The page at `/`.
pub(crate) async fn index() -> Response {
    asset(HTML, INDEX)
}

pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// The page that says a page does not exist, with a way back.
pub(crate) fn not_found_page() -> Response {
    let mut response = asset(HTML, NOT_FOUND);
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// Whether a request is a browser's navigation (it prefers HTML): unknown paths answer it with
/// the page's 404 rather than the API's JSON one.
pub(crate) fn wants_html(request: &Request) -> bool {
    request
        .headers()
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"))
}

/// `/tasks/NAME`: the page, when the catalog knows the task (as `NAME` or `NAME:run`); the
/// 404 page when it does not or the name cannot be one. When the catalog cannot be read the
/// page is served and says so itself.
pub(crate) async fn task_page(
    State(sidecar): State<Sidecar>,
    Path(task): Path<String>,
) -> Response {
    let Ok(name) = LeaseName::new(&task) else {
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
