//! The fleet endpoints (GET /v1/tasks, /v1/tasks/{task}, /v1/leases; POST pause, resume,
//! trigger) over a library scheduler's task on one store, on a paused clock: what they answer,
//! that pause and trigger reach the instance, and their typed errors. And replicas are
//! replicas: application instances that tick (or take leases) through a sidecar are the task's
//! instances and the holders, each kept in the catalog while it ticks and gone after the task's
//! idle expiry when it stops, although its sidecar lives on; the sidecar is named beside each
//! (`via`).

use std::collections::BTreeSet;
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
    // Listed with their reason, but a slot skipped on purpose is not counted as missed.
    assert_eq!(detail["missed_24h"], 0, "{detail}");
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

    // Forget is refused while the instance runs the task.
    let (status, error) = call(&api, "POST", "/v1/tasks/sweep/forget", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(error["error"], "task-live");

    // Once the instance stopped (the task stays listed: it has a control record), nobody
    // would take a trigger.
    app.shutdown().await;
    let (status, error) = call(&api, "POST", "/v1/tasks/sweep/trigger", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(error["error"], "no-instance");
    let (_, list) = call(&api, "GET", "/v1/tasks", None).await;
    assert_eq!(list["tasks"][0]["state"], "no_instance", "{list}");
    assert_eq!(list["tasks"][0]["next_slot_ms"], Value::Null);

    // Now forget takes it out of the catalog, its history kept.
    let (status, forgot) = call(&api, "POST", "/v1/tasks/sweep/forget", None).await;
    assert_eq!(status, StatusCode::OK, "{forgot}");
    assert_eq!(forgot, json!({"task": "sweep", "history_removed": false}));
    let (status, _) = call(&api, "GET", "/v1/tasks/sweep", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, list) = call(&api, "GET", "/v1/tasks", None).await;
    assert_eq!(list["tasks"], json!([]), "{list}");
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
        ("POST", "/v1/tasks/nope/forget"),
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
        (
            "/v1/tasks/x/pause",
            json!({"reason": "r".repeat(2001)}),
            "reason",
        ),
        ("/v1/tasks/x/trigger", json!({"by": ["ops"]}), "by"),
        ("/v1/tasks/x/resume", json!({"reason": "x"}), "reason"),
    ] {
        let (status, error) = call(&api, "POST", path, Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {error}");
        assert_eq!(error["field"], field, "{error}");
    }
    // Text an operator's terminal would obey (a title change, a bell, a forged table row, a
    // reversed line) is refused at this door as at the CLI's and the library's, the character
    // named visibly.
    for (path, body, field, shown) in [
        (
            "/v1/tasks/x/pause",
            json!({"reason": "\u{1b}]0;x\u{7}"}),
            "reason",
            "\\x1b",
        ),
        (
            "/v1/tasks/x/pause",
            json!({"by": "ops\nsweep  running"}),
            "by",
            "\\n",
        ),
        (
            "/v1/tasks/x/pause",
            json!({"reason": "ok", "by": "\u{202e}spo"}),
            "by",
            "\\u{202e}",
        ),
        ("/v1/tasks/x/trigger", json!({"by": "a\u{0}b"}), "by", "\\0"),
    ] {
        let (status, error) = call(&api, "POST", path, Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        assert_eq!(error["field"], field, "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("holds the character {shown} ")),
            "{message}"
        );
        assert!(
            !message.chars().any(leasehold::text::is_hidden),
            "{message:?}"
        );
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

/// A tick of `sweep` (every 2 s, ttl 3 s) by application instance `instance`; a granted run is
/// reported done at once. The answer.
async fn tick_as(api: &Router, instance: &str) -> Value {
    let (status, answer) = call(
        api,
        "POST",
        "/v1/tasks/sweep/ticks",
        Some(json!({"every_ms": 2000, "ttl_ms": 3000, "instance": instance})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    if answer["run"] == true {
        done(api, "sweep", &answer).await;
    }
    answer
}

/// The live instances of `sweep` as the fleet endpoint lists them: (instance, via).
async fn live_instances(api: &Router) -> BTreeSet<(String, String)> {
    let (status, detail) = call(api, "GET", "/v1/tasks/sweep", None).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    detail["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["live"] == true)
        .map(|i| {
            assert_eq!(
                i["pid"],
                Value::Null,
                "an application's pid is not known: {i}"
            );
            let via = i["via"].as_str().unwrap_or("-").to_owned();
            (i["instance"].as_str().unwrap().to_owned(), via)
        })
        .collect()
}

fn set(items: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    items
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// Every slot runs once among three replicas ticking through one sidecar; the three are the
/// task's instances and each run's holder names the replica that ran it; a replica that stops
/// ticking leaves the list after the idle expiry (2 × 2 s + 3 s) while the others and the
/// sidecar go on.
#[tokio::test(start_paused = true)]
async fn three_replicas_behind_one_sidecar_are_three_instances_until_one_stops() {
    let store = FaultyStore::new();
    let sidecar = Sidecar::new(
        BoxStore::new(store.clone()),
        SidecarConfig::default().holder("side"),
    );
    let api = sidecar.router(None);
    let replicas = ["app-1", "app-2", "app-3"];
    let mut ran = Vec::new();
    for round in 0..4 {
        // Each round another replica ticks first.
        for replica in replicas.iter().cycle().skip(round).take(3).copied() {
            let answer = tick_as(&api, replica).await;
            if answer["run"] == true {
                ran.push((answer["slot"].as_u64().unwrap(), replica));
            }
        }
        if round < 3 {
            tokio::time::sleep(SEC * 2).await;
        }
    }
    let slots: BTreeSet<u64> = ran.iter().map(|(slot, _)| *slot).collect();
    assert_eq!(slots.len(), 4, "one run per slot: {ran:?}");
    assert_eq!(ran.len(), 4, "no slot twice: {ran:?}");
    tokio::time::sleep(SEC).await;
    assert_eq!(
        live_instances(&api).await,
        set(&[("app-1", "side"), ("app-2", "side"), ("app-3", "side")]),
        "the replicas, not the sidecar"
    );
    let (_, detail) = call(&api, "GET", "/v1/tasks/sweep", None).await;
    let runs: Vec<&Value> = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["missed"].is_null())
        .collect();
    assert_eq!(runs.len(), 4, "{detail}");
    for run in runs {
        let holder = run["holder"].as_str().unwrap();
        let (slot, replica) = ran
            .iter()
            .find(|(slot, _)| Some(*slot) == run["slot_ms"].as_u64())
            .unwrap_or_else(|| panic!("a run of a slot not granted: {detail}"));
        assert!(
            holder.starts_with(&format!("{replica}@side#")),
            "slot {slot} run by {replica}, recorded as held by {holder}"
        );
    }

    // app-3 stops; app-1 and app-2 tick on for longer than the idle expiry.
    for _ in 0..6 {
        tokio::time::sleep(SEC * 2).await;
        tick_as(&api, "app-1").await;
        tick_as(&api, "app-2").await;
    }
    assert_eq!(
        live_instances(&api).await,
        set(&[("app-1", "side"), ("app-2", "side")]),
        "app-3 left within the idle expiry"
    );
}

/// Three replicas each behind a sidecar of its own are three instances, each named with its
/// sidecar; a lease request's instance starts the holder id (after its `holder` label).
#[tokio::test(start_paused = true)]
async fn three_replicas_behind_three_sidecars_and_lease_holders_name_the_replica() {
    let store = FaultyStore::new();
    let apis: Vec<Router> = (1..=3)
        .map(|n| {
            Sidecar::new(
                BoxStore::new(store.clone()),
                SidecarConfig::default().holder(format!("side-{n}")),
            )
            .router(None)
        })
        .collect();
    for (n, api) in apis.iter().enumerate() {
        tick_as(api, &format!("app-{}", n + 1)).await;
    }
    tokio::time::sleep(SEC).await;
    assert_eq!(
        live_instances(&apis[0]).await,
        set(&[
            ("app-1", "side-1"),
            ("app-2", "side-2"),
            ("app-3", "side-3")
        ])
    );

    for (api, lease, body, expected) in [
        (
            &apis[1],
            "report",
            json!({"ttl_ms": 5000, "instance": "app-2"}),
            "app-2@side-2#",
        ),
        (
            &apis[2],
            "audit",
            json!({"ttl_ms": 5000, "instance": "app-3", "holder": "pod-7"}),
            "pod-7@app-3@side-3#",
        ),
    ] {
        let path = format!("/v1/leases/{lease}/acquire");
        let (status, granted) = call(api, "POST", &path, Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{granted}");
        let holder = granted["holder"].as_str().unwrap();
        assert!(holder.starts_with(expected), "{granted}");
        let (_, state) = call(&apis[0], "GET", &format!("/v1/leases/{lease}"), None).await;
        assert_eq!(state["holder"], holder, "{state}");
    }
}

/// An instance is refused, naming the field, where it could forge or hide what an operator
/// reads: control and bidi characters, whitespace, empty, over 100 bytes; the same at both
/// doors.
#[tokio::test(start_paused = true)]
async fn instances_that_an_operator_could_not_read_are_refused_at_ticks_and_leases() {
    let store = FaultyStore::new();
    let api = Sidecar::new(
        BoxStore::new(store),
        SidecarConfig::default().holder("side"),
    )
    .router(None);
    let long = "a".repeat(101);
    for bad in [
        "app\u{1b}[2J",
        "app\nforged",
        "app\u{202e}1",
        "app 1",
        "",
        long.as_str(),
    ] {
        for (path, body) in [
            (
                "/v1/tasks/sweep/ticks",
                json!({"every_ms": 2000, "instance": bad}),
            ),
            (
                "/v1/leases/l/acquire",
                json!({"ttl_ms": 5000, "instance": bad}),
            ),
        ] {
            let (status, error) = call(&api, "POST", path, Some(body)).await;
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "{bad:?} at {path}: {error}"
            );
            assert_eq!(error["field"], "instance", "{bad:?} at {path}: {error}");
        }
    }
    let fine = "a".repeat(100);
    let answer = tick_as(&api, &fine).await;
    assert_eq!(answer["run"], true, "{answer}");
}

/// `done` with `outcome` (and `error`) for a granted run.
async fn done_as(api: &Router, task: &str, granted: &Value, outcome: &str, error: Option<&str>) {
    let slot = granted["slot"].as_u64().unwrap();
    let mut body = json!({"token": granted["token"], "outcome": outcome});
    if let Some(error) = error {
        body["error"] = json!(error);
    }
    let (status, answer) = call(
        api,
        "POST",
        &format!("/v1/tasks/{task}/ticks/{slot}/done"),
        Some(body),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// Runs an application reports failed make its task `failing` with the count and the error,
/// and are counted in the task's run series; a success ends the streak and is the last success.
#[tokio::test(start_paused = true)]
async fn failed_runs_reported_through_done_make_the_task_failing_and_are_counted() {
    let metrics = leasehold_serve::Metrics::install().unwrap();
    let store = FaultyStore::new();
    let sidecar = Sidecar::new(
        BoxStore::new(store.clone()),
        SidecarConfig::default().holder("side"),
    );
    let api = sidecar.router(None);
    for _ in 0..2 {
        let granted = tick(&api, "mail", 2000).await;
        assert_eq!(granted["run"], true, "{granted}");
        done_as(&api, "mail", &granted, "failed", Some("smtp: 554 rejected")).await;
        tokio::time::sleep(SEC * 2).await;
    }
    let (_, detail) = call(&api, "GET", "/v1/tasks/mail", None).await;
    assert_eq!(detail["state"], "failing", "{detail}");
    assert_eq!(detail["consecutive_failures"], 2, "{detail}");
    assert_eq!(detail["last_success_ms"], Value::Null, "{detail}");
    assert_eq!(detail["last_run"]["outcome"], "failed");
    assert_eq!(detail["last_run"]["error"], "smtp: 554 rejected");
    let scrape = metrics.render();
    let line = |name: &str| {
        scrape
            .lines()
            .find(|l| l.starts_with(name) && l.contains("task=\"mail\""))
            .unwrap_or_else(|| panic!("no {name} for mail:\n{scrape}"))
            .to_owned()
    };
    let runs = line("leasehold_runs_total{");
    assert!(
        runs.contains("outcome=\"failed\"") && runs.ends_with(" 2"),
        "{runs}"
    );
    assert!(line("leasehold_consecutive_failures{").ends_with(" 2"));
    assert!(line("leasehold_task_interval_seconds{").ends_with(" 2"));

    let granted = tick(&api, "mail", 2000).await;
    done_as(&api, "mail", &granted, "ok", None).await;
    tokio::time::sleep(SEC).await;
    let (_, detail) = call(&api, "GET", "/v1/tasks/mail", None).await;
    assert_eq!(detail["state"], "idle", "{detail}");
    assert_eq!(detail["consecutive_failures"], 0, "{detail}");
    assert_eq!(detail["last_success_ms"], detail["last_run"]["ended_ms"]);
    let scrape = metrics.render();
    let success = scrape
        .lines()
        .find(|l| l.starts_with("leasehold_last_success_timestamp_seconds{"))
        .unwrap_or_else(|| panic!("{scrape}"));
    let expected = detail["last_success_ms"].as_u64().unwrap() as f64 / 1000.0;
    let seconds: f64 = success.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        (seconds - expected).abs() < 0.001,
        "{success} vs {expected}"
    );
    assert!(
        scrape
            .lines()
            .any(|l| l.starts_with("leasehold_consecutive_failures{") && l.ends_with(" 0")),
        "{scrape}"
    );
}

/// `history_limit` bounds what the store keeps of each task ticked through the sidecar.
#[tokio::test(start_paused = true)]
async fn the_sidecar_keeps_its_history_limit() {
    let store = FaultyStore::new();
    let sidecar = Sidecar::new(
        BoxStore::new(store.clone()),
        SidecarConfig::default().holder("side").history_limit(2),
    );
    let api = sidecar.router(None);
    let mut slots = Vec::new();
    for _ in 0..4 {
        let granted = tick(&api, "mail", 2000).await;
        done(&api, "mail", &granted).await;
        slots.push(granted["slot"].as_u64().unwrap());
        tokio::time::sleep(SEC * 2).await;
    }
    let (_, detail) = call(&api, "GET", "/v1/tasks/mail?limit=50", None).await;
    let kept: Vec<u64> = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["slot_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(kept, [slots[3], slots[2]], "{detail}");
}

/// `POST /v1/tasks/{task}/backfill` asks for the past slots of a range without an ok run: the
/// library's instance runs them as trigger `backfill` and the same backfill again asks for
/// nothing; bad ranges are 400 naming the field, a task ticked through the sidecar 409
/// `no-backfill`, an unknown one 404.
#[tokio::test(start_paused = true)]
async fn backfill_runs_past_slots_once_and_refuses_what_it_cannot_run() {
    let store = FaultyStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = instance(&store, &runs);
    let sidecar = Sidecar::new(
        BoxStore::new(store.clone()),
        SidecarConfig::default().holder("side"),
    );
    let api = sidecar.router(None);
    tokio::time::sleep(SEC * 5).await;
    let (_, list) = call(&api, "GET", "/v1/tasks", None).await;
    let now = list["now_ms"].as_u64().unwrap();
    // Six slots from before the instance started.
    let to_ms = (now - 10_000) / 2000 * 2000;
    let from_ms = to_ms - 10_000;
    let range = json!({"from_ms": from_ms, "to_ms": to_ms, "by": "ops"});
    let (status, asked) = call(
        &api,
        "POST",
        "/v1/tasks/sweep/backfill",
        Some(range.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{asked}");
    let slots: Vec<u64> = (0..6).map(|k| from_ms + k * 2000).collect();
    assert_eq!(asked["slots"], json!(slots));
    assert_eq!(asked["to_run"], json!(slots));
    assert_eq!(
        asked["request"]["slots"],
        json!({"from_ms": from_ms, "to_ms": to_ms})
    );
    tokio::time::sleep(SEC * 5).await;
    let (_, detail) = call(&api, "GET", "/v1/tasks/sweep?limit=100", None).await;
    let mut backfilled: Vec<u64> = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["trigger"] == "backfill" && r["outcome"] == "ok")
        .map(|r| r["slot_ms"].as_u64().unwrap())
        .collect();
    backfilled.sort_unstable();
    assert_eq!(backfilled, slots, "{detail}");
    let (status, again) = call(&api, "POST", "/v1/tasks/sweep/backfill", Some(range)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        (&again["request"], &again["to_run"]),
        (&Value::Null, &json!([]))
    );

    let refused = [
        (json!({"from_ms": to_ms, "to_ms": from_ms}), "to_ms"),
        (json!({"from_ms": from_ms, "to_ms": now + 60_000}), "to_ms"),
        (json!({"from_ms": 0, "to_ms": to_ms}), "from_ms"),
        (json!({"from_ms": from_ms}), "to_ms"),
    ];
    for (body, field) in refused {
        let (status, error) = call(&api, "POST", "/v1/tasks/sweep/backfill", Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        assert_eq!(error["field"], field, "{error}");
    }
    let (status, error) = call(
        &api,
        "POST",
        "/v1/tasks/nope/backfill",
        Some(json!({"from_ms": from_ms, "to_ms": to_ms})),
    )
    .await;
    assert_eq!(
        (status, &error["error"]),
        (StatusCode::NOT_FOUND, &json!("unknown-task"))
    );
    // A task an application ticks through the sidecar runs one slot per tick: refused.
    let first = tick(&api, "mail", 2000).await;
    done(&api, "mail", &first).await;
    let (status, error) = call(
        &api,
        "POST",
        "/v1/tasks/mail/backfill",
        Some(json!({"from_ms": from_ms, "to_ms": to_ms})),
    )
    .await;
    assert_eq!(
        (status, &error["error"]),
        (StatusCode::CONFLICT, &json!("no-backfill")),
        "{error}"
    );
    drop(app);
}
