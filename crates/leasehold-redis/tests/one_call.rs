//! A scheduler's timer tick on Redis is one store round trip, as the sidecar's is: once the
//! store's clock is known, a firing is the one `tick` operation (no separate clock or control
//! read), and Redis answers that operation with one EVALSHA.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::store::{Answer, Layer, StoreResult, TickRequest};
use leasehold::{HolderId, LeaseConfig, LeaseName, Scheduler, Slots, Store, Task};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::OwnRedis;

/// A Redis store that notes every operation called on it.
#[derive(Clone)]
struct Counted {
    inner: RedisStore,
    calls: Arc<Mutex<Vec<&'static str>>>,
}

impl Layer for Counted {
    type Inner = RedisStore;

    fn inner(&self) -> &RedisStore {
        &self.inner
    }

    fn around<'a, T: Answer, F>(
        &'a self,
        op: &'static str,
        call: impl FnOnce() -> F + Send + 'a,
    ) -> impl Future<Output = StoreResult<T>> + Send + 'a
    where
        F: Future<Output = StoreResult<T>> + Send + 'a,
    {
        self.calls.lock().unwrap().push(op);
        call()
    }
}

/// Calls of each command so far, from `INFO commandstats`.
fn command_calls(server: &OwnRedis, command: &str) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_answers_a_tick_with_one_evalsha() {
    let server = OwnRedis::start(&[]);
    let store = RedisConfig::new(server.url())
        .notifications(false)
        .connect()
        .await
        .unwrap();
    let task = LeaseName::new("one-call/direct").unwrap();
    let holder = HolderId::new("counted").unwrap();
    // The script is loaded by the first call.
    let now = store.now_millis().await.unwrap();
    let request = TickRequest::new(&task, &holder, Duration::from_secs(30), now, None);
    store.tick(&request).await.unwrap();
    let (evalsha, eval) = (
        command_calls(&server, "evalsha"),
        command_calls(&server, "eval"),
    );
    for _ in 0..5 {
        let now = store.now_millis().await.unwrap();
        let request = TickRequest::new(&task, &holder, Duration::from_secs(30), now, None);
        store.tick(&request).await.unwrap();
    }
    // Five ticks, five EVALSHA (the commands a script runs count in `commandstats` too, so
    // only the calls of scripts are compared: no EVAL, nothing loaded again).
    assert_eq!(command_calls(&server, "evalsha") - evalsha, 5);
    assert_eq!(command_calls(&server, "eval") - eval, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_firing_is_one_tick_operation_once_the_clock_is_known() {
    let server = OwnRedis::start(&[]);
    let redis = RedisConfig::new(server.url()).connect().await.unwrap();
    let store = Counted {
        inner: redis,
        calls: Arc::default(),
    };
    let task = LeaseName::new("one-call/scheduler").unwrap();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let calls = store.calls.clone();
    let scheduler = Scheduler::new(store.clone())
        .lease_config(LeaseConfig::new(Duration::from_secs(30)))
        .task(Task::new(
            task,
            leasehold::Schedule::every(Duration::from_secs(1)).unwrap(),
            move |ctx| {
                // What the store was asked since the last run ended: this firing's decision.
                seen.lock()
                    .unwrap()
                    .push(std::mem::take(&mut *calls.lock().unwrap()));
                async move {
                    let _ = ctx;
                    Ok::<(), std::convert::Infallible>(())
                }
            },
        ))
        .start(std::future::pending())
        .unwrap();
    tokio::time::sleep(Duration::from_millis(6500)).await;
    scheduler.shutdown().await;
    let runs = runs.lock().unwrap().clone();
    assert!(runs.len() >= 5, "{runs:?}");
    // After the first firing (which reads the clock and the slot record to look for missed
    // slots), each firing is the one tick operation; besides it only what the run before it
    // left (its release, its history, a catalog heartbeat) reaches the store.
    for calls in &runs[2..] {
        let decisions: Vec<_> = calls
            .iter()
            .filter(|op| !matches!(**op, "release" | "record_history" | "register" | "renew"))
            .collect();
        assert_eq!(decisions, [&"tick"], "{runs:?}");
    }
}
