//! Drain on shutdown (issue 38): a rolling replacement, each leader SIGTERMed while its run is
//! going, loses no run (none aborted, none twice, none overlapping), on SQLite and Redis; a
//! second SIGTERM ends the drain at once.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use leasehold_witness::Fenced;

fn lease_name(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{tag}-{:08x}", nanos ^ std::process::id())
}

/// Every entry of the ledger, the aborted ones too.
fn all_runs(ledger: &Path) -> Vec<Run> {
    let (runs, unreadable) = leasehold_witness::ledger::read(ledger).unwrap();
    assert_eq!(unreadable, 0);
    runs
}

/// Waits (at most `limit`) for a run to start: the task lease of `lease` goes from free to
/// held. Returns its holder and fencing token (the run's `LEASEHOLD_TOKEN`).
async fn next_run_starts(
    store: &impl leasehold::Store,
    lease: &str,
    limit: Duration,
) -> (String, u64) {
    let task = leasehold::LeaseName::new(format!("{lease}:run")).unwrap();
    let start = Instant::now();
    let mut was_free = false;
    loop {
        let state = store.inspect(&task).await.unwrap();
        match state.and_then(|s| s.holder.map(|h| (h.to_string(), s.token.get()))) {
            Some(run) if was_free => return run,
            Some(_) => {}
            None => was_free = true,
        }
        assert!(start.elapsed() < limit, "no run started within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn epoch_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    u64::try_from(now.unwrap().as_millis()).unwrap()
}

async fn rolling_replacement(url: &str) {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = lease_name("rolling");
    // Runs of 2 s every 3 s; the drain is the ttl's default, 10 s, well above a run.
    let args = [
        "--store", url, "--lease", &lease, "--every", "3s", "--ttl", "10s",
    ];
    let work = "2s";
    let mut instances: Vec<Instance> = (1..=3)
        .map(|i| Instance::start(&format!("old{i}"), &args, &ledger, work, dir.path()))
        .collect();
    let store = leasehold_connect::open_store(url).await.unwrap();
    // (instance, the token of the run it was in when SIGTERM came, when it came)
    let mut cut = Vec::new();
    for round in 1..=3 {
        let (running, token) = next_run_starts(&store, &lease, Duration::from_secs(20)).await;
        // The replacement starts first, as a rolling deploy does; then the instance running
        // the slot is stopped in the middle of its run.
        instances.push(Instance::start(
            &format!("new{round}"),
            &args,
            &ledger,
            work,
            dir.path(),
        ));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let at = instances
            .iter()
            .position(|i| i.name == running)
            .expect("the running instance is one of ours");
        let leaving = instances.remove(at);
        let (stopping, sigterm_ms) = (Instant::now(), epoch_ms());
        assert_eq!(leaving.stop(Duration::from_secs(30)), 0, "{running}");
        println!(
            "round {round}: {running} stopped {:?} after SIGTERM",
            stopping.elapsed()
        );
        cut.push((running, token, sigterm_ms));
    }
    // The old instances that were not running a slot go too: the whole fleet is replaced.
    let (old, new): (Vec<Instance>, Vec<Instance>) = instances
        .into_iter()
        .partition(|i| i.name.starts_with("old"));
    for i in old {
        let name = i.name.clone();
        assert_eq!(i.stop(Duration::from_secs(30)), 0, "{name}");
    }
    // The replacements run a few slots more.
    tokio::time::sleep(Duration::from_secs(7)).await;
    for i in new {
        let name = i.name.clone();
        assert_eq!(i.stop(Duration::from_secs(30)), 0, "{name}");
    }
    let runs = all_runs(&ledger);
    for r in &runs {
        assert_eq!(
            r.fenced,
            Fenced::Accepted,
            "every run completed its write: {r:?}"
        );
    }
    let by_slot = assert_exactly_once(&runs);
    for (name, token, sigterm_ms) in &cut {
        let run = runs.iter().find(|r| r.token == Some(*token));
        assert!(
            run.is_some_and(|r| &r.holder == name && r.end_ms >= *sigterm_ms),
            "{name}'s run (token {token}), going when it got SIGTERM, completed after it: {run:?}"
        );
    }
    let slots: Vec<u64> = by_slot.keys().copied().collect();
    println!("ran {} slots: {slots:?}", slots.len());
    assert!(slots.len() >= 5, "only {} runs", slots.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_rolling_replacement_loses_no_run() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    rolling_replacement(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rolling_replacement_loses_no_run() {
    let url = std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    rolling_replacement(&url).await;
}

/// The first SIGTERM drains (the command runs on, and it is logged); the second forwards
/// SIGTERM to the command at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_ends_the_drain() {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let lease = lease_name("second");
    let args = [
        "--store", &url, "--lease", &lease, "--every", "1s", "--drain", "60s", "--grace", "1s",
    ];
    let mut one = Instance::start("one", &args, &ledger, "60s", dir.path());
    let store = leasehold_connect::open_store(&url).await.unwrap();
    next_run_starts(&store, &lease, Duration::from_secs(20)).await;
    one.signal("TERM");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        one.child.try_wait().unwrap().is_none(),
        "still draining after the first SIGTERM"
    );
    assert!(all_runs(&ledger).is_empty(), "the command still runs");
    let second = Instant::now();
    assert_eq!(one.stop(Duration::from_secs(20)), 0);
    let took = second.elapsed();
    println!("exited {took:?} after the second SIGTERM");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let runs = all_runs(&ledger);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].fenced, Fenced::Aborted, "the command got SIGTERM");
    let log = std::fs::read_to_string(dir.path().join("one.log")).unwrap();
    assert!(log.contains("draining: waiting up to 60s"), "{log}");
    assert!(log.contains("draining over"), "{log}");
}
