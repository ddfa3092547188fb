//! A slow Redis: one operation is bounded by `op_timeout` end to end (the driver's own response
//! timeout included), and answers slower than the driver's default (500 ms) but within
//! `op_timeout` succeed (issue 18 case 4). The latency comes from a delaying proxy of the test's
//! own in front of the shared Redis.

mod common;

use leasehold::Slots;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold::{
    HolderId, LeaseName, Store, StoreError,
    store::{Acquisition, Renewal},
};
use leasehold_redis::RedisConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A loopback TCP proxy to the shared Redis that holds every reply for `delay` (so a round trip
/// takes that much longer). Dropping it ends the listener and every connection.
struct SlowProxy {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl SlowProxy {
    async fn start(delay: Duration) -> Self {
        let upstream = common::redis_url();
        let upstream = upstream
            .strip_prefix("redis://")
            .expect("a redis:// test url")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let delay_ms = Arc::new(AtomicU64::new(delay.as_millis() as u64));
        let delay = delay_ms.clone();
        let accept = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, delay) = (upstream.clone(), delay.clone());
                conns.spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream.as_str()).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::io::copy(&mut cr, &mut sw);
                    let down = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = sr.read(&mut buf).await?;
                            if n == 0 {
                                return Ok::<_, std::io::Error>(());
                            }
                            let ms = delay.load(Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            cw.write_all(&buf[..n]).await?;
                        }
                    };
                    let _ = tokio::try_join!(up, down);
                });
            }
        });
        Self {
            addr,
            delay_ms,
            accept,
        }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection.
        self.accept.abort();
    }
}

fn name(tag: &str) -> LeaseName {
    LeaseName::new(format!("{tag}/{:08x}", fastrand::u32(..))).unwrap()
}

/// With op_timeout 2 s, a 600 ms round trip (above the driver's 500 ms default) is just slow:
/// connect, acquire, renew, inspect, claim_slot and the clock all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_600ms_round_trip_succeeds_within_op_timeout() {
    let proxy = SlowProxy::start(Duration::from_millis(600)).await;
    let store = RedisConfig::new(proxy.url())
        .prefix(common::test_prefix())
        .op_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect through a 600 ms proxy");
    let (lease, who) = (name("slow"), HolderId::new("slow-holder").unwrap());
    let ttl = Duration::from_secs(15);
    let started = Instant::now();
    let token = match store.acquire(&lease, &who, ttl).await {
        Ok(Acquisition::Acquired { token }) => token,
        other => panic!("acquire through a 600 ms proxy: {other:?}"),
    };
    assert!(
        started.elapsed() >= Duration::from_millis(550),
        "the proxy did delay the reply ({:?})",
        started.elapsed()
    );
    assert_eq!(
        store.renew(&lease, &who, token, ttl).await.unwrap(),
        Renewal::Renewed
    );
    let state = store.inspect(&lease).await.unwrap().unwrap();
    assert_eq!(state.token, token);
    store.claim_slot(&lease, 1).await.unwrap();
    store.now_millis().await.unwrap();
    store.release(&lease, &who, token).await.unwrap();
}

/// A 3 s round trip with op_timeout 2 s: the operation fails with `Timeout(2 s)` after about
/// 2 s, not `Unavailable` after 500 ms, and the store works again once the delay is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3s_round_trip_times_out_after_op_timeout() {
    let proxy = SlowProxy::start(Duration::ZERO).await;
    let op_timeout = Duration::from_secs(2);
    let store = RedisConfig::new(proxy.url())
        .prefix(common::test_prefix())
        .op_timeout(op_timeout)
        .notifications(false)
        .connect()
        .await
        .unwrap();
    proxy.set_delay(Duration::from_secs(3));
    let (lease, who) = (name("stalled"), HolderId::new("stalled-holder").unwrap());
    let started = Instant::now();
    let err = store
        .acquire(&lease, &who, Duration::from_secs(15))
        .await
        .expect_err("no answer within op_timeout");
    let took = started.elapsed();
    assert!(
        matches!(err, StoreError::Timeout(d) if d == op_timeout),
        "{err:?}"
    );
    assert!(
        took >= Duration::from_millis(1_900) && took < Duration::from_millis(2_900),
        "failed after {took:?}"
    );
    let started = Instant::now();
    let err = store.now_millis().await.expect_err("still slow");
    assert!(matches!(err, StoreError::Timeout(_)), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(1_900));
    proxy.set_delay(Duration::ZERO);
    // Late replies to the timed-out requests drain; then operations answer again.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.now_millis().await {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "store did not recover: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 31: without an `op_timeout` set, an operation on a lease is limited by a third of its
