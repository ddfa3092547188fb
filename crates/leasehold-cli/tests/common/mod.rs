//! Running `leasehold` processes from tests, and reading the ledger their commands (the
//! witness) write.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub mod sidecar;

pub const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// A `leasehold run` process, killed when dropped.
pub struct Instance {
    pub name: String,
    pub child: Child,
}

impl Instance {
    /// Starts `leasehold run --holder NAME ARGS -- leasehold witness …` (see [`witness`]).
    pub fn start(name: &str, args: &[&str], ledger: &Path, work: &str, log_dir: &Path) -> Self {
        Self::start_with_env(name, args, ledger, work, log_dir, &[])
    }

    /// [`Instance::start`] with extra environment variables.
    pub fn start_with_env(
        name: &str,
        args: &[&str],
        ledger: &Path,
        work: &str,
        log_dir: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_program(BIN.as_ref(), name, args, ledger, work, log_dir, env)
    }

    /// [`Instance::start_with_env`] with another `leasehold` as the runner (another release,
    /// say); the witness is this build's.
    pub fn start_program(
        program: &Path,
        name: &str,
        args: &[&str],
        ledger: &Path,
        work: &str,
        log_dir: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        let log = std::fs::File::create(log_dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new(program)
            .envs(env.iter().copied())
            .arg("run")
            .args(["--holder", name])
            .args(args)
            .arg("--")
            .args(witness(ledger, work))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start leasehold run");
        Self {
            name: name.to_owned(),
            child,
        }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} {}", self.name);
    }

