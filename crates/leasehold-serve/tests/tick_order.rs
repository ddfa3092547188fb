//! The order in which a sidecar's ticks take a manual trigger (`POST /v1/tasks/{task}/trigger`,
//! `leasehold trigger`), on a paused clock and the memory store: a tick whose timer slot runs
//! leaves the trigger pending, and the task's next tick takes it, once across every sidecar.
//! Every scenario runs twice: with the store deciding a tick in one call (`Slots::tick`), and
//! with the gate's separate calls.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold::store::{Answer, Layer, StoreResult};
use leasehold::{BoxStore, Capabilities, MemoryStore, Store};
use leasehold_serve::{Sidecar, SidecarConfig};
use serde_json::{Value, json};
use tokio::sync::watch;
use tower::ServiceExt;

const EVERY_MS: u64 = 2000;
const TASK: &str = "mail";

/// A memory store seen through a probe: notes every call, holds acquires while told to, and
/// hides the one-call tick when asked (then the gate decides with separate calls).
#[derive(Clone)]
struct Probe {
    inner: MemoryStore,
    one_call: bool,
    calls: Arc<Mutex<Vec<&'static str>>>,
    /// `false`: acquires wait (before they reach the store) until it turns `true`.
    acquires: Arc<watch::Sender<bool>>,
}

impl Probe {
    fn new(inner: &MemoryStore, one_call: bool) -> Self {
        Self {
            inner: inner.clone(),
            one_call,
            calls: Arc::default(),
            acquires: Arc::new(watch::channel(true).0),
        }
    }

    fn hold_acquires(&self, hold: bool) {
        self.acquires.send_replace(!hold);
    }

    fn calls(&self) -> Vec<&'static str> {
        self.calls.lock().unwrap().clone()
    }
}

impl Layer for Probe {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn around<'a, T: Answer, F>(
        &'a self,
        op: &'static str,
        call: impl FnOnce() -> F + Send + 'a,
    ) -> StoreResult<T>
    where
        F: Future<Output = StoreResult<T>> + Send + 'a,
    {
        self.calls.lock().unwrap().push(op);
        if op == "acquire" {
            let mut open = self.acquires.subscribe();
            let _ = open.wait_for(|open| *open).await;
        }
        call().await
    }

    fn capabilities_offered(&self) -> Capabilities {
        let all = Store::capabilities(&self.inner);
        match self.one_call {
            true => all,
            false => all.without(Capabilities::TICK),
        }
    }
}

/// A sidecar named `holder` on `store`, and its router.
fn sidecar(store: &Probe, holder: &str) -> Router {
    let sidecar = Sidecar::new(
        BoxStore::new(store.clone()),
        SidecarConfig::default().holder(holder),
    );
    sidecar.router(None)
}

