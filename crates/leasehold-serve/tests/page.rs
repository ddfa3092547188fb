//! The live page's routes: the embedded files with their content types, served without the
//! token (they carry no data) while the history picture needs it, task pages that exist only
//! for tasks in the catalog, and the page's 404 for browsers (the API's JSON one for others).
//! The page itself is driven in a real browser by scripts/page-test.mjs.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold::catalog::{InstanceInfo, Registration, TaskDefinition, TaskSource};
use leasehold::{BoxStore, Catalog, HolderId, LeaseName, MemoryStore};
use leasehold_serve::{Sidecar, SidecarConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

const TOKEN: &str = "page-test-token-0123456789";

struct Answer {
    status: StatusCode,
    content_type: String,
    csp: String,
    body: String,
}

async fn get(router: &Router, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = Request::get(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(router, request.body(Body::empty()).unwrap()).await
}

async fn send(router: &Router, request: Request<Body>) -> Answer {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let csp = response
        .headers()
        .get("content-security-policy")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        content_type,
        csp,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

fn router(store: &BoxStore, token: Option<&str>) -> Router {
    Sidecar::new(store.clone(), SidecarConfig::default()).router(token.map(str::to_owned))
}

/// Puts `task` in the catalog, as an instance registering it would.
async fn register(store: &BoxStore, task: &str) {
    let definition = TaskDefinition {
        source: TaskSource::Sidecar,
        schedule: "every 1s".to_owned(),
        time_zone: None,
        on_store_down: "fail-closed".to_owned(),
        catch_up: None,
        gated: true,
        leader_group: None,
        spread_group: None,
        timeout_ms: None,
        retries: None,
        jitter_ms: None,
        overlap: None,
        slot_schedule: None,
    };
    let task = LeaseName::new(task).unwrap();
    let instance = HolderId::new("page-test:1:0123456789abcdef").unwrap();
    store
        .register(&Registration {
            task: &task,
            definition: &serde_json::to_string(&definition).unwrap(),
            instance: &instance,
            about: &serde_json::to_string(&InstanceInfo::current()).unwrap(),
            ttl: Duration::from_secs(30),
            forget_after: Duration::from_secs(3600),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn the_page_and_its_files_are_embedded_with_their_types_and_need_no_token() {
    let store = BoxStore::new(MemoryStore::new());
    let router = router(&store, Some(TOKEN));
    let files = [
        ("/", "text/html", include_str!("../page/index.html")),
        (
            "/assets/page.js",
            "text/javascript",
            include_str!("../page/page.js"),
        ),
        (
            "/assets/page.css",
            "text/css",
            include_str!("../page/page.css"),
        ),
    ];
    for (path, content_type, embedded) in files {
        let got = get(&router, path, &[]).await;
        assert_eq!(got.status, StatusCode::OK, "{path}: {}", got.body);
        assert!(
            got.content_type.starts_with(content_type),
            "{path}: {}",
            got.content_type
        );
        assert_eq!(got.body, embedded, "{path} is the embedded file");
        // The browser is told so too, and that no other site may frame the buttons.
        assert!(
            got.csp.starts_with("default-src 'self';")
                && got.csp.contains("frame-ancestors 'none'"),
            "{path}: {}",
            got.csp
        );
        // Nothing is fetched from elsewhere: no absolute URLs in any of the files.
        assert!(
            !embedded.contains("http://") && !embedded.contains("https://"),
            "{path} refers to another host"
        );
    }
    let index = get(&router, "/", &[]).await.body;
    for asset in ["/assets/page.js", "/assets/page.css"] {
        assert!(index.contains(asset), "the page loads {asset}");
    }
}

#[tokio::test]
async fn unknown_pages_get_the_page_404_and_api_clients_the_json_one() {
    let store = BoxStore::new(MemoryStore::new());
    let router = router(&store, None);
    let browser = [(ACCEPT.as_str(), "text/html,application/xhtml+xml,*/*;q=0.8")];
    for path in [
        "/nope",
        "/tasks/never-registered",
        "/tasks/bad%20name",
        "/assets/x.js",
    ] {
        let got = get(&router, path, &browser).await;
        assert_eq!(got.status, StatusCode::NOT_FOUND, "{path}");
        assert!(got.content_type.starts_with("text/html"), "{path}");
        assert!(got.body.contains("Not found (404)"), "{path}: {}", got.body);
    }
    let got = get(&router, "/nope", &[]).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    let error: Value = serde_json::from_str(&got.body).unwrap();
    assert_eq!(error["error"], "not-found", "{error}");
}

#[tokio::test]
async fn a_task_page_exists_once_the_catalog_knows_the_task_by_either_name() {
    let store = BoxStore::new(MemoryStore::new());
    let router = router(&store, Some(TOKEN));
    assert_eq!(
        get(&router, "/tasks/sweep", &[]).await.status,
        StatusCode::NOT_FOUND
    );
    register(&store, "sweep").await;
    register(&store, "nightly:run").await;
    for path in ["/tasks/sweep", "/tasks/nightly:run", "/tasks/nightly%3Arun"] {
        let got = get(&router, path, &[]).await;
        assert_eq!(got.status, StatusCode::OK, "{path}: {}", got.body);
        assert_eq!(got.body, include_str!("../page/index.html"), "{path}");
    }
}

#[tokio::test]
async fn the_history_picture_is_the_timeline_svg_behind_the_token() {
    let store = BoxStore::new(MemoryStore::new());
    let router = router(&store, Some(TOKEN));
    let bearer = format!("Bearer {TOKEN}");
    let auth = [(AUTHORIZATION.as_str(), bearer.as_str())];
    register(&store, "sweep").await;
    // One run through the sidecar's ticks, so the history has a bar.
    let tick = Request::post("/v1/tasks/sweep/ticks")
        .header(AUTHORIZATION, &bearer)
        .body(Body::from(json!({"every_ms": 1000}).to_string()))
        .unwrap();
    let granted: Value = serde_json::from_str(&send(&router, tick).await.body).unwrap();
    assert_eq!(granted["run"], true, "{granted}");
    let done = Request::post(format!("/v1/tasks/sweep/ticks/{}/done", granted["slot"]))
        .header(AUTHORIZATION, &bearer)
        .body(Body::from(
            json!({"token": granted["token"], "outcome": "ok"}).to_string(),
        ))
        .unwrap();
    assert_eq!(send(&router, done).await.status, StatusCode::OK);

    let unauthorized = get(&router, "/v1/tasks/sweep/history.svg", &[]).await;
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);

    // The history writer records in the background: wait for the run to be there.
    let mut svg = String::new();
    for _ in 0..100 {
        let got = get(&router, "/v1/tasks/sweep/history.svg", &auth).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        assert_eq!(got.content_type, "image/svg+xml");
        svg = got.body;
        if svg.contains("1 runs (1 ok)") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(svg.starts_with("<svg") && svg.contains("Run history of sweep"));
    assert!(svg.contains("1 runs (1 ok)"), "{svg}");
    // The bar's tooltip names the holder and the token.
    assert!(svg.contains("<title>ok · slot "), "{svg}");
    assert!(svg.contains(" · token "), "{svg}");

    let unknown = get(&router, "/v1/tasks/nope/history.svg", &auth).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let error: Value = serde_json::from_str(&unknown.body).unwrap();
    assert_eq!(error["error"], "unknown-task", "{error}");
    for bad in ["limit=0", "limit=501", "limit=x", "colour=red"] {
        let got = get(
            &router,
            &format!("/v1/tasks/sweep/history.svg?{bad}"),
            &auth,
        )
        .await;
        assert_eq!(got.status, StatusCode::BAD_REQUEST, "{bad}: {}", got.body);
    }
}

/// A run's failure text is kept as the application wrote it, whatever it holds (a command's
/// stderr: newlines, escape sequences): the API's JSON gives it back exactly, and the history
/// picture, which the page draws, shows each control and bidi character escaped and stays XML.
#[tokio::test]
async fn a_failure_text_with_control_characters_is_kept_exactly_and_drawn_escaped() {
    let store = BoxStore::new(MemoryStore::new());
    let router = router(&store, None);
    let tick = Request::post("/v1/tasks/sweep/ticks")
        .body(Body::from(json!({"every_ms": 1000}).to_string()))
        .unwrap();
    let granted: Value = serde_json::from_str(&send(&router, tick).await.body).unwrap();
    assert_eq!(granted["run"], true, "{granted}");
    let stderr = "build failed\n\u{1b}]0;pwned\u{7}\u{1b}[2J\r\u{0}\u{7f}\u{9b}\u{202e}<svg>&";
    let done = Request::post(format!("/v1/tasks/sweep/ticks/{}/done", granted["slot"]))
        .body(Body::from(
            json!({"token": granted["token"], "outcome": "failed", "error": stderr}).to_string(),
        ))
        .unwrap();
    let answer = send(&router, done).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);

    // The history writer records in the background: wait for the run to be there.
    let mut detail = Value::Null;
    for _ in 0..100 {
        detail = serde_json::from_str(&get(&router, "/v1/tasks/sweep", &[]).await.body).unwrap();
        if detail["history"][0]["outcome"] == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(detail["history"][0]["error"], stderr, "{detail}");

    let svg = get(&router, "/v1/tasks/sweep/history.svg", &[]).await;
    assert_eq!(svg.status, StatusCode::OK, "{}", svg.body);
    let doc = roxmltree::Document::parse(&svg.body).expect("well-formed XML");
    let title = doc
        .descendants()
        .find(|n| n.has_tag_name("title"))
        .and_then(|t| t.text())
        .unwrap_or_default()
        .to_owned();
    assert!(
        title.starts_with(
            "failed: build failed\\n\\x1b]0;pwned\\x07\\x1b[2J\\r\\0\\x7f\\u{9b}\\u{202e}<svg>& · "
        ),
        "{title}"
    );
    let raw: Vec<char> = svg
        .body
        .chars()
        .filter(|&c| leasehold::text::is_hidden(c) && c != '\n')
        .collect();
    assert!(raw.is_empty(), "{raw:?}");

    // A failure text over its limit is not refused (the run's outcome would be lost with it):
    // it is recorded cut, as the library's scheduler records a long job error.
    let tick = Request::post("/v1/tasks/long/ticks")
        .body(Body::from(json!({"every_ms": 1000}).to_string()))
        .unwrap();
    let granted: Value = serde_json::from_str(&send(&router, tick).await.body).unwrap();
    let done = Request::post(format!("/v1/tasks/long/ticks/{}/done", granted["slot"]))
        .body(Body::from(
            json!({"token": granted["token"], "outcome": "failed", "error": "e".repeat(50_000)})
                .to_string(),
        ))
        .unwrap();
    let answer = send(&router, done).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let mut error = Value::Null;
    for _ in 0..100 {
        let detail: Value =
            serde_json::from_str(&get(&router, "/v1/tasks/long", &[]).await.body).unwrap();
        error = detail["history"][0]["error"].clone();
        if !error.is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let error = error.as_str().unwrap_or_else(|| panic!("{error}"));
    assert!(
        error.len() <= leasehold::text::FAILURE.max,
        "{}",
        error.len()
    );
    assert!(
        error.starts_with("eeee") && error.ends_with(" bytes cut]"),
        "{error}"
    );
}

/// `done` takes the run's output with either outcome: recorded exactly (control characters and
/// all, for the page and `history --output` to show escaped), its end kept when longer than
/// `leasehold::text::OUTPUT`'s limit, even with every byte escaped in the body; `null` is
/// refused, as for the other optional fields.
#[tokio::test]
async fn done_keeps_the_runs_output_exactly_and_its_end_when_long() {
    let store = BoxStore::new(MemoryStore::new());
    let router = router(&store, None);
    let limit = leasehold::text::OUTPUT.max;
    let hostile = "step 1\n\u{1b}[2J\r\u{0}\u{9b}\u{202e}<pre>&</pre>\n";
    // Control characters only: each is six bytes in the body (`\u0000`).
    let long = format!("{}THE END", "\u{1}".repeat(limit + 10_000));
    for (task, outcome, output) in [
        ("printed", "ok", hostile.to_owned()),
        ("long", "failed", long.clone()),
    ] {
        let tick = Request::post(format!("/v1/tasks/{task}/ticks"))
            .body(Body::from(json!({"every_ms": 1000}).to_string()))
            .unwrap();
        let granted: Value = serde_json::from_str(&send(&router, tick).await.body).unwrap();
        assert_eq!(granted["run"], true, "{granted}");
        let done_path = format!("/v1/tasks/{task}/ticks/{}/done", granted["slot"]);
        let null = Request::post(&done_path)
            .body(Body::from(
                json!({"token": granted["token"], "outcome": outcome, "output": null}).to_string(),
            ))
            .unwrap();
        assert_eq!(send(&router, null).await.status, StatusCode::BAD_REQUEST);
        let body = json!({"token": granted["token"], "outcome": outcome, "output": output});
        let done = Request::post(&done_path)
            .body(Body::from(body.to_string()))
            .unwrap();
        let answer = send(&router, done).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        let mut kept = Value::Null;
        for _ in 0..100 {
            let detail: Value =
                serde_json::from_str(&get(&router, &format!("/v1/tasks/{task}"), &[]).await.body)
                    .unwrap();
            kept = detail["history"][0]["output"].clone();
            if !kept.is_null() {
                assert_eq!(detail["history"][0]["outcome"], outcome);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let kept = kept.as_str().unwrap_or_else(|| panic!("{kept}"));
        if output.len() <= limit {
            assert_eq!(kept, output);
        } else {
            assert_eq!(kept.len(), limit);
            assert!(output.ends_with(kept) && kept.ends_with("\u{1}THE END"));
        }
    }
    // Past the room for a whole escaped output, the body is refused as any too large one.
    let tick = Request::post("/v1/tasks/huge/ticks")
        .body(Body::from(json!({"every_ms": 1000}).to_string()))
        .unwrap();
    let granted: Value = serde_json::from_str(&send(&router, tick).await.body).unwrap();
    let body = json!({"token": granted["token"], "outcome": "ok", "output": "o".repeat(500_000)});
    let done = Request::post(format!("/v1/tasks/huge/ticks/{}/done", granted["slot"]))
        .body(Body::from(body.to_string()))
        .unwrap();
    let answer = send(&router, done).await;
    assert_eq!(
        answer.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        answer.body
    );
}

/// A page of another site cannot drive a loopback sidecar through the visitor's browser: a
/// cross-site form post is refused (403) before it reaches a handler; the page itself (same
/// origin) and clients that send no Origin are served. (A DNS name of the attacker's rebound to
/// 127.0.0.1 is refused by its Host, Origin or not: tests/hosts.rs.)
#[tokio::test]
async fn requests_browsers_send_for_other_sites_are_refused() {
    let store = BoxStore::new(MemoryStore::new());
    register(&store, "sweep").await;
    let open = router(&store, None);
    let pause = |headers: &[(&str, &str)]| {
        let mut request = Request::post("/v1/tasks/sweep/pause");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
            .header(CONTENT_TYPE, "text/plain")
            .body(Body::from("{}"))
            .unwrap()
    };
    let host = ("host", "127.0.0.1:7311");
    for (headers, why) in [
        (
            vec![host, ("origin", "http://evil.example")],
            "not this sidecar",
        ),
        (vec![host, ("origin", "null")], "not this sidecar"),
        (
            vec![
                host,
                ("origin", "http://127.0.0.1:7311"),
                ("sec-fetch-site", "cross-site"),
            ],
            "another site",
        ),
    ] {
        let answer = send(&open, pause(&headers)).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{headers:?}: {}",
            answer.body
        );
        let body: Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(body["error"], "cross-site");
        assert!(body["message"].as_str().unwrap().contains(why), "{body}");
    }
    // Nothing was paused by the refused requests.
    let task = get(&open, "/v1/tasks/sweep", &[]).await;
    let task: Value = serde_json::from_str(&task.body).unwrap();
    assert_ne!(task["state"], "paused", "{task}");
    // The page's own requests and plain clients are served.
    for headers in [
        vec![
            host,
            ("origin", "http://127.0.0.1:7311"),
            ("sec-fetch-site", "same-origin"),
        ],
        vec![
            ("host", "localhost:7311"),
            ("origin", "http://localhost:7311"),
        ],
        vec![("host", "[::1]:7311"), ("origin", "http://[::1]:7311")],
        vec![host],
    ] {
        let answer = send(&open, pause(&headers)).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "{headers:?}: {}",
            answer.body
        );
    }
    // With a token, a name that is not loopback is fine (the token is the guard).
    let guarded = router(&store, Some(TOKEN));
    let bearer = format!("Bearer {TOKEN}");
    let answer = send(
        &guarded,
        pause(&[
            ("host", "sidecar.internal:7311"),
            ("origin", "http://sidecar.internal:7311"),
            ("authorization", &bearer),
        ]),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
}
