//! A tick's run policies (timeout, retries, what becomes of a cut-off run) and the bad values
//! they refuse: on a paused clock and the memory store, and the retry and re-run paths again on
//! SQLite and Redis (LEASEHOLD_TEST_REDIS_URL) on the real clock.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold::history::{RetryNote, RunRecord};
use leasehold::{BoxStore, LeaseName, MemoryStore, Store};
use leasehold_serve::{Sidecar, SidecarConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

/// Ten minutes: a test stays in one slot unless it moves on itself.
const EVERY_MS: u64 = 600_000;

struct Api {
    router: Router,
    sidecar: Sidecar,
    store: BoxStore,
    task: String,
}

impl Api {
    fn on(store: BoxStore, holder: &str, task: &str) -> Self {
        let sidecar = Sidecar::new(store.clone(), SidecarConfig::default().holder(holder));
        Self {
            router: sidecar.router(None),
            sidecar,
            store,
            task: task.to_owned(),
        }
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", path, Body::from(body.to_string())).await
    }

    async fn call(&self, method: &str, path: &str, body: Body) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(body)
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
        (status, value)
    }

    /// A tick with `policies` added to the task's schedule.
    async fn tick(&self, policies: &Value) -> Value {
        let (status, answer) = self.tick_status(policies).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    async fn tick_status(&self, policies: &Value) -> (StatusCode, Value) {
        let mut body = json!({"every_ms": EVERY_MS, "ttl_ms": 5_000, "keepalive_ms": 2_000});
        for (k, v) in policies.as_object().unwrap() {
            body[k] = v.clone();
        }
        self.post(&format!("/v1/tasks/{}/ticks", self.task), body)
            .await
    }

    async fn done(&self, granted: &Value, outcome: &str) -> (StatusCode, Value) {
        let slot = granted["slot"].as_u64().unwrap();
        let body = json!({"token": granted["token"], "outcome": outcome, "error": "boom"});
        let path = format!("/v1/tasks/{}/ticks/{slot}/done", self.task);
        self.post(&path, body).await
    }

    async fn keepalive(&self, granted: &Value) -> (StatusCode, Value) {
        let path = format!("/v1/leases/{}/keepalive", self.task);
        self.post(&path, json!({"token": granted["token"]})).await
    }

    /// The task's history, oldest first, once the background writes landed.
    async fn history(&self) -> Vec<RunRecord> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let task = LeaseName::new(self.task.as_str()).unwrap();
        let mut records = leasehold::history::read(&self.store, &task, 50)
            .await
            .unwrap();
        records.reverse();
        records
    }

    /// Waits, if the slot is about to end, until the next one is 100 ms old.
    async fn away_from_slot_end(&self, room_ms: u64) {
        let now = self.store.now_millis().await.unwrap();
        if now % EVERY_MS + room_ms > EVERY_MS {
            tokio::time::sleep(Duration::from_millis(EVERY_MS - now % EVERY_MS + 100)).await;
        }
    }
}

fn assert_run(answer: &Value, trigger: &str, attempt: u64) {
    assert_eq!(answer["run"], true, "{answer}");
    assert_eq!(answer["trigger"], trigger, "{answer}");
    assert_eq!(answer["attempt"], attempt, "{answer}");
}

fn assert_no_run(answer: &Value, reason: &str) {
    assert_eq!(answer["run"], false, "{answer}");
    assert_eq!(answer["reason"], reason, "{answer}");
}

/// Each attempt of `slot` in the history: (attempt, outcome word).
fn attempts(history: &[RunRecord], slot: u64) -> Vec<(u32, String)> {
    history
        .iter()
        .filter(|r| r.slot == Some(slot))
        .map(|r| (r.attempt(), r.word().to_owned()))
        .collect()
}

/// Two sidecars on one memory store, ticking `task`.
fn two_sidecars(task: &str) -> (Api, Api) {
    let store = BoxStore::new(MemoryStore::new());
    (Api::on(store.clone(), "a", task), Api::on(store, "b", task))
}

fn memory_api(task: &str) -> Api {
    Api::on(BoxStore::new(MemoryStore::new()), "a", task)
}

