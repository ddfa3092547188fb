//! The core's store conformance suite against a 3-member etcd cluster on loopback, started by the
//! test process itself.

mod common;

leasehold::conformance_tests!(async { common::make_store().await });
