//! The core's store conformance suite against the local Redis (`LEASEHOLD_TEST_REDIS_URL`).

mod common;

leasehold::conformance_tests!(async { common::make_store().await });

/// Checks of the run history operations, not (yet) in the core's `conformance_tests!` list; in a
/// module of their own so their names cannot clash once they are.
mod history {
    use super::common;

    leasehold::conformance_tests!(@each async { common::make_store().await };
        last_slot_reads_the_highest_claim, history_is_bounded_keyed_and_exact);
}
