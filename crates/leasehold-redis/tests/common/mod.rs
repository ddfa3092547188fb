//! Shared test helpers: the local Redis URL, per-run key prefixes, and redis-server instances
//! of a test's own.
#![allow(dead_code)]

pub mod ha;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_redis::{RedisConfig, RedisStore};

/// The shared local Redis: `LEASEHOLD_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A key prefix no other test run uses.
pub fn test_prefix() -> String {
    format!("leasehold-test-{:012x}", fastrand::u64(..) >> 16)
}

/// A store on the shared local Redis, with a prefix of its own.
pub async fn make_store() -> RedisStore {
    RedisConfig::new(redis_url())
        .prefix(test_prefix())
        .connect()
        .await
        .expect("connect to the local redis (set LEASEHOLD_TEST_REDIS_URL)")
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A redis-server of the test's own, without persistence; killed on drop.
pub struct OwnRedis {
    pub port: u16,
    extra: Vec<String>,
    child: Option<Child>,
}

impl OwnRedis {
    /// Starts `redis-server --port <free port> --save "" --appendonly no` plus `extra` arguments
    /// (in which `{port}` stands for the chosen port).
    pub fn start(extra: &[&str]) -> Self {
        Self::start_on(free_port(), extra)
    }

    /// [`start`](Self::start) on a given port.
    pub fn start_on(port: u16, extra: &[&str]) -> Self {
        let mut me = Self {
            port,
            extra: extra
                .iter()
                .map(|s| s.replace("{port}", &port.to_string()))
                .collect(),
            child: None,
        };
        me.spawn();
        me
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL, so nothing is saved) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills and starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs a redis-cli command against it.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli on PATH");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
/// Runs every check of the core's conformance suite against clones of `store`, all at once (each
/// works on names of its own), and fails naming the checks that failed. For deployments a test
/// starts itself, so one deployment serves the whole suite and is dropped at the end.
pub async fn run_conformance(store: RedisStore) {
    use leasehold::conformance as c;
    macro_rules! checks {
        ($($check:ident),* $(,)?) => {{
            let mut tasks = tokio::task::JoinSet::new();
            $(
                let s = store.clone();
                tasks.spawn(async move {
                    let started = Instant::now();
                    let outcome = tokio::spawn(c::$check(s)).await;
                    (stringify!($check), outcome.is_ok(), started.elapsed())
                });
            )*
            tasks
        }};
    }
    // The list of `leasehold::conformance_tests!`.
    let mut tasks = checks!(
        acquire_then_busy,
        reacquire_by_holder_starts_a_new_tenure,
        new_names_start_tokens_from_the_clock,
        drop_then_reacquire_keeps_the_new_tenure,
        renew_only_by_holder_with_token,
        renew_many_answers_each_lease_in_order,
        purge_removes_only_long_free_records,
        release_only_by_holder_with_token,
        expiry_hands_over,
        renew_after_expiry_is_lost,
        tokens_strictly_increase,
        tokens_are_per_name,
        inspect_reports_state,
        slot_claims_move_forward,
        concurrent_racers_one_winner,
        clock_is_sane,
        names_round_trip,
        release_notifies_waiters,
        guard_renews_and_hands_over,
        last_slot_reads_the_highest_claim,
        history_is_bounded_keyed_and_exact,
    );
    let mut failed = Vec::new();
    let mut ran = 0;
    while let Some(done) = tasks.join_next().await {
        let (check, ok, took) = done.expect("check task");
        ran += 1;
        println!("{check}: {} in {took:?}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failed.push(check);
        }
    }
    assert_eq!(ran, 21);
    assert!(failed.is_empty(), "conformance checks failed: {failed:?}");
}

/// A store from `connect_lazy` on `url` answers once it has connected in the background: the
/// first acquisition of a fresh name succeeds within 10 s (transient errors until then).
pub async fn lazy_store_connects(url: &str) {
    use leasehold::{HolderId, LeaseName, Store, store::Acquisition};
    let store = RedisConfig::new(url)
        .prefix(test_prefix())
        .connect_lazy()
        .expect("a valid url");
    let (name, who) = (
        LeaseName::new("lazy").unwrap(),
        HolderId::new("lazy").unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.acquire(&name, &who, Duration::from_secs(5)).await {
            Ok(Acquisition::Acquired { .. }) => return,
            Ok(busy) => panic!("fresh name busy: {busy:?}"),
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("lazy store never answered: {e}"),
        }
    }
}

/// Asks for `name` until the store answers (a failover in progress fails as transient), and
/// returns the answer and when it came, from `since`. Fails after 30 s.
pub async fn first_answer_after(
    since: Instant,
    store: &RedisStore,
    name: &leasehold::LeaseName,
    who: &leasehold::HolderId,
    ttl: Duration,
) -> (leasehold::store::Acquisition, Duration) {
    use leasehold::Store;
    loop {
        match store.acquire(name, who, ttl).await {
            Ok(answer) => return (answer, since.elapsed()),
            Err(e) => {
                assert!(e.is_transient(), "failover error is transient: {e}");
                assert!(
                    since.elapsed() < Duration::from_secs(30),
                    "no answer 30 s after the kill: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