/// ttl (at most 2 s), so a renewal sent into a connection that answers nothing is given up while
/// the lease can still be kept and renewed again; with a 900 ms ttl a fixed 2 s limit outlived
/// the lease. Operations without a ttl keep 2 s; a set `op_timeout` applies to all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_op_timeout_a_lease_operation_gets_a_third_of_its_ttl() {
    let proxy = SlowProxy::start(Duration::ZERO).await;
    let store = RedisConfig::new(proxy.url())
        .prefix(common::test_prefix())
        .notifications(false)
        .connect()
        .await
        .unwrap();
    let (lease, who) = (name("derived"), HolderId::new("derived-holder").unwrap());
    let ttl = Duration::from_millis(900);
    let token = match store.acquire(&lease, &who, ttl).await.unwrap() {
        Acquisition::Acquired { token } => token,
        other => panic!("{other:?}"),
    };
    proxy.set_delay(Duration::from_secs(5));
    let started = Instant::now();
    let err = store
        .renew(&lease, &who, token, ttl)
        .await
        .expect_err("no answer within a third of the ttl");
    let took = started.elapsed();
    assert!(
        matches!(err, StoreError::Timeout(d) if d == ttl / 3),
        "{err:?}"
    );
    assert!(took < Duration::from_millis(800), "gave up after {took:?}");
    let started = Instant::now();
    let err = store.now_millis().await.expect_err("still blackholed");
    assert!(
        matches!(err, StoreError::Timeout(d) if d == leasehold_redis::DEFAULT_OP_TIMEOUT),
        "{err:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(1_900));
}

/// What the README documents for fail-open under a store that answers nothing (a blackhole,
/// not a refused connection): each tick waits for the store's clock until its limit, the renew
/// interval (ttl/3), then runs ungated, so it runs one renew interval after its slot. Before the
/// outage, gated runs start within a few ms of their slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_open_tick_under_a_silent_redis_runs_one_renew_interval_late() {
    use leasehold::{LeaseConfig, Schedule, Scheduler, StoreDownPolicy, Task, TaskContext};
    use std::sync::Mutex;
    use std::time::{SystemTime, UNIX_EPOCH};

    let proxy = SlowProxy::start(Duration::ZERO).await;
    let store = RedisConfig::new(proxy.url())
        .prefix(common::test_prefix())
        .notifications(false)
        .connect()
        .await
        .unwrap();
    // (slot, how late it started in ms, gated)
    let runs: Arc<Mutex<Vec<(u64, u64, bool)>>> = Arc::default();
    let seen = runs.clone();
    let task = Task::new(
        name("fail-open-late"),
        Schedule::every(Duration::from_secs(1)).unwrap(),
        move |ctx: TaskContext| {
            let seen = seen.clone();
            async move {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                let slot = ctx.slot.unwrap();
                let late = (now.as_millis() as u64).saturating_sub(slot);
                seen.lock().unwrap().push((slot, late, ctx.token.is_some()));
                Ok::<(), std::io::Error>(())
            }
        },
    );
    let ttl = Duration::from_millis(1500);
    let renew_interval = ttl / 3;
    let scheduler = Scheduler::new(store)
        .lease_config(LeaseConfig::new(ttl))
        .on_store_down(StoreDownPolicy::FailOpen)
        .task(task)
        .start(std::future::pending())
        .unwrap();
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let before = runs.lock().unwrap().len();
    proxy.set_delay(Duration::from_secs(3600));
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    let runs = runs.lock().unwrap().clone();
    drop(scheduler);
    let (gated, rest) = runs.split_at(before);
    assert!(gated.len() >= 2, "{runs:?}");
    for &(slot, late, is_gated) in gated {
        assert!(
            is_gated && late < 200,
            "gated run of {slot}: {late} ms late"
        );
    }
    // The first tick of the outage may still be gated (its clock read answered): the ungated
    // ones are the ones that waited.
    let ungated: Vec<_> = rest.iter().filter(|r| !r.2).collect();
    assert!(ungated.len() >= 3, "{runs:?}");
    for &&(slot, late, _) in &ungated {
        let interval = renew_interval.as_millis() as u64;
        assert!(
            late >= interval - 20 && late < interval + 300,
            "fail-open run of {slot}: {late} ms late, the renew interval is {interval} ms"
        );
    }
}

/// Issue 18's latency bar: with ttl 15 s, a guard keeps its lease through round trips of
/// 300 ms, 1 s and 3 s (op_timeout 5 s, above the slowest), renewing every second, and is never
/// told it is expiring or lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_keeps_its_lease_through_slow_round_trips() {
    use leasehold::{Lease, LeaseConfig};
    let proxy = SlowProxy::start(Duration::ZERO).await;
    let store = RedisConfig::new(proxy.url())
        .prefix(common::test_prefix())
        .op_timeout(Duration::from_secs(5))
        .notifications(false)
        .connect()
        .await
        .unwrap();
    let config = LeaseConfig::new(Duration::from_secs(15)).renew_interval(Duration::from_secs(1));
    let lease = Lease::new(store.clone(), name("latency"), config).unwrap();
    let guard = lease.acquire().await.unwrap();
    for delay in [300, 1000, 3000] {
        proxy.set_delay(Duration::from_millis(delay));
        // Several renewals at this latency (each takes a round trip plus the renew interval).
        tokio::time::sleep(Duration::from_millis(3 * (delay + 1000))).await;
        assert!(guard.is_held(), "lost at a {delay} ms round trip");
        assert!(
            !guard.cancellation_token().is_cancelled(),
            "told to stop at a {delay} ms round trip"
        );
        let state = store.inspect(lease.name()).await.unwrap().unwrap();
        assert_eq!(state.token, guard.token());
        assert!(
            state.remaining > Duration::from_secs(5),
            "{delay} ms: {state:?}"
        );
    }
    proxy.set_delay(Duration::ZERO);
    guard.release().await.unwrap();
}
