//! The live page's files, embedded in the binary, and how they are served: the page, its
//! script and style, and the pages that say a path does not exist or a host is not this
//! sidecar's. Below the handlers that serve them and the host check that answers with one.

use axum::extract::Request;
use axum::http::header::{
    ACCEPT, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

pub(crate) const INDEX: &str = include_str!("../page/index.html");
const NOT_FOUND: &str = include_str!("../page/not-found.html");
const WRONG_HOST: &str = include_str!("../page/wrong-host.html");
const SCRIPT: &str = include_str!("../page/page.js");
const STYLE: &str = include_str!("../page/page.css");

pub(crate) const HTML: &str = "text/html; charset=utf-8";

/// What the page may load: its own files only (so nothing is ever fetched from elsewhere, even
/// if a bug tried), and no other site may frame it (its buttons act on the fleet).
const CSP: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// An embedded asset, revalidated on every load so a new binary's page is used at once.
pub(crate) fn asset(content_type: &'static str, body: &'static str) -> Response {
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

/// The page that says the sidecar is not answering under the name it was reached by (see
/// `hosts`): self-contained, since its stylesheet would be refused under that name too.
pub(crate) fn wrong_host_page() -> Response {
    let mut response = asset(HTML, WRONG_HOST);
    *response.status_mut() = StatusCode::FORBIDDEN;
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