async fn call(api: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let request = Request::builder().method(method).uri(path);
    let request = match body {
        Some(body) => request.body(Body::from(body.to_string())),
        None => request.body(Body::empty()),
    }
    .unwrap();
    let response = api.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

async fn tick(api: &Router) -> Value {
    let body = json!({"every_ms": EVERY_MS, "ttl_ms": 30_000});
    let (status, answer) = call(api, "POST", &format!("/v1/tasks/{TASK}/ticks"), Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer
}

async fn done(api: &Router, granted: &Value) {
    let slot = granted["slot"].as_u64().unwrap();
    let body = json!({"token": granted["token"], "outcome": "ok"});
    let path = format!("/v1/tasks/{TASK}/ticks/{slot}/done");
    let (status, answer) = call(api, "POST", &path, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["released"], true, "{answer}");
}

async fn trigger(api: &Router) -> Value {
    // The first tick registers the task in the background: let it land.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let path = format!("/v1/tasks/{TASK}/trigger");
    let (status, asked) = call(api, "POST", &path, Some(json!({"by": "ops"}))).await;
    assert_eq!(status, StatusCode::OK, "{asked}");
    asked
}

async fn detail(api: &Router) -> Value {
    // History writes go in the background: let them land.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, detail) = call(api, "GET", &format!("/v1/tasks/{TASK}"), None).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    detail
}

/// The trigger the task's control record holds, if one is pending.
async fn pending(api: &Router) -> Option<String> {
    let detail = detail(api).await;
    detail["trigger"]["id"].as_str().map(str::to_owned)
}

/// The runs recorded for the trigger `asked`.
async fn manual_runs(api: &Router, asked: &Value) -> Vec<Value> {
    let detail = detail(api).await;
    let history = detail["history"].as_array().cloned().unwrap_or_default();
    history
        .into_iter()
        .filter(|r| r["trigger"] == "manual" && r["request"]["id"] == asked["id"])
        .collect()
}

/// Waits until the store's clock is 10 ms into a slot; answers that slot.
async fn into_next_slot(store: &MemoryStore) -> u64 {
    let now = store.now_millis().await.unwrap();
    let next = (now / EVERY_MS + 1) * EVERY_MS;
    tokio::time::sleep(Duration::from_millis(next + 10 - now)).await;
    next
}

/// A timer run of a fresh slot on `api`, ended, then a trigger asked for: answers the trigger.
async fn ran_then_triggered(api: &Router, memory: &MemoryStore) -> Value {
    into_next_slot(memory).await;
    let first = tick(api).await;
    assert_eq!(first["trigger"], "timer", "{first}");
    done(api, &first).await;
    trigger(api).await
}

fn assert_grant(answer: &Value, trigger: &str, path: &str) {
    assert_eq!(answer["run"], true, "{path}: {answer}");
    assert_eq!(answer["trigger"], trigger, "{path}: {answer}");
}

fn assert_skip(answer: &Value, reason: &str, path: &str) {
    assert_eq!(answer["run"], false, "{path}: {answer}");
    assert_eq!(answer["reason"], reason, "{path}: {answer}");
}

fn path_name(one_call: bool) -> &'static str {
    match one_call {
        true => "one call",
        false => "separate calls",
    }
}

/// (a) A trigger pending while a timer slot is due: that tick runs the timer slot and leaves the
/// trigger; a tick while the timer run holds the task lease leaves it too (never beside a run);
/// the next tick after the run ended takes it, once.
#[tokio::test(start_paused = true)]
async fn a_tick_whose_timer_slot_runs_leaves_the_trigger_to_the_next() {
    for one_call in [true, false] {
        let path = path_name(one_call);
        let memory = MemoryStore::new();
        let api = sidecar(&Probe::new(&memory, one_call), "a");
        let asked = ran_then_triggered(&api, &memory).await;

        let slot = into_next_slot(&memory).await;
        let timer = tick(&api).await;
        assert_grant(&timer, "timer", path);
        assert_eq!(timer["slot"], slot, "{path}");
        assert_eq!(
            pending(&api).await.as_deref(),
            asked["id"].as_str(),
            "{path}"
        );

        let during = tick(&api).await;
        assert_skip(&during, "already-run", path);
        assert_eq!(
            pending(&api).await.as_deref(),
            asked["id"].as_str(),
            "{path}"
        );
        done(&api, &timer).await;

        let manual = tick(&api).await;
        assert_grant(&manual, "manual", path);
        assert_eq!(manual["slot"], asked["at_ms"], "{path}");
        assert_eq!(pending(&api).await, None, "{path}: taken");
        done(&api, &manual).await;

        let after = tick(&api).await;
        assert_skip(&after, "already-run", path);
        assert_eq!(manual_runs(&api, &asked).await.len(), 1, "{path}");
    }
}

/// An application that ticks once per slot, on the only instance: every tick's timer slot is
/// due and runs here, so the tick after the one that left the trigger pending must take it
/// (the slot it gives up is recorded as missed), not leave it to lapse.
#[tokio::test(start_paused = true)]
async fn one_instance_ticking_once_per_slot_takes_the_trigger_at_its_next_tick() {
    for one_call in [true, false] {
        let path = path_name(one_call);
        let memory = MemoryStore::new();
        let api = sidecar(&Probe::new(&memory, one_call), "a");
        let asked = ran_then_triggered(&api, &memory).await;

        into_next_slot(&memory).await;
        let timer = tick(&api).await;
        assert_eq!(timer["trigger"], "timer", "{path}: {timer}");
        done(&api, &timer).await;

        let given_up = into_next_slot(&memory).await;
        let manual = tick(&api).await;
        assert_grant(&manual, "manual", path);
        assert_eq!(manual["slot"], asked["at_ms"], "{path}");
        done(&api, &manual).await;

        let next = into_next_slot(&memory).await;
        let timer = tick(&api).await;
        assert_eq!(timer["trigger"], "timer", "{path}: {timer}");
        assert_eq!(timer["slot"], next, "{path}");
        done(&api, &timer).await;
        assert_eq!(manual_runs(&api, &asked).await.len(), 1, "{path}");
        let detail = detail(&api).await;
        let missed = &detail["missed"][0];
        assert_eq!(missed["slot_ms"], given_up, "{path}: {detail}");
        assert_eq!(missed["count"], 1, "{path}: {detail}");
    }
}

/// (b) Two sidecars tick at the same moment, their timer slot already run: exactly one takes
/// the trigger.
#[tokio::test(start_paused = true)]
async fn two_sidecars_ticking_at_once_take_a_trigger_once() {
    for one_call in [true, false] {
        let path = path_name(one_call);
        let memory = MemoryStore::new();
        let a = sidecar(&Probe::new(&memory, one_call), "a");
        let b = sidecar(&Probe::new(&memory, one_call), "b");
        let asked = ran_then_triggered(&a, &memory).await;

        let (on_a, on_b) = tokio::join!(tick(&a), tick(&b));
        let granted: Vec<_> = [(&a, &on_a), (&b, &on_b)]
            .into_iter()
            .filter(|(_, answer)| answer["run"] == true)
            .collect();
        assert_eq!(granted.len(), 1, "{path}: {on_a} {on_b}");
        let (api, manual) = granted[0];
        assert_eq!(manual["trigger"], "manual", "{path}: {manual}");
        done(api, manual).await;

        let (again_a, again_b) = tokio::join!(tick(&a), tick(&b));
        assert_eq!(again_a["run"], false, "{path}: {again_a}");
        assert_eq!(again_b["run"], false, "{path}: {again_b}");
        assert_eq!(manual_runs(&a, &asked).await.len(), 1, "{path}");
    }
}

/// (b) A tick that read the pending trigger, then answered late, does not take it again after
/// another sidecar took it and its run ended (the task lease is free by then): the control
/// record's compare-and-set stops it.
#[tokio::test(start_paused = true)]
async fn a_tick_that_saw_the_trigger_before_another_took_it_does_not_run_it_again() {
    for one_call in [true, false] {
        let path = path_name(one_call);
        let memory = MemoryStore::new();
        let a = sidecar(&Probe::new(&memory, one_call), "a");
        let slow = Probe::new(&memory, one_call);
        let b = sidecar(&slow, "b");
        let asked = ran_then_triggered(&a, &memory).await;

        slow.hold_acquires(true);
        let late = tokio::spawn({
            let b = b.clone();
            async move { tick(&b).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            slow.calls().contains(&"acquire"),
            "{path}: {:?}",
            slow.calls()
        );
        let manual = tick(&a).await;
        assert_eq!(manual["trigger"], "manual", "{path}: {manual}");
        done(&a, &manual).await;
        slow.hold_acquires(false);
        let late = late.await.unwrap();
        assert_eq!(late["run"], false, "{path}: {late}");
        assert!(
            slow.calls().contains(&"set_control"),
            "{path}: the late tick tried to take the trigger: {:?}",
            slow.calls()
        );
        assert_eq!(manual_runs(&a, &asked).await.len(), 1, "{path}");
    }
}

/// (c) A paused task: no timer slot runs (each is recorded as paused). A trigger is a manual
/// run, and manual runs bypass the gate (DESIGN §1.5, as the library scheduler does): the tick
/// takes it, once.
#[tokio::test(start_paused = true)]
async fn a_paused_task_runs_no_timer_slot_but_takes_a_trigger_once() {
    for one_call in [true, false] {
        let path = path_name(one_call);
        let memory = MemoryStore::new();
        let api = sidecar(&Probe::new(&memory, one_call), "a");
        into_next_slot(&memory).await;
        let first = tick(&api).await;
        done(&api, &first).await;
        let pause = format!("/v1/tasks/{TASK}/pause");
        let (status, _) = call(&api, "POST", &pause, Some(json!({"by": "ops"}))).await;
        assert_eq!(status, StatusCode::OK, "{path}");

        let paused_slot = into_next_slot(&memory).await;
        let paused = tick(&api).await;
        assert_skip(&paused, "paused", path);

        let asked = trigger(&api).await;
        let manual = tick(&api).await;
        assert_grant(&manual, "manual", path);
        done(&api, &manual).await;

        into_next_slot(&memory).await;
        let still = tick(&api).await;
        assert_skip(&still, "paused", path);
        assert_eq!(manual_runs(&api, &asked).await.len(), 1, "{path}");
        let detail = detail(&api).await;
        let history = detail["history"].as_array().unwrap();
        let timer_runs = history.iter().filter(|r| r["trigger"] == "timer").count();
        assert_eq!(
            timer_runs, 1,
            "{path}: only the slot before the pause ran: {detail}"
        );
        assert!(
            history
                .iter()
                .any(|r| r["slot_ms"] == paused_slot && r["paused"]["by"] == "ops"),
            "{path}: {detail}"
        );
    }
}

/// (d) The timer slot already run by another sidecar: the tick takes the trigger, but only once
/// that run has ended (never beside it).
#[tokio::test(start_paused = true)]
async fn a_tick_whose_slot_ran_elsewhere_takes_the_trigger_once_that_run_ended() {
    for one_call in [true, false] {
        let path = path_name(one_call);
        let memory = MemoryStore::new();
        let a = sidecar(&Probe::new(&memory, one_call), "a");
        let b = sidecar(&Probe::new(&memory, one_call), "b");
        into_next_slot(&memory).await;
        let on_a = tick(&a).await;
        assert_eq!(on_a["trigger"], "timer", "{path}: {on_a}");
        let asked = trigger(&a).await;

        let beside = tick(&b).await;
        assert_skip(&beside, "already-run", path);
        assert_eq!(pending(&b).await.as_deref(), asked["id"].as_str(), "{path}");
        done(&a, &on_a).await;

        let manual = tick(&b).await;
        assert_grant(&manual, "manual", path);
        done(&b, &manual).await;
        let runs = manual_runs(&b, &asked).await;
        assert_eq!(runs.len(), 1, "{path}");
        assert!(
            runs[0]["holder"].as_str().unwrap().starts_with("b#"),
            "{path}: {runs:?}"
        );
        let again = tick(&a).await;
        assert_eq!(again["run"], false, "{path}: {again}");
    }
}
