//! The sidecar's guarantees under adversarial sequences of calls, on a paused clock: an
//! application's silence ends its leases, a grant's `valid_for_ms` never outlives the lease, a
//! slot runs once across sidecars, a token names one tenure, shutdown releases everything.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use leasehold::faults::FaultyStore;
use leasehold::{BoxStore, LeaseName, Store, StoreDownPolicy};
use leasehold_serve::{Sidecar, SidecarConfig};
use serde_json::{Value, json};
use tokio::time::Instant;
use tower::ServiceExt;

struct Api {
    router: Router,
    sidecar: Sidecar,
}

impl Api {
    fn on(store: &FaultyStore, holder: &str) -> Self {
        Self::with(store, SidecarConfig::default().holder(holder), None)
    }

    fn with(store: &FaultyStore, config: SidecarConfig, auth: Option<&str>) -> Self {
        let sidecar = Sidecar::new(BoxStore::new(store.clone()), config);
        Self {
            router: sidecar.router(auth.map(str::to_owned)),
            sidecar,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let request = Request::builder().method(method).uri(path);
        let request = match body {
            Some(body) => request.body(Body::from(body.to_string())),
            None => request.body(Body::empty()),
        }
        .unwrap();
        self.send(request).await
    }

    async fn send(&self, request: Request<Body>) -> (StatusCode, Value) {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
        (status, value)
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", path, Some(body)).await
    }

    async fn acquire(&self, name: &str, body: Value) -> Value {
        let (status, value) = self.post(&format!("/v1/leases/{name}/acquire"), body).await;
        assert_eq!(status, StatusCode::OK, "{value}");
        value
    }

    async fn keepalive(&self, name: &str, token: &Value) -> (StatusCode, Value) {
        self.post(
            &format!("/v1/leases/{name}/keepalive"),
            json!({ "token": token }),
        )
        .await
    }

    async fn tick(&self, task: &str, body: Value) -> Value {
        let (status, value) = self.post(&format!("/v1/tasks/{task}/ticks"), body).await;
        assert_eq!(status, StatusCode::OK, "{value}");
        value
    }
}

fn token_of(v: &Value) -> u64 {
    v["token"]
        .as_str()
        .expect("token is a string")
        .parse()
        .unwrap()
}

async fn holder_in_store(store: &FaultyStore, name: &str) -> Option<String> {
    let state = store
        .inner
        .inspect(&LeaseName::new(name).unwrap())
        .await
        .unwrap();
    state.and_then(|s| s.holder).map(|h| h.to_string())
}

#[tokio::test(start_paused = true)]
async fn a_silent_application_loses_its_lease_within_its_keepalive() {
    let store = FaultyStore::new();
    let api = Api::on(&store, "a");
    let granted = api
        .acquire("sweep", json!({"ttl_ms": 3000, "keepalive_ms": 1000}))
        .await;
    assert_eq!(granted["acquired"], true);
    // valid_for_ms never reaches past the keepalive deadline.
    assert!(
        granted["valid_for_ms"].as_u64().unwrap() <= 1000,
        "{granted}"
    );
    let token = granted["token"].clone();

    // Calling keeps it, well past the ttl.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let (status, held) = api.keepalive("sweep", &token).await;
        assert_eq!(status, StatusCode::OK, "{held}");
        assert!(held["valid_for_ms"].as_u64().unwrap() <= 1000);
    }

    // Silence: gone within the keepalive interval, freed in the store, and the next call is
    // told why.
    let silent_from = Instant::now();
    tokio::time::sleep(Duration::from_millis(1001)).await;
    assert_eq!(holder_in_store(&store, "sweep").await, None);
    let (status, lost) = api.keepalive("sweep", &token).await;
    assert_eq!(status, StatusCode::GONE);
    assert_eq!(lost["reason"], "app-silent");
    assert!(Instant::now() - silent_from <= Duration::from_millis(1001));
    // Another instance takes it at once.
    let other = Api::on(&store, "b");
    assert_eq!(
        other.acquire("sweep", json!({"ttl_ms": 3000})).await["acquired"],
        true
    );
}

