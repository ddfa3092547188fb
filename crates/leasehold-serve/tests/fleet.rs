//! The fleet endpoints (GET /v1/tasks, /v1/tasks/{task}, /v1/leases; POST pause, resume,
//! trigger) over a library scheduler's task on one store, on a paused clock: what they answer,
//! that pause and trigger reach the instance, and their typed errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold::faults::FaultyStore;
use leasehold::{
    BoxStore, HolderId, LeaseConfig, LeaseName, Schedule, Scheduler, SchedulerHandle, Task,
};
use leasehold_serve::{Sidecar, SidecarConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

const SEC: Duration = Duration::from_secs(1);

async fn call(
    router: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let request = Request::builder().method(method).uri(path);
    let request = match body {
        Some(body) => request.body(Body::from(body.to_string())),
        None => request.body(Body::empty()),
    }
    .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

/// A scheduler instance running `sweep` every 2 s, counting its runs.
fn instance(store: &FaultyStore, runs: &Arc<AtomicUsize>) -> SchedulerHandle {
    let runs = runs.clone();
    Scheduler::new(store.clone())
        .holder(HolderId::new("app-1").unwrap())
        .lease_config(LeaseConfig::new(SEC * 3))
        .task(Task::new(
            LeaseName::new("sweep").unwrap(),
            Schedule::every(SEC * 2).unwrap(),
            move |_| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(())
                }
            },
        ))
        .start(std::future::pending())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_catalog_is_listed_and_pause_resume_trigger_reach_the_instance() {
    let store = FaultyStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = instance(&store, &runs);
    let sidecar = Sidecar::new(
        BoxStore::new(store.clone()),
        SidecarConfig::default().holder("side"),
    );
    let api = sidecar.router(None);
    tokio::time::sleep(SEC * 5).await;

    let (status, list) = call(&api, "GET", "/v1/tasks", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let sweep = &list["tasks"][0];
    assert_eq!(sweep["name"], "sweep", "{list}");
    assert_eq!(sweep["state"], "idle");
    assert_eq!(sweep["definition"]["source"], "scheduler");
    assert_eq!(sweep["definition"]["schedule"], "every 2s");
    assert_eq!(
        sweep["definition"]["time_zone"],
        Value::Null,
        "present, null"
    );
    assert_eq!(sweep["instances"][0]["instance"], "app-1");
    assert_eq!(sweep["instances"][0]["live"], true);
    assert_eq!(sweep["last_run"]["outcome"], "ok");
    assert_eq!(sweep["last_run"]["trigger"], "timer");
    let now = list["now_ms"].as_u64().unwrap();
    let next = sweep["next_slot_ms"].as_u64().unwrap();
    assert!(
        next > now && next <= now + 2000 && next % 2000 == 0,
        "{now} {next}"
    );
    assert_eq!(sweep["missed_24h"], 0);

    // Pause: the instance skips its slots, each recorded as paused with who and why.
    let (status, paused) = call(
        &api,
        "POST",
        "/v1/tasks/sweep/pause",
        Some(json!({"reason": "vendor down", "by": "ops"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{paused}");
    assert_eq!(paused["state"], "paused");
    assert_eq!(paused["paused"]["by"], "ops");
    assert_eq!(paused["paused"]["reason"], "vendor down");
    let before = runs.load(Ordering::SeqCst);
    tokio::time::sleep(SEC * 7).await;
    assert_eq!(runs.load(Ordering::SeqCst), before, "no run while paused");
    let (status, detail) = call(&api, "GET", "/v1/tasks/sweep?limit=5", None).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["history"].as_array().unwrap().len(), 5, "{detail}");
    let missed = detail["missed"].as_array().unwrap();
    assert!(missed.len() >= 3, "{detail}");
    assert!(missed.iter().all(|m| m["reason"] == "paused"), "{detail}");
    assert_eq!(detail["missed_24h"].as_u64().unwrap(), missed.len() as u64);
    assert_eq!(detail["history"][0]["paused"]["by"], "ops");
    assert_eq!(detail["history"][0]["missed"]["reason"], "paused");

    // Resume: slots run again, and a trigger runs once more, recorded with its id.
    let (status, resumed) = call(&api, "POST", "/v1/tasks/sweep/resume", None).await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["paused"], Value::Null);
    assert_ne!(resumed["state"], "paused");
    let (status, asked) = call(
        &api,
        "POST",
        "/v1/tasks/sweep/trigger",
        Some(json!({"by": "ops"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{asked}");
    assert_eq!(asked["by"], "ops");
    let id = asked["id"].as_str().unwrap().to_owned();
    assert!(asked["expires_ms"].as_u64() > asked["at_ms"].as_u64());
    tokio::time::sleep(SEC * 3).await;
    let (_, detail) = call(&api, "GET", "/v1/tasks/sweep", None).await;
    let manual: Vec<&Value> = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["trigger"] == "manual")
        .collect();
    assert_eq!(manual.len(), 1, "{detail}");
    assert_eq!(manual[0]["request"]["id"], id.as_str());
    assert_eq!(manual[0]["request"]["by"], "ops");
    assert_eq!(manual[0]["outcome"], "ok");
    assert_eq!(detail["trigger"], Value::Null, "taken");

    // Leases: the task lease is listed with its last token.
    let (status, leases) = call(&api, "GET", "/v1/leases", None).await;
    assert_eq!(status, StatusCode::OK, "{leases}");
    let sweep_lease = leases["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "sweep")
        .unwrap_or_else(|| panic!("{leases}"));
    assert!(
        sweep_lease["token"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .is_ok()
    );

    // Once the instance stopped (the task stays listed: it has a control record), nobody
    // would take a trigger.
    app.shutdown().await;
    let (status, error) = call(&api, "POST", "/v1/tasks/sweep/trigger", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(error["error"], "no-instance");
    let (_, list) = call(&api, "GET", "/v1/tasks", None).await;
    assert_eq!(list["tasks"][0]["state"], "no_instance", "{list}");
    assert_eq!(list["tasks"][0]["next_slot_ms"], Value::Null);
}

#[tokio::test(start_paused = true)]
async fn unknown_tasks_bad_input_auth_and_a_store_without_catalog_are_typed_errors() {
    let store = FaultyStore::new();
    let sidecar = Sidecar::new(BoxStore::new(store.clone()), SidecarConfig::default());
    let api = sidecar.router(None);
    for (method, path) in [
        ("GET", "/v1/tasks/nope"),
        ("POST", "/v1/tasks/nope/pause"),
        ("POST", "/v1/tasks/nope/resume"),
        ("POST", "/v1/tasks/nope/trigger"),
    ] {
        let (status, error) = call(&api, method, path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {error}");
        assert_eq!(error["error"], "unknown-task", "{path}");
        assert!(error["message"].as_str().unwrap().contains("nope"));
    }
    for (path, body, field) in [
        ("/v1/tasks/x/pause", json!({"reason": 5}), "reason"),
        ("/v1/tasks/x/pause", json!({"why": "x"}), "why"),
        ("/v1/tasks/x/pause", json!({"by": "b".repeat(201)}), "by"),
        ("/v1/tasks/x/trigger", json!({"by": ["ops"]}), "by"),
        ("/v1/tasks/x/resume", json!({"reason": "x"}), "reason"),
    ] {
        let (status, error) = call(&api, "POST", path, Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {error}");
        assert_eq!(error["field"], field, "{error}");
    }
    for query in ["limit=0", "limit=501", "limit=x", "page=2"] {
        let (status, error) = call(&api, "GET", &format!("/v1/tasks/x?{query}"), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {error}");
    }

    let secured = sidecar.router(Some("s3cret".into()));
    for (method, path) in [
        ("GET", "/v1/tasks"),
        ("GET", "/v1/leases"),
        ("POST", "/v1/tasks/x/pause"),
        ("POST", "/v1/tasks/x/trigger"),
    ] {
        let (status, error) = call(&secured, method, path, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {error}");
    }

    store.set(|f| &f.catalog_unsupported, true);
    for (method, path) in [
        ("GET", "/v1/tasks"),
        ("GET", "/v1/leases"),
        ("POST", "/v1/tasks/x/pause"),
    ] {
        let (status, error) = call(&api, method, path, None).await;
        assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{path}: {error}");
        assert_eq!(error["error"], "no-catalog");
    }
    store.set(|f| &f.catalog_unsupported, false);
    store.set(|f| &f.down, true);
    let (status, error) = call(&api, "GET", "/v1/tasks", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{error}");
    assert_eq!(error["error"], "store-down");
}

/// One tick of `task` (every `every_ms`) through `api`.
async fn tick(api: &Router, task: &str, every_ms: u64) -> Value {
    let (status, answer) = call(
        api,
        "POST",
        &format!("/v1/tasks/{task}/ticks"),
        Some(json!({"every_ms": every_ms, "ttl_ms": 3000})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer
}

async fn done(api: &Router, task: &str, granted: &Value) {
    let slot = granted["slot"].as_u64().unwrap();
    let (status, answer) = call(
        api,
        "POST",
        &format!("/v1/tasks/{task}/ticks/{slot}/done"),
        Some(json!({"token": granted["token"], "outcome": "ok"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// Sidecar tasks are in the catalog while ticked, honour a pause, take a trigger at their next
/// tick (answered as a manual run), and the slots nobody ran between two grants are recorded
/// as missed.
#[tokio::test(start_paused = true)]
async fn sidecar_ticks_register_honour_pause_take_triggers_and_record_gaps() {
    let store = FaultyStore::new();
    let sidecar = Sidecar::new(
        BoxStore::new(store.clone()),
        SidecarConfig::default().holder("side"),
    );
    let api = sidecar.router(None);
    let first = tick(&api, "mail", 2000).await;
    assert_eq!(first["run"], true, "{first}");
    assert_eq!(first["trigger"], "timer");
    done(&api, "mail", &first).await;
    tokio::time::sleep(SEC).await;
    let (_, list) = call(&api, "GET", "/v1/tasks", None).await;
    let mail = &list["tasks"][0];
    assert_eq!(mail["name"], "mail", "{list}");
    assert_eq!(mail["definition"]["source"], "sidecar");
    assert_eq!(mail["definition"]["schedule"], "every 2s");
    assert_eq!(mail["definition"]["on_store_down"], "fail-closed");
    assert_eq!(mail["instances"][0]["instance"], "side");
    assert_eq!(mail["instances"][0]["live"], true);

    // Three slots without a tick (the application was down), then a grant: the gap is recorded.
    tokio::time::sleep(SEC * 7).await;
    let after_gap = tick(&api, "mail", 2000).await;
    assert_eq!(after_gap["run"], true, "{after_gap}");
    done(&api, "mail", &after_gap).await;
    tokio::time::sleep(SEC).await;
    let (_, detail) = call(&api, "GET", "/v1/tasks/mail", None).await;
    let gap = detail["missed"][0].clone();
    assert_eq!(gap["reason"], "not-claimed", "{detail}");
    assert_eq!(gap["count"], 3, "{detail}");
    assert_eq!(
        gap["last_slot_ms"].as_u64().unwrap() + 2000,
        after_gap["slot"].as_u64().unwrap()
    );
    assert_eq!(
        gap["slot_ms"].as_u64().unwrap(),
        first["slot"].as_u64().unwrap() + 2000
    );
    // The next slot granted here follows the last: no gap looked for, none recorded.
    tokio::time::sleep(SEC).await;
    let next = tick(&api, "mail", 2000).await;
    done(&api, "mail", &next).await;
    tokio::time::sleep(SEC).await;
    let (_, detail) = call(&api, "GET", "/v1/tasks/mail", None).await;
    assert_eq!(detail["missed"].as_array().unwrap().len(), 1, "{detail}");

    // Paused: the tick answers no, and the slot is recorded as paused.
    let (status, _) = call(
        &api,
        "POST",
        "/v1/tasks/mail/pause",
        Some(json!({"by": "ops"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(SEC * 2).await;
    let paused = tick(&api, "mail", 2000).await;
    assert_eq!(paused["run"], false, "{paused}");
    assert_eq!(paused["reason"], "paused");
    let (_, _) = call(&api, "POST", "/v1/tasks/mail/resume", None).await;

    // A trigger is taken at the next tick, which answers a manual run; done records it.
    let (status, asked) = call(
        &api,
        "POST",
        "/v1/tasks/mail/trigger",
        Some(json!({"by": "ops"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{asked}");
    let manual = tick(&api, "mail", 2000).await;
    assert_eq!(manual["run"], true, "{manual}");
    assert_eq!(manual["trigger"], "manual");
    assert_eq!(manual["slot"], asked["at_ms"]);
    done(&api, "mail", &manual).await;
    tokio::time::sleep(SEC).await;
    let (_, detail) = call(&api, "GET", "/v1/tasks/mail", None).await;
    let run = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["trigger"] == "manual")
        .unwrap_or_else(|| panic!("{detail}"))
        .clone();
    assert_eq!(run["request"]["id"], asked["id"]);
    assert_eq!(run["outcome"], "ok");
    assert_eq!(
        run["slot_ms"],
        Value::Null,
        "manual runs are filed by their start"
    );
    assert_eq!(detail["trigger"], Value::Null, "taken once");
    let again = tick(&api, "mail", 2000).await;
    assert_ne!(again["trigger"], "manual", "{again}");

    // Ticks stop: the instance leaves the catalog after twice the interval plus the ttl.
    tokio::time::sleep(SEC * 10).await;
    let (_, list) = call(&api, "GET", "/v1/tasks", None).await;
    assert_eq!(list["tasks"][0]["instances"], json!([]), "{list}");
    assert_eq!(list["tasks"][0]["state"], "no_instance");
}
