//! The core's conformance suite run all at once on one deployment a test started itself (the
//! `leasehold::conformance_tests!` macro makes one test per check instead, each of which would
//! start a deployment of its own).

use std::future::Future;
use std::time::Instant;

use leasehold::{Catalog, Membership, Purge, Slots};

/// Runs every check of `leasehold::conformance`, all at once, each on the store
/// `store_for(check name)` yields (clones of one store, or a store with a key prefix per
/// check), printing each outcome and its duration, and panics naming the checks that failed.
pub async fn run_all<S, F, Fut>(mut store_for: F)
where
    S: Slots + Purge + Membership + Catalog,
    F: FnMut(&'static str) -> Fut,
    Fut: Future<Output = S>,
{
    use leasehold::conformance as c;
    let mut tasks = tokio::task::JoinSet::new();
    let mut count = 0;
    macro_rules! spawn_checks {
        (; $($check:ident),* $(,)?) => {$(
            count += 1;
            let store = store_for(stringify!($check)).await;
            tasks.spawn(async move {
                let started = Instant::now();
                let outcome = tokio::spawn(c::$check(store)).await;
                (stringify!($check), outcome.is_ok(), started.elapsed())
            });
        )*};
    }
    leasehold::for_each_conformance_check!([spawn_checks]());
    let mut failed = Vec::new();
    let mut ran = 0;
    while let Some(done) = tasks.join_next().await {
        let (check, ok, took) = done.expect("a conformance check's task");
        ran += 1;
        println!("{check}: {} in {took:?}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failed.push(check);
        }
    }
    assert_eq!(ran, count, "every check ran");
    assert!(failed.is_empty(), "conformance checks failed: {failed:?}");
}
