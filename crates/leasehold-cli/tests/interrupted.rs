//! A run cut off by SIGKILL is run again (issue 38): two `leasehold run` instances on SQLite and
//! on Redis, the one running a slot SIGKILLed mid-run; the other runs that slot once more, once,
//! as attempt 2 with `LEASEHOLD_TRIGGER=retry`, and no slot's write lands twice.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Waits (at most `limit`) for a run to start: the task lease of `lease` goes from free to
/// held. Returns its holder and fencing token.
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

fn token_of(record: &serde_json::Value) -> Option<u64> {
    let token = &record["token"];
    token
        .as_u64()
        .or_else(|| token.as_str().and_then(|t| t.parse().ok()))
}

async fn killed_mid_run(url: &str) {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = unique("cut-off");
    let args = [
        "--store", url, "--lease", &lease, "--every", "3s", "--ttl", "3s",
    ];
    let mut instances: Vec<Instance> = ["one", "two"]
        .iter()
        .map(|name| Instance::start(name, &args, &ledger, "2s", dir.path()))
        .collect();
    let store = leasehold_connect::open_store(url).await.unwrap();
    let (running, token) = next_run_starts(&store, &lease, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at = instances.iter().position(|i| i.name == running).unwrap();
    let mut killed = instances.remove(at);
    killed.signal("KILL");
    let _ = killed.child.wait();
    // The lease runs out (3 s), the other instance runs its next slot, then the cut-off one;
    // a live-looking catalog entry of the killed instance may put that off a slot or two.
    let survivor = instances.pop().unwrap();
    let start = Instant::now();
    let again = loop {
        let runs = read_ledger(&ledger);
        if let Some(run) = runs.iter().find(|r| r.trigger == "retry") {
            break run.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "no run again within 40 s: {runs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // A few slots more: nothing is run again twice.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(survivor.stop(Duration::from_secs(30)), 0);
    let runs = read_ledger(&ledger);
    assert_eq!(
        runs.iter().filter(|r| r.trigger == "retry").count(),
        1,
        "{runs:?}"
    );
    assert_ne!(again.holder, running);
    // Every write landed once per slot, the killed run's included (it made none).
    assert_exactly_once(&runs);
    let records = history(url, &lease);
    let cut = records
        .iter()
        .find(|r| token_of(r) == Some(token))
        .unwrap_or_else(|| panic!("the killed run is in the history: {records:#?}"));
    assert_eq!(cut["slot"].as_u64(), again.slot, "{records:#?}");
    assert_eq!(cut["result"], "interrupted", "{cut:#}");
    let second = records
        .iter()
        .find(|r| r["slot"].as_u64() == again.slot && r["attempt"] == 2)
        .unwrap_or_else(|| panic!("attempt 2 is in the history: {records:#?}"));
    assert_eq!(second["result"], "ok", "{second:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_run_killed_mid_run_is_run_again_once() {
    let dir = temp_dir();
    killed_mid_run(&sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_run_killed_mid_run_is_run_again_once() {
    killed_mid_run(&redis_url()).await;
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}", path_str(&dir.path().join("leases.db")))
}
