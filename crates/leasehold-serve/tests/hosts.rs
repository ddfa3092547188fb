//! The names a sidecar without a token answers under (issue 36 item 3). A web page can reach a
//! loopback sidecar under a DNS name of its own rebound to 127.0.0.1; its requests are then
//! same-origin and a GET carries no `Origin`, so only `Host` gives them away. Every route and
//! method under a foreign `Host` is refused, with no effect; loopback names, names given with
//! `allow_host`, requests without `Host`, requests with the token and unix sockets are served.
//! (The same in a real browser: tests/page/rebinding.test.mjs.)

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold::{BoxStore, CancellationToken, MemoryStore};
use leasehold_serve::{Listen, Metrics, ServeConfig, Sidecar, SidecarConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

const TOKEN: &str = "hosts-test-token-0123456789";
const FOREIGN: &str = "evil.example:7311";

/// Every route of the router, with a body that would be accepted.
const ROUTES: &[(&str, &str)] = &[
    ("/", ""),
    ("/tasks/sweep", ""),
    ("/assets/page.js", ""),
    ("/assets/page.css", ""),
    ("/healthz", ""),
    ("/openapi.json", ""),
    ("/metrics", ""),
    ("/no-such-path", ""),
    ("/v1/tasks", ""),
    ("/v1/tasks/sweep", ""),
    ("/v1/tasks/sweep/history.svg", ""),
    ("/v1/tasks/sweep/pause", "{}"),
    ("/v1/tasks/sweep/resume", "{}"),
    ("/v1/tasks/sweep/trigger", "{}"),
    ("/v1/tasks/sweep/ticks", r#"{"every_ms": 60000}"#),
    (
        "/v1/tasks/sweep/ticks/1/done",
        r#"{"token": "1", "outcome": "ok"}"#,
    ),
    ("/v1/leases", ""),
    ("/v1/leases/x", ""),
    ("/v1/leases/x/acquire", r#"{"ttl_ms": 10000}"#),
    ("/v1/leases/x/keepalive", r#"{"token": "1"}"#),
    ("/v1/leases/x/watch", r#"{"token": "1", "wait_ms": 0}"#),
    ("/v1/leases/x/release", r#"{"token": "1"}"#),
    ("/v1/groups/g", ""),
    ("/v1/groups/g/campaign", r#"{"ttl_ms": 10000}"#),
    ("/v1/groups/g/observe", r#"{"wait_ms": 0}"#),
];

const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];

/// The process's recorder (one per process), so `/metrics` answers rather than 404.
fn metrics() -> Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| Metrics::install().unwrap()).clone()
}

fn sidecar(config: SidecarConfig) -> Sidecar {
    Sidecar::new(
        BoxStore::new(MemoryStore::new()),
        config.holder("hosts-test").metrics(metrics()),
    )
}

struct Answer {
    status: StatusCode,
    content_type: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

async fn send(
    router: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = router
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        content_type,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

#[tokio::test]
async fn every_route_and_method_under_a_foreign_host_is_refused_without_effect() {
    let router = sidecar(SidecarConfig::default()).router(None);
    for (path, body) in ROUTES {
        for method in METHODS {
            let got = send(&router, method, path, &[("host", FOREIGN)], body).await;
            let what = format!("{method} {path}");
            assert_eq!(got.status, StatusCode::FORBIDDEN, "{what}: {}", got.body);
            if *method != "HEAD" {
                assert_eq!(got.content_type, "application/json", "{what}");
                let error = got.json();
                assert_eq!(error["error"], "host-not-allowed", "{what}: {error}");
                assert!(
                    error["message"].as_str().unwrap().contains(FOREIGN),
                    "{error}"
                );
            }
        }
        // A browser's navigation gets a page saying where to open the sidecar.
        let got = send(
            &router,
            "GET",
            path,
            &[("host", FOREIGN), ("accept", "text/html,*/*")],
            "",
        )
        .await;
        assert_eq!(got.status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(got.content_type, "text/html; charset=utf-8", "{path}");
        assert!(got.body.contains("Not under this name (403)"), "{path}");
        assert!(
            !got.body.contains("evil.example"),
            "nothing from the request"
        );
    }
    // Nothing happened: no task, no lease, no group.
    let local = [("host", "127.0.0.1:7311")];
    let tasks = send(&router, "GET", "/v1/tasks", &local, "").await.json();
    assert_eq!(tasks["tasks"], json!([]), "{tasks}");
    let lease = send(&router, "GET", "/v1/leases/x", &local, "")
        .await
        .json();
    assert_eq!(lease["held"], false, "{lease}");
    let group = send(&router, "GET", "/v1/groups/g", &local, "")
        .await
        .json();
    assert_eq!(group["leader"], Value::Null, "{group}");
    // The same requests under a loopback name get through.
    for (method, path, body) in [
        ("GET", "/", ""),
        ("GET", "/healthz", ""),
        ("GET", "/metrics", ""),
        ("POST", "/v1/tasks/sweep/ticks", r#"{"every_ms": 60000}"#),
        ("GET", "/v1/leases", ""),
        ("POST", "/v1/leases/x/acquire", r#"{"ttl_ms": 10000}"#),
    ] {
        let got = send(&router, method, path, &local, body).await;
        assert_eq!(got.status, StatusCode::OK, "{method} {path}: {}", got.body);
    }
}

#[tokio::test]
async fn loopback_names_requests_without_host_and_allowed_names_are_served() {
    let config = SidecarConfig::default()
        .allow_host("sidecar.test".parse().unwrap())
        .allow_host("[fd00::5]".parse().unwrap());
    let router = sidecar(config).router(None);
    for host in [
        "127.0.0.1:7311",
        "127.0.0.2",
        "[::1]:7311",
        "localhost:7311",
        "LocalHost",
        "app.localhost:7311",
        "sidecar.test:7311",
        "Sidecar.Test.",
        "[fd00::5]:7311",
    ] {
        let got = send(&router, "GET", "/v1/tasks", &[("host", host)], "").await;
        assert_eq!(got.status, StatusCode::OK, "{host}: {}", got.body);
    }
    // No Host at all: no browser sends that (see the real-socket test for HTTP/1.0).
    let got = send(&router, "GET", "/v1/tasks", &[], "").await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    for host in [
        "other.test",
        "sidecar.test.evil.example",
        "x.sidecar.test",
        "[fd00::6]",
        "0.0.0.0:7311",
        "127.0.0.1.nip.io",
        "localhost.evil.example",
    ] {
        let got = send(&router, "GET", "/v1/tasks", &[("host", host)], "").await;
        assert_eq!(got.status, StatusCode::FORBIDDEN, "{host}: {}", got.body);
    }
    // An Origin that matches a foreign Host does not help.
    let got = send(
        &router,
        "POST",
        "/v1/tasks/sweep/pause",
        &[("host", FOREIGN), ("origin", "http://evil.example:7311")],
        "{}",
    )
    .await;
    assert_eq!(got.json()["error"], "host-not-allowed");
}

#[tokio::test]
async fn with_a_token_any_name_is_answered_as_before() {
    let router = sidecar(SidecarConfig::default()).router(Some(TOKEN.to_owned()));
    let bearer = format!("Bearer {TOKEN}");
    let host = [("host", "sidecar.internal:7311")];
    for path in [
        "/",
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/assets/page.js",
    ] {
        let got = send(&router, "GET", path, &host, "").await;
        assert_eq!(got.status, StatusCode::OK, "{path}: {}", got.body);
    }
    let without = send(&router, "GET", "/v1/tasks", &host, "").await;
    assert_eq!(without.status, StatusCode::UNAUTHORIZED);
    let with = send(
        &router,
        "POST",
        "/v1/tasks/sweep/ticks",
        &[(HOST.as_str(), FOREIGN), (AUTHORIZATION.as_str(), &bearer)],
        r#"{"every_ms": 60000}"#,
    )
    .await;
    assert_eq!(with.status, StatusCode::OK, "{}", with.body);
    assert_eq!(with.json()["run"], true);
}

/// `leasehold_serve::serve` on a loopback port, stopped when dropped.
struct Served {
    stop: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn serve(listen: &Listen) -> Served {
    let stop = CancellationToken::new();
    let shutdown = stop.clone().cancelled_owned();
    let sidecar = sidecar(SidecarConfig::default());
    let listen = listen.clone();
    tokio::spawn(async move {
        leasehold_serve::serve(sidecar, &listen, ServeConfig::default(), shutdown).await
    });
    Served { stop }
}

/// Writes `request` as is and reads the answer until the server closes: its status and body.
async fn raw<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut conn: S,
    request: &str,
) -> (u16, String) {
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut got))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

async fn tcp(port: u16) -> tokio::net::TcpStream {
    for _ in 0..500 {
        if let Ok(conn) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            return conn;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing listens on {port}");
}

const TICK: &str = r#"{"every_ms": 60000}"#;

fn post_tick(host_line: &str) -> String {
    format!(
        "POST /v1/tasks/sweep/ticks HTTP/1.1\r\n{host_line}Content-Length: {}\r\nConnection: close\r\n\r\n{TICK}",
        TICK.len()
    )
}

#[tokio::test]
async fn over_a_socket_the_host_a_request_names_anywhere_is_checked() {
    let port = leasehold_testkit::free_port();
    let _served = serve(&format!("127.0.0.1:{port}").parse().unwrap());
    // The issue's request: a tick under a foreign name, no Origin.
    let (status, body) = raw(tcp(port).await, &post_tick("Host: evil.example\r\n")).await;
    assert_eq!(status, 403, "{body}");
    // The absolute form names the host in the request line.
    let (status, body) = raw(
        tcp(port).await,
        &format!(
            "GET http://evil.example:{port}/v1/tasks HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    // Two Host headers: one foreign is enough to refuse (or for hyper to refuse the request).
    let (status, body) = raw(
        tcp(port).await,
        "GET /v1/tasks HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(status == 403 || status == 400, "{status}: {body}");
    // HTTP/1.0 without Host: served (browsers always send one).
    let (status, body) = raw(tcp(port).await, "GET /healthz HTTP/1.0\r\n\r\n").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = raw(
        tcp(port).await,
        &post_tick(&format!("Host: 127.0.0.1:{port}\r\n")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""run":true"#),
        "the refused tick took nothing: {body}"
    );
}

#[tokio::test]
async fn a_unix_socket_answers_whatever_host_its_clients_name() {
    let dir = std::env::temp_dir().join(format!("leasehold-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sidecar.sock");
    let _served = serve(&Listen::Unix(path.clone()));
    let mut conn = None;
    for _ in 0..500 {
        if let Ok(c) = tokio::net::UnixStream::connect(&path).await {
            conn = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = raw(
        conn.expect("the socket"),
        &post_tick("Host: evil.example\r\n"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""run":true"#), "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_loopback_metrics_listener_answers_only_loopback_names() {
    let port = leasehold_testkit::free_port();
    let listen: Listen = format!("127.0.0.1:{port}").parse().unwrap();
    let listener = metrics().listen(&listen).await.unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(listener.serve(stop.clone().cancelled_owned()));
    let scrape =
        |host: &str| format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let (status, body) = raw(tcp(port).await, &scrape("evil.example")).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = raw(tcp(port).await, &scrape(&format!("localhost:{port}"))).await;
    assert_eq!(status, 200, "{body}");
    stop.cancel();
}
