//! The core's store conformance suite against the local Redis (`LEASEHOLD_TEST_REDIS_URL`).

mod common;

leasehold::conformance_tests!(async { common::make_store().await });
