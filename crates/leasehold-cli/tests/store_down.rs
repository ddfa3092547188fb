//! `leasehold run --every` started while its store is down (issue 12), with real processes and
//! a redis-server of the test's own that starts later: fail-open runs every tick on every
//! instance while the store cannot be reached and re-attaches (one run per slot) as soon as it
//! answers; fail-closed runs nothing meanwhile, stays up, and starts running when it answers.
//! Before, both exited 69 at start.

mod common;

use std::time::{Duration, Instant};

use common::*;
use leasehold_testkit::free_port;
use leasehold_testkit::redis::OwnRedis;

#[test]
fn fail_open_runs_during_the_outage_and_re_attaches_when_the_store_answers() {
    runs_during_the_outage_and_re_attaches("fail-open");
}

/// `local` (single-instance mode while the store is away) re-attaches the same way; before, an
/// instance started during an outage ran every tick for as long as it lived.
#[test]
fn local_re_attaches_when_the_store_answers() {
    runs_during_the_outage_and_re_attaches("local");
}

fn runs_during_the_outage_and_re_attaches(policy: &str) {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let args = [
        "--store",
        &url,
        "--lease",
        "open",
        "--every",
        "500ms",
        "--ttl",
        "3s",
        "--retry",
        "100ms",
        "--on-store-down",
        policy,
    ];
    let instances: Vec<Instance> = ["a", "b"]
        .iter()
        .map(|n| Instance::start(n, &args, &ledger, "20ms", dir.path()))
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let during = read_ledger(&ledger);
    for i in &instances {
        assert!(
            i.child.id() > 0 && during.iter().any(|r| r.holder == i.name),
            "{} ran nothing during the outage: {during:?}",
            i.name
        );
    }
    assert!(during.iter().all(|r| r.token.is_none()), "{during:?}");

    let _redis = OwnRedis::start_on(port, &[]);
    let up_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    std::thread::sleep(Duration::from_secs(5));
    for i in instances {
        assert_eq!(i.stop(Duration::from_secs(10)), 0, "clean exit");
    }
    let runs = read_ledger(&ledger);
    let gated: Vec<Run> = runs.iter().filter(|r| r.token.is_some()).cloned().collect();
    assert!(
        gated.len() >= 4,
        "ticks gated again once the store answered: {runs:?}"
    );
    assert_exactly_once(&gated);
    // Every instance stops running ungated ticks soon after the store answers (reconnect
    // backoff), not for as long as it lives.
    let first_gated = gated.iter().map(|r| r.start_ms).min().unwrap();
    let late: Vec<&Run> = runs
        .iter()
        .filter(|r| r.token.is_none() && r.start_ms > first_gated + 2000)
        .collect();
    assert!(late.is_empty(), "ungated runs after re-attaching: {late:?}");
    println!(
        "{policy}: {} runs during the outage; gated again {} ms after the store came up",
        during.len(),
        first_gated.saturating_sub(up_ms)
    );
}

#[test]
fn fail_closed_waits_for_the_store_instead_of_exiting() {
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let args = [
        "--store", &url, "--lease", "closed", "--every", "500ms", "--ttl", "3s", "--retry", "100ms",
    ];
    let mut one = Instance::start("one", &args, &ledger, "20ms", dir.path());
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        one.child.try_wait().unwrap().is_none(),
        "exited during the outage"
    );
    assert!(
        read_ledger(&ledger).is_empty(),
        "ran while the store was down"
    );
    let _redis = OwnRedis::start_on(port, &[]);
    let start = Instant::now();
    while read_ledger(&ledger).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no run after the store came up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(read_ledger(&ledger).iter().all(|r| r.token.is_some()));
    assert_eq!(one.stop(Duration::from_secs(10)), 0);
}
