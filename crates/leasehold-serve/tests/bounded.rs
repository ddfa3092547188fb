//! One-off names leave nothing behind in a sidecar once they are given up (issue 36 item 5): the
//! tasks ticked, the groups campaigned for, the leases and runs held, their catalog entries and
//! their series on `/metrics` go, so a sidecar that many names went through comes back to its
//! size before them. On a paused clock, against the in-process store.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold::{BoxStore, MemoryStore};
use leasehold_serve::{Kept, Metrics, Sidecar, SidecarConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

/// How many one-off names of each kind go through the sidecar.
const NAMES: usize = 40;

async fn call(
    router: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, String) {
    let request = Request::builder().method(method).uri(path);
    let request = match body {
        Some(body) => request.body(Body::from(body.to_string())),
        None => request.body(Body::empty()),
    }
    .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn post(router: &Router, path: &str, body: Value) -> Value {
    let (status, text) = call(router, "POST", path, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// One name through every door that keeps something per name: a task ticked in a group of its
/// own (its run reported done), a lease taken and released, a group campaigned for and
/// resigned.
async fn one_off(router: &Router, name: &str) {
    let tick = json!({"every_ms": 1000, "ttl_ms": 3000, "group": format!("g-{name}")});
    let answer = post(router, &format!("/v1/tasks/t-{name}/ticks"), tick).await;
    assert_eq!(answer["run"], true, "{answer}");
    let slot = answer["slot"].as_u64().unwrap();
    post(
        router,
        &format!("/v1/tasks/t-{name}/ticks/{slot}/done"),
        json!({"token": answer["token"], "outcome": "ok"}),
    )
    .await;
    for (door, lease) in [
        ("leases", format!("l-{name}")),
        ("groups", format!("c-{name}")),
    ] {
        let path = match door {
            "leases" => format!("/v1/leases/{lease}/acquire"),
            _ => format!("/v1/groups/{lease}/campaign"),
        };
        let granted = post(router, &path, json!({"ttl_ms": 3000})).await;
        assert_eq!(granted["acquired"], true, "{granted}");
        let released = post(
            router,
            &format!("/v1/leases/{lease}/release"),
            json!({"token": granted["token"]}),
        )
        .await;
        assert_eq!(released["released"], true, "{released}");
    }
}

/// The `/metrics` text (scraped twice, so the scrape's own series are in it).
async fn scrape(router: &Router) -> String {
    call(router, "GET", "/metrics", None).await;
    let (status, text) = call(router, "GET", "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    text
}

/// Long enough for every name given up to be forgotten: past the tasks' and groups' idle
/// expiry (2 × 1 s + 3 s), their catalog heartbeat, and the 2 minutes ends are remembered.
async fn forget() {
    tokio::time::sleep(Duration::from_secs(125)).await;
}

#[tokio::test(start_paused = true)]
async fn one_off_names_leave_no_state_and_no_series_once_given_up() {
    let metrics = Metrics::install().unwrap();
    let sidecar = Sidecar::new(
        BoxStore::new(MemoryStore::new()),
        SidecarConfig::default().holder("bounded").metrics(metrics),
    );
    let router = sidecar.router(None);
    // The baseline has been through every route once, so the series of routes are in it.
    one_off(&router, "warm-up").await;
    forget().await;
    let baseline = (sidecar.kept(), scrape(&router).await);
    assert!(!baseline.1.contains("warm-up"), "{}", baseline.1);

    for i in 0..NAMES {
        one_off(&router, &format!("n{i}")).await;
    }
    let busy = (sidecar.kept(), scrape(&router).await);
    let at_least = |n: usize| n >= NAMES;
    let Kept {
        ended,
        ticked,
        registered,
        groups,
        ..
    } = busy.0;
    assert!(
        at_least(ended) && at_least(ticked) && at_least(registered) && at_least(groups),
        "{:?}",
        busy.0
    );
    assert!(
        busy.1.contains("leasehold_leader{group=\"g-n0\"} 1"),
        "{}",
        busy.1
    );
    assert!(busy.1.lines().count() > baseline.1.lines().count() + 18 * NAMES);

    forget().await;
    let after = (sidecar.kept(), scrape(&router).await);
    assert_eq!(after.0, baseline.0);
    let names: Vec<_> = after
        .1
        .lines()
        .filter(|l| l.contains("n0") || l.contains("g-n"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
    assert_eq!(
        after.1.lines().count(),
        baseline.1.lines().count(),
        "before:\n{}\nafter:\n{}",
        baseline.1,
        after.1
    );
    // The same series; only their values (counts, sums) have more digits.
    assert!(
        after.1.len() < baseline.1.len() + 400,
        "{} bytes, {} at the baseline",
        after.1.len(),
        baseline.1.len()
    );
}
