//! The leasehold store conformance suite against the local MariaDB (or MySQL).

mod common;

leasehold::conformance_tests!(async { common::store().await });