/// A failing run with retries 2: attempts 2 and 3 of the same slot, trigger retry, each after
/// its backoff, then nothing more in that slot; the next slot starts again at attempt 1.
async fn failed_runs_are_retried_then_the_next_slot_runs(api: &Api) {
    api.away_from_slot_end(20_000).await;
    let policies = json!({"retries": 2, "retry_backoff_ms": 400, "retry_backoff_max_ms": 800});
    let first = api.tick(&policies).await;
    assert_run(&first, "timer", 1);
    let slot = first["slot"].as_u64().unwrap();
    assert_eq!(api.done(&first, "failed").await.0, StatusCode::OK);
    // Before the backoff: not yet, and when.
    let early = api.tick(&policies).await;
    assert_no_run(&early, "not-due");
    // The backoff is jittered to 200-400 ms; what is left of it depends on how long the
    // `done` and this tick took (a loaded host), so only its upper bound is sure.
    let wait = early["starts_in_ms"].as_u64().unwrap();
    assert!((1..=400).contains(&wait), "{early}");
    for attempt in [2, 3] {
        tokio::time::sleep(Duration::from_millis(900)).await;
        let retry = api.tick(&policies).await;
        assert_run(&retry, "retry", attempt);
        assert_eq!(retry["slot"], slot, "{retry}");
        assert_eq!(api.done(&retry, "failed").await.0, StatusCode::OK);
    }
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_no_run(&api.tick(&policies).await, "already-run");
    let history = api.history().await;
    assert_eq!(
        attempts(&history, slot),
        [1, 2, 3].map(|n| (n, "failed".to_owned()))
    );
    // The task's page and API show each attempt with the words `leasehold history` uses.
    let path = format!("/v1/tasks/{}", api.task);
    let (status, detail) = api.call("GET", &path, Body::empty()).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    let shown: Vec<(Value, Value)> = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["slot_ms"] == slot)
        .map(|r| (r["attempt"].clone(), r["outcome"].clone()))
        .collect();
    assert_eq!(
        shown,
        [3, 2, 1].map(|n| (json!(n), json!("failed"))),
        "{detail}"
    );
}

