//! The core's store conformance suite against the local Redis (`LEASEHOLD_TEST_REDIS_URL`) and,
//! in `valkey::`, against the local Valkey (`LEASEHOLD_TEST_VALKEY_URL`, which the test command
//! always sets; see `scripts/valkey.sh`), where leases are renewed and released with the native
//! compare-and-set commands rather than scripts.

mod common;

leasehold::conformance_tests!(async { common::make_store().await });

mod valkey {
    use super::common;

    /// One test per check, each skipped (with a note) when no Valkey is configured.
    macro_rules! valkey_tests {
        (; $($check:ident),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let Some(store) = common::make_valkey_store().await else { return };
                    leasehold::conformance::$check(store).await;
                }
            )*
        };
    }

    leasehold::for_each_conformance_check!([valkey_tests]());
}