    /// SIGTERM, then wait (at most `limit`) for a clean exit.
    pub fn stop(mut self, limit: Duration) -> i32 {
        self.signal("TERM");
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not stop",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The command line of the witness as a run's command: `leasehold witness --ledger LEDGER
/// --fence F --work WORK`, its fence file beside the ledger.
pub fn witness(ledger: &Path, work: &str) -> Vec<OsString> {
    vec![
        BIN.into(),
        "witness".into(),
        "--ledger".into(),
        ledger.into(),
        "--fence".into(),
        ledger.with_extension("fence").into(),
        "--work".into(),
        work.into(),
    ]
}

/// One run of the witness.
pub type Run = leasehold_witness::LedgerEntry;

/// The runs in the ledger that did their work: a run told to stop before its write (recorded
/// as aborted) did nothing.
pub fn read_ledger(path: &Path) -> Vec<Run> {
    let (runs, unreadable) = leasehold_witness::ledger::read(path).unwrap();
    assert_eq!(
        unreadable,
        0,
        "every line of {} is an entry",
        path.display()
    );
    runs.into_iter()
        .filter(|r| r.fenced != leasehold_witness::Fenced::Aborted)
        .collect()
}

/// Asserts every slot ran exactly once (or was run again after a cut-off, as `retry` under a
/// newer token) and no two runs overlapped in time; returns the last run per slot.
pub fn assert_exactly_once(runs: &[Run]) -> BTreeMap<u64, Run> {
    let mut by_slot: BTreeMap<u64, Run> = BTreeMap::new();
    let mut sorted_by_start = runs.to_vec();
    sorted_by_start.sort_by_key(|r| r.start_ms);
    for r in &sorted_by_start {
        let slot = r.slot.expect("scheduled runs carry a slot");
        if let Some(prev) = by_slot.insert(slot, r.clone()) {
            // A run killed after its write but before its end was recorded is run again
            // (at least once, issue 38): as `retry`, under a newer token.
            let rerun = r.trigger == "retry" && prev.token.is_some() && r.token > prev.token;
            assert!(rerun, "slot {slot} ran twice: {prev:?} and {r:?}");
        }
    }
    let mut sorted = runs.to_vec();
    sorted.sort_by_key(|r| r.start_ms);
    for w in sorted.windows(2) {
        assert!(
            w[1].start_ms >= w[0].end_ms,
            "runs overlap: {:?} {:?}",
            w[0],
            w[1]
        );
    }
    // Each tenure of the lease has a new token; a cut-off slot run again (trigger `retry`)
    // runs in the tenure of the run before it, so it may share that run's token.
    let tokened: Vec<&Run> = sorted.iter().filter(|r| r.token.is_some()).collect();
    for w in tokened.windows(2) {
        let (a, b) = (w[0].token.unwrap(), w[1].token.unwrap());
        assert!(
            b > a || (b == a && w[1].trigger == "retry"),
            "tokens strictly increase: {:?}",
            tokened.iter().map(|r| r.token).collect::<Vec<_>>()
        );
    }
    by_slot
}

/// The holder of `lease` on `store`, if any.
pub async fn leader(store: &impl leasehold::Store, lease: &str) -> Option<String> {
    let state = store
        .inspect(&leasehold::LeaseName::new(lease).unwrap())
        .await
        .unwrap()?;
    state.holder.map(|h| h.to_string())
}

/// Waits (at most `limit`) for `lease` to have a holder other than `not`; returns it and how
/// long that took.
pub async fn wait_for_leader(
    store: &impl leasehold::Store,
    lease: &str,
    not: Option<&str>,
    limit: Duration,
) -> (String, Duration) {
    let start = std::time::Instant::now();
    loop {
        if let Some(l) = leader(store, lease).await
            && Some(l.as_str()) != not
        {
            return (l, start.elapsed());
        }
        assert!(start.elapsed() < limit, "no new leader within {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `leasehold ARGS` to the end.
pub fn leasehold(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run leasehold")
}

/// `leasehold ARGS --json` parsed, which must succeed.
pub fn json_of(args: &[&str]) -> serde_json::Value {
    let out = leasehold(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The exit status (-1 if a signal ended it).
pub fn code(out: &std::process::Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

pub fn path_str(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

pub fn ledger_in(dir: &Path) -> PathBuf {
    dir.join("ledger.jsonl")
}

/// A process the test started, resumed (should the test have stopped it) and killed when
/// dropped, so a failing assertion leaves nothing running.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Only a process not yet reaped: its pid cannot have been reused.
        if let Ok(None) = self.0.try_wait() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.0.id().to_string()])
                .status();
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A name no other test run uses: `tag` and a few hex digits from the clock and this process.
pub fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{tag}-{:08x}", nanos ^ std::process::id())
}

/// The test Redis: `LEASEHOLD_TEST_REDIS_URL`, else the local default.
pub fn redis_url() -> String {
    std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into())
}

/// The test PostgreSQL: `LEASEHOLD_TEST_POSTGRES_URL`, else the local default.
pub fn postgres_url() -> String {
    std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or("postgres://postgres@127.0.0.1:5432/test".into())
}

/// A test of `check` on a fresh SQLite file, one on the test Redis and one on the test
/// PostgreSQL.
#[allow(unused_macros)] // (each test binary compiles this module; few use it)
macro_rules! on_sqlite_redis_and_postgres {
    ($check:ident: $sqlite:ident, $redis:ident, $postgres:ident) => {
        on_sqlite_and_redis!($check: $sqlite, $redis);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            $check(&postgres_url()).await;
        }
    };
}

#[allow(unused_imports)]
pub(crate) use on_sqlite_redis_and_postgres;

/// A test of `check` on a fresh SQLite file and one on the test Redis.
#[allow(unused_macros)] // (each test binary compiles this module; few use it)
macro_rules! on_sqlite_and_redis {
    ($check:ident: $sqlite:ident, $redis:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            let dir = temp_dir();
            $check(&format!(
                "sqlite:{}",
                path_str(&dir.path().join("store.db"))
            ))
            .await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $redis() {
            $check(&redis_url()).await;
        }
    };
}

#[allow(unused_imports)]
pub(crate) use on_sqlite_and_redis;

/// `history --json` of `task`: its runs, newest first (at most 1000).
pub fn history(url: &str, task: &str) -> Vec<serde_json::Value> {
    let doc = json_of(&["history", "--store", url, task, "--json", "--limit", "1000"]);
    doc["runs"].as_array().unwrap().clone()
}

/// Two `leasehold run --every 1s --ttl 3s` instances of `lease`, `i1` and `i2`, each running the
/// witness into `ledger` (20 ms of work).
pub fn two_every_second(url: &str, lease: &str, ledger: &Path, dir: &Path) -> Vec<Instance> {
    let args = [
        "--store", url, "--lease", lease, "--every", "1s", "--ttl", "3s",
    ];
    ["i1", "i2"]
        .iter()
        .map(|name| Instance::start(name, &args, ledger, "20ms", dir))
        .collect()
}

/// `status --store URL --json`'s entry for `task` once `check` holds for it (at most 20 s); a
/// SQLite store the instances have not created yet (exit 66) is waited for too.
pub fn task_when(
    url: &str,
    task: &str,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let args = ["status", "--store", url, "--json"];
        if code(&leasehold(&args)) == 66 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let status = json_of(&args);
        let found = status["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == task)
            .cloned();
        if let Some(t) = found.filter(|t| check(t)) {
            return t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{task}: {what}: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether a `status --json` task entry lists two live instances.
pub fn two_live(task: &serde_json::Value) -> bool {
    let instances = task["instances"].as_array().unwrap();
    instances.iter().filter(|i| i["live"] == true).count() == 2
}
