//! The core's conformance suite run all at once on one deployment a test started itself (the
//! `leasehold::conformance_tests!` macro makes one test per check instead, each of which would
//! start a deployment of its own).

use std::future::Future;
use std::time::Instant;

use leasehold::Store;

/// Runs every check of `leasehold::conformance`, all at once, each on the store
/// `store_for(check name)` yields (clones of one store, or a store with a key prefix per
/// check), printing each outcome and its duration, and panics naming the checks that failed.
pub async fn run_all<S, F, Fut>(mut store_for: F)
where
    S: Store,
    F: FnMut(&'static str) -> Fut,
    Fut: Future<Output = S>,
{
    use leasehold::conformance as c;
    let mut tasks = tokio::task::JoinSet::new();
    macro_rules! spawn_checks {
        ($($check:ident),* $(,)?) => {$(
            let store = store_for(stringify!($check)).await;
            tasks.spawn(async move {
                let started = Instant::now();
                let outcome = tokio::spawn(c::$check(store)).await;
                (stringify!($check), outcome.is_ok(), started.elapsed())
            });
        )*};
    }
    // The checks of `leasehold::conformance_tests!`.
    spawn_checks!(
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
        history_keep_zero_keeps_one,
        members_expire_refresh_and_leave,
    );
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
    assert_eq!(ran, 22, "every check ran");
    assert!(failed.is_empty(), "conformance checks failed: {failed:?}");
}