#[tokio::test(start_paused = true)]
async fn a_grant_is_never_valid_past_the_moment_another_holder_could_take_it() {
    let store = FaultyStore::new();
    let a = Api::on(&store, "a");
    let b = Api::on(&store, "b");
    let granted = a
        .acquire("job", json!({"ttl_ms": 3000, "keepalive_ms": 60000}))
        .await;
    let token = granted["token"].clone();
    // The store stops answering renewals: the sidecar gives the lease up (and releases it) at the
    // stop margin; another sidecar polls for it all along.
    store.set(|f| &f.renew_hangs, true);
    let mut last_valid_until = Instant::now();
    let mut told_lost = false;
    loop {
        let asked = Instant::now();
        if !told_lost {
            match a.keepalive("job", &token).await {
                (StatusCode::OK, held) => {
                    let valid = Duration::from_millis(held["valid_for_ms"].as_u64().unwrap());
                    last_valid_until = last_valid_until.max(asked + valid);
                }
                (status, lost) => {
                    assert_eq!(status, StatusCode::GONE);
                    assert_eq!(lost["reason"], "expired");
                    told_lost = true;
                }
            }
        }
        let (_, other) = b
            .post("/v1/leases/job/acquire", json!({"ttl_ms": 3000}))
            .await;
        if other["acquired"] == true {
            // Never before the end of the validity the first holder was promised.
            assert!(
                Instant::now() >= last_valid_until,
                "taken while still promised to a"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn watch_answers_the_moment_the_lease_is_lost() {
    let store = FaultyStore::new();
    let api = Api::on(&store, "a");
    let granted = api
        .acquire("w", json!({"ttl_ms": 3000, "keepalive_ms": 60000}))
        .await;
    let token = granted["token"].clone();
    // A quiet watch answers after its wait (at most keepalive / 4), still held.
    let (status, held) = api
        .post(
            "/v1/leases/w/watch",
            json!({"token": token, "wait_ms": 500}),
        )
        .await;
    assert_eq!(
        (status, held["held"].clone()),
        (StatusCode::OK, json!(true))
    );

    store.set(|f| &f.renew_lost, true);
    let started = Instant::now();
    let (status, lost) = api
        .post(
            "/v1/leases/w/watch",
            json!({"token": token, "wait_ms": 60000}),
        )
        .await;
    assert_eq!(status, StatusCode::GONE);
    assert_eq!(lost["reason"], "taken-over");
    // The next renewal (every ttl/3) found it lost; the watch did not wait out its 60 s.
    assert!(Instant::now() - started <= Duration::from_millis(1001));
}

#[tokio::test(start_paused = true)]
async fn release_then_reacquire_starts_a_new_tenure_the_old_token_cannot_touch() {
    let store = FaultyStore::new();
    let api = Api::on(&store, "a");
    let first = api.acquire("r", json!({"ttl_ms": 3000})).await;
    let (_, busy) = api
        .post("/v1/leases/r/acquire", json!({"ttl_ms": 3000}))
        .await;
    assert_eq!(
        busy["acquired"], false,
        "one sidecar's second grant is busy too"
    );
    let (status, released) = api
        .post("/v1/leases/r/release", json!({"token": first["token"]}))
        .await;
    assert_eq!(
        (status, released["released"].clone()),
        (StatusCode::OK, json!(true))
    );
    let second = api.acquire("r", json!({"ttl_ms": 3000})).await;
    assert!(token_of(&second) > token_of(&first));
    // The old token: lost, and releasing with it does not free the new tenure.
    assert_eq!(
        api.keepalive("r", &first["token"]).await.0,
        StatusCode::GONE
    );
    let (_, again) = api
        .post("/v1/leases/r/release", json!({"token": first["token"]}))
        .await;
    assert_eq!(again["released"], false);
    assert_eq!(api.keepalive("r", &second["token"]).await.0, StatusCode::OK);
    assert!(holder_in_store(&store, "r").await.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_busy_lease_is_waited_for_and_handed_over_on_release() {
    let store = FaultyStore::new();
    let a = Api::on(&store, "a");
    let b = Api::on(&store, "b");
    let held = a.acquire("h", json!({"ttl_ms": 10000})).await;
    let waiter = tokio::spawn({
        let router = b.router.clone();
        async move {
            let b = Api {
                router,
                sidecar: b.sidecar,
            };
            let started = Instant::now();
            let got = b
                .acquire("h", json!({"ttl_ms": 10000, "wait_ms": 30000}))
                .await;
            (got, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(2000)).await;
    a.post("/v1/leases/h/release", json!({"token": held["token"]}))
        .await;
    let (got, waited) = waiter.await.unwrap();
    assert_eq!(got["acquired"], true, "{got}");
    // Handed over at the release, not at the 10 s expiry.
    assert!(waited < Duration::from_millis(2500), "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_grant_after_a_wait_longer_than_the_keepalive_starts_the_keepalive_at_the_grant() {
    let store = FaultyStore::new();
    let a = Api::on(&store, "a");
    let b = Api::on(&store, "b");
    let held = a.acquire("w", json!({"ttl_ms": 10000})).await;
    let waiter = tokio::spawn(async move {
        let got = b
            .acquire(
                "w",
                json!({"ttl_ms": 10000, "keepalive_ms": 500, "wait_ms": 30000}),
            )
            .await;
        (got, b)
    });
    // The waiter was blocked on the answer for 2 s, four times its keepalive.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    a.post("/v1/leases/w/release", json!({"token": held["token"]}))
        .await;
    let (got, b) = waiter.await.unwrap();
    assert_eq!(got["acquired"], true, "{got}");
    // Measured from the request's arrival, the grant lasts the wait plus one keepalive.
    let valid = got["valid_for_ms"].as_u64().unwrap();
    assert!((2400..=2600).contains(&valid), "{got}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (status, kept) = b.keepalive("w", &got["token"]).await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    // Silence past the keepalive still ends it.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(b.keepalive("w", &got["token"]).await.0, StatusCode::GONE);
}

async fn run_ticks(
    sidecars: &[Api],
    task: &str,
    body: &Value,
    until: Duration,
) -> Vec<(u64, usize)> {
    let mut runs = Vec::new();
    let end = Instant::now() + until;
    while Instant::now() < end {
        for (i, api) in sidecars.iter().enumerate() {
            let answer = api.tick(task, body.clone()).await;
            if answer["run"] == true {
                runs.push((answer["slot"].as_u64().unwrap(), i));
                let slot = answer["slot"].as_u64().unwrap();
                let (status, done) = api
                    .post(
                        &format!("/v1/tasks/{task}/ticks/{slot}/done"),
                        json!({"token": answer["token"], "outcome": "ok"}),
                    )
                    .await;
                assert_eq!(status, StatusCode::OK, "{done}");
                assert_eq!(done["released"], true);
            } else {
                // not-due: a first tick long after the task's latest slot.
                assert!(
                    ["already-run", "busy", "not-leader", "not-due"]
                        .contains(&answer["reason"].as_str().unwrap()),
                    "{answer}"
                );
            }
            tokio::time::sleep(Duration::from_millis(137)).await;
        }
    }
    runs
}

#[tokio::test(start_paused = true)]
async fn each_slot_runs_once_across_sidecars_and_feeds_the_history() {
    let store = FaultyStore::new();
    let sidecars: Vec<Api> = (0..3).map(|i| Api::on(&store, &format!("s{i}"))).collect();
    let runs = run_ticks(
        &sidecars,
        "sweep",
        &json!({"every_ms": 1000}),
        Duration::from_secs(20),
    )
    .await;
    let mut slots: Vec<u64> = runs.iter().map(|r| r.0).collect();
    let n = slots.len();
    slots.dedup();
    assert_eq!(slots.len(), n, "a slot ran twice: {runs:?}");
    // Every slot of the 20 s ran (the callers tick more often than the interval).
    assert!(n >= 19, "{n} runs in 20 s");
    assert!(slots.windows(2).all(|w| w[1] == w[0] + 1000), "{slots:?}");

    let task = LeaseName::new("sweep").unwrap();
    let history = leasehold::history::read(&store.inner, &task, 100)
        .await
        .unwrap();
    let ok = history
        .iter()
        .filter(|r| r.outcome == leasehold::history::RunOutcome::Ok)
        .count();
    assert_eq!(ok, n, "every run recorded as ok");
}

/// A cron tick in a zone: the night Berlin skips 02:00-03:00, a 02:30 job's slot is the change
/// (01:00 UTC), run once across sidecars; the history records the expression with its zone.
#[tokio::test(start_paused = true)]
async fn a_cron_tick_in_a_time_zone_runs_the_skipped_time_at_the_change() {
    let store = FaultyStore::new();
    let night = 1_806_195_480_000; // 2027-03-28T00:58:00Z, 01:58 CET
    let offset = night - store.inner.now_millis().await.unwrap() as i64;
    store
        .faults
        .clock_offset_ms
        .store(offset, std::sync::atomic::Ordering::SeqCst);
    let sidecars: Vec<Api> = (0..2).map(|i| Api::on(&store, &format!("s{i}"))).collect();
    let body = json!({"cron": "30 2 * * *", "time_zone": "Europe/Berlin"});
    let runs = run_ticks(&sidecars, "nightly", &body, Duration::from_secs(240)).await;
    let slots: Vec<u64> = runs.iter().map(|r| r.0).collect();
    // Only the change: yesterday's 02:30 CET, the latest slot when ticking starts, is 22 h old
    // at the task's first tick, past the cron default's one-hour catch-up window (as for
    // `leasehold run`), so it does not run then as if on time.
    assert_eq!(slots, [1_806_195_600_000], "{runs:?}");
    let history = leasehold::history::read(&store.inner, &LeaseName::new("nightly").unwrap(), 10)
        .await
        .unwrap();
    assert!(!history.is_empty());
    assert!(history.iter().all(|r| r.schedule
        == Some(leasehold::history::RecordedSchedule::Cron(
            "CRON_TZ=Europe/Berlin 30 2 * * *".into()
        ))));
}

#[tokio::test(start_paused = true)]
async fn a_run_still_going_makes_the_next_slot_busy_and_a_silent_run_is_taken_back() {
    let store = FaultyStore::new();
    let a = Api::on(&store, "a");
    let b = Api::on(&store, "b");
    let body = json!({"every_ms": 1000, "ttl_ms": 5000, "keepalive_ms": 1500});
    let run = a.tick("t", body.clone()).await;
    assert_eq!(run["run"], true, "{run}");
    // Same slot elsewhere: already run.
    assert_eq!(b.tick("t", body.clone()).await["reason"], "already-run");
    // The next slot while the first run still holds the task lease: busy, never a second run.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    a.keepalive("t", &run["token"]).await;
    let next = b.tick("t", body.clone()).await;
    assert_eq!(
        (next["run"].clone(), next["reason"].clone()),
        (json!(false), json!("busy"))
    );
    // The first run's application goes silent: its run ends within keepalive_ms, recorded as
    // cancelled, and a later slot runs elsewhere.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let later = b.tick("t", body.clone()).await;
    assert_eq!(later["run"], true, "{later}");
    let task = LeaseName::new("t").unwrap();
    let history = leasehold::history::read(&store.inner, &task, 10)
        .await
        .unwrap();
    let first = history
        .iter()
        .find(|r| r.slot == run["slot"].as_u64())
        .expect("the first run is recorded");
    assert_eq!(first.outcome.as_str(), "cancelled", "{first:?}");
}

#[tokio::test(start_paused = true)]
async fn ticks_in_a_group_run_on_its_leader_only_and_pass_on_when_its_app_stops_ticking() {
    let store = FaultyStore::new();
    let a = Api::on(&store, "a");
    let b = Api::on(&store, "b");
    let body = json!({"every_ms": 1000, "ttl_ms": 3000, "group": "workers"});
    let first = a.tick("g1", body.clone()).await;
    assert_eq!(first["run"], true, "{first}");
    let mut b_runs = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let on_b = b.tick("g1", body.clone()).await;
        assert_eq!(on_b["reason"], "not-leader", "{on_b}");
        let on_a = a.tick("g1", body.clone()).await;
        if on_a["run"] == true {
            let slot = on_a["slot"].as_u64().unwrap();
            a.post(
                &format!("/v1/tasks/g1/ticks/{slot}/done"),
                json!({"token": on_a["token"], "outcome": "ok"}),
            )
            .await;
        }
    }
    // a's application stops ticking: its sidecar steps down after 2 intervals + ttl (5 s);
    // b's campaign takes the group within its ttl after that.
    let stopped = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let on_b = b.tick("g1", body.clone()).await;
        if on_b["run"] == true {
            b_runs += 1;
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(9),
            "b never took over"
        );
    }
    assert_eq!(b_runs, 1);
    assert!(
        stopped.elapsed() >= Duration::from_secs(5),
        "a kept the group while idle for 5 s"
    );
}

#[tokio::test(start_paused = true)]
async fn store_down_follows_the_policy() {
    let store = FaultyStore::new();
    let api = Api::on(&store, "a");
    let held = api.acquire("held", json!({"ttl_ms": 30000})).await;
    store.set(|f| &f.down, true);
    // A release the store cannot hear is not reported as "was no longer ours".
    let (status, err) = api
        .post("/v1/leases/held/release", json!({"token": held["token"]}))
        .await;
    assert_eq!(
        (status, err["error"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, json!("store-down"))
    );
    let closed = api.tick("d", json!({"every_ms": 1000})).await;
    assert_eq!(
        (closed["run"].clone(), closed["reason"].clone()),
        (json!(false), json!("store-down"))
    );
    let open = api
        .tick("d", json!({"every_ms": 1000, "on_store_down": "fail-open"}))
        .await;
    assert_eq!(
        (open["run"].clone(), open["gated"].clone()),
        (json!(true), json!(false))
    );
    assert!(open.get("token").is_none());
    // The sidecar's own default applies when the tick does not say.
    let local = Api::with(
        &store,
        SidecarConfig::default().on_store_down(StoreDownPolicy::Local),
        None,
    );
    assert_eq!(
        local.tick("d", json!({"every_ms": 1000})).await["run"],
        true
    );
    let (status, err) = api
        .post("/v1/leases/x/acquire", json!({"ttl_ms": 1000}))
        .await;
    assert_eq!(
        (status, err["error"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, json!("store-down"))
    );
    let (_, health) = api.call("GET", "/healthz", None).await;
    assert_eq!(health["store_reachable"], false);
    // Back: gated again.
    store.set(|f| &f.down, false);
    let gated = api.tick("d", json!({"every_ms": 1000})).await;
    assert_eq!(
        (gated["run"].clone(), gated["gated"].clone()),
        (json!(true), json!(true))
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_every_lease_run_and_group() {
    let store = FaultyStore::new();
    let api = Api::on(&store, "a");
    let lease = api.acquire("l", json!({"ttl_ms": 30000})).await;
    let run = api.tick("t", json!({"every_ms": 60000})).await;
    let grouped = api
        .tick("u", json!({"every_ms": 60000, "group": "grp"}))
        .await;
    assert_eq!(
        (run["run"].clone(), grouped["run"].clone()),
        (json!(true), json!(true))
    );
    assert_eq!(api.sidecar.held(), 3);
    api.sidecar.shut_down(Duration::from_secs(5)).await;
    for name in ["l", "t", "u", "grp"] {
        assert_eq!(
            holder_in_store(&store, name).await,
            None,
            "{name} still held"
        );
    }
    let (status, lost) = api.keepalive("l", &lease["token"]).await;
    assert_eq!(
        (status, lost["reason"].clone()),
        (StatusCode::GONE, json!("released"))
    );
    assert_eq!(api.sidecar.held(), 0);
}

#[tokio::test(start_paused = true)]
async fn bad_requests_get_a_json_error_naming_the_field() {
    let store = FaultyStore::new();
    let api = Api::on(&store, "a");
    let cases: &[(&str, &str, Value, &str)] = &[
        ("POST", "/v1/leases/a/acquire", json!({}), "ttl_ms"),
        (
            "POST",
            "/v1/leases/a/acquire",
            json!({"ttl_ms": 0}),
            "ttl_ms",
        ),
        (
            "POST",
            "/v1/leases/a/acquire",
            json!({"ttl_ms": -5}),
            "ttl_ms",
        ),
        (
            "POST",
            "/v1/leases/a/acquire",
            json!({"ttl_ms": 1.5}),
            "ttl_ms",
        ),
        (
            "POST",
            "/v1/leases/a/acquire",
            json!({"ttl_ms": "3s"}),
            "ttl_ms",
        ),
        (
            "POST",
            "/v1/leases/a/acquire",
            json!({"ttl_ms": 1000, "wait_ms": 400000}),
            "wait_ms",
        ),
        (
            "POST",
            "/v1/leases/a/acquire",
            json!({"ttl_ms": 1000, "keepalive_ms": 1}),
            "keepalive_ms",
        ),
        (
            "POST",
            "/v1/leases/a/acquire",
            json!({"ttl_ms": 1000, "holder": "has space"}),
            "holder",
        ),
        (
            "POST",
            "/v1/leases/a/acquire",
            json!({"ttl_ms": 1000, "extra": true}),
            "extra",
        ),
        (
            "POST",
            "/v1/leases/bad%20name/acquire",
            json!({"ttl_ms": 1000}),
            "name",
        ),
        (
            "POST",
            "/v1/leases/a/keepalive",
            json!({"token": "12x"}),
            "token",
        ),
        (
            "POST",
            "/v1/leases/a/keepalive",
            json!({"token": "99999999999999999999"}),
            "token",
        ),
        (
            "POST",
            "/v1/leases/a/keepalive",
            json!({"token": 12}),
            "token",
        ),
        (
            "POST",
            "/v1/leases/a/watch",
            json!({"token": "1", "wait_ms": 70000}),
            "wait_ms",
        ),
        ("POST", "/v1/tasks/t/ticks", json!({}), "every_ms"),
        (
            "POST",
            "/v1/tasks/t/ticks",
            json!({"every_ms": 0}),
            "every_ms",
        ),
        (
            "POST",
            "/v1/tasks/t/ticks",
            json!({"every_ms": 1000, "cron": "* * * * * *"}),
            "cron",
        ),
        (
            "POST",
            "/v1/tasks/t/ticks",
            json!({"cron": "every day"}),
            "cron",
        ),
        (
            "POST",
            "/v1/tasks/t/ticks",
            json!({"cron": "0 3 * * *", "time_zone": "Mars/Base"}),
            "time_zone",
        ),
        (
            "POST",
            "/v1/tasks/t/ticks",
            json!({"every_ms": 1000, "time_zone": "UTC"}),
            "time_zone",
        ),
        (
            "POST",
            "/v1/tasks/t/ticks",
            json!({"every_ms": 1000, "on_store_down": "maybe"}),
            "on_store_down",
        ),
        (
            "POST",
            "/v1/tasks/t/ticks",
            json!({"every_ms": 1000, "group": ""}),
            "group",
        ),
        (
            "POST",
            "/v1/tasks/t/ticks/abc/done",
            json!({"token": "1", "outcome": "ok"}),
            "slot",
        ),
        (
            "POST",
            "/v1/tasks/t/ticks/5/done",
            json!({"token": "1", "outcome": "great"}),
            "outcome",
        ),
        (
            "POST",
            "/v1/groups/g/observe",
            json!({"token": "x"}),
            "token",
        ),
    ];
    for (method, path, body, field) in cases {
        let (status, err) = api.call(method, path, Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {err}");
        assert_eq!(err["error"], "bad-request");
        assert_eq!(err["field"], *field, "{path} {body}: {err}");
    }
    // Not JSON at all, and a body over the limit.
    let request = Request::post("/v1/leases/a/acquire")
        .body(Body::from("{not json"))
        .unwrap();
    assert_eq!(api.send(request).await.0, StatusCode::BAD_REQUEST);
    let big = format!(
        "{{\"ttl_ms\": 1000, \"holder\": \"{}\"}}",
        "x".repeat(70_000)
    );
    let request = Request::post("/v1/leases/a/acquire")
        .body(Body::from(big))
        .unwrap();
    let (status, err) = api.send(request).await;
    assert_eq!(
        (status, err["error"].clone()),
        (StatusCode::PAYLOAD_TOO_LARGE, json!("too-large"))
    );
    assert_eq!(
        api.call("GET", "/v1/nothing", None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        api.call("DELETE", "/v1/leases/a", None).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    // A sidecar given no metrics recorder has no metrics.
    assert_eq!(
        api.call("GET", "/metrics", None).await.0,
        StatusCode::NOT_FOUND
    );
    // An unknown token is lost, not an error of the request.
    let (status, lost) = api.keepalive("a", &json!("123")).await;
    assert_eq!(
        (status, lost["reason"].clone()),
        (StatusCode::GONE, json!("unknown"))
    );
}

#[tokio::test(start_paused = true)]
async fn with_a_token_every_call_but_health_openapi_and_metrics_needs_it() {
    let store = FaultyStore::new();
    let api = Api::with(
        &store,
        SidecarConfig::default(),
        Some("s3cret-token-0123456789"),
    );
    assert_eq!(api.call("GET", "/healthz", None).await.0, StatusCode::OK);
    assert_eq!(
        api.call("GET", "/openapi.json", None).await.0,
        StatusCode::OK
    );
    // Outside the token too (404: this sidecar has no recorder; tests/metrics.rs of the CLI
    // scrapes a real one without the token).
    assert_eq!(
        api.call("GET", "/metrics", None).await.0,
        StatusCode::NOT_FOUND
    );
    let (status, err) = api
        .post("/v1/leases/a/acquire", json!({"ttl_ms": 1000}))
        .await;
    assert_eq!(
        (status, err["error"].clone()),
        (StatusCode::UNAUTHORIZED, json!("unauthorized"))
    );
    let wrong = Request::post("/v1/leases/a/acquire")
        .header("authorization", "Bearer s3cret-token-0123456788")
        .body(Body::from(json!({"ttl_ms": 1000}).to_string()))
        .unwrap();
    assert_eq!(api.send(wrong).await.0, StatusCode::UNAUTHORIZED);
    let right = Request::post("/v1/leases/a/acquire")
        .header("authorization", "Bearer s3cret-token-0123456789")
        .body(Body::from(json!({"ttl_ms": 1000}).to_string()))
        .unwrap();
    let (status, granted) = api.send(right).await;
    assert_eq!(
        (status, granted["acquired"].clone()),
        (StatusCode::OK, json!(true))
    );
}

#[tokio::test(start_paused = true)]
async fn observe_answers_when_the_term_changes() {
    let store = FaultyStore::new();
    let a = Api::on(&store, "a");
    let b = Api::on(&store, "b");
    let (_, nobody) = b.call("GET", "/v1/groups/g", None).await;
    assert_eq!(nobody["leader"], Value::Null);
    let term = a
        .post(
            "/v1/groups/g/campaign",
            json!({"ttl_ms": 3000, "keepalive_ms": 60000}),
        )
        .await
        .1;
    assert_eq!(term["acquired"], true, "{term}");
    // Knowing the current term, observe waits; the release ends it and observe answers.
    let observer = tokio::spawn({
        let router = b.router.clone();
        let token = term["token"].clone();
        async move {
            let b = Api {
                router,
                sidecar: b.sidecar,
            };
            let started = Instant::now();
            let state = b
                .post(
                    "/v1/groups/g/observe",
                    json!({"token": token, "wait_ms": 30000}),
                )
                .await
                .1;
            (state, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.post("/v1/leases/g/release", json!({"token": term["token"]}))
        .await;
    let (state, waited) = observer.await.unwrap();
    assert_eq!(state["leader"], Value::Null, "{state}");
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_millis(2000),
        "{waited:?}"
    );
}

/// Sleeps until `before` ahead of the next multiple of `every` ms on the store's clock; returns
/// that boundary.
async fn until_before_boundary(store: &FaultyStore, every: u64, before: u64) -> u64 {
    let now = store.now_millis().await.unwrap();
    let mut boundary = now - now % every + every;
    if boundary - now < before + 10 {
        boundary += every;
    }
    tokio::time::sleep(Duration::from_millis(boundary - before - now)).await;
    boundary
}

/// A caller whose clock runs ahead of the store's ticks a little before the slot it means
/// (issue 36 item 7): within min(1 s, interval / 4) before a boundary, the tick is for the slot
/// about to start, which the sidecar waits for and grants as timer; never the previous slot
/// (already run: the slot meant would have run a whole interval late).
#[tokio::test(start_paused = true)]
async fn a_tick_a_little_early_is_for_the_slot_about_to_start() {
    let store = FaultyStore::new();
    let api = Api::on(&store, "skewed");
    let body = json!({"every_ms": 5000});
    // A first tick, so the previous slot ran.
    let boundary = until_before_boundary(&store, 5000, 4000).await;
    let first = api.tick("skewed", body.clone()).await;
    assert_eq!(first["slot"], boundary - 5000, "{first}");
    done(&api, "skewed", &first).await;
    for early_ms in [60, 300, 1000] {
        let boundary = until_before_boundary(&store, 5000, early_ms).await;
        let asked = tokio::time::Instant::now();
        let answer = api.tick("skewed", body.clone()).await;
        assert_eq!(answer["run"], true, "{early_ms} ms early: {answer}");
        assert_eq!(answer["slot"], boundary, "{early_ms} ms early: {answer}");
        assert_eq!(answer["trigger"], "timer");
        // Answered once the slot started, not before.
        assert!(asked.elapsed() >= Duration::from_millis(early_ms));
        assert!(store.now_millis().await.unwrap() >= boundary);
        done(&api, "skewed", &answer).await;
    }
    // Earlier than the tolerance (here 1 s): a late tick of the slot that is running.
    let boundary = until_before_boundary(&store, 5000, 1500).await;
    let answer = api.tick("skewed", body.clone()).await;
    assert_eq!(
        (
            answer["run"].clone(),
            answer["reason"].clone(),
            answer["slot"].clone()
        ),
        (json!(false), json!("already-run"), json!(boundary - 5000)),
        "{answer}"
    );
}

/// A task's first tick long after its latest slot (issue 36 item 7): a daily task first ticked
/// at 07:18 does not run the 02:00 slot as if on time; it answers not-due with the time to its
/// next slot, and the next slot runs as timer. Within the catch-up window a first tick runs the
/// slot, labelled catch-up.
#[tokio::test(start_paused = true)]
async fn a_first_tick_long_after_its_slot_applies_the_catch_up_window() {
    let store = FaultyStore::new();
    let day = 86_400_000;
    let now = store.now_millis().await.unwrap();
    // The store's clock at 07:18 UTC.
    let at_0718 = now - now % day + day + 7 * 3_600_000 + 18 * 60_000;
    store
        .faults
        .clock_offset_ms
        .store((at_0718 - now) as i64, std::sync::atomic::Ordering::SeqCst);
    let api = Api::on(&store, "s");
    let nightly = json!({"cron": "0 2 * * *"});
    let answer = api.tick("nightly", nightly.clone()).await;
    assert_eq!(answer["run"], false, "{answer}");
    assert_eq!(answer["reason"], "not-due", "{answer}");
    let next_0200 = at_0718 - at_0718 % day + day + 2 * 3_600_000;
    let starts_in = answer["starts_in_ms"].as_u64().unwrap();
    assert!(
        starts_in.abs_diff(next_0200 - at_0718) < 1000,
        "{answer}: next slot in {}",
        next_0200 - at_0718
    );
    // Ticked again at once: still nothing.
    assert_eq!(
        api.tick("nightly", nightly.clone()).await["reason"],
        "not-due"
    );
    // A window given with the tick: 5 h 18 min late is outside two hours, too.
    let windowed = json!({"cron": "0 2 * * *", "catch_up_window_ms": 7_200_000});
    assert_eq!(
        api.tick("windowed", windowed.clone()).await["reason"],
        "not-due"
    );
    // At 03:30 (an hour and a half late: past an hour, so not on time) the first tick of a
    // task runs the slot within a two-hour window, labelled catch-up; without it, not at all.
    let at_0330 = at_0718 - at_0718 % day + 3 * 3_600_000 + 30 * 60_000;
    store
        .faults
        .clock_offset_ms
        .store((at_0330 - now) as i64, std::sync::atomic::Ordering::SeqCst);
    let other = Api::on(&store, "t");
    let answer = other.tick("fresh", windowed).await;
    assert_eq!(answer["run"], true, "{answer}");
    assert_eq!(answer["trigger"], "catch-up", "{answer}");
    assert_eq!(
        other.tick("fresh-default", nightly).await["reason"],
        "not-due"
    );
}

async fn done(api: &Api, task: &str, granted: &Value) {
    let slot = granted["slot"].as_u64().unwrap();
    let (status, body) = api
        .post(
            &format!("/v1/tasks/{task}/ticks/{slot}/done"),
            json!({"token": granted["token"], "outcome": "ok"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
