//! The core's store conformance suite against a SQLite file. All checks share one file (each
//! through its own store handle and connections), as processes on one host would.

use std::path::PathBuf;
use std::sync::OnceLock;

use leasehold_sqlite::{SqliteConfig, SqliteStore};

fn shared_file() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("conformance-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir")
            .keep()
    })
    .join("leases.db")
}

async fn make_store() -> SqliteStore {
    SqliteStore::open(shared_file(), SqliteConfig::default())
        .await
        .expect("open sqlite store")
}

leasehold::conformance_tests!(async { make_store().await });
