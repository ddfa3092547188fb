//! Every valid name can be opened on the page and through the API (issue 36 item 4). Names are
//! `A-Z a-z 0-9 - _ . : /`, so a name may have `.` or `..` segments (`../../etc`), which
//! browsers and HTTP clients resolve away before sending, `%2E` included (WHATWG URL). The page
//! and the clients write a name as one path segment (`/` as `%2F`) and the dots of a `.` or `..`
//! segment as `%252E`; the sidecar reads a `%2E` left after decoding the path as a dot (names
//! never hold `%`). Here each character class goes through the API and the page's
//! address over HTTP, after a WHATWG URL parser (the `url` crate) has resolved the address as a
//! browser would. (The same in a real browser: tests/page/names.test.mjs.)

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold::{BoxStore, MemoryStore};
use leasehold_serve::{Sidecar, SidecarConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

/// A name of each character class and each shape of `/`-separated segments.
const NAMES: &[&str] = &[
    "abcXYZ",
    "0123456789",
    "-",
    "_",
    ".",
    ":",
    "/",
    "a-b",
    "a_b",
    "a.b",
    "a:b",
    "a/b",
    "/lead",
    "trail/",
    "a//b",
    "//",
    "..",
    "...",
    ".hidden",
    "./x",
    "x/.",
    "x/..",
    "../../etc",
    "a/../b",
    "a/./b",
    "billing:expire-gigs/v2.1_x",
];

/// `text` as one path segment, as the page and the TypeScript client write it.
fn segment(text: &str) -> String {
    if text == "." || text == ".." {
        return text.replace('.', "%252E");
    }
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The page's address of a task, as the page links to it: each `/`-separated part a segment.
fn page_path(name: &str) -> String {
    let parts: Vec<String> = name
        .split('/')
        .map(|part| segment(part).replace("%3A", ":"))
        .collect();
    format!("/tasks/{}", parts.join("/"))
}

/// The path a browser sends for `path` (dot segments resolved, as the WHATWG URL spec says).
fn as_sent(path: &str) -> String {
    let base = url::Url::parse("http://127.0.0.1:7070/").unwrap();
    let url = base.join(path).unwrap();
    match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    }
}

async fn call(
    router: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, String) {
    let path = as_sent(path);
    let request = Request::builder()
        .method(method)
        .uri(&path)
        .header("host", "127.0.0.1:7070")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn json(router: &Router, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, text) = call(router, method, path, body).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{method} {path} (sent as {}): {text}",
        as_sent(path)
    );
    serde_json::from_str(&text).unwrap()
}

#[test]
fn the_addresses_survive_a_browsers_url_parser() {
    for name in NAMES {
        for path in [
            format!("/v1/tasks/{}/ticks", segment(name)),
            page_path(name),
        ] {
            assert_eq!(as_sent(&path), path, "{name:?}");
        }
    }
    // Without the escape the address is another one: the issue's `/tasks/../../etc` is `/etc`.
    assert_eq!(as_sent("/tasks/../../etc"), "/etc");
    assert_eq!(as_sent("/v1/tasks/%2E%2E/pause"), "/v1/pause");
}

#[tokio::test]
async fn every_name_opens_through_the_api_and_the_page() {
    let router = Sidecar::new(
        BoxStore::new(MemoryStore::new()),
        SidecarConfig::default().holder("names-test"),
    )
    .router(None);
    for name in NAMES {
        let api = format!("/v1/tasks/{}", segment(name));
        let tick = json(
            &router,
            "POST",
            &format!("{api}/ticks"),
            Some(json!({"every_ms": 60000})),
        )
        .await;
        assert_eq!(
            (&tick["task"], &tick["run"]),
            (&json!(name), &json!(true)),
            "{name:?}: {tick}"
        );
        let done = json!({"token": tick["token"], "outcome": "ok"});
        json(
            &router,
            "POST",
            &format!("{api}/ticks/{}/done", tick["slot"]),
            Some(done),
        )
        .await;
        // The tick registers the task in the catalog in the background.
        let mut detail = Value::Null;
        for _ in 0..200 {
            let (status, text) = call(&router, "GET", &api, None).await;
            if status == StatusCode::OK {
                detail = serde_json::from_str(&text).unwrap();
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(detail["name"], json!(name), "{name:?}: {detail}");
        let (status, page) = call(&router, "GET", &page_path(name), None).await;
        assert_eq!(status, StatusCode::OK, "{name:?} at {}", page_path(name));
        assert_eq!(page, include_str!("../page/index.html"));
        let (status, svg) = call(&router, "GET", &format!("{api}/history.svg"), None).await;
        assert_eq!(status, StatusCode::OK, "{name:?}: {svg}");
        assert!(svg.starts_with("<svg"), "{name:?}");
        let paused = json(&router, "POST", &format!("{api}/pause"), Some(json!({}))).await;
        assert_eq!(
            (&paused["name"], &paused["state"]),
            (&json!(name), &json!("paused")),
            "{paused}"
        );
        let resumed = json(&router, "POST", &format!("{api}/resume"), Some(json!({}))).await;
        assert_ne!(resumed["state"], "paused", "{resumed}");
        // Leases and groups take the same names.
        let lease = format!("/v1/leases/{}", segment(name));
        let held = json(
            &router,
            "POST",
            &format!("{lease}/acquire"),
            Some(json!({"ttl_ms": 10000})),
        )
        .await;
        assert_eq!(held["acquired"], true, "{name:?}: {held}");
        let state = json(&router, "GET", &lease, None).await;
        assert_eq!(
            (&state["name"], &state["held"]),
            (&json!(name), &json!(true)),
            "{state}"
        );
        let released = json(
            &router,
            "POST",
            &format!("{lease}/release"),
            Some(json!({"token": held["token"]})),
        )
        .await;
        assert_eq!(released["released"], true, "{released}");
        let group = json(
            &router,
            "GET",
            &format!("/v1/groups/{}", segment(name)),
            None,
        )
        .await;
        assert_eq!(group["group"], json!(name), "{group}");
    }
    // Every name is listed once, as itself.
    let list = json(&router, "GET", "/v1/tasks", None).await;
    let mut listed: Vec<&str> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    let mut expected = NAMES.to_vec();
    listed.sort_unstable();
    expected.sort_unstable();
    assert_eq!(listed, expected);
}

#[tokio::test]
async fn only_a_dot_is_read_from_what_decoding_leaves() {
    let router =
        Sidecar::new(BoxStore::new(MemoryStore::new()), SidecarConfig::default()).router(None);
    // `%` is no name character: any other escape left after decoding (`%41` is not read as
    // `A`) is a bad name (400), and a page for it is the 404 page.
    for segment in [
        "%25252E",
        "%2541",
        "%2520",
        "%25",
        "%252",
        "%25FF",
        "%25C3%25BC",
        "%252%252EE",
    ] {
        let (status, text) = call(
            &router,
            "POST",
            &format!("/v1/tasks/{segment}/ticks"),
            Some(json!({"every_ms": 60000})),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{segment}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["field"], "task", "{error}");
        let (status, _) = call(&router, "GET", &format!("/tasks/{segment}"), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{segment}");
    }
    // A tick's group is a body field: taken exactly as given.
    let (status, text) = call(
        &router,
        "POST",
        "/v1/tasks/t/ticks",
        Some(json!({"every_ms": 60000, "group": "%2E%2E"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
}