/// A caller that goes silent mid-run: the next tick runs the slot again as attempt 2, trigger
/// retry, once; with on_interrupt skip, not at all.
async fn a_silent_caller_s_slot_is_run_again_once(api: &Api, on_interrupt: &str) {
    api.away_from_slot_end(20_000).await;
    let policies = json!({"on_interrupt": on_interrupt, "keepalive_ms": 500});
    let first = api.tick(&policies).await;
    assert_run(&first, "timer", 1);
    let slot = first["slot"].as_u64().unwrap();
    // Silent past its keepalive: the run is ended, recorded cancelled.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (status, lost) = api.keepalive(&first).await;
    assert_eq!(
        (status, lost["reason"].clone()),
        (StatusCode::GONE, json!("app-silent"))
    );
    let next = api.tick(&policies).await;
    if on_interrupt == "skip" {
        assert_no_run(&next, "already-run");
        assert_eq!(
            attempts(&api.history().await, slot),
            [(1, "cancelled".to_owned())]
        );
        return;
    }
    assert_run(&next, "retry", 2);
    assert_eq!(next["slot"], slot, "{next}");
    assert_eq!(api.done(&next, "ok").await.0, StatusCode::OK);
    // Once: the slot's newest attempt ended ok.
    assert_no_run(&api.tick(&policies).await, "already-run");
    assert_eq!(
        attempts(&api.history().await, slot),
        [(1, "cancelled".to_owned()), (2, "ok".to_owned())]
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_past_its_timeout_hears_timed_out_and_is_recorded_so() {
    let api = memory_api("sweep");
    let policies = json!({"timeout_ms": 1_000, "keepalive_ms": 5_000});
    let run = api.tick(&policies).await;
    assert_run(&run, "timer", 1);
    // Its validity never runs past the timeout.
    assert!(run["valid_for_ms"].as_u64().unwrap() <= 1_000, "{run}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(api.keepalive(&run).await.0, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, lost) = api.keepalive(&run).await;
    assert_eq!(
        (status, &lost["reason"]),
        (StatusCode::GONE, &json!("timed-out")),
        "{lost}"
    );
    let (status, lost) = api.done(&run, "ok").await;
    assert_eq!(
        (status, &lost["reason"]),
        (StatusCode::GONE, &json!("timed-out")),
        "{lost}"
    );
    let slot = run["slot"].as_u64().unwrap();
    let history = api.history().await;
    assert_eq!(attempts(&history, slot), [(1, "timed-out".to_owned())]);
    // The lease was released at the timeout: a manual-free next slot runs at once.
    tokio::time::sleep(Duration::from_millis(EVERY_MS)).await;
    assert_run(&api.tick(&policies).await, "timer", 1);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_run_with_retries_is_retried() {
    let api = memory_api("sweep");
    let policies = json!({"timeout_ms": 1_000, "retries": 1, "retry_backoff_ms": 100});
    let run = api.tick(&policies).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let retry = api.tick(&policies).await;
    assert_run(&retry, "retry", 2);
    assert_eq!(retry["slot"], run["slot"]);
}

#[tokio::test(start_paused = true)]
async fn a_failing_run_with_retries_2_runs_attempts_2_and_3_then_the_next_slot() {
    let api = memory_api("mail");
    failed_runs_are_retried_then_the_next_slot_runs(&api).await;
    tokio::time::sleep(Duration::from_millis(EVERY_MS)).await;
    let next = api.tick(&json!({"retries": 2})).await;
    assert_run(&next, "timer", 1);
}

#[tokio::test(start_paused = true)]
async fn a_retry_never_runs_past_the_next_slot() {
    let api = memory_api("mail");
    let policies = json!({"retries": 3, "retry_backoff_ms": 8_000});
    api.away_from_slot_end(20_000).await;
    let now = api.store.now_millis().await.unwrap();
    // 2 s before the next slot (and more than a tick's early tolerance): the retry's backoff,
    // 4 to 8 s, would pass it.
    tokio::time::sleep(Duration::from_millis(EVERY_MS - now % EVERY_MS - 2_000)).await;
    let first = api.tick(&policies).await;
    api.done(&first, "failed").await;
    let history = api.history().await;
    let failed = history
        .iter()
        .rfind(|r| r.slot == first["slot"].as_u64())
        .unwrap();
    let next_slot = first["slot"].as_u64().unwrap() + EVERY_MS;
    assert_eq!(
        failed.retry,
        Some(RetryNote::DroppedBeforeSlot(next_slot)),
        "{failed:?}"
    );
    assert_no_run(&api.tick(&policies).await, "already-run");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_run(&api.tick(&policies).await, "timer", 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_goes_silent_mid_run_has_its_slot_run_again_once() {
    a_silent_caller_s_slot_is_run_again_once(&memory_api("report"), "rerun").await;
}

#[tokio::test(start_paused = true)]
async fn with_on_interrupt_skip_a_silent_caller_s_slot_is_left() {
    a_silent_caller_s_slot_is_run_again_once(&memory_api("report"), "skip").await;
}

#[tokio::test(start_paused = true)]
async fn a_run_cut_off_before_a_new_slot_is_run_again_at_the_tick_after_it() {
    let api = memory_api("report");
    let policies = json!({"keepalive_ms": 500});
    let first = api.tick(&policies).await;
    let slot = first["slot"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_millis(EVERY_MS)).await;
    // The new slot runs first; the cut-off one right after it.
    let next = api.tick(&policies).await;
    assert_run(&next, "timer", 1);
    api.done(&next, "ok").await;
    let again = api.tick(&policies).await;
    assert_run(&again, "retry", 2);
    assert_eq!(again["slot"], slot);
}

#[tokio::test(start_paused = true)]
async fn a_sidecar_that_died_mid_run_has_its_slot_run_again_by_the_next() {
    let store = BoxStore::new(MemoryStore::new());
    let dead = Api::on(store.clone(), "dead", "report");
    let run = dead.tick(&json!({})).await;
    assert_run(&run, "timer", 1);
    // Stopped mid-run, its run's end never recorded: the history says `running` under its
    // tenure, as a sidecar killed mid-run leaves it (its lease released here rather than
    // expiring, which the finder does not look at).
    dead.sidecar.shut_down(Duration::from_secs(1)).await;
    drop(dead);
    let slot = run["slot"].as_u64().unwrap();
    let next = Api::on(store, "next", "report");
    // Read back, a run still `running` that no tenure holds any more is `interrupted`.
    let history = next.history().await;
    assert_eq!(attempts(&history, slot), [(1, "interrupted".to_owned())]);
    let again = next.tick(&json!({})).await;
    assert_run(&again, "retry", 2);
    assert_eq!(again["slot"], slot);
    assert_eq!(next.done(&again, "ok").await.0, StatusCode::OK);
    assert_no_run(&next.tick(&json!({})).await, "already-run");
}

#[tokio::test(start_paused = true)]
async fn bad_policies_get_a_field_error() {
    let api = memory_api("mail");
    for (body, field) in [
        (json!({"timeout_ms": 0}), "timeout_ms"),
        (json!({"retries": 101}), "retries"),
        (json!({"retries": -1}), "retries"),
        (json!({"retry_backoff_ms": 0}), "retry_backoff_ms"),
        (
            json!({"retry_backoff_ms": 500, "retry_backoff_max_ms": 100}),
            "retry_backoff_max_ms",
        ),
        (json!({"jitter_ms": 1_800_001}), "jitter_ms"),
        (json!({"overlap": "replace"}), "overlap"),
        (json!({"overlap": "sometimes"}), "overlap"),
        (json!({"on_interrupt": "retry"}), "on_interrupt"),
        (json!({"on_interrupt": null}), "on_interrupt"),
        (json!({"history": 0}), "history"),
        (json!({"history": 1_001}), "history"),
    ] {
        let (status, error) = api.tick_status(&body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        assert_eq!(error["field"], field, "{body}: {error}");
    }
    for body in [json!({"overlap": "skip", "on_interrupt": "skip", "jitter_ms": 0})] {
        assert_eq!(api.tick_status(&body).await.0, StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn jitter_puts_a_slot_s_start_off_alike_on_every_sidecar() {
    let (a, b) = two_sidecars("fleet");
    let policies = json!({"jitter_ms": 60_000});
    a.away_from_slot_end(100_000).await;
    let now = a.store.now_millis().await.unwrap();
    tokio::time::sleep(Duration::from_millis(EVERY_MS - now % EVERY_MS + 1)).await;
    let (wa, wb) = (a.tick(&policies).await, b.tick(&policies).await);
    assert_no_run(&wa, "not-due");
    let wait = wa["starts_in_ms"].as_u64().unwrap();
    assert!(wait < 60_000, "{wa}");
    assert!(
        wb["starts_in_ms"].as_u64().unwrap().abs_diff(wait) < 10,
        "{wb}"
    );
    tokio::time::sleep(Duration::from_millis(wait)).await;
    assert_run(&a.tick(&policies).await, "timer", 1);
    assert_no_run(&b.tick(&policies).await, "already-run");
}

fn unique(task: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{task}-{}-{nanos}", std::process::id())
}

async fn on_real_store(store: BoxStore) {
    let api = Api::on(store.clone(), "a", &unique("mail"));
    failed_runs_are_retried_then_the_next_slot_runs(&api).await;
    let api = Api::on(store, "a", &unique("report"));
    a_silent_caller_s_slot_is_run_again_once(&api, "rerun").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_reruns_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("leases.db").display());
    let store = leasehold_sqlite::connect(&url).await.unwrap();
    on_real_store(BoxStore::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_reruns_on_redis() {
    let Ok(url) = std::env::var("LEASEHOLD_TEST_REDIS_URL") else {
        eprintln!("LEASEHOLD_TEST_REDIS_URL not set: skipped");
        return;
    };
    let store = leasehold_redis::connect(&url).await.unwrap();
    on_real_store(BoxStore::new(store)).await;
}

#[tokio::test(start_paused = true)]
async fn with_overlap_allow_a_slot_runs_beside_a_long_run_under_its_own_lease() {
    let (a, b) = two_sidecars("etl");
    let policies = json!({"overlap": "allow", "keepalive_ms": 700_000, "ttl_ms": 10_000});
    a.away_from_slot_end(20_000).await;
    let long = a.tick(&policies).await;
    assert_run(&long, "timer", 1);
    assert!(long.get("lease").is_none(), "{long}");
    tokio::time::sleep(Duration::from_millis(EVERY_MS)).await;
    assert_eq!(a.keepalive(&long).await.0, StatusCode::OK);
    // The next slot while the first run holds the task lease: run beside it, once.
    let beside = b.tick(&policies).await;
    assert_run(&beside, "timer", 1);
    let slot = beside["slot"].as_u64().unwrap();
    assert_eq!(slot, long["slot"].as_u64().unwrap() + EVERY_MS);
    assert_eq!(beside["lease"], format!("etl/slot/{slot}"), "{beside}");
    assert_ne!(beside["token"], long["token"]);
    assert_no_run(&a.tick(&policies).await, "already-run");
    // The long run ends a second later (the task lease's next tenure is newer than the run
    // lease's): the task lease is free, but the run beside it still goes (recorded `running`
    // under its own lease's token): neither sidecar takes it for a cut-off run.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(a.done(&long, "ok").await.0, StatusCode::OK);
    assert_no_run(&a.tick(&policies).await, "already-run");
    assert_no_run(&b.tick(&policies).await, "already-run");
    // Kept alive under its own lease (the name's `/` sent encoded), ended by `done`.
    let path = format!("/v1/leases/etl%2Fslot%2F{slot}/keepalive");
    let (status, kept) = b.post(&path, json!({"token": beside["token"]})).await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    assert_eq!(b.done(&beside, "ok").await.0, StatusCode::OK);
    assert_no_run(&a.tick(&policies).await, "already-run");
    let history = a.history().await;
    assert_eq!(attempts(&history, slot), [(1, "ok".to_owned())]);
    assert_eq!(attempts(&history, slot - EVERY_MS), [(1, "ok".to_owned())]);
}

#[tokio::test(start_paused = true)]
async fn with_overlap_skip_a_slot_falling_during_a_run_is_busy() {
    let api = memory_api("etl");
    let policies = json!({"overlap": "skip", "keepalive_ms": 700_000, "ttl_ms": 10_000});
    api.away_from_slot_end(20_000).await;
    let long = api.tick(&policies).await;
    assert_run(&long, "timer", 1);
    tokio::time::sleep(Duration::from_millis(EVERY_MS)).await;
    assert_eq!(api.keepalive(&long).await.0, StatusCode::OK);
    assert_no_run(&api.tick(&policies).await, "busy");
    // Once that run ended, a later tick of the slot runs it.
    assert_eq!(api.done(&long, "ok").await.0, StatusCode::OK);
    assert_run(&api.tick(&policies).await, "timer", 1);
}

#[tokio::test(start_paused = true)]
async fn a_cut_off_run_is_run_again_once_across_sidecars() {
    let (a, b) = two_sidecars("report");
    let policies = json!({"keepalive_ms": 500});
    a.away_from_slot_end(20_000).await;
    let first = a.tick(&policies).await;
    let slot = first["slot"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Both sidecars find it cut off; the one that takes the task lease first runs it again,
    // and the other, looking afresh under the lease, sees that attempt.
    let again = b.tick(&policies).await;
    assert_run(&again, "retry", 2);
    assert_no_run(&a.tick(&policies).await, "already-run");
    assert_eq!(b.done(&again, "ok").await.0, StatusCode::OK);
    assert_no_run(&a.tick(&policies).await, "already-run");
    assert_no_run(&b.tick(&policies).await, "already-run");
    assert_eq!(
        attempts(&a.history().await, slot),
        [(1, "cancelled".to_owned()), (2, "ok".to_owned())]
    );
}

#[tokio::test(start_paused = true)]
async fn a_tick_s_history_length_bounds_the_task_s_history() {
    let api = memory_api("short");
    let policies = json!({"history": 3});
    for _ in 0..5 {
        let run = api.tick(&policies).await;
        assert_run(&run, "timer", 1);
        assert_eq!(api.done(&run, "ok").await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(EVERY_MS)).await;
    }
    assert_eq!(api.history().await.len(), 3);
}
