//! The leasehold store conformance suite against the local PostgreSQL.

mod common;

leasehold::conformance_tests!(async { common::store().await });
